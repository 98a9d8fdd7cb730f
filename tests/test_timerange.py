"""Reads by time range: long series with many pages and chunks, time ranges, many files, caps."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from tsfile_torch import (
    SchemaError,
    TsFileDataset,
    TsFileIterableDataset,
    make_loader,
    synthetic,
)

LONG = synthetic.DatasetSpec(num_files=1, devices_per_file=1, fields_per_device=3, num_rows=60000)
START, STEP = 5, 10  # timestamps 5, 15, 25, ...: time ranges can begin and end between samples


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    """One device x 3 DOUBLE x 60,000 rows in chunks of 7,000 rows (6 pages each), step 10."""
    directory = tmp_path_factory.mktemp("long")
    synthetic.write_table_files(directory, LONG, start_time=START, interval=STEP, flush_every=7000)
    return directory


def _exact_with_times(kind, source, **kwargs):
    """A ``kind`` dataset of ``source`` that gives float64 values and their timestamps."""
    return kind(source, dtype=torch.float64, return_timestamps=True, **kwargs)


def _expected(rows) -> np.ndarray:
    return np.stack([synthetic.value_of(0, c, rows) for c in range(3)], axis=1)


def test_batches_of_a_long_chunked_series_are_exact_wherever_they_start(
    long_dir, read_backend, tmp_path
):
    ds = _exact_with_times(
        TsFileDataset,
        long_dir,
        batch_size=3000,  # batches start inside index strides, pages and chunks
        block_rows=8192,  # and cross block boundaries
        read_backend=read_backend,
        index_cache=str(tmp_path / "index"),
    )
    for i in range(len(ds)):
        values, times = ds[i]
        rows = np.arange(i * 3000, min((i + 1) * 3000, LONG.num_rows))
        np.testing.assert_array_equal(values.numpy(), _expected(rows))
        np.testing.assert_array_equal(times.numpy(), START + rows * STEP)


def test_random_windows_over_a_long_series_read_exactly_the_rows_asked_for(long_dir, read_backend):
    ds = _exact_with_times(
        TsFileDataset,
        long_dir,
        batch_size=1000,
        block_rows=8192,
        random_batches=20,
        read_backend=read_backend,
        index_cache=False,
    )
    before = ds.reader.decoded_rows
    for i in range(len(ds)):
        values, times = ds[i]
        rows = (times.numpy() - START) // STEP
        assert len(rows) == 1000 and np.all(np.diff(rows) == 1)
        np.testing.assert_array_equal(values.numpy(), _expected(rows))
    # exact reads: each window decodes its own 1,000 rows, not a 8,192-row block
    assert ds.reader.decoded_rows - before == 20 * 1000


def test_two_workers_over_a_long_series_deliver_every_row_once(long_dir):
    ds = _exact_with_times(TsFileIterableDataset, long_dir, batch_size=2500, block_rows=8192)
    seen = {}
    for values, times in make_loader(ds, num_workers=2):
        rows = (times.numpy() - START) // STEP
        np.testing.assert_array_equal(values.numpy(), _expected(rows))
        for r in rows:
            seen[int(r)] = seen.get(int(r), 0) + 1
    assert sorted(seen) == list(range(LONG.num_rows)) and set(seen.values()) == {1}


@pytest.mark.parametrize(
    ("start_time", "end_time", "first_row", "stop_row"),
    [
        (12, 20003, 1, 2000),  # both ends between samples
        (15, 19995, 1, 2000),  # both ends on samples (inclusive)
        (None, 104, 0, 10),  # from the start
        (599_000, None, 59_900, 60_000),  # to the end of the series
        (-100, 10**12, 0, 60_000),  # wider than the data
    ],
)
def test_time_ranges_select_exactly_the_rows_inside_them(
    long_dir, read_backend, start_time, end_time, first_row, stop_row
):
    ds = _exact_with_times(
        TsFileDataset,
        long_dir,
        batch_size=700,
        start_time=start_time,
        end_time=end_time,
        read_backend=read_backend,
        block_rows=4096,
    )
    assert ds.num_rows == stop_row - first_row
    got = [ds[i] for i in range(len(ds))]
    values = np.concatenate([v.numpy() for v, _ in got])
    times = np.concatenate([t.numpy() for _, t in got])
    rows = np.arange(first_row, stop_row)
    np.testing.assert_array_equal(times, START + rows * STEP)
    np.testing.assert_array_equal(values, _expected(rows))


def test_a_time_range_spanning_two_day_files_reads_both_shards(tmp_path, read_backend):
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=2, num_rows=5000
    )
    synthetic.write_table_files(tmp_path, spec, prefix="day1-")
    synthetic.write_table_files(tmp_path, spec, prefix="day2-", row_offset=5000)
    ds = _exact_with_times(
        TsFileIterableDataset,
        tmp_path,
        batch_size=1000,
        start_time=3500,
        end_time=6499,
        read_backend=read_backend,
    )
    values = np.concatenate([v.numpy() for v, _ in ds])
    rows = np.arange(3500, 6500)
    np.testing.assert_array_equal(
        values, np.stack([synthetic.value_of(0, c, rows) for c in (0, 1)], 1)
    )


def test_an_empty_time_range_is_a_schema_error_naming_the_column(long_dir):
    with pytest.raises(SchemaError, match=r"t\.d0\.s0.*no rows in the time range"):
        TsFileDataset(long_dir, start_time=16, end_time=24)  # between samples 15 and 25
    with pytest.raises(SchemaError, match="no rows in the time range"):
        TsFileDataset(long_dir, start_time=10**12)


def test_start_after_end_is_a_value_error(long_dir):
    with pytest.raises(ValueError, match="start_time must not be after end_time"):
        TsFileDataset(long_dir, start_time=100, end_time=99)
    with pytest.raises(TypeError, match="start_time"):
        TsFileDataset(long_dir, start_time=1.5)


def test_timeline_indexes_are_cached_on_disk_and_bad_entries_rebuilt(long_dir, tmp_path):
    index_dir = tmp_path / "index"
    kwargs = dict(batch_size=5000, block_rows=8192, dtype=torch.float64, index_cache=str(index_dir))
    first = TsFileDataset(long_dir, **kwargs)
    expected = first[3].numpy()
    # the whole time column is read before the first read through the index, then saved
    entries = glob.glob(str(index_dir / "*" / "*.npy"))
    assert len(entries) == 1  # one timeline, one entry
    stamp = os.stat(entries[0]).st_mtime_ns
    second = TsFileDataset(long_dir, **kwargs)
    np.testing.assert_array_equal(second[3].numpy(), expected)
    assert os.stat(entries[0]).st_mtime_ns == stamp  # loaded, not rebuilt
    np.save(entries[0], np.arange(3, dtype=np.int64))  # wrong length: ignored and rebuilt
    third = TsFileDataset(long_dir, **kwargs)
    np.testing.assert_array_equal(third[3].numpy(), expected)
    third[len(third) - 1]
    assert len(np.load(entries[0])) == -(-LONG.num_rows // 1024)


def test_many_columns_shrink_blocks_to_fit_the_cache_and_stay_exact(tmp_path):
    spec = synthetic.DatasetSpec(
        num_files=2, devices_per_file=4, fields_per_device=8, num_rows=20000
    )
    synthetic.write_table_files(tmp_path, spec)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one batch fits: no warning
        ds = TsFileDataset(tmp_path, batch_size=2000, cache_bytes=4 << 20, dtype=torch.float64)
    assert ds.reader.block_rows < 131072 and ds.reader.block_rows % 1024 == 0
    per_file = spec.devices_per_file * spec.fields_per_device
    for i in range(len(ds)):
        rows = np.arange(i * 2000, (i + 1) * 2000)
        want = np.stack(
            [synthetic.value_of(f, c, rows) for f in range(2) for c in range(per_file)], axis=1
        )
        np.testing.assert_array_equal(ds[i].numpy(), want)
    assert ds.reader.cached_bytes <= 4 << 20


def test_a_batch_larger_than_the_cache_cap_warns_with_what_to_do(long_dir):
    with pytest.warns(UserWarning, match="smaller batch_size, fewer columns"):
        TsFileDataset(long_dir, batch_size=50000, cache_bytes=1 << 19)


def test_default_cache_is_capped_whatever_the_number_of_columns(small_dir):
    from tsfile_torch.read.reader import cache_cap, default_cache_bytes

    ds = TsFileDataset(small_dir)
    assert default_cache_bytes(ds.catalog, 4, 10**9) == cache_cap() <= 1 << 30


def test_a_batch_touches_only_the_files_holding_its_rows(tmp_path):
    spec = synthetic.DatasetSpec(num_files=1, devices_per_file=1, fields_per_device=2, num_rows=200)
    paths = []
    for f in range(50):
        paths += synthetic.write_table_files(
            tmp_path, spec, row_offset=f * 200, prefix=f"day{f:03d}-"
        )
    ds = TsFileDataset(tmp_path, batch_size=300, dtype=torch.float64, index_cache=False)
    assert len(ds.catalog.files) == 50
    for i in range(len(ds)):
        ds.close()  # no reader open: the batch opens exactly the files it reads
        rows = np.arange(i * 300, min((i + 1) * 300, 10000))
        want = np.stack([synthetic.value_of(0, c, rows) for c in (0, 1)], axis=1)
        np.testing.assert_array_equal(ds[i].numpy(), want)
        holding = [str(paths[f]) for f in range(rows[0] // 200, rows[-1] // 200 + 1)]
        assert sorted(ds.backends) == holding and len(holding) <= 2


_FD_SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np, torch
    from tsfile_torch import TsFileIterableDataset, synthetic
    directory, backend = sys.argv[1], sys.argv[2]
    resource.setrlimit(resource.RLIMIT_NOFILE, (96, 96))
    ds = TsFileIterableDataset(directory, batch_size=250, read_backend=backend,
                               max_open_files=16, dtype=torch.float64, return_timestamps=True)
    base = len(os.listdir("/proc/self/fd"))
    peak, total = 0, 0
    for epoch in range(2):
        for values, times in ds:
            rows = times.numpy()
            want = np.stack([synthetic.value_of(0, c, rows) for c in (0, 1)], axis=1)
            assert np.array_equal(values.numpy(), want)
            total += len(rows)
            peak = max(peak, len(os.listdir("/proc/self/fd")))
    assert total == 2 * 300 * 100, total
    assert ds.reader.num_open <= 16
    print("ok", peak - base)
    """
)


