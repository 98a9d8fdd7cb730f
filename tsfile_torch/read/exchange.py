"""BlockExchange: decoded blocks that fork DataLoader workers hand each other in shared memory.

Note: block exchange. A shuffled batch (``order="shuffle"``) gathers rows from every block of
its shuffle buffer, so with a streaming loader (``cache="none"``) every worker whose batches
come from one buffer would decode all of that buffer's blocks: on the reference workload (one
buffer) 2 workers decoded the epoch twice. Under :func:`tsfile_torch.make_loader` with fork
workers, the main process makes one exchange per core before the workers start: fixed-size
slots in anonymous shared memory (``mmap(-1)``: no ``/dev/shm`` name, nothing left behind) and
a table saying which block each slot holds. A worker that misses a block in its own cache
claims it, decodes it, copies it into the slot and publishes it; the others take it from
there instead of decoding it again, so the workers together decode each block of an epoch
about once, in parallel (claims are first come, first served: each worker decodes the blocks
nobody claimed yet, then waits for the rest). Windows in the shuffled orders, and
mixtures of them, are the same: a batch gathers from the finalized blocks
(:meth:`~tsfile_torch.read.core.ReadingCore.block`) of devices all over its buffer or the data;
their workers share those (:func:`~tsfile_torch.read.core.share_finalized_blocks`).
One mechanism, :func:`fill_cache`, serves both: a view says which blocks a gather touches and
how one is decoded (:attr:`~tsfile_torch.data.view.LoaderSpec.gather_block`: the largest).

Guarantees:
- **Streaming stays streaming**: a slot serves only the epoch it was decoded in; the next
  epoch decodes again (the files are checked unchanged at each epoch, as without workers).
- **Bounded memory**: as many slots as one reader's cache holds; a slot is reused only when no
  live process holds it (each worker releases a block when its cache drops it, and every block
  of its cache when a pass begins; each process marks what it holds in a column of its own,
  taken when its reader opens, so loaders sharing a dataset and the new workers of each epoch
  never clear each other's marks, and a process that ended holds nothing). With no slot free,
  a worker decodes on its own, as before.
- **No hang**: a block claimed by a worker that died is claimed again; a claim or a lock held
  longer than :data:`WAIT_S` (a stopped worker) is given up and the block decoded locally.
- **Checks**: the claimer's decode runs every check (statistics, cell sums shared with the
  workers); takers check the timestamps of what they gather, as for any block.
"""

from __future__ import annotations

import mmap
import os
import time
from multiprocessing import get_context

import numpy as np

from tsfile_torch.pids import alive
from tsfile_torch.read.blockcache import Block

__all__ = ["BUSY", "BlockExchange", "WAIT_S", "fill_cache"]

#: seconds a worker waits for a block another worker claimed (or for the exchange's lock)
#: before decoding it itself: far above a block's decode
WAIT_S = 10.0
#: the most slots an exchange has (its table is scanned on each miss of a worker's cache)
MAX_SLOTS = 1024
_POLL_S = 0.0005  # sleep between looks at a claimed block

# columns of the slot table
_GROUP, _BLOCK, _LO, _HI, _STATE, _EPOCH, _PID, _D0, _D1, _USED = range(10)
_COLUMNS = 10
_FREE, _CLAIMED, _READY = 0, 1, 2

#: :meth:`BlockExchange.acquire`'s answer for a block another live worker is decoding
BUSY = "busy"


