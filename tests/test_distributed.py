"""Real DDP ranks (gloo): every rank gets the same number of batches, each batch once.

Ranks start with spawn; their DataLoader workers start with each start method, so the rank and
world size a worker uses must have travelled in the pickled dataset (a spawned or forkserver
worker has no process group to ask).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader, synthetic


def _check_rows(values: torch.Tensor, rows: np.ndarray) -> None:
    """The small dataset's first and last columns at ``rows``, exactly (timestamp = row)."""
    expected_first = synthetic.value_of(0, 0, rows).astype(np.float32)
    expected_last = synthetic.value_of(2, 5, rows).astype(np.float32)
    np.testing.assert_array_equal(values[:, 0].numpy(), expected_first)
    np.testing.assert_array_equal(values[:, -1].numpy(), expected_last)


def _rank_main(rank: int, world: int, store_path: str, data: str, out: str, context) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        kinds = {  # rank and world size come from the process group
            # rows shuffled within the buffer: 5000 rows, 2500 a rank in batches of 700
            "iterable": TsFileIterableDataset(
                data, batch_size=700, shuffle=True, seed=3, return_timestamps=True
            ),
            # 8 batches of rows in a (seed, epoch) permutation
            "map": TsFileDataset(
                data, batch_size=700, order="batches", seed=3, return_timestamps=True
            ),
        }
        results = {}
        for name, ds in kinds.items():
            loader = make_loader(ds, num_workers=2, multiprocessing_context=context)
            for epoch in range(2):  # no set_epoch: each pass is the next epoch on every rank
                times = []
                for values, batch_times in loader:
                    _check_rows(values, batch_times.numpy())
                    times.append(batch_times.numpy())
                counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
                # would hang if ranks disagreed on the number of steps
                dist.all_gather(counts, torch.tensor([len(times)]))
                results[f"{name}{epoch}"] = np.concatenate(times)
                results[f"{name}{epoch}_firsts"] = np.array([int(t[0]) for t in times])
                results[f"{name}{epoch}_len"] = np.array([len(times), len(loader)])
        np.savez(os.path.join(out, f"rank{rank}.npz"), **results)
    finally:
        dist.destroy_process_group()


def _run_ranks(world: int, data, tmp_path, context: str) -> list[dict]:
    mp.start_processes(
        _rank_main,
        args=(world, str(tmp_path / "store"), str(data), str(tmp_path), context),
        nprocs=world,
        start_method="spawn",
    )
    return [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(world)]


@pytest.mark.parametrize(
    "context",
    [
        "fork",
        # ranks x workers each import torch afresh: ~10 s and ~50 s on 2 cores (.ci/run runs them)
        pytest.param("forkserver", marks=pytest.mark.slow),
        pytest.param("spawn", marks=pytest.mark.slow),
    ],
)
def test_two_ranks_with_two_workers_split_every_epoch(small_dir, tmp_path, context):
    per_rank = _run_ranks(2, small_dir, tmp_path, context)
    for name in ("iterable0", "iterable1", "map0", "map1"):
        # 4 batches a rank, not 8; len(loader) is the per-rank count
        assert [list(p[f"{name}_len"]) for p in per_rank] == [[4, 4], [4, 4]]
        rows = np.concatenate([p[name] for p in per_rank])  # row r has timestamp r
        assert sorted(rows.tolist()) == list(range(5000))  # each row once across the ranks
    for p in per_rank:  # the map dataset's batches are whole batches of 700 rows
        assert {int(f) % 700 for f in p["map0_firsts"]} == {0}
    for name in ("iterable", "map"):
        for p in per_rank:  # epoch 1 is a new order on each rank
            assert not np.array_equal(p[f"{name}0"], p[f"{name}1"])


@pytest.mark.slow  # three spawned ranks: ~20 s on 2 cores
def test_three_ranks_pad_to_equal_counts(small_dir, tmp_path):
    per_rank = _run_ranks(3, small_dir, tmp_path, "fork")
    # 8 batches padded to 9 by wrapping around: 3 a rank
    assert [int(p["map0_len"][0]) for p in per_rank] == [3, 3, 3]
    firsts = np.concatenate([p["map0_firsts"] for p in per_rank]).tolist()
    assert set(firsts) == set(range(0, 5000, 700)) and len(firsts) == 9
    # 5000 shuffled rows padded to 5001: 1667 rows a rank, in batches of 700, 700 and 267
    assert [int(p["iterable0_len"][0]) for p in per_rank] == [3, 3, 3]
    rows = np.concatenate([p["iterable0"] for p in per_rank]).tolist()
    assert [len(p["iterable0"]) for p in per_rank] == [1667] * 3
    assert set(rows) == set(range(5000)) and len(rows) == 5001
