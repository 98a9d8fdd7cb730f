"""MemoryStore: rows kept for the life of a process (``cache="memory"``), in one array.

The one decoded memory cache: the row datasets keep their one table here, the window dataset
one table per device, side by side in the same ``(rows, columns)`` array, so a batch of windows
from many devices is one numpy gather. Values are kept as handed out (normalized, in the
output dtype); a table's rows are filled as they are first read. Memory:
``rows * (columns * itemsize + 9)`` bytes per process.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["MemoryStore"]


class MemoryStore:
    """Rows of several tables kept in one array, filled as they are read.

    Args:
        sizes: rows of each table.
        num_columns: columns of every table.
        dtype: dtype of the values.
    """

    def __init__(self, sizes: Sequence[int], num_columns: int, dtype):
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(self.offsets[-1])
        self.values = np.empty((total, num_columns), dtype=dtype)
        self.times = np.empty(total, dtype=np.int64)
        self.filled = np.zeros(total, dtype=bool)
        self._whole = np.zeros(len(sizes), dtype=bool)  # tables known to be kept entirely

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.times.nbytes + self.filled.nbytes

    def has(self, table: int, start: int, stop: int) -> bool:
        """Return True if rows ``[start, stop)`` of ``table`` are kept."""
        if self._whole[table]:
            return True
        base = self.offsets[table]
        return bool(self.filled[base + start : base + stop].all())

    def has_whole(self, table: int) -> bool:
        """Return True if every row of ``table`` is kept (remembered once found)."""
        if not self._whole[table]:
            lo, hi = self.offsets[table], self.offsets[table + 1]
            self._whole[table] = bool(self.filled[lo:hi].all())
        return bool(self._whole[table])

    def get(self, table: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Return views of kept rows ``[start, stop)`` of ``table``: values, timestamps."""
        base = int(self.offsets[table])
        return self.values[base + start : base + stop], self.times[base + start : base + stop]

    def put(self, table: int, start: int, values: np.ndarray, times: np.ndarray) -> None:
        """Keep ``values`` / ``times`` as rows ``start, start + 1, ...`` of ``table``."""
        base = int(self.offsets[table]) + start
        self.values[base : base + len(times)] = values
        self.times[base : base + len(times)] = times
        self.filled[base : base + len(times)] = True
