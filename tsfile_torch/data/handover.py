"""The one hand-over of worker batches: every array of a batch carved from one buffer.

Note: ring. Under :func:`tsfile_torch.make_loader` that buffer is a slot of the worker's
:class:`WorkerRing`: a few shared-memory segments created once by the worker, mapped once by
the main process and reused batch after batch, so a batch travels as a slot number and its
arrays' layouts (:mod:`tsfile_torch.data.ring`), with no new segment, file descriptor or
round trip to the worker per batch. A slot is written only when the main process has marked
it free (every tensor it handed out of it is gone); with no free slot (a consumer that keeps
batches) the worker takes a new segment, and beyond :data:`RING_SLOTS` slots it falls back to
a segment per batch, as a plain DataLoader does: it never waits.

In a DataLoader worker a batch travels to the main process through shared memory. Allocating
its arrays there from the start (as ``default_collate`` does) saves copying them at pickling,
and carving every array of a batch (values, times, masks, features, ids) from one buffer costs
one file-descriptor hand-over per batch, each a round trip to the busy worker's resource-sharer
thread, not one per array (dict items have six). Rows, windows and mixtures all allocate their
batches here (:func:`batch_arrays`), and make tensors of them with :func:`as_tensor`; outside a
worker the arrays are plain numpy arrays. Kept batches go by reference (Note: hand-over in
:mod:`tsfile_torch.data.view`).

Note: shared memory short. A batch's segment lives in ``/dev/shm`` (a tmpfs: 64 MiB in a
container by default). When a ring slot cannot be made there (``posix_fallocate`` reserves it
first, so a full ``/dev/shm`` is an error at once, never a SIGBUS later) the batch takes a
segment of its own through torch (:func:`shared_buffer`); when that fails too, the worker raises
a :class:`~tsfile_torch.errors.ResourceError` naming ``/dev/shm``, its free space and the fixes
(:func:`shm_error`), which the DataLoader re-raises in the main process. torch 2.1 to 2.13 leave
the name of a segment whose allocation failed in ``/dev/shm`` (``/torch_<pid>_...``, named in its
error): :func:`shared_buffer` unlinks it, so nothing is left behind.
"""

from __future__ import annotations

import math
import mmap
import os
import re
import shutil
import sys
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.errors import ResourceError
from tsfile_torch.native.errors import address_space_limit
from tsfile_torch.pids import ending_deferred

__all__ = [
    "RING_SLOTS",
    "WorkerRing",
    "as_tensor",
    "batch_array",
    "batch_arrays",
    "shared_buffer",
    "shm_error",
    "worker_ring",
]

#: Slots per worker ring: a worker's batches in flight (``prefetch_factor``, more when other
#: workers finish first), the two its consumer may still hold, the one being written.
RING_SLOTS = 8
#: slot states: written by the worker (BUSY: taken for a batch) or the main process (FREE: its
#: batch is gone; DETACHED: the consumer keeps it, make a new segment; HELD: busy, delivered in
#: an earlier pass of the loader)
FREE, BUSY, DETACHED, HELD = 0, 1, 2, 3

_ring: WorkerRing | None = None


def worker_ring() -> WorkerRing | None:
    """Return this worker's ring (None outside a make_loader worker)."""
    return _ring


