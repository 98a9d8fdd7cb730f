"""Whole series per device: :class:`TsFileSeriesDataset`, the series kind of the core.

Item ``i`` is one device's target column (or, with ``multivariate=True``, all its targets)
over the device's whole time range on its ``freq=`` grid, as a GluonTS data entry: so
``estimator.train(ds)`` and ``predictor.predict(ds)`` of GluonTS estimators take the dataset
as it is, and :meth:`TsFileSeriesDataset.chronos2_inputs` gives ``Chronos2Pipeline.fit`` /
``predict`` their per-device dicts. A missing step (no timestamp on the grid, a null cell) is
NaN in ``target``; GluonTS and Chronos read NaN as missing.

Note: series in memory. An item holds its device's selected columns whole (float32, steps x
fields x 4 bytes); GluonTS estimators read every item each epoch. A device longer than memory
should be cut: ``max_length=`` keeps the last N steps (``start`` moves with them), and
``start_time`` / ``end_time`` bound what is read. Items are read on demand through the reading
core (same readers, caches, checks as the window and row views) and are not kept.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd
import torch.utils.data as tud

from tsfile_torch.catalog.devices import select_devices, tag_codes
from tsfile_torch.data.window_spec import WindowSpec
from tsfile_torch.errors import SchemaError
from tsfile_torch.options import TIME_UNITS, ReadOptions, check_bool, check_int, to_timestamp
from tsfile_torch.read.core import ReadingCore, place_on_grid

__all__ = ["TsFileSeriesDataset"]


class TsFileSeriesDataset(tud.Dataset):
    """Map-style dataset of whole series, one item per device and target column.

    Item ``i`` is a dict (a GluonTS data entry): ``start`` (a ``pd.Period`` of the grid's
    ``freq``: the device's first step in range), ``target`` (float32 ``(steps,)``; with
    ``multivariate=True`` ``(len(targets), steps)``, one item per device), NaN where a step is
    missing; ``item_id`` (``"meters.s0/temp"``, or the device name when multivariate);
    ``feat_static_cat`` (int64 code of each tag value of the device, an index into
    :attr:`tag_vocab` per tag level, as the window datasets give); ``past_feat_dynamic_real``
    (``(k, steps)``, the columns that are neither targets nor ``known``) and
    ``feat_dynamic_real`` (the ``known`` columns), each only when there are such columns.

    Args:
        sources: paths, directories, globs, URLs or binary file objects (as every dataset).
        columns: field names read; ``None``: every numeric field all selected devices have.
        targets: the fields forecast; ``None``: ``columns`` less ``known``.
        freq: the time grid (required: GluonTS assumes a regular frequency): a fixed pandas
            offset alias (``"15min"``), a ``timedelta`` or a number in ``time_unit``.
        known: columns known in the future (``feat_dynamic_real``; a GluonTS estimator
            using them needs their values over the forecast range at ``predict`` time).
        devices: device names or glob patterns (``None``: every device with the fields).
        multivariate: one item per device with every target (``target`` ``(d, steps)``).
        max_length: keep the last ``max_length`` steps of each series (Note: series in
            memory); ``None``: all.
        origin, snap: as for the window datasets' grid.
        **read_options: :class:`~tsfile_torch.options.ReadOptions` fields (``start_time``,
            ``end_time``, ``time_unit``, ``read_backend``, ``cache``...).

    Raises:
        SchemaError: unknown devices or fields, a timestamp off the grid.
        ValueError, TypeError: a bad argument, naming it.
    """

    def __init__(
        self,
        sources,
        columns: Sequence[str] | str | None = None,
        targets: Sequence[str] | str | None = None,
        *,
        freq,
        known: Sequence[str] | str = (),
        devices: Sequence[str] | str | None = None,
        multivariate: bool = False,
        max_length: int | None = None,
        origin=None,
        snap: bool = False,
        **read_options,
    ):
        if freq is None:
            raise ValueError(
                "freq is required: a series is read on a regular time grid (GluonTS assumes "
                "one); pass freq='15min' (or the step in the files' time unit)"
            )
        known = (known,) if isinstance(known, str) else tuple(known)
        self.multivariate = check_bool("multivariate", multivariate)
        self.max_length = check_int("max_length", max_length, 1, 2**40, allow_none=True)
        if columns is not None and targets is None:
            columns = (columns,) if isinstance(columns, str) else tuple(columns)
            targets = tuple(c for c in columns if c not in known) or None
        if targets is not None and known:
            targets = (targets,) if isinstance(targets, str) else tuple(targets)
            if set(targets) & set(known):
                raise ValueError(f"known {list(known)} and targets {list(targets)} overlap")
            columns = tuple(dict.fromkeys((*(columns or targets), *known)))
        # the grid lives in the window spec: a series is read on the grid a window would be
        self.spec = WindowSpec(
            1, columns=columns, targets=targets, devices=devices, freq=freq, origin=origin,
            snap=snap,
        )  # fmt: skip
        self._request = (sources, read_options, known)
        self._build(sources, ReadOptions(**read_options), known)

    def _build(self, sources, read: ReadOptions, known: tuple[str, ...]) -> None:
        core = ReadingCore(sources, read)
        self.core = core
        spec = self.spec
        chosen = select_devices(
            core.meta, spec.columns, spec.targets, spec.devices, read.start_time, read.end_time
        )
        #: every field read, the targets, the known and the other (past only) columns
        self.fields = list(chosen.fields)
        self.targets = list(chosen.targets)
        for name in known:
            if name not in self.fields:
                raise SchemaError(f"known column {name!r} is not among the fields {self.fields}")
        self.known = list(known)
        self.past_only = [f for f in chosen.columns if f not in self.targets and f not in known]
        self.devices = list(chosen.names)
        #: per tag level, its values; ``feat_static_cat`` holds indices into these lists
        self.tag_vocab, self._tag_codes = tag_codes(chosen.keys)
        tables = [
            (chosen.table_columns(k), f"device {d!r}: fields") for k, d in enumerate(self.devices)
        ]
        core.lay_out(chosen.catalog, tables, align_fill="nan")
        self.grid = spec.grid(read.time_unit)
        place_on_grid(core, self.grid, [f"device {d!r}" for d in self.devices])
        core.finish(nulls_hint=None)
        #: the grid's step as a pandas offset (GluonTS's ``freq``)
        self.freq = pd.tseries.frequencies.to_offset(
            pd.Timedelta(self.grid.step * (10**9 // TIME_UNITS[read.time_unit]), unit="ns")
        ).freqstr
        self._width = 1 if self.multivariate else len(self.targets)

    def __len__(self) -> int:
        return len(self.devices) * self._width

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(len(self)))

    def series(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Return device ``k``'s ``(values (steps, fields), times)`` on the grid (the last
        ``max_length`` steps)."""
        steps = self.core.table_sizes[k]
        start = 0 if self.max_length is None else max(0, steps - self.max_length)
        values, times = self.core.rows(k, start, steps)
        return np.asarray(values, dtype=np.float32), times

    def __getitem__(self, index: int) -> dict:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index should be an int, but got {index!r}")
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} series")
        k, j = divmod(int(index) % len(self), self._width)
        values, times = self.series(k)
        pos = {f: i for i, f in enumerate(self.fields)}
        device = self.devices[k]
        if self.multivariate:
            target = values[:, [pos[f] for f in self.targets]].T.copy()
            item_id = device
        else:
            target = values[:, pos[self.targets[j]]].copy()
            item_id = f"{device}/{self.targets[j]}"
        entry = {
            "start": self._period(times[0]),
            "target": target,
            "item_id": item_id,
            "feat_static_cat": self._tag_codes[k].astype(np.int64),
        }
        for key, names in (
            ("past_feat_dynamic_real", self.past_only),
            ("feat_dynamic_real", self.known),
        ):
            if names:
                entry[key] = values[:, [pos[f] for f in names]].T.copy()
        return entry

    def _period(self, time: int) -> pd.Period:
        unit = self.options.time_unit
        stamp = pd.Timestamp(int(time) * (10**9 // TIME_UNITS[unit]), unit="ns")
        return pd.Period(stamp, freq=self.freq)

    @property
    def options(self) -> ReadOptions:
        return self.core.options

    def chronos2_inputs(self) -> list[dict]:
        """Return one dict per device for ``Chronos2Pipeline.fit`` / ``predict``: ``target``
        (``(steps,)`` for one target, else ``(len(targets), steps)``; NaN where missing),
        ``past_covariates`` (every other column by name) and, with ``known``, a
        ``future_covariates`` dict naming them with ``None`` (known in the future: fit learns
        from their values in the past; for ``predict`` put their future values there). Chronos
        checks the dicts itself (``chronos.chronos2.preprocess``)."""
        out = []
        pos = {f: i for i, f in enumerate(self.fields)}
        for k in range(len(self.devices)):
            values, _ = self.series(k)
            target = values[:, [pos[f] for f in self.targets]].T.copy()
            entry = {"target": target[0] if len(self.targets) == 1 else target}
            others = self.past_only + self.known
            if others:
                entry["past_covariates"] = {f: values[:, pos[f]].copy() for f in others}
            if self.known:
                entry["future_covariates"] = {f: None for f in self.known}
            out.append(entry)
        return out

    def split_by_time(self, t) -> tuple[TsFileSeriesDataset, TsFileSeriesDataset]:
        """Return ``(train, test)``: each series before ``t``, and each series whole (to
        ``end_time``), so a forecast from train's end is scored on test's steps from ``t``
        (GluonTS's convention: a test entry holds its past too)."""
        sources, read_options, known = self._request
        cut = to_timestamp("t", t, self.options.time_unit)
        lo = self.options.start_time
        if lo is not None and cut <= lo:
            raise ValueError(f"split_by_time: t={cut} must be after start_time={lo}")
        train = self._with(**{**read_options, "end_time": cut - 1})
        return train, self._with(**read_options)

    def _with(self, **read_options) -> TsFileSeriesDataset:
        sources, _, known = self._request
        new = object.__new__(type(self))
        new.__dict__.update(
            spec=self.spec, multivariate=self.multivariate, max_length=self.max_length
        )
        new._request = (sources, read_options, known)
        new._build(sources, ReadOptions(**read_options), known)
        return new

    def __repr__(self) -> str:
        return (
            f"TsFileSeriesDataset({len(self.devices)} devices, targets={self.targets}, "
            f"freq={self.freq!r}, {len(self)} items)"
        )
