"""Gathers and random windows keep whole blocks in the store (memory or disk), so workers serve
shuffled and random epochs from it once every block was read (Note: hand-over in view.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch.utils.data as tud

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader

BLOCK = 1000  # the small dataset's 5,000 rows are 5 blocks


def _kept_blocks(core) -> list[bool]:
    store = core.store()
    return [store.has(0, lo, min(lo + BLOCK, 5000)) for lo in range(0, 5000, BLOCK)]


def test_a_shuffled_batch_keeps_the_whole_blocks_its_rows_fall_in(small_dir, small_expected):
    ds = TsFileIterableDataset(
        small_dir, batch_size=100, order="shuffle", shuffle_blocks=1, block_rows=BLOCK,
        cache="memory", return_timestamps=True, seed=4,
    )  # fmt: skip
    values, times = next(iter(ds))
    block = int(times[0]) // BLOCK
    assert (times.numpy() // BLOCK == block).all()  # one block per shuffle buffer
    np.testing.assert_array_equal(values.numpy(), small_expected[times.numpy()].astype(np.float32))
    assert _kept_blocks(ds.core) == [b == block for b in range(5)]


def test_a_random_window_keeps_the_blocks_it_spans(small_dir, small_expected):
    ds = TsFileDataset(
        small_dir, batch_size=300, random_batches=1, block_rows=BLOCK, cache="memory",
        return_timestamps=True, seed=2,
    )  # fmt: skip
    values, times = ds[0]
    first, last = int(times[0]) // BLOCK, int(times[-1]) // BLOCK
    np.testing.assert_array_equal(values.numpy(), small_expected[times.numpy()].astype(np.float32))
    assert _kept_blocks(ds.core) == [first <= b <= last for b in range(5)]


def _sorted(batches) -> list[np.ndarray]:
    return sorted(batches, key=lambda b: b[0].tolist())


def _with_kept_rows(batch):
    """A collate_fn that also says how many rows this worker's memory store keeps."""
    return batch, int(tud.get_worker_info().dataset.core.store().filled.sum())


@pytest.mark.parametrize("order", ["shuffle", "random"])
def test_workers_keep_whole_blocks_of_shuffled_and_random_epochs(small_dir, order):
    options = dict(order=order, block_rows=BLOCK, seed=9, batch_size=250)
    if order == "random":
        options["random_batches"] = 12
    streamed = make_loader(TsFileIterableDataset(small_dir, **options))
    want = [_sorted(b.numpy() for b in streamed) for _ in range(4)]  # epochs 0-3
    ds = TsFileIterableDataset(small_dir, cache="memory", **options)
    loader = make_loader(ds, num_workers=2, collate_fn=_with_kept_rows)
    kept = []
    for epoch in range(4):
        got = list(loader)
        # the same batches as without workers (dealt to workers in turn: in another order)
        for batch, expected in zip(_sorted(b.numpy() for b, _ in got), want[epoch], strict=True):
            np.testing.assert_array_equal(batch, expected)
        kept.extend(rows for _, rows in got)
    # each worker keeps every block it read whole (kept one batch at a time, it would hold
    # only the rows it was dealt): after the first shuffled epoch, every row
    assert kept and all(rows % BLOCK == 0 for rows in kept)
    if order == "shuffle":
        assert kept[-4:] == [5000] * 4
