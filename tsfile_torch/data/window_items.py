"""Window items: what a batch of windows is made of, and how it is handed out.

:class:`WindowItems` knows the shape of a window view's items (context, horizon, which fields
are ``x`` and ``y``, dict items or tuples, time features) and turns the arrays a batch was
gathered into (:func:`~tsfile_torch.data.handover.batch_arrays`, so a worker's batch is one
shared-memory buffer) into a :class:`WindowBatch`: tuples ``(x, y, ...)`` or Hugging Face
style dict items. :func:`collate_windows` hands a batch over as stacked tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.data.features import fill_missing, time_features
from tsfile_torch.data.handover import as_tensor
from tsfile_torch.data.view import KeptBatch, LoaderSpec

__all__ = ["WindowBatch", "WindowItems", "collate_windows", "pad_windows", "window_loader_spec"]


class WindowBatch(Sequence):
    """Windows of one batch, stored stacked: a sequence of items that are views into it.

    ``default_collate`` stacks its items again (correct, one copy and one object per window);
    :func:`collate_windows` hands the stacked tensors over as they are.
    """

    def __init__(self, parts: tuple[torch.Tensor, ...], keys: tuple[str, ...] | None = None):
        self.parts = parts
        #: names of the parts when items are dicts (``return_dict=True``)
        self.keys = keys

    def __len__(self) -> int:
        return len(self.parts[0])

    def __getitem__(self, i):
        if self.keys is not None:
            return {key: p[i] for key, p in zip(self.keys, self.parts, strict=True)}
        if len(self.parts) == 1:
            return self.parts[0][i]
        return tuple(p[i] for p in self.parts)


class TensorWindows(tuple, WindowBatch):
    """Windows that are one tensor each (``horizon=0``, no timestamps): a tuple of views into
    one stacked tensor, so torch's ``default_collate`` stacks it as the list of samples a plain
    DataLoader gives it, while :func:`collate_windows` hands the stacked tensor over as it is."""

    def __new__(cls, stacked: torch.Tensor):
        return super().__new__(cls, stacked.unbind(0))

    def __init__(self, stacked: torch.Tensor):
        self.parts, self.keys = (stacked,), None


def collate_windows(batch):
    """``collate_fn`` for window batches: stacked tensors without a Python object per window.

    A :class:`WindowBatch` becomes ``x``, the tuple ``(x, y, ...)`` or (``return_dict=True``)
    the dict of batched tensors; anything else goes to ``default_collate``.
    """
    if isinstance(batch, KeptBatch):
        return batch  # served by make_loader's iterator (Note: hand-over)
    if isinstance(batch, WindowBatch):
        if batch.keys is not None:
            return dict(zip(batch.keys, batch.parts, strict=True))
        return batch.parts[0] if len(batch.parts) == 1 else batch.parts
    return tud.default_collate(batch)


@dataclass
class WindowItems:
    """The shape of a window view's items (see the module notes)."""

    context_length: int
    horizon: int
    fields: list[str]
    x_pos: list[int]
    y_pos: list[int]
    return_dict: bool
    time_features: tuple[str, ...]
    dtype: str
    fill: str
    return_timestamps: bool
    time_unit: str
    tag_codes: np.ndarray

    def specs(self, n: int) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Shapes and dtypes of the arrays a batch of ``n`` windows is made of."""
        length, width = self.context_length + self.horizon, len(self.fields)
        dtype = np.float64 if self.dtype == "float64" else np.float32
        specs = {"values": ((n, length, width), dtype)}
        if self.return_timestamps or self.return_dict:
            specs["times"] = ((n, length), np.int64)
        if self.return_dict:
            specs["observed"] = ((n, length, width), dtype)
            specs["device_id"] = ((n,), np.int64)
            specs["codes"] = ((n, self.tag_codes.shape[1]), np.int64)
            if self.time_features:
                specs["features"] = ((n, length, len(self.time_features)), np.float32)
        return specs

    def items(self, arrays: dict[str, np.ndarray], k: np.ndarray, features_ready=False):
        """Return the batch of windows ``k`` gathered into ``arrays`` (see _batch_specs), as a
        :class:`WindowBatch` of tuples or dict items; ``features_ready``: time features were
        gathered from their blocks (else they are computed here from the times)."""
        c = self.context_length
        values, times = arrays["values"], arrays.get("times")
        missing = np.isnan(values) if self.return_dict or self.fill != "nan" else None
        if missing is not None:
            # before a window's first value ffill has nothing to carry: tuples keep NaN there
            # (as align's ffill before a series' first sample), dict items 0 (masked)
            fill_missing(values, missing, self.fill, 0.0 if self.return_dict else np.nan)
        if self.return_dict:
            return self.dict_items(arrays, k, missing, features_ready)
        identity = self.x_pos == list(range(len(self.fields)))
        x = as_tensor(values[:, :c] if identity else values[:, :c, self.x_pos])
        parts = [x]
        if self.horizon:
            identity = self.y_pos == list(range(len(self.fields)))
            parts.append(as_tensor(values[:, c:] if identity else values[:, c:, self.y_pos]))
        if self.dtype not in ("float32", "float64"):
            parts = [p.to(getattr(torch, self.dtype)) for p in parts]
        if times is not None:
            stamps = as_tensor(times)
            parts += [stamps[:, :c], stamps[:, c:]] if self.horizon else [stamps]
        return TensorWindows(parts[0]) if len(parts) == 1 else WindowBatch(tuple(parts))

    def dict_items(
        self, arrays: dict[str, np.ndarray], k: np.ndarray, missing: np.ndarray, features_ready
    ) -> WindowBatch:
        """Return the windows as Hugging Face style dict items (``return_dict=True``)."""
        c, out_dtype = self.context_length, getattr(torch, self.dtype)
        values, times, feats = arrays["values"], arrays["times"], arrays.get("features")
        observed = arrays["observed"]
        np.logical_not(missing, out=observed, casting="unsafe")
        if feats is not None and not features_ready:
            feats[...] = time_features(times, self.time_features, self.time_unit)
        arrays["device_id"][...] = k
        np.take(self.tag_codes, k, axis=0, out=arrays["codes"])
        everything = list(range(len(self.fields)))
        keys, parts = [], []

        def add(key, array, cast=False):
            keys.append(key)
            tensor = as_tensor(array)
            parts.append(tensor.to(out_dtype) if cast and tensor.dtype != out_dtype else tensor)

        for side, steps, pos in (
            ("past", slice(None, c), self.x_pos),
            ("future", slice(c, None), self.y_pos),
        ):
            if side == "future" and not self.horizon:
                break
            fields = slice(None) if pos == everything else pos  # a view when it can be
            add(f"{side}_values", values[:, steps, fields], cast=True)
            add(f"{side}_observed_mask", observed[:, steps, fields], cast=True)
            add(f"{side}_time", times[:, steps])
            if self.time_features:
                add(f"{side}_time_features", feats[:, steps])
        add("device_id", arrays["device_id"])
        add("static_categorical_features", arrays["codes"])
        return WindowBatch(tuple(parts), tuple(keys))


def window_loader_spec(view, cores: list, slots, gather_block=None) -> LoaderSpec:
    """Return the loader spec of a view of windows (a window dataset, a mixture): single
    windows batched by the loader through :func:`collate_windows`; a batch kept in the disk
    cache by a worker is gathered again here, in the main process (Note: hand-over).
    ``gather_block``: :attr:`LoaderSpec.gather_block`."""
    return LoaderSpec(
        windows=True,
        iterable=False,
        cores=cores,
        block_values=max(core.block_rows * len(core.catalog.columns) for core in cores),
        serve=lambda kept: collate_windows(view.__getitems__(*kept.request)),
        collate_fn=collate_windows,
        slots=slots,
        gather_block=gather_block,
    )


def pad_windows(values: np.ndarray, times: np.ndarray | None, start: np.ndarray):
    """Shift the windows gathered from row 0 for a negative ``start`` right, padding with NaN.

    Padded steps get timestamps extrapolated back with the device's first step.
    """
    if start.min() >= 0:
        return values, times
    for i in np.flatnonzero(start < 0).tolist():
        p = min(-int(start[i]), values.shape[1])
        values[i, p:] = values[i, : values.shape[1] - p].copy()
        values[i, :p] = np.nan
        if times is not None:
            real = times[i, : times.shape[1] - p].copy()
            step = int(real[1] - real[0]) if len(real) > 1 else 0
            times[i, p:] = real
            times[i, :p] = real[0] - step * np.arange(p, 0, -1)
    return values, times
