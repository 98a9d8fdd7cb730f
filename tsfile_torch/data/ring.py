"""Batches from DataLoader workers through a reused ring of shared-memory slots (Note: ring in
:mod:`tsfile_torch.data.handover`).

- :class:`RingControl`: made by :func:`tsfile_torch.make_loader` in the main process for a loader
  with workers; the slot states and generations of every worker (shared memory that travels to
  the workers it starts, with any start method) and the names of the slots' segments.
- In a worker, the loader's collate function ends with :func:`pack`: every tensor of the batch
  that lies in a slot of the worker's :class:`~tsfile_torch.data.handover.WorkerRing` becomes a
  :class:`SlotTensor` (slot, generation, offset, dtype, shape, strides): a few numbers.
- In the main process :class:`RingReceiver` maps each slot segment the first time it names one
  (and unlinks its name at once: no ``/dev/shm`` entry outlives the mapping), and turns a
  :class:`RingBatch` back into tensors that view the mapping, each tensor its own storage (so a
  batch can be ``torch.save``\\ d). Before each later batch it frees the slots whose tensors are
  all gone; a slot whose tensors the consumer still holds two batches later (``list(loader)``,
  a list of batches) is given to the consumer for good: the worker makes a new segment for that
  slot, so nothing is ever written under a held tensor.

How long a batch's tensors stay valid: as long as they are referenced; the memory is reused only
after every tensor (and every view of one) of the batch is gone.

The segments are registered with multiprocessing's resource tracker by the worker that makes
them, so a main process killed by SIGKILL leaves none behind either; :meth:`RingReceiver.close`
(the end of the loader's iterator, a worker failure, the loader's deletion, interpreter exit)
unlinks every segment a worker made that the main process has not mapped yet.

Note: ring platforms. The ring needs POSIX shared memory (Linux, macOS:
:func:`tsfile_torch.compat.posix_shm`); where it is missing (Windows) :func:`ring_available` is
False and :func:`tsfile_torch.make_loader` hands batches over as a plain DataLoader does (a
segment per batch, through torch). A slot is reserved with ``os.posix_fallocate`` where the
platform has it (Linux: a full ``/dev/shm`` is an error when the slot is made, never a SIGBUS
when it is written), else sized with ``os.ftruncate`` (macOS). Both are looked up when used.
"""

from __future__ import annotations

import collections
import mmap
import os
import secrets
import weakref
from multiprocessing import sharedctypes
from typing import Any, NamedTuple

import numpy as np
import torch

from tsfile_torch import compat, mechanisms
from tsfile_torch.data.handover import (
    DETACHED,
    FREE,
    HELD,
    RING_SLOTS,
    shared_buffer,
    worker_ring,
)
from tsfile_torch.data.view import KeptBatch
from tsfile_torch.data.window_items import WindowBatch

# CPython's POSIX shared memory and resource tracker (tsfile_torch.compat); None where the
# platform has none (Windows): no ring (Note: ring platforms)
_shm, _tracker = compat.posix_shm() or (None, None)

__all__ = ["RingBatch", "RingControl", "RingReceiver", "SlotTensor", "pack", "ring_available"]

#: Batches a consumer may still hold before their slots are given to it (the loop variable of
#: ``for batch in loader`` holds the previous batch while the next is fetched).
HOLD = 2


def ring_available() -> bool:
    """Return whether this platform has the POSIX shared memory the ring needs (Note: ring
    platforms)."""
    return _shm is not None and mechanisms.on("ring")


def _reserve(fd: int, size: int) -> None:
    """Give a new segment ``size`` bytes: reserved where ``posix_fallocate`` exists (a full
    ``/dev/shm`` raises ENOSPC now, never a SIGBUS later), else only sized (Note: ring
    platforms)."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:
        os.ftruncate(fd, size)
    else:
        fallocate(fd, 0, size)


class RingControl:
    """The shared slot table of one loader's worker rings (see the module notes).

    Args:
        num_workers: the loader's workers.
        slots: slots per worker.
    """

    def __init__(self, num_workers: int, slots: int = RING_SLOTS):
        self.num_workers, self.slots = num_workers, slots
        self.token = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.states = sharedctypes.RawArray("b", num_workers * slots)
        self.gens = sharedctypes.RawArray("i", num_workers * slots)
        #: passes of the loader begun: a slot taken in an earlier one and still busy holds a
        #: batch the DataLoader drained, never delivered
        self.era = sharedctypes.RawValue("i", 0)
        _tracker.ensure_running()  # before workers start: they share it

    def name(self, worker: int, slot: int, gen: int) -> str:
        return f"/tsfile-torch-{self.token}-{worker}-{slot}-{gen}"

    def create(self, worker: int, slot: int, gen: int, size: int) -> mmap.mmap | None:
        """Make and map a slot segment of ``size`` bytes (in a worker); None when shared
        memory is short (the batch then takes a segment of its own, as without a ring)."""
        name = self.name(worker, slot, gen)
        # registered before it exists: a worker killed right after making it (its main process
        # got SIGKILL) still leaves it to the tracker (which only warns of a name never made)
        _tracker.register(name, "shared_memory")
        try:
            fd = _shm.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        except OSError:
            _tracker.unregister(name, "shared_memory")
            return None
        try:
            _reserve(fd, size)  # a full /dev/shm: an error now, never a SIGBUS
            segment = mmap.mmap(fd, size)
        except OSError:
            _unlink(name)
            return None
        finally:
            os.close(fd)
        return segment

    def reset(self) -> None:
        """New workers start (their slots are new segments): every slot is free."""
        for i in range(len(self.states)):
            self.states[i] = FREE


class SlotTensor(NamedTuple):
    """A tensor of a batch that lies in a ring slot (see the module notes)."""

    worker: int
    slot: int
    gen: int
    offset: int  # bytes from the slot's start to the tensor's first element
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class RingBatch:
    """A worker's batch with its slot tensors as :class:`SlotTensor` (see the module notes)."""

    __slots__ = ("packed",)

    def __init__(self, packed):
        self.packed = packed

    def pin_memory(self, device=None) -> RingBatch:
        return self  # pinned in the main process once it is tensors again


