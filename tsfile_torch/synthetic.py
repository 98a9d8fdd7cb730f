"""Write TsFiles with known values, with tsfile's own writers (tests, benchmarks, examples).

Every value is :func:`value_of` ``(file, column, row)``: an integer part that names the file and
the column, plus a pseudo-random 53-bit fraction from a hash of (file, column, row), so values are
unique and barely compressible, like noisy sensor data (GORILLA + LZ4 keep most of each value's
8 bytes).
Tests compare with ``value_of(...)`` converted to the output dtype, which is exact.
Timestamps are ``start_time + row * interval``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from tsfile import (
    ColumnCategory,
    ColumnSchema,
    Compressor,
    DeviceSchema,
    TableSchema,
    TimeseriesSchema,
    TSDataType,
    TSEncoding,
    TsFileTableWriter,
    TsFileWriter,
)

__all__ = [
    "REFERENCE",
    "DatasetSpec",
    "value_of",
    "panel_device_times",
    "write_panel",
    "write_reference",
    "write_table_devices",
    "write_table_files",
    "write_tree_file",
    "write_tree_series",
]


@dataclass(frozen=True)
class DatasetSpec:
    """Shape of a synthetic table-model dataset."""

    num_files: int = 8
    devices_per_file: int = 1
    fields_per_device: int = 8
    num_rows: int = 131072
    table: str = "t"


#: The reference workload: 8 files x 1 device x 8 DOUBLE fields x 131,072 rows (64 columns).
REFERENCE = DatasetSpec()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fast, well-spread hash of uint64 values."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def value_of(file: int, column: int, rows) -> np.ndarray:
    """Return the float64 values of ``column`` (index inside its file) of ``file`` at ``rows``.

    ``file * 64 + column`` is the integer part; the fraction is ``k / 2**53`` with ``k`` the top
    53 bits of a hash of (file, column, row).
    """
    rows = np.asarray(rows, dtype=np.uint64)
    with np.errstate(over="ignore"):
        key = rows * np.uint64(1 << 20) + np.uint64(file * 4096 + column)
        frac = (_mix(key) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return float(file * 64 + column) + frac


def _table_schema(spec: DatasetSpec, extra: dict[str, TSDataType]) -> TableSchema:
    cols = [ColumnSchema("device", TSDataType.STRING, ColumnCategory.TAG)]
    cols += [
        ColumnSchema(f"s{j}", TSDataType.DOUBLE, ColumnCategory.FIELD)
        for j in range(spec.fields_per_device)
    ]
    cols += [ColumnSchema(name, kind, ColumnCategory.FIELD) for name, kind in extra.items()]
    return TableSchema(spec.table, cols)


def write_table_files(
    directory: str | os.PathLike,
    spec: DatasetSpec = REFERENCE,
    *,
    start_time: int = 0,
    interval: int = 1,
    row_offset: int = 0,
    prefix: str = "part",
    extra_fields: dict[str, TSDataType] | None = None,
    null_every: int = 0,
    flush_every: int = 0,
) -> list[str]:
    """Write a table-model dataset, one file per ``spec.num_files``; return the paths.

    File ``f`` holds devices ``d{f * devices_per_file + i}`` with DOUBLE fields ``s0..``; field
    ``j`` of device ``i`` is column ``i * fields_per_device + j`` of :func:`value_of`.

    Args:
        directory: where to write (created if needed); existing files are replaced.
        spec: the dataset's shape.
        start_time, interval: timestamps are ``start_time + (row_offset + row) * interval``.
        row_offset: first row's number, for a series that continues from earlier files.
        prefix: file names are ``{prefix}{f:03d}.tsfile``.
        extra_fields: more fields per device (e.g. ``{"label": TSDataType.STRING}``): STRING and
            TEXT hold ``"r{row}"``, numeric types hold ``row`` (BOOLEAN: ``row % 2``).
        null_every: if > 0, field ``s1`` is null at rows where ``row % null_every == 0``.
        flush_every: if > 0, write and flush every ``flush_every`` rows of a device: each series
            then has several chunks (like files IoTDB writes), not one.
    """
    os.makedirs(directory, exist_ok=True)
    extra = dict(extra_fields or {})
    rows = np.arange(row_offset, row_offset + spec.num_rows, dtype=np.int64)
    times = pa.array(start_time + rows * interval, pa.int64())
    paths = []
    for f in range(spec.num_files):
        path = os.path.join(os.fspath(directory), f"{prefix}{f:03d}.tsfile")
        if os.path.exists(path):
            os.remove(path)
        writer = TsFileTableWriter(path, _table_schema(spec, extra))
        try:
            for i in range(spec.devices_per_file):
                device = f * spec.devices_per_file + i
                data = {"time": times, "device": pa.array([f"d{device}"] * spec.num_rows)}
                for j in range(spec.fields_per_device):
                    values = value_of(f, i * spec.fields_per_device + j, rows)
                    mask = (rows % null_every == 0) if (null_every and j == 1) else None
                    data[f"s{j}"] = pa.array(values, pa.float64(), mask=mask)
                for name, kind in extra.items():
                    data[name] = _extra_column(kind, rows)
                table = pa.table(data)
                step = flush_every or spec.num_rows
                for s in range(0, spec.num_rows, step):
                    writer.writer.write_arrow_batch(spec.table, table.slice(s, step), 0)
                    if flush_every:
                        writer.flush()
        finally:
            writer.close()
        paths.append(path)
    return paths


def _extra_column(kind: TSDataType, rows: np.ndarray) -> pa.Array:
    if kind in (TSDataType.STRING, TSDataType.TEXT):
        return pa.array([f"r{r}" for r in rows], pa.string())
    if kind == TSDataType.BOOLEAN:
        return pa.array(rows % 2 == 1)
    if kind == TSDataType.INT32:
        return pa.array(rows.astype(np.int32))
    if kind == TSDataType.FLOAT:
        return pa.array(rows.astype(np.float32))
    if kind in (TSDataType.INT64, TSDataType.TIMESTAMP):
        return pa.array(rows, pa.int64())
    return pa.array(rows.astype(np.float64))


def write_tree_file(
    path: str | os.PathLike,
    devices: int = 2,
    num_rows: int = 1000,
    file_index: int = 0,
    group: str = "root.sg",
) -> list[str]:
    """Write a tree-model file (non-aligned series); return its column names in order.

    Device ``{group}.d{k}`` has DOUBLE ``m0``, INT64 ``m1``, BOOLEAN ``m2`` and TEXT ``note``;
    ``m0`` of device ``k`` is ``value_of(file_index, k * 3, row)``, ``m1`` is ``row``, ``m2`` is
    ``row % 2``. Timestamps are ``row``.
    """
    path = os.fspath(path)
    if os.path.exists(path):
        os.remove(path)
    kinds = [
        ("m0", TSDataType.DOUBLE, TSEncoding.GORILLA),
        ("m1", TSDataType.INT64, TSEncoding.TS_2DIFF),
        ("m2", TSDataType.BOOLEAN, TSEncoding.PLAIN),
        ("note", TSDataType.TEXT, TSEncoding.PLAIN),
    ]
    writer = TsFileWriter(path)
    names = []
    try:
        for k in range(devices):
            device = f"{group}.d{k}"
            writer.register_device(
                DeviceSchema(
                    device,
                    [
                        TimeseriesSchema(name, kind, enc, Compressor.LZ4)
                        for name, kind, enc in kinds
                    ],
                )
            )
        from tsfile import Tablet

        rows = np.arange(num_rows)
        for k in range(devices):
            device = f"{group}.d{k}"
            m0 = value_of(file_index, k * 3, rows)
            for s in range(0, num_rows, 4096):
                n = min(4096, num_rows - s)
                tablet = Tablet([name for name, _, _ in kinds], [kind for _, kind, _ in kinds], n)
                tablet.set_table_name(device)
                tablet.set_timestamp_list([int(t) for t in rows[s : s + n]])
                for i in range(n):
                    r = s + i
                    tablet.add_value_by_index(0, i, float(m0[r]))
                    tablet.add_value_by_index(1, i, int(r))
                    tablet.add_value_by_index(2, i, bool(r % 2))
                    tablet.add_value_by_index(3, i, f"r{r}")
                writer.write_tablet(tablet)
            names += [f"{device}.{name}" for name, kind, _ in kinds if kind != TSDataType.TEXT]
    finally:
        writer.close()
    return names


def write_reference(directory: str | os.PathLike, spec: DatasetSpec = REFERENCE) -> list[str]:
    """Write the reference dataset into ``directory`` unless it is already there; return paths."""
    directory = os.fspath(directory)
    expected = [os.path.join(directory, f"part{f:03d}.tsfile") for f in range(spec.num_files)]
    marker = os.path.join(directory, ".complete")
    if os.path.exists(marker) and all(os.path.exists(p) for p in expected):
        return expected
    paths = write_table_files(directory, spec)
    with open(marker, "w", encoding="utf-8") as fh:
        fh.write(f"{spec}\n")
    return paths


# -- panels: devices with their own timestamps (forecasting windows) ------------------------------


def write_table_devices(
    path: str | os.PathLike,
    table: str,
    fields: list[str],
    devices: dict[str, tuple[np.ndarray, np.ndarray]],
    tag: str = "id",
) -> str:
    """Write one table-model file: ``devices`` maps a tag value to ``(times, values)``.

    ``values`` is a float64 ``(rows, len(fields))`` array written as DOUBLE fields (NaN: null).
    Each device keeps its own timestamps. Returns the path.
    """
    path = os.fspath(path)
    if os.path.exists(path):
        os.remove(path)
    schema = TableSchema(
        table,
        [ColumnSchema(tag, TSDataType.STRING, ColumnCategory.TAG)]
        + [ColumnSchema(f, TSDataType.DOUBLE, ColumnCategory.FIELD) for f in fields],
    )
    writer = TsFileTableWriter(path, schema)
    try:
        for name, (times, values) in devices.items():
            values = np.asarray(values, dtype=np.float64).reshape(len(times), len(fields))
            data = {"time": pa.array(np.asarray(times, dtype=np.int64)), tag: [name] * len(times)}
            for j, f in enumerate(fields):
                data[f] = pa.array(values[:, j], pa.float64(), mask=np.isnan(values[:, j]))
            writer.writer.write_arrow_batch(table, pa.table(data), 0)
    finally:
        writer.close()
    return path


def write_tree_series(
    path: str | os.PathLike, series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]
) -> str:
    """Write one tree-model file of non-aligned DOUBLE series, each with its own timestamps.

    ``series`` maps a device path (``root.sg.d1``) to ``{measurement: (times, values)}``.
    Returns the path.
    """
    from tsfile import Tablet

    path = os.fspath(path)
    if os.path.exists(path):
        os.remove(path)
    writer = TsFileWriter(path)
    try:
        for device, measurements in series.items():
            writer.register_device(
                DeviceSchema(
                    device,
                    [
                        TimeseriesSchema(m, TSDataType.DOUBLE, TSEncoding.GORILLA, Compressor.LZ4)
                        for m in measurements
                    ],
                )
            )
        for device, measurements in series.items():
            for m, (times, values) in measurements.items():
                for s in range(0, len(times), 4096):
                    n = min(4096, len(times) - s)
                    tablet = Tablet([m], [TSDataType.DOUBLE], n)
                    tablet.set_table_name(device)
                    tablet.set_timestamp_list([int(t) for t in times[s : s + n]])
                    for i in range(n):
                        tablet.add_value_by_index(0, i, float(values[s + i]))
                    writer.write_tablet(tablet)
    finally:
        writer.close()
    return path


def panel_device_times(device: int, rows) -> np.ndarray:
    """Return the timestamps of ``rows`` of device ``device`` in :func:`write_panel` data.

    Device ``d`` starts at time ``d`` and samples every ``d % 3 + 1`` time units, so no two
    neighbouring devices share timestamps.
    """
    return device + np.asarray(rows, dtype=np.int64) * (device % 3 + 1)


def write_panel(
    directory: str | os.PathLike,
    num_devices: int = 4,
    num_fields: int = 2,
    num_rows: int | list[int] = 1000,
    num_files: int = 2,
    table: str = "meters",
) -> list[str]:
    """Write a table-model panel: devices ``{table}.s{d}`` with their own timestamps.

    Field ``f{j}`` of device ``d`` at device row ``r`` is ``value_of(d, j, r)``; timestamps are
    :func:`panel_device_times`. Each device's rows are split evenly over ``num_files`` files
    (``panel000.tsfile``...), so every series continues across files. ``num_rows`` is one count
    for all devices or one per device. Returns the paths.
    """
    counts = [num_rows] * num_devices if isinstance(num_rows, int) else list(num_rows)
    fields = [f"f{j}" for j in range(num_fields)]
    os.makedirs(directory, exist_ok=True)
    paths = []
    for f in range(num_files):
        devices = {}
        for d, n in enumerate(counts):
            rows = np.arange(n * f // num_files, n * (f + 1) // num_files)
            if len(rows):
                values = np.stack([value_of(d, j, rows) for j in range(num_fields)], axis=1)
                devices[f"s{d}"] = (panel_device_times(d, rows), values)
        path = os.path.join(os.fspath(directory), f"panel{f:03d}.tsfile")
        paths.append(write_table_devices(path, table, fields, devices))
    return paths
