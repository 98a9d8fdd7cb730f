"""Elastic resume: a state saved under one topology (ranks, workers) loads under another.

The rest of the interrupted epoch is every item not yet delivered, once across the new ranks and
workers (plus the documented padding: at most ``world_size - 1`` repeated items per topology),
and the epochs after it run as if the new topology had been used from the start. Items are
recovered from real TsFiles: rows by their timestamps (row r has timestamp r), windows by
(device value, first timestamp).
"""

from __future__ import annotations

import collections
import multiprocessing
import os

import pytest
import torch

from tsfile_torch import (
    TsFileDataset,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)

ROWS = 10_000  # rows of the dataset: two files side by side (2 devices x 2 fields)


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("elastic-rows")
    spec = synthetic.DatasetSpec(num_files=2, fields_per_device=2, num_rows=ROWS)
    synthetic.write_table_files(directory, spec)
    return str(directory)


@pytest.fixture(scope="module")
def panel_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("elastic-panel")
    synthetic.write_panel(directory, num_devices=4, num_fields=2, num_rows=900, num_files=2)
    return str(directory)


def _loader(kind, data, order, rank, world, workers, batch_size=16):
    common = dict(order=order, seed=5, rank=rank, world_size=world, validate=False)
    if kind == "window":
        ds = TsFileWindowDataset(data, 20, 5, stride=3, return_timestamps=True, **common)
        return make_loader(ds, batch_size=batch_size, num_workers=workers, stateful=True)
    cls = TsFileIterableDataset if kind == "iterable" else TsFileDataset
    ds = cls(data, batch_size=700, return_timestamps=True, **common)
    return make_loader(ds, num_workers=workers, stateful=True)


def _items(kind, batch) -> list:
    if kind == "window":
        x, _, xt, _ = batch
        return [(round(float(v[0, 0]), 6), int(t[0])) for v, t in zip(x, xt, strict=True)]
    return batch[1].tolist()


def _epoch1(kind, data, order, world, workers) -> collections.Counter:
    """Every item of epoch 1 under a topology, all ranks together (uninterrupted)."""
    out = collections.Counter()
    for rank in range(world):
        loader = _loader(kind, data, order, rank, world, workers)
        list(loader)
        out.update(i for b in loader for i in _items(kind, b))
    return out


CASES = [
    (kind, order)
    for kind in ("iterable", "map", "window")
    for order in ("sequential", "shuffle", "batches")
]


def _resume_elsewhere(kind, data, order, new_world, new_workers):
    # two ranks with two workers each, stopped after 3 batches of epoch 1: rank 0's state only
    got = collections.Counter()
    state = None
    for rank in range(2):
        loader = _loader(kind, data, order, rank, 2, 2)
        list(loader)
        it = iter(loader)
        for _ in range(3):
            got.update(_items(kind, next(it)))
        state = state or loader.state_dict()
        del it, loader
    later = collections.Counter()
    for rank in range(new_world):
        loader = _loader(kind, data, order, rank, new_world, new_workers)
        loader.load_state_dict(state)
        got.update(i for b in loader for i in _items(kind, b))  # the rest of epoch 1
        later.update(i for b in loader for i in _items(kind, b))  # epoch 2, new topology
    every = _epoch1(kind, data, order, 1, 0)
    assert not every - got, "items of the epoch never delivered"
    # repeats: at most the old topology's and the new one's padding (world_size - 1 items
    # each; an item of the sequential and batches row orders is a batch of 700 rows)
    unit = 700 if kind != "window" and order != "shuffle" else 1
    assert sum((got - every).values()) <= ((2 - 1) + (new_world - 1)) * unit
    # epoch 2 as if the new topology had been used from the start
    fresh = collections.Counter()
    for rank in range(new_world):
        loader = _loader(kind, data, order, rank, new_world, new_workers)
        list(loader), list(loader)
        fresh.update(i for b in loader for i in _items(kind, b))
    assert later == fresh


@pytest.mark.parametrize(
    "kind, order",
    [("iterable", "shuffle"), pytest.param("window", "shuffle", marks=pytest.mark.slow)],
)
def test_rest_of_an_epoch_from_two_ranks_of_two_workers_on_one_rank_of_three(
    rows_dir, panel_dir, kind, order
):
    data = panel_dir if kind == "window" else rows_dir
    _resume_elsewhere(kind, data, order, 1, 3)


@pytest.mark.slow
@pytest.mark.parametrize("new_world, new_workers", [(1, 3), (4, 1), (2, 0)])
@pytest.mark.parametrize("kind, order", CASES)
def test_rest_of_an_epoch_under_any_topology_is_every_item_once(
    rows_dir, panel_dir, kind, order, new_world, new_workers
):
    data = panel_dir if kind == "window" else rows_dir
    _resume_elsewhere(kind, data, order, new_world, new_workers)


