"""The reading core under every dataset, and the one sampler of the map-style datasets.

:class:`DatasetCore` is what the row datasets and the window dataset are built on (Note: a
dataset kind is a view): one :class:`~tsfile_torch.options.ReadOptions`, sources expanded by the
one registry and validated in a child process whatever their kind, one catalog laid out from
metadata (with the one time cut), one :class:`~tsfile_torch.read.reader.BatchReader` per process
with its block cache, timeline indexes and integrity checks, one alignment, one memory store,
one normalizer, one epoch counter, DDP rank captured once. A kind says which **tables** it reads
(rows of some columns with one numbering: every column for the row datasets, each device's
fields for windows), how its items map to rows of them, and how a batch of items is read.

Note: rank capture. DDP rank and world size are fixed when the dataset is built, in the process
that builds it: explicit ``rank=`` / ``world_size=``, else ``torch.distributed`` when it is
initialized, else the ``RANK`` / ``WORLD_SIZE`` environment variables, else (0, 1). They travel
to DataLoader workers by pickling, so fork, forkserver and spawn workers shard alike (a spawned
worker has no process group to ask).

Note: resume. Order is a pure function (see :mod:`tsfile_torch.sampling.orders`), so a pass is
(epoch, position) plus what the order depends on (:func:`tsfile_torch.sampling.state.pass_state`),
and resuming slices the epoch's batches: the skipped ones are never read. An iterable dataset's
state is its latest pass in the calling process (each DataLoader worker has its own;
``StatefulDataLoader`` collects them); a map-style dataset's is its sampler's (the loader's).

Note: hand-over. With ``cache="disk"`` every process maps the same decoded file, so a batch a
DataLoader worker finds kept there need not travel as values: the worker returns a
:class:`KeptBatch` (the request it was given: a few numbers, or the rows of a shuffled batch)
and the main process serves the request from its own mapping of the same entry (one copy out
of the page cache, as with ``num_workers=0``). A worker's batch otherwise crosses processes as
a shared-memory segment the main process maps and faults in; through two workers that costs
more than the copy it replaces (measured on the reference workload: 2.9x streaming with values
sent, see ``benchmarks/RESULTS.md`` for the hand-over's figure). Workers still decode (and
fill the entry) in parallel; a batch not yet kept, a memory cache, or a loader whose
``collate_fn`` is not ours sends values as before. Only :func:`tsfile_torch.make_loader`'s
workers hand over (its ``worker_init_fn`` sets ``_hand_over`` on the worker's copy), and its
iterator turns every :class:`KeptBatch` back into the batch before the user sees it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.catalog.build import (
    Catalog,
    SourceMetadata,
    check_shared_timeline,
    read_metadata,
)
from tsfile_torch.data.normalize import Normalizer, make_normalizer, series_stats
from tsfile_torch.errors import warn_caller
from tsfile_torch.integrity.checks import CELL_ROWS, CellSums
from tsfile_torch.integrity.reports import ReadSlots
from tsfile_torch.integrity.screen import leave_out, screen_sources
from tsfile_torch.native.backend import check_backend
from tsfile_torch.options import ReadOptions, check_int
from tsfile_torch.read import diskcache
from tsfile_torch.read.align import Alignment, timelines_of
from tsfile_torch.read.memory import MemoryStore
from tsfile_torch.read.reader import BatchReader, cache_cap
from tsfile_torch.sampling import orders, state
from tsfile_torch.sampling.orders import OrderSpec
from tsfile_torch.sources import expand_sources
from tsfile_torch.sources.remote import RemoteOptions

__all__ = ["DatasetCore", "EpochSampler", "KeptBatch", "Table", "resolve_rank"]

_NUMPY_DTYPE = {"float64": np.float64}  # every other torch dtype is read as float32 first
#: Largest integer magnitude below which every integer is exact in each float dtype.
_EXACT_INTEGERS = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53}


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
    """A batch a DataLoader worker found in the decoded disk cache (Note: hand-over).

    ``request``: what the dataset needs to serve it again from its own mapping.
    """

    __slots__ = ("request",)

    def __init__(self, request: tuple):
        self.request = request

    def pin_memory(self, device=None) -> KeptBatch:
        return self  # pinned once served, by the loader's iterator

    def __repr__(self) -> str:
        return f"KeptBatch({self.request!r})"


@dataclass
class Table:
    """Rows of some catalog columns with one numbering: positional, or aligned on time."""

    columns: tuple[int, ...]
    num_rows: int
    alignment: Alignment | None = None

    def read(self, reader: BatchReader, start: int, stop: int, random_access: bool = False):
        """Return rows ``[start, stop)``: values ``(n, columns)`` in the reader's dtype, times."""
        if self.alignment is not None:
            return self.alignment.read(reader, start, stop)
        return reader.read(start, stop, random_access=random_access, view=reader.view(self.columns))

    def take(self, reader: BatchReader, rows: np.ndarray):
        """Return rows ``rows`` (any order): values ``(n, columns)``, times."""
        if self.alignment is None:
            return reader.take(rows, view=reader.view(self.columns))
        values, times = self.alignment.read(reader, int(rows.min()), int(rows.max()) + 1)
        return values[rows - rows.min()], times[rows - rows.min()]


