"""GroupDecoder: decodes row ranges of one read group (one device of one file) into blocks.

What :class:`~tsfile_torch.read.reader.BatchReader` asks of the files: the row -> time index of
a group (Note: reads by time range), a time-range query of its rows, and the decoded block,
every native call through the one guarded read (:mod:`tsfile_torch.native.guard`: change check,
announcement, error translation, statistics check, damage memory). Buffers come from, and go
back to, the reader's :class:`~tsfile_torch.read.blockcache.BlockCache` (Note: recycled
buffers).

Note: head reads. Rows ``[0, n)`` of a group whose timeline index this process has not needed
yet, in a file where each of its series is one chunk (the writer's default), are read without
the index: from the group's first timestamp to where the mean sampling step (metadata: time
range over row count) puts row ``n - 1``, plus :data:`HEAD_MARGIN`; a range that holds fewer
rows is followed by the next one from its end, twice as long each time, until ``n`` rows came
(or the group's end: then it is the usual lost-rows error). Regularly sampled data takes one
query; the first batch of a process then costs its decode only, not an index load (four checking
queries per group, Note: index cache in :mod:`tsfile_torch.read.timeline`) or a pass over the
time column. Series of several chunks always go through the index (Note: whole time column
first: a damaged later chunk header must be found before rows are handed out).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tsfile_torch.catalog.build import Catalog, ReadGroup
from tsfile_torch.errors import SKIP_HINT, SchemaError, TsFileFormatError
from tsfile_torch.native.guard import damage_remembered, guarded_call
from tsfile_torch.native.queries import query, query_times
from tsfile_torch.read.blockcache import Block, BlockCache
from tsfile_torch.read.openfiles import OpenFiles
from tsfile_torch.read.timeline import TimeIndex, open_index, save_index, seeded_index

__all__ = ["GroupDecoder", "Plan", "misaligned"]

#: How far past the estimated time of its last row a head read's first query reaches (a
#: fraction of the estimate; Note: head reads).
HEAD_MARGIN = 1 / 32


@dataclass(frozen=True)
class Plan:
    """One native read, prepared in the calling thread: group-local rows of one group."""

    group_index: int
    group: ReadGroup
    reader: object
    handles: list
    span: tuple[int, int | None, int]  # start_time, end_time (None: a head read), rows to skip
    start: int
    num_rows: int
    via: str = ""  # the backend of ``reader`` when it is not the decoder's (read-ahead's pread)


class GroupDecoder:
    """Decode group-local row ranges through ``files`` (see the module notes)."""

    def __init__(
        self,
        catalog: Catalog,
        files: OpenFiles,
        read_backend: str,
        dtype: np.dtype,
        buffers: BlockCache,
        statistics,
        index_dir: str | None,
        index_stride: int,
    ):
        self.catalog = catalog
        self.files = files
        self.read_backend = read_backend
        self.dtype = dtype
        self.buffers = buffers
        self.statistics = statistics
        self.index_dir = index_dir
        self.index_stride = index_stride
        self._indexes: dict[int, TimeIndex] = {}
        self._lock = threading.Lock()  # counters, shared with decode threads
        #: Rows decoded by native queries, summed over groups (what caches save).
        self.decoded_rows = 0
        #: called with a description of each native read before it starts, and with None after
        self.on_read = None

    def group_times(self, group_index: int, t0=None, t1=None, purpose: str = "") -> np.ndarray:
        """Return the timestamps of one read group in ``[t0, t1]`` (default: all of them; its
        time column only, one guarded query); ``purpose`` ends the read's description."""
        group = self.catalog.groups[group_index]
        t0 = group.start_time if t0 is None else t0
        t1 = group.end_time if t1 is None else t1
        reader, handles = self.files.handles(group_index, group)  # may have been closed
        what = f"device {'.'.join(map(str, group.device))}, timestamps [{t0}, {t1}]{purpose}"
        return guarded_call(  # Note: guarded read
            self.catalog.files[group.file_index],
            what,
            query_times,
            reader,
            handles[0],
            group.aligned,
            t0,
            t1,
            on_read=self.on_read,
        )

    def index(self, group_index: int) -> TimeIndex:
        index = self._indexes.get(group_index)
        if index is None:
            group = self.catalog.groups[group_index]
            info = self.catalog.files[group.file_index]
            fetch, key = self._index_source(group_index)
            index = open_index(fetch, info, group, self.index_stride, self.index_dir, key)
            self._indexes[group_index] = index
        return index

    def seed(self, group_index: int, marks: np.ndarray, stride: int, save: bool = False) -> None:
        """Take ``marks`` (the group's timestamps at rows 0, ``stride``, ...; read before with
        its whole time column) as the group's complete timeline index (Note: seeded indexes in
        :mod:`tsfile_torch.read.timeline`); with ``save`` also write it to the index cache
        where one is set. A group that has an index in this process, or marks of another
        stride or shape, is left as it is (its index is then learned from the file)."""
        if group_index in self._indexes or stride != self.index_stride:
            return
        group = self.catalog.groups[group_index]
        info = self.catalog.files[group.file_index]
        fetch, key = self._index_source(group_index) if save else (self._fetch(group_index), None)
        index = seeded_index(fetch, info, group, marks, stride, self.index_dir, key)
        if index is None:
            return
        self._indexes[group_index] = index
        if index.cache_path and not os.path.exists(index.cache_path):
            info.check_unchanged()  # Note: index cache
            save_index(index)

    def _fetch(self, group_index: int):
        """Return ``fetch(t0, t1)``: the group's timestamps in ``[t0, t1]``, for its index."""
        purpose = f" for the timeline index via {self.read_backend}"

        def fetch(t0: int, t1: int) -> np.ndarray:
            return self.group_times(group_index, t0, t1, purpose)

        return fetch

    def _index_source(self, group_index: int):
        """Return the group's index ``fetch`` and its cache key (None: not cached)."""
        group = self.catalog.groups[group_index]
        info = self.catalog.files[group.file_index]
        # open first: the cache key is the identity the reader was opened on (Note: index
        # cache), never the file's identity at save time
        self.files.handles(group_index, group)
        opened = self.files.opened_identity(group.file_index)
        key = info.source.index_key(opened) if opened is not None else None
        return self._fetch(group_index), key

    def span(self, group_index: int, start: int, stop: int) -> tuple[int, int | None, int]:
        """Return ``(start_time, end_time, rows to skip)`` of local rows ``[start, stop)``;
        ``end_time`` None: a head read (Note: head reads)."""
        group = self.catalog.groups[group_index]
        if start == 0 and stop == group.num_rows:
            return group.start_time, group.end_time, 0
        if start == 0 and group_index not in self._indexes and _one_chunk(group):
            return group.start_time, None, 0
        # learning the index checks the time column it reads (Note: whole time column first):
        # a mismatch found there is damage too
        with damage_remembered(self.catalog.files[group.file_index]):
            index = self.index(group_index)
            was_complete = index.complete
            span = index.time_range(start, stop)
        if index.cache_path and index.complete and not was_complete:
            self.catalog.files[group.file_index].check_unchanged()  # Note: index cache
            save_index(index)
        return span

    def plan(
        self, group_index: int, start: int, stop: int, files: OpenFiles | None = None, span=None
    ) -> Plan:
        """Return what decoding local rows ``[start, stop)`` needs (opens, indexes: main thread).

        ``files``: readers of the same files to decode through instead of the decoder's own
        (read-ahead's pread readers of mapped files, Note: read-ahead); the index is the
        decoder's either way. ``span``: :meth:`span` of the rows, found before (the main
        thread learns indexes; a decode ahead then opens and prepares its pread reader on
        its own thread).
        """
        group = self.catalog.groups[group_index]
        span = self.span(group_index, start, stop) if span is None else span
        files = self.files if files is None else files  # (an OpenFiles with none open is falsy)
        via = files.read_backend if files is not self.files else ""
        reader, handles = files.handles(group_index, group)
        return Plan(group_index, group, reader, handles, span, start, stop - start, via)

    def decode(self, plan: Plan) -> Block:
        """Decode one planned range of one group into a block of exactly its rows.

        Note: integrity hooks (tsfile_torch.integrity.checks), through Note: guarded read
        (:mod:`tsfile_torch.native.guard`): the file is checked unchanged before and after,
        the read is announced (worker slot; a frame that names it in a fatal signal report),
        and the decoded block is checked against the metadata statistics.
        """
        info = self.catalog.files[plan.group.file_index]
        check = self.statistics
        verify = None
        if check is not None:

            def verify(block: Block) -> None:
                check.block(plan.group_index, plan.start, block.times, block.values)

        return guarded_call(
            info,
            self._describe(plan),
            self._decode_native,
            plan,
            on_read=self.on_read,
            verify=verify,
        )

    def _decode_native(self, plan: Plan) -> Block:
        group, num_rows = plan.group, plan.num_rows
        start_time, end_time, skip = plan.span
        out = self.buffers.buffers(len(plan.handles), num_rows)
        want = skip + num_rows
        try:
            got, t0, tries = 0, start_time, 0
            while True:  # one time range; a head read: growing ones from the start (see notes)
                t1 = end_time if end_time is not None else _head_end(group, t0, want - got, tries)
                got = self._query_into(plan, out, t0, t1, got, want)
                if end_time is not None or got >= want or t1 >= group.end_time:
                    break
                t0, tries = t1 + 1, tries + 1
            if got < want:
                raise TsFileFormatError(self._lost(group, start_time, num_rows, got - skip))
        except BaseException:
            self.buffers.recycle(out)
            raise
        with self._lock:
            self.decoded_rows += num_rows
        return out

    def _query_into(self, plan: Plan, out: Block, t0: int, t1: int, got: int, want: int) -> int:
        """Query times ``[t0, t1]`` of ``plan``'s group; put its rows from ``got`` on (minus
        the span's rows to skip) into ``out`` up to ``want``; return the rows read so far."""
        group, skip = plan.group, plan.span[2]
        times, values = out.times, out.values
        pos = got
        for k0, result in enumerate(query(plan.reader, plan.handles, group.aligned, t0, t1)):
            pos = got
            with result:
                while pos < want and (batch := result.read_arrow_record_batch()) is not None:
                    a, b = max(pos, skip), min(pos + batch.num_rows, want)
                    if a < b:
                        part = batch.slice(a - pos, b - a)
                        o = a - skip
                        stamps = part.column(0).to_numpy(zero_copy_only=False)
                        if k0 == 0:
                            times[o : o + b - a] = stamps
                        elif not np.array_equal(times[o : o + b - a], stamps):
                            raise SchemaError(
                                misaligned(
                                    self.catalog, group, group.columns[0], group.start_row + o
                                )
                            )
                        for k in range(1, part.num_columns):
                            values[k0 + k - 1, o : o + b - a] = _as_float(part.column(k))
                    pos += batch.num_rows
        return min(pos, want)

    def read_group(self, group_index: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Read group-local rows ``[start, stop)`` of one read group (one device of one file).

        Cost ~ the rows read, wherever they sit in the file (a time-range query).

        Returns:
            ``(times, values)``: int64 ``(n,)`` timestamps and ``(len(group.columns), n)`` values
            in ``dtype`` (nulls NaN), in the order of ``catalog.groups[group_index].columns``.
            The arrays may be reused by later calls: copy what you keep.
        """
        group = self.catalog.groups[group_index]
        if not 0 <= start < stop <= group.num_rows:
            raise ValueError(
                f"rows [{start}, {stop}) are outside group {group_index}'s {group.num_rows} rows"
            )
        block = self.decode(self.plan(group_index, start, stop))
        return block.times, block.values

    def _describe(self, plan: Plan) -> str:
        return (
            f"reading device {'.'.join(map(str, plan.group.device))}, rows [{plan.start}, "
            f"{plan.start + plan.num_rows}) via {plan.via or self.read_backend}"
        )

    def _lost(self, group: ReadGroup, start_time: int, num_rows: int, got: int) -> str:
        info = self.catalog.files[group.file_index]
        return (
            f"{info.name}: device {'.'.join(map(str, group.device))} returned {got} rows from "
            f"time {start_time}, expected {num_rows}; metadata and data disagree (damaged or "
            f"changed file); {SKIP_HINT}"
        )


def _one_chunk(group: ReadGroup) -> bool:
    """Whether every series of ``group`` is one chunk in its file (Note: head reads); a count
    the binding does not give (0) is not one."""
    return all(shard.chunks == 1 for shard in group.shards)


def _head_end(group: ReadGroup, t0: int, rows: int, tries: int) -> int:
    """The end of a head read's next query from ``t0`` for ``rows`` more rows: the time the
    mean sampling step puts them at, plus :data:`HEAD_MARGIN` of it, doubled for each query
    that fell short before (``tries``; Note: head reads)."""
    step = (group.end_time - group.start_time) / max(group.num_rows - 1, 1)
    reach = max(rows - 1, 1) * step * (1 + HEAD_MARGIN) * 2**tries
    return min(group.end_time, t0 + max(1, math.ceil(reach)))


def misaligned(
    catalog: Catalog, group: ReadGroup, ref: int, row: int, ref_time=None, time=None
) -> str:
    """Return the message of columns of one group that do not share timestamps."""
    names = [catalog.columns[c].name for c in group.columns]
    where = f"at row {row} (time {ref_time} vs {time})" if time is not None else f"near row {row}"
    info = catalog.files[group.file_index]
    return (
        f"{info.name}: columns {names} do not share timestamps with column "
        f"{catalog.columns[ref].name!r} {where}, though their metadata agree on row "
        f"count and time range: either they sample at different times (pass align='union' "
        f"/ 'intersect' to join them on time) or a file is damaged (check it with "
        f"`tsfile-torch verify`)"
    )


def _as_float(column: pa.Array) -> np.ndarray:
    """Return an Arrow numeric column as a float numpy array, nulls as NaN."""
    kind = column.type
    if pa.types.is_floating(kind):
        return column.to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        column = column.cast(pa.int64())
    # safe=False: an int64 beyond 2**53 rounds to the nearest float64 (the datasets warn from
    # the metadata, _warn_inexact_integers) instead of raising ArrowInvalid as damage
    return pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)
