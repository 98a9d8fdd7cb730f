"""Orders and sharding: pure functions of integers, no I/O, no torch (Note: order is pure).

Every dataset is a sequence of **items** (rows, batches of rows, or windows) grouped into
**blocks** (items whose data lie in the same decoded block). One epoch's delivered batches on one
rank are a function of (order, seed, epoch, rank, world size, number of workers) and the items'
layout alone, computed in four steps written once here and used by every dataset:

1. **Order** (:func:`epoch_items`), picked by name from :data:`ORDERS`:
   ``"sequential"`` (items in order, delivered in order whatever the number of workers),
   ``"stretches"`` (items in order, each worker reading a stretch of its own: step 4),
   ``"batches" (a (seed, epoch) permutation of the items;
   the row datasets use it with whole batches as items: contiguous batches in random order),
   ``"shuffle"`` (a buffer shuffle, like MosaicML Streaming's and LitData's shuffle within
   shards: the blocks are permuted, taken ``shuffle_blocks`` at a time, and the items of each
   group permuted together: a batch mixes items from up to ``shuffle_blocks`` places, a
   process holds about that many decoded blocks, and each block is decoded about once per
   epoch) and ``"random"`` (``num_samples`` items drawn with replacement: uniformly, or with
   ``block_weights`` a block drawn with those probabilities, then an item of it uniformly:
   a window dataset's devices sampled uniformly, a mixture's datasets by their weights).
2. **Ranks** (:func:`shard_for_rank`): the epoch's items are padded by wrapping around (as
   ``DistributedSampler`` pads: at most ``world_size - 1`` repeated items) or trimmed
   (``drop_last``) to a multiple of the world size, and rank ``r`` takes the ``r``-th
   contiguous run, so ranks read different blocks and every rank gets the same count however
   few blocks there are.
3. **Batches** (:func:`cut_batches`): the rank's items cut in order into batches of
   ``batch_size`` items (the last one shorter unless ``drop_last``).
4. **Workers** (:func:`worker_batches`): ``"sequential"`` deals the rank's batches to the
   workers in turn (worker ``w`` yields batches ``w``, ``w + num_workers``, ...), so the
   DataLoader's round-robin delivery hands them out in row order, as a plain DataLoader over a
   ``SequentialSampler`` does; each worker then decodes blocks that hold the others' batches
   too. Every other order cuts the rank's batches into ``num_workers`` contiguous runs of
   (nearly) equal count; worker ``w`` yields run ``w`` in the epoch's order. Runs of the order
   itself where consecutive batches share blocks (``"stretches"``, ``"shuffle"``: a buffer's
   batches go to one worker), runs of the batches sorted by their first item where they do not
   (``"batches"``, ``"random"``). A worker thus reads its own stretch of the data (with
   ``"stretches"`` the same rows every epoch), and workers rarely decode the same block; the
   delivered order interleaves the stretches (batch 0, the first batch of the second stretch,
   batch 1, ...). The DataLoader hands out the workers' batches round-robin
   (:func:`interleave`), which is the order a map-style dataset's sampler yields too, so both
   kinds of dataset deliver the same batches in the same order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tsfile_torch.errors import warn_caller
from tsfile_torch.options import check_bool, check_choice, check_int, check_seed

__all__ = [
    "MAX_SAMPLES",
    "IN_ORDER",
    "ORDERS",
    "OrderSpec",
    "cut_batches",
    "epoch_items",
    "interleave",
    "plan_epoch",
    "remaining_items",
    "shard_for_rank",
    "worker_batches",
]

#: Orders by name (see the module notes).
ORDERS = ("sequential", "stretches", "batches", "shuffle", "random")
#: Orders whose items are in order (before the worker split).
IN_ORDER = ("sequential", "stretches")
#: Most items one epoch may draw with ``"random"`` (their indices alone take 2 GiB).
MAX_SAMPLES = 1 << 28
#: Padding above this fraction of an epoch's items is warned about.
PAD_WARNING = 0.05


@dataclass(frozen=True)
class OrderSpec:
    """How a dataset's items are ordered, validated once.

    Attributes:
        order: one of :data:`ORDERS`.
        seed: any integer, kept modulo 2**64.
        drop_last: trim ranks to equal counts and drop short last batches, instead of padding.
        shuffle_blocks: blocks whose items ``"shuffle"`` mixes together (the buffer).
        num_samples: items per epoch of ``"random"``.
        block_weights: with ``"random"``, the probability weight of each block (then an item
            of the drawn block, uniformly); ``None``: every item equally likely.
    """

    order: str = "sequential"
    seed: int = 0
    drop_last: bool = False
    shuffle_blocks: int = 16
    num_samples: int | None = None
    block_weights: tuple[float, ...] | None = None

    def __post_init__(self):
        check_choice("order", self.order, ORDERS)
        object.__setattr__(self, "seed", check_seed(self.seed))
        check_bool("drop_last", self.drop_last)
        object.__setattr__(
            self, "shuffle_blocks", check_int("shuffle_blocks", self.shuffle_blocks, 1, 2**31)
        )
        samples = check_int("num_samples", self.num_samples, 1, MAX_SAMPLES, allow_none=True)
        object.__setattr__(self, "num_samples", samples)
        if (self.order == "random") != (samples is not None):
            raise ValueError(
                "order='random' needs num_samples (items per epoch), and num_samples goes with "
                f"order='random' only; got order={self.order!r}, num_samples={samples!r}"
            )
        if self.block_weights is not None:
            weights = np.asarray(self.block_weights, dtype=np.float64)
            if self.order != "random" or not len(weights):
                raise ValueError("block_weights go with order='random' and at least one block")
            if not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
                raise ValueError(
                    f"block_weights must be finite, >= 0 and not all 0; got {self.block_weights}"
                )
            object.__setattr__(self, "block_weights", tuple(weights.tolist()))

    @property
    def identity(self) -> dict:
        """What the order depends on besides the epoch (saved and checked with a state)."""
        out = {
            "order": self.order,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "shuffle_blocks": self.shuffle_blocks,
            "num_samples": self.num_samples,
        }
        if self.block_weights is not None:  # absent otherwise: earlier states stay valid
            digest = hashlib.sha1(np.asarray(self.block_weights).tobytes()).hexdigest()[:16]
            out["block_weights"] = digest
        return out


def resolve_order(order: str | None, shuffle: bool | None, default: str = "sequential") -> str:
    """Return the order name from ``order=`` and the ``shuffle=`` shorthand.

    ``shuffle=True`` means ``order="shuffle"``; giving both is an error unless they agree.
    """
    if shuffle is not None:
        check_bool("shuffle", shuffle)
    if order is None:
        return "shuffle" if shuffle else default
    check_choice("order", order, ORDERS)
    if shuffle is not None and shuffle != (order not in IN_ORDER):
        raise ValueError(
            f"shuffle={shuffle} contradicts order={order!r}; pass one of them "
            f"(shuffle=True means order='shuffle')"
        )
    return order


def _rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, stream])


def epoch_items(spec: OrderSpec, block_starts: np.ndarray, epoch: int) -> np.ndarray:
    """Return the items of one epoch, in order, before sharding.

    Args:
        spec: the order.
        block_starts: first item of every block, increasing, then the number of items
            (``len(block_starts) - 1`` blocks).
        epoch: the epoch.
    """
    count = int(block_starts[-1])
    if spec.order in IN_ORDER:
        return np.arange(count, dtype=np.int64)
    if spec.order == "batches":
        return _rng(spec.seed, epoch, 0).permutation(count).astype(np.int64)
    if spec.order == "random" and spec.block_weights is not None:
        return _weighted_draw(spec, block_starts, epoch)
    if spec.order == "random":
        return _rng(spec.seed, epoch, 1).integers(0, count, size=spec.num_samples, dtype=np.int64)
    rng = _rng(spec.seed, epoch, 2)
    blocks = rng.permutation(len(block_starts) - 1)
    parts = []
    for g in range(0, len(blocks), spec.shuffle_blocks):
        members = np.concatenate(
            [
                np.arange(block_starts[b], block_starts[b + 1])
                for b in blocks[g : g + spec.shuffle_blocks]
            ]
        )
        parts.append(rng.permutation(members))
    return np.concatenate(parts).astype(np.int64) if parts else np.empty(0, np.int64)


def _weighted_draw(spec: OrderSpec, block_starts: np.ndarray, epoch: int) -> np.ndarray:
    """Draw ``num_samples`` items: a block by ``block_weights``, then an item of it uniformly."""
    starts = np.asarray(block_starts, dtype=np.int64)
    sizes = np.diff(starts)
    weights = np.asarray(spec.block_weights, dtype=np.float64)
    if len(weights) != len(sizes):
        raise ValueError(
            f"block_weights has {len(weights)} weights for {len(sizes)} blocks; give one per block"
        )
    weights = np.where(sizes > 0, weights, 0.0)
    if weights.sum() <= 0:
        raise ValueError("block_weights put every weight on empty blocks; nothing to draw")
    rng = _rng(spec.seed, epoch, 3)
    blocks = rng.choice(len(weights), size=spec.num_samples, p=weights / weights.sum())
    within = (rng.random(spec.num_samples) * sizes[blocks]).astype(np.int64)
    return (starts[blocks] + np.minimum(within, sizes[blocks] - 1)).astype(np.int64)


def rank_count(count: int, world_size: int, drop_last: bool) -> int:
    """Return the items each rank gets of ``count`` (see the module notes)."""
    return count // world_size if drop_last else -(-count // world_size)


def check_sharding(count: int, world_size: int, drop_last: bool, what: str = "items") -> None:
    """Raise if ranks would get nothing; warn if padding repeats more than 5% of the items."""
    per_rank = rank_count(count, world_size, drop_last)
    if per_rank == 0:
        raise ValueError(
            f"{count} {what} per epoch cannot be shared by {world_size} ranks with "
            f"drop_last=True: every rank would get none; use drop_last=False, fewer ranks or "
            f"more data"
        )
    pad = per_rank * world_size - count
    if pad > PAD_WARNING * count:
        warn_caller(
            f"{count} {what} per epoch over {world_size} ranks: {pad} are repeated to give every "
            f"rank {per_rank} ({pad / count:.0%}); drop_last=True trims instead"
        )


def shard_for_rank(items: np.ndarray, rank: int, world_size: int, drop_last: bool) -> np.ndarray:
    """Return rank ``rank``'s contiguous run of ``items`` (equal counts on every rank)."""
    if world_size == 1:
        return items
    per_rank = rank_count(len(items), world_size, drop_last)
    if len(items) and len(items) < per_rank * world_size:  # wrap around, as DistributedSampler
        items = np.resize(items, per_rank * world_size)
    return items[rank * per_rank : (rank + 1) * per_rank]


