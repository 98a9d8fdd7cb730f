"""Rows aligned on time across columns with different timestamps (``align="union"|"intersect"``).

A timeline is the time column a set of columns shares: all selected fields of one aligned
(table-model) device, or one non-aligned (tree-model) series alone. With ``align`` set and more
than one timeline, :meth:`Alignment.build` reads every timeline's timestamps once (one pass over
the time columns, in the building process). If they are all identical the dataset keeps
positional rows (the fast path); otherwise it keeps them with the aligned rows ``times`` (union
or intersection): ``8 * rows`` bytes per timeline, pickled into workers with the dataset.
Reading aligned rows ``[a, b)`` then reads, per timeline, only its samples with timestamps in
``[times[a], times[b - 1]]`` (one earlier sample for ``fill="ffill"``) through
:meth:`BatchReader.read_group`, and places them with :func:`tsfile_torch.read.align.align_to`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tsfile_torch.catalog.build import Catalog, subset_catalog
from tsfile_torch.errors import SchemaError
from tsfile_torch.read.align import align_to, aligned_times
from tsfile_torch.read.reader import BatchReader

__all__ = ["Alignment", "several_timelines"]


def _timeline_key(catalog: Catalog, column: int) -> tuple:
    shard = catalog.columns[column].shards[0]
    return ("device", shard.device) if shard.aligned else ("series", column)


def several_timelines(catalog: Catalog) -> bool:
    """Return True if the columns come from more than one time column (device or series)."""
    return len({_timeline_key(catalog, c) for c in range(len(catalog.columns))}) > 1


@dataclass
class _Timeline:
    columns: tuple[int, ...]  # output positions
    groups: tuple[int, ...]  # read groups, in row order
    times: np.ndarray  # int64 timestamps of its rows


class Alignment:
    """Aligned rows of a catalog whose columns have different timestamps. Picklable."""

    def __init__(self, catalog: Catalog, timelines: list[_Timeline], align: str, fill: str):
        self.catalog = catalog
        self.timelines = timelines
        self.align = align
        self.fill = fill
        self.times = aligned_times([t.times for t in timelines], align)

    @property
    def num_rows(self) -> int:
        return len(self.times)

    @property
    def identical(self) -> bool:
        """True if every timeline has exactly the aligned timestamps (positional rows suffice)."""
        return all(np.array_equal(t.times, self.times) for t in self.timelines)

    @classmethod
    def build(cls, catalog: Catalog, read_backend: str, align: str, fill: str) -> Alignment:
        """Read every timeline's timestamps (with one value column each) and align them."""
        members: dict[tuple, list[int]] = {}
        for c in range(len(catalog.columns)):
            members.setdefault(_timeline_key(catalog, c), []).append(c)
        # one column per timeline is enough to read its time column: decode no other values
        probe = subset_catalog(
            catalog, [catalog.columns[cols[0]].name for cols in members.values()]
        )
        reader = BatchReader(probe, read_backend, np.float64, cache_bytes=0, decode_threads=1)
        timelines = []
        try:
            for k, cols in enumerate(members.values()):
                timeline = _Timeline(tuple(cols), _groups_of(catalog, cols), np.empty(0, np.int64))
                single = _Timeline((k,), _groups_of(probe, [k]), np.empty(0, np.int64))
                rows = catalog.columns[cols[0]].num_rows
                timeline.times = _read(probe, reader, single, 0, rows)[0].copy()
                timelines.append(timeline)
        finally:
            reader.close()
        out = cls(catalog, timelines, align, fill)
        if not out.num_rows:
            raise SchemaError(
                f"align={align!r}: columns {catalog.column_names[:6]} share no timestamp, so "
                f"there are no rows; use align='union' or select overlapping columns"
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
        out = np.empty((len(target), len(self.catalog.columns)), dtype=reader.dtype)
        for timeline in self.timelines:
            own = timeline.times
            lo = int(np.searchsorted(own, target[0], side="left"))
            hi = int(np.searchsorted(own, target[-1], side="right"))
            if self.fill == "ffill" and lo > 0:
                lo -= 1
            if lo < hi:
                times, values = _read(self.catalog, reader, timeline, lo, hi)
            else:
                times = np.empty(0, np.int64)
                values = np.empty((len(timeline.columns), 0), dtype=reader.dtype)
            for k, c in enumerate(timeline.columns):
                out[:, c] = align_to(target, times, values[k], self.fill)
        return out, target.copy()


def _groups_of(catalog: Catalog, cols) -> tuple[int, ...]:
    """Return the read groups holding ``cols``, in row order."""
    groups = {gi for gi, g in enumerate(catalog.groups) if set(g.columns) & set(cols)}
    return tuple(sorted(groups, key=lambda gi: catalog.groups[gi].start_row))


def _read(catalog: Catalog, reader: BatchReader, timeline: _Timeline, lo: int, hi: int):
    """Return rows ``[lo, hi)`` of one timeline: times ``(n,)``, values ``(columns, n)``."""
    times = np.empty(hi - lo, np.int64)
    values = np.empty((len(timeline.columns), hi - lo), dtype=reader.dtype)
    where = {c: k for k, c in enumerate(timeline.columns)}
    for gi in timeline.groups:
        group = catalog.groups[gi]
        a, b = max(lo, group.start_row), min(hi, group.stop_row)
        if a >= b:
            continue
        t, v = reader.read_group(gi, a - group.start_row, b - group.start_row)
        times[a - lo : b - lo] = t
        for r, c in enumerate(group.columns):
            values[where[c], a - lo : b - lo] = v[r]
    return times, values