class DatasetCore:
    """What every dataset kind shares (see the module notes). Not used directly.

    A kind implements :meth:`_tables` (the tables it reads, from the laid-out catalog),
    :meth:`_layout` (its items: block starts, batch size in items) and :meth:`_read_items`.
    """

    #: short name of the kind, for messages and repr
    kind = "dataset"

    def _setup(
        self,
        sources,
        read: ReadOptions,
        order: OrderSpec,
        rank: int | None,
        world_size: int | None,
    ) -> SourceMetadata:
        """Expand, validate and read the metadata of ``sources``; keep the settings."""
        self.options = read
        self.order_spec = order
        self.rank, self.world_size = resolve_rank(rank, world_size)
        self.remote = RemoteOptions.of(read)
        expanded = expand_sources(sources, self.remote)
        # manifests, then the first contact with each file in a child (Note: damaged files at
        # build, Note: validation child)
        screened = screen_sources(expanded, read.validate, read.on_damaged)
        problems = screened.problems
        skipped = problems if read.on_damaged == "skip" else None
        meta = read_metadata(screened.sources, screened.identities, skipped)
        #: (file name, reason) of each file left out (``on_damaged="skip"``)
        self.skipped = leave_out(problems, len(expanded))
        for info in meta.files:
            check_backend(info.source, read.read_backend)
        self.epochs = state.EpochCounter()
        self._slots: ReadSlots | None = ReadSlots()  # Note: worker reports
        self._reader: BatchReader | None = None
        self._reader_epoch: int | None = None
        self._store: MemoryStore | bool | None = None  # False: the disk cache is unusable here
        self._passes = 0
        self._latest: tuple[state.Cursor, int, int] | None = None  # this process's latest pass
        self._resume: dict[str, Any] | None = None
        return meta

    def _finish(self, catalog: Catalog, tables: list[Table], names: Sequence[str]) -> None:
        """Keep the catalog and tables, resolve ``normalize=``, check the set-up."""
        self.catalog = catalog
        self.tables = tables
        #: sums of decoded cells, shared with workers (Note: cell sums)
        self._cells = (
            CellSums(catalog, math.gcd(CELL_ROWS, self.block_rows, *self._decode_grid()))
            if self.options.check_statistics
            else None
        )
        _warn_inexact_integers(catalog, self.options.dtype)
        _warn_nulls(catalog, self._nulls_hint())
        #: Applied to every value read (``normalize=``); hand it to a validation dataset.
        self.normalizer: Normalizer | None = self._make_normalizer(list(names))
        if self.options.cache == "disk":
            # create the entry (or warn that it cannot be used) once, here: workers only open it
            self._memory()
        self.close()  # readers used while building are not carried into workers

    def _nulls_hint(self) -> str | None:
        """What to do about nulls that reach the batches as NaN; None: they do not."""
        return "mask them with torch.isnan(batch), or replace them with torch.nan_to_num"

    def _make_normalizer(self, names: list[str]) -> Normalizer | None:
        """Resolve ``normalize=`` for values named ``names`` (statistics of the rows in range)."""
        return make_normalizer(self.options.normalize, names, lambda exact: self.stats(exact))

    # -- tables and alignment ---------------------------------------------------------------
    def _table(self, catalog: Catalog, columns: tuple[int, ...], what: str) -> Table:
        """Return the table of ``columns``: positional when they share a timeline, else aligned.

        Raises:
            SchemaError: their row counts or time ranges differ and ``align`` is None.
        """
        several = len(timelines_of(catalog, columns)) > 1
        if several and self.options.align is not None:
            alignment = Alignment.build(
                catalog,
                columns,
                self.options.align,
                getattr(self, "_align_fill", self.options.fill),
                self._new_reader,
            )
            if not alignment.identical:  # else positional rows: the fast path
                return Table(columns, alignment.num_rows, alignment)
        check_shared_timeline([catalog.columns[c] for c in columns], what)
        return Table(columns, catalog.columns[columns[0]].num_rows)

    # -- the per-process reader -------------------------------------------------------------
    def _new_reader(self, catalog: Catalog | None = None, **overrides) -> BatchReader:
        """Return a reader of ``catalog`` (default: the dataset's) with the dataset's settings."""
        o = self.options
        settings = dict(
            read_backend=o.read_backend,
            dtype=_NUMPY_DTYPE.get(o.dtype, np.float32),
            block_rows=self.block_rows,
            malloc_tuning=o.malloc_tuning,
            decode_threads=self._decode_threads(),
            cache_bytes=o.cache_bytes,
            max_open_files=o.max_open_files,
            index_dir=o.index_dir,
            check_statistics=o.check_statistics,
            cell_sums=self._cells if catalog is None else None,
        )
        settings.update(overrides)
        return BatchReader(catalog or self.catalog, **settings)

    @property
    def reader(self) -> BatchReader:
        """This process's reader, opened on first use and kept until :meth:`close`."""
        if self._reader is None or self._reader.pid != os.getpid():
            overrides = self._reader_overrides()
            if getattr(self, "normalizer", None) is not None:  # see _finalize
                overrides["dtype"] = np.float64
            self._reader = self._new_reader(**overrides)
            self._store = None
            info = tud.get_worker_info()
            if info is not None and self._slots is not None:  # Note: worker reports
                slots, worker = self._slots, info.id
                self._reader.on_read = lambda text: slots.write(worker, text)
        return self._reader

    def _reader_overrides(self) -> dict:
        return {}

    def _decode_threads(self) -> int:
        if self.options.decode_threads is not None:
            return self.options.decode_threads
        if tud.get_worker_info() is not None:
            return 1
        return max(1, min(4, os.cpu_count() or 1))

    def _decode_grid(self) -> tuple[int, ...]:
        """Return row counts every decode boundary is a multiple of, besides ``block_rows``."""
        return ()

    @property
    def block_rows(self) -> int:
        """Rows decoded per native call (``block_rows=``, else the kind's default)."""
        return self.options.block_rows or self.default_block_rows

    default_block_rows = 131072

    def _start_epoch(self, epoch: int) -> BatchReader:
        """Return the reader, checking the files at each new epoch (streaming: cache emptied)."""
        reader = self.reader
        if self._reader_epoch != epoch:
            reader.check_unchanged()
            if self.options.cache == "none":
                reader.clear_cache()
            self._reader_epoch = epoch
        return reader

    def _rows(self, table: int, start: int, stop: int, random_access: bool = False):
        """Return rows ``[start, stop)`` of ``table`` as handed out: normalized, output dtype.

        The arrays are the caller's: with ``cache="memory"`` / ``"disk"`` rows are kept in the
        :class:`~tsfile_torch.read.memory.MemoryStore` and a kept range is returned as a copy.
        """
        store = self._memory()
        if store is not None and store.has(table, start, stop):
            values, times = store.get(table, start, stop)
            out = np.empty_like(values)
            np.copyto(out, values)
            return out, times.copy()
        values, times = self.tables[table].read(self.reader, start, stop, random_access)
        values = self._finalize(table, values)
        if store is not None:
            store.put(table, start, values, times)
        return values, times

    def _finalize(self, table: int, values: np.ndarray) -> np.ndarray:
        """Return read values normalized (``normalize=``) in the output dtype.

        With a normalizer the reader decodes float64 and the values are rounded once, after
        normalizing (as a float64 pipeline would give them).
        """
        if self.normalizer is None:
            return values
        values = self.normalizer(values, self._table_names(table))
        return values.astype(_NUMPY_DTYPE.get(self.options.dtype, np.float32), copy=False)

    def _table_names(self, table: int) -> list[str]:
        raise NotImplementedError

    #: set on a worker's copy by make_loader (Note: hand-over)
    _hand_over = False

    def _handing_over(self) -> MemoryStore | None:
        """This worker's disk store when kept batches are handed over (Note: hand-over)."""
        if not self._hand_over or self.options.cache != "disk":
            return None
        return self._memory()

    def serve_kept(self, kept: KeptBatch):
        """Return the batch ``kept`` stands for, read here (Note: hand-over)."""
        raise NotImplementedError

    def _memory(self) -> MemoryStore | None:
        """Return this process's store of kept rows (``cache="memory"`` / ``"disk"``), or None.

        ``None`` with ``cache="none"``, and with ``cache="disk"`` when the disk cache cannot be
        used here (it warned once; rows are decoded as when streaming).
        """
        if self.options.cache == "none":
            return None
        self.reader  # noqa: B018 - a store belongs to the process's reader
        if self._store is None:
            sizes = [t.num_rows for t in self.tables]
            dtype = _NUMPY_DTYPE.get(self.options.dtype, np.float32)
            width = len(self.tables[0].columns)
            if self.options.cache == "memory":
                self._store = MemoryStore(sizes, width, dtype)
            else:
                o = self.options
                key = self._cache_key(dtype)
                quiet = tud.get_worker_info() is not None  # the building process warned
                self._store = (
                    diskcache.open_store(
                        sizes, width, dtype, key, o.cache_dir, o.cache_limit, quiet
                    )
                    or False
                )
        return self._store or None

    def _cache_key(self, dtype) -> str | None:
        """Return what shapes the kept values (the disk cache's key), or None if unkeyable."""
        files = [info.index_key for info in self.catalog.files]  # as the catalog read them
        if None in files:
            return None
        o = self.options
        return diskcache.fingerprint(
            {
                "format": 1,
                "files": files,
                "names": [info.name for info in self.catalog.files],
                "columns": self.catalog.column_names,
                "tables": [[list(t.columns), t.num_rows] for t in self.tables],
                "dtype": np.dtype(dtype).str,
                "time": [o.start_time, o.end_time, self.catalog.start_time, self.catalog.end_time],
                "align": [o.align, o.fill],
                "normalize": repr(self.normalizer),
            }
        )

    def close(self) -> None:
        """Close this process's readers and drop decoded values (they reopen on the next read)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._store = None

    # -- pickling: no native handles ---------------------------------------------------------
    def __getstate__(self):
        out = self.__dict__.copy()
        out.update(_reader=None, _reader_epoch=None, _store=None, _latest=None)
        out.pop("_running_loader", None)  # the main process's loader (make_loader)
        from multiprocessing import context

        if context.get_spawning_popen() is None:
            # a plain pickle (a checkpoint) takes no shared memory
            out["_slots"] = None
            if self._cells is not None and self._cells.shared:
                out["_cells"] = None
        return out

    # -- public surface ---------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        """Column names, in output order (tsfile series naming: ``table.tag.field``)."""
        return self.catalog.column_names

    def stats(self, exact: bool = False) -> dict[str, dict]:
        """Return statistics per column: metadata only, or with ``exact`` one pass adding std.

        See :func:`tsfile_torch.data.normalize.series_stats`; they cover the rows in
        ``start_time`` / ``end_time`` where the metadata allows (a cut shard has no sum).
        """
        names = {name: [i] for i, name in enumerate(self.columns)}
        return self._stats(names, exact)

    def _stats(self, names: dict[str, list[int]], exact: bool) -> dict[str, dict]:
        return series_stats(
            self.catalog,
            names,
            exact,
            lambda catalog: self._new_reader(catalog, dtype=np.float64, cache_bytes=0),
            self.block_rows,
        )

    @property
    def backends(self) -> dict[str, str]:
        """File name -> backend its open reader really uses, in this process."""
        if self._reader is None:
            return {}
        return {self.catalog.files[i].name: b for i, b in self._reader.backends.items()}

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (later passes count on from it).

        Reaches DataLoader workers, persistent or not. Without it each pass is the next epoch.
        """
        self.epochs.set(check_int("epoch", epoch, 0, state.MAX_EPOCH))

    @property
    def epoch(self) -> int | None:
        """Epoch of the latest pass (or the one ``set_epoch`` named); ``None`` before any."""
        return self.epochs.latest

    # -- the order ---------------------------------------------------------------------------
    @property
    def spec(self) -> OrderSpec:
        """The order in force."""
        return self.order_spec

    def _layout(self) -> tuple[np.ndarray, int]:
        """Return (block starts of the items, items per batch)."""
        raise NotImplementedError

    def _identity(self, batch_size: int | None = None) -> dict[str, Any]:
        """What the delivered order depends on besides the epoch (checked on resume)."""
        starts, per_batch = self._layout()
        return {
            state.ORDER: self.spec.identity,
            state.LAYOUT: [int(starts[-1]), len(starts) - 1, batch_size or per_batch],
        }

    def epoch_batches(
        self, epoch: int, batch_size: int | None = None, history: tuple = ()
    ) -> list[np.ndarray]:
        """Return this rank's batches of ``epoch`` (arrays of items), before the worker split.

        ``history``: what earlier topologies delivered of this epoch (Note: elastic resume).
        """
        starts, per_batch = self._layout()
        return orders.plan_epoch(
            self.spec, starts, epoch, self.rank, self.world_size, batch_size or per_batch, history
        )

    def _check_sharding(self, batch_size: int | None = None) -> None:
        starts, _ = self._layout()
        count = self.spec.num_samples or int(starts[-1])
        orders.check_sharding(count, self.world_size, self.spec.drop_last)
        if not self.epoch_batches(0, batch_size):
            warn_caller(
                f"the {self.kind} yields no batches on rank {self.rank}: drop_last=True and "
                f"fewer items than one batch; lower batch_size or set drop_last=False"
            )

    # -- iterable passes ---------------------------------------------------------------------
    def _begin_pass(self) -> tuple[state.Cursor, int, int]:
        """Start a pass in this process (a worker's share of it, in a worker)."""
        info = tud.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._passes += 1
        tag = 0 if info is None else state.pass_tag(info.seed - info.id, self._passes)
        history: tuple = ()
        if self._resume is not None:
            saved, self._resume = self._resume, None
            epoch, position, history = self._resumed(saved, worker, num_workers)
            if worker == 0:
                self.epochs.record(epoch, tag)
        else:
            epoch, position = self.epochs.claim(tag, leader=worker == 0), 0
        batches = self.epoch_batches(epoch, history=history)
        split = orders.worker_batches(batches, worker, num_workers, self.spec.order)
        cursor = state.Cursor(epoch, [batches[i] for i in split], position, history)
        self._latest = (cursor, worker, num_workers)
        return self._latest

    def _resumed(self, saved: state.PassPoint, worker: int, num_workers: int):
        """Return (epoch, position, history) a pass of ``worker`` of ``num_workers`` resumes.

        The same topology resumes exactly; a main-process state (or the loader's, see
        :meth:`resume_elsewhere`) under another one resumes the rest of the epoch (Note:
        elastic resume); a single worker's state under another topology cannot (it does not
        know what the other workers delivered).
        """
        here = (worker, num_workers, self.rank, self.world_size)
        if saved.worker < 0:  # handed over by the loader: the rest of the epoch, from its start
            return saved.epoch, 0, saved.history
        if (saved.worker, saved.num_workers, saved.rank, saved.world_size) == here:
            return saved.epoch, saved.position, saved.history
        if saved.num_workers == 1:
            return saved.epoch, 0, saved.handed_over()
        raise ValueError(
            f"this state_dict was saved by worker {saved.worker} of {saved.num_workers} of rank "
            f"{saved.rank} of {saved.world_size} and is resumed by worker {worker} of "
            f"{num_workers} of rank {self.rank} of {self.world_size}: one worker's state does "
            f"not say what the other workers delivered; load the loader's state_dict (it holds "
            f"every worker's), which resumes under any number of workers and ranks"
        )

    def resume_elsewhere(self, epoch: int, history: tuple) -> None:
        """Make the next pass deliver the rest of ``epoch`` after ``history`` (any topology)."""
        self._resume = state.PassPoint(epoch, 0, -1, -1, self.rank, self.world_size, tuple(history))

    def state_dict(self) -> dict[str, Any]:
        """Return where this process's latest pass stands (see Note: resume).

        ``epoch`` is ``None`` before the first pass here; a loaded state not yet resumed is
        returned as loaded.
        """
        if self._resume is not None:
            point = self._resume
        elif self._latest is None:
            point = state.PassPoint(None, 0, 0, 1, self.rank, self.world_size)
        else:
            cursor, worker, num_workers = self._latest
            point = state.PassPoint(
                cursor.epoch,
                cursor.position,
                worker,
                num_workers,
                self.rank,
                self.world_size,
                cursor.history,
            )
        return state.pass_state(point, self._identity())

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Make the next pass resume where ``saved`` stood; later passes count on from it.

        A state of the main process resumes under any number of workers and ranks (the rest of
        its epoch, Note: elastic resume); a DataLoader worker's state only under the same
        topology (a loader's state_dict holds every worker's and resumes anywhere).

        Raises:
            ValueError: ``saved`` comes from a dataset with another order, seed, batch size or
                data.
        """
        point = state.check_state(saved, self._identity(), type(self).__name__)
        self._resume = point if point.epoch is not None else None

    def __repr__(self) -> str:
        o = self.options
        return (
            f"{type(self).__name__}({len(self.catalog.files)} files, {len(self.columns)} "
            f"columns, {len(self)} items, order={self.order_spec.order!r}, "
            f"read_backend={o.read_backend!r}, cache={o.cache!r})"
        )


def _warn_inexact_integers(catalog: Catalog, dtype: str) -> None:
    """Warn when metadata min / max show integer columns that ``dtype`` cannot hold exactly."""
    limit = _EXACT_INTEGERS[dtype]
    inexact = [
        c.name
        for c in catalog.columns
        if c.dtype in ("INT32", "INT64", "TIMESTAMP")
        and max(abs(c.min or 0), abs(c.max or 0)) > limit
    ]
    if not inexact:
        return
    shown = ", ".join(inexact[:8]) + (f" and {len(inexact) - 8} more" if len(inexact) > 8 else "")
    hint = (
        "pass dtype=torch.float64 (exact up to 2**53)"
        if dtype != "float64"
        else "their values beyond 2**53 are rounded"
    )
    warn_caller(
        f"integer columns {shown} hold values beyond {limit:,} (metadata min / max), where "
        f"{dtype} cannot represent every integer: values will be rounded; {hint}"
    )


def _warn_nulls(catalog: Catalog, hint: str | None) -> None:
    """Warn once per dataset when metadata counts nulls in the selected columns (Note: a NaN
    in a batch makes a loss NaN, silently)."""
    nulls = {
        c.name: c.num_rows - c.num_values
        for c in catalog.columns
        if c.num_values is not None and c.num_values < c.num_rows
    }
    if hint is None or not nulls:
        return
    worst = sorted(nulls.items(), key=lambda kv: -kv[1])[:3]
    shown = ", ".join(f"{name} ({count:,})" for name, count in worst)
    more = f" and {len(nulls) - 3} more columns" if len(nulls) > 3 else ""
    warn_caller(
        f"{sum(nulls.values()):,} values of the selected columns are null (metadata): "
        f"{shown}{more}; they reach the batches as NaN, and one NaN makes a loss NaN: {hint}"
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
    :meth:`DatasetCore.epoch_batches` gives, in the order a loader with ``num_workers`` workers
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
    """

    def __init__(self, dataset, batch_size: int | None = None, num_workers: int = 0):
        if not isinstance(dataset, DatasetCore):
            raise TypeError(
                f"EpochSampler needs a tsfile-torch dataset; got {type(dataset).__name__}"
            )
        self.dataset = dataset
        self.batch_size = check_int("batch_size", batch_size, 1, 2**40, allow_none=True)
        self.num_workers = check_int("num_workers", num_workers, 0, 1024)
        self._latest: _SamplerPass | None = None

    def batches(self, epoch: int, history: tuple = ()) -> list[np.ndarray]:
        """Return this rank's batches of ``epoch`` (item arrays) in delivered order."""
        batches = self.dataset.epoch_batches(epoch, self.batch_size, history)
        order = orders.delivered_order(batches, self.num_workers, self.dataset.spec.order)
        return [batches[i] for i in order]

    def identity(self) -> dict[str, Any]:
        return self.dataset._identity(self.batch_size)

    def point(self, epoch, position: int = 0, history: tuple = ()) -> state.PassPoint:
        """Return a pass point of this sampler's topology."""
        ds = self.dataset
        return state.PassPoint(
            epoch, position, 0, self.num_workers, ds.rank, ds.world_size, history
        )

    def __len__(self) -> int:
        """Batches per epoch on this rank (of the pass in progress, else of the next)."""
        if self._latest is not None and self._latest.cursor is not None:
            return len(self._latest.cursor)
        return len(self.dataset.epoch_batches(self.dataset.epoch or 0, self.batch_size))

    def __iter__(self) -> Iterator:
        loaded = self._latest
        if loaded is not None and loaded.cursor is None and loaded._pending is not None:
            return loaded  # a loaded state not yet begun: this pass resumes it
        self._latest = _SamplerPass(self)
        return self._latest

    def state_dict(self) -> dict[str, Any]:
        """Return where the latest pass stands (see Note: resume)."""
        if self._latest is None:
            return state.pass_state(self.point(None), self.identity())
        return self._latest.state_dict()

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Make the next pass continue where ``saved`` stood.

        A state at the start of an epoch also sets the dataset's next epoch, so a pass begun
        afresh (a loader that starts a new iterator after loading) takes that epoch too.
        """
        self._latest = _SamplerPass(self)
        self._latest.load_state_dict(saved)
        pending = self._latest._pending
        if pending is not None and (pending.position == 0 or not self._latest.exact):
            self.dataset.epochs.set(pending.epoch)

    def resume_elsewhere(self, epoch: int, history: tuple) -> None:
        """Make the next pass deliver the rest of ``epoch`` after ``history`` (any topology)."""
        self._latest = _SamplerPass(self)
        self._latest._pending = self.point(epoch, 0, tuple(history))
        self.dataset.epochs.set(epoch)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (the dataset's :meth:`DatasetCore.set_epoch`)."""
        self.dataset.set_epoch(epoch)