def pack(batch):
    """Return ``batch`` (in a worker) with its tensors as :class:`SlotTensor` (a
    :class:`RingBatch`), or as it is when it holds none.

    Tensors already in a slot of this batch are described where they are; the others (made
    after the read: a dtype conversion, a model's inputs, a user's collate function) are copied
    into one more slot first, so no tensor of the batch travels as a shared-memory handle the
    main process would fetch from the worker (a wait no ``timeout`` covers).
    """
    ring = worker_ring()
    if ring is None or isinstance(batch, KeptBatch):
        return batch
    others: list[torch.Tensor] = []

    def collect(t):
        if isinstance(t, torch.Tensor) and _sendable(t) and ring.locate(t.data_ptr()) is None:
            others.append(t)
        return t

    _rebuild(batch, collect)
    copies = _copy_in(others, ring) if others else {}
    used: set[int] = set()
    packed = _rebuild(batch, lambda t: _slot_tensor(copies.get(id(t), t), ring, used))
    ring.packed(used)
    if used:
        return RingBatch(packed)
    return packed if copies else batch  # copies in a segment of their own: sent as they are


def _sendable(value: torch.Tensor) -> bool:
    return (
        value.numel() > 0
        and value.device.type == "cpu"
        and value.layout == torch.strided
        and not value.requires_grad
        and all(s >= 0 for s in value.stride())
    )


def _rebuild(value, leaf):
    """Return ``value`` with every leaf (a tensor, a :class:`SlotTensor`) replaced by
    ``leaf(it)``, the containers a batch is made of (tuples, named tuples, lists, dicts,
    :class:`WindowBatch`) rebuilt around them; a KeptBatch and anything else as it is."""
    if isinstance(value, (torch.Tensor, SlotTensor)):
        return leaf(value)
    if isinstance(value, WindowBatch):
        return WindowBatch(tuple(_rebuild(p, leaf) for p in value.parts), value.keys)
    if isinstance(value, dict):
        return type(value)((k, _rebuild(v, leaf)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_rebuild(v, leaf) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, leaf) for v in value)
    return value


