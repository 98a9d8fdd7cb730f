"""MemoryStore: rows kept for the life of a process (``cache="memory"``), in one array.

The one decoded cache: the row datasets keep their one table here, the window dataset one
table per device, side by side in the same ``(rows, columns)`` array, so a batch of windows
from many devices is one numpy gather. Values are kept as handed out (normalized, in the
output dtype); a table's rows are filled as they are first read. Memory:
``rows * (columns * itemsize + 9)`` bytes per process (once for fork workers, below).
``cache="disk"`` is the same store over arrays mapped from one file shared by every process (see
:mod:`tsfile_torch.read.diskcache`, Note: decoded disk cache).

Note: shared memory store. Under :func:`tsfile_torch.make_loader` with fork workers (the default
where tsfile-torch makes fork safe), ``cache="memory"``'s store is made by the main process
before the workers start, in anonymous shared memory (``mmap(-1)``, ``MAP_SHARED``: no file, no
``/dev/shm`` name, nothing left behind whatever ends the processes), and every worker fills and
reads that one store: one copy of the rows for the machine instead of one per worker, batches a
worker finds kept there handed over by reference, and once every row is kept the main process
serves a pass alone (Note: kept passes in :mod:`tsfile_torch.loader`), as with ``cache="disk"``.
Workers write the same bytes to rows two of them fill at once, values before flags (the
fence). Spawn and forkserver workers, which cannot inherit it, keep a store each.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["MemoryStore", "fence"]

_FENCE = threading.Lock()
_ADOPT_ROWS = 1 << 16  # rows :meth:`MemoryStore.adopt` copies at once


def fence() -> None:
    """Order the stores before it before the stores after it, as other processes see them.

    Acquiring and releasing a mutex is a full memory barrier; on x86 stores are seen in
    program order anyway, on weaker CPUs (ARM) this keeps a ``filled`` flag from becoming
    visible before the values it vouches for.
    """
    with _FENCE:
        pass


def _seen(kept: bool) -> bool:
    """Return ``kept``, after a fence when it is True: the values a flag set by another
    process vouches for are read after the flag (the read side of :meth:`MemoryStore.put`'s
    fence; x86 keeps loads in order anyway, weaker CPUs need not)."""
    if kept:
        fence()
    return kept


class MemoryStore:
    """Rows of several tables kept in one array, filled as they are read.

    Args:
        sizes: rows of each table.
        num_columns: columns of every table.
        dtype: dtype of the values.
        arrays: ``(values, times, filled)`` to keep the rows in (a mapped file); ``None``:
            new arrays in this process's memory.
        backing: what ``arrays`` live in (kept open as long as the store).
        writable: ``False``: rows already kept are served, :meth:`put` keeps nothing.
        seals: the disk cache's checked blocks
            (:class:`~tsfile_torch.read.diskcache.BlockSeals`): rows are kept once their block
            is sealed and verified in this process, not when their flags are set (Note:
            checked blocks); ``None``: the flags decide (memory of this process only).
    """

    def __init__(
        self,
        sizes: Sequence[int],
        num_columns: int,
        dtype,
        arrays: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        backing=None,
        writable: bool = True,
        seals=None,
    ):
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        total = int(self.offsets[-1])
        if arrays is None:
            arrays = (
                np.empty((total, num_columns), dtype=dtype),
                np.empty(total, dtype=np.int64),
                np.zeros(total, dtype=bool),
            )
        self.values, self.times, self.filled = arrays
        self.backing = backing
        self.writable = writable
        self.seals = seals
        if seals is not None:
            seals.table_starts = self.offsets
        self._whole = np.zeros(len(sizes), dtype=bool)  # tables known to be kept entirely

    @classmethod
    def shared(cls, sizes: Sequence[int], num_columns: int, dtype) -> MemoryStore:
        """Return an empty store in anonymous shared memory (Note: shared memory store): the
        processes this one forks later see and fill the same rows; no file, no name, gone
        with the last process that maps it."""
        total = int(np.sum(sizes, dtype=np.int64))
        dtype = np.dtype(dtype)
        parts = [total * num_columns * dtype.itemsize, total * 8, total]
        pages = [-(-n // mmap.PAGESIZE) * mmap.PAGESIZE for n in parts]
        backing = mmap.mmap(-1, max(sum(pages), mmap.PAGESIZE))  # MAP_SHARED, zero-filled
        at = np.concatenate([[0], np.cumsum(pages)])
        values = np.frombuffer(backing, dtype, total * num_columns, int(at[0]))
        times = np.frombuffer(backing, np.int64, total, int(at[1]))
        filled = np.frombuffer(backing, np.bool_, total, int(at[2]))
        return cls(
            sizes, num_columns, dtype, (values.reshape(total, num_columns), times, filled), backing
        )

    def adopt(self, other: MemoryStore) -> None:
        """Take the rows ``other`` (a store of the same tables) keeps, a stretch at a time (no
        second whole copy)."""
        for lo in range(0, len(other.filled), _ADOPT_ROWS):
            rows = lo + np.flatnonzero(other.filled[lo : lo + _ADOPT_ROWS])
            if len(rows):
                self.put_rows(rows, other.values[rows], other.times[rows])

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.times.nbytes + self.filled.nbytes

    def has(self, table: int, start: int, stop: int) -> bool:
        """Return True if rows ``[start, stop)`` of ``table`` are kept."""
        if self._whole[table]:
            return True
        base = int(self.offsets[table])
        if self.seals is not None:
            return self.seals.ready(*self.seals.blocks(base + start, base + stop))
        return _seen(bool(self.filled[base + start : base + stop].all()))

    def has_whole(self, table: int) -> bool:
        """Return True if every row of ``table`` is kept (remembered once found)."""
        if not self._whole[table]:
            lo, hi = int(self.offsets[table]), int(self.offsets[table + 1])
            if self.seals is not None:
                self._whole[table] = lo == hi or self.seals.ready(*self.seals.blocks(lo, hi))
            else:
                self._whole[table] = _seen(bool(self.filled[lo:hi].all()))
        return bool(self._whole[table])

    def known_whole(self) -> bool:
        """Return True once every table was found kept entirely (by :meth:`has_whole`)."""
        return bool(self._whole.all())

    def get(self, table: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Return views of kept rows ``[start, stop)`` of ``table``: values, timestamps."""
        base = int(self.offsets[table])
        return self.values[base + start : base + stop], self.times[base + start : base + stop]

    def put(self, table: int, start: int, values: np.ndarray, times: np.ndarray) -> None:
        """Keep ``values`` / ``times`` as rows ``start, start + 1, ...`` of ``table``."""
        base = int(self.offsets[table]) + start
        self.put_rows(slice(base, base + len(times)), values, times)

    def has_rows(self, rows: np.ndarray) -> bool:
        """Return True if the store rows ``rows`` (positions in the one array) are kept."""
        if self.seals is not None:
            return self.seals.ready_rows(rows)
        return _seen(bool(self.filled[rows].all()))

    def put_rows(self, rows, values: np.ndarray, times: np.ndarray) -> None:
        """Keep ``values`` / ``times`` as the store rows ``rows`` (a slice or positions).

        Values first, flags last (Note: decoded disk cache), then the seals of the blocks
        this left complete (Note: checked blocks): a reader in another process trusts a row
        once its block is sealed (the flags alone in this process's memory).
        """
        if not self.writable:
            return
        self.values[rows] = values
        self.times[rows] = times
        fence()
        self.filled[rows] = True
        if self.seals is not None:
            fence()
            self.seals.sealed_after(rows)
