"""The one hand-over of worker batches: every array of a batch carved from one buffer.

In a DataLoader worker a batch travels to the main process through shared memory. Allocating
its arrays there from the start (as ``default_collate`` does) saves copying them at pickling,
and carving every array of a batch (values, times, masks, features, ids) from one buffer costs
one file-descriptor hand-over per batch, each a round trip to the busy worker's resource-sharer
thread, not one per array (dict items have six: measured through 2 workers, the round trips
were a third of the main process's time). Rows, windows and mixtures all allocate their
batches here (:func:`batch_arrays`), and make tensors of them with :func:`as_tensor`; outside a
worker the arrays are plain numpy arrays. Kept batches go by reference (Note: hand-over in
:mod:`tsfile_torch.data.view`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

__all__ = ["as_tensor", "batch_array", "batch_arrays"]


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
    buffer = torch.empty(max(total, 1), dtype=torch.uint8).share_memory_().numpy()
    return {
        name: buffer[lo : lo + nbytes].view(dtype).reshape(shape)
        for (name, (shape, dtype)), (lo, nbytes) in zip(specs.items(), spans.values(), strict=True)
    }


def batch_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Return one empty array for a batch (see :func:`batch_arrays`)."""
    return batch_arrays({"array": (shape, dtype)})["array"]


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """Return ``array`` as a tensor; an array of :func:`batch_arrays` stays a view of its buffer.

    ``torch.from_numpy`` wraps such an array in a new storage that is not shared, and
    DataLoader then copies each such tensor into a new shared-memory segment of its own when a
    worker sends the batch. A view of the shared buffer is sent as a reference to it.
    """
    base = array.base
    while isinstance(base, np.ndarray):
        base = base.base
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