def cut_batches(items: np.ndarray, batch_size: int, drop_last: bool) -> list[np.ndarray]:
    """Cut ``items`` in order into batches of ``batch_size`` (the last shorter unless drop_last)."""
    stop = len(items) - len(items) % batch_size if drop_last else len(items)
    return [items[i : min(i + batch_size, stop)] for i in range(0, stop, batch_size)]


#: Orders whose consecutive batches share blocks: workers take runs of the order itself.
LOCAL_ORDERS = ("stretches", "shuffle")


def worker_batches(
    batches: Sequence[np.ndarray], worker: int, num_workers: int, order: str = "sequential"
) -> list[int]:
    """Return the indices into ``batches`` that worker ``worker`` of ``num_workers`` yields."""
    if num_workers <= 1:
        return list(range(len(batches)))
    if order == "sequential":  # dealt in turn: delivered in order
        return list(range(worker, len(batches), num_workers))
    bounds = np.linspace(0, len(batches), num_workers + 1).round().astype(np.int64)
    if order in LOCAL_ORDERS:
        return list(range(bounds[worker], bounds[worker + 1]))
    homes = np.array([int(b.min()) if len(b) else 0 for b in batches], dtype=np.int64)
    by_home = np.argsort(homes, kind="stable")
    return sorted(by_home[bounds[worker] : bounds[worker + 1]].tolist())


