"""BatchReader: reads rows ``[start_row, stop_row)`` of every selected column into one array.

Parts, one job each: :class:`~tsfile_torch.read.openfiles.OpenFiles` (open readers, an LRU
bounded by ``max_open_files``), :mod:`~tsfile_torch.read.timeline` (row -> time index, so every
read is a time range: Note: reads by time range), :class:`~tsfile_torch.read.blockcache.BlockCache`
(decoded blocks), and this module: which groups a row range touches, decoding, and assembling
the output.

Blocks (Note: block cache): a group (one device of one file) is decoded ``block_rows`` rows at a
time and kept in a byte-bounded LRU cache, so consecutive batches do not decode the same pages
again. Blocks are clipped to the rows this reader serves (:meth:`BatchReader.set_range`: a
DataLoader worker's share), so no worker decodes another's rows. When the cache cannot hold two
blocks of every group a batch touches, blocks shrink to fit (:attr:`BatchReader.block_rows`).
Random access (``random_access=True``) to a group longer than one block reads exactly the rows
asked for instead of whole blocks. :meth:`BatchReader.clear_cache` drops the decoded values and
keeps the readers (a streaming epoch starts that way).

Read-ahead (Note: read-ahead in :mod:`tsfile_torch.read.readahead`): sequential reads decode the
next blocks in the background, and a pass's first batch decodes small.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import numpy as np

from tsfile_torch.catalog.build import Catalog, ReadGroup
from tsfile_torch.errors import SchemaError, TsFileFormatError
from tsfile_torch.integrity.checks import StatisticsCheck
from tsfile_torch.options import DEFAULT_MAX_OPEN_FILES
from tsfile_torch.read.blockcache import Block, BlockCache
from tsfile_torch.read.decode import GroupDecoder, misaligned
from tsfile_torch.read.exchange import fill_cache
from tsfile_torch.read.openfiles import OpenFiles
from tsfile_torch.read.readahead import FIRST_BLOCK_ROWS, ReadAhead, stopping_on_error
from tsfile_torch.read.readahead import local_rows as _local_rows
from tsfile_torch.read.timeline import DEFAULT_INDEX_STRIDE, marks_of, time_column_damaged

__all__ = [
    "BatchReader",
    "DEFAULT_BLOCK_ROWS",
    "FIRST_BLOCK_ROWS",
    "DEFAULT_CACHE_CAP",
    "RowView",
    "cache_cap",
    "default_cache_bytes",
]

logger = logging.getLogger(__name__)

#: Rows decoded per native call and per cache entry: fewer, larger queries decode an epoch
#: faster (smaller blocks: benchmarks/RESULTS.md, "Tried and not kept").
DEFAULT_BLOCK_ROWS = 131072
#: Upper bound of the default streaming cache, whatever the number of columns.
DEFAULT_CACHE_CAP = 1 << 30
_MIN_CACHE_BYTES = 256 << 20


def cache_cap() -> int:
    """Return the default cache's absolute cap: 1 GiB or a quarter of RAM, whichever is smaller."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_CACHE_CAP
    return min(DEFAULT_CACHE_CAP, ram // 4)


def _fit_block_rows(reader: BatchReader, block_rows: int) -> int:
    """Return ``block_rows``, lowered (to whole index strides) until two blocks of every group
    a batch touches fit the reader's cache."""
    if not reader.cache.capacity:
        return block_rows
    catalog, itemsize = reader.catalog, reader.dtype.itemsize
    row_bytes = len(catalog.columns) * itemsize + 8 * reader.full.segments.widest
    fit = reader.cache.capacity // (2 * max(row_bytes, 1))
    if fit >= block_rows:
        return block_rows
    stride = reader.index_stride
    return max(stride, fit // stride * stride)


def default_cache_bytes(catalog: Catalog, itemsize: int, block_rows: int) -> int:
    """Return the default block-cache budget (``cache_bytes=None``), for every kind of view.

    Two blocks of every group (values plus timestamps), at least 256 MiB, at most
    :func:`cache_cap`. Two let a batch that straddles a block boundary be served without
    decoding either block twice; the floor lets random windows revisit the blocks of a panel.
    """
    one = block_rows * (len(catalog.columns) * itemsize + 8 * len(catalog.groups))
    return min(max(_MIN_CACHE_BYTES, 2 * one), cache_cap())


class _Segments:
    """Which groups cover which rows: per-batch work grows with the groups a batch touches only."""

    def __init__(self, groups: dict[int, ReadGroup], ref_groups: set[int]):
        bounds = sorted(
            {g.start_row for g in groups.values()} | {g.stop_row for g in groups.values()}
        )
        self.bounds = np.asarray(bounds, dtype=np.int64)
        members: list[list[int]] = [[] for _ in range(max(len(bounds) - 1, 0))]
        for gi, g in groups.items():
            lo = int(np.searchsorted(self.bounds, g.start_row))
            hi = int(np.searchsorted(self.bounds, g.stop_row))
            for s in range(lo, hi):
                members[s].append(gi)
        order = lambda gi: (gi not in ref_groups, gi)  # noqa: E731 - timestamps first
        self.members = [sorted(m, key=order) for m in members]
        self._order = order

    def groups(self, start_row: int, stop_row: int) -> list[int]:
        """Return the groups holding rows of ``[start_row, stop_row)``, timestamp groups first."""
        lo = int(np.searchsorted(self.bounds, start_row, side="right")) - 1
        hi = min(int(np.searchsorted(self.bounds, stop_row, side="left")), len(self.members))
        if hi - lo == 1:
            return self.members[lo]
        seen = {gi for s in range(max(lo, 0), hi) for gi in self.members[s]}
        return sorted(seen, key=self._order)

    @property
    def widest(self) -> int:
        """Most groups over any one row."""
        return max((len(m) for m in self.members), default=0)


class RowView:
    """Some columns of a catalog that share one row numbering (all of them, or one device's).

    The row datasets read one view of every column; the window dataset one view per device.
    Every read group holding a column of the view must hold only columns of the view (groups
    are one device of one file, so any set of whole devices qualifies).

    Attributes:
        columns: catalog column indices, in output order.
        num_rows: rows of the view (its first column's).
    """

    def __init__(self, catalog: Catalog, columns: tuple[int, ...]):
        self.columns = tuple(columns)
        where = {c: i for i, c in enumerate(self.columns)}
        self.groups = {
            gi: g for gi, g in enumerate(catalog.groups) if set(g.columns) & set(self.columns)
        }
        for gi, g in self.groups.items():
            if not set(g.columns) <= set(self.columns):
                raise ValueError(f"read group {gi} holds columns outside the view")
        self.num_rows = catalog.columns[self.columns[0]].num_rows
        #: groups that hold the view's first column: they give each row's timestamp
        self.ref_groups = {gi for gi, g in self.groups.items() if self.columns[0] in g.columns}
        self.segments = _Segments(self.groups, self.ref_groups)
        self.targets = {
            gi: _target(tuple(where[c] for c in g.columns)) for gi, g in self.groups.items()
        }
        # a group whose rows are exactly those of a timestamp group: its blocks are verified
        # against that group's block once, not batch by batch
        spans = {(self.groups[i].start_row, self.groups[i].num_rows): i for i in self.ref_groups}
        self.twin = {
            gi: spans.get((g.start_row, g.num_rows))
            for gi, g in self.groups.items()
            if gi not in self.ref_groups
        }


class BatchReader:
    """Read row ranges of a :class:`~tsfile_torch.catalog.build.Catalog` through open readers.

    Args:
        catalog: what to read.
        read_backend: ``"auto"``, ``"mmap"`` or ``"pread"``, captured when each reader opens.
        dtype: numpy dtype of the output (float32 or float64).
        block_rows: rows decoded per native call (lowered when two blocks of every group a
            batch touches would not fit ``cache_bytes``).
        cache_bytes: budget of the decoded-block cache; ``None`` for
            :func:`default_cache_bytes`, ``0`` to decode exactly the rows asked for.
        malloc_tuning: apply :func:`tsfile_torch.native.malloc.tune_malloc` before the first
            open.
        decode_threads: groups decoded at once (tsfile's native read releases the GIL).
        max_open_files: readers open at once in this process.
        index_dir: directory caching timeline indexes across processes and runs (``None``:
            kept in memory only).
        index_stride: rows between two timeline index entries.
        check_statistics: check decoded blocks against the metadata statistics.
        cell_sums: the :class:`~tsfile_torch.integrity.checks.CellSums` table shared by the
            processes reading the same dataset (``None``: one of its own).
    """

    def __init__(
        self,
        catalog: Catalog,
        read_backend: str = "auto",
        dtype=np.float32,
        block_rows: int = DEFAULT_BLOCK_ROWS,
        cache_bytes: int | None = None,
        malloc_tuning: bool = True,
        decode_threads: int = 1,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        index_dir: str | None = None,
        index_stride: int = DEFAULT_INDEX_STRIDE,
        check_statistics: bool = True,
        cell_sums=None,
    ):
        self.catalog = catalog
        self.read_backend = read_backend
        self.dtype = np.dtype(dtype)
        self.decode_threads = decode_threads
        self.index_dir = index_dir
        self.index_stride = index_stride
        self.files = OpenFiles(catalog.files, read_backend, max_open_files, malloc_tuning)
        if cache_bytes is None:
            cache_bytes = default_cache_bytes(catalog, self.dtype.itemsize, block_rows)
        self.cache = BlockCache(cache_bytes, self.dtype)
        self._views: dict[tuple[int, ...], RowView] = {}
        #: The view of every column, in catalog order (what the row datasets read).
        self.full = self.view(tuple(range(len(catalog.columns))))
        #: Rows per decoded block actually used (see the module notes).
        self.block_rows = _fit_block_rows(self, block_rows)
        self._clip = (0, catalog.num_rows)
        # Note: integrity hooks (tsfile_torch.integrity.checks)
        self.statistics = (
            StatisticsCheck(catalog, self.dtype, cell_sums) if check_statistics else None
        )
        #: decodes row ranges of one group through the open files (Note: guarded read)
        self.decoder = GroupDecoder(
            catalog,
            self.files,
            read_backend,
            self.dtype,
            self.cache,
            self.statistics,
            index_dir,
            index_stride,
        )
        #: decodes ahead of the caller in the background (Note: read-ahead)
        self.ahead = ReadAhead(self, max_open_files)
        #: blocks fork workers share (Note: block exchange), and the pass it serves
        self.exchange, self.pass_epoch = None, -1

    # -- lifetime -------------------------------------------------------------------------
    def __getstate__(self):
        raise TypeError("BatchReader holds native readers: pickle the dataset, which drops it")

    @property
    def pid(self) -> int:
        return self.files.pid

    @property
    def num_open(self) -> int:
        """Readers open now."""
        return len(self.files)

    @property
    def open_count(self) -> int:
        """Native opens done by this reader (reopens after an LRU eviction included)."""
        return self.files.open_count

    @property
    def backends(self) -> dict[int, str]:
        """File index -> backend its open reader really uses (``"mmap"`` or ``"pread"``)."""
        return self.files.backends()

    @property
    def cache_bytes(self) -> int:
        return self.cache.capacity

    @property
    def cached_bytes(self) -> int:
        return self.cache.nbytes

    def view(self, columns: tuple[int, ...]) -> RowView:
        """Return the :class:`RowView` of catalog columns ``columns`` (made once per reader)."""
        found = self._views.get(columns)
        if found is None:
            found = self._views[columns] = RowView(self.catalog, columns)
        return found

    def close(self) -> None:
        """Close every reader and drop decoded blocks (timeline indexes are kept)."""
        self.ahead.close()
        self.files.close()
        self.cache.clear(drop_buffers=True)

    def clear_cache(self) -> None:
        """Drop decoded values (their buffers are kept for reuse); readers stay open. A new
        pass begins: its first reads decode small, or were decoded ahead by the pass before
        (Note: read-ahead)."""
        self.ahead.new_pass(keep_next=True)
        self.cache.clear()

    def set_range(self, start_row: int, stop_row: int) -> None:
        """Serve only rows ``[start_row, stop_row)`` from now on: blocks are clipped to them.

        A DataLoader worker calls this with its share of rows, so the blocks it decodes never
        hold another worker's rows. Drops cached blocks if the range changes.
        """
        clip = (max(0, start_row), min(stop_row, self.catalog.num_rows))
        if clip != self._clip:
            self.ahead.new_pass()
            self.cache.clear()
            self._clip = clip

    def check_unchanged(self) -> None:
        """Raise TsFileFormatError if a source file changed since the catalog was built."""
        for info in self.catalog.files:
            info.check_unchanged()

    # -- decoding (read/decode.py) ----------------------------------------------------------
    @property
    def on_read(self):
        """Called with a description of each native read before it starts, and with None after
        it (DataLoader workers record it so the main process can name a crashed read)."""
        return self.decoder.on_read

    @on_read.setter
    def on_read(self, hook) -> None:
        self.decoder.on_read = hook

    @property
    def decoded_rows(self) -> int:
        """Rows decoded by native queries, summed over groups (what caches save)."""
        return self.decoder.decoded_rows

    def read_group(self, group_index: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Read group-local rows ``[start, stop)`` of one read group (see
        :meth:`~tsfile_torch.read.decode.GroupDecoder.read_group`)."""
        return self.decoder.read_group(group_index, start, stop)

    # -- blocks -----------------------------------------------------------------------------
    def _block_rows_of(self, group: ReadGroup, block: int) -> tuple[int, int]:
        """Return local rows ``[lo, hi)`` of block ``block`` of ``group``, clipped to the range."""
        lo = max(block * self.block_rows, self._clip[0] - group.start_row, 0)
        hi = min((block + 1) * self.block_rows, self._clip[1] - group.start_row, group.num_rows)
        return lo, hi

    def _block_needs(self, group: ReadGroup, local_lo: int, local_hi: int):
        """Yield (block, need_lo, need_hi, lo, hi) for group-local rows ``[local_lo, local_hi)``.

        ``[need_lo, need_hi)`` are the rows wanted from block ``block``, ``[lo, hi)`` the rows
        the block holds (clipped to :meth:`set_range`).
        """
        for b in range(local_lo // self.block_rows, (local_hi - 1) // self.block_rows + 1):
            lo, hi = self._block_rows_of(group, b)
            need_lo = max(local_lo, b * self.block_rows)
            need_hi = min(local_hi, (b + 1) * self.block_rows)
            yield b, need_lo, need_hi, lo, hi

    def _pieces(self, group_index: int, start_row: int, stop_row: int, random_access: bool):
        """Yield (out_start, block_start, block_stop, block, block_number or None)."""
        group = self.catalog.groups[group_index]
        local_lo, local_hi = _local_rows(group, start_row, stop_row)
        if local_lo >= local_hi:
            return
        exact = not self.cache.capacity or (random_access and group.num_rows > self.block_rows)
        if exact:
            block = self.decoder.decode(self.decoder.plan(group_index, local_lo, local_hi))
            yield group.start_row + local_lo - start_row, 0, local_hi - local_lo, block, None
            self.cache.recycle(block)
            return
        for b, need_lo, need_hi, lo, hi in self._block_needs(group, local_lo, local_hi):
            if need_lo < lo or need_hi > hi:  # rows outside set_range: read exactly, keep none
                data = self.decoder.decode(self.decoder.plan(group_index, need_lo, need_hi))
                yield group.start_row + need_lo - start_row, 0, need_hi - need_lo, data, None
                self.cache.recycle(data)
                continue
            key = (group_index, b)
            data = self.cache.get(key) or self.ahead.take(key)
            head = self.ahead.heads.pop(key, None)
            if data is None and head is not None:  # decoded small (Note: read-ahead)
                yield group.start_row + need_lo - start_row, 0, need_hi - need_lo, head, None
                self.cache.recycle(head)
                self.ahead.later.append(key)  # the whole block, in the background
                continue
            if data is None:
                data = self.decoder.decode(self.decoder.plan(group_index, lo, hi))
                self.cache.put(key, data)
            self.ahead.begun.add(group_index)
            yield group.start_row + need_lo - start_row, need_lo - lo, need_hi - lo, data, b

    # -- assembly ---------------------------------------------------------------------------
    @stopping_on_error  # Note: an error stops its read-ahead
    def read(
        self,
        start_row: int,
        stop_row: int,
        out: np.ndarray | None = None,
        random_access: bool = False,
        view: RowView | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Read rows ``[start_row, stop_row)`` of every column of ``view`` (default: all).

        Args:
            start_row: first row, ``0 <= start_row < stop_row <= view.num_rows``.
            stop_row: one past the last row.
            out: optional C-contiguous ``(stop_row - start_row, num_columns)`` array to fill.
            random_access: the caller jumps around (random windows): groups longer than one
                block are read exactly, not by whole blocks.
            view: the columns (:meth:`view`); ``None``: :attr:`full`.

        Returns:
            ``(values, timestamps)``: values ``(rows, columns)`` in ``dtype``, nulls as NaN;
            timestamps int64 ``(rows,)``.

        Raises:
            ValueError: the range is outside ``[0, num_rows]`` or empty.
            SchemaError: columns disagree on the timestamp of a row.
            TsFileFormatError: a file cannot be read or returned fewer rows than its metadata.
        """
        view = view or self.full
        if not 0 <= start_row < stop_row <= view.num_rows:
            raise ValueError(
                f"row range [{start_row}, {stop_row}) is outside the dataset's "
                f"{view.num_rows} rows or empty"
            )
        n = stop_row - start_row
        shape = (n, len(view.columns))
        if out is None:
            out = np.empty(shape, dtype=self.dtype)
        elif out.shape != shape or out.dtype != self.dtype:
            raise ValueError(
                f"out must have shape {shape} and dtype {self.dtype}; got {out.shape} {out.dtype}"
            )
        times = np.empty(n, dtype=np.int64)
        groups = view.segments.groups(start_row, stop_row)
        ahead = self.ahead.on and self.cache.capacity and not random_access
        if ahead:
            self.ahead.first_reads(start_row, stop_row, groups)
        if self.decode_threads > 1 and self.cache.capacity and not random_access:
            self.ahead.prefetch(start_row, stop_row, groups)
        for gi in groups:
            target = view.targets[gi]
            for o, a, b, block, number in self._pieces(gi, start_row, stop_row, random_access):
                m = b - a
                if gi in view.ref_groups:
                    times[o : o + m] = block.times[a:b]
                elif not block.verified:
                    self._check_times(view, gi, times[o : o + m], block.times[a:b], start_row + o)
                    self._verify_block(view, gi, block, number)
                out[o : o + m, target] = block.values[:, a:b].T
        if ahead:
            self.ahead.after_read(groups, start_row, stop_row)
        return out, times

    @stopping_on_error
    def take(self, rows: np.ndarray, view: RowView | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Gather rows ``rows`` (any order, repeats allowed) of every column of ``view``.

        What a buffer-shuffled batch reads: the blocks the rows fall in are decoded once into
        the block cache and the rows picked from them, one numpy gather per group and block.

        Returns:
            ``(values, timestamps)`` as :meth:`read`, in the order of ``rows``.
        """
        view = view or self.full
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= view.num_rows):
            raise ValueError(f"rows outside the dataset's {view.num_rows} rows")
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        # gathered in sorted row order (each block read front to back), column by column;
        # put in the order of ``rows`` by one row scatter at the end
        values = np.empty((len(view.columns), len(rows)), dtype=self.dtype)
        stamps = np.empty(len(rows), dtype=np.int64)
        groups = sorted(view.groups, key=lambda gi: gi not in view.ref_groups)  # timestamps first
        runs = _runs(view, groups, ordered, self.block_rows)
        if self.cache.capacity and (self.decode_threads > 1 or self.exchange is not None):
            _fetch_blocks(self, view, runs)  # the blocks touched, before the gather
        for gi, (lo, local, parts) in runs.items():
            group = view.groups[gi]
            target = view.targets[gi]
            for _, a, b in parts:
                first, last = int(local[a]), int(local[b - 1]) + 1
                for o, ba, _, block, number in self._pieces(
                    gi, group.start_row + first, group.start_row + last, False
                ):
                    # a run lies in one block: its one piece holds all of its rows
                    pick = local[a:b] - first - o + ba
                    at = slice(lo + a, lo + b)
                    if gi in view.ref_groups:
                        stamps[at] = block.times[pick]
                    elif not block.verified:
                        got = block.times[pick]
                        self._check_times(view, gi, stamps[at], got, ordered[at])
                        self._verify_block(view, gi, block, number)
                    _gather(values, target, at, block.values, pick)
        out = np.empty((len(rows), len(view.columns)), dtype=self.dtype)
        times = np.empty(len(rows), dtype=np.int64)
        out[order] = values.T
        times[order] = stamps
        return out, times

    def _check_times(self, view, gi: int, ref: np.ndarray, got: np.ndarray, row) -> None:
        """Raise SchemaError where ``got`` differs from the timestamps ``ref``; ``row``: the
        dataset row of the first (consecutive rows) or of each (an array) compared."""
        if not np.array_equal(ref, got):
            bad = int(np.flatnonzero(ref != got)[0])
            group = self.catalog.groups[gi]
            at = int(row) + bad if np.ndim(row) == 0 else int(row[bad])
            message = misaligned(self.catalog, group, view.columns[0], at, ref[bad], got[bad])
            raise SchemaError(message)

    def _verify_block(self, view: RowView, gi: int, block: Block, number: int | None) -> None:
        """Mark ``block`` verified if its twin timestamp block is cached and equal."""
        twin = view.twin.get(gi)
        if twin is None or number is None:
            return
        ref = self.cache.peek((twin, number))
        if ref is not None and np.array_equal(ref.times, block.times):
            block.verified = True


def read_times(reader: BatchReader, columns: tuple[int, ...]) -> Iterator[np.ndarray]:
    """Yield the timestamps of the rows of ``reader.view(columns)``, one read group at a time
    (their time columns only, no values decoded). Each group's timeline index is taken from
    them and saved where the index cache is on, so no later reader reads the column again
    (Note: seeded indexes in :mod:`tsfile_torch.read.timeline`).

    Raises:
        TsFileFormatError: a group's time column disagrees with its metadata row count.
    """
    view = reader.view(columns)
    for gi in sorted(view.ref_groups, key=lambda g: view.groups[g].start_row):
        times = reader.decoder.group_times(gi)
        group = view.groups[gi]
        if len(times) != group.num_rows:
            name = reader.catalog.files[group.file_index].name
            device = f"{name}: device {'.'.join(map(str, group.device))}"
            t0, t1 = group.start_time, group.end_time
            message = time_column_damaged(device, 0, t0, t1, len(times), group.num_rows, t1)
            raise TsFileFormatError(message)
        stride = reader.decoder.index_stride
        marks = marks_of(times, group.num_rows, group.start_time, group.end_time, stride)
        if marks is not None:
            reader.decoder.seed(gi, marks, stride, save=True)
        yield times


def _fetch_blocks(reader: BatchReader, view: RowView, runs: dict) -> None:
    """Get the blocks a gather's ``runs`` touch into ``reader``'s cache first: from the
    workers' block exchange (Note: block exchange), else decoded on the decode threads."""
    needs = []
    for gi, (_, local, parts) in runs.items():
        for b, a, z in parts:  # the rows a run needs: outside set_range, no prefetch
            need = (int(local[a]), int(local[z - 1]) + 1)
            needs.append((gi, b, *need, *reader._block_rows_of(view.groups[gi], b)))
    if reader.exchange is None:
        reader.ahead.prefetch_blocks(needs)
        return
    wanted, itemsize = [], reader.dtype.itemsize
    for gi, b, need_lo, need_hi, lo, hi in needs:
        if lo <= need_lo and need_hi <= hi:  # else read exactly, as the gather does
            row_bytes = len(reader.catalog.groups[gi].columns) * itemsize + 8
            wanted.append(((gi, b), (gi, b, lo, hi), (hi - lo) * row_bytes))

    def decode(key):
        return reader.decoder.decode(reader.decoder.plan(key[0], key[2], key[3]))

    fill_cache(reader.exchange, reader.cache, reader.pass_epoch, reader.dtype, wanted, decode)


def _runs(view: RowView, groups, ordered: np.ndarray, block_rows: int) -> dict:
    """Where sorted dataset rows ``ordered`` fall: group -> ``(lo, local, runs)``, with
    ``ordered[lo:lo + len(local)]`` the group's rows, ``local`` them group-local, and ``runs``
    ``(block, a, b)``: ``local[a:b]`` lie in block ``block``."""
    out = {}
    for gi in groups:
        group = view.groups[gi]
        lo, hi = np.searchsorted(ordered, [group.start_row, group.stop_row])
        if lo < hi:
            local = ordered[lo:hi] - group.start_row
            blocks = local // block_rows
            cuts = np.flatnonzero(np.diff(blocks)) + 1
            starts, stops = np.r_[0, cuts], np.r_[cuts, len(local)]
            out[gi] = (
                int(lo),
                local,
                list(zip(blocks[starts].tolist(), starts, stops, strict=True)),
            )
    return out


def _gather(values: np.ndarray, target, at: slice, block: np.ndarray, pick: np.ndarray) -> None:
    """``values[target, at] = block[:, pick]`` for ``(columns, rows)`` arrays, without a
    temporary where the columns are a slice (one contiguous take per column)."""
    if isinstance(target, slice):
        for k, column in enumerate(block):
            np.take(column, pick, out=values[target.start + k, at])
    else:
        values[target, at] = block[:, pick]


def _target(columns: tuple[int, ...]) -> slice | list[int]:
    """Return the output columns of a group: a slice when they are consecutive."""
    if columns == tuple(range(columns[0], columns[0] + len(columns))):
        return slice(columns[0], columns[0] + len(columns))
    return list(columns)