class BlockExchange:
    """Slots of decoded blocks shared by one loader's fork workers (Note: block exchange).

    Args:
        slot_bytes: bytes of one slot: the largest block (timestamps, then values).
        num_slots: slots.
        num_workers: workers expected at once; each process that reads through the exchange
            takes a holder column of its own (:meth:`bind`), and there are ``4 x num_workers``
            (at least 16): loaders sharing a dataset, and new workers each epoch, reuse the
            columns of processes that ended.
    """

    def __init__(self, slot_bytes: int, num_slots: int, num_workers: int):
        self.slot_bytes = -(-slot_bytes // 64) * 64
        self.num_slots = num_slots
        columns = min(max(4 * num_workers, 16), 256)
        table_bytes = num_slots * _COLUMNS * 8 + columns * 8 + num_slots * columns
        head = -(-table_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
        self._map = mmap.mmap(-1, head + num_slots * self.slot_bytes)  # MAP_SHARED, zeros
        table = np.frombuffer(self._map, np.int64, num_slots * _COLUMNS)
        self._table = table.reshape(num_slots, _COLUMNS)
        at = num_slots * _COLUMNS * 8
        self._pids = np.frombuffer(self._map, np.int64, columns, at)  # each column's process
        holders = np.frombuffer(self._map, np.uint8, num_slots * columns, at + columns * 8)
        self._holders = holders.reshape(num_slots, columns)
        self._data_at = head
        self._lock = get_context("fork").Lock()
        self.column = None  # this process's holder column (:meth:`bind`)
        self.broken = False  # a lock was held too long: this process stops using the exchange

    @classmethod
    def for_blocks(cls, block_rows: int, max_fields: int, capacity: int, num_workers: int):
        """Return an exchange whose slots hold blocks of ``block_rows`` rows of ``max_fields``
        values (8 bytes each at most) and a timestamp, ``capacity`` bytes of them (one
        process's cache), or ``None`` where not even two slots fit."""
        slot_bytes = block_rows * (max_fields * 8 + 8)
        num_slots = min(MAX_SLOTS, capacity // max(slot_bytes, 1))
        return cls(slot_bytes, num_slots, num_workers) if num_slots >= 2 else None

    def bind(self) -> bool:
        """Take a holder column for this process (a free one, or one of a process that
        ended: what it held is dropped); ``False`` when none is left or the lock is stuck
        (this process then reads without the exchange)."""
        pid = os.getpid()
        if self.column is not None and self._pids[self.column] == pid:
            return True
        if not self._locked():
            return False
        try:
            for column, owner in enumerate(self._pids.tolist()):
                if owner == pid or not alive(owner):  # 0: never taken
                    self._pids[column] = pid
                    self._holders[:, column] = 0
                    self.column = column
                    return True
            self.broken = True
            return False
        finally:
            self._lock.release()

    # -- slots -------------------------------------------------------------------------------
    def acquire(self, key: tuple[int, int, int, int], dtype, epoch: int):
        """Look up block ``key`` = (group, block, lo, hi) as decoded in ``epoch``.

        Returns a :class:`Block` over the slot (held until its ``release``) when it is
        published; ``(slot,)`` when this worker must decode it now and :meth:`publish` it (or
        :meth:`abandon` it); :data:`BUSY` when another live worker is decoding it; ``None``
        when the exchange cannot help (no slot free, or its lock is stuck): decode it alone.
        """
        if self.broken or self.column is None or not self._locked():
            return None
        try:
            t = self._table
            same = np.flatnonzero(
                (t[:, _GROUP] == key[0])
                & (t[:, _BLOCK] == key[1])
                & (t[:, _LO] == key[2])
                & (t[:, _HI] == key[3])
                & (t[:, _EPOCH] == epoch)
                & (t[:, _STATE] != _FREE)
            )
            if len(same):
                slot = int(same[0])
                if t[slot, _STATE] == _READY:
                    self._holders[slot, self.column] = 1
                    return self._view(slot, key, dtype)
                pid = int(t[slot, _PID])
                if pid != os.getpid() and alive(pid):
                    return BUSY
                t[slot, _PID] = os.getpid()  # its claimer died: decode it here
                return (slot,)
            slot = self._free_slot(epoch)
            if slot is None:
                return None
            t[slot] = (*key, _CLAIMED, epoch, os.getpid(), 0, 0, 0)
            return (slot,)
        finally:
            self._lock.release()

    def publish(self, claim: tuple[int], block: Block) -> Block:
        """Copy ``block`` (decoded by this worker after :meth:`acquire` answered ``claim``)
        into its slot, mark it published and return the slot's copy, held by this worker."""
        (slot,) = claim
        if block.times.nbytes + block.values.nbytes > self.slot_bytes:  # not made for it
            self.abandon(claim)
            return block
        shape = block.values.shape
        times, values = self._arrays(slot, len(block.times), shape, block.values.dtype)
        times[:] = block.times
        values[:] = block.values
        if not self._locked():  # unpublished: the decoded block serves, waiters give up
            return block  # on the claim after WAIT_S
        try:
            self._table[slot, _D0], self._table[slot, _D1] = shape
            self._table[slot, _STATE] = _READY  # after the values (the lock is the fence)
            self._holders[slot, self.column] = 1
        finally:
            self._lock.release()
        return self._block(slot, times, values)

    def abandon(self, claim: tuple[int]) -> None:
        """Give back a claim whose decode failed (another worker then claims it)."""
        if not self._locked():
            return  # the claim stays; waiters give up on it after WAIT_S
        try:
            self._table[claim[0], _STATE] = _FREE
        finally:
            self._lock.release()

    def wait(self, key: tuple[int, int, int, int], dtype, epoch: int):
        """:meth:`acquire` until the block is not :data:`BUSY`; after :data:`WAIT_S` of a
        live claimer's silence (a stopped worker), ``None``: decode it alone."""
        deadline = time.monotonic() + WAIT_S
        while True:
            got = self.acquire(key, dtype, epoch)
            if got is not BUSY:
                return got
            if time.monotonic() > deadline:
                return None
            time.sleep(_POLL_S)

    def held(self) -> int:
        """Return the slots this process holds."""
        return int(self._holders[:, self.column].sum())

    # -- helpers -----------------------------------------------------------------------------
    def _locked(self) -> bool:
        """Take the lock; ``False`` (and the exchange given up in this process) when another
        process held it for :data:`WAIT_S` (it was stopped, or died holding it)."""
        if self._lock.acquire(timeout=WAIT_S):
            return True
        self.broken = True
        return False

    def _free_slot(self, epoch: int) -> int | None:
        """Return a slot to claim (lock held), one no worker holds: published in an earlier
        epoch (its pages are mapped in every worker already: no page faults), else never used,
        else claimed by a worker that died, else published in this epoch; the least recently
        used first. A claim of a live worker is never taken: it may still write its values."""
        t = self._table
        live = [c for c, p in enumerate(self._pids.tolist()) if alive(p)]
        idle = ~self._holders[:, live].any(axis=1)  # a process that ended holds nothing
        ready = idle & (t[:, _STATE] == _READY)
        for pick in (ready & (t[:, _EPOCH] != epoch), idle & (t[:, _STATE] == _FREE)):
            slots = np.flatnonzero(pick)
            if len(slots):
                return int(slots[np.argmin(t[slots, _USED])])
        for s in np.flatnonzero(idle & (t[:, _STATE] == _CLAIMED)):
            if not alive(int(t[s, _PID])):
                return int(s)
        slots = np.flatnonzero(ready)
        return int(slots[np.argmin(t[slots, _USED])]) if len(slots) else None

    def _release(self, slot: int) -> None:
        """This worker no longer reads ``slot`` (its cache dropped the block)."""
        if self.broken or not self._locked():
            return
        try:
            self._holders[slot, self.column] = 0
            self._table[slot, _USED] = int(self._table[:, _USED].max()) + 1
        finally:
            self._lock.release()

    def _arrays(self, slot: int, n: int, shape, dtype) -> tuple[np.ndarray, np.ndarray]:
        """``n`` timestamps, then values of ``shape``, in ``slot``."""
        at = self._data_at + slot * self.slot_bytes
        times = np.frombuffer(self._map, np.int64, n, at)
        values = np.frombuffer(self._map, dtype, shape[0] * shape[1], at + n * 8).reshape(shape)
        return times, values

    def _view(self, slot: int, key, dtype) -> Block:
        """The published block in ``slot`` (lock held), read-only."""
        shape = (int(self._table[slot, _D0]), int(self._table[slot, _D1]))
        times, values = self._arrays(slot, key[3] - key[2], shape, dtype)
        times.flags.writeable = values.flags.writeable = False
        return self._block(slot, times, values)

    def _block(self, slot: int, times: np.ndarray, values: np.ndarray) -> Block:
        return Block(times, values, release=lambda: self._release(slot))

    def __getstate__(self):
        raise TypeError("a BlockExchange reaches fork workers only (anonymous shared memory)")


def fill_cache(exchange, cache, epoch: int, dtype, wanted, decode, prepare=None) -> None:
    """Put the blocks of ``wanted`` that ``cache`` lacks into it through ``exchange`` (Note:
    block exchange): published ones are taken, unclaimed ones claimed and decoded here
    (``decode(key) -> Block``), and those another worker is decoding waited for last.

    ``wanted``: ``(cache key, exchange key, nbytes)`` of each block a gather touches, the
    exchange key ``(table or group, block, lo, hi)``; ``prepare(block)`` runs on each block
    put into the cache (a view's per-block extras). When the missing ones would not fit the
    cache together (they would evict each other before the gather), none is taken; blocks
    the exchange cannot give are left to the gather, which decodes them as without workers.
    """
    missing = {c: (key, n) for c, key, n in wanted if c not in cache}
    if sum(n for _, n in missing.values()) > cache.capacity:
        return
    waiting = []
    for c, (key, _) in missing.items():
        got = exchange.acquire(key, dtype, epoch)
        if got is BUSY:
            waiting.append((c, key))
        else:
            _keep(exchange, cache, c, key, got, decode, prepare)
    for c, key in waiting:
        _keep(exchange, cache, c, key, exchange.wait(key, dtype, epoch), decode, prepare)


def _keep(exchange, cache, c, key, got, decode, prepare) -> None:
    """Put what :meth:`BlockExchange.acquire` gave for ``key`` into ``cache`` as ``c``."""
    if got is None:
        return
    if isinstance(got, tuple):  # claimed: decode it here, for every worker
        try:
            block = decode(key)
        except BaseException:
            exchange.abandon(got)
            raise
        got = exchange.publish(got, block)
        if got is not block:
            cache.recycle(block)  # its buffers, for the next decode
    if prepare is not None:
        prepare(got)
    cache.put(c, got)
    if c not in cache:  # larger than the whole cache: not kept
        cache.recycle(got)
