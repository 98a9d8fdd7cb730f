"""Epochs advance with every pass of any loader; rank and world size are fixed at build time."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from torch.utils.data import DataLoader

from tsfile_torch import EpochSampler, TsFileDataset, TsFileIterableDataset, make_loader
from tsfile_torch.sampling import orders as sampling


def _expected_pass(ds: TsFileIterableDataset, epoch: int, num_workers: int) -> list[int]:
    """First rows in the order a DataLoader delivers them: one batch from each worker in turn."""
    runs = [
        list(ds.items_for(epoch, worker=w, num_workers=num_workers)) for w in range(num_workers)
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
    ds = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True, seed=11)
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
    ds = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True)
    ref = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True)
    order = lambda d: [int(rows_of(b)[0]) for b in d]  # noqa: E731
    assert ds.epoch is None
    first, second = order(ds), order(ds)
    ref.set_epoch(1)
    assert second == order(ref) and first != second and ds.epoch == 1
    ds.set_epoch(7)
    assert order(ds) == _expected_pass(ds, 7, 1)
    assert order(ds) == _expected_pass(ds, 8, 1)  # passes count on from the epoch set


def test_set_epoch_rejects_what_is_not_an_epoch(small_dir):
    ds = TsFileIterableDataset(small_dir, batch_size=500)
    for bad in (-1, 1.0, True, sampling.MAX_EPOCH + 1):
        with pytest.raises(ValueError, match="epoch should be an integer"):
            ds.set_epoch(bad)


def test_map_style_random_windows_advance_each_pass_of_make_loader(small_dir, rows_of):
    ds = TsFileDataset(small_dir, batch_size=500, random_batches=4, seed=2)
    loader = make_loader(ds, num_workers=2)
    passes = [[int(rows_of(b)[0]) for b in loader] for _ in range(3)]
    assert passes == [[int(s) for s in ds._windows(epoch)] for epoch in range(3)]
    ds.set_epoch(0)
    assert [int(rows_of(b)[0]) for b in loader] == passes[0]


def test_epoch_sampler_shuffles_by_seed_and_epoch_and_deals_ranks(small_dir):
    per_rank = []
    for rank in range(3):
        ds = TsFileDataset(small_dir, batch_size=500, seed=4, rank=rank, world_size=3)
        sampler = EpochSampler(ds, shuffle=True)
        first, second = list(sampler), list(sampler)
        assert first != second and len(first) == len(sampler) == 4  # 10 batches padded to 12
        per_rank.append(first)
    assert set(sum(per_rank, [])) == set(range(10))
    with pytest.raises(TypeError, match="needs a TsFileDataset"):
        EpochSampler(TsFileIterableDataset(small_dir, batch_size=500))


def test_consecutive_passes_of_the_same_workers_never_share_a_tag():
    for seed in (0, 1, 2**63, -7):
        passes = [*range(1, 500), *range(65_000, 66_000)]  # across the 16-bit wrap
        tags = {p: sampling.pass_tag(seed, p) for p in passes}
        assert all(tags[p] != tags[p + 1] for p in passes if p + 1 in tags)
        assert 1 <= min(tags.values()) <= max(tags.values()) < 2**16


def test_epoch_word_round_trips_and_names_the_next_epoch():
    for fields in [(-1, False, 0, 0), (0, False, 4194303, 65535), (sampling.MAX_EPOCH, True, 7, 1)]:
        word = sampling.pack_epoch_word(*fields)
        assert 0 <= word < 2**63 and tuple(sampling.unpack_epoch_word(word)) == fields
    assert sampling.next_epoch(sampling.EpochWord(-1, False, 0, 0)) == 0  # first pass
    assert sampling.next_epoch(sampling.EpochWord(3, False, 9, 9)) == 4
    assert sampling.next_epoch(sampling.EpochWord(9, True, 0, 0)) == 9  # set_epoch(9)


def test_rank_is_captured_at_build_time_and_travels_in_pickles(small_dir, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = TsFileIterableDataset(small_dir, batch_size=500)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert (ds.rank, ds.world_size) == (1, 2) and len(ds) == 5
    clone = pickle.loads(pickle.dumps(ds))
    assert (clone.rank, clone.world_size) == (1, 2)
    assert list(ds.items_for(0)) == list(range(500, 5000, 1000))
    explicit = TsFileIterableDataset(small_dir, batch_size=500, rank=2, world_size=3)
    assert (explicit.rank, explicit.world_size, len(explicit)) == (2, 3, 4)
    alone = TsFileIterableDataset(small_dir, batch_size=500)  # no env, no process group
    assert (alone.rank, alone.world_size) == (0, 1)


@pytest.mark.parametrize(
    "kwargs, env, match",
    [
        ({"rank": 2, "world_size": 2}, {}, r"rank should be in \[0, world_size\)"),
        ({"rank": 0}, {}, "give both or neither"),
        ({"rank": 0, "world_size": 1.0}, {}, "world_size should be an integer"),
        ({}, {"RANK": "x", "WORLD_SIZE": "2"}, "RANK and WORLD_SIZE must be integers"),
        ({}, {"RANK": "3", "WORLD_SIZE": "2"}, "from the RANK / WORLD_SIZE environment"),
    ],
)
def test_bad_rank_settings_are_value_errors(small_dir, monkeypatch, kwargs, env, match):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        TsFileDataset(small_dir, batch_size=500, **kwargs)


@pytest.mark.parametrize("seed", [-1, -(2**70), 2**64 + 5, np.int64(-3)])
def test_any_integer_seed_is_taken_modulo_2_64(small_dir, rows_of, seed):
    ds = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True, seed=seed)
    same = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True, seed=int(seed) % 2**64)
    assert ds.options.seed == int(seed) % 2**64
    assert [int(rows_of(b)[0]) for b in ds] == [int(rows_of(b)[0]) for b in same]


@pytest.mark.parametrize("seed", [1.5, "3", True, None])
def test_a_seed_that_is_not_an_integer_is_a_value_error(small_dir, seed):
    with pytest.raises(ValueError, match="seed should be an integer"):
        TsFileIterableDataset(small_dir, batch_size=500, seed=seed)


def test_a_new_loader_each_pass_with_the_same_seeded_generator_still_counts_epochs(
    small_dir, rows_of
):
    """Every pass's workers then get the same base seed: the pass key alone cannot tell them."""
    import torch

    ds = TsFileIterableDataset(small_dir, batch_size=500, shuffle=True, seed=5)
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
