"""ReadingCore: the one reader under every view and engine, an object they hold (not a base).

A view (rows, windows, a mixture's datasets, a Ray read task, a script) builds one core and asks
it for rows of a **table** (rows of some catalog columns with one numbering: every column for
the row datasets, each device's fields for windows):

- :meth:`ReadingCore.rows` ``(table, start, stop)`` and :meth:`ReadingCore.take`
  ``(table, rows)``: values ``(n, columns)`` in the output dtype, normalized, and int64 times;
- :meth:`ReadingCore.block`: a block of a table plus a tail (windows gather from it);
- with every guarantee: sources expanded by the one registry and screened (manifests,
  validation child), the change check at each epoch, statistics and cell-sum checks of decoded
  values, worker reports of the read in progress (Note: worker reports), DDP-free and
  torch-free (a view in ``data/`` adds torch).

The core owns one **store** of kept rows, picked by name from :data:`STORES` (``cache=``):
``"none"`` keeps nothing beyond the reader's streaming cache (and, for views that gather many
items from a block, a byte-bounded LRU of finalized blocks: :meth:`block`), ``"memory"`` a
:class:`~tsfile_torch.read.memory.MemoryStore` per process (one shared with fork workers:
Note: shared memory store), ``"disk"`` the same store over one mapped file shared by every
process and later runs (Note: decoded disk cache).

Note: a view holds the core. A dataset kind maps its items to rows of the core's tables and
calls the core; it never reads, caches or checks on its own. If a view needs something of the
reader, the core is missing a public method: add it here, and every view and engine gets it.

Example (no torch needed)::

    core = ReadingCore.for_rows("data/", columns=["t.d0.*"], read_backend="mmap")
    values, times = core.rows(0, 0, 8192)     # rows [0, 8192) of every selected column
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tsfile_torch import mechanisms
from tsfile_torch.catalog.build import (
    Catalog,
    check_shared_timeline,
    lay_out,
    read_metadata,
)
from tsfile_torch.errors import SchemaError, warn_caller
from tsfile_torch.integrity.checks import CELL_ROWS, CellSums, KeptRowsCheck
from tsfile_torch.integrity.reports import ReadSlots
from tsfile_torch.integrity.screen import leave_out, screen_sources
from tsfile_torch.native.backend import check_backend
from tsfile_torch.options import ReadOptions
from tsfile_torch.pids import cpu_share, worker_id
from tsfile_torch.read import diskcache
from tsfile_torch.read.align import Alignment, timeline_name, timelines_of
from tsfile_torch.read.blockcache import Block, BlockCache
from tsfile_torch.read.exchange import BlockExchange, fill_cache
from tsfile_torch.read.grid import TIME_STRETCH, Grid, GridSpec, StepSummary, step_summary
from tsfile_torch.read.memory import MemoryStore
from tsfile_torch.read.merge import warn_resolved
from tsfile_torch.read.reader import (
    DEFAULT_BLOCK_ROWS,
    BatchReader,
    default_cache_bytes,
    read_times,
)
from tsfile_torch.read.stats import series_stats
from tsfile_torch.sources import expand_sources
from tsfile_torch.sources.remote import RemoteOptions

__all__ = ["STORES", "ReadingCore", "Table", "place_on_grid", "step_summaries", "worker_id"]

_NUMPY_DTYPE = {"float64": np.float64}  # every other torch dtype is read as float32 first
#: Largest integer magnitude below which every integer is exact in each float dtype.
_EXACT_INTEGERS = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53}


@dataclass
class Table:
    """Rows of some catalog columns with one numbering: positional, or aligned on time."""

    columns: tuple[int, ...]
    num_rows: int
    alignment: Alignment | None = None
    #: the rows on a regular time grid (``freq=``; Note: time grid in :mod:`.grid`)
    grid: Grid | None = None

    def read(self, reader: BatchReader, start: int, stop: int, random_access: bool = False):
        """Return rows ``[start, stop)``: values ``(n, columns)`` in the reader's dtype, times."""
        if self.grid is not None:
            return self.grid.read(
                lambda a, b: self._read(reader, a, b, random_access),
                start,
                stop,
                len(self.columns),
                reader.dtype,
            )
        return self._read(reader, start, stop, random_access)

    def _read(self, reader: BatchReader, start: int, stop: int, random_access: bool):
        """Return rows ``[start, stop)`` as read (positional or aligned), before any grid."""
        if self.alignment is not None:
            return self.alignment.read(reader, start, stop)
        return reader.read(start, stop, random_access=random_access, view=reader.view(self.columns))

    def take(self, reader: BatchReader, rows: np.ndarray):
        """Return rows ``rows`` (any order): values ``(n, columns)``, times."""
        if self.alignment is None and self.grid is None:
            return reader.take(rows, view=reader.view(self.columns))
        values, times = self.read(reader, int(rows.min()), int(rows.max()) + 1)
        return values[rows - rows.min()], times[rows - rows.min()]

    def read_times(self, reader: BatchReader) -> Iterator[np.ndarray]:
        """Yield the timestamps of the rows as read (before any grid), in stretches."""
        if self.alignment is None:
            yield from read_times(reader, self.columns)
            return
        n = len(self.alignment.times)
        for a in range(0, n, TIME_STRETCH):
            yield self.alignment.times[a : a + TIME_STRETCH]