class WorkerRing:
    """The batch buffers of one DataLoader worker (Note: ring), on the worker's side.

    ``control``: the loader's :class:`~tsfile_torch.data.ring.RingControl` (slot states and
    generations shared with the main process); ``worker``: this worker's id.
    """

    def __init__(self, control, worker: int):
        self.control, self.worker = control, worker
        self.base = worker * control.slots
        self.maps: list[tuple[int, mmap.mmap, np.ndarray] | None] = [None] * control.slots
        self.pending: list[int] = []  # slots taken since the last batch was packed
        self.eras = [0] * control.slots  # the loader's pass count when each slot was taken

    @staticmethod
    def install(control, worker: int) -> None:
        """Give this worker process its ring (the loader's worker_init_fn)."""
        global _ring
        _ring = WorkerRing(control, worker)

    def take(self, nbytes: int) -> np.ndarray | None:
        """Return a free slot's buffer (uint8) of at least ``nbytes``, or None (no slot free)."""
        states, gens, era = self.control.states, self.control.gens, self.control.era.value
        renew = None
        for s, held in enumerate(self.maps):
            state = states[self.base + s]
            if state == BUSY and self.eras[s] < era:
                state = FREE  # taken in an earlier pass and never delivered (a drained batch)
            if held is not None and state == FREE and len(held[2]) >= nbytes:
                states[self.base + s] = BUSY
                self.eras[s] = era
                self.pending.append(s)
                return held[2]
            if renew is None and (held is None or state in (FREE, DETACHED)):
                renew = s  # never made, given to the consumer, or too small: a new segment
        if renew is None:
            return None
        gen = gens[self.base + renew] + 1
        size = max(-(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE, mmap.PAGESIZE)
        # made and announced as one step: the main process unlinks the segments it was told of
        # (a worker ended between the two left one to the resource tracker, which warns)
        with ending_deferred():
            segment = self.control.create(self.worker, renew, gen, size)
            if segment is None:
                return None
            gens[self.base + renew] = gen
        self.maps[renew] = (gen, segment, np.frombuffer(segment, dtype=np.uint8))
        states[self.base + renew] = BUSY
        self.eras[renew] = era
        self.pending.append(renew)
        return self.maps[renew][2]

    def locate(self, address: int) -> tuple[int, int, int] | None:
        """Return (slot, generation, offset) of ``address`` in a slot taken for this batch."""
        for s in self.pending:
            gen, _, buffer = self.maps[s]
            start = buffer.__array_interface__["data"][0]
            if start <= address < start + len(buffer):
                return s, gen, address - start
        return None

    def packed(self, used: set[int]) -> None:
        """A batch was packed: slots taken for it that it does not use are free again."""
        for s in self.pending:
            if s not in used:
                self.control.states[self.base + s] = FREE
        self.pending = []


def batch_arrays(specs: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, np.ndarray]:
    """Return empty arrays of the given (shape, dtype) by name for one batch.

    In a DataLoader worker they are carved from one shared-memory buffer (see the module
    notes); their tensors must be made with :func:`as_tensor` to stay views of it.
    """
    if tud.get_worker_info() is None:
        return {name: np.empty(shape, dtype=dtype) for name, (shape, dtype) in specs.items()}
    spans, total = {}, 0
    for name, (shape, dtype) in specs.items():
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        spans[name] = (total, nbytes)
        total += -(-nbytes // 64) * 64  # every array 64-byte aligned
    buffer = _ring.take(max(total, 1)) if _ring is not None else None
    if buffer is None:  # no ring (a plain DataLoader) or no slot free: a segment of its own
        buffer = shared_buffer(max(total, 1)).numpy()
    return {
        name: buffer[lo : lo + nbytes].view(dtype).reshape(shape)
        for (name, (shape, dtype)), (lo, nbytes) in zip(specs.items(), spans.values(), strict=True)
    }


def shared_buffer(nbytes: int) -> torch.Tensor:
    """Return a new shared-memory buffer of ``nbytes`` (a uint8 tensor) through torch, a segment
    of its own (Note: shared memory short).

    Raises:
        ResourceError: shared memory (``/dev/shm``) or memory is short.
    """
    try:
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()
    except RuntimeError as err:
        # torch names the segment it failed to allocate and leaves it behind: unlink it
        left = re.search(r"</(torch_[\w.-]+)>", str(err))
        if left is None and "shared memory" not in str(err) and "mmap" not in str(err):
            raise  # not an allocation
        if left is not None and os.path.isdir("/dev/shm"):
            try:
                os.unlink(os.path.join("/dev/shm", left.group(1)))
            except OSError:
                pass
        raise shm_error(nbytes, err) from err


def shm_error(nbytes: int, err: BaseException) -> ResourceError:
    """Return the error for ``nbytes`` of shared memory that could not be had (Note: shared
    memory short): ``/dev/shm`` full (its free space and the fixes), or memory short."""
    need = f"{nbytes / 2**20:.1f} MiB"
    free = None
    if sys.platform.startswith("linux") and os.path.isdir("/dev/shm"):
        usage = shutil.disk_usage("/dev/shm")
        free = usage.free
        where = f"/dev/shm has {usage.free / 2**20:.1f} MiB free of {usage.total / 2**20:.0f} MiB"
    else:
        where = "the system's shared memory is short"
    if free is not None and free >= nbytes:  # room in /dev/shm: mapping it failed (memory)
        limit = address_space_limit()
        said = f"an address-space limit (`ulimit -v`) of {limit >> 20} MiB" if limit else ""
        return ResourceError(
            f"a DataLoader worker could not map {need} of shared memory for a batch ({err}); "
            f"{where}, so this process's memory is short{': ' + said if said else ''}; free "
            f"memory or raise the limit, or give each worker less to hold (fewer num_workers, "
            f"a smaller batch_size), or read in the main process (num_workers=0)"
        )
    return ResourceError(
        f"a DataLoader worker could not allocate {need} of shared memory for a batch ({err}): "
        f"{where}; batches travel from workers to the main process through /dev/shm (a "
        f"container's is 64 MiB unless set): give it more (`docker run --shm-size=8g`, or a "
        f"memory-backed emptyDir mounted at /dev/shm in Kubernetes), read in the main process "
        f"(make_loader(..., num_workers=0)), or keep decoded rows on disk (cache='disk': "
        f"workers then hand batches over by reference), or lower batch_size / num_workers"
    )


def batch_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Return one empty array for a batch (see :func:`batch_arrays`)."""
    return batch_arrays({"array": (shape, dtype)})["array"]


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """Return ``array`` as a tensor; an array of :func:`batch_arrays` stays a view of its buffer.

    In a ring slot (Note: ring) the tensor wraps the array itself; the packing of the batch
    (:func:`tsfile_torch.data.ring.pack`) finds it there by its address.

    ``torch.from_numpy`` wraps such an array in a new storage that is not shared, and
    DataLoader then copies each such tensor into a new shared-memory segment of its own when a
    worker sends the batch. A view of the shared buffer is sent as a reference to it.
    """
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, mmap.mmap):  # a ring slot's: wrapped in place
        return torch.from_numpy(array)
    if not isinstance(base, torch.Tensor) or not base.is_shared():
        return torch.from_numpy(array)
    itemsize = array.itemsize
    offset = array.__array_interface__["data"][0] - base.data_ptr()
    offset += base.storage_offset() * base.element_size()
    if offset % itemsize or any(s % itemsize for s in array.strides):
        return torch.from_numpy(array)
    out = torch.empty(0, dtype=torch.from_numpy(array[:0]).dtype)
    return out.set_(
        base.untyped_storage(),
        offset // itemsize,
        array.shape,
        [s // itemsize for s in array.strides],
    )
