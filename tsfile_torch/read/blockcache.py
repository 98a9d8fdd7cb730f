"""BlockCache: decoded blocks kept by key in a byte-bounded LRU, with their buffers recycled.

(Note: recycled buffers.) Blocks dropped from the cache keep their memory in a spare list and are
refilled by the next decode, so an epoch does not fault fresh pages in (benchmarks/RESULTS.md,
"Reused decode buffers"). A spare serves any block of as many fields and at most as many rows,
because a worker's stretch of random batches, and so its blocks' shapes, changes each epoch. Spares
beyond the cache's capacity (at least :data:`MIN_SPARE_BYTES`) are dropped, smallest first. A block
over another process's memory (Note: block exchange in :mod:`tsfile_torch.read.exchange`) is never
recycled: dropping it releases it to its owner instead."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Block", "BlockCache", "MIN_SPARE_BYTES"]

#: spare buffers kept at least, whatever the capacity (a cache of 0 bytes still reuses the
#: buffers of its exact reads)
MIN_SPARE_BYTES = 64 << 20


@dataclass
class Block:
    """Decoded rows of one read group: ``times`` int64 ``(n,)``, ``values`` ``(k, n)``."""

    times: np.ndarray
    values: np.ndarray
    #: its timestamps were found equal to the timestamp column's for all its rows
    verified: bool = False
    #: calendar features of ``times`` (windows' ``time_features``), computed once per block
    features: np.ndarray | None = None
    #: set on a block over shared memory (Note: block exchange): called once it is dropped
    release: Callable[[], None] | None = None
    #: the whole buffers a block of :meth:`BlockCache.buffers` lies in (times, flat values)
    spare: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def nbytes(self) -> int:
        extra = 0 if self.features is None else self.features.nbytes
        return self.times.nbytes + self.values.nbytes + extra


class BlockCache:
    """A byte-bounded LRU of :class:`Block` objects keyed by any hashable.

    Args:
        capacity: bytes of blocks kept; a block larger than that is never stored.
        dtype: dtype of the value buffers handed out by :meth:`buffers`.
        recycle: keep evicted blocks' memory for :meth:`buffers` (only for caches whose blocks
            come from :meth:`buffers`).
    """

    def __init__(self, capacity: int, dtype, recycle: bool = True):
        self.capacity = capacity
        self.recycle_evicted = recycle
        self.dtype = np.dtype(dtype)
        self.nbytes = 0
        self._blocks: OrderedDict[object, Block] = OrderedDict()
        self._spare: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # by fields
        self._spare_bytes = 0
        self._lock = threading.Lock()  # spares are taken from decode threads

    def __contains__(self, key) -> bool:
        return key in self._blocks

    def peek(self, key) -> Block | None:
        """Return the block stored under ``key`` without touching the LRU order, or ``None``."""
        return self._blocks.get(key)

    def get(self, key) -> Block | None:
        """Return the block stored under ``key`` (now most recently used), or ``None``."""
        block = self._blocks.get(key)
        if block is not None:
            self._blocks.move_to_end(key)
        return block

    def put(self, key, block: Block) -> None:
        """Store ``block``, dropping least recently used blocks to stay within capacity."""
        if block.nbytes > self.capacity:
            return
        self._blocks[key] = block
        self.nbytes += block.nbytes
        while self.nbytes > self.capacity:
            _, old = self._blocks.popitem(last=False)
            self.nbytes -= old.nbytes
            if self.recycle_evicted or old.release is not None:
                self.recycle(old)

    def buffers(self, k: int, n: int) -> Block:
        """Return a block of ``k`` x ``n`` values to fill: in recycled buffers if some are
        large enough (the smallest such), else new ones."""
        with self._lock:
            spares = self._spare.get(k, [])
            fits = [i for i, (times, _) in enumerate(spares) if len(times) >= n]
            if fits:
                times, flat = spares.pop(min(fits, key=lambda i: len(spares[i][0])))
                self._spare_bytes -= times.nbytes + flat.nbytes
                return _in(times, flat, k, n)
        return _in(np.empty(n, dtype=np.int64), np.empty(k * n, dtype=self.dtype), k, n)

    def recycle(self, block: Block) -> None:
        """Keep ``block``'s buffers for a later :meth:`buffers` call (a block over shared
        memory is released instead; one not made by :meth:`buffers` is let go)."""
        if block.release is not None:
            block.release()
            return
        if block.spare is None:
            return
        times, flat = block.spare
        block.spare = None  # recycled once, whoever drops it again
        with self._lock:
            spares = self._spare.setdefault(block.values.shape[0], [])
            spares.append((times, flat))
            self._spare_bytes += times.nbytes + flat.nbytes
            while self._spare_bytes > max(self.capacity, MIN_SPARE_BYTES) and self._spare:
                k, i = min(
                    ((k, i) for k, v in self._spare.items() for i in range(len(v))),
                    key=lambda ki: len(self._spare[ki[0]][ki[1]][0]),
                )
                dropped = self._spare[k].pop(i)
                self._spare_bytes -= dropped[0].nbytes + dropped[1].nbytes
                if not self._spare[k]:
                    del self._spare[k]

    def clear(self, drop_buffers: bool = False) -> None:
        """Drop every block (keeping their buffers for reuse unless ``drop_buffers``)."""
        for block in self._blocks.values():
            if block.release is not None or (not drop_buffers and self.recycle_evicted):
                self.recycle(block)
        self._blocks.clear()
        self.nbytes = 0
        if drop_buffers:
            with self._lock:
                self._spare.clear()
                self._spare_bytes = 0


def _in(times: np.ndarray, flat: np.ndarray, k: int, n: int) -> Block:
    """A block of ``k`` x ``n`` values at the start of buffers ``times`` and ``flat``."""
    return Block(times[:n], flat[: k * n].reshape(k, n), spare=(times, flat))
