"""Ray Data over TsFiles (tsfile_torch.ray): the datasets' rows and windows, value for value.

Every test writes real TsFiles and compares what Ray reads with what ``TsFileIterableDataset`` /
``TsFileWindowDataset`` give on the same sources, or with the values written: rows come in the
file's types (DOUBLE series as float64) unless ``dtype=`` asks for one float type. Tests on the
local cluster (one for the module, ``ray.init(num_cpus=2)``, block order preserved) are slow:
Ray's start-up alone is 5-15 s. The fast ones run the planned read tasks in this process, with
no cluster.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tsfile import ColumnCategory, ColumnSchema, TableSchema, TSDataType, TsFileTableWriter

from tsfile_torch import (
    SchemaError,
    TsFileFormatError,
    TsFileIterableDataset,
    TsFileWindowDataset,
    synthetic,
)

ROOT = Path(__file__).resolve().parent.parent
# Ray's DataContext warns about its own deprecated fields when it is copied into a job
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
SMALL = synthetic.DatasetSpec(num_files=3, devices_per_file=2, fields_per_device=3, num_rows=5000)


@pytest.fixture(scope="session")
def tray():
    """The tsfile_torch.ray module (imports Ray: a second or more, so only where used)."""
    pytest.importorskip("ray.data")
    import tsfile_torch.ray as tray

    return tray


@pytest.fixture(scope="module")
def cluster(tray, ray_cluster):
    """The module's local Ray cluster (``ray_cluster`` in conftest.py)."""
    return ray_cluster


def _columns(ds) -> dict[str, np.ndarray]:
    """Every column of a Ray dataset as one numpy array, rows in block order."""
    batches = list(ds.iter_batches(batch_size=None, batch_format="numpy"))
    assert batches
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def _rows_of(ds, columns: list[str], with_time: bool = False):
    """The rows of a Ray dataset as (values (n, columns), times or None), in block order."""
    found = _columns(ds)
    values = np.stack([found[c] for c in columns], axis=1)
    return values, found["time"] if with_time else None


def _dataset_rows(sources, **options):
    """Every row a TsFileIterableDataset gives, in one batch: (values, times)."""
    ds = TsFileIterableDataset(sources, batch_size=4096, return_timestamps=True, **options)
    batches = list(ds)
    values = np.concatenate([v.numpy() for v, _ in batches])
    return ds.columns, values, np.concatenate([t.numpy() for _, t in batches])


def _window_parts(ds: TsFileWindowDataset) -> dict[str, np.ndarray]:
    """Every window of a window dataset, by the column names read_tsfile_windows gives."""
    batch = ds.gather(np.arange(len(ds)))
    if batch.keys is not None:
        names = list(batch.keys)
    else:
        names = ["x", "y"][: 1 + bool(ds.horizon)]
        if ds.options.return_timestamps:
            names += ["x_times", "y_times"][: 1 + bool(ds.horizon)]
    return {name: part.numpy() for name, part in zip(names, batch.parts, strict=True)}


