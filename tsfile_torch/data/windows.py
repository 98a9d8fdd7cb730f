"""Forecasting windows per device: :class:`TsFileWindowDataset`, the window kind of the core.

A device is a table-model device (table + tag values, ``meters.s0``) or a tree-model device
(``root.sg.d1``); its rows are one table of the reading core (its fields, positional or aligned
on time with ``align=``; a device continued across files is one device). Item ``i`` is
``context_length`` consecutive rows of ``columns`` and the next ``horizon`` rows of ``targets``
of one device; windows start at device rows 0, stride, 2 * stride, ... (rows inside
``start_time`` / ``end_time``) and are numbered device by device in device order.

Note: window blocks. Values are read in blocks of ``block_rows`` consecutive rows of one device
plus the ``context_length + horizon - 1`` rows after them, so every window starting in a block
lies inside it; a block is normalized once and kept in a per-process
:class:`~tsfile_torch.read.blockcache.BlockCache` of ``cache_bytes`` (default 256 MiB). A batch
of windows (``__getitems__``) fetches each block it needs once and gathers its windows with one
numpy indexing operation per block. The orders of :mod:`tsfile_torch.sampling.orders` see a
block as the windows starting in it, so ``order="shuffle"`` mixes ``shuffle_blocks`` blocks at
a time and a process decodes each block about once per epoch. ``cache="memory"`` keeps every
device whole in the :class:`~tsfile_torch.read.memory.MemoryStore` instead (first read of a
device decodes it), and a batch from any devices is then one gather; ``cache="disk"`` is the
same store in a file mapped by every worker and later run (Note: decoded disk cache).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.catalog.build import device_name, lay_out, subset_catalog
from tsfile_torch.data.core import DatasetCore, KeptBatch
from tsfile_torch.data.features import check_time_features, fill_missing, time_features
from tsfile_torch.data.normalize import DeviceNormalizer, Normalizer, make_normalizer
from tsfile_torch.errors import SchemaError
from tsfile_torch.options import ReadOptions, check_bool, check_choice, check_int, to_timestamp
from tsfile_torch.read.blockcache import Block, BlockCache
from tsfile_torch.sampling import orders
from tsfile_torch.sampling.orders import OrderSpec

__all__ = ["TsFileWindowDataset", "WindowBatch", "WindowInfo", "collate_windows"]

#: Device rows per decoded block (Note: window blocks): ~3 pages of the writer's defaults.
DEFAULT_WINDOW_BLOCK_ROWS = 32768
_DEFAULT_CACHE_BYTES = 256 << 20
#: ``column``: one scale per field over every device; ``device``: per device and field.
NORMALIZE_BY = ("column", "device")
#: ``length``: every window equally likely (a device in proportion to its windows);
#: ``uniform``: every device equally likely, then one of its windows (order="random").
DEVICE_WEIGHTS = ("length", "uniform")


class WindowInfo(NamedTuple):
    """Where window ``i`` comes from (``start_row``: the device's row, counted in range)."""

    device: str
    start_row: int
    start_time: int


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


def _names(name: str, value) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be None or a non-empty list of names; got {value!r}")
    for v in value:
        if not isinstance(v, str):
            raise TypeError(f"{name} must hold names (str); got {v!r}")
    return tuple(dict.fromkeys(value))


def _match_devices(all_devices: list[str], patterns) -> list[str]:
    if patterns is None:
        return all_devices
    chosen: dict[str, None] = {}
    for item in patterns:
        matches = [d for d in all_devices if d == item or fnmatch.fnmatchcase(d, item)]
        if not matches:
            shown = ", ".join(all_devices[:8]) + (" ..." if len(all_devices) > 8 else "")
            raise SchemaError(f"devices: {item!r} matches no device; devices are {shown}")
        chosen.update(dict.fromkeys(matches))
    return list(chosen)


class TsFileWindowDataset(DatasetCore, tud.Dataset):
    """Map-style dataset of forecasting windows, one device at a time.

    Item ``i`` is ``(x, y)``: ``x`` of shape ``(context_length, len(columns))`` and ``y`` the next
    ``horizon`` rows of ``targets``, shape ``(horizon, len(targets))``; with ``horizon=0`` the
    item is ``x``. With ``return_timestamps=True`` the int64 timestamps of ``x`` (and ``y``)
    follow: ``(x, y, x_times, y_times)`` or ``(x, x_times)``. Batch it with
    :func:`tsfile_torch.make_loader` (``make_loader(ds, batch_size=256)``): this rank's windows
    in the dataset's order, a new epoch per pass, resumable, every guarantee of the row datasets.

    Args:
        sources: paths, directories, globs, URLs or binary file objects (as the row datasets).
        context_length: rows of ``x``, >= 1.
        horizon: rows of ``y`` after ``x``, >= 0.
        stride: rows between the starts of consecutive windows of a device, >= 1.
        columns: field names of ``x``; ``None``: every numeric field all selected devices have.
        targets: field names of ``y``; ``None``: ``columns``.
        devices: device names or glob patterns (``"meters.*"``, ``"root.sg.d1"``); ``None``: all
            devices that have every field asked for (with ``columns=None``: all devices).
        order: ``"sequential"`` (default), ``"shuffle"`` (windows shuffled within a buffer of
            ``shuffle_blocks`` blocks), ``"batches"`` (a full permutation of the windows) or
            ``"random"`` (``num_samples`` windows drawn with replacement).
        shuffle: ``True`` means ``order="shuffle"``.
        seed, drop_last, shuffle_blocks, rank, world_size: as for the row datasets.
        num_samples: windows per epoch of ``order="random"``.
        device_weights: with ``order="random"``: ``"length"`` (default; every window equally
            likely, so a device in proportion to its windows) or ``"uniform"`` (every device
            with windows equally likely, then one of its windows), as Uni2TS samples series.
        return_dict: items are dicts in Hugging Face's naming instead of tuples:
            ``past_values`` (context, columns), ``past_observed_mask`` (1.0 where a value was
            read, 0.0 where it is null or an alignment gap), ``past_time`` (int64), the same
            ``future_*`` for the horizon and targets (none with ``horizon=0``), ``device_id``
            (int64 index into :attr:`devices`) and ``static_categorical_features`` (int64 code
            of each tag value of the device, per tag level: an index into :attr:`tag_vocab`).
            Batched by :func:`collate_windows` into a dict of stacked tensors.
        time_features: with ``return_dict``, calendar features of the timestamps (in
            ``time_unit``) as ``past_time_features`` / ``future_time_features``, shape
            (steps, len(time_features)), GluonTS's encoding in [-0.5, 0.5]; names from
            :data:`~tsfile_torch.data.features.TIME_FEATURES` (``"hour_of_day"``...).
        min_context: windows may start before a device's first row as long as their context
            holds at least this many rows of it (GluonTS's ``is_pad``): the steps before are
            padding, NaN in the values (filled as ``fill`` says), 0 in the observed mask, with
            timestamps extrapolated back by the device's first step. ``None``: whole windows.
        max_missing: drop windows whose fraction of missing values (nulls and padding, over
            the context's columns and the horizon's targets) exceeds it, in [0, 1]; ``None``
            keeps all. Cost: the selected fields of every device are read once when the
            dataset is built (and 8 bytes per kept window are held), so ``len(ds)`` is exact.
        **read_options: :class:`~tsfile_torch.options.ReadOptions` fields (``read_backend``,
            ``dtype``, ``normalize`` (per field, every device alike), ``align`` (for fields of one
            device with different timestamps), ``fill`` (``"zero"`` / ``"ffill"`` fill nulls
            and alignment gaps; ffill carries values within a window only with
            ``return_dict``, where alignment leaves gaps to the window so masks stay exact),
            ``cache``, ``cache_bytes`` (the
            window-block cache, default 256 MiB), ``block_rows`` (default 32,768),
            ``start_time`` / ``end_time``, ``storage_options``, ``validate``...).
        normalize_by: with ``normalize=``: ``"column"`` (one shift / scale per field over
            every device) or ``"device"`` (per device and field, from the device's own rows,
            like pytorch-forecasting's GroupNormalizer; ``ds.normalizer`` is a
            :class:`~tsfile_torch.data.normalize.DeviceNormalizer` whose
            ``inverse(y, device_id)`` undoes it). Statistics cover only the rows inside
            ``start_time`` / ``end_time``. Default: ``"device"`` when ``normalize`` is a
            DeviceNormalizer (a training dataset's, handed to its validation dataset), else
            ``"column"``.

    Raises:
        ValueError, TypeError: bad arguments. SchemaError: unknown devices or fields, a device
        without a field asked for, fields on different timelines without ``align``, or no
        device long enough for one window. TsFileFormatError: unreadable sources.
    """

    kind = "window dataset"
    default_block_rows = DEFAULT_WINDOW_BLOCK_ROWS

    def __init__(
        self,
        sources,
        context_length: int,
        horizon: int = 0,
        stride: int = 1,
        columns: Sequence[str] | str | None = None,
        targets: Sequence[str] | str | None = None,
        devices: Sequence[str] | str | None = None,
        *,
        order: str | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        drop_last: bool = False,
        shuffle_blocks: int = 16,
        num_samples: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        return_dict: bool = False,
        time_features: Sequence[str] | None = None,
        normalize_by: str | None = None,
        min_context: int | None = None,
        max_missing: float | None = None,
        device_weights: str = "length",
        **read_options,
    ):
        self._arguments = dict(
            sources=sources,
            context_length=context_length,
            horizon=horizon,
            stride=stride,
            columns=columns,
            targets=targets,
            devices=devices,
            order=order,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            shuffle_blocks=shuffle_blocks,
            num_samples=num_samples,
            rank=rank,
            world_size=world_size,
            return_dict=return_dict,
            time_features=time_features,
            normalize_by=normalize_by,
            min_context=min_context,
            max_missing=max_missing,
            device_weights=device_weights,
            **read_options,
        )  # what split_by_time builds its two datasets from
        read = ReadOptions(**read_options)
        if normalize_by is None:  # a training dataset's per-device normalizer says "device"
            normalize_by = "device" if isinstance(read.normalize, DeviceNormalizer) else "column"
        self.normalize_by = check_choice("normalize_by", normalize_by, NORMALIZE_BY)
        self.return_dict = check_bool("return_dict", return_dict)
        self.time_features = check_time_features(time_features)
        if self.time_features and not self.return_dict:
            raise ValueError(
                "time_features are part of dict items: pass return_dict=True with time_features"
            )
        # dict items carry observed masks: alignment leaves gaps NaN, the window fills them
        self._align_fill = "nan" if self.return_dict else read.fill
        self.context_length = check_int("context_length", context_length, 1, 2**40)
        self.horizon = check_int("horizon", horizon, 0, 2**40)
        self.stride = check_int("stride", stride, 1, 2**40)
        #: observed context rows the first windows of a device need (the rest is padding)
        self.min_context = check_int(
            "min_context", min_context, 1, self.context_length, allow_none=True
        )
        self.max_missing = _check_fraction("max_missing", max_missing)
        self.device_weights = check_choice("device_weights", device_weights, DEVICE_WEIGHTS)
        columns, targets = _names("columns", columns), _names("targets", targets)
        patterns = _names("devices", devices)
        spec = OrderSpec(
            orders.resolve_order(order, shuffle), seed, drop_last, shuffle_blocks, num_samples
        )
        if self.device_weights != "length" and spec.order != "random":
            raise ValueError(
                f"device_weights={self.device_weights!r} goes with order='random' (windows drawn "
                f"per epoch); got order={spec.order!r}"
            )
        meta = self._setup(sources, read, spec, rank, world_size)

        fields_of: dict[str, dict[str, str]] = {}  # device -> field -> column name
        device_of: dict[str, tuple] = {}  # device name -> (table, tag values...)
        for col in meta.numeric:
            shard = col.shards[0]
            fields_of.setdefault(device_name(shard.device), {})[shard.measurement] = col.name
            device_of[device_name(shard.device)] = tuple(shard.device)
        names = _match_devices(list(fields_of), patterns)
        if columns is None:
            shared = [f for f in fields_of[names[0]] if all(f in fields_of[d] for d in names)]
            if not shared:
                raise SchemaError(
                    f"devices {names[:5]} share no numeric field; pass columns=[...] and devices="
                )
            columns = tuple(shared)
        self.columns_x = list(columns)
        self.targets = list(targets) if targets is not None else list(columns)
        self.fields = list(dict.fromkeys(self.columns_x + self.targets))
        known = set().union(*(set(fields_of[d]) for d in names))
        unknown = [f for f in self.fields if f not in known]
        if unknown:
            raise SchemaError(
                f"fields {unknown} are not numeric fields of the selected devices; their "
                f"fields are {sorted(known)}"
            )
        if patterns is None:  # every device that has the fields asked for
            names = [d for d in names if all(f in fields_of[d] for f in self.fields)]
            if not names:
                raise SchemaError(
                    f"no device has all of the fields {self.fields}; pick fields one device "
                    f"has, or name devices= to see which field each one lacks"
                )
        missing = [(d, f) for d in names for f in self.fields if f not in fields_of[d]]
        if missing:
            d, f = missing[0]
            raise SchemaError(
                f"device {d!r} has no numeric field {f!r}; select devices that have every "
                f"field in columns / targets"
            )
        catalog = lay_out(
            meta,
            [fields_of[d][f] for d in names for f in self.fields],
            read.start_time,
            read.end_time,
            shared_timeline=False,
            drop_empty=True,
        )
        kept = set(catalog.column_names)  # a device with a field empty in range has no windows
        names = [d for d in names if all(fields_of[d][f] in kept for f in self.fields)]
        if len(names) * len(self.fields) != len(kept):
            catalog = subset_catalog(catalog, [fields_of[d][f] for d in names for f in self.fields])
        width = len(self.fields)
        tables = [
            self._table(catalog, tuple(range(k * width, (k + 1) * width)), f"device {d!r}: fields")
            for k, d in enumerate(names)
        ]
        self._devices = names
        self._set_tags([device_of[d] for d in names])
        self._x_pos = [self.fields.index(f) for f in self.columns_x]
        self._y_pos = [self.fields.index(f) for f in self.targets]
        spans = np.array([t.num_rows for t in tables], dtype=np.int64)
        needed = self.context_length - self._padding + self.horizon
        if spans.max() < needed:
            raise SchemaError(
                f"no device has {needed} rows (context_length {self.context_length} + horizon "
                f"{self.horizon}{' - padding' if self._padding else ''}) in range; the longest "
                f"has {int(spans.max())}: use shorter windows, more data or a wider time range"
            )
        self._blocks: BlockCache | None = None
        self._finish(catalog, tables, self.fields)
        self._set_windows(np.full(len(names), -self._padding, dtype=np.int64))
        if not len(self):
            raise SchemaError(
                f"every window has more than max_missing={self.max_missing} of its values "
                f"missing; raise max_missing or pick other fields / devices"
            )
        self._check_sharding(1)

    @property
    def _padding(self) -> int:
        """Rows of left padding the first window of a device may have (``min_context``)."""
        return 0 if self.min_context is None else self.context_length - self.min_context

    def _set_windows(self, lowest: np.ndarray) -> None:
        """Number the windows: device ``k``'s start at rows ``lowest[k]``, + stride, ...

        Rows below 0 are left padding (``min_context``). With ``max_missing`` every device is
        read once here and the windows over it are dropped (Note: window numbering).
        """
        length = self.context_length + self.horizon
        room = np.array([t.num_rows for t in self.tables], dtype=np.int64) - lowest
        counts = np.where(room >= length, (room - length) // self.stride + 1, 0)
        #: device row of each device's first window (negative: padded; split_by_time moves it)
        self._offset = lowest.astype(np.int64)
        #: with max_missing: the start row of every window kept, device by device
        self._starts: np.ndarray | None = None
        if self.max_missing is not None:
            kept = []
            for k, count in enumerate(counts.tolist()):
                starts = self._offset[k] + np.arange(count, dtype=np.int64) * self.stride
                kept.append(starts[self._missing_fraction(k, starts) <= self.max_missing])
            counts = np.array([len(s) for s in kept], dtype=np.int64)
            self._starts = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
            self.close()  # the reader used here is not carried into workers
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self.device_weights == "uniform":  # a block per device with windows, equal weights
            blocks = int((counts > 0).sum())
            self.order_spec = dataclasses.replace(self.order_spec, block_weights=(1.0,) * blocks)

    def _missing_fraction(self, k: int, starts: np.ndarray) -> np.ndarray:
        """Return the fraction of missing (null or padded) values of each window of device k."""
        table, n = self.tables[k], self.tables[k].num_rows
        miss_x, miss_y = np.zeros(n + 1, np.int64), np.zeros(n + 1, np.int64)
        for lo in range(0, n, self.block_rows):
            hi = min(lo + self.block_rows, n)
            values, _ = table.read(self.reader, lo, hi)
            nan = np.isnan(values)
            miss_x[lo + 1 : hi + 1] = nan[:, self._x_pos].sum(axis=1)
            miss_y[lo + 1 : hi + 1] = nan[:, self._y_pos].sum(axis=1)
        miss_x, miss_y = np.cumsum(miss_x), np.cumsum(miss_y)
        c, h = self.context_length, self.horizon
        first = np.maximum(starts, 0)
        padded = (first - starts) * len(self._x_pos)
        missing = padded + miss_x[starts + c] - miss_x[first] + miss_y[starts + c + h]
        missing -= miss_y[starts + c]
        return missing / (c * len(self._x_pos) + h * len(self._y_pos))

    # -- items ------------------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        """Field names of ``x``."""
        return self.columns_x

    @property
    def devices(self) -> list[str]:
        """Selected device names, in window order."""
        return list(self._devices)

    def __len__(self) -> int:
        return int(self._first[-1])

    def _set_tags(self, devices: list[tuple]) -> None:
        """Code each device's tag values (table model: the values after the table name)."""
        levels = max(len(d) - 1 for d in devices)
        tags = [[str(v) if v is not None else "" for v in d[1:]] for d in devices]
        tags = [t + [""] * (levels - len(t)) for t in tags]
        #: per tag level (schema order), its values; a code is an index into this list
        self.tag_vocab: list[list[str]] = [sorted({t[j] for t in tags}) for j in range(levels)]
        self._tag_codes = np.array(
            [[self.tag_vocab[j].index(t[j]) for j in range(levels)] for t in tags],
            dtype=np.int64,
        ).reshape(len(devices), levels)

    def window_counts(self) -> dict[str, int]:
        """Windows per device."""
        return {d: int(self._first[k + 1] - self._first[k]) for k, d in enumerate(self._devices)}

    def _layout(self) -> tuple[np.ndarray, int]:
        """Block starts: windows whose first row lies in one ``block_rows`` run of a device."""
        if self.order_spec.order in ("sequential", "shuffle"):
            bounds = []
            for k in range(len(self._devices)):
                first, count = int(self._first[k]), int(self._first[k + 1] - self._first[k])
                if count:
                    block = np.maximum(self._window_starts(k), 0) // self.block_rows
                    cuts = np.flatnonzero(np.diff(block)) + 1
                    bounds.extend((first + np.r_[0, cuts]).tolist())
            return np.array(bounds + [len(self)], dtype=np.int64), 1
        if self.order_spec.block_weights is not None:  # device_weights="uniform": per device
            return np.unique(self._first), 1
        return np.array([0, len(self)], dtype=np.int64), 1

    def _batch_key(self, items: np.ndarray, batch_size: int | None) -> list[int]:
        return items.tolist()

    def _locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Return (device, first device row) of each window index (negative ones count back)."""
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
        k = np.searchsorted(self._first, idx, side="right") - 1
        if self._starts is not None:
            return k, self._starts[idx]
        return k, self._offset[k] + (idx - self._first[k]) * self.stride

    def _window_starts(self, k: int) -> np.ndarray:
        """Return the start rows of device ``k``'s windows."""
        first, stop = int(self._first[k]), int(self._first[k + 1])
        if self._starts is not None:
            return self._starts[first:stop]
        return self._offset[k] + np.arange(stop - first, dtype=np.int64) * self.stride

    def split_by_time(self, t) -> tuple[TsFileWindowDataset, TsFileWindowDataset]:
        """Return ``(train, validation)`` datasets split at time ``t``.

        ``train``: this dataset's arguments with ``end_time`` before ``t``, so every train
        window ends before ``t`` (its ``normalize=`` statistics come from those rows only).
        ``validation``: the windows whose horizon starts at or after ``t`` (the first one of
        each device forecasts from its first row at or after ``t``; windows keep this dataset's
        stride from there), their context possibly before ``t``; with ``horizon=0``, the
        windows whose last row is at or after ``t`` (each holds at least one row no train
        window saw). Same devices in the same order as ``train`` (so ``device_id`` means the
        same), normalized with ``train``'s normalizer. Both keep every other argument (order,
        seed, time features...).

        Args:
            t: a timestamp in ``time_unit``, a datetime (naive = UTC), ``pandas.Timestamp``,
                ``numpy.datetime64`` or an ISO-8601 string.

        Raises:
            ValueError: ``t`` outside the time range.
            SchemaError: no device has a whole window before ``t``, or none after it.
        """
        cut = to_timestamp("t", t, self.options.time_unit)
        lo, hi = self.options.start_time, self.options.end_time
        if (lo is not None and cut <= lo) or (hi is not None and cut > hi):
            raise ValueError(
                f"split_by_time: t={cut} must lie in (start_time, end_time] = ({lo}, {hi}]"
            )
        train = type(self)(**{**self._arguments, "end_time": cut - 1})
        arguments = {**self._arguments, "devices": train.devices}
        if train.normalizer is not None:
            arguments.update(normalize=train.normalizer, normalize_by=train.normalize_by)
        validation = type(self)(**arguments)
        before = [table.num_rows for table in train.tables]  # each device's rows before t
        validation._forecast_from(np.asarray(before, dtype=np.int64), cut)
        return train, validation

    def _forecast_from(self, rows_before: np.ndarray, cut: int) -> None:
        """Keep the windows whose first new row (the horizon's first; with ``horizon=0`` the
        window's last) is device row ``rows_before[k]`` (the first at or after t) or later."""
        first = rows_before - self.context_length + (0 if self.horizon else 1)
        self._set_windows(np.maximum(first, -self._padding))
        if self._first[-1] == 0:
            raise SchemaError(
                f"split_by_time: no device has a whole window "
                f"{'forecasting from' if self.horizon else 'ending at or after'} t={cut} "
                f"(context_length {self.context_length} + horizon {self.horizon} rows); pick "
                f"an earlier t"
            )
        self._check_sharding(1)

    def window_info(self, index: int) -> WindowInfo:
        """Return (device, first device row, first timestamp) of window ``index``."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        k, row = (int(a[0]) for a in self._locate([index]))
        real = max(row, 0)  # a padded window: the time of its first real row
        times = self._block(k, real // self.block_rows).times
        return WindowInfo(self._devices[k], row, int(times[real % self.block_rows]))

    def __getitem__(self, index):
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch:
        """Return the windows ``indices`` as a :class:`WindowBatch` (Note: window blocks).

        No indices give an empty batch (zero windows, the usual shapes otherwise), as slicing
        does.
        """
        self._start_epoch(self.epoch or 0)
        length = self.context_length + self.horizon
        k, start = self._locate(indices)
        row = np.maximum(start, 0)  # padded windows gather from row 0, then shift (below)
        steps = np.arange(length)
        store = self._device_store() if len(k) else None
        if store is not None:  # every device kept whole, in one array: one gather
            if not store.known_whole():
                for dk in np.unique(k):
                    self._whole_device(int(dk))
            if self._handing_over() is store:  # before allocating what the main process fills
                return KeptBatch((list(indices),))
        arrays = _batch_arrays(self._batch_specs(len(k)))
        values, times = arrays["values"], arrays.get("times")
        if not len(k):
            return self._items(arrays, k)
        if store is not None:
            pick = (store.offsets[k] + row)[:, None] + steps
            # mode="clip" lets take write into ``out`` unbuffered (2.5x faster than "raise");
            # every window lies inside its device's rows (_locate), so nothing is clipped
            np.take(store.values, pick, axis=0, out=values, mode="clip")
            if times is not None:
                np.take(store.times, pick, out=times, mode="clip")
            _pad(values, times, start)
            return self._items(arrays, k)
        first_block = row // self.block_rows
        key = k * (1 << 40) + first_block
        order = np.argsort(key, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(key[order])) + 1)
        # cached blocks first: decoding a missing block then evicts blocks this batch is done
        # with, never one it still needs (else a batch spanning two shuffle groups thrashes)
        cache = self._block_cache()
        groups.sort(key=lambda m: (int(k[m[0]]), int(first_block[m[0]])) not in cache)
        # time features are computed once per block, as it is decoded, and gathered like the
        # values: a row is in about (context_length + horizon) / stride windows
        feats = arrays.get("features")
        for members in groups:
            dk, b = int(k[members[0]]), int(first_block[members[0]])
            block = self._block(dk, b)
            pick = (row[members] - b * self.block_rows)[:, None] + steps
            values[members] = np.take(block.values, pick, axis=0)  # 5x faster than [pick]
            if times is not None:
                times[members] = np.take(block.times, pick)
            if feats is not None:
                feats[members] = np.take(block.features, pick, axis=0)
        _pad(values, times, start)
        if feats is not None and start.min() < 0:  # padded windows' times were extrapolated
            padded = start < 0
            feats[padded] = time_features(times[padded], self.time_features, self.options.time_unit)
        return self._items(arrays, k, features_ready=True)

    def _batch_specs(self, n: int) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Shapes and dtypes of the arrays a batch of ``n`` windows is made of."""
        length, width = self.context_length + self.horizon, len(self.fields)
        dtype = np.float64 if self.options.dtype == "float64" else np.float32
        specs = {"values": ((n, length, width), dtype)}
        if self.options.return_timestamps or self.return_dict:
            specs["times"] = ((n, length), np.int64)
        if self.return_dict:
            specs["observed"] = ((n, length, width), dtype)
            specs["device_id"] = ((n,), np.int64)
            specs["codes"] = ((n, self._tag_codes.shape[1]), np.int64)
            if self.time_features:
                specs["features"] = ((n, length, len(self.time_features)), np.float32)
        return specs

    def serve_kept(self, kept: KeptBatch):
        return collate_windows(self.__getitems__(*kept.request))

    def _items(self, arrays: dict[str, np.ndarray], k: np.ndarray, features_ready=False):
        """Return the batch of windows ``k`` gathered into ``arrays`` (see _batch_specs), as a
        :class:`WindowBatch` of tuples or dict items; ``features_ready``: time features were
        gathered from their blocks (else they are computed here from the times)."""
        c = self.context_length
        values, times = arrays["values"], arrays.get("times")
        missing = np.isnan(values) if self.return_dict or self.options.fill != "nan" else None
        if missing is not None:
            # before a window's first value ffill has nothing to carry: tuples keep NaN there
            # (as align's ffill before a series' first sample), dict items 0 (masked)
            fill_missing(values, missing, self.options.fill, 0.0 if self.return_dict else np.nan)
        if self.return_dict:
            return self._dict_items(arrays, k, missing, features_ready)
        identity = self._x_pos == list(range(len(self.fields)))
        x = as_tensor(values[:, :c] if identity else values[:, :c, self._x_pos])
        parts = [x]
        if self.horizon:
            identity = self._y_pos == list(range(len(self.fields)))
            parts.append(as_tensor(values[:, c:] if identity else values[:, c:, self._y_pos]))
        if self.options.dtype not in ("float32", "float64"):
            parts = [p.to(getattr(torch, self.options.dtype)) for p in parts]
        if times is not None:
            stamps = as_tensor(times)
            parts += [stamps[:, :c], stamps[:, c:]] if self.horizon else [stamps]
        return WindowBatch(tuple(parts))

    def _dict_items(
        self, arrays: dict[str, np.ndarray], k: np.ndarray, missing: np.ndarray, features_ready
    ) -> WindowBatch:
        """Return the windows as Hugging Face style dict items (``return_dict=True``)."""
        c, out_dtype = self.context_length, getattr(torch, self.options.dtype)
        values, times, feats = arrays["values"], arrays["times"], arrays.get("features")
        observed = arrays["observed"]
        np.logical_not(missing, out=observed, casting="unsafe")
        if feats is not None and not features_ready:
            feats[...] = time_features(times, self.time_features, self.options.time_unit)
        arrays["device_id"][...] = k
        np.take(self._tag_codes, k, axis=0, out=arrays["codes"])
        everything = list(range(len(self.fields)))
        keys, parts = [], []

        def add(key, array, cast=False):
            keys.append(key)
            tensor = as_tensor(array)
            parts.append(tensor.to(out_dtype) if cast and tensor.dtype != out_dtype else tensor)

        for side, steps, pos in (
            ("past", slice(None, c), self._x_pos),
            ("future", slice(c, None), self._y_pos),
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

    # -- blocks -----------------------------------------------------------------------------
    def _nulls_hint(self) -> str | None:
        if self.return_dict or self.options.fill == "zero" or self.max_missing == 0:
            return None  # masked, filled, or the windows holding nulls are dropped
        return (
            "pass fill='zero' (or 'ffill': the last value read earlier in the window, NaN "
            "before the first), max_missing=0.0 to drop the windows holding them, or "
            "return_dict=True for observed masks"
        )

    def _reader_overrides(self) -> dict:
        return {"cache_bytes": 0}  # blocks are cached here, assembled (Note: window blocks)

    def _block_cache(self) -> BlockCache:
        self.reader  # noqa: B018 - the cache belongs to this process's reader
        if self._blocks is None or self._blocks_pid != self._reader.pid:
            budget = self.options.cache_bytes
            budget = _DEFAULT_CACHE_BYTES if budget is None else budget
            self._blocks = BlockCache(budget, self._dtype, recycle=False)
            self._blocks_pid = self._reader.pid
        return self._blocks

    def _block(self, k: int, b: int) -> Block:
        """Return block ``b`` of device ``k`` with its windows' tails (values, times, and
        with ``time_features`` their features, except from the memory or disk store)."""
        lo = b * self.block_rows
        hi = min(
            lo + self.block_rows + self.context_length + self.horizon - 1, self.tables[k].num_rows
        )
        store = self._device_store()
        if store is not None:
            self._whole_device(k)
            values, times = store.get(k, lo, hi)
            return Block(times, values)
        cache = self._block_cache()
        block = cache.get((k, b))
        if block is None:
            values, times = self._rows(k, lo, hi)
            block = Block(times, values.astype(self._dtype, copy=False))
            if self.time_features:
                unit = self.options.time_unit
                block.features = time_features(times, self.time_features, unit)
            cache.put((k, b), block)
        return block

    @property
    def _dtype(self):
        return np.float64 if self.options.dtype == "float64" else np.float32

    def _device_store(self):
        """Return the store when devices can be kept whole in it (else None: read blocks).

        A read-only disk cache (Note: decoded disk cache) serves only when it holds every
        device already: rows it lacks could not be kept, and a gather must not read them.
        """
        store = self._memory()
        if store is None or store.writable:
            return store
        if store is not self._checked_store:
            whole = all(store.has_whole(k) for k in range(len(self.tables)))
            self._checked_store, self._whole_store = store, whole
        return store if self._whole_store else None

    _checked_store = None
    _whole_store = False

    def _whole_device(self, k: int) -> None:
        """Decode device ``k`` into the memory store (``cache="memory"``), once per process."""
        store = self._memory()
        if store.has_whole(k):
            return
        n = self.tables[k].num_rows
        for lo in range(0, n, self.block_rows):
            hi = min(lo + self.block_rows, n)
            if not store.has(k, lo, hi):  # another process may have filled it (cache="disk")
                self._rows(k, lo, hi)

    def _table_names(self, table: int) -> list[str]:
        if self.normalize_by == "device":
            return [f"{self._devices[table]}.{f}" for f in self.fields]
        return self.fields

    def _make_normalizer(self, names: list[str]) -> Normalizer | None:
        if self.normalize_by == "column":
            return super()._make_normalizer(names)
        normalize = self.options.normalize
        qualified = [n for k in range(len(self._devices)) for n in self._table_names(k)]
        if isinstance(normalize, Normalizer) and not isinstance(normalize, DeviceNormalizer):
            raise ValueError(
                f"normalize_by='device' takes normalize='minmax', 'standard', None or a "
                f"DeviceNormalizer (a training dataset's ds.normalizer); got {normalize!r}"
            )
        flat = make_normalizer(normalize, qualified, self._device_stats)
        if flat is None or isinstance(flat, DeviceNormalizer):
            return flat
        return DeviceNormalizer.from_normalizer(flat, self._devices, self.fields, self.targets)

    def _device_stats(self, exact: bool) -> dict[str, dict]:
        """Statistics per device and field (``device.field``), rows in range only."""
        names = {
            f"{d}.{f}": [self.tables[k].columns[j]]
            for k, d in enumerate(self._devices)
            for j, f in enumerate(self.fields)
        }
        return self._stats(names, exact)

    @property
    def cached_bytes(self) -> int:
        """Bytes of decoded values held in this process (blocks, or the memory store)."""
        if self._store:
            return self._store.nbytes
        return self._blocks.nbytes if self._blocks is not None else 0

    def close(self) -> None:
        super().close()
        self._blocks = None

    def __getstate__(self):
        out = super().__getstate__()
        out["_blocks"] = None
        out["_arguments"] = None  # sources may be open file objects; split before pickling
        out.pop("_checked_store", None)
        return out

    # -- statistics -------------------------------------------------------------------------
    def stats(self, exact: bool = False) -> dict[str, dict]:
        """Return per-field statistics over the selected devices.

        Without ``exact``: ``count``, ``min``, ``max``, ``mean`` from the files' metadata, no
        value read (``"source": "metadata"``; ``std`` is ``None``). With ``exact=True``: one
        streaming pass over the values adds ``std`` (population) and recounts the rest
        (``"source": "data"``). Both count samples, not filled rows.
        """
        names = {f: [t.columns[j] for t in self.tables] for j, f in enumerate(self.fields)}
        return self._stats(names, exact)

    def __repr__(self) -> str:
        return (
            f"TsFileWindowDataset({len(self._devices)} devices, {len(self)} windows, "
            f"context_length={self.context_length}, horizon={self.horizon}, "
            f"stride={self.stride}, columns={self.columns_x}, targets={self.targets}, "
            f"order={self.order_spec.order!r})"
        )


def _pad(values: np.ndarray, times: np.ndarray | None, start: np.ndarray):
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


def _check_fraction(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} should be a fraction in [0, 1] or None, but got {name}={value!r}")
    if not 0 <= value <= 1:
        raise ValueError(f"{name} should be a fraction in [0, 1], but got {name}={value!r}")
    return float(value)


def _batch_arrays(specs: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, np.ndarray]:
    """Return empty arrays of the given (shape, dtype) by name for one batch.

    In a DataLoader worker they are carved from one shared-memory buffer: a worker's batch
    travels to the main process through shared memory, so allocating it there from the start
    (as ``default_collate`` does) saves copying it at pickling, and one buffer costs one
    file-descriptor hand-over per batch, each a round trip to the busy worker's
    resource-sharer thread, not one per array (dict items have six: measured through 2
    workers, the round trips were a third of the main process's time). Their tensors must be
    made with :func:`as_tensor` to stay views of it.
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


def _batch_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Return one empty array for a batch (see :func:`_batch_arrays`)."""
    return _batch_arrays({"array": (shape, dtype)})["array"]


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """Return ``array`` as a tensor; an array of :func:`_batch_arrays` stays a view of its buffer.

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