@pytest.mark.other_backends_slow
def test_300_files_under_a_low_fd_limit_with_max_open_files(tmp_path, read_backend):
    spec = synthetic.DatasetSpec(num_files=1, devices_per_file=1, fields_per_device=2, num_rows=100)
    data = tmp_path / "data"
    for f in range(300):
        synthetic.write_table_files(data, spec, row_offset=f * 100, prefix=f"day{f:03d}-")
    out = subprocess.run(
        [sys.executable, "-c", _FD_SCRIPT, str(data), read_backend],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    status, extra_fds = out.stdout.split()
    assert status == "ok" and int(extra_fds) <= 16 + 4


def test_irregular_sampling_widens_index_reads_until_rows_are_found(tmp_path, read_backend):
    """Sparse then dense timestamps: the mean step underestimates the sparse part."""
    import pyarrow as pa
    from tsfile import ColumnCategory, ColumnSchema, TableSchema, TSDataType, TsFileTableWriter

    rows = np.arange(40000)
    times = np.where(rows < 20000, rows * 1000, 20000 * 1000 + (rows - 20000))
    path = tmp_path / "irregular.tsfile"
    schema = TableSchema(
        "t",
        [
            ColumnSchema("device", TSDataType.STRING, ColumnCategory.TAG),
            ColumnSchema("s0", TSDataType.DOUBLE, ColumnCategory.FIELD),
        ],
    )
    writer = TsFileTableWriter(str(path), schema)
    try:
        data = {
            "time": pa.array(times, pa.int64()),
            "device": pa.array(["d0"] * len(rows)),
            "s0": pa.array(synthetic.value_of(0, 0, rows), pa.float64()),
        }
        writer.writer.write_arrow_batch("t", pa.table(data), 0)
    finally:
        writer.close()
    ds = _exact_with_times(
        TsFileDataset,
        path,
        batch_size=3000,
        block_rows=4096,
        read_backend=read_backend,
        index_cache=False,
    )
    for i in range(len(ds)):
        values, stamps = ds[i]
        want = rows[i * 3000 : (i + 1) * 3000]
        np.testing.assert_array_equal(stamps.numpy(), times[want])
        np.testing.assert_array_equal(values.numpy()[:, 0], synthetic.value_of(0, 0, want))


def test_readers_closed_by_the_lru_unmap_their_files(tmp_path):
    from tsfile_torch.native.backend import mapped_paths

    spec = synthetic.DatasetSpec(num_files=1, devices_per_file=1, fields_per_device=2, num_rows=500)
    paths = []
    for f in range(6):
        paths += synthetic.write_table_files(tmp_path, spec, row_offset=f * 500, prefix=f"d{f}-")
    ds = TsFileDataset(tmp_path, batch_size=500, read_backend="mmap", max_open_files=2)
    for i in range(len(ds)):
        ds[i]
        mapped = [p for p in paths if os.path.realpath(p) in mapped_paths()]
        assert len(mapped) <= 2 and ds.reader.num_open <= 2
    assert ds.reader.open_count == 6
    assert set(ds.backends.values()) == {"mmap"}


def test_random_windows_crossing_a_workers_range_after_sequential_epochs_are_exact(
    small_dir, small_expected, rows_of
):
    """A window that starts in a worker's rows and ends past them, its block already cached."""
    ds = TsFileIterableDataset(small_dir, batch_size=1000, dtype=torch.float64, order="stretches")
    loader = make_loader(ds, num_workers=2)
    # stretches: each worker reads its own contiguous stretch of rows (its reader clipped to it)
    assert sum(len(b) for b in loader) == 5000
    # worker 0's rows [0, edge): the batches it was given
    edge = (int(max(b[-1] for b in ds.items_for(0, worker=0, num_workers=2))) + 1) * 1000
    assert 0 < edge < 5000
    ds.set_random_batches(40)
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == 40
        for batch in batches:
            rows = rows_of(batch)
            np.testing.assert_array_equal(batch.numpy(), small_expected[rows])
    crossing = [  # worker 0's windows of epochs 1 and 2 that end in worker 1's rows
        int(b[0])
        for e in (1, 2)
        for b in ds.items_for(e, worker=0, num_workers=2)
        if b[0] < edge < b[0] + 1000
    ]
    assert crossing, "no window crossed the workers' boundary: pick another seed"