@pytest.mark.parametrize("kind", ["iterable", "map", "window"])
def test_eight_then_two_then_eight_workers_across_three_restarts(rows_dir, panel_dir, kind):
    data = panel_dir if kind == "window" else rows_dir
    got = collections.Counter()
    loader = _loader(kind, data, "shuffle", 0, 1, 8)
    list(loader)
    it = iter(loader)
    for _ in range(4):
        got.update(_items(kind, next(it)))
    state = loader.state_dict()
    del it, loader
    loader = _loader(kind, data, "shuffle", 0, 1, 2)
    loader.load_state_dict(state)
    it = iter(loader)
    for _ in range(5):
        got.update(_items(kind, next(it)))
    state = loader.state_dict()
    assert state  # the remainder's state carries the history of both topologies
    del it, loader
    loader = _loader(kind, data, "shuffle", 0, 1, 8)
    loader.load_state_dict(state)
    got.update(i for b in loader for i in _items(kind, b))
    assert got == _epoch1(kind, data, "shuffle", 1, 0)  # every item exactly once


def test_a_state_saved_on_the_last_batch_wraps_to_the_next_epoch(rows_dir):
    loader = _loader("iterable", rows_dir, "shuffle", 0, 1, 2)
    list(loader)
    n = len(list(iter(loader)))  # epoch 1
    loader = _loader("iterable", rows_dir, "shuffle", 0, 1, 2)
    list(loader)
    it = iter(loader)
    for _ in range(n):
        next(it)
    state = loader.state_dict()  # every batch of epoch 1 delivered
    del it, loader
    resumed = _loader("iterable", rows_dir, "shuffle", 0, 1, 0)
    resumed.load_state_dict(state)
    assert list(resumed) == []  # nothing left of epoch 1
    epoch2 = [b[1].tolist() for b in resumed]
    fresh = _loader("iterable", rows_dir, "shuffle", 0, 1, 0)
    list(fresh), list(fresh)
    assert epoch2 == [b[1].tolist() for b in fresh]


def test_changing_batch_size_or_the_order_on_resume_is_a_clear_error(rows_dir, panel_dir):
    loader = _loader("window", panel_dir, "shuffle", 0, 1, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    other = _loader("window", panel_dir, "shuffle", 0, 1, 2, batch_size=8)
    with pytest.raises(ValueError, match="saved with layout="):
        other.load_state_dict(state)
    ds = TsFileIterableDataset(rows_dir, batch_size=700, shuffle=True, seed=5, validate=False)
    next(iter(ds))
    again = TsFileIterableDataset(rows_dir, batch_size=700, shuffle=True, seed=6, validate=False)
    with pytest.raises(ValueError, match=r"saved with order=.*'seed': 5"):
        again.load_state_dict(ds.state_dict())


def _gloo_rank(rank, data, port, out, stop):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ds = TsFileIterableDataset(data, batch_size=700, shuffle=True, seed=5, return_timestamps=True)
    loader = make_loader(ds, num_workers=2, stateful=True)
    list(loader)
    it = iter(loader)
    seen = [t for _ in range(stop) for t in next(it)[1].tolist()]
    out.put((rank, seen, loader.state_dict(), ds.rank, ds.world_size))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_real_two_rank_gloo_job_resumes_on_one_process(rows_dir):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_gloo_rank, args=(r, rows_dir, port, out, 4)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [(r[3], r[4]) for r in results] == [(0, 2), (1, 2)]  # ranks from the process group
    got = collections.Counter(t for r in results for t in r[1])
    loader = _loader("iterable", rows_dir, "shuffle", 0, 1, 0)
    loader.load_state_dict(results[1][2])  # rank 1's state alone
    got.update(t for b in loader for t in b[1].tolist())
    assert sorted(got) == list(range(ROWS))  # every row once: 10,000 rows split evenly, no padding
    assert max(got.values()) == 1


def test_torch_save_of_a_state_round_trips(rows_dir, tmp_path):
    loader = _loader("map", rows_dir, "batches", 0, 1, 2)
    it = iter(loader)
    next(it)
    torch.save(loader.state_dict(), tmp_path / "state.pt")
    del it
    other = _loader("map", rows_dir, "batches", 0, 1, 0)
    other.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    assert len(list(other)) == len(loader) - 1


def test_a_mixture_resumes_the_rest_of_its_epoch_on_another_number_of_workers(panel_dir):
    import tsfile_torch as tt

    def build(workers):
        parts = [
            TsFileWindowDataset(
                panel_dir,
                20,
                5,
                stride=3,
                devices=devices,
                return_timestamps=True,
                validate=False,
            )  # fmt: skip
            for devices in (["meters.s0", "meters.s1"], ["meters.s2", "meters.s3"])
        ]
        mix = tt.MixedWindows(parts, weights=[1, 3], num_samples=400, seed=3)
        return make_loader(mix, batch_size=16, num_workers=workers, stateful=True)

    whole = build(2)
    list(whole)
    epoch1 = collections.Counter(i for b in whole for i in _items("window", b))
    loader = build(2)
    list(loader)
    it = iter(loader)
    got = collections.Counter(i for _ in range(5) for i in _items("window", next(it)))
    state = loader.state_dict()
    del it, loader
    resumed = build(0)
    resumed.load_state_dict(state)
    got.update(i for b in resumed for i in _items("window", b))
    assert got == epoch1 and sum(got.values()) == 400  # the draws of epoch 1, each once