class _SamplerPass(Iterator):
    """One pass of an :class:`EpochSampler`; claims its epoch at its first batch (lazily: a
    DataLoader creates iterators it never uses). Its state is its pass point."""

    def __init__(self, sampler: EpochSampler):
        self.sampler = sampler
        self.cursor: state.Cursor | None = None
        self._pending: state.PassPoint | None = None  # a loaded point, not begun
        self.finished = False  # raised StopIteration

    @property
    def exact(self) -> bool:
        """Whether the loaded point is of this sampler's topology (else: elastic resume)."""
        p, here = self._pending, self.sampler.point(None)
        return p is None or (p.num_workers, p.rank, p.world_size) == (
            here.num_workers,
            here.rank,
            here.world_size,
        )

    def _begin(self) -> None:
        ds = self.sampler.dataset
        point = self._pending
        if point is None:
            epoch, position, history = ds.epochs.claim(), 0, ()
        elif self.exact:
            epoch, position, history = point.epoch, point.position, point.history
        else:  # another topology: the rest of the epoch (Note: elastic resume)
            epoch, position, history = point.epoch, 0, point.handed_over()
        if point is not None:
            ds.epochs.record(epoch)
        self.cursor = state.Cursor(epoch, self.sampler.batches(epoch, history), position, history)

    def __next__(self):
        if self.cursor is None:
            self._begin()
        try:
            items = next(self.cursor)
        except StopIteration:
            self.finished = True
            raise
        return self.sampler.dataset._batch_key(items, self.sampler.batch_size)

    def state_dict(self) -> dict[str, Any]:
        s = self.sampler
        if self.cursor is None:  # not begun: where it would begin
            point = self._pending or s.point(s.dataset.epochs.peek())
        elif self.finished:  # ran out (StopIteration): the next pass begins
            point = s.point(self.cursor.epoch + 1)
        else:
            point = s.point(self.cursor.epoch, self.cursor.position, self.cursor.history)
        return state.pass_state(point, s.identity())

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        point = state.check_state(saved, self.sampler.identity(), "EpochSampler")
        self._pending = None if point.epoch is None else point
        self.cursor, self.finished = None, False
