"""What every view shares: the core it holds, its passes, and what its loader needs.

A view (rows, windows, a mixture) is a torch dataset that holds a
:class:`~tsfile_torch.read.core.ReadingCore` (``view.core``; a mixture holds its datasets) and
a :class:`~tsfile_torch.sampling.passes.Passes` (``view.passes``), and maps its items to rows of
the core's tables. :class:`View` gives every view the same public surface by delegation
(``columns``, ``reader``, ``set_epoch``, ``state_dict``...); it neither reads nor keeps
state of its own. :meth:`View.loader_spec` says what :func:`tsfile_torch.make_loader` needs
(:class:`LoaderSpec`), so the loader checks no types.

Note: rank capture. DDP rank and world size are fixed when the dataset is built, in the process
that builds it: explicit ``rank=`` / ``world_size=``, else ``torch.distributed`` when it is
initialized, else the ``RANK`` / ``WORLD_SIZE`` environment variables, else (0, 1). They travel
to DataLoader workers by pickling, so fork, forkserver and spawn workers shard alike (a spawned
worker has no process group to ask).

Note: hand-over. With ``cache="disk"`` every process maps the same decoded file, and with
``cache="memory"`` make_loader's fork workers fill one store in anonymous shared memory the
main process made before they started (Note: shared memory store in
:mod:`tsfile_torch.read.memory`), so a batch a DataLoader worker finds kept there need not
travel as values: the worker returns a :class:`KeptBatch` (the request it was given: a few
numbers) and the main process serves the request from its own mapping of the same store (one
copy, as with ``num_workers=0``). Spawn and forkserver workers keep a memory store each: they
send values. A shuffled row batch is a gather, a copy wherever it is made: the worker
makes it, into its ring slot, so workers gather in parallel instead of the main process alone.
Any other batch a worker makes is carved from one shared-memory buffer
(:mod:`tsfile_torch.data.handover`), a slot of its ring. Only
:func:`tsfile_torch.make_loader`'s workers hand kept batches over (its ``worker_init_fn`` sets
``hand_over`` on the worker's cores), and its iterator turns every :class:`KeptBatch` back into
the batch before the user sees it.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.errors import warn_caller
from tsfile_torch.options import ReadOptions, check_bool, check_int
from tsfile_torch.read.reader import cache_cap
from tsfile_torch.sampling import orders, state

__all__ = ["EpochSampler", "KeptBatch", "LoaderSpec", "View", "resolve_rank"]


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Return (rank, world size) as fixed when a dataset is built (see Note: rank capture).

    Raises:
        ValueError: on a rank outside ``[0, world_size)``, one of the two given without the
            other, or unparsable ``RANK`` / ``WORLD_SIZE`` environment variables.
    """
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"rank and world_size go together: give both or neither; got rank={rank!r}, "
            f"world_size={world_size!r}"
        )
    source = "rank / world_size arguments"
    if rank is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
            source = "torch.distributed"
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            source = "the RANK / WORLD_SIZE environment variables"
            try:
                rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            except ValueError:
                raise ValueError(
                    f"RANK and WORLD_SIZE must be integers; got RANK={os.environ['RANK']!r}, "
                    f"WORLD_SIZE={os.environ['WORLD_SIZE']!r}"
                ) from None
        else:
            return 0, 1
    world_size = check_int("world_size", world_size, 1)
    rank = check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(
            f"rank should be in [0, world_size), but got rank={rank}, world_size={world_size} "
            f"(from {source})"
        )
    return rank, world_size


class KeptBatch:
    """A batch a DataLoader worker found kept in a store the main process maps too (the decoded
    disk cache, or a shared memory store; Note: hand-over).

    ``request``: what the dataset needs to serve it again from its own mapping.
    """

    __slots__ = ("request",)

    def __init__(self, request: tuple):
        self.request = request

    def pin_memory(self, device=None) -> KeptBatch:
        return self  # pinned once served, by the loader's iterator

    def __repr__(self) -> str:
        return f"KeptBatch({self.request!r})"


