"""Device listing: one record per device, from metadata and one pass over each time column.

:func:`list_devices` describes the devices of some files as the window datasets name them
(table model ``meters.s0``, tree model ``root.sg.d1``), each on its own clock: a panel of
devices with different timestamps and lengths is listed as it is, no shared timeline needed.

Note: what a listing reads. The metadata of each file (tags, fields, types, row counts, non-null
value counts, time ranges) and, once, the time column of each device in each file (one file's
device at a time, 8 bytes a row, or all of a device's timestamps when its files overlap in time,
to merge them; a URL source is downloaded for it): the typical step, the
largest gap and the comparison of timestamps need the timestamps, and a regular-looking time
range does not prove a regular clock. No value is read: a field's nulls are its device's rows
minus its non-null values (metadata). The time column read must hold exactly the metadata's
rows, in strictly increasing timestamps, or the file is damaged.

Note: damaged files in a listing. A file whose metadata or time column cannot be read is left
out and named, with the reason, in :attr:`DeviceListing.skipped`; the other files are listed.
tsfile's reader runs in the calling process here, so damage that crashes it natively is kept
out only by checking the files in a child first (``tsfile-torch inspect`` does, and
``tsfile-torch verify`` says what is wrong).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np
from tsfile import ColumnCategory

from tsfile_torch.catalog.build import FileInfo, Shard, device_name, read_metadata
from tsfile_torch.catalog.devices import match_devices
from tsfile_torch.errors import FileProblem, TsFileFormatError
from tsfile_torch.native.backend import open_reader
from tsfile_torch.native.errors import METADATA_ERRORS, native_call
from tsfile_torch.native.queries import prepare_handles, query_times
from tsfile_torch.sources import expand_sources

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "VERIFY_HINT",
    "DeviceInfo",
    "DeviceListing",
    "list_devices",
    "median_step",
    "step_counts",
]

#: The end of every reason a listing gives for a file it left out.
VERIFY_HINT = "check the file with `tsfile-torch verify`"


@dataclass(frozen=True)
class DeviceInfo:
    """One device of a listing. Times are int64 in the files' own unit (ms, us or ns).

    Attributes:
        name: ``table.tag1.tag2`` (table model; a missing tag value reads ``null``) or the
            device path ``root.sg.d1`` (tree model): the name window datasets use.
        tags: tag name -> value (table model, schema order); ``{}`` for a tree-model device.
        fields: field name -> tsfile type (``"DOUBLE"``, ``"STRING"``...), numeric or not.
        num_rows: the device's rows: its distinct timestamps over all files.
        start_time, end_time: its first and last timestamp.
        median_step: the typical step, the median of the steps between consecutive timestamps
            (the lower one of the two middle steps when their number is even, so always a step
            that occurs); ``None`` for a single row.
        max_gap: the largest step between consecutive timestamps; ``None`` for a single row.
        nulls: field -> rows without a value (``num_rows`` minus the field's non-null values
            in metadata); ``None`` where a file holds no statistics for the field.
        files: the files holding the device, in source order.
        shared_timeline: every field has a row (a value or a null) at each of the device's
            timestamps: its fields share one time column (table model, aligned tree devices)
            or have equal timestamps (compared).
        overlapping_files: how many of its files hold time ranges that overlap another
            file's (datasets merge them by timestamp: Note: merged shards in
            :mod:`tsfile_torch.read.merge`); 0 when none do.
        overlap: the time range where its files overlap (first, last), or None.
        duplicates: timestamps stored in more than one of its files (a dataset refuses them
            unless ``duplicates="first"`` or ``"last"``).
    """

    name: str
    tags: dict[str, str | None]
    fields: dict[str, str]
    num_rows: int
    start_time: int
    end_time: int
    median_step: int | None
    max_gap: int | None
    nulls: dict[str, int | None]
    files: tuple[str, ...]
    shared_timeline: bool
    overlapping_files: int = 0
    overlap: tuple[int, int] | None = None
    duplicates: int = 0


@dataclass(frozen=True)
class DeviceListing:
    """What :func:`list_devices` found: the devices, and the files left out.

    Iterating yields the :class:`DeviceInfo` records; ``listing[k]`` is the k-th and
    ``listing["meters.s0"]`` the one of that name.
    """

    devices: tuple[DeviceInfo, ...]
    #: (file, reason) of each file left out as damaged or not a TsFile (Note: damaged files in
    #: a listing)
    skipped: tuple[tuple[str, str], ...] = ()
    #: series name (``device.field``) -> key of its timestamps: equal keys, equal timestamps
    _timeline_keys: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def __iter__(self) -> Iterator[DeviceInfo]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def __getitem__(self, key: int | str) -> DeviceInfo:
        if isinstance(key, str):
            for device in self.devices:
                if device.name == key:
                    return device
            shown = ", ".join(d.name for d in self.devices[:8])
            raise KeyError(f"no device {key!r} in the listing; devices are {shown}")
        return self.devices[key]

    @property
    def names(self) -> list[str]:
        """Device names, in listing order."""
        return [d.name for d in self.devices]

    def to_frame(self) -> pd.DataFrame:
        """Return one row per device, the :class:`DeviceInfo` attributes as columns.

        ``tags``, ``fields`` and ``nulls`` hold dicts; ``median_step`` and ``max_gap`` are
        pandas' nullable ``Int64`` (``<NA>`` for a single row).
        """
        import pandas as pd

        names = [f.name for f in dataclasses.fields(DeviceInfo)]
        frame = pd.DataFrame([dataclasses.asdict(d) for d in self.devices], columns=names)
        for name in ("median_step", "max_gap"):
            frame[name] = frame[name].astype("Int64")
        return frame

    def timelines(self, columns: Sequence[str] | None = None) -> list[list[str]]:
        """Group series (``device.field``) whose timestamps are equal, compared as read.

        Args:
            columns: the series to group (default: every field of every device).

        Returns:
            Groups of series names, most series first, each in the order ``columns`` gives.

        Raises:
            KeyError: a name is not a series of the listing.
        """
        names = list(self._timeline_keys) if columns is None else list(columns)
        position = {n: i for i, n in reversed(list(enumerate(names)))}
        groups: dict[str, list[str]] = {}
        for name in names:
            if name not in self._timeline_keys:
                raise KeyError(f"{name!r} is not a series (device.field) of the listing")
            groups.setdefault(self._timeline_keys[name], []).append(name)
        return sorted(groups.values(), key=lambda g: (-len(g), position[g[0]]))


def list_devices(
    sources, devices: Sequence[str] | None = None, *, remote_options=None
) -> DeviceListing:
    """List the devices of ``sources``: tags, fields, rows, time range, steps and nulls.

    Reads the files' metadata and each device's time column once (Note: what a listing reads);
    a file that cannot be read is left out and named in ``skipped`` (Note: damaged files in a
    listing). Devices need not share a timeline.

    Args:
        sources: what :func:`tsfile_torch.sources.expand_sources` takes: paths,
            directories, globs, URLs, file objects.
        devices: device names or glob patterns (``"meters.*"``); ``None``: every device.
        remote_options: :class:`~tsfile_torch.sources.remote.RemoteOptions` for URL sources.

    Returns:
        A :class:`DeviceListing`, devices in catalog order (sources, then devices as each
        file's metadata lists them; with ``devices``, in the order its items name them, as
        window datasets order them); ``.to_frame()`` makes it a pandas DataFrame.

    Raises:
        TsFileFormatError: a path does not exist, or the readable files hold no series.
        SchemaError: a pattern matches no device, or a series changes type across files.
    """
    problems: list[FileProblem] = []
    meta = read_metadata(expand_sources(sources, remote_options), skipped=problems)
    skipped = [(p.name, _with_hint(p.reason)) for p in problems]
    members: dict[str, list[tuple[str, str, Shard]]] = {}  # device -> (series, dtype, shard)
    for col in meta.columns.values():
        for shard in col.shards:
            members.setdefault(device_name(shard.device), []).append((col.name, col.dtype, shard))
    if not members:
        return DeviceListing((), tuple(skipped))
    chosen = match_devices(list(members), devices)
    members = {d: members[d] for d in chosen}
    keep = {d for d, m in members.items() if _files_overlap([s for _, _, s in m])}
    by_file: dict[int, dict[str, list[tuple[str, Shard]]]] = {}  # file -> device -> series
    for d, m in members.items():
        for n, _, s in m:
            by_file.setdefault(s.file_index, {}).setdefault(d, []).append((n, s))
    clocks: dict[str, list[_Clock]] = {}
    keys: dict[str, list[_Clock]] = {}  # series -> the clocks of its time columns
    tags: dict[str, dict] = {}
    read: set[int] = set()  # indices of the files whose time columns were read
    for info in meta.files:
        if info.index not in by_file:  # holds none of the devices asked for
            continue
        try:
            found = _read_file(info, by_file[info.index], keep)
        except TsFileFormatError as err:
            skipped.append((info.name, _with_hint(FileProblem.of(info.name, err).reason)))
            continue
        read.add(info.index)
        for d, (device_clock, series_clocks, device_tags) in found.items():
            clocks.setdefault(d, []).append(device_clock)
            tags.setdefault(d, device_tags)
            for series, clock in series_clocks.items():
                keys.setdefault(series, []).append(clock)
    listed, timeline_keys = [], {}
    for d, m in members.items():
        if d not in clocks:  # every file holding it was left out
            continue
        clock = _merge(clocks[d])
        series = {n: _key(keys[n]) for n, _, _ in m if n in keys}
        timeline_keys.update(series)
        listed.append(_describe(d, m, clock, series, tags[d], meta.files, read))
    return DeviceListing(tuple(listed), tuple(skipped), timeline_keys)


def _with_hint(reason: str) -> str:
    return reason if "tsfile-torch verify" in reason else f"{reason}; {VERIFY_HINT}"


def _files_overlap(shards: Sequence[Shard]) -> bool:
    """Whether the device's time ranges in different files overlap (its files' timestamps then
    interleave: the union needs them all at once)."""
    return _overlap(shards)[0] > 0


def _overlap(shards: Sequence[Shard]) -> tuple[int, tuple[int, int] | None]:
    """Return how many files' time ranges of the device overlap another file's, and the time
    range where they do (None: no overlap)."""
    spans: dict[int, tuple[int, int]] = {}
    for s in shards:
        lo, hi = spans.get(s.file_index, (s.start_time, s.end_time))
        spans[s.file_index] = (min(lo, s.start_time), max(hi, s.end_time))
    ordered = sorted(spans.items(), key=lambda kv: kv[1])
    hit: set[int] = set()
    first = last = None
    end, end_file = None, None
    for f, (lo, hi) in ordered:
        if end is not None and lo <= end:
            hit.update((f, end_file))
            first = lo if first is None else min(first, lo)
            last = min(hi, end) if last is None else max(last, min(hi, end))
        if end is None or hi > end:
            end, end_file = hi, f
    return len(hit), (None if first is None else (first, last))


@dataclass
class _Clock:
    """Strictly increasing timestamps, summarized so that pieces in other files merge exactly.

    ``steps`` / ``counts``: each distinct step and how often it occurs; ``fingerprint``: two
    sums (mod 2**64) of a mix of each timestamp, so that equal sets of timestamps, however
    split over files, have equal fingerprints; ``times``: kept when pieces interleave.
    """

    num_rows: int
    first: int
    last: int
    steps: np.ndarray
    counts: np.ndarray
    fingerprint: tuple[int, int]
    times: np.ndarray | None = None
    #: timestamps found in more than one of the pieces merged into it
    duplicates: int = 0


_SEEDS = (0x9E3779B97F4A7C15, 0xD1B54A32D192ED03)


def _mix_sum(times: np.ndarray, seed: int) -> int:
    """Sum of splitmix64 of each timestamp, mod 2**64 (numpy's uint64 arithmetic wraps)."""
    z = np.ascontiguousarray(times, dtype=np.int64).view(np.uint64) + np.uint64(seed)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return int(z.sum(dtype=np.uint64))


def step_counts(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return each distinct step of ``steps`` and how often it occurs (a regular clock: no
    sort)."""
    if len(steps) and steps.min() == steps.max():
        return steps[:1], np.array([len(steps)], dtype=np.int64)
    return np.unique(steps, return_counts=True)


def median_step(steps: np.ndarray, counts: np.ndarray) -> int:
    """Return the exact (lower) median of steps given as values and their counts (values may
    repeat: counts of several stretches, concatenated); the one step statistic of the device
    listing and of the missing-timestamps warning."""
    order = np.argsort(steps, kind="stable")
    cum = np.cumsum(counts[order])
    middle = (int(cum[-1]) - 1) // 2  # the lower median's position among the sorted steps
    return int(steps[order][np.searchsorted(cum, middle, side="right")])


def _clock(times: np.ndarray, keep: bool = False) -> _Clock:
    distinct, counts = step_counts(np.diff(times))
    return _Clock(
        len(times),
        int(times[0]),
        int(times[-1]),
        distinct,
        counts,
        tuple(_mix_sum(times, seed) for seed in _SEEDS),
        times if keep else None,
    )


def _merge(pieces: list[_Clock]) -> _Clock:
    """Return the clock of the union of ``pieces`` (pieces that interleave carry their times)."""
    if len(pieces) == 1:
        return pieces[0]
    pieces = sorted(pieces, key=lambda c: c.first)
    if any(b.first <= a.last for a, b in pairwise(pieces)):
        times, counts = np.unique(np.concatenate([c.times for c in pieces]), return_counts=True)
        return dataclasses.replace(_clock(times), duplicates=int(np.count_nonzero(counts > 1)))
    joins = np.array([b.first - a.last for a, b in pairwise(pieces)], dtype=np.int64)
    return _Clock(
        sum(c.num_rows for c in pieces),
        pieces[0].first,
        pieces[-1].last,
        np.concatenate([*(c.steps for c in pieces), joins]),
        np.concatenate([*(c.counts for c in pieces), np.ones(len(joins), dtype=np.int64)]),
        _add(pieces),
    )


def _add(pieces: Sequence[_Clock]) -> tuple[int, int]:
    return tuple(sum(c.fingerprint[k] for c in pieces) % 2**64 for k in range(2))


def _key(pieces: Sequence[_Clock]) -> str:
    """Key of the timestamps of a series whose time columns are ``pieces`` (one per file)."""
    one, two = _add(pieces)
    return f"{sum(c.num_rows for c in pieces)}:{one:016x}{two:016x}"


def _median_and_gap(clock: _Clock) -> tuple[int | None, int | None]:
    if clock.num_rows < 2:
        return None, None
    return median_step(clock.steps, clock.counts), int(clock.steps.max())


def _read_file(
    info: FileInfo, members: dict[str, list[tuple[str, Shard]]], keep: set[str]
) -> dict[str, tuple[_Clock, dict[str, _Clock], dict]]:
    """Read the time columns of ``members`` (device -> its series here) in one file.

    Returns device -> (its clock here, series -> the clock of its time column here, its tags).

    Raises:
        TsFileFormatError: the file cannot be read, or a time column disagrees with metadata.
    """
    reader, _ = open_reader(info.source, "pread", check_mapped=False)
    try:
        schemas = native_call(
            info.name,
            "reading the table schemas",
            reader.get_all_table_schemas,
            hint="the file is damaged",
            also=METADATA_ERRORS,
        )
        found = {}
        for device, series in members.items():
            aligned = [(n, s) for n, s in series if s.aligned]
            columns = ([([n for n, _ in aligned], aligned[0][1])] if aligned else []) + [
                ([n], s) for n, s in series if not s.aligned
            ]  # one per time column: the aligned series share one, unaligned have their own
            handles = prepare_handles(
                reader, info.index, info.nbytes, info.name, [s for _, s in columns]
            )
            times = [
                _read_times(reader, info, device, shard, handle)
                for (_, shard), handle in zip(columns, handles, strict=True)
            ]
            clocks = [_clock(t) for t in times]
            union = times[0] if len(times) == 1 else np.unique(np.concatenate(times))
            fresh = device in keep or len(times) > 1  # else the one time column's clock serves
            device_clock = _clock(union, keep=device in keep) if fresh else clocks[0]
            by_series = {n: c for (names, _), c in zip(columns, clocks, strict=True) for n in names}
            found[device] = (device_clock, by_series, _tags(series[0][1].device, schemas))
        return found
    finally:
        reader.close()


def _read_times(reader, info: FileInfo, device: str, shard: Shard, handle) -> np.ndarray:
    what = f"reading the time column of device {device}"
    times = native_call(
        info.name,
        what,
        query_times,
        reader,
        handle,
        shard.aligned,
        shard.start_time,
        shard.end_time,
        hint=f"the file is damaged; {VERIFY_HINT}",
    )
    increasing = len(times) < 2 or bool(np.all(times[1:] > times[:-1]))
    if (
        len(times) != shard.num_rows
        or not increasing
        or (len(times) and (times[0], times[-1]) != (shard.start_time, shard.end_time))
    ):
        raise TsFileFormatError(
            f"{info.name}: the time column of device {device} ({shard.measurement!r}) read "
            f"{len(times)} timestamps{'' if increasing else ' not strictly increasing'}, which "
            f"disagrees with the metadata's {shard.num_rows} rows in [{shard.start_time}, "
            f"{shard.end_time}]; the file is damaged; {VERIFY_HINT}"
        )
    return times


def _tags(device: tuple, schemas) -> dict[str, str | None]:
    """Tag name -> value of a table-model device (``{}`` in the tree model)."""
    table = (schemas or {}).get(device[0])
    if table is None:
        return {}
    names = [
        c.get_column_name() for c in table.get_columns() if c.get_category() == ColumnCategory.TAG
    ]
    values = [*device[1:], *[None] * len(names)][: len(names)]  # trailing missing values: None
    return {n: (None if v is None else str(v)) for n, v in zip(names, values, strict=True)}


def _describe(
    name: str,
    members: Sequence[tuple[str, str, Shard]],
    clock: _Clock,
    keys: dict[str, str],
    tags: dict,
    files: Sequence[FileInfo],
    read: set[int],
) -> DeviceInfo:
    """Describe device ``name`` from its series' shards in the files ``read`` (file indices)."""
    dtypes: dict[str, str] = {}
    values: dict[str, int | None] = {}
    held = []
    for _, dtype, shard in members:
        if shard.file_index not in read:
            continue
        held.append(files[shard.file_index].name)
        dtypes.setdefault(shard.measurement, dtype)
        count = values.get(shard.measurement, 0)
        known = count is not None and shard.num_values is not None
        values[shard.measurement] = count + shard.num_values if known else None
    step, gap = _median_and_gap(clock)
    device_key = _key([clock])
    overlapping, overlap = _overlap([s for _, _, s in members if s.file_index in read])
    return DeviceInfo(
        name=name,
        tags=tags,
        fields=dtypes,
        num_rows=clock.num_rows,
        start_time=clock.first,
        end_time=clock.last,
        median_step=step,
        max_gap=gap,
        nulls={f: None if v is None else clock.num_rows - v for f, v in values.items()},
        files=tuple(dict.fromkeys(held)),
        shared_timeline=all(key == device_key for key in keys.values()),
        overlapping_files=overlapping,
        overlap=overlap,
        duplicates=clock.duplicates,
    )
