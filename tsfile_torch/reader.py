"""BatchReader: reads rows ``[start_row, stop_row)`` of every selected column into one array.

Per process, readers open lazily (Note: readers live in the process that uses them) and stay
open until :meth:`BatchReader.close`; each read group (one device of one file) is prepared once
with ``prepare_series`` and read with one native ``query_prepared_multi`` call per block.

Blocks (Note: block cache): a group is decoded ``block_rows`` rows at a time and the decoded
block is kept in a bounded LRU cache of ``cache_bytes``, so consecutive batches and overlapping
random windows do not decode the same pages again. :meth:`BatchReader.clear_cache` drops the
decoded values and keeps the readers (a streaming epoch starts that way).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .backend import open_reader
from .catalog import Catalog, ReadGroup
from .errors import SchemaError, TsFileFormatError
from .integrity import StatisticsCheck, check_unchanged
from .workers import reading

__all__ = ["BatchReader", "DEFAULT_BLOCK_ROWS", "default_cache_bytes", "tune_malloc"]

logger = logging.getLogger(__name__)

#: Rows decoded per native call and per cache entry. Measured on the reference workload: one
#: 131,072-row query per file decodes in 0.10 s per epoch, two 65,536-row queries in 0.17 s
#: (a block edge inside a 10,000-point page decodes that page twice, and offsets skip pages).
DEFAULT_BLOCK_ROWS = 131072
_MIN_CACHE_BYTES = 64 << 20


def default_cache_bytes(catalog: Catalog, itemsize: int, block_rows: int) -> int:
    """Return the default block-cache budget: two blocks of every group, at least 64 MiB.

    One block of every group is ``block_rows * (num_columns * itemsize + 8 * num_groups)``
    bytes (values plus timestamps); two let a batch that straddles a block boundary be served
    without decoding either block twice.
    """
    one = block_rows * (len(catalog.columns) * itemsize + 8 * len(catalog.groups))
    return max(_MIN_CACHE_BYTES, 2 * one)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_TUNED_PID: int | None = None


def tune_malloc() -> bool:
    """Keep glibc from returning decode buffers to the OS between queries (once per process).

    tsfile decodes into freshly allocated native buffers; with glibc's defaults, buffers over
    the dynamic mmap threshold are unmapped on free and page-faulted in again on the next query.
    ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` and ``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` (what the
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables do) took a
    streaming epoch of the reference workload from 0.17 s to 0.10 s here. The cost: up to 1 GiB
    of freed heap may stay in the process instead of going back to the OS.

    Returns:
        True if applied (glibc), False where mallopt is unavailable.
    """
    global _TUNED_PID
    if _TUNED_PID == os.getpid():
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    except (OSError, AttributeError):
        return False
    if ok:
        _TUNED_PID = os.getpid()
        logger.debug("glibc malloc tuned for tsfile decoding (pid %d)", _TUNED_PID)
    return ok


@dataclass
class _Block:
    times: np.ndarray  # int64 (n,)
    values: np.ndarray  # (k, n) in the output dtype

    @property
    def nbytes(self) -> int:
        return self.times.nbytes + self.values.nbytes


class BatchReader:
    """Read row ranges of a :class:`~tsfile_torch.catalog.Catalog` through open TsFile readers.

    Args:
        catalog: what to read.
        read_backend: ``"auto"``, ``"mmap"`` or ``"pread"``, captured when each reader opens.
        dtype: numpy dtype of the output (float32 or float64).
        block_rows: rows decoded per native call.
        cache_bytes: budget of the decoded-block cache; ``None`` for
            :func:`default_cache_bytes`, ``0`` to decode exactly the rows asked for.
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
        check_statistics: bool = True,
    ):
        self.catalog = catalog
        self.malloc_tuning = malloc_tuning
        self.decode_threads = decode_threads
        self._pool = None
        self._lock = threading.Lock()  # spare buffers and counters, shared with decode threads
        self.read_backend = read_backend
        self.dtype = np.dtype(dtype)
        self.block_rows = block_rows
        self.cache_bytes = (
            default_cache_bytes(catalog, self.dtype.itemsize, block_rows)
            if cache_bytes is None
            else cache_bytes
        )
        self.pid = os.getpid()
        #: Native opens done by this reader (a test of reuse across epochs reads it).
        self.open_count = 0
        #: Rows decoded by native queries, summed over groups (what caches save).
        self.decoded_rows = 0
        #: File index -> backend the open reader really uses ("mmap" or "pread").
        self.backends: dict[int, str] = {}
        self._readers: dict[int, object] = {}
        self._prepared: dict[int, list] = {}
        self._cache: OrderedDict[tuple[int, int], _Block] = OrderedDict()
        self._cached_bytes = 0
        # Note: recycled buffers. Blocks dropped from the cache keep their memory here and are
        # refilled by the next decode of the same shape: fresh arrays would page-fault every
        # epoch (measured: ~140k minor faults per streaming epoch of the reference workload).
        self._spare: dict[tuple[int, int], list[_Block]] = {}
        self._matrix: np.ndarray | None = None
        self._matrix_times: np.ndarray | None = None
        self._filled: np.ndarray | None = None
        self._ref_groups = {i for i, g in enumerate(catalog.groups) if 0 in g.columns}
        self._read_order = sorted(
            range(len(catalog.groups)), key=lambda i: i not in self._ref_groups
        )
        # -- issue 7 integrity hooks (Note: integrity hooks in tsfile_torch.integrity) ---------
        self.statistics = StatisticsCheck(catalog, self.dtype) if check_statistics else None
        #: called with a description of each native read before it starts, and with None after
        #: it (DataLoader workers record it so the main process can name a crashed read)
        self.on_read = None

    # -- lifetime -------------------------------------------------------------------------
    def __getstate__(self):
        raise TypeError(
            "BatchReader holds native readers and cannot be pickled; pickle the "
            "dataset instead, which drops its reader"
        )

    @property
    def num_open(self) -> int:
        return len(self._readers)

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    def close(self) -> None:
        """Close every reader and drop decoded blocks."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._prepared.clear()
        for reader in self._readers.values():
            try:
                reader.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                logger.debug("closing a reader failed", exc_info=True)
        self._readers.clear()
        self.backends.clear()
        self.clear_cache()
        self._spare.clear()
        self._matrix = self._matrix_times = self._filled = None

    def set_block_rows(self, block_rows: int) -> None:
        """Change the block size; drops cached blocks if it changes."""
        if block_rows != self.block_rows:
            self.clear_cache()
            self._spare.clear()
            self.block_rows = block_rows

    def clear_cache(self) -> None:
        """Drop decoded values (their buffers are kept for reuse); readers stay open."""
        for block in self._cache.values():
            self._recycle(block)
        self._cache.clear()
        self._cached_bytes = 0

    def _recycle(self, block: _Block) -> None:
        self._spare.setdefault(block.values.shape, []).append(block)

    def _buffers(self, k: int, n: int) -> _Block:
        with self._lock:
            spare = self._spare.get((k, n))
            if spare:
                return spare.pop()
        return _Block(np.empty(n, dtype=np.int64), np.empty((k, n), dtype=self.dtype))

    def check_unchanged(self) -> None:
        """Raise TsFileFormatError if a source file changed since the catalog was built.

        See :func:`tsfile_torch.integrity.check_unchanged` (size, mtime, ctime, inode).
        """
        for info in self.catalog.files:
            check_unchanged(info)

    def _reader(self, file_index: int):
        if self.pid != os.getpid():
            raise RuntimeError(
                "BatchReader used in a process other than the one that created "
                "it; create a new BatchReader per process"
            )
        reader = self._readers.get(file_index)
        if reader is None:
            if self.malloc_tuning:
                tune_malloc()
            info = self.catalog.files[file_index]
            if not isinstance(info.source, str):
                info.source.seek(0)
            reader, actual = open_reader(info.source, self.read_backend)
            self.open_count += 1
            self._readers[file_index] = reader
            self.backends[file_index] = actual
            logger.debug("opened %s with backend %s (pid %d)", info.name, actual, self.pid)
        return reader

    def _handles(self, group_index: int) -> list:
        handles = self._prepared.get(group_index)
        if handles is None:
            group = self.catalog.groups[group_index]
            info = self.catalog.files[group.file_index]
            reader = self._reader(group.file_index)
            handles, owner = [], None
            for shard in group.shards:
                locator = (
                    0,
                    group.file_index,
                    info.nbytes,
                    0,
                    shard.meta_index,
                    int(shard.aligned),
                    0,
                    shard.value_offset,
                    shard.value_length,
                    shard.time_offset,
                    shard.time_length,
                )
                try:
                    handle = reader.prepare_series(locator, time_owner=owner, trust_index=True)
                except Exception as err:
                    raise TsFileFormatError(
                        f"{info.name}: cannot prepare series {shard.measurement!r} of device "
                        f"{'.'.join(map(str, shard.device))} ({type(err).__name__}: {err})"
                    ) from err
                if group.aligned and owner is None:
                    owner = handle
                handles.append(handle)
            self._prepared[group_index] = handles
        return handles

    # -- decoding -------------------------------------------------------------------------
    def _decode(self, group_index: int, start: int, num_rows: int) -> _Block:
        """Decode local rows [start, start + num_rows) of one group, with the issue 7 hooks.

        Note: integrity hooks (tsfile_torch.integrity). Around every native read: the file is
        checked unchanged before and after, the read is announced (worker slot; a frame that
        names it in a fatal signal report), and the decoded block is checked against the
        metadata statistics.
        """
        group = self.catalog.groups[group_index]
        check_unchanged(self.catalog.files[group.file_index])
        what = self._describe(group, start, num_rows)
        if self.on_read is not None:
            self.on_read(what)
        try:
            block = reading(what, self._decode_native, group_index, start, num_rows)
        finally:
            if self.on_read is not None:
                self.on_read(None)
        check_unchanged(self.catalog.files[group.file_index])  # changed during the read?
        if self.statistics is not None:
            self.statistics.block(group_index, start, block.times, block.values)
        return block

    def _decode_native(self, group_index: int, start: int, num_rows: int) -> _Block:
        """Decode local rows [start, start + num_rows) of one group."""
        group = self.catalog.groups[group_index]
        reader = self._reader(group.file_index)
        handles = self._handles(group_index)
        out = self._buffers(len(handles), num_rows)  # no spares without a cache: a new block
        times, values = out.times, out.values
        pos = 0
        try:
            if group.aligned:
                results = iter([reader.query_prepared_multi(handles, offset=start, limit=num_rows)])
            else:  # one query per series, opened one at a time
                results = (reader.query_prepared(h, offset=start, limit=num_rows) for h in handles)
            for k0, result in enumerate(results):
                pos = 0
                with result:
                    while (batch := result.read_arrow_record_batch()) is not None:
                        n = batch.num_rows
                        if pos + n > num_rows:
                            raise TsFileFormatError(self._lost(group, start, num_rows, pos + n))
                        if k0 == 0:
                            times[pos : pos + n] = batch.column(0).to_numpy(zero_copy_only=False)
                        elif not np.array_equal(times[pos : pos + n], batch.column(0).to_numpy()):
                            raise SchemaError(
                                self._misaligned(group, group.start_row + start + pos)
                            )
                        for k in range(1, batch.num_columns):
                            values[k0 + k - 1, pos : pos + n] = _as_float(batch.column(k))
                        pos += n
                if pos != num_rows:
                    raise TsFileFormatError(self._lost(group, start, num_rows, pos))
            with self._lock:
                self.decoded_rows += num_rows
        except (TsFileFormatError, SchemaError):
            raise
        except Exception as err:
            info = self.catalog.files[group.file_index]
            raise TsFileFormatError(
                f"{info.name}: reading rows [{start}, {start + num_rows}) of device "
                f"{'.'.join(map(str, group.device))} failed ({type(err).__name__}: {err}); the "
                f"file may be damaged or changed while in use"
            ) from err
        return out

    def read_group(self, group_index: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Read group-local rows ``[start, stop)`` of one read group (one device of one file).

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
        block = self._decode(group_index, start, stop - start)
        return block.times, block.values

    def _describe(self, group: ReadGroup, start: int, num_rows: int) -> str:
        info = self.catalog.files[group.file_index]
        backend = self.backends.get(group.file_index, self.read_backend)
        return (
            f"{info.name}: device {'.'.join(map(str, group.device))}, rows [{start}, "
            f"{start + num_rows}) via {backend}"
        )

    def _lost(self, group: ReadGroup, start: int, num_rows: int, got: int) -> str:
        info = self.catalog.files[group.file_index]
        return (
            f"{info.name}: device {'.'.join(map(str, group.device))} returned {got} rows for "
            f"rows [{start}, {start + num_rows}), expected {num_rows}; metadata and data "
            f"disagree (damaged or changed file)"
        )

    def _misaligned(self, group: ReadGroup, row: int, ref_time=None, time=None) -> str:
        names = [self.catalog.columns[c].name for c in group.columns]
        where = (
            f"at row {row} (time {ref_time} vs {time})" if time is not None else f"near row {row}"
        )
        return (
            f"columns {names} do not share timestamps with column "
            f"{self.catalog.columns[0].name!r} {where}; select columns with equal "
            f"timestamps (time-aligned joins are not supported yet)"
        )

    def _block(self, group_index: int, block: int) -> _Block:
        key = (group_index, block)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        data = self._decode_block(group_index, block)
        self._store(key, data)
        return data

    def _decode_block(self, group_index: int, block: int) -> _Block:
        group = self.catalog.groups[group_index]
        start = block * self.block_rows
        return self._decode(group_index, start, min(self.block_rows, group.num_rows - start))

    def _store(self, key: tuple[int, int], data: _Block) -> None:
        if data.nbytes <= self.cache_bytes:
            self._cache[key] = data
            self._cached_bytes += data.nbytes
            while self._cached_bytes > self.cache_bytes:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= old.nbytes
                self._recycle(old)

    def _local_rows(self, group: ReadGroup, start_row: int, stop_row: int) -> tuple[int, int]:
        """Return group-local rows ``[lo, hi)`` of ``[start_row, stop_row)``; none if lo >= hi."""
        return (
            max(start_row, group.start_row) - group.start_row,
            min(stop_row, group.stop_row) - group.start_row,
        )

    def _blocks(self, local_lo: int, local_hi: int) -> range:
        """Return the block numbers covering group-local rows ``[local_lo, local_hi)``."""
        return range(local_lo // self.block_rows, (local_hi - 1) // self.block_rows + 1)

    def _prefetch(self, start_row: int, stop_row: int) -> None:
        """Decode the missing blocks of ``[start_row, stop_row)`` on ``decode_threads`` threads.

        tsfile's native read releases the GIL, so groups decode in parallel. Skipped when the
        blocks would not all fit the cache: they would be evicted and decoded again.
        """
        missing, nbytes = [], 0
        for gi, group in enumerate(self.catalog.groups):
            lo, hi = self._local_rows(group, start_row, stop_row)
            if lo >= hi:
                continue
            for b in self._blocks(lo, hi):
                if (gi, b) not in self._cache:
                    missing.append((gi, b))
                    rows = min(self.block_rows, group.num_rows - b * self.block_rows)
                    nbytes += rows * (len(group.columns) * self.dtype.itemsize + 8)
        if len(missing) < 2 or nbytes > self.cache_bytes:
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.decode_threads, thread_name_prefix="tsfile-decode")
        for gi in {gi for gi, _ in missing}:  # open readers and prepare handles first, in order
            self._handles(gi)
        decoded = list(self._pool.map(lambda key: (key, self._decode_block(*key)), missing))
        for key, data in decoded:
            self._store(key, data)

    def _pieces(self, group_index: int, start_row: int, stop_row: int):
        """Yield (out_start, local_start, local_stop, block) covering the group's rows."""
        group = self.catalog.groups[group_index]
        local_lo, local_hi = self._local_rows(group, start_row, stop_row)
        if local_lo >= local_hi:
            return
        if self.cache_bytes == 0:
            yield (
                group.start_row + local_lo - start_row,
                0,
                local_hi - local_lo,
                self._decode(group_index, local_lo, local_hi - local_lo),
            )
            return
        for block in self._blocks(local_lo, local_hi):
            b0 = block * self.block_rows
            a, b = max(local_lo, b0), min(local_hi, b0 + self.block_rows)
            yield group.start_row + a - start_row, a - b0, b - b0, self._block(group_index, block)

    def read(
        self,
        start_row: int,
        stop_row: int,
        out: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Read rows ``[start_row, stop_row)`` of every column.

        Args:
            start_row: first row, ``0 <= start_row < stop_row <= catalog.num_rows``.
            stop_row: one past the last row.
            out: optional C-contiguous ``(stop_row - start_row, num_columns)`` array to fill.

        Returns:
            ``(values, timestamps)``: values ``(rows, columns)`` in ``dtype``, nulls as NaN;
            timestamps int64 ``(rows,)``.

        Raises:
            ValueError: the range is outside ``[0, num_rows]`` or empty.
            SchemaError: columns disagree on the timestamp of a row.
            TsFileFormatError: a file cannot be read or returned fewer rows than its metadata.
        """
        if not 0 <= start_row < stop_row <= self.catalog.num_rows:
            raise ValueError(
                f"row range [{start_row}, {stop_row}) is outside the dataset's "
                f"{self.catalog.num_rows} rows or empty"
            )
        n = stop_row - start_row
        ncols = len(self.catalog.columns)
        if out is None:
            out = np.empty((n, ncols), dtype=self.dtype)
        elif out.shape != (n, ncols) or out.dtype != self.dtype:
            raise ValueError(
                f"out must have shape {(n, ncols)} and dtype {self.dtype}; got "
                f"{out.shape} {out.dtype}"
            )
        if self._matrix is not None and self._filled[start_row:stop_row].all():
            np.copyto(out, self._matrix[start_row:stop_row])
            return out, self._matrix_times[start_row:stop_row].copy()
        times = np.empty(n, dtype=np.int64)
        if self.decode_threads > 1 and self.cache_bytes:
            self._prefetch(start_row, stop_row)
        for gi in self._read_order:
            group = self.catalog.groups[gi]
            cols = group.columns
            contiguous = cols == tuple(range(cols[0], cols[0] + len(cols)))
            target = slice(cols[0], cols[0] + len(cols)) if contiguous else list(cols)
            for o, a, b, block in self._pieces(gi, start_row, stop_row):
                m = b - a
                if gi in self._ref_groups:
                    times[o : o + m] = block.times[a:b]
                elif not np.array_equal(times[o : o + m], block.times[a:b]):
                    bad = int(np.flatnonzero(times[o : o + m] != block.times[a:b])[0])
                    raise SchemaError(
                        self._misaligned(
                            group, start_row + o + bad, times[o + bad], block.times[a + bad]
                        )
                    )
                out[o : o + m, target] = block.values[:, a:b].T
        if self._matrix is not None:
            self._matrix[start_row:stop_row] = out
            self._matrix_times[start_row:stop_row] = times
            self._filled[start_row:stop_row] = True
        return out, times

    def keep_all(self) -> None:
        """Keep every row read, assembled, for the life of this reader (``cache="memory"``).

        Rows are kept as one row-major ``(num_rows, num_columns)`` array, so once read a batch
        costs one memory copy, like slicing an in-memory array. Memory: ``num_rows *
        (num_columns * itemsize + 8)`` bytes per process.
        """
        if self._matrix is None:
            n, c = self.catalog.num_rows, len(self.catalog.columns)
            self._matrix = np.empty((n, c), dtype=self.dtype)
            self._matrix_times = np.empty(n, dtype=np.int64)
            self._filled = np.zeros(n, dtype=bool)

    @property
    def kept_bytes(self) -> int:
        """Bytes held by :meth:`keep_all` (0 when not keeping)."""
        if self._matrix is None:
            return 0
        return self._matrix.nbytes + self._matrix_times.nbytes + self._filled.nbytes


def _as_float(column: pa.Array) -> np.ndarray:
    """Return an Arrow numeric column as a float numpy array, nulls as NaN."""
    kind = column.type
    if pa.types.is_floating(kind):
        return column.to_numpy(zero_copy_only=False)
    if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
        column = column.cast(pa.int64())
    return pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
