"""Epochs advance with every pass of any loader; rank and world size are fixed at build time."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tsfile_torch import EpochSampler, TsFileDataset, TsFileIterableDataset, make_loader
from tsfile_torch.sampling import state


def _expected_pass(ds: TsFileIterableDataset, epoch: int, num_workers: int) -> list[int]:
    """First rows in the order a DataLoader delivers them: one batch from each worker in turn.

    With ``order="batches"`` an item is a batch number: its first row is ``item * batch_size``.
    """
    runs = [
        [int(b[0]) * ds.batch_size for b in ds.items_for(epoch, worker=w, num_workers=num_workers)]
        for w in range(num_workers)
    ]
    out = []
    for i in range(max(len(r) for r in runs)):
        out += [r[i] for r in runs if i < len(r)]
    return out


@pytest.mark.parametrize(
    "context, persistent",
    [
        ("fork", False),
        ("fork", True),
        # forkserver workers import torch afresh: 5-10 s persistent, ~12 s not (.ci/run)
        pytest.param("forkserver", True, marks=pytest.mark.slow),
        pytest.param("forkserver", False, marks=pytest.mark.slow),
    ],
)
def test_plain_dataloader_passes_are_epochs_0_1_2(small_dir, rows_of, context, persistent):
    ds = TsFileIterableDataset(small_dir, batch_size=500, order="batches", seed=11)
    loader = DataLoader(
        ds,
        batch_size=None,
        num_workers=2,
        persistent_workers=persistent,
        multiprocessing_context=context,
    )
    passes = [[int(rows_of(b)[0]) for b in loader] for _ in range(3)]
    assert passes == [_expected_pass(ds, epoch, 2) for epoch in range(3)]
    assert len({tuple(p) for p in passes}) == 3  # three different orders
    assert ds.epoch == 2  # the main process knows the epoch its workers ran


def test_in_process_passes_are_epochs_and_set_epoch_names_the_next(small_dir, rows_of):
    ds = TsFileIterableDataset(small_dir, batch_size=500, order="batches")
    ref = TsFileIterableDataset(small_dir, batch_size=500, order="batches")
    order = lambda d: [int(rows_of(b)[0]) for b in d]  # noqa: E731
    assert ds.epoch is None
    first, second = order(ds), order(ds)
    ref.set_epoch(1)
    assert second == order(ref) and first != second and ds.epoch == 1
    ds.set_epoch(7)
    assert order(ds) == _expected_pass(ds, 7, 1)
    assert order(ds) == _expected_pass(ds, 8, 1)  # passes count on from the epoch set


def test_shuffled_rows_are_new_each_pass_and_follow_set_epoch(small_dir):
    ds = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True, return_timestamps=True)
    ref = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True, return_timestamps=True)
    times = lambda d: torch.cat([t for _, t in d]).numpy()  # noqa: E731 - row r has time r
    first, second = times(ds), times(ds)
    assert sorted(first) == sorted(second) == list(range(5000))  # each row once per epoch
    assert not np.array_equal(first, second)
    ref.set_epoch(1)
    np.testing.assert_array_equal(times(ref), second)


@pytest.mark.parametrize(
    "bad, error", [(-1, ValueError), (state.MAX_EPOCH + 1, ValueError), (1.0, TypeError),
                   (True, TypeError)]
)  # fmt: skip
def test_set_epoch_rejects_what_is_not_an_epoch(small_dir, bad, error):
    ds = TsFileIterableDataset(small_dir, batch_size=500)
    with pytest.raises(error, match="epoch should be an integer"):
        ds.set_epoch(bad)


def _delivered(firsts: list[int], num_workers: int) -> list[int]:
    """``firsts`` (one epoch's batches in epoch order) as a loader with workers delivers them.

    The batches sorted by first row are cut into ``num_workers`` contiguous runs; each worker
    yields its run in epoch order and the loader takes one batch from each worker in turn.
    """
    by_first = np.argsort(firsts, kind="stable")
    bounds = np.linspace(0, len(firsts), num_workers + 1).round().astype(int)
    runs = [sorted(by_first[bounds[w] : bounds[w + 1]].tolist()) for w in range(num_workers)]
    return [firsts[r[i]] for i in range(max(map(len, runs))) for r in runs if i < len(r)]


def test_map_style_random_windows_advance_each_pass_of_make_loader(small_dir, rows_of):
    ds = TsFileDataset(small_dir, batch_size=500, random_batches=4, seed=2)
    loader = make_loader(ds, num_workers=2)
    passes = [[int(rows_of(b)[0]) for b in loader] for _ in range(3)]
    probe = TsFileDataset(small_dir, batch_size=500, random_batches=4, seed=2)
    windows = []
    for epoch in range(3):
        probe.set_epoch(epoch)  # ds[i]: the i-th random window of the current epoch
        windows.append([int(rows_of(probe[i])[0]) for i in range(4)])
    assert passes == [_delivered(w, 2) for w in windows]
    assert len({tuple(sorted(w)) for w in windows}) == 3
    ds.set_epoch(0)
    assert [int(rows_of(b)[0]) for b in loader] == passes[0]


def test_epoch_sampler_permutes_batches_by_seed_and_epoch_and_gives_ranks_runs(small_dir):
    per_rank = []
    for rank in range(3):
        with pytest.warns(UserWarning, match="2 are repeated"):  # 10 batches padded to 12
            ds = TsFileDataset(small_dir, batch_size=500, order="batches", seed=4, rank=rank,
                               world_size=3)  # fmt: skip
        sampler = EpochSampler(ds)
        first = [int(key.items[0]) for key in sampler]
        second = [int(key.items[0]) for key in sampler]
        assert first != second and len(first) == len(sampler) == 4
        per_rank.append(first)
    assert set(sum(per_rank, [])) == set(range(10))
    assert len(sum(per_rank, [])) == 12
    with pytest.raises(TypeError, match="needs a tsfile-torch dataset"):
        EpochSampler(list(range(10)))


def test_consecutive_passes_of_the_same_workers_never_share_a_tag():
    for seed in (0, 1, 2**63, -7):
        passes = [*range(1, 500), *range(65_000, 66_000)]  # across the 16-bit wrap
        tags = {p: state.pass_tag(seed, p) for p in passes}
        assert all(tags[p] != tags[p + 1] for p in passes if p + 1 in tags)
        assert 1 <= min(tags.values()) <= max(tags.values()) < 2**16


def test_epoch_word_round_trips_its_extreme_fields():
    for fields in [(-1, False, 0, 0), (0, False, 4194303, 65535), (state.MAX_EPOCH, True, 7, 1)]:
        word = state._pack(*fields)
        assert 0 <= word < 2**63 and tuple(state._unpack(word)) == fields


def test_epoch_counter_counts_passes_and_takes_a_set_epoch_as_is():
    counter = state.EpochCounter()
    assert counter.latest is None
    assert [counter.claim() for _ in range(3)] == [0, 1, 2]
    counter.set(9)
    assert counter.latest == 9
    assert [counter.claim(), counter.claim()] == [9, 10]
    counter.set(state.MAX_EPOCH)
    assert counter.claim() == state.MAX_EPOCH
    clone = pickle.loads(pickle.dumps(counter))  # a checkpoint copy takes the value
    assert clone.latest == state.MAX_EPOCH


def test_rank_is_captured_at_build_time_and_travels_in_pickles(small_dir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = TsFileIterableDataset(small_dir, batch_size=500)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert (ds.rank, ds.world_size) == (1, 2) and len(ds) == 5
    clone = pickle.loads(pickle.dumps(ds))
    assert (clone.rank, clone.world_size) == (1, 2)
    # rank 1 of 2 takes the second contiguous run of the 10 batches
    assert [b.tolist() for b in ds.items_for(0)] == [[5], [6], [7], [8], [9]]
    assert [b.tolist() for b in clone.items_for(0)] == [[5], [6], [7], [8], [9]]
    with pytest.warns(UserWarning, match="2 are repeated"):
        explicit = TsFileIterableDataset(small_dir, batch_size=500, rank=2, world_size=3)
    assert (explicit.rank, explicit.world_size, len(explicit)) == (2, 3, 4)
    # 10 batches padded to 12 by wrapping around: rank 2 takes 8, 9, 0, 1
    assert [b.tolist() for b in explicit.items_for(0)] == [[8], [9], [0], [1]]
    alone = TsFileIterableDataset(small_dir, batch_size=500)  # no env, no process group
    assert (alone.rank, alone.world_size) == (0, 1)


@pytest.mark.parametrize(
    "kwargs, env, error, match",
    [
        ({"rank": 2, "world_size": 2}, {}, ValueError, r"rank should be in \[0, world_size\)"),
        ({"rank": 0}, {}, ValueError, "give both or neither"),
        ({"rank": 0, "world_size": 1.0}, {}, TypeError, "world_size should be an integer"),
        ({"rank": 0, "world_size": 0}, {}, ValueError, "world_size should be an integer >= 1"),
        ({}, {"RANK": "x", "WORLD_SIZE": "2"}, ValueError, "RANK and WORLD_SIZE must be"),
        ({}, {"RANK": "3", "WORLD_SIZE": "2"}, ValueError, "from the RANK / WORLD_SIZE env"),
    ],
)
def test_bad_rank_settings_are_clear_errors(small_dir, monkeypatch, kwargs, env, error, match):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(error, match=match):
        TsFileDataset(small_dir, batch_size=500, **kwargs)


@pytest.mark.parametrize("seed", [-1, -(2**70), 2**64 + 5, np.int64(-3)])
def test_any_integer_seed_is_taken_modulo_2_64(small_dir, seed):
    kwargs = dict(batch_size=500, shuffle=True, return_timestamps=True)
    ds = TsFileIterableDataset(small_dir, seed=seed, **kwargs)
    same = TsFileIterableDataset(small_dir, seed=int(seed) % 2**64, **kwargs)
    assert ds.order_spec.seed == int(seed) % 2**64
    got = torch.cat([times for _, times in ds]).numpy()
    np.testing.assert_array_equal(got, torch.cat([times for _, times in same]).numpy())


@pytest.mark.parametrize("seed", [1.5, "3", True, None])
def test_a_seed_that_is_not_an_integer_is_a_type_error(small_dir, seed):
    with pytest.raises(TypeError, match=r"seed should be an integer \(any sign"):
        TsFileIterableDataset(small_dir, batch_size=500, seed=seed)


def test_a_new_loader_each_pass_with_the_same_seeded_generator_still_counts_epochs(
    small_dir, rows_of
):
    """Every pass's workers then get the same base seed: the pass key alone cannot tell them."""
    ds = TsFileIterableDataset(small_dir, batch_size=500, order="batches", seed=5)
    passes = []
    for _ in range(3):
        loader = DataLoader(
            ds,
            batch_size=None,
            num_workers=2,
            generator=torch.Generator().manual_seed(0),
            multiprocessing_context="fork",
        )
        passes.append([int(rows_of(b)[0]) for b in loader])
    assert passes == [_expected_pass(ds, epoch, 2) for epoch in range(3)]
