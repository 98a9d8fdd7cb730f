"""Real DDP ranks (gloo, two processes): every rank gets the same number of batches, each once."""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tsfile_torch import TsFileIterableDataset


def _rank_main(rank: int, world: int, store_path: str, data: str, out: str) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        ds = TsFileIterableDataset(data, batch_size=700, shuffle=True, seed=3)  # 8 batches
        ds.set_epoch(1)
        firsts = [float(b[0, 0]) for b in ds]
        count = torch.tensor([len(firsts)])
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
        dist.all_gather(counts, count)  # would hang if ranks disagreed on the number of steps
        np.save(os.path.join(out, f"rank{rank}.npy"), np.array(firsts + [len(ds)]))
    finally:
        dist.destroy_process_group()


def test_ranks_get_equal_counts_and_cover_every_batch(small_dir, small_expected, tmp_path):
    world = 3
    mp.start_processes(
        _rank_main,
        args=(world, str(tmp_path / "store"), str(small_dir), str(tmp_path)),
        nprocs=world,
        start_method="spawn",
    )
    per_rank = [np.load(tmp_path / f"rank{r}.npy") for r in range(world)]
    assert {len(p) for p in per_rank} == {4}  # 8 batches padded to 9: 3 each (+ len)
    assert all(p[-1] == 3 for p in per_rank)  # len(ds) is the per-rank count
    firsts = np.concatenate([p[:-1] for p in per_rank])
    batch_firsts = small_expected[::700, 0].astype(np.float32)
    assert set(firsts.tolist()) == set(batch_firsts.tolist())  # all 8 batches, one repeated