def interleave(runs: Sequence[Sequence[int]]) -> list[int]:
    """Return the runs' elements round-robin (the DataLoader's order over its workers)."""
    longest = max((len(r) for r in runs), default=0)
    return [r[i] for i in range(longest) for r in runs if i < len(r)]


def plan_epoch(
    spec: OrderSpec,
    block_starts: np.ndarray,
    epoch: int,
    rank: int,
    world_size: int,
    batch_size: int,
    history: Sequence[Sequence[int]] = (),
) -> list[np.ndarray]:
    """Return rank ``rank``'s batches of ``epoch`` (steps 1 to 3 of the module notes).

    ``history`` (Note: elastic resume): what earlier topologies already delivered of this
    epoch; the batches are then those of the epoch's remaining items.
    """
    items = remaining_items(spec, block_starts, epoch, batch_size, history)
    return cut_batches(
        shard_for_rank(items, rank, world_size, spec.drop_last), batch_size, spec.drop_last
    )


def remaining_items(
    spec: OrderSpec,
    block_starts: np.ndarray,
    epoch: int,
    batch_size: int,
    history: Sequence[Sequence[int]] = (),
) -> np.ndarray:
    """Return the items of ``epoch`` not delivered yet, in the epoch's order.

    Note: elastic resume. A pass interrupted under one topology (world size, number of workers)
    and resumed under another is described by its ``history``: one ``(world_size,
    num_workers, batches)`` segment per topology it ran under, ``batches`` being what each rank
    had delivered then (ranks deliver the same number of batches, so one rank's count speaks
    for all). Each segment removes, from the items left by the segments before it, every item
    some rank delivered under that topology (in the delivered order of :func:`delivered_order`,
    padding repeats included); the items left are sharded and batched under the current
    topology as a whole epoch would be. Pure: any process computes the same remainder.
    """
    items = epoch_items(spec, block_starts, epoch)
    positions = np.arange(len(items), dtype=np.int64)
    for world_size, num_workers, delivered in history:
        gone = []
        for rank in range(world_size):
            chunk = shard_for_rank(positions, rank, world_size, spec.drop_last)
            batches = cut_batches(chunk, batch_size, spec.drop_last)
            order = delivered_order([items[b] for b in batches], num_workers, spec.order)
            gone += [batches[i] for i in order[:delivered]]
        if gone:
            positions = positions[~np.isin(positions, np.concatenate(gone))]
    return items[positions]


def delivered_order(
    batches: Sequence[np.ndarray], num_workers: int, order: str = "sequential"
) -> list[int]:
    """Return the indices into ``batches`` in the order a loader with ``num_workers`` delivers."""
    runs = [worker_batches(batches, w, num_workers, order) for w in range(max(num_workers, 1))]
    return interleave(runs)
