"""BlockCache's recycled buffers (Note: recycled buffers in tsfile_torch.read.blockcache)."""

from __future__ import annotations

import numpy as np

from tsfile_torch.read.blockcache import MIN_SPARE_BYTES, BlockCache


def test_a_spare_serves_a_block_of_fewer_rows_in_its_memory():
    cache = BlockCache(capacity=1 << 20, dtype=np.float32)
    first = cache.buffers(3, 1000)
    memory = first.spare[1]
    cache.recycle(first)
    cache.recycle(first)  # dropped twice: kept once, never handed out to two blocks
    smaller = cache.buffers(3, 900)  # a worker's stretch of random batches, a new shape
    assert smaller.values.shape == (3, 900) and smaller.values.flags.c_contiguous
    assert smaller.times.shape == (900,)
    assert np.shares_memory(smaller.values, memory)
    assert not np.shares_memory(cache.buffers(3, 900).values, memory)  # taken already
    larger = cache.buffers(3, 2000)  # no spare is large enough: new memory
    assert not np.shares_memory(larger.values, memory)


def test_spares_stay_within_the_capacity_dropping_the_smallest():
    cache = BlockCache(capacity=0, dtype=np.float64)
    rows = MIN_SPARE_BYTES // 16 // 3  # three such blocks fill the floor
    blocks = [cache.buffers(1, rows + k) for k in range(10)]  # not touched: no memory used
    for block in blocks:
        cache.recycle(block)
    assert cache._spare_bytes <= MIN_SPARE_BYTES
    kept = sorted(len(times) for times, _ in cache._spare[1])
    assert kept == [rows + k for k in range(10 - len(kept), 10)]  # the largest stay
