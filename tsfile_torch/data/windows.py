"""Forecasting windows per device: :class:`TsFileWindowDataset` and :class:`WindowBatchSampler`.

A device is a table-model device (table + tag values, ``meters.s0``) or a tree-model device
(``root.sg.d1``); its rows are its own timeline, the shards of files in time order. Item ``i``
is ``context_length`` consecutive rows of ``columns`` and the next ``horizon`` rows of
``targets`` of one device; windows start at device rows 0, stride, 2 * stride, ... and are
numbered device by device in device order.

Note: window blocks. Values are decoded in blocks of ``block_rows`` consecutive rows of one
device, plus the ``context_length + horizon - 1`` rows after them so that every window starting
in a block lies inside it (one native read per read group, i.e. per file and device, per block),
normalized once and kept in a per-process LRU of ``cache_bytes``; a window is a slice of one
block. A batch of windows (``__getitems__``) fetches each block it needs once, so it
costs as many reads as the distinct blocks it covers, not one per window. A TsFile query decodes
whole pages (10,000 points with the writer's defaults) anyway, so a block of a few pages costs
about what one short window costs alone.

Random order over long series decodes a block per window unless the blocks stay cached. Two
ways keep it cheap:
- :class:`WindowBatchSampler` (the streaming route, like MosaicML Streaming's and LitData's
  shuffle within shards): each epoch permutes the blocks, takes them ``blocks_per_shuffle`` at a
  time and shuffles the windows inside that group, so a process decodes each block once per
  epoch as long as ``cache_bytes`` holds ``blocks_per_shuffle + 1`` blocks (a batch serves its
  cached blocks before decoding missing ones, so a batch that spans two groups never evicts a
  block it still needs). With
  ``num_workers`` given it deals groups of blocks to workers in the order the DataLoader hands
  batches to them (round-robin), so no two workers decode the same block.
- ``cache="memory"``: the first batch in a process decodes every selected device into one
  array kept for the life of the process (the decoded per-device cache); then any order is one
  gather per batch, like indexing a preloaded numpy array.
Plain ``RandomSampler`` / ``DistributedSampler`` work too (each window once, exact values) but
decode a block per window once the panel exceeds ``cache_bytes``.
"""

from __future__ import annotations

import fnmatch
import os
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.read import align as _align
from tsfile_torch.native.backend import Source, check_backend, parse_backend
from tsfile_torch.catalog.build import Catalog, build_catalog, device_name, subset_catalog
from tsfile_torch.data.rows import (
    STATE_EPOCH,
    STATE_NUM_WORKERS,
    STATE_POSITION,
    STATE_RANK,
    STATE_SEED,
    STATE_WORLD_SIZE,
)
from tsfile_torch.errors import SchemaError
from tsfile_torch.data.normalize import Normalizer, make_normalizer, series_stats
from tsfile_torch.options import _bool, _dtype_name, _positive_int, _seed
from tsfile_torch.read.reader import BatchReader

__all__ = [
    "TsFileWindowDataset",
    "WindowBatch",
    "WindowBatchSampler",
    "WindowInfo",
    "WindowOptions",
    "collate_windows",
    "make_window_loader",
]

#: Device rows per decoded block (Note: window blocks): ~3 pages of the writer's defaults.
DEFAULT_WINDOW_BLOCK_ROWS = 32768
_DEFAULT_CACHE_BYTES = 256 << 20
_WINDOW_CACHE_MODES = ("none", "memory")


class WindowInfo(NamedTuple):
    """Where window ``i`` comes from."""

    device: str
    start_row: int
    start_time: int


class WindowBatch(Sequence):
    """Windows of one batch, stored stacked: a sequence of items that are views into it.

    ``default_collate`` stacks its items again (correct, one copy and one object per window);
    :func:`collate_windows` hands the stacked tensors over as they are.
    """

    def __init__(self, parts: tuple[torch.Tensor, ...]):
        self.parts = parts

    def __len__(self) -> int:
        return len(self.parts[0])

    def __getitem__(self, i):
        if len(self.parts) == 1:
            return self.parts[0][i]
        return tuple(p[i] for p in self.parts)


def collate_windows(batch):
    """``collate_fn`` for window batches: stacked tensors without a Python object per window.

    A :class:`WindowBatch` becomes ``x`` or the tuple ``(x, y, ...)`` of batched tensors;
    anything else goes to ``default_collate``.
    """
    if isinstance(batch, WindowBatch):
        return batch.parts[0] if len(batch.parts) == 1 else batch.parts
    return tud.default_collate(batch)


@dataclass(frozen=True)
class WindowOptions:
    """Settings of a :class:`TsFileWindowDataset`, validated once (see its arguments)."""

    context_length: int
    horizon: int = 0
    stride: int = 1
    columns: tuple[str, ...] | None = None
    targets: tuple[str, ...] | None = None
    devices: tuple[str, ...] | None = None
    start_time: int | None = None
    end_time: int | None = None
    read_backend: str = "auto"
    dtype: str = "float32"
    return_timestamps: bool = False
    align: str | None = None
    fill: str = "nan"
    cache: str = "none"
    cache_bytes: int = _DEFAULT_CACHE_BYTES
    block_rows: int = DEFAULT_WINDOW_BLOCK_ROWS

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        _positive_int("context_length", self.context_length)
        _positive_int("horizon", self.horizon, allow_zero=True)
        _positive_int("stride", self.stride)
        _bool("return_timestamps", self.return_timestamps)
        set_("read_backend", parse_backend(self.read_backend))
        set_("dtype", _dtype_name(self.dtype))
        _align.check_align(self.align, self.fill)
        if self.cache not in _WINDOW_CACHE_MODES:
            raise ValueError(f"cache must be one of 'none', 'memory'; got {self.cache!r}")
        _positive_int("cache_bytes", self.cache_bytes, allow_zero=True)
        _positive_int("block_rows", self.block_rows)
        for name in ("start_time", "end_time"):
            t = getattr(self, name)
            if t is not None and (isinstance(t, bool) or not isinstance(t, (int, np.integer))):
                raise TypeError(f"{name} must be an integer timestamp or None; got {t!r}")
        if None not in (self.start_time, self.end_time) and self.start_time > self.end_time:
            raise ValueError(f"start_time {self.start_time} is after end_time {self.end_time}")
        set_("columns", _field_list("columns", self.columns))
        set_("targets", _field_list("targets", self.targets))
        if self.devices is not None:
            devices = (self.devices,) if isinstance(self.devices, str) else self.devices
            for d in devices:
                if not isinstance(d, str):
                    raise TypeError(f"devices must be names or glob patterns (str); got {d!r}")
            set_("devices", tuple(devices))


