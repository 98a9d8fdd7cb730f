"""Row datasets: batches of ``batch_size`` rows x every selected column.

:class:`TsFileIterableDataset` and :class:`TsFileDataset` are the row views of a
:class:`~tsfile_torch.read.core.ReadingCore` (:mod:`tsfile_torch.data.view`): one table of
every selected column (positional rows, or aligned on time with ``align=``).
Their items depend on the order:

- ``"sequential"`` / ``"stretches"`` / ``"batches"``: an item is a batch of consecutive rows
  (batch ``i`` is rows ``[i * batch_size, (i + 1) * batch_size)``), in row order (with
  DataLoader workers: still in row order, or each worker's stretch of rows, interleaved) or in
  a (seed, epoch) permutation;
- ``"shuffle"``: an item is a row, shuffled within a buffer of ``shuffle_blocks`` blocks of
  ``block_rows`` rows (see :mod:`tsfile_torch.sampling.orders`): each batch holds rows from many
  places, new every epoch, rows inside a batch in time order;
- ``"random"`` (``random_batches=N``): an item is a batch of consecutive rows starting at a
  uniformly random row, ``N`` per epoch.

Note: row fill. ``fill=`` says what a null holds in a batch, with or without ``align=``:
``"nan"`` leaves NaN, ``"zero"`` writes 0 (in the values handed out, after ``normalize=``),
``"ffill"`` carries the last value of the column read earlier in the same batch, NaN before the
first. A batch never borrows from outside itself, so it does not depend on which batches were
read before it, by which process, or in what order (as a window's fill, see
:func:`~tsfile_torch.data.features.fill_missing`). Batches of consecutive rows (every order but
``"shuffle"``) carry along time; a ``"shuffle"`` batch holds rows from many places, where a
carried value would be an unrelated row's: ``fill="ffill"`` with ``order="shuffle"`` is a
ValueError when the metadata counts nulls in the selected columns (or cannot rule them out: a
time range cut them). With ``align=``, a row where a series has no sample takes its fill as
before, over the whole series (:mod:`tsfile_torch.read.align`: ffill carries the last earlier
sample, from whatever batch; zero is a 0 read, then normalized); the batch's fill then applies to
the nulls that remain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch import compat, mechanisms
from tsfile_torch.catalog.build import Catalog, lay_out
from tsfile_torch.data.features import fill_missing
from tsfile_torch.data.handover import as_tensor, batch_arrays
from tsfile_torch.data.normalize import make_normalizer
from tsfile_torch.data.view import (
    KeptBatch,
    LoaderSpec,
    View,
    resolve_rank,
    warn_if_batch_exceeds_cache,
)
from tsfile_torch.options import ReadOptions, check_int
from tsfile_torch.read.core import ReadingCore, cell_grid
from tsfile_torch.sampling import orders
from tsfile_torch.sampling.orders import OrderSpec
from tsfile_torch.sampling.passes import Passes
from tsfile_torch.sampling.state import SharedInt

__all__ = ["ItemBatch", "TsFileDataset", "TsFileIterableDataset"]


@dataclasses.dataclass(frozen=True)
class ItemBatch:
    """What :class:`~tsfile_torch.data.view.EpochSampler` hands a dataset: one batch's items."""

    items: np.ndarray


