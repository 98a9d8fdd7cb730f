"""BlockCache: decoded blocks kept by key in a byte-bounded LRU, with their buffers recycled.

(Note: recycled buffers.) Blocks dropped from the cache keep their memory in a spare list and are
refilled by the next decode of the same shape: fresh arrays would page-fault every epoch
(measured: ~140k minor faults per streaming epoch of the reference workload). A block over
another process's memory (Note: block exchange in :mod:`tsfile_torch.read.exchange`) is never
recycled: dropping it releases it to its owner instead.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["Block", "BlockCache"]


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
        self._spare: dict[tuple[int, int], list[Block]] = {}
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
        """Return a block of ``k`` x ``n`` values to fill: a recycled one if there is one."""
        with self._lock:
            spare = self._spare.get((k, n))
            if spare:
                block = spare.pop()
                block.verified = False
                return block
        return Block(np.empty(n, dtype=np.int64), np.empty((k, n), dtype=self.dtype))

    def recycle(self, block: Block) -> None:
        """Keep ``block``'s memory for a later :meth:`buffers` call of the same shape (a block
        over shared memory is released instead)."""
        if block.release is not None:
            block.release()
            return
        with self._lock:
            self._spare.setdefault(block.values.shape, []).append(block)

    def clear(self, drop_buffers: bool = False) -> None:
        """Drop every block (keeping their buffers for reuse unless ``drop_buffers``)."""
        for block in self._blocks.values():
            if block.release is not None or (not drop_buffers and self.recycle_evicted):
                self.recycle(block)
        self._blocks.clear()
        self.nbytes = 0
        if drop_buffers:
            self._spare.clear()