def _assert_windows_equal(ray_ds, expected: dict[str, np.ndarray]) -> None:
    found = _columns(ray_ds)
    assert list(found) == list(expected)
    for name, want in expected.items():
        got = found[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


# -- without a cluster -------------------------------------------------------------------------
def test_read_tasks_are_planned_from_metadata_and_read_the_datasets_rows(tray, tmp_path):
    # one device whose series continue across 3 files of 1,000 / 1,000 / 1,000 rows
    synthetic.write_panel(tmp_path, num_devices=1, num_fields=2, num_rows=3000, num_files=3)
    columns, values, times = _dataset_rows(tmp_path, dtype="float64")  # DOUBLE series
    for wanted, cuts in [
        (1, [0, 3000]),
        (2, [0, 2000, 3000]),
        (5, [0, 600, 1000, 1200, 1800, 2000, 2400, 3000]),
    ]:
        source = tray.TsFileDatasource(tmp_path, return_timestamps=True, override_num_blocks=wanted)
        plan = source.plan()
        assert [a for a, _ in plan] + [plan[-1][1]] == cuts  # file shards: 0, 1000, 2000
        tasks = source.get_read_tasks(200)
        meta = [t.metadata for t in tasks]
        assert [m.num_rows for m in meta] == [b - a for a, b in plan]
        assert [m.size_bytes for m in meta] == [(b - a) * (2 * 8 + 8) for a, b in plan]
        last = [str(tmp_path / "panel002.tsfile")]
        if plan[-1][0] < 2000:  # the last task reads the other files too
            last = [str(tmp_path / f"panel00{i}.tsfile") for i in range(3)]
        assert list(meta[-1].input_files) == last
        tables = [block for task in tasks for block in task()]  # each task run in this process
        assert tables[0].column_names == ["time", *columns]
        assert [str(t) for t in tables[0].schema.types] == ["int64", "double", "double"]
        got = np.concatenate([np.stack([t[c].to_numpy() for c in columns], 1) for t in tables])
        np.testing.assert_array_equal(got, values)
        np.testing.assert_array_equal(np.concatenate([t["time"].to_numpy() for t in tables]), times)
    batch = {c: tables[0][c].to_numpy() for c in columns}  # what iter_torch_batches collates
    stacked = tray.stack_columns(columns)(batch).numpy()  # float32: the datasets' batch
    np.testing.assert_array_equal(stacked, values[:600].astype(np.float32))
    kept = tray.stack_columns(columns, dtype=None)(batch).numpy()
    np.testing.assert_array_equal(kept, values[:600])
    half = tray.TsFileDatasource(tmp_path, dtype="float16")
    [table] = [block for task in half.get_read_tasks(200) for block in task()]
    assert str(half.schema().field(columns[0]).type) == "halffloat" == str(table[columns[0]].type)
    np.testing.assert_array_equal(table[columns[1]].to_numpy(), values[:, 1].astype(np.float16))
    default = tray.TsFileDatasource(tmp_path)  # 3000 x 2 float64: far below TASK_BYTES
    assert default.plan(200) == [(0, 3000)] and default.estimate_inmemory_data_size() == 48000


def test_what_cannot_reach_ray_workers_or_arrow_is_refused_naming_the_fix(tray, small_dir):
    with pytest.raises(TypeError, match="file object cannot travel there.*pass paths"):
        tray.TsFileDatasource(io.BytesIO((small_dir / "part000.tsfile").read_bytes()))
    with pytest.raises(ValueError, match=r"no order, seed: Ray orders and shards"):
        tray.TsFileWindowDatasource(small_dir, 10, order="shuffle", seed=1)
    with pytest.raises(ValueError, match=r"no bfloat16.*iter_torch_batches\(dtypes="):
        tray.TsFileDatasource(small_dir, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"does not normalize.*stats\(\)"):
        tray.TsFileDatasource(small_dir, normalize="minmax")
    with pytest.raises(ValueError, match="override_num_blocks should be an integer >= 1"):
        tray.TsFileDatasource(small_dir, override_num_blocks=0)
    with pytest.raises(ValueError, match=r"dtype must be a torch dtype.*got 'float33'"):
        tray.stack_columns(["t.d0.s0"], dtype="float33")
    with pytest.raises(SchemaError, match="'nope' matches no series"):
        tray.TsFileDatasource(small_dir, columns=["nope"])


#: The types of _write_typed's fields: one of each numeric tsfile type but TIMESTAMP (tsfile
#: 2.5.0's Arrow writer takes no TIMESTAMP field).
TYPED_FIELDS = {
    "b": TSDataType.BOOLEAN,
    "i": TSDataType.INT32,
    "l": TSDataType.INT64,
    "f": TSDataType.FLOAT,
    "d": TSDataType.DOUBLE,
}


def _write_typed(path: Path, clocks: dict[str, np.ndarray], base: int) -> dict[str, tuple]:
    """Write one field of each type per device ``t.<name>`` sampled at ``clocks[name]``; row r
    of device k: b = r % 3 == 0, i = r * 7919 - 2**31 + 1, l = base + 10**6 * k + r,
    f = r / 3, d = r / 7 + 1e10 + k, field j null where (r + j + k) % 5 == 0. Return series
    name -> (timestamps, the Arrow array written)."""
    schema = TableSchema(
        "t",
        [ColumnSchema("id", TSDataType.STRING, ColumnCategory.TAG)]
        + [ColumnSchema(f, kind, ColumnCategory.FIELD) for f, kind in TYPED_FIELDS.items()],
    )
    written = {}
    writer = TsFileTableWriter(str(path), schema)
    try:
        for k, (name, times) in enumerate(clocks.items()):
            r = np.arange(len(times), dtype=np.int64)
            values = [
                r % 3 == 0,
                r * 7919 - 2**31 + 1,
                base + 10**6 * k + r,
                (r / 3).astype(np.float32),
                r / 7 + 1e10 + k,
            ]
            kinds = [pa.bool_(), pa.int32(), pa.int64(), pa.float32(), pa.float64()]
            data = {"time": pa.array(times, pa.int64()), "id": pa.array([name] * len(times))}
            for j, (field, v, kind) in enumerate(zip(TYPED_FIELDS, values, kinds, strict=True)):
                data[field] = pa.array(v, kind, mask=(r + j + k) % 5 == 0)
                written[f"t.{name}.{field}"] = (np.asarray(times), data[field])
            writer.writer.write_arrow_batch("t", pa.table(data), 0)
    finally:
        writer.close()
    return written


def _read_in_process(source) -> pa.Table:
    """Every row of a TsFileDatasource, its planned read tasks run in this process."""
    return pa.concat_tables([block for task in source.get_read_tasks(200) for block in task()])


def _aligned_samples(written: dict[str, tuple], names: list[str], fill: str):
    """Return the union of the series' timestamps and each series aligned on it, one row at a
    time: its sample there, else (``fill``) the last earlier one, 0, or null."""
    times = np.unique(np.concatenate([written[n][0] for n in names]))
    out = {}
    for name in names:
        own, values = written[name][0], written[name][1].to_pylist()
        kind = written[name][1].type
        zero = pa.array([0]).cast(kind)[0].as_py() if fill == "zero" else None
        column = []
        for t in times:
            earlier = np.flatnonzero(own <= t)
            if len(earlier) and (own[earlier[-1]] == t or fill == "ffill"):
                column.append(values[earlier[-1]])
            else:
                column.append(zero)
        out[name] = pa.array(column, kind)
    return times, out


def test_rows_come_in_the_files_types_with_nulls_and_in_one_float_type_with_dtype(tray, tmp_path):
    path = tmp_path / "typed.tsfile"
    written = _write_typed(path, {"d0": np.arange(3000) * 10}, base=2**40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no word of NaN nulls or rounded integers
        source = tray.TsFileDatasource(path, return_timestamps=True, override_num_blocks=3)
    names = list(written)
    assert source.schema() == pa.schema(
        [("time", pa.int64())] + [(n, written[n][1].type) for n in names]
    )
    assert [t.metadata.size_bytes for t in source.get_read_tasks(200)] == [1000 * 33] * 3
    table = _read_in_process(source)
    assert table.schema == source.schema()
    for name in names:  # exact values, nulls as nulls (2**40 + r and -2**31 + ... included)
        assert table[name].combine_chunks().equals(written[name][1]), name
    np.testing.assert_array_equal(table["time"].to_numpy(), written[names[0]][0])
    with (
        pytest.warns(UserWarning, match="null .* reach the batches as NaN"),
        pytest.warns(UserWarning, match=r"t\.d0\.i, t\.d0\.l .* float32 cannot represent"),
    ):
        floats = tray.TsFileDatasource(path, dtype="float32", override_num_blocks=3)
    assert floats.schema() == pa.schema([(n, pa.float32()) for n in names])
    table = _read_in_process(floats)
    for name in names:
        want = written[name][1].cast(pa.float64()).fill_null(np.nan).to_numpy()
        np.testing.assert_array_equal(table[name].to_numpy(), want.astype(np.float32), name)
        assert table[name].null_count == 0  # NaN, as in the datasets' batches
    with pytest.warns(UserWarning, match="null"):
        as_torch = tray.TsFileDatasource(path, dtype=pytest.importorskip("torch").float64)
    assert as_torch.schema() == pa.schema([(n, pa.float64()) for n in names])


@pytest.mark.parametrize("base", [2**40, 2**60])
def test_int64_rows_are_exact_positional_and_aligned_on_time(tray, tmp_path, base):
    path = tmp_path / "typed.tsfile"
    # two devices on their own clocks: aligned rows hold fills at the other device's times
    written = _write_typed(path, {"d0": np.arange(700) * 2, "d1": np.arange(500) * 3}, base)
    d0 = [n for n in written if n.startswith("t.d0.")]
    table = _read_in_process(tray.TsFileDatasource(path, columns=d0, override_num_blocks=3))
    for name in d0:
        assert table[name].combine_chunks().equals(written[name][1]), name
    names = ["t.d0.l", "t.d1.l", "t.d0.b", "t.d1.i"]
    for fill in ["ffill", "zero", "nan"]:
        times, expected = _aligned_samples(written, names, fill)
        source = tray.TsFileDatasource(
            path,
            columns=names,
            align="union",
            fill=fill,
            return_timestamps=True,
            override_num_blocks=4,
        )
        table = _read_in_process(source)
        np.testing.assert_array_equal(table["time"].to_numpy(), times)
        for name in names:
            assert table[name].combine_chunks().equals(expected[name]), (fill, name)


@pytest.mark.filterwarnings("ignore:integer columns")
def test_windows_keep_their_float_values_over_typed_series(tray, tmp_path):
    path = tmp_path / "typed.tsfile"
    _write_typed(path, {"d0": np.arange(400)}, base=2**40)
    options = {"columns": list(TYPED_FIELDS), "targets": ["d"], "fill": "zero", "max_missing": 1.0}
    expected = _window_parts(TsFileWindowDataset(path, 20, 5, 3, **options))
    source = tray.TsFileWindowDatasource(path, 20, 5, 3, override_num_blocks=3, **options)
    table = pa.concat_tables([block for task in source.get_read_tasks(200) for block in task()])
    for name, want in expected.items():
        got = table[name].combine_chunks().to_numpy()
        assert got.dtype == want.dtype == np.float32 and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


# -- on the local cluster ----------------------------------------------------------------------
@pytest.mark.slow
def test_table_model_rows_are_the_datasets_rows(
    cluster, tray, small_dir, small_expected, read_backend
):
    columns, values, times = _dataset_rows(small_dir, dtype="float64")
    ds = tray.read_tsfile(
        small_dir, return_timestamps=True, override_num_blocks=4, read_backend=read_backend
    )
    assert ds.columns() == ["time", *columns]
    assert ds.count() == SMALL.num_rows  # from the tasks' metadata
    got, got_times = _rows_of(ds, columns, with_time=True)
    assert got.dtype == np.float64  # DOUBLE series, as written
    np.testing.assert_array_equal(got, values)
    np.testing.assert_array_equal(got, small_expected)
    np.testing.assert_array_equal(got_times, times)
    picked = tray.read_tsfile(small_dir, columns=["t.d1.*"], dtype="float32")
    assert picked.columns() == ["t.d1.s0", "t.d1.s1", "t.d1.s2"]
    got, _ = _rows_of(picked, picked.columns())
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, small_expected[:, 3:6].astype(np.float32))


@pytest.mark.slow
def test_tree_model_rows_are_the_datasets_rows_numeric_series_only(cluster, tray, tmp_path):
    path = tmp_path / "tree.tsfile"
    synthetic.write_tree_file(path, devices=2, num_rows=3000)
    columns, values, times = _dataset_rows(path, dtype="float64")
    assert columns == ["root.sg.d0.m0", "root.sg.d0.m1", "root.sg.d0.m2"] + [
        "root.sg.d1.m0",
        "root.sg.d1.m1",
        "root.sg.d1.m2",
    ]  # the TEXT series left out, as the datasets do
    ds = tray.read_tsfile(path, override_num_blocks=3)
    assert ds.columns() == columns
    assert [str(t) for t in ds.schema().types] == ["double", "int64", "bool"] * 2  # as written
    got, _ = _rows_of(ds, columns)
    np.testing.assert_array_equal(got, values)
    np.testing.assert_array_equal(got[:, 1], np.arange(3000))  # m1 is the row number


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:integer columns", "ignore:.*null")
def test_typed_rows_in_the_ray_job_are_the_values_written_and_stack_as_the_datasets_batch(
    cluster, tray, tmp_path
):
    import torch

    path = tmp_path / "typed.tsfile"
    written = _write_typed(path, {"d0": np.arange(3000) * 10}, base=2**40)
    names = list(written)
    ds = tray.read_tsfile(path, override_num_blocks=3)  # one shard cut: sums across tasks
    table = pa.concat_tables(cluster.get(ds.to_arrow_refs()))
    assert table.schema == pa.schema([(n, written[n][1].type) for n in names])
    for name in names:
        assert table[name].combine_chunks().equals(written[name][1]), name
    _, values, _ = _dataset_rows(path)  # float32, nulls NaN: what the datasets give
    stacked = ds.iter_torch_batches(batch_size=1000, collate_fn=tray.stack_columns(names))
    np.testing.assert_array_equal(torch.cat(list(stacked)).numpy(), values)
    floats = tray.read_tsfile(path, dtype="float32", override_num_blocks=3)
    batches = list(floats.iter_torch_batches(batch_size=1000, dtypes=torch.float64))
    for k, name in enumerate(names):
        got = torch.cat([b[name] for b in batches])
        assert got.dtype == torch.float64, name
        np.testing.assert_array_equal(got.numpy(), values[:, k].astype(np.float64), name)


def _panel_with_nulls(directory: Path) -> list[str]:
    """Two files of meters m0 / m1 on their own clocks, with nulls; m1 continues in file 2."""
    rows = np.arange(400)
    paths = []
    for f in range(2):
        devices = {}
        for d in range(2):
            part = rows[f * 200 : (f + 1) * 200]
            values = np.stack([synthetic.value_of(d, j, part) for j in range(2)], axis=1)
            values[part % 7 == d, d] = np.nan  # nulls, in another field per device
            devices[f"m{d}"] = (synthetic.panel_device_times(d + 1, part), values)
        paths.append(
            synthetic.write_table_devices(directory / f"p{f}.tsfile", "p", ["a", "b"], devices)
        )
    return paths


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*null")
@pytest.mark.parametrize("align", ["union", "intersect"])
def test_a_panel_on_own_timestamps_with_nulls_is_aligned_as_the_datasets_align_it(
    cluster, tray, tmp_path, align
):
    _panel_with_nulls(tmp_path)
    columns, values, times = _dataset_rows(tmp_path, align=align, fill="nan", dtype="float64")
    assert np.isnan(values).any()
    ds = tray.read_tsfile(tmp_path, align=align, return_timestamps=True, override_num_blocks=3)
    assert ds.columns() == ["time", *columns]
    got, got_times = _rows_of(ds, columns, with_time=True)
    np.testing.assert_array_equal(got, values)  # nulls (NaN in numpy) where the datasets' NaN
    np.testing.assert_array_equal(got_times, times)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*null")
def test_panel_windows_with_nulls_are_the_window_datasets_windows(cluster, tray, tmp_path):
    _panel_with_nulls(tmp_path)
    for options in [
        {},
        {"return_dict": True, "time_features": ["hour_of_day"]},
        {"normalize": "minmax", "fill": "zero"},
    ]:
        expected = _window_parts(TsFileWindowDataset(tmp_path, 20, 5, 3, **options))
        ds = tray.read_tsfile_windows(tmp_path, 20, 5, 3, block_rows=64, **options)
        _assert_windows_equal(ds, expected)
        if "past_observed_mask" in expected:  # the nulls, masked as the dataset masks them
            missing = expected["past_observed_mask"] == 0
            assert missing.any() and np.array_equal(missing, np.isnan(expected["past_values"]))


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [2, 7])
def test_a_series_across_files_and_time_ranges_read_as_the_datasets_read_them(
    cluster, tray, tmp_path, blocks
):
    synthetic.write_panel(tmp_path, num_devices=1, num_fields=3, num_rows=30000, num_files=3)
    for bounds in [{}, {"start_time": 4000, "end_time": 25000}, {"start_time": 12345}]:
        columns, values, times = _dataset_rows(tmp_path, dtype="float64", **bounds)
        ds = tray.read_tsfile(
            tmp_path, return_timestamps=True, override_num_blocks=blocks, **bounds
        )
        assert ds.count() == len(values)
        got, got_times = _rows_of(ds, columns, with_time=True)
        np.testing.assert_array_equal(got, values)
        np.testing.assert_array_equal(got_times, times)


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 5, 60])
def test_windows_at_task_boundaries_are_each_read_once(cluster, tray, tmp_path, blocks):
    # 4 devices of different lengths, each across 2 files; window blocks of 40 rows
    synthetic.write_panel(
        tmp_path, num_devices=4, num_fields=3, num_rows=[500, 700, 300, 900], num_files=2
    )
    for options in [{"return_timestamps": True}, {"horizon": 0}, {"max_missing": 0.0}]:
        horizon = options.pop("horizon", 12)
        args = (tmp_path, 30, horizon, 7)
        ds = TsFileWindowDataset(*args, columns=["f0", "f1"], targets=["f2"], **options)
        source = tray.TsFileWindowDatasource(
            *args,
            columns=["f0", "f1"],
            targets=["f2"],
            block_rows=40,
            override_num_blocks=blocks,
            **options,
        )
        plan = source.plan()
        assert plan[0][0] == 0 and plan[-1][1] == len(ds)
        assert all(a[1] == b[0] for a, b in zip(plan, plan[1:], strict=False))  # no window twice
        assert len(plan) >= min(blocks, 2)
        ray_ds = cluster.data.read_datasource(source, override_num_blocks=blocks)
        assert ray_ds.count() == len(ds)
        _assert_windows_equal(ray_ds, _window_parts(ds))


