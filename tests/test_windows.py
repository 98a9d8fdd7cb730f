"""TsFileWindowDataset on real TsFiles: exact windows per device, edges, errors, loaders, samplers.

Panel data (``synthetic.write_panel``): field ``f{j}`` of device ``meters.s{d}`` at device row
``r`` is ``value_of(d, j, r)``, timestamps ``panel_device_times(d, r)``: devices have different
timestamps and every series continues across files.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from tsfile_torch import (
    EpochSampler,
    Normalizer,
    SchemaError,
    TsFileWindowDataset,
    collate_windows,
    make_loader,
    synthetic,
)

COUNTS = [300, 170, 40, 121]  # rows per device: device 2 is shorter than most windows


@pytest.fixture(scope="module")
def panel_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("panel")
    synthetic.write_panel(directory, num_devices=4, num_fields=3, num_rows=COUNTS, num_files=3)
    return directory


def _device_rows(device: int, rows: np.ndarray, fields: list[int]) -> np.ndarray:
    return np.stack([synthetic.value_of(device, j, rows) for j in fields], axis=1)


def _first_row_in_range(device: int, start_time: int | None) -> int:
    """Device row of the first timestamp >= ``start_time`` (0 without a time range)."""
    if start_time is None:
        return 0
    times = synthetic.panel_device_times(device, np.arange(COUNTS[device]))
    return int(np.searchsorted(times, start_time))


def _check_window(ds, i, item, x_fields, y_fields, start_time=None):
    info = ds.window_info(i)
    d = int(info.device.rsplit(".s", 1)[1])
    c, h = ds.context_length, ds.horizon
    first = _first_row_in_range(d, start_time) + info.start_row  # start_row counts in range
    rows = np.arange(first, first + c + h)
    x, y, tx, ty = item
    np.testing.assert_array_equal(x.numpy(), _device_rows(d, rows[:c], x_fields))
    np.testing.assert_array_equal(y.numpy(), _device_rows(d, rows[c:], y_fields))
    np.testing.assert_array_equal(
        torch.cat([tx, ty]).numpy(), synthetic.panel_device_times(d, rows)
    )
    assert info.start_time == synthetic.panel_device_times(d, rows[:1])[0]


@pytest.mark.other_backends_slow
def test_every_window_is_exact_and_never_crosses_devices(panel_dir, read_backend):
    ds = TsFileWindowDataset(
        panel_dir,
        context_length=24,
        horizon=6,
        stride=7,
        columns=["f0", "f2"],
        targets=["f1"],
        dtype=torch.float64,
        return_timestamps=True,
        read_backend=read_backend,
        block_rows=50,  # windows straddle blocks and files
    )
    assert ds.devices == ["meters.s0", "meters.s1", "meters.s2", "meters.s3"]
    expected_counts = [(n - 30) // 7 + 1 if n >= 30 else 0 for n in COUNTS]
    assert list(ds.window_counts().values()) == expected_counts
    assert len(ds) == sum(expected_counts)
    for i in range(len(ds)):
        _check_window(ds, i, ds[i], [0, 2], [1])
    # windows start at rows 0, stride, ...; the last one of device 0 ends within its last rows
    starts = [ds.window_info(i).start_row for i in range(expected_counts[0])]
    assert starts == list(range(0, 300 - 30 + 1, 7))


def test_a_device_exactly_one_window_long_gives_one_window_ending_at_its_last_row(tmp_path):
    synthetic.write_panel(tmp_path, num_devices=2, num_fields=1, num_rows=[10, 9], num_files=2)
    ds = TsFileWindowDataset(tmp_path, context_length=7, horizon=3, return_timestamps=True)
    assert ds.window_counts() == {"meters.s0": 1, "meters.s1": 0}
    x, y, tx, ty = ds[0]
    np.testing.assert_array_equal(
        torch.cat([x, y])[:, 0].numpy(), synthetic.value_of(0, 0, np.arange(10)).astype(np.float32)
    )
    assert ty[-1] == synthetic.panel_device_times(0, [9])[0]
    with pytest.raises(IndexError, match="window index 1 out of range for 1 windows"):
        ds[1]


def test_horizon_zero_gives_x_alone_and_default_columns_are_shared_fields(panel_dir):
    ds = TsFileWindowDataset(panel_dir, context_length=5, stride=100, dtype=torch.float64)
    assert ds.columns == ds.targets == ["f0", "f1", "f2"]
    x = ds[0]
    assert isinstance(x, torch.Tensor) and x.shape == (5, 3)
    np.testing.assert_array_equal(x.numpy(), _device_rows(0, np.arange(5), [0, 1, 2]))
    x, tx = TsFileWindowDataset(panel_dir, context_length=5, return_timestamps=True)[3]
    np.testing.assert_array_equal(tx.numpy(), synthetic.panel_device_times(0, np.arange(3, 8)))


def test_devices_take_names_and_globs_in_device_order(panel_dir):
    ds = TsFileWindowDataset(panel_dir, context_length=5, devices=["meters.s3", "meters.s[01]"])
    assert ds.devices == ["meters.s3", "meters.s0", "meters.s1"]
    assert ds.window_info(0).device == "meters.s3"


def test_time_range_keeps_windows_inside_it(panel_dir):
    # device 1 samples every 2 time units from time 1: rows 50..119 have times 101..239
    ds = TsFileWindowDataset(
        panel_dir,
        context_length=10,
        horizon=2,
        stride=5,
        devices="meters.s1",
        start_time=100,
        end_time=239,
        dtype=torch.float64,
        return_timestamps=True,
    )
    # start_row counts rows inside the time range: window 0 starts at device row 50
    assert _first_row_in_range(1, 100) == 50
    assert ds.window_info(0).start_row == 0 and len(ds) == (70 - 12) // 5 + 1
    assert ds.window_info(1).start_row == 5
    for i in range(len(ds)):
        _check_window(ds, i, ds[i], [0, 1, 2], [0, 1, 2], start_time=100)
        assert 100 <= ds[i][2][0] and ds[i][3][-1] <= 239


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"context_length": 0}, ValueError, r"context_length should be an integer in \[1, .*=0"),
        ({"context_length": 4, "horizon": -1}, ValueError, r"horizon should be .*horizon=-1"),
        ({"context_length": 4, "stride": 0}, ValueError, r"stride should be .* in \[1, .*=0"),
        ({"context_length": True}, TypeError, "context_length should be an integer, but got"),
        ({"context_length": 290, "horizon": 11}, SchemaError, "no device has 301 rows.*300"),
        ({"context_length": 4, "columns": ["volt"]}, SchemaError, r"\['volt'\] are not numeric"),
        ({"context_length": 4, "targets": ["f9"]}, SchemaError, r"\['f9'\] are not numeric"),
        ({"context_length": 4, "devices": "meters.x*"}, SchemaError, "matches no device"),
        ({"context_length": 4, "align": "outer"}, ValueError, "align must be one of 'union'"),
        ({"context_length": 4, "fill": "bfill"}, ValueError, "fill must be one of"),
        ({"context_length": 4, "normalize": "zscore"}, ValueError, "normalize must be None"),
        ({"context_length": 4, "start_time": 9, "end_time": 3}, ValueError, "after end_time"),
    ],
)
def test_bad_arguments_name_the_problem(panel_dir, kwargs, error, message):
    with pytest.raises(error, match=message):
        TsFileWindowDataset(panel_dir, **kwargs)


def test_a_device_missing_a_field_is_named(tmp_path):
    synthetic.write_table_devices(
        tmp_path / "a.tsfile", "m", ["load"], {"a": (np.arange(20), np.ones((20, 1)))}
    )
    synthetic.write_table_devices(
        tmp_path / "b.tsfile", "n", ["volt"], {"b": (np.arange(20), np.ones((20, 1)))}
    )
    ds = TsFileWindowDataset(tmp_path, context_length=4, columns=["load"])
    assert ds.devices == ["m.a"]  # devices=None: the devices that have the fields
    with pytest.raises(SchemaError, match=r"device 'n.b' has no numeric field 'load'"):
        TsFileWindowDataset(tmp_path, context_length=4, columns=["load"], devices=["*"])
    with pytest.raises(SchemaError, match="share no numeric field"):
        TsFileWindowDataset(tmp_path, context_length=4)
    with pytest.raises(SchemaError, match=r"no device has all of the fields \['load', 'volt'\]"):
        TsFileWindowDataset(tmp_path, context_length=4, columns=["load", "volt"])


# -- tree model ------------------------------------------------------------------------------


def test_tree_model_devices_with_aligned_timestamps(tmp_path):
    synthetic.write_tree_file(tmp_path / "tree.tsfile", devices=3, num_rows=500)
    ds = TsFileWindowDataset(
        tmp_path,
        context_length=16,
        horizon=4,
        stride=16,
        columns=["m0", "m1"],
        targets=["m1"],
        devices=["root.sg.d1", "root.sg.d2"],
        dtype=torch.float64,
    )
    assert ds.devices == ["root.sg.d1", "root.sg.d2"] and len(ds) == 2 * ((500 - 20) // 16 + 1)
    x, y = ds[len(ds) // 2 + 1]  # device d2, second window: rows 16..35
    rows = np.arange(16, 36)
    np.testing.assert_array_equal(x[:, 0].numpy(), synthetic.value_of(0, 2 * 3, rows[:16]))
    np.testing.assert_array_equal(x[:, 1].numpy(), rows[:16])
    np.testing.assert_array_equal(y[:, 0].numpy(), rows[16:])


def _tree_pair(tmp_path, a_times, b_times):
    a_times, b_times = np.asarray(a_times), np.asarray(b_times)
    synthetic.write_tree_series(
        tmp_path / "pair.tsfile",
        {"root.sg.d1": {"a": (a_times, a_times * 10.0), "b": (b_times, b_times * 100.0 + 1)}},
    )
    return a_times, b_times


CASES = {
    "interleaving": (np.arange(0, 40, 2), np.arange(1, 41, 3)),
    "nested": (np.arange(0, 40), np.arange(10, 20, 2)),
    "disjoint": (np.arange(0, 20), np.arange(100, 120)),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("align", ["union", "intersect"])
@pytest.mark.parametrize("fill", ["nan", "ffill", "zero"])
def test_unaligned_tree_fields_are_aligned_on_time(tmp_path, expected_aligned, case, align, fill):
    a_times, b_times = _tree_pair(tmp_path, *CASES[case])
    rows, values = expected_aligned(
        [(a_times, a_times * 10.0), (b_times, b_times * 100.0 + 1)], align, fill
    )
    if len(rows) < 4:
        message = "no device has 4 rows" if len(rows) else r"align='intersect'.* share no timestamp"
        with pytest.raises(SchemaError, match=message):
            TsFileWindowDataset(tmp_path, context_length=3, horizon=1, align=align, fill=fill)
        return
    ds = TsFileWindowDataset(
        tmp_path,
        context_length=3,
        horizon=1,
        align=align,
        fill=fill,
        dtype=torch.float64,
        return_timestamps=True,
        block_rows=7,
    )
    assert ds.columns == ["a", "b"] and len(ds) == len(rows) - 3
    for i in range(len(ds)):
        x, y, tx, ty = ds[i]
        np.testing.assert_array_equal(torch.cat([tx, ty]).numpy(), rows[i : i + 4])
        np.testing.assert_array_equal(torch.cat([x, y]).numpy(), values[i : i + 4])


def test_unaligned_fields_without_align_are_an_error_naming_the_device(tmp_path):
    _tree_pair(tmp_path, *CASES["interleaving"])
    with pytest.raises(
        SchemaError, match=r"device 'root.sg.d1'.*'root.sg.d1.a'.*'root.sg.d1.b'.*align='union'"
    ):
        TsFileWindowDataset(tmp_path, context_length=3)


# -- batches, loaders, samplers ---------------------------------------------------------------


def _index_of(ds) -> dict[bytes, int]:
    """First context row (float32 bytes) -> window index: panel values are unique."""
    return {ds[i][0][0].numpy().tobytes(): i for i in range(len(ds))}


def test_a_batch_decodes_each_block_once(panel_dir):
    ds = TsFileWindowDataset(panel_dir, context_length=8, horizon=2, devices="meters.s0")
    batch = ds.__getitems__(list(range(0, 60, 3)))  # 20 windows within rows 0..189
    assert [ds[i][0].tolist() for i in range(0, 60, 3)] == [b[0].tolist() for b in batch]
    ds.close()
    ds.__getitems__(list(range(0, 60, 3)))
    # one block (300 rows of device 0, 3 files -> 3 read groups): 300 rows decoded, not 20 x 10
    assert ds.reader.decoded_rows == 300


@pytest.mark.parametrize("cache", ["none", "memory"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_random_sampler_loader_delivers_every_window_once(panel_dir, num_workers, cache):
    ds = TsFileWindowDataset(panel_dir, context_length=12, horizon=3, stride=2, cache=cache)
    lookup = _index_of(ds)
    loader = DataLoader(
        ds,
        batch_size=16,
        sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(0)),
        num_workers=num_workers,
    )
    seen = []
    for x, y in loader:
        assert x.shape[1:] == (12, 3) and y.shape[1:] == (3, 3)
        seen += [lookup[row.numpy().tobytes()] for row in x[:, 0]]
    assert sorted(seen) == list(range(len(ds))) and seen != sorted(seen)


def test_distributed_sampler_splits_windows_between_ranks(panel_dir):
    ds = TsFileWindowDataset(panel_dir, context_length=12, horizon=3, stride=2)
    lookup = _index_of(ds)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, drop_last=True)
        for x, _ in DataLoader(ds, batch_size=10, sampler=sampler):
            seen += [lookup[row.numpy().tobytes()] for row in x[:, 0]]
    assert len(seen) == len(set(seen)) == len(ds) // 2 * 2


@pytest.mark.slow  # starting spawn / forkserver workers takes seconds
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_workers_open_their_own_readers(panel_dir, method):
    ds = TsFileWindowDataset(panel_dir, context_length=12, horizon=3, stride=5)
    ds[0]  # a reader open in the parent is not pickled
    loader = DataLoader(ds, batch_size=32, num_workers=1, multiprocessing_context=method)
    got = torch.cat([x for x, _ in loader])
    np.testing.assert_array_equal(got.numpy(), torch.stack([ds[i][0] for i in range(len(ds))]))


def _block_of(ds, block_rows: int):
    """The function ``window -> (device, block)`` of the window's first row."""
    return lambda i: (ds.window_info(i).device, ds.window_info(i).start_row // block_rows)


def test_shuffle_yields_each_window_once_and_reshuffles_per_epoch(panel_dir):
    ds = TsFileWindowDataset(
        panel_dir, context_length=4, stride=1, block_rows=32, shuffle=True, shuffle_blocks=2, seed=3
    )
    sampler = EpochSampler(ds, batch_size=10)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        flat = [i for batch in sampler for i in batch]
        assert sorted(flat) == list(range(len(ds)))
        epochs.append(flat)
    assert epochs[0] != epochs[1]
    # windows of one batch come from at most shuffle_blocks (+2 at a group edge) blocks
    block = _block_of(ds, 32)
    sampler.set_epoch(0)
    assert max(len({block(i) for i in batch}) for batch in sampler) <= 4


class _WorkerLogged(TsFileWindowDataset):
    """Appends ``worker id, window index`` of every window it reads to ``log`` (any process)."""

    log = ""

    def __getitems__(self, indices):
        info = torch.utils.data.get_worker_info()
        with open(self.log, "a") as fh:
            fh.writelines(f"{info.id if info else -1} {int(i)}\n" for i in indices)
        return super().__getitems__(indices)


def test_shuffled_loader_workers_read_disjoint_blocks(panel_dir, tmp_path):
    ds = _WorkerLogged(
        panel_dir, context_length=4, stride=1, block_rows=32, shuffle=True, shuffle_blocks=2
    )
    ds.log = str(tmp_path / "reads.txt")
    for _ in make_loader(ds, batch_size=8, num_workers=2):
        pass
    reads = np.loadtxt(ds.log, dtype=np.int64, ndmin=2)
    assert sorted(reads[:, 1]) == list(range(len(ds)))  # every window once
    block = _block_of(ds, 32)
    worker_blocks = [{block(int(i)) for i in reads[reads[:, 0] == w, 1]} for w in range(2)]
    # each worker decodes its own blocks: apart from the edge between the two stretches,
    # no block is decoded by both
    assert len(worker_blocks[0] & worker_blocks[1]) <= 2, worker_blocks


def test_ranks_get_equal_disjoint_shares_of_shuffled_windows(panel_dir):
    counts, union = [], set()
    for rank in range(3):
        ds = TsFileWindowDataset(
            panel_dir,
            context_length=4,
            stride=1,
            block_rows=32,
            shuffle=True,
            shuffle_blocks=2,
            drop_last=True,
            rank=rank,
            world_size=3,
        )
        flat = [i for b in EpochSampler(ds, batch_size=8) for i in b]
        counts.append(len(flat))
        union |= set(flat)
    # drop_last: each rank's len(ds) // 3 windows, in whole batches of 8
    assert counts == [len(ds) // 3 // 8 * 8] * 3 and len(union) == sum(counts)


def test_shuffled_loader_through_two_workers_covers_every_window(panel_dir):
    ds = TsFileWindowDataset(
        panel_dir, context_length=12, horizon=3, stride=2, block_rows=64, shuffle=True
    )
    lookup = _index_of(ds)
    loader = make_loader(ds, batch_size=16, num_workers=2)
    for epoch in range(2):
        loader.batch_sampler.set_epoch(epoch)
        seen = [lookup[row.numpy().tobytes()] for x, _ in loader for row in x[:, 0]]
        assert sorted(seen) == list(range(len(ds)))


def test_memory_cache_decodes_every_row_once(panel_dir):
    ds = TsFileWindowDataset(panel_dir, context_length=4, cache="memory", block_rows=64)
    ds.__getitems__(list(range(len(ds))))
    decoded = ds.reader.decoded_rows
    ds.__getitems__(list(reversed(range(len(ds)))))
    assert ds.reader.decoded_rows == decoded == sum(COUNTS)  # every row once
    assert ds.cached_bytes == sum(COUNTS) * (3 * 4 + 9)  # values, time, kept flag
    streaming = TsFileWindowDataset(
        panel_dir, context_length=3, horizon=2, return_timestamps=True, block_rows=64
    )
    memory = TsFileWindowDataset(
        panel_dir, context_length=3, horizon=2, return_timestamps=True, cache="memory"
    )
    everything = list(range(len(streaming)))
    for a, b in zip(
        collate_windows(streaming.__getitems__(everything)),
        collate_windows(memory.__getitems__(everything)),
        strict=True,
    ):
        assert torch.equal(a, b)


# -- statistics and normalization --------------------------------------------------------------


def _all_values(field: int) -> np.ndarray:
    return np.concatenate(
        [synthetic.value_of(d, field, np.arange(n)) for d, n in enumerate(COUNTS)]
    )


def test_stats_from_metadata_and_exact_std(panel_dir):
    ds = TsFileWindowDataset(panel_dir, context_length=4, columns=["f1", "f0"])
    stats = ds.stats()
    values = _all_values(1)
    assert stats["f1"]["source"] == "metadata" and stats["f1"]["std"] is None
    assert stats["f1"]["count"] == sum(COUNTS)
    assert (stats["f1"]["min"], stats["f1"]["max"]) == (values.min(), values.max())
    assert stats["f1"]["mean"] == pytest.approx(values.mean(), rel=1e-12)
    assert ds.reader.decoded_rows == 0  # no value read
    exact = ds.stats(exact=True)
    assert exact["f1"]["source"] == "data"
    assert exact["f1"]["std"] == pytest.approx(values.std(), rel=1e-12)
    assert exact["f0"]["std"] == pytest.approx(_all_values(0).std(), rel=1e-12)


@pytest.mark.parametrize("method", ["minmax", "standard"])
def test_normalize_applies_to_x_and_y_and_inverts(panel_dir, method):
    ds = TsFileWindowDataset(
        panel_dir,
        context_length=6,
        horizon=2,
        columns=["f0", "f1"],
        targets=["f1"],
        normalize=method,
        dtype=torch.float64,
    )
    f0, f1 = _all_values(0), _all_values(1)
    if method == "minmax":
        shift, scale = (f0.min(), f1.min()), (np.ptp(f0), np.ptp(f1))
    else:
        shift, scale = (f0.mean(), f1.mean()), (f0.std(), f1.std())
    assert ds.normalizer.method == method
    np.testing.assert_allclose(ds.normalizer.shift, shift, rtol=1e-12)
    np.testing.assert_allclose(ds.normalizer.scale, scale, rtol=1e-12)
    x, y = ds[5]
    raw = _device_rows(0, np.arange(5, 13), [0, 1])
    np.testing.assert_allclose(x.numpy(), (raw[:6] - shift) / scale, rtol=1e-12)
    np.testing.assert_allclose(y.numpy(), (raw[6:, 1:] - shift[1]) / scale[1], rtol=1e-12)
    np.testing.assert_allclose(
        ds.normalizer.inverse(y, ds.targets).numpy(), raw[6:, 1:], rtol=1e-12
    )


def test_validation_dataset_takes_the_training_normalizer(panel_dir):
    train = TsFileWindowDataset(panel_dir, context_length=6, end_time=200, normalize="minmax")
    val = TsFileWindowDataset(
        panel_dir, context_length=6, start_time=201, normalize=train.normalizer
    )
    assert val.normalizer is train.normalizer
    x = val[0]
    info = val.window_info(0)
    d = int(info.device.rsplit(".s", 1)[1])
    first = _first_row_in_range(d, 201) + info.start_row  # start_row counts in range
    raw = _device_rows(d, np.arange(first, first + 6), [0, 1, 2])
    expect = train.normalizer(raw, ["f0", "f1", "f2"]).astype(np.float32)
    np.testing.assert_allclose(x.numpy(), expect, rtol=1e-6)
    wrong = Normalizer(("volt",), (0.0,), (1.0,))
    with pytest.raises(ValueError, match=r"no numbers for fields \['f0', 'f1', 'f2'\]"):
        TsFileWindowDataset(panel_dir, context_length=6, normalize=wrong)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_make_loader_hands_over_stacked_batches(panel_dir, num_workers):
    ds = TsFileWindowDataset(
        panel_dir, context_length=12, horizon=3, stride=2, block_rows=64, shuffle=True, seed=1
    )
    lookup = _index_of(ds)
    loader = make_loader(ds, batch_size=16, num_workers=num_workers)
    orders = []
    for epoch in range(2):
        loader.batch_sampler.set_epoch(epoch)
        seen = []
        for x, y in loader:
            assert x.shape[1:] == (12, 3) and y.shape[1:] == (3, 3) and len(x) == len(y) <= 16
            seen += [lookup[row.numpy().tobytes()] for row in x[:, 0]]
        assert sorted(seen) == list(range(len(ds)))
        orders.append(seen)
    assert orders[0] != orders[1]


def test_collate_windows_matches_default_collate(panel_dir):
    ds = TsFileWindowDataset(panel_dir, context_length=5, horizon=2, return_timestamps=True)
    batch = ds.__getitems__([7, 0, 300])
    ours, theirs = collate_windows(batch), torch.utils.data.default_collate(list(batch))
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


def test_shuffled_epoch_decodes_each_block_once_with_a_small_cache(panel_dir):
    length, block = 5, 32
    one_block = (block + length - 1) * (3 * 4 + 8)
    ds = TsFileWindowDataset(
        panel_dir,
        context_length=4,
        horizon=1,
        block_rows=block,
        cache_bytes=3 * one_block,
        shuffle=True,
        shuffle_blocks=2,
        seed=5,
    )
    for batch in EpochSampler(ds, batch_size=10):
        ds.__getitems__(batch)
    # each block once: its rows plus the tail its last windows need, nothing decoded twice
    expected = sum(
        min(b + block + length - 1, n) - b for n in COUNTS for b in range(0, n - length + 1, block)
    )
    assert ds.reader.decoded_rows == expected


def test_tree_devices_continue_across_files_with_their_own_timestamps(tmp_path):
    def series(times, device):
        return {"a": (times, times * 1.0 + device), "b": (times, -times * 1.0 - device)}

    d1, d2 = np.arange(0, 600, 2), np.arange(1, 1201, 4)  # 300 rows each, different clocks
    synthetic.write_tree_series(
        tmp_path / "day1.tsfile",
        {"root.sg.d1": series(d1[:170], 1), "root.sg.d2": series(d2[:90], 2)},
    )
    synthetic.write_tree_series(
        tmp_path / "day2.tsfile",
        {"root.sg.d1": series(d1[170:], 1), "root.sg.d2": series(d2[90:], 2)},
    )
    ds = TsFileWindowDataset(
        tmp_path,
        context_length=20,
        horizon=5,
        stride=3,
        dtype=torch.float64,
        block_rows=64,
        return_timestamps=True,
    )
    assert ds.devices == ["root.sg.d1", "root.sg.d2"] and len(ds) == 2 * ((300 - 25) // 3 + 1)
    for i in range(len(ds)):
        info = ds.window_info(i)
        device, times = (1, d1) if info.device == "root.sg.d1" else (2, d2)
        t = times[info.start_row : info.start_row + 25]
        x, y, tx, ty = ds[i]
        np.testing.assert_array_equal(torch.cat([tx, ty]).numpy(), t)
        np.testing.assert_array_equal(
            torch.cat([x, y]).numpy(), np.stack([t + device, -t - device], 1)
        )


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("replicas", "workers"), [(1, 0), (1, 2), (3, 2)])
def test_sampler_and_loader_len_match_what_they_yield(panel_dir, drop_last, replicas, workers):
    for rank in range(replicas):
        ds = TsFileWindowDataset(
            panel_dir,
            context_length=4,
            stride=3,
            block_rows=32,
            shuffle=True,
            shuffle_blocks=3,
            seed=7,
            drop_last=drop_last,
            rank=rank,
            world_size=replicas,
        )
        sampler = EpochSampler(ds, batch_size=7, num_workers=workers)
        assert len(make_loader(ds, batch_size=7, num_workers=workers)) == len(sampler)
        for _ in range(2):  # each pass is the next epoch; lengths may differ between epochs
            expected = len(sampler)  # before the pass (tqdm, Lightning): the coming pass's
            it = iter(sampler)
            batches = [next(it)]
            assert len(sampler) == expected  # during the pass: its own
            batches += list(it)
            assert len(batches) == expected
            assert all(len(b) == 7 for b in batches) or not drop_last


def test_tree_fields_with_equal_metadata_but_different_timestamps(tmp_path, expected_aligned):
    a_times = np.arange(0, 200, 2)
    b_times = np.append(np.arange(99), 198)  # same count, first and last as a
    series = [(a_times, a_times * 1.0), (b_times, -b_times * 1.0)]
    synthetic.write_tree_series(
        tmp_path / "t.tsfile", {"root.sg.d1": {"a": series[0], "b": series[1]}}
    )
    plain = TsFileWindowDataset(tmp_path, context_length=8, horizon=2)  # metadata agrees
    with pytest.raises(
        SchemaError, match=r"\['root.sg.d1.b'\] do not share timestamps with column 'root.sg.d1.a'"
    ):
        plain[0]
    times, values = expected_aligned(series, "union", "zero")
    ds = TsFileWindowDataset(
        tmp_path, context_length=8, horizon=2, align="union", fill="zero", dtype=torch.float64
    )
    assert len(ds) == len(times) - 9
    x, y = ds[40]
    np.testing.assert_array_equal(torch.cat([x, y]).numpy(), values[40:50])


def test_misaligned_fields_of_a_later_device_are_named_with_its_own_columns(tmp_path):
    times = np.arange(0, 200, 2)
    other = np.append(np.arange(99), 198)  # same count, first and last; differs inside
    synthetic.write_tree_series(
        tmp_path / "t.tsfile",
        {
            "root.sg.d1": {"a": (times, times * 1.0), "b": (times, times * 2.0)},
            "root.sg.d2": {"a": (times, times * 1.0), "b": (other, -other * 1.0)},
        },
    )
    ds = TsFileWindowDataset(tmp_path, context_length=8, horizon=2)  # metadata agrees
    np.testing.assert_array_equal(ds[0][0][:, 1].numpy(), times[:8] * 2.0)  # d1 is fine
    with pytest.raises(
        SchemaError, match=r"\['root.sg.d2.b'\] do not share timestamps with column 'root.sg.d2.a'"
    ):
        ds[len(ds) - 1]  # a window of d2


def test_a_device_without_rows_in_the_time_range_has_no_windows(panel_dir):
    # devices 2 (40 rows) and 3 (121 rows) end before time 201; devices 0 and 1 run on past it
    ds = TsFileWindowDataset(panel_dir, context_length=6, start_time=201, dtype=torch.float64)
    counts = ds.window_counts()
    in_range = [n - _first_row_in_range(d, 201) for d, n in enumerate(COUNTS)]
    assert in_range[2] == in_range[3] == 0
    assert [counts.get(f"meters.s{d}", 0) for d in range(4)] == [
        max(n - 6 + 1, 0) for n in in_range
    ]
    assert len(ds) == sum(counts.values())
    for i in (0, len(ds) - 1):
        info = ds.window_info(i)
        d = int(info.device.rsplit(".s", 1)[1])
        first = _first_row_in_range(d, 201) + info.start_row
        np.testing.assert_array_equal(
            ds[i].numpy(), _device_rows(d, np.arange(first, first + 6), [0, 1, 2])
        )


def test_no_window_indices_give_an_empty_batch(panel_dir):
    from tsfile_torch import MixedWindows

    ds = TsFileWindowDataset(panel_dir, 24, 8, return_timestamps=True)
    x, y, tx, ty = collate_windows(ds.__getitems__([]))
    assert (x.shape, y.shape, tx.shape, ty.shape) == ((0, 24, 3), (0, 8, 3), (0, 24), (0, 8))
    as_dicts = TsFileWindowDataset(panel_dir, 24, return_dict=True)
    assert collate_windows(as_dicts.__getitems__([]))["past_values"].shape == (0, 24, 3)
    mix = MixedWindows([ds, ds], num_samples=10)
    assert collate_windows(mix.__getitems__([]))[0].shape == (0, 24, 3)
