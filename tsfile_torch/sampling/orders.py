"""Batch order and sharding: pure functions of integers, no I/O, no torch.

Every order is a function of (seed, epoch, rank, world_size, worker, num_workers) alone
(Note: order is pure), so two processes that agree on those agree on every batch.

Sharding rules:
- Across DDP ranks the epoch's items are dealt round-robin (``items[rank::world_size]``), after
  padding by wrapping around (``drop_last=False``) or truncating (``drop_last=True``) to a
  multiple of ``world_size``: every rank gets the same count, so collective ops never hang.
- Across DataLoader workers of one rank the rows are cut into ``num_workers`` contiguous
  ranges (on batch boundaries) and each worker yields, in the epoch's order, the rank's items
  that start in its range (:func:`worker_row_range`). A worker thus reads the same rows every
  epoch and only those, so no two workers decode the same pages and each worker's block cache
  stays warm. The DataLoader interleaves the workers' outputs: with ``num_workers > 1`` and
  ``shuffle=False`` batches are in row order within each worker's range, not globally.

Note: epoch word. Every pass over a dataset is the next epoch unless ``set_epoch`` named one.
The epoch lives in one 64-bit word of shared memory created with the dataset (the main process
owns it; fork, forkserver and spawn workers all map it): the epoch of the latest pass, whether
``set_epoch`` wrote it since (then the next pass takes it as is), and who claimed it: the pid of
that pass's worker 0 and a tag of the pass (from the loader's base seed, drawn in the main
process for every new iterator, and the number of passes the worker's copy of the dataset has
made, which tells a persistent worker's passes apart). Worker 0 claims each pass and writes
the word; every other worker computes the same epoch from the word it reads, without waiting:
a word with its own tag written by a live worker 0 is its pass's claim, any other word is the
state before that claim (:func:`next_epoch`). A dead claimer means an earlier loader, even if
its tag is the same (a DataLoader rebuilt each epoch with the same seeded generator). With
``num_workers=0`` the main process claims each pass itself. One word is read and written
whole, so no lock is needed. Limit: one loader at a time over one dataset object.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "batch_starts",
    "epoch_items",
    "random_window_starts",
    "shard_for_rank",
    "num_batches",
    "worker_row_range",
    "shard_by_rows",
    "pack_epoch_word",
    "unpack_epoch_word",
    "EpochWord",
    "next_epoch",
    "pass_tag",
    "MAX_EPOCH",
]

#: Largest epoch the epoch word holds (see Note: epoch word).
MAX_EPOCH = (1 << 24) - 2
_PID_BITS, _TAG_BITS = 22, 16  # Linux pids fit 22 bits; elsewhere they are masked to 22


def num_batches(num_rows: int, batch_size: int, drop_last: bool) -> int:
    """Return how many batches ``num_rows`` rows make (the last partial one unless drop_last)."""
    return num_rows // batch_size if drop_last else -(-num_rows // batch_size)


def batch_starts(num_rows: int, batch_size: int, drop_last: bool) -> np.ndarray:
    """Return the first row of each batch, in row order."""
    return np.arange(num_batches(num_rows, batch_size, drop_last), dtype=np.int64) * batch_size


def _rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, stream])


def epoch_items(count: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """Return item indices ``0..count-1`` of one epoch: in order, or a (seed, epoch) permutation."""
    if not shuffle:
        return np.arange(count, dtype=np.int64)
    return _rng(seed, epoch, 0).permutation(count).astype(np.int64)


def random_window_starts(
    num_rows: int, batch_size: int, count: int, seed: int, epoch: int
) -> np.ndarray:
    """Return ``count`` window starts drawn uniformly from ``[0, num_rows - batch_size]``.

    A dataset shorter than one batch gives windows starting at 0 (one short window each).
    """
    high = max(num_rows - batch_size, 0)
    return _rng(seed, epoch, 1).integers(0, high + 1, size=count, dtype=np.int64)


def shard_for_rank(items: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Return the items of one DDP rank; every rank gets the same count (see module notes)."""
    if world_size == 1:
        return items
    if drop_last:
        items = items[: len(items) - len(items) % world_size]
    elif len(items) % world_size and len(items):
        pad = world_size - len(items) % world_size
        items = np.concatenate([items, np.resize(items, pad)])
    return items[rank::world_size]


def worker_row_range(
    num_rows: int,
    batch_size: int,
    worker: int,
    num_workers: int,
) -> tuple[int, int]:
    """Return the rows ``[start, stop)`` whose batches worker ``worker`` owns.

    Batch starts are split into ``num_workers`` contiguous runs of (nearly) equal count.
    """
    count = -(-num_rows // batch_size)
    bounds = np.linspace(0, count, num_workers + 1).round().astype(np.int64) * batch_size
    return int(bounds[worker]), int(min(bounds[worker + 1], num_rows))


def shard_by_rows(starts: np.ndarray, start_row: int, stop_row: int) -> np.ndarray:
    """Return the items (first rows) that start inside ``[start_row, stop_row)``, order kept."""
    return starts[(starts >= start_row) & (starts < stop_row)]


class EpochWord(NamedTuple):
    """The fields of the epoch word (see Note: epoch word)."""

    epoch: int  # -1: no pass yet
    explicit: bool  # set_epoch wrote it: the next pass takes it as is
    pid: int  # worker 0 that claimed it, masked to 22 bits; 0: the main process or set_epoch
    tag: int  # tag of the claiming pass (pass_tag); 0: the main process or set_epoch


def pack_epoch_word(epoch: int, explicit: bool, pid: int = 0, tag: int = 0) -> int:
    """Return the epoch word of these fields (a non-negative int64)."""
    pid &= (1 << _PID_BITS) - 1
    word = (epoch + 1) << 1 | int(explicit)
    return (word << _PID_BITS | pid) << _TAG_BITS | tag


def unpack_epoch_word(word: int) -> EpochWord:
    """Return the fields of an epoch word."""
    tag = word & ((1 << _TAG_BITS) - 1)
    pid = (word >> _TAG_BITS) & ((1 << _PID_BITS) - 1)
    rest = word >> (_TAG_BITS + _PID_BITS)
    return EpochWord((rest >> 1) - 1, bool(rest & 1), pid, tag)


def next_epoch(word: EpochWord) -> int:
    """Return the epoch a new pass claims after ``word``: the one set, else the next."""
    return word.epoch if word.explicit else word.epoch + 1


def pass_tag(base_seed: int, passes: int) -> int:
    """Return the tag of a DataLoader pass, in ``[1, 65535]`` (see Note: epoch word).

    Consecutive passes of the same workers (``passes`` and ``passes + 1``) never share a tag.
    """
    mixed = int(np.random.SeedSequence(base_seed % (1 << 64)).generate_state(1)[0])
    return 1 + (mixed + passes) % ((1 << _TAG_BITS) - 1)
