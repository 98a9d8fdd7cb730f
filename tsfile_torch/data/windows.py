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
:class:`~tsfile_torch.read.blockcache.BlockCache` of ``cache_bytes`` (one default for every
view). A batch
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
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch.utils.data as tud

from tsfile_torch.catalog.devices import select_devices, tag_codes
from tsfile_torch.data.features import time_features
from tsfile_torch.data.handover import batch_arrays
from tsfile_torch.data.normalize import DeviceNormalizer, Normalizer, make_normalizer
from tsfile_torch.data.view import KeptBatch, LoaderSpec, View, resolve_rank
from tsfile_torch.data.window_index import WindowIndex
from tsfile_torch.data.window_items import (
    WindowBatch,
    WindowItems,
    collate_windows,
    pad_windows,
    window_loader_spec,
)
from tsfile_torch.data.window_spec import WindowSpec, step_alias
from tsfile_torch.errors import SchemaError, warn_caller
from tsfile_torch.options import TIME_UNITS, ReadOptions, format_timestamp, to_timestamp
from tsfile_torch.read.blockcache import Block
from tsfile_torch.read.core import (
    ReadingCore,
    place_on_grid,
    share_finalized_blocks,
    step_summaries,
)
from tsfile_torch.sampling import orders
from tsfile_torch.sampling.orders import OrderSpec
from tsfile_torch.sampling.passes import Passes

__all__ = ["TsFileWindowDataset", "WindowBatch", "WindowInfo", "collate_windows"]

#: Device rows per decoded block (Note: window blocks): ~3 pages of the writer's defaults.
DEFAULT_WINDOW_BLOCK_ROWS = 32768


class WindowInfo(NamedTuple):
    """Where window ``i`` comes from (``start_row``: the device's row, counted in range)."""

    device: str
    start_row: int
    start_time: int


