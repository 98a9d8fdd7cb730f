"""Window numbering: window ``i`` <-> (device, first device row), and the blocks of windows.

Windows start at device rows ``lowest[k]``, ``+ stride``, ... (``lowest`` below 0: left
padding, ``min_context``), numbered device by device in device order; with ``max_missing`` only
the kept starts are numbered (8 bytes per window). The orders of
:mod:`tsfile_torch.sampling.orders` see a block as the windows whose first row lies in one
``block_rows`` run of a device (Note: window blocks in :mod:`tsfile_torch.data.windows`).
Pure numpy: no reading, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["WindowIndex"]


class WindowIndex:
    """The windows of a set of devices (see the module notes).

    Args:
        num_rows: rows of each device (in range).
        length: rows of a window (context + horizon).
        stride: rows between consecutive starts of a device.
        lowest: the first start of each device (negative: padded).
        keep: ``keep(k, starts)`` -> a boolean mask of the starts of device ``k`` to number
            (``max_missing``); None numbers every start.
    """

    def __init__(
        self,
        num_rows: Sequence[int],
        length: int,
        stride: int,
        lowest: np.ndarray,
        keep: Callable[[int, np.ndarray], np.ndarray] | None = None,
    ):
        self.stride = stride
        room = np.asarray(num_rows, dtype=np.int64) - lowest
        counts = np.where(room >= length, (room - length) // stride + 1, 0)
        #: device row of each device's first window (negative: padded)
        self.offset = lowest.astype(np.int64)
        #: with ``keep``: the start row of every window kept, device by device
        self.starts: np.ndarray | None = None
        if keep is not None:
            kept = []
            for k, count in enumerate(counts.tolist()):
                starts = self.offset[k] + np.arange(count, dtype=np.int64) * stride
                kept.append(starts[keep(k, starts)])
            counts = np.array([len(s) for s in kept], dtype=np.int64)
            self.starts = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
        #: the number of the first window of each device, and the total last
        self.first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self.first[-1])

    def counts(self) -> np.ndarray:
        """Windows per device."""
        return np.diff(self.first)

    def device_starts(self, k: int) -> np.ndarray:
        """Return the start rows of device ``k``'s windows."""
        first, stop = int(self.first[k]), int(self.first[k + 1])
        if self.starts is not None:
            return self.starts[first:stop]
        return self.offset[k] + np.arange(stop - first, dtype=np.int64) * self.stride

    def blocks(self, block_rows: int) -> np.ndarray:
        """Return the first window of each block (windows starting in one run of a device)."""
        bounds = []
        for k in range(len(self.first) - 1):
            if self.first[k + 1] > self.first[k]:
                block = np.maximum(self.device_starts(k), 0) // block_rows
                cuts = np.flatnonzero(np.diff(block)) + 1
                bounds.extend((int(self.first[k]) + np.r_[0, cuts]).tolist())
        return np.array(bounds + [len(self)], dtype=np.int64)

    def locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Return (device, first device row) of each window index (negative ones count back).

        Raises:
            TypeError: an index is not an integer. IndexError: one is out of range.
        """
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            bad = next(
                i
                for i in np.ravel(indices)
                if isinstance(i, bool) or not isinstance(i, (int, np.integer))
            )
            raise TypeError(f"index must be an integer window number; got {bad!r}")
        idx = idx.astype(np.int64)
        n = len(self)
        bad = (idx < -n) | (idx >= n)
        if bad.any():
            raise IndexError(f"window index {int(idx[bad][0])} out of range for {n} windows")
        idx = idx % n
        k = np.searchsorted(self.first, idx, side="right") - 1
        if self.starts is not None:
            return k, self.starts[idx]
        return k, self.offset[k] + (idx - self.first[k]) * self.stride