def _copy_in(tensors: list[torch.Tensor], ring) -> dict[int, torch.Tensor]:
    """Copy ``tensors`` into one more slot; return their copies there by ``id`` of the
    original (the batch's own tensors are left as they are: a dataset may keep them)."""
    spans, total = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        spans.append((total, nbytes))
        total += -(-nbytes // 64) * 64
    buffer = ring.take(total)
    copies = {}
    if buffer is None:  # no slot: a segment of their own, sent as torch sends shared tensors
        shared = shared_buffer(max(total, 1))  # (Note: shared memory short)
        for t, (lo, nbytes) in zip(tensors, spans, strict=True):
            copies[id(t)] = shared[lo : lo + nbytes].view(t.dtype).view(t.shape).copy_(t)
        return copies
    for t, (lo, nbytes) in zip(tensors, spans, strict=True):
        copy = torch.frombuffer(buffer[lo : lo + nbytes], dtype=t.dtype).view(t.shape)
        copies[id(t)] = copy.copy_(t)
    return copies


def _slot_tensor(value: torch.Tensor, ring, used: set[int]):
    """Return ``value`` as a :class:`SlotTensor` if it lies in a slot of this batch (noting the
    slot in ``used``), else as it is."""
    if not _sendable(value):
        return value
    where = ring.locate(value.data_ptr())
    if where is None:
        return value
    slot, gen, offset = where
    used.add(slot)
    return SlotTensor(
        ring.worker, slot, gen, offset, value.dtype, tuple(value.shape), value.stride()
    )


class RingCollate:
    """A loader's collate function in its workers: the batch, then :func:`pack`."""

    def __init__(self, collate_fn):
        self.collate_fn = collate_fn

    def __call__(self, data):
        return pack(self.collate_fn(data))


class RingReceiver:
    """The main process's side of a loader's rings (see the module notes)."""

    def __init__(self, control: RingControl):
        self.control = control
        self._maps: dict[tuple[int, int], tuple[int, mmap.mmap]] = {}
        #: batches handed out: (worker, slot, gen, a weak reference to the batch's buffer)
        self._handed: collections.deque = collections.deque()
        self._finalizer = weakref.finalize(self, _unlink_unmapped, control, self._maps)

    def unpack(self, batch: RingBatch):
        """Return the batch as tensors viewing the slots (call :meth:`release` before)."""
        buffers: dict[tuple[int, int], np.ndarray] = {}
        out = _rebuild(batch.packed, lambda v: _tensor_of(v, self, buffers))
        for (worker, slot), buffer in buffers.items():
            gen = self._maps[worker, slot][0]
            self._handed.append((worker, slot, gen, weakref.ref(buffer)))
        return out

    def buffer(self, worker: int, slot: int, gen: int, buffers: dict) -> np.ndarray:
        """A new array over slot ``(worker, slot)`` for one batch (its liveness is the batch's)."""
        key = (worker, slot)
        if key not in buffers:
            mapped = self._maps.get(key)
            if mapped is None or mapped[0] != gen:
                mapped = self._maps[key] = (gen, self._map(worker, slot, gen))
            buffers[key] = np.frombuffer(mapped[1], dtype=np.uint8)
        return buffers[key]

    def _map(self, worker: int, slot: int, gen: int) -> mmap.mmap:
        name = self.control.name(worker, slot, gen)
        fd = _shm.shm_open(name, os.O_RDWR, 0o600)
        try:
            segment = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        _unlink(name)  # both sides have it mapped: the name is no longer needed
        return segment

    def release(self) -> None:
        """Free the slots of batches that are gone; give those held too long to the consumer."""
        states, slots = self.control.states, self.control.slots
        kept = collections.deque()
        held = len(self._handed)
        for i, (worker, slot, gen, ref) in enumerate(self._handed):
            current = self._maps.get((worker, slot))
            if current is None or current[0] != gen:
                continue  # the slot has a new segment since: this one is the consumer's
            if ref() is None:
                states[worker * slots + slot] = FREE
            elif held - i > HOLD:
                states[worker * slots + slot] = DETACHED  # the consumer keeps it
            else:
                kept.append((worker, slot, gen, ref))
        self._handed = kept

    def new_pass(self) -> None:
        """A pass of the loader begins (before the DataLoader drains the last one's batches):
        the consumer keeps the slots it still holds, the rest are free."""
        states, slots = self.control.states, self.control.slots
        for worker, slot, gen, ref in self._handed:
            current = self._maps.get((worker, slot))
            if current is not None and current[0] == gen:
                states[worker * slots + slot] = FREE if ref() is None else HELD
        self._handed = collections.deque(e for e in self._handed if e[3]() is not None)
        self.control.era.value += 1

    def restart(self) -> None:
        """The loader starts new workers: forget the old ones' slots (their tensors stay)."""
        self.close()
        self._maps.clear()
        self._handed.clear()
        self.control.reset()

    def close(self) -> None:
        """Unlink every slot segment a worker made that was never mapped here."""
        _unlink_unmapped(self.control, self._maps)


def _tensor_of(value, receiver: RingReceiver, buffers: dict):
    """Return the tensor a :class:`SlotTensor` describes, viewing the slot (others as they are)."""
    if not isinstance(value, SlotTensor):
        return value
    buffer = receiver.buffer(value.worker, value.slot, value.gen, buffers)
    itemsize = torch.empty(0, dtype=value.dtype).element_size()
    span = sum((n - 1) * s for n, s in zip(value.shape, value.stride, strict=True)) + 1
    flat = buffer[value.offset : value.offset + span * itemsize]
    return torch.frombuffer(flat, dtype=value.dtype).as_strided(value.shape, value.stride)


def _unlink(name: str) -> None:
    try:
        _shm.shm_unlink(name)
    except FileNotFoundError:
        pass
    _tracker.unregister(name, "shared_memory")


def _unlink_unmapped(control: RingControl, maps: dict[tuple[int, int], Any]) -> None:
    """Unlink the newest segment of every slot that was made but never mapped here (in flight
    when the loader stopped, or its worker died first): older ones were all mapped."""
    for i, gen in enumerate(control.gens):
        worker, slot = divmod(i, control.slots)
        mapped = maps.get((worker, slot))
        if gen and (mapped is None or mapped[0] != gen):
            name = control.name(worker, slot, gen)
            try:
                _shm.shm_unlink(name)
            except FileNotFoundError:
                continue
            _tracker.unregister(name, "shared_memory")