def _no_store(core: ReadingCore) -> None:
    return None


def _memory_store(core: ReadingCore) -> MemoryStore:
    if core._shared is not None:  # made before fork workers started (Note: shared memory store)
        return core._shared
    return MemoryStore(core.table_sizes, core.width, core.dtype)


def _disk_store(core: ReadingCore) -> MemoryStore | None:
    o = core.options
    quiet = worker_id() is not None  # the building process warned
    store = diskcache.open_store(
        core.table_sizes,
        core.width,
        core.dtype,
        cache_key(core),
        o.cache_dir,
        o.cache_limit,
        quiet,
        kept_check(core) if o.check_statistics else None,
    )
    return store or None


def kept_check(core: ReadingCore) -> Callable:
    """Return the statistics checks of kept blocks of the core's tables (Note: checked
    blocks), as ``check(table, start, times, values) -> problem or None``."""
    normalize = None
    if core.normalizer is not None:

        def normalize(values, table):
            return core.normalizer(values, core._names[table])

    # a grid's steps without a reading are NaN (ignored by the bounds), and snapped timestamps
    # may lie half a step outside the series' time range
    tables = [
        (t.columns, t.alignment is None, t.grid.step // 2 if t.grid is not None else 0)
        for t in core.tables
    ]
    return KeptRowsCheck(core.catalog, tables, core.dtype, normalize).problem


#: ``cache=`` name -> the store a process keeps rows in (None: nothing kept).
STORES: dict[str, Callable[[ReadingCore], MemoryStore | None]] = {
    "none": _no_store,
    "memory": _memory_store,
    "disk": _disk_store,
}


class ReadingCore:
    """Catalog, tables, this process's reader, the store of kept rows and the checks.

    Build it (sources -> metadata: ``core.meta``), then :meth:`lay_out` the view's catalog and
    tables and :meth:`finish` (normalizer, checks); :meth:`for_rows` does all three for rows.
    Pickles without native handles: a DataLoader worker or a Ray task reopens its readers.

    Args:
        sources: paths, directories, globs, URLs, binary file objects, or a list of them.
        options: what is read and how (:class:`~tsfile_torch.options.ReadOptions`).
        default_block_rows: rows per decoded block when ``options.block_rows`` is None.
        reader_cache: ``False``: the reader keeps no decoded blocks of its own (a view that
            gathers from :meth:`block` keeps finalized blocks instead).
    """

    def __init__(
        self,
        sources,
        options: ReadOptions,
        *,
        default_block_rows: int = DEFAULT_BLOCK_ROWS,
        reader_cache: bool = True,
    ):
        self.options = options
        self.block_rows = options.block_rows or default_block_rows
        self._reader_cache = reader_cache
        self.remote = RemoteOptions.of(options)
        #: what the files hold (metadata only), for the view to select its catalog from;
        #: (file name, reason) of each file left out (``on_damaged="skip"``)
        self.meta, self.skipped = open_sources(sources, options, self.remote)
        #: shared memory where workers say what they read (Note: worker reports)
        self.slots: ReadSlots | None = ReadSlots()
        #: set on a worker's copy by make_loader: kept batches go by reference (Note: hand-over)
        self.hand_over = False
        self.catalog: Catalog | None = None
        self.tables: list[Table] = []
        #: the time grid every table is placed on (:meth:`place_on_grid`), or None
        self.grid_spec: GridSpec | None = None
        self._shared: MemoryStore | None = None  # fork workers' too (:func:`share_store`)
        self._exchange: BlockExchange | None = None  # fork workers' (:func:`share_blocks`)
        self.normalizer = None
        self._names: list[list[str]] | None = None
        self._cells: CellSums | None = None
        self._reset()

    def _reset(self) -> None:
        self._reader: BatchReader | None = None
        self._reader_epoch: int | None = None
        self._store: MemoryStore | None | bool = False  # False: not opened in this process
        self._blocks: BlockCache | None = None
        self._whole = False  # every table known kept in the store

    @classmethod
    def for_rows(cls, sources, columns: Sequence[str] | str | None = None, **read_options):
        """Return a finished core of one table: every selected column (the row datasets')."""
        o = ReadOptions(**read_options)
        core = cls(sources, o)
        catalog = lay_out(
            core.meta, columns, o.start_time, o.end_time, shared_timeline=o.align is None
        )
        core.lay_out(catalog, [(tuple(range(len(catalog.columns))), "columns")])
        core.finish()
        return core

    # -- layout ------------------------------------------------------------------------------
    def lay_out(
        self,
        catalog: Catalog,
        tables: Sequence[tuple[tuple[int, ...], str]],
        align_fill: str | None = None,
        decode_grid: tuple[int, ...] = (),
    ) -> None:
        """Keep ``catalog`` and make a table of each ``(columns, what)``.

        Columns on one timeline are positional rows (the fast path); on several, they are
        aligned on time when ``align`` is set (gaps filled with ``align_fill``, default the
        options' ``fill``). ``decode_grid``: row counts every decode boundary is a multiple of
        (a view's batch size), so cell sums stay whole.

        Raises:
            SchemaError: columns of one table on different timelines and ``align`` is None.
        """
        self.catalog = catalog
        fill = self.options.fill if align_fill is None else align_fill
        self.tables = [
            make_table(catalog, columns, what, self.options, fill, self.new_reader)
            for columns, what in tables
        ]
        _warn_duplicates(catalog, self.tables, self.options.duplicates)
        #: sums of decoded cells, shared with workers (Note: cell sums)
        grid = math.gcd(CELL_ROWS, self.block_rows, *decode_grid)
        self._cells = CellSums(catalog, grid) if self.options.check_statistics else None

    def finish(
        self,
        normalizer=None,
        names: Sequence[Sequence[str]] | None = None,
        nulls_hint: str | None = "mask them with torch.isnan(batch), or replace them with "
        "torch.nan_to_num",
    ) -> None:
        """Set the normalizer (applied to every value read; ``names[table]`` names a table's
        columns for it), warn about values the output cannot hold, and open the disk cache once
        here (workers only open it). Readers used while building are closed."""
        self.normalizer = normalizer
        self._names = [list(n) for n in names] if names is not None else None
        _warn_inexact_integers(self.catalog, self.options.dtype)
        _warn_nulls(self.catalog, nulls_hint)
        if self.options.cache == "disk":
            self.store()  # create the entry (or warn that it cannot be used), once
        self.close()

    @property
    def table_sizes(self) -> list[int]:
        """Rows of each table."""
        return [t.num_rows for t in self.tables]

    @property
    def width(self) -> int:
        """Columns of every table."""
        return len(self.tables[0].columns)

    @property
    def dtype(self):
        """numpy dtype of the values handed out (float16 / bfloat16 are cast by the view)."""
        return _NUMPY_DTYPE.get(self.options.dtype, np.float32)

    # -- the per-process reader --------------------------------------------------------------
    def new_reader(self, catalog: Catalog | None = None, **overrides) -> BatchReader:
        """Return a new reader of ``catalog`` (default: the core's) with the core's settings."""
        o = self.options
        settings = dict(
            read_backend=o.read_backend,
            dtype=self.dtype,
            block_rows=self.block_rows,
            malloc_tuning=o.malloc_tuning,
            decode_threads=decode_threads(o),
            cache_bytes=o.cache_bytes if self._reader_cache else 0,
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
            overrides = {"dtype": np.float64} if self.normalizer is not None else {}
            self._reset()
            self._reader = self.new_reader(**overrides)
            _attach_worker(self, self._reader)
        return self._reader

    def start_epoch(self, epoch: int) -> BatchReader:
        """Return the reader, checking the files at each new epoch (streaming: cache emptied)."""
        reader = self.reader
        if self._reader_epoch != epoch:
            reader.check_unchanged()
            if self.options.cache == "none":
                reader.clear_cache()  # finalized blocks (block()) stay: the view's choice
                reader.pass_epoch = epoch  # what its block exchange serves (Note: block exchange)
            self._reader_epoch = epoch
        return reader

    def set_range(self, start: int, stop: int) -> None:
        """Decode only rows ``[start, stop)`` of the tables (a worker's stretch)."""
        self.reader.set_range(start, stop)

    # -- reads -------------------------------------------------------------------------------
    def rows(
        self,
        table: int,
        start: int,
        stop: int,
        random_access: bool = False,
        out: tuple[np.ndarray, np.ndarray | None] | None = None,
    ):
        """Return rows ``[start, stop)`` of ``table`` as handed out: normalized, output dtype.

        The arrays are the caller's: a range kept in the store is returned as a copy. ``out``:
        ``(values, times or None)`` to fill and return instead (a worker's shared batch
        buffer, :mod:`tsfile_torch.data.handover`); decoded values are assembled straight into
        it where nothing has to be done to them afterwards.
        """
        store = self.store()
        if random_access and store is not None and start < stop:
            _keep_blocks(self, table, np.r_[start : stop : self.block_rows, stop - 1])
        if store is not None and store.has(table, start, stop):
            values, times = store.get(table, start, stop)
            return _copy(values, times, out)
        t = self.tables[table]
        if out is not None and t.alignment is None and t.grid is None and self.normalizer is None:
            reader = self.reader
            values, times = reader.read(
                start, stop, out[0], random_access=random_access, view=reader.view(t.columns)
            )
        else:
            values, times = t.read(self.reader, start, stop, random_access)
            values = self._finalize(table, values)
        if store is not None:
            store.put(table, start, values, times)
        if out is not None and values is not out[0]:
            return _copy(values, times, out)
        if out is not None and out[1] is not None:
            out[1][...] = times
            return values, out[1]
        return values, times

    def take(self, table: int, rows: np.ndarray, out=None):
        """Return rows ``rows`` (sorted) of ``table`` as handed out (store rows when kept).

        ``out``: (values, times or None) arrays to return them in, as :meth:`rows` takes.
        """
        store = self.store()
        if store is not None:
            at = rows + store.offsets[table]
            if not store.has_rows(at):
                _keep_blocks(self, table, rows)
            if store.has_rows(at):
                return _taken(store.values, store.times, at, out)
        values, times = self.tables[table].take(self.reader, rows)
        values = self._finalize(table, values)
        if store is not None:
            store.put_rows(at, values, times)
        return (values, times) if out is None else _copy(values, times, out)

    def _finalize(self, table: int, values: np.ndarray) -> np.ndarray:
        """Return read values normalized (``normalize=``) in the output dtype.

        With a normalizer the reader decodes float64 and the values are rounded once, after
        normalizing (as a float64 pipeline would give them).
        """
        if self.normalizer is None:
            return values
        values = self.normalizer(values, self._names[table])
        return values.astype(self.dtype, copy=False)

    def block(self, table: int, lo: int, hi: int, annotate=None) -> Block:
        """Return rows ``[lo, hi)`` of ``table`` as a :class:`Block` to gather items from: from
        the store when it holds every table (filled here first), else a finalized block kept in
        a byte-bounded LRU (``cache_bytes``, default :func:`default_cache_bytes`) keyed by
        ``(table, lo)``;
        ``annotate(times)`` (time features) runs once per decoded block (``block.features``)."""
        store = self.whole_store()
        if store is not None:
            self.fill(table)
            values, times = store.get(table, lo, hi)
            return Block(times, values)
        cache = self.block_cache()
        block = cache.get((table, lo))
        if block is None:
            block = _finalized(self, table, lo, hi, annotate)
            cache.put((table, lo), block)
        return block

    def block_cache(self) -> BlockCache:
        """This process's LRU of finalized blocks (see :meth:`block`)."""
        self.reader  # noqa: B018 - the cache belongs to this process's reader
        if self._blocks is None:
            budget = self.options.cache_bytes
            if budget is None:
                budget = default_cache_bytes(
                    self.catalog, np.dtype(self.dtype).itemsize, self.block_rows
                )
            self._blocks = BlockCache(budget, self.dtype, recycle=False)
        return self._blocks

    # -- the store ---------------------------------------------------------------------------
    def store(self) -> MemoryStore | None:
        """Return this process's store of kept rows (:data:`STORES`), or None (``cache="none"``,
        or a disk cache unusable here: it warned once, rows are decoded as when streaming)."""
        self.reader  # noqa: B018 - a store belongs to the process's reader
        if self._store is False:
            self._store = STORES[self.options.cache](self)
        return self._store

    def whole_store(self) -> MemoryStore | None:
        """Return the store when tables can be kept whole in it (else None: read blocks); a
        read-only disk cache only when it holds every table already (rows it lacks could not be
        kept, and a gather must not read them)."""
        store = self.store()
        if store is None or store.writable:
            return store
        if not self._whole:
            self._whole = kept_whole(self)
        return store if self._whole else None

    def fill(self, table: int) -> None:
        """Decode every row of ``table`` into the store, once per process."""
        if not self.store().has_whole(table):
            _keep_blocks(self, table, np.arange(0, self.tables[table].num_rows, self.block_rows))

    def kept(self, table: int | None, start: int = 0, stop: int = 0, rows=None, tables=()) -> bool:
        """Whether a make_loader worker hands rows ``[start, stop)`` (or the rows ``rows``) of
        ``table`` over by reference (Note: hand-over); ``table=None``: a gather from the whole
        tables ``tables`` (empty: all), each kept whole in a store the main process maps (no
        before the rows are there: never a batch the main process would have to decode)."""
        store = self.store() if self.hand_over and shares_store(self) else None
        if store is None or table is None:
            if store is None or store is not self.whole_store():
                return False
            wanted = range(len(self.tables)) if not len(tables) else tables
            return all(store.has_whole(int(t)) for t in wanted)
        if rows is not None:
            return store.has_rows(rows + store.offsets[table])
        return store.has(table, start, stop)

    @property
    def cached_bytes(self) -> int:
        """Bytes of decoded values held in this process (the store, or finalized blocks)."""
        if self._store:
            return self._store.nbytes
        return self._blocks.nbytes if self._blocks is not None else 0

    # -- statistics --------------------------------------------------------------------------
    def stats(self, names: dict[str, list[int]], exact: bool = False) -> dict[str, dict]:
        """Return statistics per name over the catalog columns listed for it (see
        :func:`tsfile_torch.read.stats.series_stats`): metadata, or with ``exact`` one pass."""
        reader = functools.partial(self.new_reader, dtype=np.float64, cache_bytes=0)
        return series_stats(self.catalog, names, exact, reader, self.block_rows)

    @property
    def backends(self) -> dict[str, str]:
        """File name -> backend its open reader really uses, in this process."""
        opened = self._reader.backends if self._reader is not None else {}
        return {self.catalog.files[i].name: b for i, b in opened.items()}

    def close(self) -> None:
        """Close this process's readers and drop decoded values (they reopen on the next read)."""
        if self._reader is not None:
            self._reader.close()
        self._reset()  # the shared store stays: persistent fork workers still fill it

    # -- pickling: no native handles ---------------------------------------------------------
    def __getstate__(self):
        out = self.__dict__.copy()
        # anonymous shared memory (Note: shared memory store) reaches fork children only
        out.update(_reader=None, _reader_epoch=None, _store=False, _blocks=None, _whole=False)
        out.update(_shared=None, _exchange=None)
        from multiprocessing import context

        if context.get_spawning_popen() is None:
            # a plain pickle (a checkpoint, a Ray task) takes no shared memory
            out["slots"] = None
            if self._cells is not None and self._cells.shared:
                out["_cells"] = None
        return out


def place_on_grid(core: ReadingCore, spec: GridSpec, names: Sequence[str]) -> None:
    """Place every table's rows of ``core`` on the time grid ``spec`` (Note: time grid in
    :mod:`tsfile_torch.read.grid`), reading each table's time column once; ``names[k]`` names
    table ``k`` in errors. Call between :meth:`ReadingCore.lay_out` and ``finish``.

    Raises:
        SchemaError: a timestamp off the grid (or two on one step with ``snap``).
    """
    reader = core.new_reader(core.catalog)  # no cell sums: only time columns are read
    try:
        for k, table in enumerate(core.tables):
            grid = Grid.build(spec, table.read_times(reader), names[k])
            core.tables[k] = dataclasses.replace(table, num_rows=grid.num_rows, grid=grid)
    finally:
        reader.close()
    core.grid_spec = spec


def step_summaries(core: ReadingCore) -> list[StepSummary]:
    """Return the steps between consecutive timestamps of each table of ``core`` (its time
    column is read once)."""
    reader = core.new_reader(core.catalog)
    try:
        return [step_summary(table.read_times(reader)) for table in core.tables]
    finally:
        reader.close()


def _keep_blocks(core: ReadingCore, table: int, rows: np.ndarray) -> None:
    """Keep whole the blocks of ``table`` that rows ``rows`` fall in (if the store lacks them).

    A gather or a random window keeps blocks, not just its own rows: a worker is given other
    rows of the same blocks each epoch (batches are dealt out in turn), so rows kept one batch
    at a time would never add up to a batch it can serve from its store.
    """
    store, size = core.store(), int(core.table_sizes[table])
    if not store.writable:
        return
    for block in np.unique(rows // core.block_rows):
        lo = int(block) * core.block_rows
        hi = min(lo + core.block_rows, size)
        if not store.has(table, lo, hi):  # another process may have kept it (disk)
            core.rows(table, lo, hi)


def shares_store(core: ReadingCore) -> bool:
    """Whether the store is one every process of a loader sees (disk, or shared memory)."""
    return core.options.cache == "disk" or core._shared is not None


def share_store(core: ReadingCore) -> None:
    """Keep ``cache="memory"``'s rows in memory that fork workers share with this process
    (Note: shared memory store in :mod:`tsfile_torch.read.memory`), once, before the workers
    start; rows this process kept already move there."""
    if core.options.cache == "memory" and core._shared is None:
        shared = MemoryStore.shared(core.table_sizes, core.width, core.dtype)
        own = core._store if core._store is not False and core._reader is not None else None
        if own is not None and core._reader.pid == os.getpid():
            shared.adopt(own)
            core._store = shared
        core._shared = shared


def share_blocks(core: ReadingCore, num_workers: int, rows: int, fields: int) -> None:
    """Give ``num_workers`` fork workers of a streaming core one exchange of decoded blocks
    of up to ``rows`` x ``fields`` values (Note: block exchange in
    :mod:`tsfile_torch.read.exchange`), once, before they start: for views whose batches
    gather from many blocks (shuffled rows: the reader's blocks; shuffled windows: the
    finalized blocks of :meth:`ReadingCore.block`)."""
    o = core.options
    if o.cache != "none" or num_workers < 2 or o.cache_bytes == 0 or core._exchange is not None:
        return  # one per core: the processes of every loader over it take columns of their own
    if not mechanisms.on("exchange"):
        return
    capacity = o.cache_bytes
    if capacity is None:
        capacity = default_cache_bytes(core.catalog, 8, core.block_rows)
    rows = min(rows, max(core.table_sizes))
    core._exchange = BlockExchange.for_blocks(rows, fields, capacity, num_workers)


def _finalized(core: ReadingCore, table: int, lo: int, hi: int, annotate=None) -> Block:
    """Rows ``[lo, hi)`` of ``table`` as handed out, as a :class:`Block` (with
    ``annotate(times)`` as its features): what :meth:`ReadingCore.block` keeps."""
    values, times = core.rows(table, lo, hi)
    block = Block(times, values.astype(core.dtype, copy=False))
    if annotate is not None:
        block.features = annotate(times)
    return block


def share_finalized_blocks(core: ReadingCore, wanted, annotate=None) -> None:
    """Get the blocks of :meth:`ReadingCore.block` a gather is about to read, ``wanted`` as
    ``(table, lo, hi)``, into this process's block cache through the fork workers' block
    exchange (Note: block exchange in :mod:`tsfile_torch.read.exchange`): what another
    worker decoded is taken, the rest is decoded here for both. Nothing happens without an
    exchange (0 workers, spawn workers, a cache that keeps rows) or outside a worker."""
    exchange = core._exchange
    if exchange is None or worker_id() is None or not exchange.bind():
        return
    cache = core.block_cache()
    row_bytes = core.width * np.dtype(core.dtype).itemsize + 8
    items = [((t, lo), (t, -1, lo, hi), (hi - lo) * row_bytes) for t, lo, hi in wanted]

    def decode(key):  # the features follow (prepare), on the block each process keeps
        return _finalized(core, key[0], key[2], key[3])

    def prepare(block):
        block.features = annotate(block.times)

    extras = None if annotate is None else prepare
    fill_cache(exchange, cache, core.reader.pass_epoch, core.dtype, items, decode, extras)


def _attach_worker(core: ReadingCore, reader: BatchReader) -> None:
    """Wire a DataLoader worker's new reader to what its loader shares: its report slot
    (Note: worker reports) and the block exchange (Note: block exchange)."""
    worker = worker_id()
    if worker is None:
        return
    if core.slots is not None:
        slots, wid = core.slots, worker[0]
        reader.on_read = lambda text: slots.write(wid, text)
    exchange = core._exchange
    if exchange is not None and core._reader_cache and exchange.bind():
        reader.exchange = exchange


def sums_verified(core: ReadingCore) -> bool:
    """Whether the cell sums (Note: cell sums) of every read group that has metadata sums
    were complete and checked already: decoded whole and matched, in some process of the
    loader. False where the sums are off (no statistics checks, a grid too fine for memory)."""
    return core._cells is not None and core._cells.all_checked()


def cell_grid(core: ReadingCore) -> int:
    """Rows per cell of the core's cell sums (1 without them): a worker's stretch that starts
    and ends on this grid leaves every cell whole in some process (Note: cell sums)."""
    return core._cells.cell_rows if core._cells is not None else 1


def kept_whole(core: ReadingCore) -> bool:
    """Whether every table of ``core`` is kept entirely in this process's store."""
    store = core.store()
    return store is not None and all(store.has_whole(k) for k in range(len(core.tables)))


def _copy(values: np.ndarray, times: np.ndarray, out=None) -> tuple[np.ndarray, np.ndarray]:
    """Return copies of ``values`` / ``times``, into ``out`` (values, times or None) if given."""
    if out is None:
        target = np.empty_like(values)
        np.copyto(target, values)
        return target, times.copy()
    np.copyto(out[0], values)
    if out[1] is None:
        return out[0], times.copy()
    out[1][...] = times
    return out


def _taken(values: np.ndarray, times: np.ndarray, at: np.ndarray, out=None):
    """Return rows ``at`` of kept ``values`` / ``times``, gathered into ``out`` if given."""
    if out is None:
        return values[at], times[at]
    np.take(values, at, axis=0, out=out[0])
    if out[1] is None:
        return out[0], times[at]
    np.take(times, at, out=out[1])
    return out


def decode_threads(options: ReadOptions) -> int:
    """Return the native decode threads of a reader: as asked, else the usable CPUs split among
    the reading processes, at most 4 each: up to 4 with ``num_workers=0``, ``cpus // N`` in each
    of N DataLoader workers (1 where there are no more CPUs than workers), divided again by the
    ranks on this machine where torchrun says (``LOCAL_WORLD_SIZE``): one thread per worker left
    workers short of decode threads, not of cores (``benchmarks/RESULTS.md``, "Decode threads
    per process")."""
    if options.decode_threads is not None:
        return options.decode_threads
    return cpu_share(4)


def make_table(
    catalog: Catalog,
    columns: tuple[int, ...],
    what: str,
    options: ReadOptions,
    fill: str,
    new_reader,
) -> Table:
    """Return the table of ``columns``: positional on one timeline, else aligned on time.

    A column whose shards overlap in time is read merged by timestamp (Note: merged shards in
    :mod:`tsfile_torch.read.merge`), through the alignment; with ``align=None`` the merged
    timelines must then have the same timestamps as the others.
    """
    merged = any(catalog.columns[c].overlapping for c in columns)
    if merged or (len(timelines_of(catalog, columns)) > 1 and options.align is not None):
        alignment = Alignment.build(
            catalog,
            columns,
            options.align or "union",
            fill,
            new_reader,
            options.duplicates,
            options.time_unit,
        )
        if merged and options.align is None and not alignment.identical:
            _refuse_unaligned(catalog, alignment, what)
        if merged or not alignment.identical:  # else positional rows: the fast path
            return Table(columns, alignment.num_rows, alignment)
    check_shared_timeline([catalog.columns[c] for c in columns], what)
    return Table(columns, catalog.columns[columns[0]].num_rows)


def _warn_duplicates(catalog: Catalog, tables: Sequence[Table], duplicates: str) -> None:
    """Warn once when duplicate timestamps of merged shards were resolved (Note: merged
    shards in :mod:`tsfile_torch.read.merge`): how many, in which series, and how."""
    merges = {}
    for table in tables:
        for t in table.alignment.timelines if table.alignment is not None else ():
            if t.merge is not None:
                merges.setdefault(timeline_name(catalog, t.catalog_columns), t.merge)
    warn_resolved(list(merges.items()), duplicates)


def _refuse_unaligned(catalog: Catalog, alignment: Alignment, what: str) -> None:
    """Raise SchemaError naming two timelines of ``alignment`` whose timestamps differ."""
    ref = alignment.timelines[0]
    other = next(t for t in alignment.timelines if not np.array_equal(t.times, ref.times))
    a, b = (catalog.columns[t.catalog_columns[0]].name for t in (ref, other))
    raise SchemaError(
        f"{what} do not share one timeline: {a!r} has {len(ref.times)} rows (its files merged "
        f"by timestamp where they overlap), {b!r} {len(other.times)}; select columns with "
        f"equal timestamps or align them on time with align='union' or align='intersect' "
        f"(and fill=...)"
    )


def open_sources(sources, options: ReadOptions, remote: RemoteOptions):
    """Expand and screen ``sources``; return their metadata and the files left out.

    Manifests, then the first contact with each file in a child (Note: damaged files at build,
    Note: validation child); the backend asked for is checked against every file.
    """
    expanded = expand_sources(sources, remote)
    screened = screen_sources(expanded, options.validate, options.on_damaged)
    problems = screened.problems
    skipped = problems if options.on_damaged == "skip" else None
    meta = read_metadata(screened.sources, screened.identities, skipped)
    for info in meta.files:
        check_backend(info.source, options.read_backend)
    return meta, leave_out(problems, len(expanded))


def cache_key(core: ReadingCore) -> str | None:
    """Return what shapes the kept values (the disk cache's key), or None if unkeyable."""
    files = [info.index_key for info in core.catalog.files]  # as the catalog read them
    if None in files:
        return None
    o = core.options
    return diskcache.fingerprint(
        {
            "format": 2,  # 2: checked blocks (Note: checked blocks)
            "files": files,
            "names": [info.name for info in core.catalog.files],
            "columns": core.catalog.column_names,
            "tables": [[list(t.columns), t.num_rows] for t in core.tables],
            "dtype": np.dtype(core.dtype).str,
            "time": [o.start_time, o.end_time, core.catalog.start_time, core.catalog.end_time],
            "align": [o.align, o.fill],
            "grid": repr(core.grid_spec),
            "normalize": repr(core.normalizer),
        }
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
