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
``set_epoch`` wrote it since (then the next pass takes it as is), and the key of the pass that
claimed it. A pass run by DataLoader workers is keyed by the loader's base seed (drawn afresh in
the main process for every new iterator) and the number of passes the worker's copy of the
dataset has made (what tells persistent workers' passes apart). Worker 0 claims the pass and
writes the word; the other workers compute the same epoch from the word they read without
waiting, before or after that write (:func:`claim_epoch`). With ``num_workers=0`` the main
process claims each pass itself. One word means one reading store and one writing store, so no
lock is needed. Limits: one loader at a time over one dataset object, and a loader whose base
seed repeats exactly (the global torch RNG reseeded identically before every pass) should call
``set_epoch``.
"""

from __future__ import annotations

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
    "claim_epoch",
    "pass_key",
    "MAX_EPOCH",
]

#: Largest epoch the epoch word holds (see Note: epoch word).
MAX_EPOCH = (1 << 30) - 2
_KEY_MASK = (1 << 32) - 1


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


def pack_epoch_word(epoch: int, explicit: bool, key: int) -> int:
    """Return the epoch word: ``epoch`` (-1: no pass yet), set by ``set_epoch``, pass ``key``."""
    return ((epoch + 1) << 33) | (int(explicit) << 32) | (key & _KEY_MASK)


def unpack_epoch_word(word: int) -> tuple[int, bool, int]:
    """Return ``(epoch, explicit, key)`` of an epoch word."""
    return (word >> 33) - 1, bool((word >> 32) & 1), word & _KEY_MASK


def claim_epoch(word: int, key: int) -> tuple[int, int]:
    """Return the epoch of the pass ``key`` and the word once that pass has claimed it.

    ``key`` 0 is a pass of the main process, always new. Otherwise a word already holding
    ``key`` means this pass claimed it already; any other word is the state before the claim.
    """
    epoch, explicit, last_key = unpack_epoch_word(word)
    if key and key == last_key:
        return epoch, word
    epoch = epoch if explicit else epoch + 1
    return epoch, pack_epoch_word(epoch, False, key)


def pass_key(base_seed: int, passes: int) -> int:
    """Return the non-zero 32-bit key of a DataLoader pass (see Note: epoch word)."""
    mixed = np.random.SeedSequence([base_seed % (1 << 64), passes]).generate_state(1)[0]
    return int(mixed) or 1
