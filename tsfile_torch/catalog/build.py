"""Catalog: files -> series -> columns -> row layout, from TsFile metadata only.

No values are read here. Readers opened to read metadata are closed before this module returns,
so nothing native crosses a fork (Note: readers live in the process that uses them).

Column order (Note: column order): sources in the order given (a directory's ``*.tsfile`` sorted
by name, a glob's matches sorted), then devices in the order tsfile's metadata lists them, then
fields in table-schema order (table model) or metadata order (tree model). A series that continues
across files keeps the position of its first appearance. When ``columns`` names columns or
patterns, the result follows that list, each pattern expanding in the order above.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tsfile import TSDataType

from tsfile_torch.errors import FileProblem, SchemaError, TsFileFormatError
from tsfile_torch.native.backend import open_reader
from tsfile_torch.native.errors import METADATA_ERRORS, native_call
from tsfile_torch.native.queries import prepare_handles, query_times
from tsfile_torch.sources import Source, expand_sources

__all__ = [
    "NUMERIC_TYPES",
    "READABLE_VERSIONS",
    "Catalog",
    "Column",
    "FileInfo",
    "ReadGroup",
    "Shard",
    "SourceMetadata",
    "build_catalog",
    "check_shared_timeline",
    "check_format_version",
    "chunk_count",
    "format_version",
    "lay_out",
    "read_metadata",
    "device_name",
    "survey",
    "subset_catalog",
    "unreadable_version",
]

#: tsfile types read as numbers; every other type is left out of ``columns=None``.
NUMERIC_TYPES = {
    TSDataType.BOOLEAN: "BOOLEAN",
    TSDataType.INT32: "INT32",
    TSDataType.INT64: "INT64",
    TSDataType.FLOAT: "FLOAT",
    TSDataType.DOUBLE: "DOUBLE",
    TSDataType.TIMESTAMP: "TIMESTAMP",
}


@dataclass
class FileInfo:
    """One source file: the source, its size, and its identity when the catalog was built."""

    index: int
    source: Source
    name: str
    nbytes: int
    #: what :meth:`Source.check_unchanged` compares before every read (None: not checkable);
    #: a change that leaves the content as it was (Note: content-relevant identity) replaces it
    identity: Any = None

    def check_unchanged(self) -> None:
        """Raise TsFileFormatError if the file is no longer the one the catalog was built from."""
        self.identity = self.source.check_unchanged(self.identity)

    @property
    def index_key(self) -> str | None:
        """Key of what is derived from this file as the catalog knows it (caches on disk)."""
        return self.source.index_key(self.identity)


@dataclass(frozen=True)
class Shard:
    """The part of one series stored in one file (what ``prepare_series`` needs to find it)."""

    file_index: int
    device: tuple
    measurement: str
    aligned: bool
    meta_index: int
    value_offset: int
    value_length: int
    time_offset: int
    time_length: int
    num_rows: int
    start_time: int
    end_time: int
    start_row: int = 0
    #: chunks of the series in this file (IoTDB flushes, long files: several); 0: unknown (a
    #: binding without ``chunk_meta_count``), treated as several
    chunks: int = 0
    #: the series' value statistics in this file (checked against decoded values; None: absent)
    num_values: int | None = None
    min: float | None = None
    max: float | None = None
    sum: float | None = None
    first: float | None = None
    last: float | None = None


@dataclass
class Column:
    """One selected series: its name, tsfile type, row count, time range and statistics."""

    name: str
    dtype: str
    shards: list[Shard] = field(default_factory=list)
    #: non-null values (metadata); None when a time range cut the series (not known then)
    num_values: int | None = 0
    min: float | None = None
    max: float | None = None
    sum: float | None = None

    @property
    def num_rows(self) -> int:
        """Rows, nulls included (an aligned device's timeline)."""
        return sum(s.num_rows for s in self.shards)

    @property
    def start_time(self) -> int:
        return self.shards[0].start_time

    @property
    def end_time(self) -> int:
        return max(s.end_time for s in self.shards)

    @property
    def overlapping(self) -> bool:
        """Whether two of its shards overlap in time (Note: merged shards): its rows are then
        the shards' merged by timestamp, and ``num_rows`` counts duplicates once per shard."""
        end = None
        for shard in sorted(self.shards, key=lambda s: s.start_time):
            if end is not None and shard.start_time <= end:
                return True
            end = shard.end_time if end is None else max(end, shard.end_time)
        return False


@dataclass(frozen=True)
class ReadGroup:
    """Columns read by one native call: one device of one file covering the same rows.

    ``columns`` are positions in the output; ``shards`` the matching shards, same order.
    """

    file_index: int
    device: tuple
    aligned: bool
    start_row: int
    num_rows: int
    columns: tuple[int, ...]
    shards: tuple[Shard, ...]

    @property
    def stop_row(self) -> int:
        return self.start_row + self.num_rows

    @property
    def start_time(self) -> int:
        return self.shards[0].start_time

    @property
    def end_time(self) -> int:
        return self.shards[0].end_time


@dataclass(frozen=True)
class Catalog:
    """Everything known about a dataset before reading a value. Picklable, no native handles."""

    files: tuple[FileInfo, ...]
    columns: tuple[Column, ...]
    groups: tuple[ReadGroup, ...]
    num_rows: int
    start_time: int
    end_time: int

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def describe(self) -> list[dict]:
        """Return one dict per column: name, dtype, rows, values, time range, min, max, mean."""
        return [
            {
                "name": c.name,
                "dtype": c.dtype,
                "num_rows": c.num_rows,
                "num_values": c.num_values,
                "start_time": c.start_time,
                "end_time": c.end_time,
                "min": c.min,
                "max": c.max,
                "mean": (c.sum / c.num_values) if c.sum is not None and c.num_values else None,
                "files": sorted({self.files[s.file_index].name for s in c.shards}),
            }
            for c in self.columns
        ]


def chunk_count(ts) -> int:
    """Return the chunks of tsfile series metadata ``ts`` in its file; 0: unknown (a binding
    without ``chunk_meta_count``), which readers treat as several."""
    return getattr(ts, "chunk_meta_count", 0) or 0


def _device_name(device: tuple) -> str:
    return ".".join("null" if part is None else str(part) for part in device)


def _stat_value(stat, prefix: str):
    for suffix in ("float64", "int64", "bool"):
        value = getattr(stat, f"{prefix}_{suffix}", None)
        if value is not None:
            return float(value)
    return None


#: TsFile format versions (the byte after the ``TsFile`` magic) the installed tsfile reads:
#: tsfile 2.5.0 reads and writes version 4; a version 3 file (older IoTDB releases) fails
#: inside its reader with "Incomplete data read operation", which is not damage.
READABLE_VERSIONS = (4,)
_MAGIC = b"TsFile"


def format_version(target) -> int | None:
    """Return the format version byte of a TsFile at ``target`` (a path or a binary file
    object, left where it was); None when it does not start with the ``TsFile`` magic or
    cannot be read (tsfile's own open then says why)."""
    try:
        if isinstance(target, (str, os.PathLike)):
            with open(target, "rb") as f:
                head = f.read(len(_MAGIC) + 1)
        else:
            where = target.tell()
            target.seek(0)
            head = target.read(len(_MAGIC) + 1)
            target.seek(where)
    except (OSError, ValueError):
        return None
    if len(head) <= len(_MAGIC) or not head.startswith(_MAGIC):
        return None
    return head[len(_MAGIC)]


def unreadable_version(reason: str) -> bool:
    """Whether a file's problem (a :class:`~tsfile_torch.errors.FileProblem` reason) is a
    format version the installed tsfile does not read, not damage."""
    return reason.startswith("TsFile format version ")


def check_format_version(target, name: str) -> None:
    """Raise TsFileFormatError if the TsFile at ``target`` has a format version the installed
    tsfile does not read (:data:`READABLE_VERSIONS`): a version, not damage."""
    version = format_version(target)
    if version is None or version in READABLE_VERSIONS:
        return
    readable = ", ".join(map(str, READABLE_VERSIONS))
    raise TsFileFormatError(
        f"{name}: TsFile format version {version}; the installed tsfile "
        f"({_tsfile_version()}) reads format version {readable} only. The file is not "
        f"damaged: rewrite it in version {READABLE_VERSIONS[-1]} (load it into a current "
        f"IoTDB and export it, or read and write it again with a tsfile release that reads "
        f"version {version}), or leave it out"
    )


def _tsfile_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"tsfile {version('tsfile')}"
    except PackageNotFoundError:
        return "tsfile"


def _read_metadata(source: Source) -> tuple[dict, dict]:
    """Return tsfile's timeseries metadata and table schemas of one file (reader closed).

    Raises:
        TsFileFormatError: a format version tsfile does not read, or unreadable metadata.
    """
    with source.metadata_target() as target:
        check_format_version(target, source.name)
        reader, _ = open_reader(target, "pread", check_mapped=False, name=source.name)
        try:
            return native_call(
                source.name,
                "reading the TsFile metadata",
                lambda: (reader.get_timeseries_metadata(None), reader.get_all_table_schemas()),
                hint="the file is damaged or not a TsFile",
                also=METADATA_ERRORS,
            )
        finally:
            reader.close()


def _read_file(
    index: int, source: Source, identity: Any = None
) -> tuple[FileInfo, list[tuple[str, str, Shard, object]]]:
    """Return the file's info and (name, dtype, shard, statistic) for every field, in order."""
    # before the metadata: a change after it is caught later
    identity = source.identity() if identity is None else source.check_unchanged(identity)
    metadata, schemas = _read_metadata(source)
    info = FileInfo(index, source, source.name, source.size(), identity)
    fields = []
    for device, group in metadata.items():
        order = {ts.measurement_name: i for i, ts in enumerate(group.timeseries)}
        table = schemas.get(group.table_name) if schemas else None
        if table is not None:
            declared = [c.get_column_name() for c in table.get_columns()]
            order = {
                m: declared.index(m) if m in declared else len(declared) + i
                for m, i in order.items()
            }
        for j, ts in sorted(
            enumerate(group.timeseries), key=lambda it: order[it[1].measurement_name]
        ):
            aligned = bool(ts.layout)
            timeline = ts.timeline_statistic if aligned else ts.statistic
            shard = Shard(
                file_index=index,
                device=tuple(device),
                measurement=ts.measurement_name,
                aligned=aligned,
                meta_index=j,
                value_offset=ts.value_metadata_offset,
                value_length=ts.value_metadata_length,
                time_offset=ts.time_metadata_offset,
                time_length=ts.time_metadata_length,
                num_rows=timeline.row_count,
                start_time=timeline.start_time,
                end_time=timeline.end_time,
                chunks=chunk_count(ts),
                **_shard_statistics(ts.statistic),
            )
            dtype = NUMERIC_TYPES.get(ts.data_type, ts.data_type.name)
            fields.append(
                (f"{_device_name(device)}.{ts.measurement_name}", dtype, shard, ts.statistic)
            )
    return info, fields


def _shard_statistics(stat) -> dict:
    if not getattr(stat, "has_statistic", False):
        return {}
    total = getattr(stat, "sum", None)
    return {
        "num_values": stat.row_count,
        "min": _stat_value(stat, "min"),
        "max": _stat_value(stat, "max"),
        "sum": None if total is None else float(total),
        "first": _stat_value(stat, "first"),
        "last": _stat_value(stat, "last"),
    }


def _select(all_columns: dict[str, Column], requested: Sequence[str] | None) -> list[Column]:
    numeric = [c for c in all_columns.values() if c.dtype in NUMERIC_TYPES.values()]
    if requested is None:
        if not numeric:
            raise SchemaError(
                "the sources hold no numeric fields (BOOLEAN, INT32, INT64, FLOAT, "
                "DOUBLE, TIMESTAMP); nothing to read"
            )
        return numeric
    if isinstance(requested, str):
        requested = [requested]
    if not isinstance(requested, (list, tuple)) or not requested:
        raise ValueError(
            f"columns must be None or a non-empty list of names / glob patterns; got {requested!r}"
        )
    chosen: dict[str, Column] = {}
    for item in requested:
        if not isinstance(item, str):
            raise TypeError(f"columns must be names or glob patterns (str); got {item!r}")
        if item in all_columns:
            col = all_columns[item]
            if col.dtype not in NUMERIC_TYPES.values():
                raise SchemaError(
                    f"column {item!r} has type {col.dtype}, which does not read as a number; "
                    f"numeric types are {', '.join(NUMERIC_TYPES.values())}: leave it out"
                )
            chosen.setdefault(item, col)
            continue
        matches = [c for c in all_columns.values() if fnmatch.fnmatchcase(c.name, item)]
        numeric_matches = [c for c in matches if c.dtype in NUMERIC_TYPES.values()]
        if not matches:
            raise SchemaError(
                f"column {item!r} matches no series in the sources{_hint(item, all_columns)}"
            )
        if not numeric_matches:
            raise SchemaError(
                f"pattern {item!r} matches only non-numeric columns "
                f"({', '.join(c.name + ':' + c.dtype for c in matches[:5])}); those are left out"
            )
        for col in numeric_matches:
            chosen.setdefault(col.name, col)
    return list(chosen.values())


def _hint(item: str, all_columns: dict[str, Column]) -> str:
    """Suggest full names for a bare field name (``f64`` -> ``t.d0.f64``, ``*.f64``)."""
    full = [name for name in all_columns if name.endswith("." + item)]
    if full:
        shown = ", ".join(full[:5]) + (f" and {len(full) - 5} more" if len(full) > 5 else "")
        return (
            f"; columns are named table.tag.field (tree model: root.sg.device.measurement): "
            f"use the full names ({shown}) or the pattern '*.{item}' for every device's {item}"
        )
    close = difflib.get_close_matches(item, list(all_columns), n=5, cutoff=0.5)
    return f"; close names: {', '.join(close)}" if close else ""


def _place_shards(col: Column) -> None:
    """Number the rows of ``col``'s shards one after the other, in time order.

    Note: merged shards. Shards that do not overlap in time are the series' rows in this order
    (today's path). Shards that overlap are numbered the same way, one after the other (their
    *stored* rows); the reading layer merges them by timestamp
    (:mod:`tsfile_torch.read.merge`), so a column's ``num_rows`` is then an upper bound of
    its rows (a timestamp stored in two files counts twice).
    """
    col.shards.sort(key=lambda s: (s.start_time, s.file_index))
    start = 0
    placed = []
    for shard in col.shards:
        placed.append(replace(shard, start_row=start))
        start += shard.num_rows
    col.shards[:] = placed


def _make_groups(columns: Sequence[Column]) -> tuple[ReadGroup, ...]:
    buckets: dict[tuple, list[tuple[int, Shard]]] = {}
    for pos, col in enumerate(columns):
        for shard in col.shards:
            if shard.aligned:
                key = (shard.file_index, shard.device, True, shard.start_row, shard.num_rows)
            else:
                key = (shard.file_index, shard.device, False, shard.start_row, pos)
            buckets.setdefault(key, []).append((pos, shard))
    groups = []
    for members in buckets.values():
        first = members[0][1]
        groups.append(
            ReadGroup(
                file_index=first.file_index,
                device=first.device,
                aligned=first.aligned,
                start_row=first.start_row,
                num_rows=first.num_rows,
                columns=tuple(p for p, _ in members),
                shards=tuple(s for _, s in members),
            )
        )
    groups.sort(key=lambda g: (g.file_index, g.start_row, g.columns))
    return tuple(groups)


@dataclass(frozen=True)
class SourceMetadata:
    """Every series of some sources, from their metadata (shards in file order, not placed)."""

    files: tuple[FileInfo, ...]
    columns: dict[str, Column]

    @property
    def numeric(self) -> list[Column]:
        return [c for c in self.columns.values() if c.dtype in NUMERIC_TYPES.values()]


def read_metadata(
    sources: Sequence[Source],
    identities: Mapping[str, Any] | None = None,
    skipped: list | None = None,
) -> SourceMetadata:
    """Read the metadata of every source (one reader per file, closed before returning).

    Args:
        sources: the files.
        identities: source key -> identity taken earlier (a manifest check): used for change
            detection from then on, once checked unchanged.
        skipped: when given, a source whose metadata cannot be read is left out and a
            :class:`~tsfile_torch.errors.FileProblem` for it appended here.

    Raises:
        TsFileFormatError: a source is not a readable TsFile, or none holds a series.
        SchemaError: a series changes type across files.
    """
    files: list[FileInfo] = []
    all_columns: dict[str, Column] = {}
    for source in sources:
        try:
            info, fields = _read_file(len(files), source, (identities or {}).get(source.key))
        except TsFileFormatError as err:
            if skipped is None:
                raise
            skipped.append(FileProblem.of(source.name, err))
            continue
        files.append(info)
        for name, dtype, shard, stat in fields:
            col = all_columns.setdefault(name, Column(name, dtype))
            if col.dtype != dtype:
                raise SchemaError(
                    f"column {name!r} is {col.dtype} in one file and {dtype} in {info.name}; a "
                    f"series must keep one type across files"
                )
            col.shards.append(shard)
            _add_statistic(col, stat)
    if files and not all_columns:  # (no files: every one was skipped, the caller says so)
        raise TsFileFormatError(
            f"{', '.join(f.name for f in files)}: no series in the sources; the TsFiles are empty"
        )
    return SourceMetadata(tuple(files), all_columns)


def survey(sources: Sequence[Source], columns: Sequence[str] | str | None = None) -> dict:
    """Describe ``sources`` from metadata without laying out rows: what ``inspect`` prints.

    Unlike :func:`build_catalog` this does not require the columns to share one timeline; it
    says which do. A timeline is (row count, first time, last time) of a series over all files.

    Returns:
        ``{"files": [name...], "devices": [{"name", "files", "columns"}...], "timelines":
        [{"num_rows", "start_time", "end_time", "columns": [name...]}...] (most columns first),
        "columns": [per-column dict as :meth:`Catalog.describe`, plus "timeline" (its index)],
        "left_out": [non-numeric "name:TYPE"...]}``.

    Raises:
        TsFileFormatError, SchemaError: as :func:`build_catalog`, except for timelines.
    """
    meta = read_metadata(sources)
    files, all_columns = meta.files, meta.columns
    selected = _select(all_columns, columns)
    keys: dict[tuple[int, int, int], list[str]] = {}
    devices: dict[str, dict] = {}
    described = []
    for col in selected:
        key = (
            col.num_rows,
            min(sh.start_time for sh in col.shards),
            max(sh.end_time for sh in col.shards),
        )
        keys.setdefault(key, []).append(col.name)
        device = _device_name(col.shards[0].device)
        entry = devices.setdefault(device, {"name": device, "files": [], "columns": []})
        entry["columns"].append(col.name)
        for sh in col.shards:
            if files[sh.file_index].name not in entry["files"]:
                entry["files"].append(files[sh.file_index].name)
        described.append((col, key))
    timelines = sorted(keys.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    index = {key: i for i, (key, _) in enumerate(timelines)}
    return {
        "files": [f.name for f in files],
        "devices": list(devices.values()),
        "timelines": [
            {"num_rows": k[0], "start_time": k[1], "end_time": k[2], "columns": names}
            for k, names in timelines
        ],
        "columns": [
            {
                "name": c.name,
                "dtype": c.dtype,
                "timeline": index[key],
                "num_rows": key[0],
                "num_values": c.num_values,
                "start_time": key[1],
                "end_time": key[2],
                "min": c.min,
                "max": c.max,
                "mean": (c.sum / c.num_values) if c.sum is not None and c.num_values else None,
                "files": sorted({files[s.file_index].name for s in c.shards}),
            }
            for c, key in described
        ],
        "left_out": [
            f"{c.name}:{c.dtype}"
            for c in all_columns.values()
            if c.dtype not in NUMERIC_TYPES.values()
        ],
    }


def build_catalog(
    sources,
    columns: Sequence[str] | str | None = None,
    start_time: int | None = None,
    end_time: int | None = None,
    remote_options=None,
    *,
    shared_timeline: bool = True,
) -> Catalog:
    """Read the metadata of ``sources`` and lay out the selected ``columns`` as rows.

    ``sources`` are what :func:`tsfile_torch.sources.expand_sources` takes; the rest is
    :func:`lay_out`'s.
    """
    meta = read_metadata(expand_sources(sources, remote_options))
    return lay_out(meta, columns, start_time, end_time, shared_timeline=shared_timeline)


def lay_out(
    meta: SourceMetadata,
    columns: Sequence[str] | str | None = None,
    start_time: int | None = None,
    end_time: int | None = None,
    *,
    shared_timeline: bool = True,
    drop_empty: bool = False,
) -> Catalog:
    """Lay out the selected ``columns`` of ``meta`` as rows (the one time cut lives here).

    Args:
        meta: from :func:`read_metadata`.
        columns: ``None`` for every numeric field, else exact names or glob patterns.
        start_time, end_time: keep only rows with timestamps in ``[start_time, end_time]``
            (inclusive; ``None``: unbounded). Shards wholly inside or outside come from metadata;
            a shard the range cuts has the timestamps of its rows in range read once, to count
            them (cost ~ the rows selected; a remote file is downloaded for this).
        shared_timeline: require every selected column to have the same row count and time
            range (the row datasets need it). ``False`` keeps each column on its own timeline
            (per-device windows, aligned rows): shards still get ``start_row`` along their own
            series, and ``Catalog.num_rows`` / ``start_time`` / ``end_time`` are the largest /
            earliest / latest over the columns.

    Raises:
        TsFileFormatError: a cut shard's timestamps cannot be read.
        SchemaError: a column is unknown or not numeric, a column has no rows in
            the time range, or the selected columns do not share one timeline.
    """
    selected = [
        Column(c.name, c.dtype, list(c.shards), c.num_values, c.min, c.max, c.sum)
        for c in _select(meta.columns, columns)
    ]  # copies: the cut and the placement below change them
    if start_time is not None or end_time is not None:
        _restrict(selected, meta.files, start_time, end_time, drop_empty)
        selected = [c for c in selected if c.shards]
        if not selected:
            raise SchemaError(
                f"no selected column has rows in the time range [{start_time}, {end_time}]; "
                f"widen start_time / end_time"
            )
    for col in selected:
        _place_shards(col)
    if shared_timeline:
        check_shared_timeline(selected)
    return _layout(meta.files, selected)


def _layout(files: tuple[FileInfo, ...], columns: Sequence[Column]) -> Catalog:
    return Catalog(
        files=files,
        columns=tuple(columns),
        groups=_make_groups(columns),
        num_rows=max(c.num_rows for c in columns),
        start_time=min(c.start_time for c in columns),
        end_time=max(c.end_time for c in columns),
    )


def subset_catalog(catalog: Catalog, names: Sequence[str]) -> Catalog:
    """Return a catalog of the columns ``names`` (exact names, in that order) of ``catalog``.

    No metadata is read again; the result has no timeline check (see ``shared_timeline``).
    """
    by_name = {c.name: c for c in catalog.columns}
    missing = [n for n in names if n not in by_name]
    if missing or not names:
        raise SchemaError(f"columns {missing} are not in the catalog; pick from its column_names")
    return _layout(catalog.files, [by_name[n] for n in names])


def device_name(device: tuple) -> str:
    """Return the dotted name of a device tuple: ``('t', 'd0')`` -> ``'t.d0'``."""
    return _device_name(device)


def _add_statistic(col: Column, stat) -> None:
    if not getattr(stat, "has_statistic", False):
        return
    col.num_values += stat.row_count
    low, high, total = (
        _stat_value(stat, "min"),
        _stat_value(stat, "max"),
        getattr(stat, "sum", None),
    )
    if low is not None:
        col.min = low if col.min is None else min(col.min, low)
    if high is not None:
        col.max = high if col.max is None else max(col.max, high)
    if total is not None:
        col.sum = float(total) if col.sum is None else col.sum + float(total)


def check_shared_timeline(columns: Sequence[Column], what: str = "columns") -> None:
    """Raise SchemaError unless ``columns`` have the same row count and time range.

    The metadata check of one timeline (row datasets; a device's fields for windows); rows
    are then compared timestamp by timestamp as they are read. A column whose shards overlap
    counts duplicate timestamps once per shard (Note: merged shards): its row count is compared
    once merged, by the reading layer, and only its time range here.
    """
    ref = columns[0]
    for col in columns[1:]:
        merged = ref.overlapping or col.overlapping
        if (None if merged else col.num_rows, col.start_time, col.end_time) != (
            None if merged else ref.num_rows,
            ref.start_time,
            ref.end_time,
        ):
            raise SchemaError(
                f"{what} do not share one timeline: {ref.name!r} has {ref.num_rows} rows in "
                f"[{ref.start_time}, {ref.end_time}], {col.name!r} has {col.num_rows} rows in "
                f"[{col.start_time}, {col.end_time}]; select columns with equal timestamps or "
                f"align them on time with align='union' or align='intersect' (and fill=...)"
            )


_MIN_TIME, _MAX_TIME = -(2**63), 2**63 - 1


def _restrict(
    columns: Sequence[Column],
    files: Sequence[FileInfo],
    start_time: int | None,
    end_time: int | None,
    drop_empty: bool = False,
) -> None:
    """Cut every column's shards to ``[start_time, end_time]`` (in place; maybe to none).

    Statistics that describe a whole shard (first, last, sum; a column's sum and value count)
    no longer describe what is read, so a cut shard drops them and a column that lost rows
    drops its sum; min and max stay (still bounds).
    """
    lo = _MIN_TIME if start_time is None else start_time
    hi = _MAX_TIME if end_time is None else end_time
    counted: dict[tuple, Shard | None] = {}  # one count per timeline (aligned device of a file)
    for col in columns:
        kept = []
        for shard in col.shards:
            if shard.end_time < lo or shard.start_time > hi:
                continue
            if lo <= shard.start_time and shard.end_time <= hi:
                kept.append(shard)
                continue
            key = (shard.file_index, shard.device, shard.aligned or shard.measurement)
            if key not in counted:
                counted[key] = _cut(shard, files[shard.file_index], lo, hi)
            cut = counted[key]
            if cut is not None:
                kept.append(
                    replace(
                        shard,
                        start_time=cut.start_time,
                        end_time=cut.end_time,
                        num_rows=cut.num_rows,
                        num_values=None,
                        sum=None,
                        first=None,
                        last=None,
                    )
                )
        if kept != col.shards:  # the metadata's sum and value count cover rows left out
            col.sum = None
            col.num_values = None
        if not kept and not drop_empty:
            raise SchemaError(
                f"column {col.name!r} has no rows in the time range [{start_time}, {end_time}] "
                f"(its data spans [{col.start_time}, {col.end_time}]); widen start_time / end_time"
            )
        col.shards[:] = kept


def _cut(shard: Shard, info: FileInfo, lo: int, hi: int) -> Shard | None:
    """Return ``shard`` cut to ``[lo, hi]`` by reading its timestamps there; None if empty."""
    reader, _ = open_reader(info.source, "pread", check_mapped=False)
    try:
        (handle,) = prepare_handles(reader, shard.file_index, info.nbytes, info.name, [shard])
        times = native_call(
            info.name,
            f"reading the timestamps of {shard.measurement!r} in [{lo}, {hi}]",
            query_times,
            reader,
            handle,
            shard.aligned,
            max(lo, shard.start_time),
            min(hi, shard.end_time),
        )
    finally:
        reader.close()
    if not len(times):
        return None
    return replace(
        shard, start_time=int(times[0]), end_time=int(times[-1]), num_rows=int(len(times))
    )
