"""Rows aligned on time across columns with different timestamps (``align="union"|"intersect"``).

The one alignment of the package: the row datasets align all their columns, the window dataset
the fields of each device. A timeline is the time column a set of columns shares: all selected
fields of one aligned (table-model) device of a file, or one non-aligned (tree-model) series.
:meth:`Alignment.build` reads every timeline's timestamps once (one pass over one column of each
timeline, in the building process) and keeps the aligned rows ``times`` (the union or the
intersection): ``8 * rows`` bytes per timeline, pickled into workers with the dataset. Reading
aligned rows ``[a, b)`` then reads, per timeline, only its samples with timestamps in
``[times[a], times[b - 1]]`` (one earlier sample for ``fill="ffill"``) and places them with
:func:`align_to`. A column with no sample at a row gets its fill: ``"nan"``, ``"ffill"`` (the
last earlier sample, NaN before the first) or ``"zero"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tsfile_torch.catalog.build import Catalog, device_name, subset_catalog
from tsfile_torch.errors import SchemaError
from tsfile_torch.read.merge import Merge
from tsfile_torch.read.reader import BatchReader, read_times

__all__ = ["Alignment", "align_to", "aligned_times", "timeline_name", "timelines_of"]


def aligned_times(times: Sequence[np.ndarray], align: str) -> np.ndarray:
    """Return the sorted union or intersection of increasing int64 timestamp arrays."""
    if len(times) == 1:
        return np.asarray(times[0], dtype=np.int64)
    if align == "union":
        return np.unique(np.concatenate([np.asarray(t, dtype=np.int64) for t in times]))
    out = np.asarray(times[0], dtype=np.int64)
    for t in times[1:]:
        out = np.intersect1d(out, t, assume_unique=True)
    return out


def align_to(target: np.ndarray, times: np.ndarray, values: np.ndarray, fill: str) -> np.ndarray:
    """Return ``values`` (float, shape ``(len(times),)``) at the timestamps ``target``.

    Args:
        target: increasing int64 timestamps of the output rows.
        times: increasing int64 timestamps of the series' samples.
        values: the samples, one per timestamp.
        fill: ``"nan"``, ``"ffill"`` or ``"zero"`` for rows without a sample. For ``"ffill"``
            the caller passes the sample before ``target[0]`` too when there is one.
    """
    if fill == "ffill":
        if not len(times):
            return np.full(len(target), np.nan, dtype=values.dtype)
        idx = np.searchsorted(times, target, side="right") - 1
        out = values[np.maximum(idx, 0)].astype(values.dtype, copy=True)
        out[idx < 0] = np.nan
        return out
    out = np.full(len(target), np.nan if fill == "nan" else 0.0, dtype=values.dtype)
    idx = np.searchsorted(times, target, side="left")
    hit = idx < len(times)
    hit[hit] = times[idx[hit]] == target[hit]
    out[hit] = values[idx[hit]]
    return out


def timelines_of(catalog: Catalog, columns: Sequence[int]) -> dict[tuple, list[int]]:
    """Return timeline key -> the columns of ``columns`` on it (in order of first appearance)."""
    members: dict[tuple, list[int]] = {}
    for c in columns:
        shard = catalog.columns[c].shards[0]
        key = ("device", shard.device) if shard.aligned else ("series", c)
        members.setdefault(key, []).append(c)
    return members


@dataclass
class _Timeline:
    columns: tuple[int, ...]  # positions in the alignment's output
    catalog_columns: tuple[int, ...]  # the same columns in the catalog
    times: np.ndarray  # int64 timestamps of its rows
    #: its shards merged by timestamp (they overlap in time: Note: merged shards), or None
    merge: Merge | None = None

    def read(self, reader: BatchReader, lo: int, hi: int):
        """Return its rows ``[lo, hi)`` (merged when its shards overlap): values, times."""
        view = reader.view(self.catalog_columns)
        if self.merge is None:
            return reader.read(lo, hi, view=view)
        # the shards' indexes from the build's timestamps (Note: seeded indexes in timeline)
        self.merge.seed(reader.decoder, {g: view.groups[g] for g in view.ref_groups})
        return self.merge.read(
            lambda a, b, out: reader.read(a, b, out, view=view),
            lo,
            hi,
            len(self.catalog_columns),
            reader.dtype,
        )


class Alignment:
    """Aligned rows of some catalog columns whose timestamps differ. Picklable, no handles.

    Attributes:
        columns: the catalog columns, in output order.
        times: the aligned rows' timestamps.
    """

    def __init__(self, columns: tuple[int, ...], timelines: list[_Timeline], align: str, fill):
        self.columns = columns
        self.timelines = timelines
        self.align = align
        self.fill = fill
        self.times = aligned_times([t.times for t in timelines], align)

    @property
    def num_rows(self) -> int:
        return len(self.times)

    @property
    def identical(self) -> bool:
        """True if every timeline has exactly the aligned timestamps."""
        return all(np.array_equal(t.times, self.times) for t in self.timelines)

    @property
    def merges(self) -> list[Merge]:
        """The merges of its timelines whose shards overlap in time (Note: merged shards)."""
        return [t.merge for t in self.timelines if t.merge is not None]

    @classmethod
    def build(
        cls,
        catalog: Catalog,
        columns: Sequence[int],
        align: str,
        fill: str,
        make_reader: Callable[[Catalog], BatchReader],
        duplicates: str = "error",
        time_unit: str = "ms",
    ) -> Alignment:
        """Read every timeline's timestamps (through one of its columns) and align them.

        ``make_reader(catalog)`` opens a reader with the dataset's settings; it is closed here.
        A timeline whose shards overlap in time is merged by timestamp first (Note: merged
        shards in :mod:`tsfile_torch.read.merge`; ``duplicates`` and ``time_unit`` are its).

        Raises:
            SchemaError: duplicate timestamps with ``duplicates="error"``, or no rows.
        """
        members = timelines_of(catalog, columns)
        out_pos = {c: i for i, c in enumerate(columns)}
        # one column per timeline is enough to read its time column: decode no other values
        probe = subset_catalog(
            catalog, [catalog.columns[cols[0]].name for cols in members.values()]
        )
        reader = make_reader(probe)
        timelines = []
        try:
            for k, cols in enumerate(members.values()):
                positions = tuple(out_pos[c] for c in cols)
                if probe.columns[k].overlapping:
                    merge, times = Merge.build(
                        probe.columns[k].shards,
                        list(read_times(reader, (k,))),
                        duplicates,
                        timeline_name(catalog, cols),
                        [f.name for f in catalog.files],
                        time_unit,
                        reader.index_stride,
                    )  # read_times seeded (and saved) this reader's indexes
                    timelines.append(_Timeline(positions, tuple(cols), times, merge))
                    continue
                # time columns only, no values; their indexes seeded (and saved) on the way
                times = np.concatenate(list(read_times(reader, (k,))))
                timelines.append(_Timeline(positions, tuple(cols), times))
        finally:
            reader.close()
        out = cls(tuple(columns), timelines, align, fill)
        if not out.num_rows:
            names = [catalog.columns[c].name for c in columns[:6]]
            raise SchemaError(
                f"align={align!r}: columns {names} share no timestamp, so there are no rows; "
                f"use align='union' or select overlapping columns"
            )
        return out

    def read(self, reader: BatchReader, start_row: int, stop_row: int):
        """Return aligned rows ``[start_row, stop_row)``: values ``(n, columns)``, timestamps."""
        if not 0 <= start_row < stop_row <= self.num_rows:
            raise ValueError(
                f"row range [{start_row}, {stop_row}) is outside the dataset's "
                f"{self.num_rows} aligned rows or empty"
            )
        target = self.times[start_row:stop_row]
        if len(self.timelines) == 1 and self.timelines[0].merge is not None:
            timeline = self.timelines[0]  # one merged timeline: its rows are the aligned rows
            values, times = timeline.read(reader, start_row, stop_row)
            if timeline.columns == tuple(range(len(self.columns))):
                return values, times
            out = np.empty_like(values)
            out[:, list(timeline.columns)] = values
            return out, times
        out = np.empty((len(target), len(self.columns)), dtype=reader.dtype)
        for timeline in self.timelines:
            own = timeline.times
            lo = int(np.searchsorted(own, target[0], side="left"))
            hi = int(np.searchsorted(own, target[-1], side="right"))
            if self.fill == "ffill" and lo > 0:
                lo -= 1
            if lo < hi:
                values, times = timeline.read(reader, lo, hi)
            else:
                times = np.empty(0, np.int64)
                values = np.empty((0, len(timeline.columns)), dtype=reader.dtype)
            if np.array_equal(times, target):  # every row here is a sample of this timeline
                out[:, list(timeline.columns)] = values
                continue
            for k, c in enumerate(timeline.columns):
                out[:, c] = align_to(target, times, values[:, k], self.fill)
        return out, target.copy()


def timeline_name(catalog: Catalog, columns: Sequence[int]) -> str:
    """Return what to call the timeline of catalog ``columns`` in messages: ``device t.d1``
    (an aligned device's fields), else ``series <name>``."""
    shard = catalog.columns[columns[0]].shards[0]
    if shard.aligned:
        return f"device {device_name(shard.device)}"
    return f"series {catalog.columns[columns[0]].name}"
