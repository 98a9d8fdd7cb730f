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
        kinds = {
            "iterable": TsFileIterableDataset(
                data, batch_size=700, shuffle=True, seed=3, return_timestamps=True
            ),  # 8 batches
            "map": TsFileDataset(data, batch_size=700, return_timestamps=True),
        }
        results = {}
        for name, ds in kinds.items():
            loader = make_loader(
                ds, num_workers=2, shuffle=name == "map", multiprocessing_context=context
            )
            for epoch in range(2):  # no set_epoch: each pass is the next epoch on every rank
                firsts = []
                for values, times in loader:
                    _check_rows(values, times.numpy())
                    firsts.append(int(times[0]))
                counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
                # would hang if ranks disagreed on the number of steps
                dist.all_gather(counts, torch.tensor([len(firsts)]))
                results[f"{name}{epoch}"] = np.array(firsts + [len(loader)])
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
    every_batch = set(range(0, 5000, 700))
    for name in ("iterable0", "iterable1", "map0", "map1"):
        firsts = [p[name][:-1] for p in per_rank]
        assert [len(f) for f in firsts] == [4, 4]  # 8 batches: 4 per rank, not 8
        assert [p[name][-1] for p in per_rank] == [4, 4]  # len(loader) is the per-rank count
        assert set(np.concatenate(firsts).tolist()) == every_batch  # each batch once
    for name in ("iterable", "map"):
        orders = [np.concatenate([p[f"{name}{e}"][:-1] for p in per_rank]) for e in (0, 1)]
        assert not np.array_equal(orders[0], orders[1])  # epoch 1 is a new permutation


@pytest.mark.slow  # three spawned ranks: ~20 s on 2 cores
def test_three_ranks_pad_to_equal_counts(small_dir, tmp_path):
    per_rank = _run_ranks(3, small_dir, tmp_path, "fork")
    firsts = [p["iterable0"][:-1] for p in per_rank]
    assert [len(f) for f in firsts] == [3, 3, 3]  # 8 batches padded to 9 by wrapping around
    everything = np.concatenate(firsts).tolist()
    assert set(everything) == set(range(0, 5000, 700)) and len(everything) == 9