class _Rows(View):
    """What both row datasets share: their items, and reading a batch of them."""

    kind = "row dataset"

    def __init__(
        self,
        sources,
        columns: Sequence[str] | str | None = None,
        batch_size: int = 8192,
        shuffle: bool | None = None,
        seed: int = 0,
        drop_last: bool = False,
        random_batches: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        order: str | None = None,
        shuffle_blocks: int = 16,
        num_samples: int | None = None,
        **read_options,
    ):
        read = ReadOptions(**read_options)
        self.batch_size = check_int("batch_size", batch_size, 1, 2**40)
        name = orders.resolve_order(order, shuffle)
        if num_samples is not None and random_batches is not None:
            raise ValueError(
                f"num_samples and random_batches are one setting (random batches per epoch); "
                f"got num_samples={num_samples!r}, random_batches={random_batches!r}: pass "
                f"num_samples only"
            )
        arg = "num_samples" if num_samples is not None else "random_batches"
        random_batches = num_samples if num_samples is not None else random_batches
        if random_batches is not None:
            check_int(arg, random_batches, 1, orders.MAX_SAMPLES)
            if name not in ("sequential", "random"):
                raise ValueError(
                    f"{arg} draws random windows already; it cannot be combined with "
                    f"order={name!r} / shuffle=True: leave them out"
                )
            name = "random"
        self.order_spec = OrderSpec(name, seed, drop_last, shuffle_blocks, random_batches)
        # -1: as built; 0: full passes; N > 0: N random windows (set_random_batches)
        self._random = SharedInt(-1)
        self.passes = Passes(self, *resolve_rank(rank, world_size))
        self.core = core = ReadingCore(sources, read)
        catalog = lay_out(
            core.meta, columns, read.start_time, read.end_time, shared_timeline=read.align is None
        )
        #: columns that hold nulls (metadata count; None: a time range cut it, not known)
        self._nulls = _null_counts(catalog)
        _check_fill(read.fill, name, self._nulls)
        every = tuple(range(len(catalog.columns)))
        core.lay_out(catalog, [(every, "columns")], decode_grid=(self.batch_size,))
        normalizer = make_normalizer(read.normalize, catalog.column_names, self.stats)
        core.finish(normalizer, [catalog.column_names], _NULLS_HINTS[read.fill])
        warn_if_batch_exceeds_cache(read, self.batch_size, len(catalog.columns))
        self.passes.check_sharding()

    # -- items ------------------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        """Column names, in output order (tsfile series naming: ``table.tag.field``)."""
        return self.catalog.column_names

    def stats(self, exact: bool = False) -> dict[str, dict]:
        """Return statistics per column: metadata only, or with ``exact`` one pass adding std.

        See :func:`tsfile_torch.read.stats.series_stats`; they cover the rows in
        ``start_time`` / ``end_time`` where the metadata allows (a cut shard has no sum).
        """
        return self.core.stats({name: [i] for i, name in enumerate(self.columns)}, exact)

    @property
    def num_rows(self) -> int:
        return self.tables[0].num_rows

    @property
    def alignment(self):
        """The time alignment of the columns (``align=``), or ``None`` for positional rows."""
        return self.tables[0].alignment

    @property
    def spec(self) -> OrderSpec:
        """The order in force (``set_random_batches`` may have switched it)."""
        count = self._random.value
        cached = self.__dict__.get("_spec_for")
        if cached is not None and cached[0] == count:
            return cached[1]
        base = self.order_spec
        if count < 0:
            spec = base
        elif count == 0:
            name = "sequential" if base.order == "random" else base.order
            spec = dataclasses.replace(base, order=name, num_samples=None)
        else:
            spec = dataclasses.replace(base, order="random", num_samples=count)
        self._spec_for = (count, spec)  # the shared count moves rarely: derive once per value
        return spec

    @property
    def random_batches(self) -> int | None:
        """Random windows per epoch now in force (``None``: full passes over the rows)."""
        return self.spec.num_samples

    @property
    def num_samples(self) -> int | None:
        """Items per epoch of ``order="random"`` (random batches here; windows for windows)."""
        return self.spec.num_samples

    def set_random_batches(self, count: int | None) -> None:
        """Switch later epochs to ``count`` random windows, or back to full passes with ``None``.

        Like :meth:`set_epoch` it reaches persistent workers, so one loader (and its open
        readers and caches) can alternate full epochs and random-window epochs.
        """
        check_int("count", count, 1, orders.MAX_SAMPLES, allow_none=True)
        self._random.value = 0 if count is None else count

    def _layout(self) -> tuple[np.ndarray, int]:
        n, bs, spec = self.num_rows, self.batch_size, self.spec
        if spec.order == "shuffle":
            return np.r_[np.arange(0, n, self.block_rows), n].astype(np.int64), bs
        if spec.order == "random":
            return np.array([0, max(n - bs, 0) + 1], dtype=np.int64), 1
        count = n // bs if spec.drop_last else -(-n // bs)
        per_block = max(1, self.block_rows // bs)
        return np.r_[np.arange(0, count, per_block), count].astype(np.int64), 1

    def _layout_extra(self) -> list[int]:
        """What a resumed state must also agree on (rows and batch size)."""
        return [self.num_rows, self.batch_size]

    def _batch_key(self, items: np.ndarray, batch_size: int | None) -> ItemBatch:
        return ItemBatch(items)

    def _row_span(self, items: np.ndarray, order: str) -> tuple[int, int]:
        """Return the rows ``[start, stop)`` one item of a batch order covers."""
        start = int(items[0]) if order == "random" else int(items[0]) * self.batch_size
        return start, min(start + self.batch_size, self.num_rows)

    def _read_items(self, items: np.ndarray, order: str | None = None):
        """Return the batch of ``items`` (of ``order``, default the one in force) as handed out."""
        order = order or self.spec.order
        core = self.core
        if order != "shuffle":
            start, stop = self._row_span(items, order)
            if core.kept(0, start, stop):
                return KeptBatch((items, order))
            return self._as_batch(
                *core.rows(0, start, stop, order == "random", self._out(stop - start))
            )
        # a gather is a copy wherever it is made: made here, in the worker (into its ring
        # slot), not by the main process from its own mapping (Note: hand-over)
        return self._as_batch(*core.take(0, np.sort(items), self._out(len(items))), gathered=True)

    def _start(self, epoch: int, order: str):
        """Return the reader for a pass of ``order`` in ``epoch``: a sequential streaming pass
        decodes ahead for the next one (Note: read-ahead)."""
        reader = self.core.start_epoch(epoch)
        reader.ahead.next_pass = (
            order in orders.IN_ORDER and self.options.cache == "none" and mechanisms.on("readahead")
        )
        return reader

    def _out(self, n: int):
        """Return the arrays a batch of ``n`` rows is read into (Note: hand-over)."""
        specs = {"values": ((n, len(self.catalog.columns)), self.core.dtype)}
        if self.options.return_timestamps:
            specs["times"] = ((n,), np.int64)
        arrays = batch_arrays(specs)  # one buffer: one ring slot
        return arrays["values"], arrays.get("times")

    def serve_kept(self, kept: KeptBatch):
        return self._read_items(*kept.request)

    def _as_batch(self, values: np.ndarray, times: np.ndarray, gathered: bool = False):
        """Return the batch handed out: ``values`` (the caller's arrays) filled in place
        (Note: row fill), as tensors. ``gathered``: rows from many places (``"shuffle"``),
        where ffill has no neighbour to carry from."""
        fill = self.options.fill
        if fill == "zero" or (fill == "ffill" and not gathered):
            fill_missing(values[None], np.isnan(values)[None], fill, np.nan)
        tensor = as_tensor(values)
        if self.options.dtype not in ("float32", "float64"):
            tensor = tensor.to(getattr(torch, self.options.dtype))
        if self.options.return_timestamps:
            return tensor, as_tensor(times)
        return tensor

    def loader_spec(self) -> LoaderSpec:
        """Whole batches from the dataset; a map-style one visited by an EpochSampler."""
        return LoaderSpec(
            windows=False,
            iterable=isinstance(self, tud.IterableDataset),
            cores=[self.core],
            block_values=self.block_rows * len(self.catalog.columns),
            serve=self.serve_kept,
            num_batches=len(self) if isinstance(self, tud.IterableDataset) else None,
            epoch_sums=lambda: self.checks_epoch_sums,
            slots=self.core.slots,
            main_pass=self.main_pass if isinstance(self, tud.IterableDataset) else None,
            gather_block=(self.block_rows, max(len(g.columns) for g in self.catalog.groups))
            if self.spec.order == "shuffle"
            else None,
        )

    @property
    def checks_epoch_sums(self) -> bool:
        """Whether a full epoch hands out every row exactly once, as metadata sums describe."""
        return (
            self.options.check_statistics
            and self.spec.order != "random"
            and self.world_size == 1
            and self.tables[0].alignment is None
            and self.normalizer is None
            and not (self.options.fill == "ffill" and self._nulls)  # carried values add up
        )


class TsFileIterableDataset(_Rows, tud.IterableDataset):
    """Batches of ``batch_size`` rows x all selected columns, as an ``IterableDataset``.

    Use with :func:`tsfile_torch.make_loader` (or ``DataLoader(ds, batch_size=None)``). Each
    epoch yields this rank's batches exactly once across DataLoader workers (every rank the same
    number); see :mod:`tsfile_torch.sampling.orders` for the order. Every pass is the next epoch
    unless :meth:`set_epoch` says otherwise; :meth:`state_dict` / :meth:`load_state_dict`
    resume a pass where it stopped (see Note: resume in :mod:`tsfile_torch.data.view`).

    Args:
        sources: a path, a directory (its ``*.tsfile``, sorted), a glob, a URL, a binary file
            object, or a list of them.
        columns: ``None`` for every numeric field, or exact names / glob patterns.
        batch_size: rows per batch.
        order: ``"sequential"`` (default: batches in row order, whatever the number of
            workers), ``"stretches"`` (each worker reads a stretch of rows of its own: less
            decoding with workers, delivered interleaved), ``"batches"`` (contiguous batches
            in a (seed, epoch) permutation), ``"shuffle"`` (rows shuffled within a buffer of
            ``shuffle_blocks`` blocks) or ``"random"`` (with ``random_batches``).
        shuffle: ``True`` means ``order="shuffle"``.
        seed: seed of every random choice (any integer, modulo 2**64).
        drop_last: leave out the last short batch; DDP ranks are trimmed instead of padded.
        random_batches: if set, each epoch is this many windows of ``batch_size`` rows at
            uniformly random rows (``order="random"``). ``num_samples`` is the same setting
            under the name the window datasets use (pass one of the two).
        shuffle_blocks: blocks mixed by ``order="shuffle"`` (memory: that many decoded blocks).
        rank, world_size: this process's DDP rank and the number of ranks; ``None`` (both):
            captured now (see Note: rank capture in :mod:`tsfile_torch.data.view`).
        **read_options: :class:`~tsfile_torch.options.ReadOptions` fields (``read_backend``,
            ``dtype``, ``cache``, ``start_time``, ``align``, ``normalize``, ``validate``...);
            ``fill`` fills nulls too, within each batch (Note: row fill in
            :mod:`tsfile_torch.data.rows`).

    Raises:
        TsFileFormatError, SchemaError, MappingError, ValueError, TypeError: on bad input;
        ValueError for ``fill="ffill"`` with ``order="shuffle"`` over columns with nulls.
    """

    def __len__(self) -> int:
        """Batches per epoch on this rank (all workers together)."""
        return len(self.epoch_batches(self.epoch or 0))

    def __iter__(self) -> Iterator:
        # not a generator: the pass begins (and its state is valid) as soon as the loader asks
        # for the iterator, as StatefulDataLoader reads the state right then
        if compat.batching_fetcher():
            _refuse_loader_batching(self)
        cursor, worker, num_workers = self._begin_pass()
        return self._generate(cursor, num_workers, worker)

    def _generate(self, cursor, num_workers: int, worker: int = 0) -> Iterator:
        order = self.spec.order  # the pass's (set_random_batches acts on later passes)
        reader = self._start(cursor.epoch, order)
        streaming = self.options.cache == "none"
        if (
            num_workers > 1
            and len(cursor)
            and (order in (*orders.IN_ORDER, "batches") or (order == "random" and streaming))
        ):
            # decode only this worker's rows: blocks are clipped to its stretch (random
            # batches: its share of them sorted by row, new each epoch; streaming keeps no
            # blocks across epochs, so a new stretch costs nothing)
            spans = [self._row_span(b, order) for b in cursor.batches]
            lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
            if order == "random":
                # widened to whole cells, and the first and last workers' to the ends, so that
                # the workers' stretches together hold every cell whole: the sum checks
                # complete in the first pass, as with 0 workers (a few rows more to decode)
                grid, total = cell_grid(self.core), reader.catalog.num_rows
                lo = 0 if worker == 0 else lo // grid * grid
                hi = total if worker == num_workers - 1 else min(-(-hi // grid) * grid, total)
            reader.set_range(lo, hi)
        else:  # every row (a clip of an earlier pass would read this one without blocks)
            reader.set_range(0, reader.catalog.num_rows)
        for items in cursor:
            yield self._read_items(items, order)

    def main_pass(self, epoch: int, num_workers: int) -> tuple[int, Iterator]:
        """Begin a fresh pass over ``epoch`` as ``num_workers`` DataLoader workers deliver it,
        read in this process (Note: kept passes in :mod:`tsfile_torch.loader`); return its
        number of batches and its batches. Each worker's share as it would read it, taken in
        turn (one batch of each worker, then the next; a worker whose share is done is
        skipped), the order DataLoader's in-order delivery gives. The pass begins now, as a
        worker's would (the epoch is recorded as its first worker records it), not at its
        first batch."""
        order = self.spec.order
        shares = [self.items_for(epoch, w, num_workers) for w in range(num_workers)]
        turns = range(max(map(len, shares), default=0))
        plan = [share[turn] for turn in turns for share in shares if turn < len(share)]
        self._start(epoch, order)
        self.passes.epochs.record(epoch)
        return len(plan), (self._read_items(items, order) for items in plan)

    def items_for(self, epoch: int, worker: int = 0, num_workers: int = 1) -> list[np.ndarray]:
        """Return the batches (item arrays) one worker of this rank yields in ``epoch``."""
        batches = self.epoch_batches(epoch)
        split = orders.worker_batches(batches, worker, num_workers, self.spec.order)
        return [batches[i] for i in split]


class TsFileDataset(_Rows, tud.Dataset):
    """Map-style twin of :class:`TsFileIterableDataset`: ``len(ds)`` batches, ``ds[i]`` batch ``i``.

    ``ds[i]`` is rows ``[i * batch_size, (i + 1) * batch_size)`` (with ``random_batches=N``:
    the ``i``-th random window of the current epoch). :func:`tsfile_torch.make_loader` visits
    it through an :class:`~tsfile_torch.data.view.EpochSampler`: this rank's batches in the
    dataset's order, a new epoch per pass, resumable; plain ``RandomSampler`` /
    ``DistributedSampler`` work too (``DataLoader(ds, batch_size=None, sampler=...)``).

    Takes the arguments of :class:`TsFileIterableDataset`.
    """

    def __len__(self) -> int:
        if self.random_batches is not None:
            return self.random_batches
        n, bs = self.num_rows, self.batch_size
        return n // bs if self.order_spec.drop_last else -(-n // bs)

    def __getitem__(self, index):
        if isinstance(index, ItemBatch):
            self._start(self.epoch or 0, self.spec.order)
            return self._read_items(index.items)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer batch number; got {index!r}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"batch index {index} out of range for {n} batches")
        index = int(index) % n
        epoch = self.epoch or 0
        self.core.start_epoch(epoch)
        if self.random_batches is not None:
            starts, _ = self._layout()
            return self._read_items(orders.epoch_items(self.spec, starts, epoch)[index : index + 1])
        start = index * self.batch_size
        stop = min(start + self.batch_size, self.num_rows)
        return self._as_batch(*self.core.rows(0, start, stop, out=self._out(stop - start)))

    def __getitems__(self, indices):
        """Refuse a list of batches: DataLoader asks for one only with ``batch_size`` set, and
        would stack the batches again (use ``batch_size=None``, or make_loader)."""
        _refuse_loader_batching(self)


#: the hint of the nulls warning (Note: row fill); None: no null reaches a batch as NaN
_NULLS_HINTS = {
    "nan": "pass fill='zero' (or 'ffill': the last value read earlier in the batch, NaN before "
    "the first), mask them with torch.isnan(batch), or replace them with torch.nan_to_num",
    "ffill": "with fill='ffill' only those before a column's first value in a batch do (a batch "
    "never borrows from outside itself): mask them with torch.isnan(batch), or pass fill='zero'",
    "zero": None,
}


def _null_counts(catalog: Catalog) -> dict[str, int | None]:
    """Return column name -> nulls the metadata counts (None: not known), for the columns that
    hold some or may."""
    out = {}
    for c in catalog.columns:
        if c.num_values is None or c.num_values < c.num_rows:
            out[c.name] = None if c.num_values is None else c.num_rows - c.num_values
    return out


def _check_fill(fill: str, order: str, nulls: dict[str, int | None]) -> None:
    """Raise ValueError for ``fill="ffill"`` over shuffled rows with nulls (Note: row fill)."""
    if fill != "ffill" or order != "shuffle" or not nulls:
        return
    shown = ", ".join(
        f"{name} ({'unknown: a time range cut it' if n is None else f'{n:,}'})"
        for name, n in list(nulls.items())[:3]
    )
    more = f" and {len(nulls) - 3} more" if len(nulls) > 3 else ""
    raise ValueError(
        f"fill='ffill' fills a null with the last value read earlier in the same batch, and "
        f"order='shuffle' batches hold rows from many places (a null would take an unrelated "
        f"row's value); the metadata counts nulls in the selected columns, or cannot rule them "
        f"out: {shown}{more}. Pass fill='zero', or order='batches' (batches of consecutive "
        f"rows in a shuffled order)"
    )


def _refuse_loader_batching(ds) -> None:
    """Raise: a DataLoader with ``batch_size`` set is about to stack our batches again.

    A row dataset yields whole batches; ``DataLoader(ds)`` (``batch_size=1``, its default)
    would silently add a leading dimension. A map-style one learns it from DataLoader asking
    for a list of items (``__getitems__``); an iterable one from torch's fetcher that called
    its ``__iter__`` (:func:`tsfile_torch.compat.batching_fetcher`).
    """
    raise ValueError(
        f"{type(ds).__name__} yields whole batches of batch_size={ds.batch_size} "
        f"rows, and this DataLoader would stack them again (it has batch_size set; "
        f"1 is its default): use tsfile_torch.make_loader(ds) or "
        f"DataLoader(ds, batch_size=None)"
    )