def data_fingerprint(parts) -> str:
    """Return a short stable digest of JSON-able ``parts``."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass
class LoaderSpec:
    """What :func:`tsfile_torch.make_loader` needs of a view (the view's :meth:`View.loader_spec`).

    ``windows``: items are single windows batched by the loader (``batch_size`` required, an
    :class:`EpochSampler` as ``batch_sampler``, ``collate_fn``); else the view yields whole
    batches (``batch_size`` must be None; a map-style one is visited by an
    :class:`EpochSampler` as ``sampler``). ``iterable``: an ``IterableDataset`` (its passes
    resume through the dataset, else through the sampler). ``cores``: the reading cores its
    workers read through (hand-over flags, worker reports). ``block_values``: values one
    read may decode first (for the timeout). ``serve``: turns a :class:`KeptBatch` back into
    the batch. ``epoch_sums()``: whether a full epoch now hands out every row once (checked
    against the metadata sums). ``main_pass(epoch, num_workers)``: begins an iterable view's
    fresh pass of ``num_workers`` workers, read in the calling process, in the order a
    DataLoader delivers it; returns (batches, iterator) (Note: kept passes in
    :mod:`tsfile_torch.loader`).
    """

    windows: bool
    iterable: bool
    cores: list
    block_values: int
    serve: Callable[[KeptBatch], Any]
    collate_fn: Callable | None = None
    num_batches: int | None = None
    epoch_sums: Callable[[], bool] | None = None
    slots: Any = field(default=None)
    main_pass: Callable[[int, int], tuple[int, Any]] | None = None
    #: its batches gather from many blocks (shuffled rows or windows): (rows, values per row)
    #: of the largest such block, for fork workers of a streaming loader to share what they
    #: decode (Note: block exchange in tsfile_torch.read.exchange); None: they do not
    gather_block: tuple[int, int] | None = None


class View:
    """The public surface every view shares, delegated to its core and passes (see module)."""

    #: short name of the kind, for messages and repr
    kind = "dataset"
    core: Any
    passes: Any

    # -- what the core holds -----------------------------------------------------------------
    @property
    def options(self) -> ReadOptions:
        return self.core.options

    @property
    def catalog(self):
        return self.core.catalog

    @property
    def tables(self):
        return self.core.tables

    @property
    def reader(self):
        """This process's reader, opened on first use and kept until :meth:`close`."""
        return self.core.reader

    @property
    def block_rows(self) -> int:
        """Rows decoded per native call (``block_rows=``, else the kind's default)."""
        return self.core.block_rows

    @property
    def skipped(self):
        """(file name, reason) of each file left out (``on_damaged="skip"``)."""
        return self.core.skipped

    @property
    def normalizer(self):
        """Applied to every value read (``normalize=``); hand it to a validation dataset."""
        return self.core.normalizer

    @property
    def backends(self) -> dict[str, str]:
        """File name -> backend its open reader really uses, in this process."""
        return self.core.backends

    @property
    def cached_bytes(self) -> int:
        """Bytes of decoded values held in this process (blocks, or the store)."""
        return self.core.cached_bytes

    @property
    def _slots(self):
        return self.core.slots

    def close(self) -> None:
        """Close this process's readers and drop decoded values (they reopen on the next read)."""
        self.core.close()

    # -- what the passes hold ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.passes.rank

    @property
    def world_size(self) -> int:
        return self.passes.world_size

    @property
    def epochs(self):
        return self.passes.epochs

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (later passes count on from it).

        Reaches DataLoader workers, persistent or not. Without it each pass is the next epoch.
        """
        self.passes.set_epoch(epoch)

    @property
    def epoch(self) -> int | None:
        """Epoch of the latest pass (or the one ``set_epoch`` named); ``None`` before any."""
        return self.passes.epoch

    @property
    def spec(self):
        """The order in force."""
        return self.order_spec

    def epoch_batches(self, epoch: int, batch_size: int | None = None, history: tuple = ()):
        """Return this rank's batches of ``epoch`` (arrays of items), before the worker split."""
        return self.passes.epoch_batches(epoch, batch_size, history)

    def _identity(self, batch_size: int | None = None) -> dict[str, Any]:
        return self.passes.identity(batch_size)

    def data_identity(self) -> dict[str, Any]:
        """What the items are made of, as short fingerprints by part (Note: state identity in
        :mod:`tsfile_torch.sampling.state`): the file base names, the columns, the rows of each
        table and the time cut, and the content (each column's time range and value statistics
        per shard, from the metadata). Not where the files lie, so a job moved to other paths
        or nodes resumes; a resume state saved over other data is refused, naming the part."""
        cat = self.catalog
        files = [os.path.basename(f.name.rstrip("/")) for f in cat.files]
        content = [
            [
                [s.start_time, s.end_time, s.num_rows, s.num_values, s.min, s.max, s.sum]
                for s in c.shards
            ]
            for c in cat.columns
        ]
        return {
            "files": data_fingerprint(files),
            "columns": data_fingerprint(cat.column_names),
            "rows": data_fingerprint([self.core.table_sizes, cat.start_time, cat.end_time]),
            "content": data_fingerprint(content),
        }

    def resume_elsewhere(self, epoch: int, history: tuple) -> None:
        """Make the next pass deliver the rest of ``epoch`` after ``history`` (any topology)."""
        self.passes.resume_elsewhere(epoch, history)

    def begin_main_pass(self) -> tuple[int, tuple]:
        """Decide the epoch of a loader's next pass here, in the main process (see
        :meth:`~tsfile_torch.sampling.passes.Passes.begin_main_pass`)."""
        return self.passes.begin_main_pass()

    def state_dict(self) -> dict[str, Any]:
        """Return where this process's latest pass stands (Note: resume in
        :mod:`tsfile_torch.sampling.passes`)."""
        return self.passes.state_dict()

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Make the next pass resume where ``saved`` stood; later passes count on from it.

        A state of the main process resumes under any number of workers and ranks (the rest of
        its epoch); a DataLoader worker's state only under the same topology.

        Raises:
            ValueError: ``saved`` comes from a dataset with another order, seed, batch size or
                data.
        """
        self.passes.load_state_dict(saved, type(self).__name__)

    def _begin_pass(self):
        """Start a pass here: a worker's share of it in a DataLoader worker."""
        info = tud.get_worker_info()
        if info is None:
            return self.passes.begin(), 0, 1
        cursor = self.passes.begin(info.id, info.num_workers, info.seed - info.id)
        return cursor, info.id, info.num_workers

    def __getstate__(self):
        out = self.__dict__.copy()
        out.pop("_running_loader", None)  # the main process's loader (make_loader)
        return out

    def __setstate__(self, saved):
        self.__dict__.update(saved)
        self.passes.bind(self)

    def __repr__(self) -> str:
        o = self.options
        return (
            f"{type(self).__name__}({len(self.catalog.files)} files, {len(self.columns)} "
            f"columns, {len(self)} items, order={self.order_spec.order!r}, "
            f"read_backend={o.read_backend!r}, cache={o.cache!r})"
        )


def warn_if_batch_exceeds_cache(options: ReadOptions, rows: int, num_columns: int) -> None:
    """Warn when one batch alone is larger than the streaming block cache."""
    if options.cache != "none" or options.cache_bytes == 0:
        return
    cap = options.cache_bytes if options.cache_bytes is not None else cache_cap()
    batch_bytes = rows * (num_columns * options.itemsize + 8)
    if batch_bytes > cap:
        warn_caller(
            f"one batch of {rows} rows x {num_columns} columns is {batch_bytes / 2**20:.0f} MiB, "
            f"more than the streaming cache's {cap / 2**20:.0f} MiB: blocks cannot be cached and "
            f"pages will be decoded more than once; use a smaller batch_size, fewer columns, or "
            f"a larger cache_bytes"
        )


class EpochSampler(tud.Sampler):
    """The sampler of every map-style dataset: this rank's batches of each epoch, in order.

    Each pass claims the dataset's next epoch in the main process (or the one ``set_epoch``
    named), so any loader behaves the same; its batches are those
    :meth:`View.epoch_batches` gives, in the order a loader with ``num_workers`` workers
    delivers them (:func:`~tsfile_torch.sampling.orders.delivered_order`), so each worker reads
    its own stretch. It yields what the dataset's ``__getitem__`` / ``__getitems__`` takes: a
    batch key (``batch_size=None``: the dataset yields whole batches) or a list of item indices
    (use it as ``batch_sampler``). Its passes save and load (epoch, position), so
    ``StatefulDataLoader`` resumes a pass by slicing the order.

    Args:
        dataset: a map-style tsfile-torch dataset.
        batch_size: items per batch for datasets of single items (windows); ``None`` for
            datasets whose items are batches.
        num_workers: the loader's ``num_workers`` (the delivered order deals batches to them).
        drop_last: leave out a batch shorter than ``batch_size`` (the last of this rank's
            epoch), as a DataLoader's ``drop_last=True`` does: make_loader's ``drop_last``
            for datasets of single items whose own ``drop_last`` is False.
    """

    def __init__(
        self,
        dataset,
        batch_size: int | None = None,
        num_workers: int = 0,
        drop_last: bool = False,
    ):
        if not isinstance(dataset, View):
            raise TypeError(
                f"EpochSampler needs a tsfile-torch dataset; got {type(dataset).__name__}"
            )
        self.dataset = dataset
        self.batch_size = check_int("batch_size", batch_size, 1, 2**40, allow_none=True)
        self.num_workers = check_int("num_workers", num_workers, 0, 1024)
        self.drop_last = check_bool("drop_last", drop_last)
        if drop_last and self.batch_size is None:
            raise ValueError(
                "drop_last=True goes with batch_size (items per batch); a dataset whose items "
                "are batches drops its own short batch: build it with drop_last=True"
            )
        self._held: state.Pass | None = None  # a loaded pass not begun yet
        self._ref = None  # the latest pass, by a weak reference (its iterator's owner has it)
        self._after: int | None = None  # the epoch after the latest finished pass

    @property
    def _latest(self) -> state.Pass | None:
        if self._held is not None:
            return self._held
        return self._ref() if self._ref is not None else None

    @_latest.setter
    def _latest(self, latest: state.Pass | None) -> None:
        # A pass keeps its sampler; the sampler keeps a begun pass only by a weak reference, so
        # the two make no reference cycle (one would keep the dataset, its files and mappings,
        # alive until a garbage collection). A loaded pass not begun is kept: nothing else has
        # it yet.
        waiting = latest is not None and not latest.begun and latest.pending is not None
        self._held = latest if waiting else None
        self._ref = weakref.ref(latest) if latest is not None else None

    def batches(self, epoch: int, history: tuple = ()) -> list[np.ndarray]:
        """Return this rank's batches of ``epoch`` (item arrays) in delivered order."""
        batches = self._planned(epoch, history)
        order = orders.delivered_order(batches, self.num_workers, self.dataset.spec.order)
        return [batches[i] for i in order]

    def _planned(self, epoch: int, history: tuple = ()) -> list[np.ndarray]:
        """Return this rank's batches of ``epoch`` before the worker split (``drop_last``: a
        short one left out; only the last can be short)."""
        batches = self.dataset.epoch_batches(epoch, self.batch_size, history)
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches = batches[:-1]
        return batches

    def identity(self) -> dict[str, Any]:
        out = self.dataset._identity(self.batch_size)
        if self.drop_last:  # absent otherwise: earlier states stay valid
            out = {**out, state.LAYOUT: [*out[state.LAYOUT], "loader drop_last"]}
        return out

    def point(self, epoch, position: int = 0, history: tuple = ()) -> state.PassPoint:
        """Return a pass point of this sampler's topology."""
        return state.PassPoint(epoch, position, *self._topology(), history)

    def _topology(self) -> tuple[int, int, int, int]:
        return 0, self.num_workers, self.dataset.rank, self.dataset.world_size

    def _loaded(self) -> state.Pass | None:
        """The loaded pass the next one resumes, if any (not begun, with a point)."""
        latest = self._latest
        return latest if latest is not None and latest.pending is not None else None

    def __len__(self) -> int:
        """Batches per epoch on this rank (of the pass in progress, else of the next)."""
        if self._latest is not None and self._latest.begun:
            return len(self._latest)
        return len(self._planned(self.dataset.epoch or 0))

    def __iter__(self) -> Iterator:
        run = self._loaded()  # a loaded state: this pass resumes it
        if run is None:
            run = state.Pass(self._topology())
        self._latest = run
        return self._run(run)

    def _run(self, run: state.Pass) -> Iterator:
        """Hand out the batch keys of pass ``run``, begun at its first batch (a DataLoader
        creates iterators it never uses)."""
        epoch, position, history = run.start(self.dataset.epochs, whole=True)
        run.begin(epoch, self.batches(epoch, history), position, history)
        self._latest = run  # begun: kept by a weak reference from now on
        for items in run:
            yield self.dataset._batch_key(items, self.batch_size)
        self._after = run.epoch + 1

    def state_dict(self) -> dict[str, Any]:
        """Return where the latest pass stands (see Note: resume)."""
        latest = self._latest
        if latest is None:
            point = self.point(self._after)
        elif not latest.begun:  # where it would begin
            point = latest.pending or self.point(self.dataset.epochs.peek())
        elif latest.finished:  # ran out: the next pass begins
            point = self.point(latest.epoch + 1)
        else:
            point = latest.point()
        return state.pass_state(point, self.identity())

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Make the next pass continue where ``saved`` stood.

        A state at the start of an epoch also sets the dataset's next epoch, so a pass begun
        afresh (a loader that starts a new iterator after loading) takes that epoch too.
        """
        point = state.check_state(saved, self.identity(), "EpochSampler")
        pending = None if point.epoch is None else point
        self._latest = state.Pass(self._topology(), pending)
        exact = pending is not None and pending.topology == self._topology()
        if pending is not None and (pending.position == 0 or not exact):
            self.dataset.epochs.set(pending.epoch)

    def resume_elsewhere(self, epoch: int, history: tuple) -> None:
        """Make the next pass deliver the rest of ``epoch`` after ``history`` (any topology).

        Raises:
            ValueError: with ``drop_last`` (what was delivered cannot be told from the
                dataset's order alone).
        """
        if self.drop_last:
            raise ValueError(
                "a state saved under another number of workers or ranks cannot resume a "
                "loader with drop_last=True over a dataset whose own drop_last is False: build "
                "the dataset with drop_last=True (and leave it out of make_loader)"
            )
        self._latest = state.Pass(self._topology(), self.point(epoch, 0, tuple(history)))
        self.dataset.epochs.set(epoch)

    def begin_main_pass(self) -> tuple[int, tuple]:
        """Return the epoch the next pass takes (claimed at its first batch) and the history it
        resumes after (Note: loader resume in :mod:`tsfile_torch.loader`)."""
        loaded = self._loaded()
        if loaded is not None:
            epoch, _, history = state.resume_point(loaded.pending, self._topology(), whole=True)
            return epoch, history
        return self.dataset.epochs.peek(), ()

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (the dataset's :meth:`View.set_epoch`)."""
        self.dataset.set_epoch(epoch)
