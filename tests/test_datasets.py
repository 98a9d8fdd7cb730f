"""Datasets in one process: exact values, order, epochs, random windows, map-style samplers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader, synthetic
from tsfile_torch.read.core import sums_verified


@pytest.mark.parametrize("block_rows", [65536, 1500])
def test_sequential_epoch_returns_every_value_exactly(
    small_dir, small_expected, read_backend, block_rows
):
    ds = TsFileIterableDataset(
        small_dir, batch_size=1024, read_backend=read_backend, block_rows=block_rows
    )
    batches = list(ds)
    assert [b.shape for b in batches] == [(1024, 18)] * 4 + [(904, 18)]
    assert all(b.dtype == torch.float32 for b in batches)
    np.testing.assert_array_equal(torch.cat(batches).numpy(), small_expected.astype(np.float32))


def test_drop_last_leaves_out_the_partial_batch(small_dir, small_expected, read_backend):
    ds = TsFileIterableDataset(
        small_dir, batch_size=1024, drop_last=True, read_backend=read_backend
    )
    batches = list(ds)
    assert len(ds) == len(batches) == 4
    np.testing.assert_array_equal(
        torch.cat(batches).numpy(), small_expected[:4096].astype(np.float32)
    )


def test_float64_batches_are_the_stored_doubles(small_dir, small_expected, read_backend):
    ds = TsFileIterableDataset(
        small_dir,
        batch_size=5000,
        dtype=torch.float64,
        read_backend=read_backend,
        columns=["t.d2.*"],
    )
    (batch,) = list(ds)
    assert batch.dtype == torch.float64
    np.testing.assert_array_equal(batch.numpy(), small_expected[:, 6:9])


@pytest.mark.parametrize("order", ["sequential", "batches", "shuffle"])
def test_timestamps_are_those_of_the_values_rows(small_dir, small_expected, read_backend, order):
    ds = TsFileIterableDataset(
        small_dir, batch_size=2000, read_backend=read_backend, return_timestamps=True, order=order
    )
    seen = []
    for values, times in ds:
        assert times.dtype == torch.int64 and times.shape == (values.shape[0],)
        # the small dataset's row r has timestamp r: each timestamp must be its value row's
        np.testing.assert_array_equal(values.numpy(), small_expected[times].astype(np.float32))
        seen.append(times.numpy())
    assert sorted(len(t) for t in seen) == [1000, 2000, 2000]
    assert sorted(np.concatenate(seen).tolist()) == list(range(5000))


def test_batches_order_is_a_permutation_of_batches_fixed_by_seed_and_epoch(small_dir, rows_of):
    def order(seed, epoch):
        ds = TsFileIterableDataset(small_dir, batch_size=500, order="batches", seed=seed)
        ds.set_epoch(epoch)
        return [int(rows_of(b)[0]) for b in ds]  # rows_of: each batch is a run of rows

    first = order(0, 0)
    assert sorted(first) == list(range(0, 5000, 500))
    assert order(0, 0) == first
    assert order(0, 1) != first
    assert order(1, 0) != first


def test_shuffled_rows_are_a_permutation_fixed_by_seed_and_epoch(small_dir):
    def rows(seed, epoch):
        ds = TsFileIterableDataset(
            small_dir, batch_size=500, shuffle=True, seed=seed, return_timestamps=True
        )
        ds.set_epoch(epoch)
        return torch.cat([t for _, t in ds]).numpy()  # row r has timestamp r

    first = rows(0, 0)
    assert sorted(first.tolist()) == list(range(5000))
    np.testing.assert_array_equal(rows(0, 0), first)
    assert not np.array_equal(rows(0, 1), first)
    assert not np.array_equal(rows(1, 0), first)


def test_without_set_epoch_each_pass_is_the_next_epoch(small_dir, rows_of):
    ds = TsFileIterableDataset(small_dir, batch_size=500, order="batches")
    passes = [[int(rows_of(b)[0]) for b in ds] for _ in range(2)]
    ref = TsFileIterableDataset(small_dir, batch_size=500, order="batches")
    ref.set_epoch(1)
    assert passes[1] == [int(rows_of(b)[0]) for b in ref]
    assert passes[0] != passes[1]


def test_a_shuffled_batch_mixes_rows_from_many_places_in_time_order(small_dir, small_expected):
    ds = TsFileIterableDataset(small_dir, batch_size=700, shuffle=True, return_timestamps=True)
    for values, times in ds:
        rows = times.numpy()  # row r has timestamp r
        assert (np.diff(rows) > 0).all()  # time order inside the batch
        assert rows[-1] - rows[0] > 2 * len(rows)  # not a run: rows from all over the buffer
        np.testing.assert_array_equal(values.numpy(), small_expected[rows].astype(np.float32))


def test_row_shuffle_mixes_only_the_blocks_of_its_buffer(small_dir, small_expected):
    # blocks of 500 rows, 2 a buffer: each group of 1000 rows is 4 whole batches of 250
    ds = TsFileIterableDataset(
        small_dir,
        batch_size=250,
        shuffle=True,
        block_rows=500,
        shuffle_blocks=2,
        return_timestamps=True,
    )
    for _ in range(2):  # epochs 0 and 1
        batches = [t.numpy() for _, t in ds]
        assert len(batches) == 20
        assert sorted(np.concatenate(batches).tolist()) == list(range(5000))
        groups = [np.unique(np.concatenate(batches[g : g + 4]) // 500) for g in range(0, 20, 4)]
        assert all(len(blocks) == 2 for blocks in groups)  # 4 batches: 2 whole blocks
        assert sorted(np.concatenate(groups).tolist()) == list(range(10))
        assert any(len(np.unique(b // 500)) == 2 for b in batches)  # a batch mixes blocks


def test_random_windows_are_exact_and_seeded_by_seed_and_epoch(
    small_dir, small_expected, read_backend, rows_of
):
    ds = TsFileIterableDataset(
        small_dir, batch_size=800, random_batches=6, seed=3, read_backend=read_backend
    )
    ds.set_epoch(2)
    starts = []
    for batch in ds:
        rows = rows_of(batch)
        assert batch.shape == (800, 18)
        np.testing.assert_array_equal(
            batch.numpy(), small_expected[rows[0] : rows[0] + 800].astype(np.float32)
        )
        starts.append(int(rows[0]))
    assert len(starts) == len(ds) == 6
    again = TsFileDataset(small_dir, batch_size=800, random_batches=6, seed=3)
    again.set_epoch(2)
    assert [int(rows_of(again[i])[0]) for i in range(6)] == starts
    again.set_epoch(3)
    assert [int(rows_of(again[i])[0]) for i in range(6)] != starts


@pytest.mark.parametrize("workers", [0, 2])
def test_random_windows_through_workers_are_exact_and_each_worker_decodes_its_stretch(
    tmp_path, small_dir, small_expected, rows_of, workers, decode_counting
):
    # random batches are dealt to the workers sorted by row, so each worker's blocks are
    # clipped to its stretch: the workers together decode about one pass, not one each
    ds = decode_counting(small_dir, tmp_path, batch_size=800, random_batches=6, seed=3)
    loader = make_loader(ds, num_workers=workers, persistent_workers=workers > 0)
    starts = {}
    for epoch in range(2):
        starts[epoch] = []
        for batch in loader:
            rows = rows_of(batch)
            np.testing.assert_array_equal(
                batch.numpy(), small_expected[rows[0] : rows[0] + 800].astype(np.float32)
            )
            starts[epoch].append(int(rows[0]))
        # each pass decodes its blocks whole, and through workers the first worker's stretch
        # starts at row 0 and the last one's ends at the last row: together they hold every
        # cell of the sums whole, so the sums are checked in the first pass
        assert sums_verified(ds.core)
    plain = TsFileDataset(small_dir, batch_size=800, random_batches=6, seed=3)
    for epoch in range(2):
        plain.set_epoch(epoch)
        assert sorted(starts[epoch]) == sorted(int(rows_of(plain[i])[0]) for i in range(6))
    if workers:
        groups = 6  # 3 files x 2 devices, 5,000 rows each
        for epoch in range(2):
            per_worker = [int(p.read_text()) for p in tmp_path.glob(f"epoch{epoch}-worker*")]
            assert len(per_worker) == 2
            # two sorted halves overlap by at most one batch (and each end widens to a 32-row
            # cell): at most 5,928 rows of each group
            assert 0 < sum(per_worker) <= (5000 + 800 + 4 * 32) * groups, per_worker


def test_nulls_read_as_nan(tmp_path, read_backend):
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=2, num_rows=3000
    )
    synthetic.write_table_files(tmp_path, spec, null_every=7)
    (batch,) = list(TsFileIterableDataset(tmp_path, batch_size=3000, read_backend=read_backend))
    rows = np.arange(3000)
    col = batch[:, 1].numpy()
    assert np.isnan(col[rows % 7 == 0]).all()
    np.testing.assert_array_equal(
        col[rows % 7 != 0], synthetic.value_of(0, 1, rows[rows % 7 != 0]).astype(np.float32)
    )
    np.testing.assert_array_equal(
        batch[:, 0].numpy(), synthetic.value_of(0, 0, rows).astype(np.float32)
    )


def test_tree_model_values_and_types_read_as_numbers(tmp_path, read_backend):
    synthetic.write_tree_file(tmp_path / "a.tsfile", devices=2, num_rows=2500, file_index=0)
    ds = TsFileIterableDataset(
        tmp_path, batch_size=1000, read_backend=read_backend, dtype=torch.float64, block_rows=900
    )
    values = torch.cat(list(ds)).numpy()
    rows = np.arange(2500)
    expected = np.stack(
        [
            synthetic.value_of(0, 0, rows),
            rows,
            rows % 2,
            synthetic.value_of(0, 3, rows),
            rows,
            rows % 2,
        ],
        axis=1,
    )
    np.testing.assert_array_equal(values, expected)


def test_shards_across_files_read_as_one_series(tmp_path, read_backend):
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=2, num_rows=1500
    )
    synthetic.write_table_files(tmp_path, spec, prefix="day1_")
    synthetic.write_table_files(tmp_path, spec, prefix="day2_", row_offset=1500)
    ds = TsFileIterableDataset(tmp_path, batch_size=1000, read_backend=read_backend)
    values = torch.cat(list(ds)).numpy()
    rows = np.arange(3000)
    assert values.shape == (3000, 2)
    np.testing.assert_array_equal(values[:, 1], synthetic.value_of(0, 1, rows).astype(np.float32))


def test_map_style_dataset_with_random_sampler_covers_each_batch_once(
    small_dir, small_expected, read_backend, rows_of
):
    ds = TsFileDataset(small_dir, batch_size=1000, read_backend=read_backend)
    assert len(ds) == 5
    loader = DataLoader(ds, batch_size=None, sampler=RandomSampler(ds))
    seen = sorted(int(rows_of(b)[0]) for b in loader)
    assert seen == [0, 1000, 2000, 3000, 4000]
    np.testing.assert_array_equal(ds[-1].numpy(), small_expected[4000:].astype(np.float32))


def test_map_style_dataset_with_distributed_sampler_splits_batches(
    small_dir, small_expected, rows_of
):
    ds = TsFileDataset(small_dir, batch_size=1000)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=1)
        rows = [int(rows_of(b)[0]) for b in DataLoader(ds, batch_size=None, sampler=sampler)]
        assert len(rows) == 3  # 5 batches padded to 6: every rank the same count
        seen += rows
    assert set(seen) == {0, 1000, 2000, 3000, 4000}


def test_make_loader_refuses_shuffle_the_order_belongs_to_the_dataset(small_dir):
    ds = TsFileDataset(small_dir, batch_size=1000)
    with pytest.raises(ValueError, match="shuffle=True belongs to the dataset"):
        make_loader(ds, shuffle=True)


def test_make_loader_visits_a_map_style_batch_permutation_new_each_epoch(small_dir, rows_of):
    loader = make_loader(TsFileDataset(small_dir, batch_size=1000, order="batches", seed=3))
    passes = [[int(rows_of(b)[0]) for b in loader] for _ in range(3)]
    assert all(sorted(p) == list(range(0, 5000, 1000)) for p in passes)
    assert len({tuple(p) for p in passes}) > 1


def test_make_loader_over_a_map_style_row_shuffle_hands_each_row_once(small_dir, small_expected):
    ds = TsFileDataset(small_dir, batch_size=1000, shuffle=True, return_timestamps=True)
    batches = list(make_loader(ds))
    assert len(batches) == 5
    times = torch.cat([t for _, t in batches]).numpy()  # row r has timestamp r
    assert sorted(times.tolist()) == list(range(5000))
    values = torch.cat([v for v, _ in batches]).numpy()
    np.testing.assert_array_equal(values, small_expected[times].astype(np.float32))


@pytest.mark.parametrize("order, items", [("batches", 50), ("shuffle", 5000)])
def test_iterable_items_cover_every_item_once_across_ranks_and_workers(small_dir, order, items):
    # "batches": an item is one of the 50 batches; "shuffle": one of the 5000 rows
    alone = TsFileIterableDataset(small_dir, batch_size=100, order=order, validate=False)
    epoch_order = np.concatenate(alone.epoch_batches(5))  # the whole epoch on one rank
    for world in (1, 2, 3):
        ranks = [
            TsFileIterableDataset(
                small_dir, batch_size=100, order=order, rank=r, world_size=world, validate=False
            )
            for r in range(world)
        ]
        assert len({len(ds) for ds in ranks}) == 1  # equal batch counts: DDP never hangs
        per_rank = -(-items // world)
        padded = np.resize(epoch_order, per_rank * world)  # wrapped around to equal counts
        for r, ds in enumerate(ranks):  # rank r takes the r-th contiguous run of the epoch
            np.testing.assert_array_equal(
                np.concatenate(ds.epoch_batches(5)), padded[r * per_rank : (r + 1) * per_rank]
            )
        for workers in (1, 2, 4):
            got = [
                np.concatenate(
                    [np.concatenate(ds.items_for(5, w, workers)) for w in range(workers)]
                )
                for ds in ranks
            ]
            assert [len(g) for g in got] == [per_rank] * world  # equal counts
            everything = np.concatenate(got)
            assert set(everything.tolist()) == set(range(items))
            # the workers of a rank split its items: each once
            for r, g in enumerate(got):
                np.testing.assert_array_equal(
                    np.sort(g), np.sort(padded[r * per_rank : (r + 1) * per_rank])
                )


def test_dataset_pickles_without_native_readers(small_dir, small_expected):
    ds = TsFileIterableDataset(small_dir, batch_size=2500, read_backend="mmap")
    next(iter(ds))
    assert ds.reader.num_open == 3
    ds.set_epoch(4)
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.core._reader is None and clone.epoch == 4
    np.testing.assert_array_equal(
        next(iter(clone)).numpy(), small_expected[:2500].astype(np.float32)
    )


@pytest.mark.parametrize("order", ["sequential", "shuffle"])
def test_memory_cache_keeps_rows_across_epochs_and_stops_decoding(
    small_dir, small_expected, read_backend, order
):
    ds = TsFileIterableDataset(
        small_dir, batch_size=1000, cache="memory", order=order, read_backend=read_backend
    )
    first = list(ds)
    assert ds.core.store().nbytes == 5000 * (18 * 4 + 8 + 1)
    assert ds.core.store().filled.all()
    decoded = ds.reader.decoded_rows
    assert decoded >= 5000
    second = list(ds)
    assert ds.reader.decoded_rows == decoded  # epoch 2 decoded nothing
    full = small_expected.astype(np.float32)
    for batches in (first, second):
        values = np.concatenate([b.numpy() for b in batches])
        assert sorted(map(bytes, values)) == sorted(map(bytes, full))
    second[0].add_(1.0)  # batches are copies: changing one leaves the cache intact
    third = np.concatenate([b.numpy() for b in ds])
    assert sorted(map(bytes, third)) == sorted(map(bytes, full))


def test_streaming_without_block_cache_reads_the_same_values(small_dir, small_expected):
    streaming = TsFileIterableDataset(small_dir, batch_size=1000, cache_bytes=0)
    np.testing.assert_array_equal(
        torch.cat(list(streaming)).numpy(), small_expected.astype(np.float32)
    )
    assert streaming.reader.cached_bytes == 0