def _damage(path: Path, series: int, offset: int) -> Path:
    """Flip one byte ``offset`` bytes into the value chunk of series s<series> of ``path``."""
    data = bytearray(path.read_bytes())
    data[data.index(b"\x41\x04s" + str(series).encode()) + offset] ^= 0xFF
    bad = path.with_name("damaged.tsfile")
    bad.write_bytes(bytes(data))
    return bad


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """1 device x 4 DOUBLE x 30,000 rows (test_damage's shape)."""
    directory = tmp_path_factory.mktemp("pristine")
    [path] = synthetic.write_table_files(directory, synthetic.DatasetSpec(1, 1, 4, 30000))
    return Path(path)


@pytest.mark.slow
def test_a_damaged_file_is_an_error_naming_it_at_build_or_in_the_ray_job(
    cluster, tray, pristine, tmp_path
):
    # metadata damage: the validation child on the driver finds it when the dataset is built
    data = bytearray(pristine.read_bytes())
    data[len(data) - 8] ^= 0xFF
    (tmp_path / "built.tsfile").write_bytes(bytes(data))
    with pytest.raises(TsFileFormatError, match=r"built\.tsfile: .*crashed"):
        tray.read_tsfile(tmp_path / "built.tsfile")
    # a damaged data page, not validated: a read task raises the datasets' error, naming it
    copy = tmp_path / "pristine.tsfile"
    copy.write_bytes(pristine.read_bytes())
    bad = _damage(copy, 1, 10000)
    ds = tray.read_tsfile(bad, validate=False, override_num_blocks=2)
    with pytest.raises(TsFileFormatError, match=r"damaged\.tsfile: reading device t\.d0"):
        ds.materialize()
    windows = tray.read_tsfile_windows(bad, 50, 10, validate=False)
    with pytest.raises(TsFileFormatError, match=r"damaged\.tsfile: reading device t\.d0"):
        windows.materialize()


