"""Bring your own data: a pandas DataFrame, a CSV or a Parquet file -> one TsFile.

Rows are written by tsfile's own table-model writer (``TsFileTableWriter``), so the file is what
any TsFile reader expects: one table whose ``tags`` are TAG columns (one device per distinct tag
tuple), whose other columns are FIELD columns, and whose timestamps are the ``time`` column.
Rows are sorted by device, then time (tsfile's writer refuses rows out of order).

Note (refuse, never mangle): what TsFile cannot hold, or what tsfile's writer would silently
change, is a ``ValueError`` naming the column and the fix, raised before anything is written:
upper-case letters in names (tsfile lower-cases table and column names; ``lower_names=True``
lower-cases the column names instead), ``'.'`` in the table or a field name (tsfile-torch names
series ``table.tag1.tag2.field``), tag values that make two devices share one name, nulls or
fractions in the time column, two rows of one device at one timestamp, and dtypes with no TsFile
type (object columns that are not strings, complex, durations, dates, bytes...).
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from tsfile import ColumnCategory, ColumnSchema, TableSchema, TSDataType, TsFileTableWriter

from tsfile_torch.catalog.build import device_name
from tsfile_torch.options import TIME_UNITS, check_choice

__all__ = [
    "FIELD_TYPES",
    "SEPARATORS",
    "Conversion",
    "input_format",
    "read_frame",
    "sniff_separator",
    "write_dataframe",
]

logger = logging.getLogger(__name__)

#: TsFile types a field can be written as, with the Arrow type tsfile's writer takes for each
#: (TIMESTAMP values are int64 in ``time_unit``, handed over as Arrow ``timestamp[ns]``).
FIELD_TYPES = {
    "BOOLEAN": pa.bool_(),
    "INT32": pa.int32(),
    "INT64": pa.int64(),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "TIMESTAMP": pa.int64(),
    "STRING": pa.string(),
    "TEXT": pa.string(),
}

#: Suffixes :func:`read_frame` reads, and how.
INPUT_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}

#: CSV separators :func:`sniff_separator` chooses from; on a tie the earlier one wins.
SEPARATORS = (",", ";", "\t", "|")


@dataclass(frozen=True)
class Conversion:
    """What :func:`write_dataframe` wrote."""

    path: str
    table: str
    num_rows: int
    #: device names as tsfile-torch shows them: ``table.tag1.tag2``
    devices: list[str]
    #: field name -> TsFile type name, in the file's column order
    fields: dict[str, str]
    time_unit: str

    def describe(self) -> str:
        """Return one line for people: rows, devices, fields and their types, the time unit."""
        fields = ", ".join(f"{name} {kind}" for name, kind in self.fields.items())
        return (
            f"wrote {self.num_rows} rows of {len(self.devices)} devices to {self.path}: table "
            f"{self.table!r}, fields {fields}; timestamps in {self.time_unit}"
        )


def write_dataframe(
    df: pd.DataFrame,
    path: str | os.PathLike,
    *,
    table: str,
    tags: Sequence[str] = (),
    time: str = "time",
    types: Mapping[str, str | TSDataType] | None = None,
    time_unit: str = "ms",
    overwrite: bool = False,
    lower_names: bool = False,
) -> Conversion:
    """Write ``df`` into one table-model TsFile at ``path`` through tsfile's table writer.

    Every column other than ``time`` and ``tags`` is a field, in ``df``'s order. Missing values
    (None, NaN, pandas NA) are nulls in TsFile; tsfile-torch reads them back as NaN.

    Args:
        df: one row per (device, timestamp).
        path: the TsFile to write; written aside and renamed into place, so a refused or failed
            conversion leaves nothing behind.
        table: the table name (lower-case, no ``'.'``).
        tags: columns naming the device (TAG columns, in this order): strings, or integers
            (written as their decimal strings); none: the table is one device.
        time: the timestamp column (or ``df``'s index of that name): integers (written as they
            are), datetimes (naive ones are UTC) or ISO-8601 strings, both written as int64
            counts of ``time_unit`` since 1970-01-01 UTC.
        types: TsFile type per field name (``FIELD_TYPES``: ``"DOUBLE"``, ``"INT32"``...),
            instead of the one inferred from its dtype: bool -> BOOLEAN, integers up to 32 bits
            -> INT32, wider -> INT64, float32 / float16 -> FLOAT, float64 -> DOUBLE, datetimes
            -> TIMESTAMP (in ``time_unit``), strings -> STRING.
        time_unit: unit of the written timestamps: ``"s"``, ``"ms"`` (TsFile's usual unit),
            ``"us"`` or ``"ns"``; a datetime finer than the unit is refused, never truncated.
        overwrite: replace an existing file at ``path``.
        lower_names: lower-case the column names (and the index name), and the names given in
            ``tags``, ``time`` and ``types`` with them, instead of refusing upper-case letters
            (TsFile stores names in lower case). The table name is not changed.

    Returns:
        What was written: rows, device names, field types.

    Raises:
        TypeError: ``df`` is not a DataFrame, or an argument has the wrong type.
        ValueError: what TsFile cannot hold (see the module's note), with the column and the fix.
        FileExistsError: ``path`` exists and ``overwrite`` is False.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df should be a pandas DataFrame; got {type(df).__name__}")
    check_choice("time_unit", time_unit, tuple(TIME_UNITS))
    if lower_names:
        df, tags, time, types = _lowered(df, tags, time, types)
    tags, types = _check_columns(df, table, tags, time, types)
    if time not in df.columns:
        df = df.reset_index()  # the time is the index (checked above)
    if len(df) == 0:
        raise ValueError("df has no rows; there is nothing to write")

    times = _time_column(time, df[time], time_unit)
    tag_values = {name: _tag_column(name, df[name]) for name in tags}
    fields = [c for c in df.columns if c != time and c not in tag_values]
    values = {name: _field_column(name, df[name], types.get(name), time_unit) for name in fields}
    order, devices = _device_order(table, tag_values, times, df.index)

    columns = {"time": pa.array(times, pa.int64())}
    columns.update(tag_values)
    columns.update({name: array for name, (_, array) in values.items()})
    data = pa.table(columns).take(pa.array(order))
    schema = TableSchema(
        table,
        [ColumnSchema(name, TSDataType.STRING, ColumnCategory.TAG) for name in tags]
        + [
            ColumnSchema(name, TSDataType[kind], ColumnCategory.FIELD)
            for name, (kind, _) in values.items()
        ],
    )
    _write(os.fspath(path), schema, data, overwrite)
    return Conversion(
        path=os.fspath(path),
        table=table,
        num_rows=len(df),
        devices=devices,
        fields={name: kind for name, (kind, _) in values.items()},
        time_unit=time_unit,
    )


def read_frame(
    path: str | os.PathLike,
    tags: Sequence[str] = (),
    *,
    sep: str | None = None,
    lower_names: bool = False,
) -> pd.DataFrame:
    """Read a CSV (``.csv``, also compressed: ``.csv.gz``...) or Parquet file into a DataFrame.

    CSV tag columns are read as strings, so ``"007"`` stays ``"007"``.

    Args:
        path: the file; its suffix tells the format (:func:`input_format`).
        tags: the columns naming the device (read as strings from a CSV).
        sep: the CSV separator, one character; None: the one of ``SEPARATORS`` that splits the
            header line into the most columns (:func:`sniff_separator`; logged at INFO).
        lower_names: lower-case the column names (``tags`` match them case-insensitively).

    Raises:
        ValueError: the suffix is neither CSV nor Parquet, ``sep`` is not one character, or
            ``sep`` is given for a Parquet file.
    """
    name = os.fspath(path)
    kind = input_format(name)
    if kind == "parquet":
        if sep is not None:
            raise ValueError(f"{name}: sep applies to CSV input; this file is Parquet")
        df = pd.read_parquet(name, engine="pyarrow")
    else:
        if sep is None:
            sep = sniff_separator(name)
            logger.info("%s: separator %r, sniffed from the header (sep= to choose)", name, sep)
        _check_sep(sep)
        text = {tag: str for tag in tags}
        if lower_names and tags:  # a tag given as 'site' names the header's 'Site' too
            wanted = {_lower(tag) for tag in tags}
            header = pd.read_csv(name, sep=sep, nrows=0).columns
            text.update({c: str for c in header if _lower(c) in wanted})
        df = pd.read_csv(name, sep=sep, dtype=text)
    return _lower_columns(df) if lower_names else df


def input_format(path: str | os.PathLike) -> str:
    """Return ``"csv"`` or ``"parquet"``, told by the suffix (``.csv.gz`` and the like are CSV).

    Raises:
        ValueError: the suffix is neither CSV nor Parquet.
    """
    name = os.fspath(path)
    stem, suffix = os.path.splitext(name.lower())
    if suffix in (".gz", ".bz2", ".xz", ".zst", ".zip"):
        suffix = os.path.splitext(stem)[1]
    kind = INPUT_FORMATS.get(suffix)
    if kind is None:
        raise ValueError(
            f"{name}: cannot tell the format from the suffix {suffix!r}; the input must be one "
            f"of {', '.join(sorted(INPUT_FORMATS))} (CSV may be compressed: .csv.gz)"
        )
    return kind


def sniff_separator(path: str | os.PathLike) -> str:
    """Return the separator of a CSV file: the one of ``SEPARATORS`` that splits its header line
    into the most columns (``','`` when none occurs in it).
    """
    # pandas reads the first line as one cell (a separator no header holds, quotes kept), so a
    # compressed or BOM-prefixed file is opened exactly as the read that follows opens it
    first = pd.read_csv(
        os.fspath(path),
        sep="\x1f",
        header=None,
        nrows=1,
        dtype=str,
        quoting=csv.QUOTE_NONE,
        keep_default_na=False,
    )
    return _separator_of(str(first.iat[0, 0]) if first.size else "")


def _separator_of(line: str) -> str:
    widths = {sep: len(next(csv.reader([line], delimiter=sep), [])) for sep in SEPARATORS}
    return max(SEPARATORS, key=widths.__getitem__)  # the first of the widest: ',' on a tie


def _check_sep(sep: Any) -> None:
    if not isinstance(sep, str) or len(sep) != 1 or sep in '"\r\n':
        raise ValueError(
            f"sep must be one character other than a quote or a line break, e.g. ';' or '\\t' "
            f"(command line: --sep ';', --sep tab); got {sep!r}"
        )


def _shown_sep(sep: str) -> str:
    """Return ``sep`` as one would type it after ``--sep``."""
    return "tab" if sep == "\t" else f"'{sep}'"


# -- checks ------------------------------------------------------------------------------------


def _check_name(what: str, name: Any, dotted: bool) -> None:
    """Refuse a name tsfile would rewrite (upper case) or tsfile-torch could not tell apart."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} {name!r}: names must be non-empty strings")
    if name != name.lower():
        fix = (
            f"pass table={name.lower()!r} (command line: --table {name.lower()})"
            if what == "table"
            else "pass lower_names=True (command line: --lower-names) to lower-case the names, "
            "or rename it first (pandas: df.rename(columns=str.lower); a CSV: its header)"
        )
        raise ValueError(
            f"{what} {name!r}: TsFile stores names in lower case (tsfile's writer would write "
            f"{name.lower()!r}, and you would read back a name you did not write); {fix}"
        )
    if dotted and "." in name:
        raise ValueError(
            f"{what} {name!r}: tsfile-torch names series table.tag1.tag2.field, so a '.' "
            f"inside a name is ambiguous; rename it (e.g. replace '.' with '_')"
        )


def _check_columns(df, table, tags, time, types) -> tuple[list[str], dict[str, str]]:
    """Check the names and roles of ``df``'s columns; return the tags and the types by name."""
    _check_name("table", table, dotted=True)
    if isinstance(tags, str) or not isinstance(tags, Sequence):
        raise TypeError(f"tags should be a list of column names; got {tags!r}")
    if not isinstance(time, str):
        raise TypeError(f"time should be a column name; got {time!r}")
    columns = list(df.columns)
    repeated = sorted({str(c) for c in columns if columns.count(c) > 1})
    if repeated:
        raise ValueError(f"df has several columns named {repeated}; names must be unique")
    if time not in columns and df.index.name != time:
        raise ValueError(
            f"time column {time!r} is neither a column nor the index of the data (columns: "
            f"{columns}); {_separator_hint(columns)}pass time=<the column holding the "
            f"timestamps> (command line: --time COLUMN)"
        )
    for name in tags:
        if name not in columns:
            raise ValueError(
                f"tag column {name!r} is not a column of the data (columns: {columns}); pass "
                f"tags=[...] (command line: --tags a,b) naming the columns that identify a device"
            )
        if name == time:
            raise ValueError(f"column {name!r} cannot be both the time column and a tag")
        _check_name("tag column", name, dotted=False)
    if len(set(tags)) != len(tags):
        raise ValueError(f"tags {list(tags)} name a column twice")
    fields = [c for c in columns if c != time and c not in tags]
    if not fields:
        raise ValueError(
            f"df has no field columns (every column is the time or a tag: {columns}); TsFile "
            f"stores at least one value per row"
        )
    for name in fields:
        _check_name("column", name, dotted=True)
    if "time" in columns and time != "time":
        raise ValueError(
            f"column 'time' is not the time column ({time!r} is): 'time' is the name of "
            f"TsFile's own time column; rename it, or pass time='time'"
        )
    return list(tags), _check_types(types, fields)


def _separator_hint(columns: list) -> str:
    """Say so when the data's one column looks like a CSV header split at the wrong separator."""
    if len(columns) != 1 or not isinstance(columns[0], str):
        return ""
    sep = _separator_of(columns[0])
    if sep not in columns[0]:
        return ""
    return (
        f"its one column holds {sep!r}, so the CSV is likely separated by {sep!r}: read it "
        f"with sep={sep!r} (command line: --sep {_shown_sep(sep)}); else "
    )


def _lower(name: Any) -> Any:
    return name.lower() if isinstance(name, str) else name


def _lowered(df: pd.DataFrame, tags, time, types):
    """Return ``df`` with lower-case names (:func:`_lower_columns`), and ``tags``, ``time`` and
    ``types`` naming its columns in lower case too.
    """
    if isinstance(tags, Sequence) and not isinstance(tags, str):
        tags = [_lower(t) for t in tags]
    if isinstance(types, Mapping):
        types = {_lower(name): kind for name, kind in types.items()}
    return _lower_columns(df), tags, _lower(time), types


def _lower_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Return ``df`` with lower-case column and index names; refuse names only case told apart."""
    by_name: dict[Any, list] = {}
    for column in df.columns:
        by_name.setdefault(_lower(column), []).append(column)
    clashes = [found for found in by_name.values() if len(set(found)) > 1]
    if clashes:
        raise ValueError(
            f"columns {clashes[0]} would all be named {_lower(clashes[0][0])!r} with lower-case "
            f"names (lower_names=True, --lower-names); rename all but one of them first"
        )
    df = df.set_axis([_lower(c) for c in df.columns], axis="columns")
    if isinstance(df.index.name, str):  # the time may be the index
        df = df.rename_axis(index=df.index.name.lower())
    return df


def _check_types(types, fields: list[str]) -> dict[str, str]:
    if types is None:
        return {}
    if not isinstance(types, Mapping):
        raise TypeError(f"types should be a dict of field name -> TsFile type; got {types!r}")
    out = {}
    for name, kind in types.items():
        if name not in fields:
            raise ValueError(
                f"types names {name!r}, which is not a field column (fields: {fields}); the "
                f"time column and tags have fixed types"
            )
        kind = getattr(kind, "name", kind)
        if not isinstance(kind, str) or kind.upper() not in FIELD_TYPES:
            raise ValueError(
                f"types[{name!r}] must be one of {', '.join(FIELD_TYPES)}; got {kind!r}"
            )
        out[name] = kind.upper()
    return out


# -- columns -----------------------------------------------------------------------------------


def _arrow(what: str, series: pd.Series) -> pa.Array:
    """Return ``series`` as an Arrow array (nulls for None, NaN, NA), or a ValueError."""
    try:
        array = pa.array(series, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        raise ValueError(
            f"{what} (dtype {series.dtype}) holds values TsFile has no type for ({err}); "
            f"convert it to numbers, booleans or strings first"
        ) from err
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):  # pandas categoricals
        array = array.dictionary_decode()
    return array


def _first_bad_row(series: pd.Series, ok) -> str:
    for label, value in series.items():
        if not ok(value):
            return f"{value!r} ({type(value).__name__}) at index {label!r}"
    return "?"


def _time_column(name: str, series: pd.Series, time_unit: str) -> np.ndarray:
    """Return the timestamps as int64 in ``time_unit``."""
    what = f"time column {name!r}"
    nulls = int(series.isna().sum())
    if nulls:
        first = series.index[series.isna().to_numpy()][0]
        first = first.item() if isinstance(first, np.generic) else first  # pandas 2: np.int64
        raise ValueError(
            f"{what} has {nulls} null values (the first at index {first!r}); every TsFile row "
            f"needs a timestamp: drop those rows or fill them"
        )
    array = _arrow(what, series)
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        try:
            parsed = pd.to_datetime(series, format="ISO8601", utc=True)
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{what} holds strings that are not ISO-8601 dates ({err}); write them like "
                f"'2024-01-31T12:00:00Z', or convert the column with pd.to_datetime"
            ) from err
        array = _arrow(what, parsed)
    if pa.types.is_timestamp(array.type):
        return _datetimes_in_unit(what, array, time_unit).to_numpy()
    if pa.types.is_integer(array.type):
        return _cast(what, array, pa.int64(), "INT64").to_numpy()
    raise ValueError(
        f"{what} has dtype {series.dtype}; TsFile timestamps are integers, datetimes or "
        f"ISO-8601 strings (integral floats: df[{name!r}].astype('int64'))"
    )


def _datetimes_in_unit(what: str, array: pa.Array, time_unit: str) -> pa.Array:
    """Return datetimes as int64 counts of ``time_unit`` since 1970 UTC (naive = UTC)."""
    try:
        return array.cast(pa.timestamp(time_unit, tz=array.type.tz)).cast(pa.int64())
    except pa.ArrowInvalid as err:
        raise ValueError(
            f"{what} holds datetimes finer than time_unit={time_unit!r} ({err}); pass a finer "
            f"time_unit ('us' or 'ns') or round them first (e.g. .dt.floor('{time_unit}'))"
        ) from err


def _cast(what: str, array: pa.Array, target: pa.DataType, kind: str) -> pa.Array:
    try:
        return array.cast(target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise ValueError(f"{what} cannot be written as {kind}: {err}") from err


def _tag_column(name: str, series: pd.Series) -> pa.Array:
    """Return a tag column as Arrow strings (integers become their decimal strings)."""
    what = f"tag column {name!r}"
    array = _arrow(what, series)
    if pa.types.is_integer(array.type) or pa.types.is_null(array.type):
        return array.cast(pa.string())
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array.cast(pa.string())
    raise ValueError(
        f"{what} has dtype {series.dtype}; TsFile tags are strings: convert it first, e.g. "
        f"df[{name!r}] = df[{name!r}].astype(str)"
    )


def _infer_type(what: str, series: pd.Series, array: pa.Array) -> str:
    kind = array.type
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    if series.dtype == object and not (text or pa.types.is_null(kind)):
        bad = _first_bad_row(series, lambda v: v is None or isinstance(v, str) or v != v)
        raise ValueError(
            f"{what} has dtype object but holds {bad}; an object column must hold strings: "
            f"convert it (pd.to_numeric(df[col]), .astype(str)) or give its type with types="
        )
    if pa.types.is_null(kind):
        raise ValueError(
            f"{what} holds no values, so its type cannot be inferred; give it with types="
            f"{{...: 'DOUBLE'}} or drop the column"
        )
    if pa.types.is_boolean(kind):
        return "BOOLEAN"
    if pa.types.is_integer(kind):  # what fits in 32 signed bits is INT32
        narrow = kind.bit_width < 32 or (kind.bit_width == 32 and pa.types.is_signed_integer(kind))
        return "INT32" if narrow else "INT64"
    if pa.types.is_floating(kind):
        return "DOUBLE" if kind.bit_width == 64 else "FLOAT"
    if pa.types.is_timestamp(kind):
        return "TIMESTAMP"
    if text:
        return "STRING"
    raise ValueError(
        f"{what} has dtype {series.dtype} (Arrow {kind}), which TsFile cannot hold; fields are "
        f"{', '.join(FIELD_TYPES)}: convert it first"
    )


def _field_column(
    name: str, series: pd.Series, kind: str | None, time_unit: str
) -> tuple[str, pa.Array]:
    """Return (TsFile type name, Arrow array tsfile's writer takes) for one field."""
    what = f"column {name!r}"
    array = _arrow(what, series)
    kind = kind or _infer_type(what, series, array)
    if kind == "TIMESTAMP":
        if pa.types.is_timestamp(array.type):
            array = _datetimes_in_unit(what, array, time_unit)
        # tsfile's writer takes TIMESTAMP values as Arrow timestamp[ns] and stores the raw int64
        return kind, _cast(what, array, pa.int64(), kind).cast(pa.timestamp("ns"))
    return kind, _cast(what, array, FIELD_TYPES[kind], kind)


def _device_order(
    table: str, tags: dict[str, pa.Array], times: np.ndarray, index: pd.Index
) -> tuple[np.ndarray, list[str]]:
    """Return the row order (by device, then time) and the device names; refuse duplicates."""
    columns = {f"tag{i}": array.to_pandas() for i, array in enumerate(tags.values())}
    keys = pd.DataFrame({**columns, "time": times})
    repeated = keys.duplicated(keep=False).to_numpy()
    if repeated.any():
        groups = keys[repeated].groupby(list(keys.columns), dropna=False, sort=True).indices
        key, positions = next(iter(groups.items()))
        rows = index[np.flatnonzero(repeated)[positions]]
        raise ValueError(
            f"{int(repeated.sum())} rows share a (device, timestamp) with another row, e.g. rows "
            f"at index {list(rows[:5])} of device {_device(table, key[:-1])!r} at timestamp "
            f"{int(key[-1])}; TsFile holds one row per device and timestamp: drop or aggregate "
            f"them (df.drop_duplicates(...), df.groupby(...).mean())"
        )
    order = keys.sort_values(list(keys.columns), kind="stable", na_position="first").index
    if not tags:
        return order.to_numpy(), [table]
    devices: dict[str, tuple] = {}
    for row in keys.loc[order, list(columns)].drop_duplicates().itertuples(index=False):
        shown, values = _device(table, row), _tags(row)
        if devices.setdefault(shown, values) != values:
            raise ValueError(
                f"devices {devices[shown]} and {values} would both be named "
                f"{shown!r} (tsfile-torch names a device table.tag1.tag2, a missing tag "
                f"'null'); change the tag values (e.g. replace '.' with '_')"
            )
    return order.to_numpy(), list(devices)


def _tags(values) -> tuple:
    return tuple(None if v is None or v != v else v for v in values)


def _device(table: str, values) -> str:
    return device_name((table, *_tags(values)))


def _write(path: str, schema: TableSchema, data: pa.Table, overwrite: bool) -> None:
    """Write ``data`` aside, then rename it to ``path``: a failure leaves no partial file."""
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"{path}: file exists; pass overwrite=True (--overwrite) to replace")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    partial = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.part")
    with contextlib.suppress(FileNotFoundError):
        os.remove(partial)
    try:
        writer = TsFileTableWriter(partial, schema)
        try:
            writer.write_arrow_batch(data)
        finally:
            writer.close()
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