@dataclass(frozen=True)
class _Device:
    """One device: its fields' catalog columns, row count, rows in range, and its layout.

    ``positional``: every field has the same shards (one timeline), rows are positions.
    Otherwise ``times`` holds the aligned timeline (union / intersection of the fields').
    """

    name: str
    columns: tuple[int, ...]
    num_rows: int
    row_lo: int
    row_hi: int
    positional: bool
    times: np.ndarray | None = None


def _match_devices(all_devices: list[str], devices) -> list[str]:
    if devices is None:
        return all_devices
    if isinstance(devices, str):
        devices = [devices]
    chosen: dict[str, None] = {}
    for item in devices:
        if not isinstance(item, str):
            raise TypeError(f"devices must be names or glob patterns (str); got {item!r}")
        matches = [d for d in all_devices if d == item or fnmatch.fnmatchcase(d, item)]
        if not matches:
            shown = ", ".join(all_devices[:8]) + (" ..." if len(all_devices) > 8 else "")
            raise SchemaError(f"devices: {item!r} matches no device; devices are {shown}")
        chosen.update(dict.fromkeys(matches))
    return list(chosen)


def _field_list(name: str, value) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be None or a non-empty list of field names; got {value!r}")
    for v in value:
        if not isinstance(v, str):
            raise TypeError(f"{name} must hold field names (str); got {v!r}")
    return tuple(dict.fromkeys(value))