@pytest.mark.slow
@pytest.mark.parametrize("blocks", [1, 3])
def test_a_wrong_sum_is_found_whether_one_task_or_several_read_the_shard(
    cluster, tray, pristine, tmp_path, blocks
):
    # low mantissa bits of s1 flipped: every value in [min, max], only the sum sees it
    copy = tmp_path / "pristine.tsfile"
    copy.write_bytes(pristine.read_bytes())
    bad = _damage(copy, 1, 500)
    ds = tray.read_tsfile(bad, dtype="float64", override_num_blocks=blocks)
    with pytest.raises(
        TsFileFormatError,
        match=r"damaged\.tsfile: series t\.d0\.s1, rows "
        r"\[0, 30000\): sum of all values .* metadata says",
    ):
        ds.materialize()
    intact = tray.read_tsfile(copy, dtype="float64", override_num_blocks=blocks)
    assert intact.materialize().count() == 30000  # no false alarm over the same cuts


@pytest.mark.slow
def test_s3_sources_read_as_local_ones(
    cluster, tray, s3_server, small_dir, small_expected, tmp_path
):
    s3_server.upload("ray-bucket", small_dir, prefix="data/")
    ds = tray.read_tsfile(
        "s3://ray-bucket/data/",
        storage_options=s3_server.storage_options,
        cache_dir=tmp_path / "cache",
        override_num_blocks=3,
    )
    columns = [c for c in ds.columns() if c != "time"]
    got, _ = _rows_of(ds, columns)
    np.testing.assert_array_equal(got, small_expected)
    assert len(list((tmp_path / "cache").glob("*.tsfile"))) == 3  # the tasks fetched each file


@pytest.mark.slow
def test_the_ray_train_example_runs_and_learns(tmp_path):
    pytest.importorskip("ray.train")
    spec = synthetic.DatasetSpec(
        num_files=2, devices_per_file=1, fields_per_device=4, num_rows=20000
    )
    synthetic.write_table_files(tmp_path / "data", spec)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    command = [
        sys.executable,
        str(ROOT / "examples" / "ray_train.py"),
        "--data",
        str(tmp_path / "data"),
        "--epochs",
        "3",
        "--batch-size",
        "1000",
        "--storage",
        str(tmp_path / "runs"),
    ]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "20000 rows x 8 columns" in proc.stdout
    losses = [float(x) for x in proc.stdout.split("losses [")[1].split("]")[0].split(",")]
    assert len(losses) == 3 and losses[2] < 0.8 * losses[0]
    assert list((tmp_path / "runs").rglob("model.pt"))