class TsFileWindowDataset(View, tud.Dataset):
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
        order: ``"sequential"`` (default; in order whatever ``num_workers``), ``"stretches"``
            (a stretch per worker, delivered interleaved), ``"shuffle"`` (shuffled within a
            buffer of ``shuffle_blocks`` blocks), ``"batches"`` (a full permutation) or
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
        freq: place each device's rows on a regular time grid (Note: time grid in
            :mod:`tsfile_torch.read.grid`): a fixed pandas offset alias (``"15min"``), a
            ``timedelta`` or a number in ``time_unit``. A step without a reading is a missing
            row (NaN, masked, ``fill=`` and ``max_missing`` apply), so a window spans exactly
            ``(context_length + horizon - 1) * freq``; ``stride``, ``min_context`` and
            ``split_by_time`` count steps. ``None``: windows count rows, and missing
            timestamps are warned about once (``ds.steps``).
        origin, snap: with ``freq``: a time the grid passes through (default: each device's
            first timestamp); round timestamps to the nearest step instead of refusing those
            off the grid.
        max_future_missing: leave out windows whose horizon misses more than this fraction
            of its target values (``0.0``: any); ``ds.filtered`` counts what each filter
            left out.
        **read_options: :class:`~tsfile_torch.options.ReadOptions` fields (``read_backend``,
            ``dtype``, ``normalize`` (per field, every device alike), ``align`` (for fields of one
            device with different timestamps), ``fill`` (``"zero"`` / ``"ffill"`` fill nulls
            and alignment gaps; ffill carries values within a window only with
            ``return_dict``, where alignment leaves gaps to the window so masks stay exact),
            ``cache``, ``cache_bytes`` (the
            window-block cache, default as for rows), ``block_rows`` (default 32,768),
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
        freq=None,
        origin=None,
        snap: bool = False,
        max_future_missing: float | None = None,
        **read_options,
    ):
        window = WindowSpec(
            context_length,
            horizon,
            stride,
            columns,
            targets,
            devices,
            return_dict,
            time_features,
            normalize_by,
            min_context,
            max_missing,
            device_weights,
            freq,
            origin,
            snap,
            max_future_missing,
        )
        order_spec = OrderSpec(
            orders.resolve_order(order, shuffle), seed, drop_last, shuffle_blocks, num_samples
        )
        self._build(sources, window, ReadOptions(**read_options), order_spec, rank, world_size)

    @classmethod
    def from_specs(
        cls,
        sources,
        window: WindowSpec,
        read: ReadOptions,
        order: OrderSpec,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> TsFileWindowDataset:
        """Build the dataset from its three groups of arguments (:mod:`tsfile_torch.data.
        window_spec`): what a window is, what is read and how items are ordered."""
        ds = cls.__new__(cls)
        ds._build(sources, window, read, order, rank, world_size)
        return ds

    def _build(self, sources, window, read, order_spec, rank, world_size) -> None:
        window = _resolved(window, read, order_spec)
        #: what this dataset was built from (split_by_time replaces the read options)
        self._request = (sources, order_spec, rank, world_size)
        self.window, self.order_spec = window, order_spec
        self.passes = Passes(self, *resolve_rank(rank, world_size))
        # blocks are cached by the core finalized, with their tails (Note: window blocks)
        core = ReadingCore(
            sources, read, default_block_rows=DEFAULT_WINDOW_BLOCK_ROWS, reader_cache=False
        )
        self.core = core
        chosen = select_devices(
            core.meta, window.columns, window.targets, window.devices, read.start_time,
            read.end_time,
        )  # fmt: skip
        self.columns_x, self.targets, self.fields = chosen.columns, chosen.targets, chosen.fields
        self._devices = chosen.names
        #: per tag level (schema order), its values; a code is an index into this list
        self.tag_vocab, self._tag_codes = tag_codes(chosen.keys)
        tables = [
            (chosen.table_columns(k), f"device {d!r}: fields") for k, d in enumerate(chosen.names)
        ]
        # dict items carry observed masks: alignment leaves gaps NaN, the window fills them
        core.lay_out(chosen.catalog, tables, align_fill="nan" if self.return_dict else read.fill)
        _place_on_grid(self, core, window.grid(read.time_unit))
        _check_long_enough(self, core)
        names = [self._table_names(k) for k in range(len(self._devices))]
        core.finish(_normalizer(self, read.normalize), names, self._nulls_hint())
        self.items = _window_items(self, read)
        _set_windows(self, np.full(len(self._devices), -self._padding, dtype=np.int64))
        if not len(self):
            raise SchemaError(_no_window_left(self))
        self.passes.check_sharding(1)

    @property
    def _padding(self) -> int:
        """Rows of left padding the first window of a device may have (``min_context``)."""
        return self.window.padding

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
        return len(self.index)

    @property
    def missing_future(self) -> int | None:
        """Windows (before filtering) with a missing target value in their horizon, counted
        when a filter read the windows (``max_missing`` / ``max_future_missing``), else None."""
        return None if self.filtered is None else self.filtered.missing_future

    def window_counts(self) -> dict[str, int]:
        """Windows per device."""
        return dict(zip(self._devices, self.index.counts().tolist(), strict=True))

    def data_identity(self) -> dict:
        """The view's data identity plus the window settings, kept readable (a state saved with
        other settings is refused, naming them; Note: state identity)."""
        windows = {
            "context_length": self.context_length,
            "horizon": self.horizon,
            "stride": self.stride,
            "min_context": self.min_context,
            "max_missing": self.max_missing,
            "targets": list(self.targets),
            "grid": repr(self.core.grid_spec),
            "max_future_missing": self.max_future_missing,
        }
        return {**super().data_identity(), "windows": windows}

    def _layout(self) -> tuple[np.ndarray, int]:
        """Block starts: windows whose first row lies in one ``block_rows`` run of a device."""
        if self.order_spec.order in ("sequential", "stretches", "shuffle"):
            return self.index.blocks(self.block_rows), 1
        if self.order_spec.block_weights is not None:  # device_weights="uniform": per device
            return np.unique(self.index.first), 1
        return np.array([0, len(self)], dtype=np.int64), 1

    def _batch_key(self, items: np.ndarray, batch_size: int | None) -> list[int]:
        return items.tolist()

    def _locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Return (device, first device row) of each window index (negative ones count back)."""
        return self.index.locate(indices)

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
        return _split_by_time(self, t)

    def window_info(self, index: int) -> WindowInfo:
        """Return (device, first device row, first timestamp) of window ``index``."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        k, row = (int(a[0]) for a in self.index.locate([index]))
        real = max(row, 0)  # a padded window: the time of its first real row
        times = self._block(k, real // self.block_rows).times
        return WindowInfo(self._devices[k], row, int(times[real % self.block_rows]))

    def __getitem__(self, index):
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch | KeptBatch:
        """Return the windows ``indices`` as a :class:`WindowBatch` (Note: window blocks).

        No indices give an empty batch (zero windows, the usual shapes otherwise), as slicing
        does. In a make_loader worker, a batch kept whole in the disk cache is a
        :class:`KeptBatch` (Note: hand-over).
        """
        return self.gather(indices, hand_over=True)

    def gather(self, indices: Sequence[int], hand_over: bool = False):
        """Return the windows ``indices`` as a :class:`WindowBatch` (``hand_over``: or a
        :class:`KeptBatch` where a make_loader worker may hand the batch over by reference)."""
        return _gather(self, indices, hand_over)

    def loader_spec(self) -> LoaderSpec:
        """Windows are batched by the loader (``batch_size`` windows) through collate_windows."""
        return window_loader_spec(self, [self.core], self.core.slots, gather_block(self))

    # -- blocks -----------------------------------------------------------------------------
    def _nulls_hint(self) -> str | None:
        if self.return_dict or self.options.fill == "zero" or self.max_missing == 0:
            return None  # masked, filled, or the windows holding nulls are dropped
        return (
            "pass fill='zero' (or 'ffill': the last value read earlier in the window, NaN "
            "before the first), max_missing=0.0 to drop the windows holding them, or "
            "return_dict=True for observed masks"
        )

    def _block(self, k: int, b: int) -> Block:
        """Return block ``b`` of device ``k`` with its windows' tails (Note: window blocks)."""
        return self.core.block(k, *_block_span(self, k, b), _annotate(self))

    def _time_features(self, times: np.ndarray) -> np.ndarray:
        return time_features(times, self.time_features, self.options.time_unit)

    def _table_names(self, table: int) -> list[str]:
        if self.normalize_by == "device":
            return [f"{self._devices[table]}.{f}" for f in self.fields]
        return self.fields

    def __getstate__(self):
        out = super().__getstate__()
        out["_request"] = None  # sources may be open file objects; split before pickling
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
        return self.core.stats(names, exact)

    def __repr__(self) -> str:
        return (
            f"TsFileWindowDataset({len(self._devices)} devices, {len(self)} windows, "
            f"context_length={self.context_length}, horizon={self.horizon}, "
            f"stride={self.stride}, columns={self.columns_x}, targets={self.targets}, "
            f"order={self.order_spec.order!r})"
        )


def _block_span(ds, k: int, b: int) -> tuple[int, int]:
    """Rows ``[lo, hi)`` of block ``b`` of device ``k``: its rows and its windows' tails."""
    lo = b * ds.block_rows
    hi = lo + ds.block_rows + ds.context_length + ds.horizon - 1
    return lo, min(hi, ds.core.tables[k].num_rows)


def _annotate(ds):
    """What computes a block's features (its windows' time features), or None."""
    return ds._time_features if ds.time_features else None


def gather_block(ds) -> tuple[int, int] | None:
    """The largest block a batch of ``ds`` gathers from, for fork workers to share
    (:attr:`LoaderSpec.gather_block`): in the shuffled orders a batch gathers windows from
    blocks all over its buffer or the data, so without sharing each worker decodes all of them.
    The in-order orders share none: workers taking turns through the same blocks gained nothing
    from it (benchmarks/RESULTS.md, "What each mechanism pays")."""
    return None if ds.order_spec.order in orders.IN_ORDER else window_block(ds)


def window_block(ds) -> tuple[int, int]:
    """(rows, values per row) of the largest block of ``ds``: ``block_rows`` and the
    windows' tails (Note: window blocks), every field of a device."""
    return ds.block_rows + ds.context_length + ds.horizon - 1, ds.core.width


def _gather(ds, indices: Sequence[int], hand_over: bool = False):
    """Return the windows ``indices`` as a :class:`WindowBatch` (``hand_over``: or a
    :class:`KeptBatch` where a make_loader worker may hand the batch over by reference)."""
    core = ds.core
    core.start_epoch(ds.epoch or 0)
    length = ds.context_length + ds.horizon
    k, start = ds.index.locate(indices)
    row = np.maximum(start, 0)  # padded windows gather from row 0, then shift (below)
    steps = np.arange(length)
    store = core.whole_store() if len(k) else None
    if store is not None:  # every device kept whole, in one array: one gather
        devices = np.unique(k)
        if not store.known_whole():
            for dk in devices:
                core.fill(int(dk))
        if hand_over and core.kept(None, tables=devices):  # before allocating the batch
            return KeptBatch((list(indices),))
    arrays = batch_arrays(ds.items.specs(len(k)))
    values, times = arrays["values"], arrays.get("times")
    if not len(k):
        return ds.items.items(arrays, k)
    if store is not None:
        pick = (store.offsets[k] + row)[:, None] + steps
        # mode="clip" lets take write into ``out`` unbuffered (faster than "raise");
        # every window lies inside its device's rows (_locate), so nothing is clipped
        np.take(store.values, pick, axis=0, out=values, mode="clip")
        if times is not None:
            np.take(store.times, pick, out=times, mode="clip")
        pad_windows(values, times, start)
        return ds.items.items(arrays, k)
    first_block = row // ds.block_rows
    key = k * (1 << 40) + first_block
    order = np.argsort(key, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(key[order])) + 1)
    # cached blocks first: decoding a missing block then evicts blocks this batch is done
    # with, never one it still needs (else a batch spanning two shuffle groups thrashes)
    cache, rows = core.block_cache(), ds.block_rows
    # through fork workers, blocks another worker decoded are taken (Note: block exchange)
    spans = [(int(k[m[0]]), int(first_block[m[0]])) for m in groups]
    wanted = [(dk, *_block_span(ds, dk, b)) for dk, b in spans]
    share_finalized_blocks(core, wanted, _annotate(ds))
    groups.sort(key=lambda m: (int(k[m[0]]), int(first_block[m[0]]) * rows) not in cache)
    # time features are computed once per block, as it is decoded, and gathered like the
    # values: a row is in about (context_length + horizon) / stride windows
    feats = arrays.get("features")
    for members in groups:
        dk, b = int(k[members[0]]), int(first_block[members[0]])
        block = ds._block(dk, b)
        pick = (row[members] - b * ds.block_rows)[:, None] + steps
        values[members] = np.take(block.values, pick, axis=0)  # 5x faster than [pick]
        if times is not None:
            times[members] = np.take(block.times, pick)
        if feats is not None:
            feats[members] = np.take(block.features, pick, axis=0)
    pad_windows(values, times, start)
    if feats is not None and start.min() < 0:  # padded windows' times were extrapolated
        padded = start < 0
        feats[padded] = time_features(times[padded], ds.time_features, ds.options.time_unit)
    return ds.items.items(arrays, k, features_ready=True)


# what a window is, as attributes of the dataset (ds.context_length, ...): its WindowSpec's
for _name in (
    "context_length", "horizon", "stride", "return_dict", "time_features", "normalize_by",
    "min_context", "max_missing", "device_weights", "freq", "origin", "snap",
    "max_future_missing",
):  # fmt: skip
    setattr(TsFileWindowDataset, _name, property(lambda self, n=_name: getattr(self.window, n)))


def _resolved(window: WindowSpec, read: ReadOptions, order: OrderSpec) -> WindowSpec:
    """Return ``window`` with ``normalize_by`` resolved, checked against the order."""
    if window.normalize_by is None:  # a training dataset's per-device normalizer says so
        by = "device" if isinstance(read.normalize, DeviceNormalizer) else "column"
        window = window.replace(normalize_by=by)
    if window.device_weights != "length" and order.order != "random":
        raise ValueError(
            f"device_weights={window.device_weights!r} goes with order='random' (windows "
            f"drawn per epoch); got order={order.order!r}"
        )
    return window


def _forecast_from(ds, rows_before: np.ndarray, cut: int) -> None:
    """Keep the windows whose first new row (the horizon's first; with ``horizon=0`` the
    window's last) is device row ``rows_before[k]`` (the first at or after t) or later."""
    first = rows_before - ds.context_length + (0 if ds.horizon else 1)
    _set_windows(ds, np.maximum(first, -ds._padding))
    if not len(ds.index):
        raise SchemaError(
            f"split_by_time: no device has a whole window "
            f"{'forecasting from' if ds.horizon else 'ending at or after'} t={cut} "
            f"(context_length {ds.context_length} + horizon {ds.horizon} rows); pick "
            f"an earlier t"
        )
    ds.passes.check_sharding(1)


def _split_by_time(ds, t):
    """See :meth:`TsFileWindowDataset.split_by_time`."""
    cut = to_timestamp("t", t, ds.options.time_unit)
    lo, hi = ds.options.start_time, ds.options.end_time
    if (lo is not None and cut <= lo) or (hi is not None and cut > hi):
        raise ValueError(
            f"split_by_time: t={cut} must lie in (start_time, end_time] = ({lo}, {hi}]"
        )
    if ds._request is None:
        raise ValueError(
            "split_by_time: this dataset was unpickled (its sources are not kept in a pickle); "
            "split the dataset before pickling it or handing it to DataLoader workers"
        )
    sources, order, rank, world_size = ds._request
    train_read = dataclasses.replace(ds.options, end_time=cut - 1)
    train = type(ds).from_specs(sources, ds.window, train_read, order, rank, world_size)
    window, read = ds.window.replace(devices=tuple(train.devices)), ds.options
    if train.normalizer is not None:
        window = window.replace(normalize_by=train.normalize_by)
        read = dataclasses.replace(read, normalize=train.normalizer)
    validation = type(ds).from_specs(sources, window, read, order, rank, world_size)
    if validation.core.grid_spec is not None:  # grid rows before t, holes included
        before = [table.grid.steps_before(cut) for table in validation.core.tables]
    else:
        before = [table.num_rows for table in train.core.tables]  # each device's rows before t
    _forecast_from(validation, np.asarray(before, dtype=np.int64), cut)
    return train, validation


def _set_windows(ds, lowest: np.ndarray) -> None:
    """Number the windows: device ``k``'s start at rows ``lowest[k]``, + stride, ...

    Rows below 0 are left padding (``min_context``). With ``max_missing`` or
    ``max_future_missing`` every device is read once here (unless the metadata shows no
    value can be missing) and the windows over it are dropped; ``ds.filtered`` counts them.
    """
    keep, ds.filtered = None, None
    if ds.max_missing is not None or ds.max_future_missing is not None:
        ds.filtered = WindowFilter()
        keep = lambda k, starts: _keep(ds, k, starts)  # noqa: E731
    ds.index = WindowIndex(
        [t.num_rows for t in ds.core.tables],
        ds.context_length + ds.horizon,
        ds.stride,
        lowest,
        keep,
    )
    if keep is not None:
        ds.close()  # the reader used here is not carried into workers
    if ds.device_weights == "uniform":  # a block per device with windows, equal weights
        blocks = int((ds.index.counts() > 0).sum())
        ds.order_spec = dataclasses.replace(ds.order_spec, block_weights=(1.0,) * blocks)


def _keep(ds, k: int, starts: np.ndarray) -> np.ndarray:
    """Return which windows of device ``k`` starting at ``starts`` pass ``max_missing`` and
    ``max_future_missing``, counting them in ``ds.filtered``."""
    if ds.max_missing is None and not _may_miss_future(ds, k):
        ds.filtered.add(len(starts), 0, 0, 0, 0)  # metadata: no target can be missing
        return np.ones(len(starts), dtype=bool)
    total, future = _missing_fraction(ds, k, starts)
    ok_total = np.ones(len(starts), bool) if ds.max_missing is None else total <= ds.max_missing
    ok_future = np.ones(len(starts), bool)
    if ds.max_future_missing is not None:
        ok_future = future <= ds.max_future_missing
    kept = ok_total & ok_future
    ds.filtered.add(
        len(starts),
        int((future > 0).sum()),
        int((~ok_total).sum()),
        int((~ok_future).sum()),
        int((kept & (future > 0)).sum()),
    )
    return kept


def _may_miss_future(ds, k: int) -> bool:
    """Whether a target value of device ``k`` may be missing: a null in the metadata, a step
    of the grid without a reading, or padding."""
    table = ds.core.tables[k]
    if table.alignment is not None or ds._padding:
        return True
    if table.grid is not None and table.grid.holes:
        return True
    cols = [ds.core.catalog.columns[table.columns[j]] for j in ds.items.y_pos]
    return any(c.num_values is None or c.num_values < c.num_rows for c in cols)


class WindowFilter:
    """What ``max_missing`` / ``max_future_missing`` did (``ds.filtered``)."""

    def __init__(self):
        #: windows before filtering; those with a missing target value in their horizon;
        #: those over ``max_missing``; those over ``max_future_missing``; windows kept that
        #: still have a missing target value in their horizon
        self.windows = self.missing_future = self.over_missing = self.over_future = 0
        self.kept_missing_future = 0

    def add(self, windows, missing_future, over_missing, over_future, kept_missing_future):
        self.windows += windows
        self.missing_future += missing_future
        self.over_missing += over_missing
        self.over_future += over_future
        self.kept_missing_future += kept_missing_future

    def __repr__(self) -> str:
        return (
            f"WindowFilter(windows={self.windows}, missing_future={self.missing_future}, "
            f"over_missing={self.over_missing}, over_future={self.over_future}, "
            f"kept_missing_future={self.kept_missing_future})"
        )


def _no_window_left(ds) -> str:
    """The message when the filters leave no window: what each filter left out alone, and
    only fixes that leave windows on this data."""
    f = ds.filtered
    parts = []
    if ds.max_missing is not None:
        parts.append(
            f"max_missing={ds.max_missing} leaves out {f.over_missing} of {f.windows} windows"
        )
    if ds.max_future_missing is not None:
        parts.append(
            f"max_future_missing={ds.max_future_missing} leaves out {f.over_future} (a missing "
            f"target value in the horizon)"
        )
    fixes = []
    if ds.max_missing is not None and f.over_missing < f.windows:
        fixes.append("drop max_missing=")
    elif ds.max_missing is not None:
        fixes.append("raise max_missing")
    if ds.max_future_missing is not None and f.over_future < f.windows:
        fixes.append("drop max_future_missing=")
    elif ds.max_future_missing is not None:
        fixes.append(
            "raise max_future_missing (every horizon misses a target value: check the "
            "targets' null counts with tsfile_torch.list_devices, or a coarser freq=)"
        )
    return (
        f"no window is left: {'; '.join(parts)}; {' or '.join(fixes)}, or pick other fields / "
        f"devices"
    )


def _place_on_grid(ds, core: ReadingCore, grid) -> None:
    """Place the devices' rows on ``grid`` (Note: time grid), or without one warn about
    missing timestamps."""
    if grid is None:
        _warn_gaps(ds, core)
        return
    place_on_grid(core, grid, [f"device {d!r}" for d in ds._devices])
    _warn_holes(ds, core)


def _warn_gaps(ds, core: ReadingCore) -> None:
    """Without ``freq``: warn once when a device's timeline has missing timestamps (a step of
    1.5 typical steps or more), naming it, the largest gap and ``freq=``."""
    summaries = step_summaries(core)
    #: each device's steps between consecutive timestamps (typical, largest)
    ds.steps = dict(zip(ds._devices, summaries, strict=True))
    gapped = [(d, s) for d, s in ds.steps.items() if s.has_gaps]
    if not gapped:
        return
    name, worst = max(gapped, key=lambda ds_: ds_[1].largest / ds_[1].typical)
    unit = ds.options.time_unit
    at = format_timestamp(worst.largest_at, unit)
    warn_caller(
        f"{len(gapped)} of {len(ds._devices)} devices have missing timestamps, e.g. device "
        f"{name!r}: typically {_span(worst.typical, unit)} between readings, but "
        f"{_span(worst.largest, unit)} before {at}. Windows count rows, so a window over such "
        f"a gap spans more time than its steps say and its masks show nothing missing; pass "
        f"freq={_span(worst.typical, unit)!r} to place rows on a time grid where a missing "
        f"timestamp is a missing (masked, counted) row"
    )


def _warn_holes(ds, core: ReadingCore) -> None:
    """With ``freq``: warn when grid steps without a reading reach tuple items as NaN."""
    holes = {d: t.grid.holes for d, t in zip(ds._devices, core.tables, strict=True)}
    ds.steps = None
    total = sum(holes.values())
    if not total or ds._nulls_hint() is None:
        return
    worst = max(holes, key=holes.get)
    warn_caller(
        f"{total:,} steps of the freq={core.grid_spec.label!r} grid have no reading (device "
        f"{worst!r}: {holes[worst]:,}); they reach the windows as NaN: {ds._nulls_hint()}"
    )


def _span(step: int, unit: str) -> str:
    """Return a step in ``unit`` as a pandas offset alias (``"15min"``)."""
    nanos = step * (10**9 // TIME_UNITS[unit])
    return step_alias(pd.Timedelta(nanos, "ns")) or f"{step}{unit}"


def _missing_fraction(ds, k: int, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return the fraction of missing (null, padded or off-grid) values of each window of
    device k, and of its horizon's target values."""
    table, n = ds.tables[k], ds.tables[k].num_rows
    miss_x, miss_y = np.zeros(n + 1, np.int64), np.zeros(n + 1, np.int64)
    for lo in range(0, n, ds.block_rows):
        hi = min(lo + ds.block_rows, n)
        values, _ = table.read(ds.core.reader, lo, hi)
        nan = np.isnan(values)
        miss_x[lo + 1 : hi + 1] = nan[:, ds.items.x_pos].sum(axis=1)
        miss_y[lo + 1 : hi + 1] = nan[:, ds.items.y_pos].sum(axis=1)
    miss_x, miss_y = np.cumsum(miss_x), np.cumsum(miss_y)
    c, h = ds.context_length, ds.horizon
    first = np.maximum(starts, 0)
    padded = (first - starts) * len(ds.items.x_pos)
    future = miss_y[starts + c + h] - miss_y[starts + c]
    missing = padded + miss_x[starts + c] - miss_x[first] + future
    total = missing / (c * len(ds.items.x_pos) + h * len(ds.items.y_pos))
    return total, future / max(h * len(ds.items.y_pos), 1)


def _normalizer(ds, normalize) -> Normalizer | None:
    """Resolve ``normalize=`` per field (``normalize_by="column"``) or per device and field."""
    if ds.normalize_by == "column":
        return make_normalizer(normalize, ds.fields, ds.stats)
    qualified = [n for k in range(len(ds._devices)) for n in ds._table_names(k)]
    if isinstance(normalize, Normalizer) and not isinstance(normalize, DeviceNormalizer):
        raise ValueError(
            f"normalize_by='device' takes normalize='minmax', 'standard', None or a "
            f"DeviceNormalizer (a training dataset's ds.normalizer); got {normalize!r}"
        )
    flat = make_normalizer(normalize, qualified, lambda exact: _device_stats(ds, exact))
    if flat is None or isinstance(flat, DeviceNormalizer):
        return flat
    return DeviceNormalizer.from_normalizer(flat, ds._devices, ds.fields, ds.targets)


def _device_stats(ds, exact: bool) -> dict[str, dict]:
    """Statistics per device and field (``device.field``), rows in range only."""
    names = {
        f"{d}.{f}": [ds.core.tables[k].columns[j]]
        for k, d in enumerate(ds._devices)
        for j, f in enumerate(ds.fields)
    }
    return ds.core.stats(names, exact)


def _window_items(ds, read: ReadOptions) -> WindowItems:
    """Return the shape of ``ds``'s items."""
    return WindowItems(
        ds.context_length,
        ds.horizon,
        ds.fields,
        [ds.fields.index(f) for f in ds.columns_x],
        [ds.fields.index(f) for f in ds.targets],
        ds.return_dict,
        ds.time_features,
        read.dtype,
        read.fill,
        read.return_timestamps,
        read.time_unit,
        ds._tag_codes,
    )


def _check_long_enough(ds, core: ReadingCore) -> None:
    """Raise SchemaError when no device has the rows of one window."""
    longest = max(t.num_rows for t in core.tables)
    needed = ds.context_length - ds._padding + ds.horizon
    if longest < needed:
        raise SchemaError(
            f"no device has {needed} rows (context_length {ds.context_length} + horizon "
            f"{ds.horizon}{' - padding' if ds._padding else ''}) in range; the longest "
            f"has {longest}: use shorter windows, more data or a wider time range"
        )