class TsFileWindowDataset(tud.Dataset):
    """Map-style dataset of forecasting windows, one device at a time.

    Item ``i`` is ``(x, y)``: ``x`` of shape ``(context_length, len(columns))`` and ``y`` the next
    ``horizon`` rows of ``targets``, shape ``(horizon, len(targets))``; with ``horizon=0`` the
    item is ``x``. With ``return_timestamps=True`` the int64 timestamps of ``x`` (and ``y``)
    follow: ``(x, y, x_times, y_times)`` or ``(x, x_times)``.

    Args:
        sources: paths, directories, globs or binary file objects (as the row datasets).
        context_length: rows of ``x``, >= 1.
        horizon: rows of ``y`` after ``x``, >= 0.
        stride: rows between the starts of consecutive windows of a device, >= 1.
        columns: field names of ``x``; ``None``: every numeric field all selected devices have.
        targets: field names of ``y``; ``None``: ``columns``.
        devices: device names or glob patterns (``"meters.*"``, ``"root.sg.d1"``); ``None``: all
            devices that have every field asked for (with ``columns=None``: all devices).
        start_time, end_time: keep rows with ``start_time <= t <= end_time`` (inclusive; reads
            the timestamps of files that straddle a bound once, at construction).
        read_backend: ``"auto"``, ``"mmap"`` or ``"pread"``.
        dtype: torch floating dtype of ``x`` and ``y``.
        normalize: ``None``, ``"minmax"`` (metadata min / max, no read), ``"standard"`` (mean and
            std: one pass over the data at construction) or a :class:`Normalizer` (e.g. the
            training dataset's ``normalizer``). Applied to ``x`` and ``y`` alike.
        return_timestamps: add the timestamps of ``x`` and ``y`` to each item.
        align: fields of one device with different timestamps (tree model, non-aligned
            series): ``None`` raises; ``"union"`` / ``"intersect"`` align them on time (one
            pass over their timestamps at construction).
        fill: ``"nan"``, ``"ffill"`` or ``"zero"`` for a field with no sample at an aligned row.
        cache: ``"none"``: decoded blocks in an LRU of ``cache_bytes`` per process;
            ``"memory"``: decode every selected device once per process, at the first read, and
            keep them (``rows * (fields * itemsize + 8)`` bytes).
        cache_bytes: LRU budget per process for ``cache="none"``.
        block_rows: device rows decoded per block (Note: window blocks).

    Raises:
        ValueError, TypeError: bad arguments. SchemaError: unknown devices or fields, a device
        without a field asked for, fields on different timelines without ``align``, or no
        device long enough for one window. TsFileFormatError: unreadable sources.
    """

    def __init__(
        self,
        sources: Source | Sequence[Source],
        context_length: int,
        horizon: int = 0,
        stride: int = 1,
        columns: Sequence[str] | str | None = None,
        targets: Sequence[str] | str | None = None,
        devices: Sequence[str] | str | None = None,
        start_time: int | None = None,
        end_time: int | None = None,
        read_backend="auto",
        dtype=torch.float32,
        normalize: str | Normalizer | None = None,
        return_timestamps: bool = False,
        align: str | None = None,
        fill: str = "nan",
        cache: str = "none",
        cache_bytes: int = _DEFAULT_CACHE_BYTES,
        block_rows: int = DEFAULT_WINDOW_BLOCK_ROWS,
    ):
        self.options = o = WindowOptions(
            context_length=context_length,
            horizon=horizon,
            stride=stride,
            columns=columns,
            targets=targets,
            devices=devices,
            start_time=start_time,
            end_time=end_time,
            read_backend=read_backend,
            dtype=dtype,
            return_timestamps=return_timestamps,
            align=align,
            fill=fill,
            cache=cache,
            cache_bytes=cache_bytes,
            block_rows=block_rows,
        )
        # the options' values, read often
        self.context_length, self.horizon, self.stride = o.context_length, o.horizon, o.stride
        self.start_time, self.end_time = o.start_time, o.end_time
        self.read_backend, self.dtype, self.return_timestamps = (
            o.read_backend,
            o.dtype,
            o.return_timestamps,
        )
        self.align, self.fill = o.align, o.fill
        self.cache, self.cache_bytes, self.block_rows = o.cache, o.cache_bytes, o.block_rows
        columns, targets, devices = o.columns, o.targets, o.devices

        full = build_catalog(sources, None, shared_timeline=False)
        for info in full.files:
            check_backend(info.source, self.read_backend)
        by_device: dict[str, dict[str, int]] = {}
        for i, col in enumerate(full.columns):
            shard = col.shards[0]
            by_device.setdefault(device_name(shard.device), {})[shard.measurement] = i
        names = _match_devices(list(by_device), devices)
        fields_of = {d: by_device[d] for d in names}
        if columns is None:
            shared = [f for f in fields_of[names[0]] if all(f in fields_of[d] for d in names)]
            if not shared:
                raise SchemaError(
                    f"devices {names[:5]} share no numeric field; pass columns=[...] and devices="
                )
            columns = tuple(shared)
        self.columns = list(columns)
        self.targets = list(targets) if targets is not None else list(columns)
        self.fields = list(dict.fromkeys(self.columns + self.targets))
        known = set().union(*(set(f) for f in fields_of.values()))
        unknown = [f for f in self.fields if f not in known]
        if unknown:
            raise SchemaError(
                f"fields {unknown} are not numeric fields of the selected devices; their "
                f"fields are {sorted(known)}"
            )
        if devices is None:  # every device that has the fields asked for
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
        self.catalog: Catalog = subset_catalog(
            full, [full.columns[fields_of[d][f]].name for d in names for f in self.fields]
        )
        self._x_pos = [self.fields.index(f) for f in self.columns]
        self._y_pos = [self.fields.index(f) for f in self.targets]
        self._groups_of: dict[int, list[int]] = {}  # catalog column -> read groups, row order
        for gi, group in enumerate(self.catalog.groups):
            for c in group.columns:
                self._groups_of.setdefault(c, []).append(gi)
        for gis in self._groups_of.values():
            gis.sort(key=lambda gi: self.catalog.groups[gi].start_row)

        self._device_groups: list[list[int]] = []  # device -> its read groups, row order
        self._own_times: dict[tuple[int, int], np.ndarray] = {}  # time-aligned devices' fields
        self._reader: BatchReader | None = None
        self._cache: OrderedDict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._cached_bytes = 0
        self._panel: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # cache="memory"
        self._devices: list[_Device] = []
        num_fields = len(self.fields)
        for k, name in enumerate(names):
            cols = tuple(range(k * num_fields, (k + 1) * num_fields))
            gis = {gi for c in cols for gi in self._groups_of[c]}
            self._device_groups.append(
                sorted(gis, key=lambda gi: (self.catalog.groups[gi].start_row, gi))
            )
            self._devices.append(self._layout_device(k, name, cols))
        length = self.context_length + self.horizon
        spans = np.array([d.row_hi - d.row_lo for d in self._devices], dtype=np.int64)
        counts = np.where(spans >= length, (spans - length) // self.stride + 1, 0)
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._row_lo = np.array([d.row_lo for d in self._devices], dtype=np.int64)
        if self._first[-1] == 0:
            raise SchemaError(
                f"no device has {length} rows (context_length {self.context_length} + horizon "
                f"{self.horizon}) in range; the longest has {int(spans.max())}: use shorter "
                f"windows, more data or a wider time range"
            )
        self.normalizer = make_normalizer(normalize, self.fields, lambda exact: self.stats(exact))
        self.close()  # readers used at construction are not carried into workers

    # -- construction helpers -------------------------------------------------------------
    def _layout_device(self, k: int, name: str, cols: tuple[int, ...]) -> _Device:
        columns = [self.catalog.columns[c] for c in cols]
        key = lambda col: [  # noqa: E731
            (s.file_index, s.start_row, s.num_rows, s.start_time, s.end_time) for s in col.shards
        ]
        positional = all(key(c) == key(columns[0]) for c in columns[1:])
        if self.align is not None and not columns[0].shards[0].aligned and len(columns) > 1:
            # non-aligned series with equal metadata may still differ inside: align on time
            positional = False
        if positional:
            num_rows = columns[0].num_rows
            times = None
        elif self.align is None:
            a, b = columns[0], next(c for c in columns[1:] if key(c) != key(columns[0]))
            raise SchemaError(
                f"device {name!r}: fields {a.name.rsplit('.', 1)[-1]!r} ({a.num_rows} rows in "
                f"[{a.start_time}, {a.end_time}]) and {b.name.rsplit('.', 1)[-1]!r} "
                f"({b.num_rows} rows in [{b.start_time}, {b.end_time}]) have different "
                f"timestamps; pass align='union' or align='intersect' (and fill=...)"
            )
        else:
            for j, c in enumerate(cols):
                rows = self.catalog.columns[c].num_rows
                self._own_times[(k, j)] = self._column_rows(c, 0, rows)[0]
            times = _align.aligned_times(
                [self._own_times[(k, j)] for j in range(len(cols))], self.align
            )
            num_rows = len(times)
        device = _Device(name, cols, num_rows, 0, num_rows, positional, times)
        if self.start_time is None and self.end_time is None:
            return device
        lo = 0 if self.start_time is None else self._row_of(device, self.start_time, "left")
        hi = num_rows if self.end_time is None else self._row_of(device, self.end_time, "right")
        return _Device(name, cols, num_rows, lo, max(lo, hi), positional, times)

    def _row_of(self, device: _Device, t: int, side: str) -> int:
        """Return the first device row with time >= t (left) or > t (right)."""
        if device.times is not None:
            return int(np.searchsorted(device.times, t, side=side))
        col = self.catalog.columns[device.columns[0]]
        for shard in col.shards:
            if t < shard.start_time or (side == "left" and t == shard.start_time):
                return shard.start_row
            if t <= shard.end_time:  # inside this shard: read its timestamps once
                times, _ = self._column_rows(
                    device.columns[0], shard.start_row, shard.start_row + shard.num_rows
                )
                return shard.start_row + int(np.searchsorted(times, t, side=side))
        return col.num_rows

    # -- pickling: no native handles --------------------------------------------------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_cache"] = OrderedDict()
        state["_cached_bytes"] = 0
        state["_panel"] = None
        return state

    @property
    def reader(self) -> BatchReader:
        """This process's reader over the selected series, opened on first use."""
        if self._reader is None or self._reader.pid != os.getpid():
            self._reader = BatchReader(
                self.catalog, self.read_backend, np.float64, cache_bytes=0, decode_threads=1
            )
            self._cache.clear()
            self._cached_bytes = 0
            self._panel = None
        return self._reader

    def close(self) -> None:
        """Close this process's readers and drop decoded blocks."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._cache.clear()
        self._cached_bytes = 0
        self._panel = None

    # -- public surface -------------------------------------------------------------------
    @property
    def devices(self) -> list[str]:
        """Selected device names, in window order."""
        return [d.name for d in self._devices]

    def __len__(self) -> int:
        return int(self._first[-1])

    def _locate(self, index) -> tuple[int, int]:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"window index {index} out of range for {n} windows")
        index = int(index) % n
        k = int(np.searchsorted(self._first, index, side="right")) - 1
        return k, self._devices[k].row_lo + (index - int(self._first[k])) * self.stride

    def window_info(self, index: int) -> WindowInfo:
        """Return (device, first device row, first timestamp) of window ``index``."""
        k, row = self._locate(index)
        times, _ = self._rows(k, row, row + 1)
        return WindowInfo(self._devices[k].name, row, int(times[0]))

    def window_counts(self) -> dict[str, int]:
        """Windows per device."""
        return {
            d.name: int(self._first[k + 1] - self._first[k]) for k, d in enumerate(self._devices)
        }

    def __getitem__(self, index):
        return self.__getitems__([index])[0]

    def _locate_many(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            for i in indices:
                self._locate(i)  # raises the error for the first bad index
            idx = idx.astype(np.int64)
        n = len(self)
        bad = (idx < -n) | (idx >= n)
        if bad.any():
            raise IndexError(f"window index {int(idx[bad][0])} out of range for {n} windows")
        idx = idx % n
        k = np.searchsorted(self._first, idx, side="right") - 1
        row = self._row_lo[k] + (idx - self._first[k]) * self.stride
        return k, row

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch:
        """Return the windows ``indices`` as a :class:`WindowBatch` (Note: window blocks).

        Each block the windows need is fetched once; windows inside one block are gathered
        with one numpy indexing operation.
        """
        length = self.context_length + self.horizon
        k, row = self._locate_many(indices)
        steps = np.arange(length)
        if self.cache == "memory":  # every device decoded once, in one array: one gather
            panel_times, panel_values, offsets = self._whole_panel()
            pick = (offsets[k] + row)[:, None] + steps
            times = panel_times[pick] if self.return_timestamps else None
            values = _batch_array((len(k), length, len(self.fields)), panel_values.dtype)
            np.take(panel_values, pick, axis=0, out=values)
            return self._items(values, times)
        n = len(k)
        first_block = row // self.block_rows
        key = k * (1 << 40) + first_block
        values = _batch_array((n, length, len(self.fields)), _NUMPY.get(self.dtype, "float32"))
        times = np.empty((n, length), dtype=np.int64) if self.return_timestamps else None
        order = np.argsort(key, kind="stable")
        cuts = np.flatnonzero(np.diff(key[order])) + 1
        groups = np.split(order, cuts)
        # cached blocks first: decoding a missing block then evicts blocks this batch is done
        # with, never one it still needs (else a batch spanning two shuffle groups thrashes)
        groups.sort(key=lambda m: (int(k[m[0]]), int(first_block[m[0]])) not in self._cache)
        for members in groups:
            dk, b = int(k[members[0]]), int(first_block[members[0]])
            block_times, block_values = self._block(dk, b)
            local = row[members] - b * self.block_rows
            pick = local[:, None] + steps  # inside the block: it holds its windows' tails
            values[members] = block_values[pick]
            if times is not None:
                times[members] = block_times[pick]
        return self._items(values, times)

    def _items(self, values: np.ndarray, times: np.ndarray | None) -> WindowBatch:
        c = self.context_length
        identity = self._x_pos == list(range(len(self.fields)))
        x = torch.from_numpy(values[:, :c] if identity else values[:, :c, self._x_pos])
        parts = [x]
        if self.horizon:
            identity = self._y_pos == list(range(len(self.fields)))
            parts.append(
                torch.from_numpy(values[:, c:] if identity else values[:, c:, self._y_pos])
            )
        if self.dtype not in ("float32", "float64"):
            parts = [p.to(getattr(torch, self.dtype)) for p in parts]
        if times is not None:
            stamps = torch.from_numpy(times)
            parts += [stamps[:, :c], stamps[:, c:]] if self.horizon else [stamps]
        return WindowBatch(tuple(parts))

    # -- statistics -----------------------------------------------------------------------
    def stats(self, exact: bool = False) -> dict[str, dict]:
        """Return per-field statistics over the selected devices (all their rows in the files).

        Without ``exact``: ``count``, ``min``, ``max``, ``mean`` from the files' metadata, no
        value read (``"source": "metadata"``; ``std`` is ``None``). With ``exact=True``: one
        streaming pass over the values adds ``std`` (population) and recounts the rest
        (``"source": "data"``). Both ignore ``start_time`` / ``end_time`` (metadata statistics
        cover whole series) and count samples, not filled rows.
        """
        names = {f: [d.columns[j] for d in self._devices] for j, f in enumerate(self.fields)}
        return series_stats(self.catalog, names, exact, self.read_backend, self.block_rows)

    # -- reading ----------------------------------------------------------------------------
    def _column_rows(self, c: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Return rows [lo, hi) of catalog column ``c`` on its own timeline: times, values."""
        reader = self.reader
        times, values = np.empty(hi - lo, np.int64), np.empty(hi - lo)
        for gi in self._groups_of[c]:
            group = self.catalog.groups[gi]
            a, b = max(lo, group.start_row), min(hi, group.stop_row)
            if a >= b:
                continue
            t, v = reader.read_group(gi, a - group.start_row, b - group.start_row)
            times[a - lo : b - lo] = t
            values[a - lo : b - lo] = v[group.columns.index(c)]
        return times, values

    def _raw_rows(self, k: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Return device rows [lo, hi) of device ``k``: times (n,), float64 values (n, fields)."""
        device = self._devices[k]
        n = hi - lo
        values = np.empty((n, len(self.fields)))
        if device.positional:
            groups = self.catalog.groups
            base = device.columns[0]
            times = np.empty(n, np.int64)
            segments: set[int] = set()  # start rows whose timestamps are written
            for gi in self._device_groups[k]:
                group = groups[gi]
                a, b = max(lo, group.start_row), min(hi, group.stop_row)
                if a >= b:
                    continue
                t, v = self.reader.read_group(gi, a - group.start_row, b - group.start_row)
                if group.start_row not in segments:
                    times[a - lo : b - lo] = t
                    segments.add(group.start_row)
                elif not np.array_equal(times[a - lo : b - lo], t):
                    bad = int(np.flatnonzero(times[a - lo : b - lo] != t)[0])
                    field = self.fields[group.columns[0] - base]
                    raise SchemaError(
                        f"device {device.name!r}: field {field!r} has different timestamps "
                        f"from the device's other fields at row {a + bad}; pass "
                        f"align='union' or align='intersect'"
                    )
                values[a - lo : b - lo, [c - base for c in group.columns]] = v.T
            return times, values
        times = device.times[lo:hi]
        for j, c in enumerate(device.columns):
            col = self.catalog.columns[c]
            # this field's own rows that can matter: within the time span (+1 before for ffill)
            own = self._own_times[(k, j)]
            a = int(np.searchsorted(own, times[0], side="left"))
            b = int(np.searchsorted(own, times[-1], side="right"))
            if self.fill == "ffill" and a > 0:
                a -= 1
            if a >= b:
                t, v = np.empty(0, np.int64), np.empty(0)
            else:
                t, v = self._column_rows(c, a, min(b, col.num_rows))
            values[:, j] = _align.align_to(times, t, v, self.fill)
        return times, values

    def _whole_panel(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decode every selected device once into one array (``cache="memory"``)."""
        if self._panel is None or self._reader is None or self._reader.pid != os.getpid():
            self.reader  # noqa: B018 - (re)open for this process; drops another process's panel
            counts = [d.num_rows for d in self._devices]
            offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
            dtype = np.dtype(_NUMPY.get(self.dtype, "float32"))
            times = np.empty(int(offsets[-1]), dtype=np.int64)
            values = np.empty((int(offsets[-1]), len(self.fields)), dtype=dtype)
            for k, n in enumerate(counts):
                for a in range(0, n, self.block_rows):
                    b = min(a + self.block_rows, n)
                    t, v = self._raw_rows(k, a, b)
                    if self.normalizer is not None:
                        v = self.normalizer(v, self.fields)
                    times[offsets[k] + a : offsets[k] + b] = t
                    values[offsets[k] + a : offsets[k] + b] = v
            self._panel = (times, values, offsets)
            self._cached_bytes = times.nbytes + values.nbytes
        return self._panel

    def _block(self, k: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        if self.cache == "memory":
            times, values, offsets = self._whole_panel()
            lo = offsets[k] + b * self.block_rows
            hi = min(lo + self.block_rows + self.context_length + self.horizon - 1, offsets[k + 1])
            return times[lo:hi], values[lo:hi]
        key = (k, b)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        device = self._devices[k]
        lo = b * self.block_rows
        # the block's rows plus the tail of the windows that start in it (Note: window blocks)
        hi = min(lo + self.block_rows + self.context_length + self.horizon - 1, device.num_rows)
        times, values = self._raw_rows(k, lo, hi)
        if self.normalizer is not None:
            values = self.normalizer(values, self.fields)
        block = (times.copy(), values.astype(np.dtype(_NUMPY.get(self.dtype, "float32"))))
        nbytes = block[0].nbytes + block[1].nbytes
        if self.cache == "memory" or nbytes <= self.cache_bytes:
            self._cache[key] = block
            self._cached_bytes += nbytes
            while self.cache == "none" and self._cached_bytes > self.cache_bytes:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= old[0].nbytes + old[1].nbytes
        return block

    def _rows(self, k: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Return device rows ``[lo, hi)`` of device ``k`` (normalized, output dtype)."""
        first, last = lo // self.block_rows, (hi - 1) // self.block_rows
        o = first * self.block_rows
        if first == last or hi - lo <= self.context_length + self.horizon:
            times, values = self._block(k, first)  # the block holds its windows' tails
            return times[lo - o : hi - o], values[lo - o : hi - o]
        parts = [self._block(k, b) for b in range(first, last + 1)]
        B = self.block_rows
        times = np.concatenate([p[0][:B] for p in parts])[lo - o : hi - o]
        values = np.concatenate([p[1][:B] for p in parts])[lo - o : hi - o]
        return times, values

    @property
    def cached_bytes(self) -> int:
        """Bytes of decoded blocks held in this process."""
        return self._cached_bytes

    def __repr__(self) -> str:
        return (
            f"TsFileWindowDataset({len(self._devices)} devices, {len(self)} windows, "
            f"context_length={self.context_length}, horizon={self.horizon}, "
            f"stride={self.stride}, columns={self.columns}, targets={self.targets})"
        )


_NUMPY = {"float64": "float64"}


def _batch_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Return an empty array for a batch; in a DataLoader worker, in shared memory.

    A worker's batch travels to the main process through shared memory: allocating it there
    from the start (as ``default_collate`` does) saves copying it at pickling.
    """
    if tud.get_worker_info() is None:
        return np.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name)).share_memory_().numpy()


def _deal(sizes: Sequence[int], bins: int) -> list[list[int]]:
    """Deal items (by index, in order) to ``bins``, each to the bin with the least so far."""
    out: list[list[int]] = [[] for _ in range(bins)]
    load = [0] * bins
    for i, size in enumerate(sizes):
        b = load.index(min(load))
        out[b].append(i)
        load[b] += size
    return out


class WindowBatchSampler(tud.Sampler[list[int]]):
    """Batches of window indices shuffled inside groups of blocks (Note: window blocks).

    Each epoch, a (seed, epoch) permutation of the blocks (runs of windows starting in the same
    ``block_rows`` rows of one device) is cut into groups of ``blocks_per_shuffle`` blocks; the
    windows of a group are permuted and cut into batches. Ranks of a DDP job take every
    ``num_replicas``-th group and, as ``DistributedSampler`` does, the same number of windows
    each (wrapping around, or dropping the rest with ``drop_last``). With ``num_workers > 1``
    the rank's groups are dealt to ``num_workers`` streams and their batches interleaved in the
    order the DataLoader hands batches to workers (round-robin), so each worker decodes only its
    own blocks. Use ``DataLoader(ds, batch_sampler=sampler, num_workers=...)``.

    Epochs and resume (Note: window sampler epochs): every pass over the sampler is the next
    epoch (0, 1, 2, ...) unless :meth:`set_epoch` named the next pass's; a pass claims its
    epoch at its first batch, in the process that iterates the sampler (the DataLoader's main
    process), so persistent and non-persistent workers need nothing. :meth:`state_dict` says
    where the latest pass stands (epoch, batches handed out) with what the order depends on;
    :meth:`load_state_dict` makes the next pass continue there, slicing the epoch's batches
    (nothing is decoded for the skipped ones). torchdata's ``StatefulDataLoader`` saves and
    loads it with the loader (``make_window_loader(..., stateful=True)``).

    Args:
        dataset: the window dataset.
        batch_size: windows per batch.
        shuffle: ``False``: windows in dataset order.
        seed: seed of the order (any integer, taken modulo 2**64).
        blocks_per_shuffle: blocks whose windows are mixed together; more mixes better and holds
            more decoded blocks per process.
        num_workers: the DataLoader's ``num_workers``.
        num_replicas, rank: DDP world size and rank (default: ``torch.distributed``'s, else 1, 0).
        drop_last: drop each stream's last partial batch, and windows beyond an equal share per
            rank.
    """

    def __init__(
        self,
        dataset: TsFileWindowDataset,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        blocks_per_shuffle: int = 16,
        num_workers: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
    ):
        self.batch_size = _positive_int("batch_size", batch_size)
        self.shuffle = _bool("shuffle", shuffle)
        self.blocks_per_shuffle = _positive_int("blocks_per_shuffle", blocks_per_shuffle)
        self.num_workers = _positive_int("num_workers", num_workers, allow_zero=True)
        self.drop_last = _bool("drop_last", drop_last)
        self.seed = _seed(seed)
        if num_replicas is None or rank is None:
            dist = torch.distributed
            live = dist.is_available() and dist.is_initialized()
            num_replicas = (
                num_replicas if num_replicas is not None else (dist.get_world_size() if live else 1)
            )
            rank = rank if rank is not None else (dist.get_rank() if live else 0)
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank should be in [0, {num_replicas - 1}], but got rank={rank}")
        self.num_replicas, self.rank = num_replicas, rank
        # block boundaries in window numbers: a block = windows whose first row is in one
        # block_rows run of one device
        bounds = []
        for k, d in enumerate(dataset._devices):
            first, count = int(dataset._first[k]), int(dataset._first[k + 1] - dataset._first[k])
            if not count:
                continue
            starts = d.row_lo + np.arange(count) * dataset.stride
            block = starts // dataset.block_rows
            cut = np.flatnonzero(np.diff(block)) + 1
            bounds.extend((first + np.concatenate([[0], cut])).tolist())
        self._bounds = np.array(bounds + [len(dataset)], dtype=np.int64)
        self._num_windows = len(dataset)
        # where the order stands (Note: window sampler epochs): (epoch, batches handed out) of
        # the latest pass, or where the next pass starts when _pending (a new iterator,
        # set_epoch, a loaded state); None before any pass
        self._cursor: tuple[int, int] | None = None
        self._pending = False
        self._finished = False  # the latest pass ran out (its iterator raised StopIteration)
        self._passes = 0  # passes claimed: only the latest pass moves the cursor
        self._pass_len = 0  # batches of the latest pass

    # -- epochs ---------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (later passes count on from it).

        Without it every pass is the next epoch. A state loaded with :meth:`load_state_dict`
        and not yet resumed is replaced.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch should be a non-negative integer, but got epoch={epoch!r}")
        self._cursor, self._pending = (epoch, 0), True

    @property
    def epoch(self) -> int | None:
        """Epoch of the latest pass (or of the pass about to begin); ``None`` before any."""
        return None if self._cursor is None else self._cursor[0]

    def _next_pass(self) -> tuple[int, int]:
        """Return (epoch, first batch) of the pass that would begin now."""
        if self._pending:
            return self._cursor
        return (0 if self._cursor is None else self._cursor[0] + 1), 0

    def _claim(self) -> tuple[int, int, int]:
        """Begin a pass: return its epoch, first batch and pass number; move the cursor there."""
        epoch, position = self._next_pass()
        self._passes += 1
        self._cursor, self._pending, self._finished = (epoch, position), False, False
        return epoch, position, self._passes

    # -- the order --------------------------------------------------------------------------
    def _rank_plan(self, epoch: int):
        """Return this rank's groups as ``(blocks, windows kept)``, the padding, and the rng.

        Pure in (seed, epoch, rank, num_replicas); no window index is materialized here, so
        ``len()`` is cheap.
        """
        num_blocks = len(self._bounds) - 1
        rng = np.random.default_rng([self.seed, epoch, 2])
        order = rng.permutation(num_blocks) if self.shuffle else np.arange(num_blocks)
        groups = [
            order[i : i + self.blocks_per_shuffle]
            for i in range(0, num_blocks, self.blocks_per_shuffle)
        ]
        sizes = np.diff(self._bounds)
        group_sizes = [int(sizes[g].sum()) for g in groups]
        ranks = _deal(group_sizes, self.num_replicas)
        have = [sum(group_sizes[i] for i in r) for r in ranks]
        per_rank = min(have) if self.drop_last else max(have)
        mine = [(groups[i], group_sizes[i]) for i in ranks[self.rank]]
        excess, kept = have[self.rank] - per_rank, []
        for blocks, n in reversed(mine):  # trim from the end so every rank has the same count
            cut = min(max(excess, 0), n)
            excess -= cut
            if n - cut:
                kept.append((blocks, n - cut))
        return kept[::-1], max(-excess, 0), rng

    def _streams(self, sizes: list[int]) -> list[list[int]]:
        """Deal groups (by size) to one stream per DataLoader worker."""
        return _deal(sizes, max(self.num_workers, 1))

    def _num_batches(self, count: int) -> int:
        return count // self.batch_size if self.drop_last else -(-count // self.batch_size)

    def batches_for(self, epoch: int) -> list[list[int]]:
        """Return the batches (window indices) this rank visits in ``epoch``, in order.

        A pure function of (seed, epoch, rank, num_replicas, num_workers) and the dataset's
        layout.
        """
        plan, pad, rng = self._rank_plan(epoch)
        groups = []
        for blocks, n in plan:
            windows = np.concatenate(
                [np.arange(self._bounds[b], self._bounds[b + 1]) for b in blocks]
            )
            groups.append((rng.permutation(windows) if self.shuffle else windows)[:n])
        if pad:  # wrap around this rank's own windows, as DistributedSampler pads
            flat = np.concatenate(groups) if groups else np.arange(self._num_windows)
            groups.append(np.resize(flat, pad))
        streams: list[list[list[int]]] = []
        for run in self._streams([len(g) for g in groups]):
            flat = [w for i in run for w in groups[i].tolist()]
            streams.append(
                [
                    flat[i : i + self.batch_size]
                    for i in range(
                        0, self._num_batches(len(flat)) * self.batch_size, self.batch_size
                    )
                ]
            )
        return [
            stream[i]
            for i in range(max((len(s) for s in streams), default=0))
            for stream in streams
            if i < len(stream)
        ]

    def _len_of(self, epoch: int) -> int:
        plan, pad, _ = self._rank_plan(epoch)
        sizes = [n for _, n in plan] + ([pad] if pad else [])
        return sum(self._num_batches(sum(sizes[i] for i in run)) for run in self._streams(sizes))

    def __iter__(self) -> Iterator[list[int]]:
        # a new iterator is a new pass: the state now says where it starts (a pass in
        # progress is abandoned); it claims that epoch at its first batch
        self._cursor, self._pending = self._next_pass(), True
        return _WindowPass(self)

    def __len__(self) -> int:
        """Batches of the pass in progress, else of the next pass (what ``tqdm(loader)`` needs).

        A pass is in progress from its first batch until the sampler has handed out its last
        (with workers, a few batches before the loader delivers them).
        """
        if self._pending or self._cursor is None or self._cursor[1] >= self._pass_len:
            return self._len_of(self._next_pass()[0])
        return self._pass_len

    # -- resume -----------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        """What the order depends on besides the epoch (checked by :meth:`load_state_dict`)."""
        return {
            STATE_SEED: self.seed,
            STATE_RANK: self.rank,
            STATE_WORLD_SIZE: self.num_replicas,
            STATE_NUM_WORKERS: self.num_workers,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "blocks_per_shuffle": self.blocks_per_shuffle,
            "drop_last": self.drop_last,
            # windows and blocks of the dataset (counts and a checksum of the block bounds)
            "windows": [
                self._num_windows,
                len(self._bounds) - 1,
                zlib.crc32(self._bounds.astype("<i8").tobytes()),
            ],
        }

    def state_dict(self) -> dict[str, Any]:
        """Return where the order stands: the latest pass's epoch and batches handed out.

        ``epoch`` is ``None`` before any pass. After :meth:`set_epoch` (or a loaded state not
        yet resumed) it is where the next pass starts. The other keys say what the order
        depends on: seed, rank, world size (``num_replicas``), ``num_workers``, batching and
        the dataset's windows.
        """
        if self._cursor is None:
            epoch, position = None, 0
        elif self._finished and not self._pending:
            epoch, position = self._cursor[0] + 1, 0  # a pass that ran out: the next one
        else:
            epoch, position = self._cursor
        return {STATE_EPOCH: epoch, STATE_POSITION: position, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass continue where ``state`` stood; later passes count on from it.

        A state saved after a pass ran out starts the following epoch.

        Raises:
            ValueError: ``state`` comes from a sampler with another seed, rank, world size,
                number of workers, batching or dataset layout (the order would differ), or
                its position is past its epoch's end.
        """
        mine = self._identity()
        keys = (STATE_EPOCH, STATE_POSITION, *mine)
        if not isinstance(state, dict) or not set(keys) <= set(state):
            raise ValueError(
                f"state_dict of WindowBatchSampler needs the keys {sorted(keys)}; got "
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
            )
        for key, value in mine.items():
            got = list(state[key]) if isinstance(value, list) else state[key]
            if got != value:
                name = "num_replicas" if key == STATE_WORLD_SIZE else key
                hint = (
                    "resume with the same num_workers (the order deals batches to workers)"
                    if key == STATE_NUM_WORKERS
                    else "build the dataset and sampler (and the process group) as when the "
                    "state was saved"
                )
                raise ValueError(
                    f"cannot load this WindowBatchSampler state: it was saved with "
                    f"{name}={state[key]!r}, this sampler has {name}={value!r}; {hint}"
                )
        epoch, position = state[STATE_EPOCH], state[STATE_POSITION]
        if epoch is None:
            self._cursor, self._pending = None, False
            return
        self._cursor, self._pending = self._checked_cursor(epoch, position), True

    def _checked_cursor(self, epoch, position) -> tuple[int, int]:
        epoch, position = int(epoch), int(position)
        total = self._len_of(epoch)
        if epoch < 0 or not 0 <= position <= total:
            raise ValueError(
                f"cannot load this WindowBatchSampler state: position {position} is outside "
                f"epoch {epoch}'s {total} batches"
            )
        return epoch, position


class _WindowPass(Iterator[list[int]]):
    """One pass of a :class:`WindowBatchSampler`; claims its epoch at its first batch (lazily:
    a DataLoader creates iterators it never uses). Its state is its pass's (epoch, position):
    ``StatefulDataLoader`` loads it into the iterator that resumes, which claims it at once."""

    def __init__(self, sampler: WindowBatchSampler):
        self.sampler = sampler
        self.epoch: int | None = None
        self.position = 0
        self._batches: list[list[int]] | None = None
        self._pass = 0

    def __iter__(self) -> Iterator[list[int]]:
        return self

    def _begin(self) -> None:
        self.epoch, self.position, self._pass = self.sampler._claim()
        self._batches = self.sampler.batches_for(self.epoch)
        self.sampler._pass_len = len(self._batches)

    def __next__(self) -> list[int]:
        s = self.sampler
        if self._batches is None:
            self._begin()
        latest = s._passes == self._pass  # an older pass iterated late moves nothing
        if self.position >= len(self._batches):
            if latest:
                s._finished = True
            raise StopIteration
        batch = self._batches[self.position]
        self.position += 1
        if latest:
            s._cursor = (self.epoch, self.position)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {STATE_EPOCH: self.epoch, STATE_POSITION: self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state[STATE_EPOCH] is None:  # saved before its first batch: begins as a new pass
            return
        s = self.sampler
        s._cursor = s._checked_cursor(state[STATE_EPOCH], state[STATE_POSITION])
        s._pending = True
        self._begin()


def make_window_loader(
    dataset: TsFileWindowDataset,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    num_workers: int = 0,
    blocks_per_shuffle: int = 16,
    drop_last: bool = False,
    stateful: bool = False,
    **kwargs,
) -> tud.DataLoader:
    """Return a DataLoader of window batches with the block-shuffling sampler, set up right.

    Uses :class:`WindowBatchSampler` (each pass is the next epoch; ``loader.batch_sampler``
    takes ``set_epoch``), :func:`collate_windows`, persistent workers and the project's worker
    start method. ``stateful=True`` returns torchdata's ``StatefulDataLoader`` (install
    ``tsfile-torch[resume]``): its ``state_dict()`` holds the sampler's, and a loader rebuilt
    the same way and loaded delivers exactly the batches an uninterrupted run would have
    (loading a state saved with another ``num_workers`` is a ``ValueError``; keep torchdata's
    ``snapshot_every_n_steps=1``: with more, it replays the batches since its last snapshot by
    reading them). ``kwargs`` go to the ``DataLoader`` (``pin_memory``...).

    Raises:
        ImportError: ``stateful=True`` without torchdata installed.
    """
    from tsfile_torch.loader import _stateful_loader_class, worker_context

    if not isinstance(stateful, bool):
        raise TypeError(f"stateful should be True or False, but got stateful={stateful!r}")
    sampler = WindowBatchSampler(
        dataset,
        batch_size,
        shuffle=shuffle,
        seed=seed,
        blocks_per_shuffle=blocks_per_shuffle,
        num_workers=num_workers,
        drop_last=drop_last,
    )
    if num_workers:
        kwargs.setdefault("persistent_workers", True)
        kwargs.setdefault("multiprocessing_context", worker_context())
    loader_class = _stateful_loader_class() if stateful else tud.DataLoader
    with warnings.catch_warnings():  # torchdata 0.11 calls a torch API deprecated in 2.13
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return loader_class(
            dataset,
            batch_sampler=sampler,
            num_workers=num_workers,
            collate_fn=collate_windows,
            **kwargs,
        )
