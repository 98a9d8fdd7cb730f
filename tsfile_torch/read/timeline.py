"""Timeline index: row -> time for one read group, so rows ``[a, b)`` become one time range.

(Note: reads by time range.) tsfile decodes from ``offset`` to the end of a series whatever
``limit`` says, so reading rows far into a long series by offset costs O(rows after them). A time
range prunes pages instead. The index keeps the timestamp of every ``stride``-th row of a group
(``stride`` = 1,024 by default: 8 bytes per 1,024 rows, 78 KiB for 10M rows); rows ``[a, b)`` are
then read as the time range ``[time(a // stride * stride), time(ceil(b / stride) * stride) - 1]``
and the few rows before ``a`` dropped. Reads that start at a group's first row or end at its last
row need no index entry (the group's time range comes from metadata).

Building an index reads the time column of the group once, through its first series queried as
two columns (see :func:`tsfile_torch.native.queries.query_times`; measured on a 2M-row,
8-DOUBLE file: 69 ms, against 211 ms to read all 8 series). It is learned lazily, in the
process that reads, as
far as reads need it, and kept for the life of that process; once complete and with an index
cache directory it is also saved there (keyed by the file's path, size, mtime, ctime and
inode, the series and the time range), so later builds of the same dataset, other DataLoader
workers and later runs load it instead of reading.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile

import numpy as np

from tsfile_torch.catalog.build import FileInfo, ReadGroup
from tsfile_torch.errors import TsFileFormatError

__all__ = ["DEFAULT_INDEX_STRIDE", "TimeIndex", "open_index", "save_index"]

logger = logging.getLogger(__name__)

#: Rows between two index entries.
DEFAULT_INDEX_STRIDE = 1024


class TimeIndex:
    """Timestamps of rows ``0, stride, 2 * stride, ...`` of one group, learned as far as needed.

    The marks are filled forward on demand: a read that needs the time of row ``r`` reads the
    time column from the last known mark up to a little past ``r`` (one time-range query sized
    from the mean sampling step, widened if it falls short). A sequential pass thus extends the
    index one block ahead at a time, and the first batch of a 10M-row file costs about as much
    as the first batch of a small one; a random read far into a file reads the timestamps up
    to it once.

    Args:
        stride: rows between marks.
        num_rows: rows of the group.
        start_time, end_time: timestamps of the group's first and last row.
        fetch: ``fetch(t0, t1)`` returns the group's timestamps in ``[t0, t1]`` (int64).
        name: what to call the group in errors.
        marks: a complete index loaded from the cache, if any.
    """

    def __init__(self, stride, num_rows, start_time, end_time, fetch, name="", marks=None):
        self.stride = stride
        self.num_rows = num_rows
        self.end_time = end_time
        self._fetch = fetch
        self._name = name
        count = -(-num_rows // stride)
        if marks is not None:
            self.marks, self.known = marks, count
        else:
            self.marks = np.empty(count, dtype=np.int64)
            self.marks[0] = start_time
            self.known = 1
        self._step = max(1.0, (end_time - start_time) / max(num_rows - 1, 1))

    @property
    def complete(self) -> bool:
        return self.known == len(self.marks)

    def time_range(self, start: int, stop: int) -> tuple[int, int, int]:
        """Return ``(start_time, end_time, skip)`` covering local rows ``[start, stop)``.

        The time range (inclusive) starts ``skip`` rows before ``start`` and ends at or after
        row ``stop - 1``.
        """
        first = start // self.stride
        last = -(-stop // self.stride)
        self._learn(min(last, len(self.marks) - 1))
        end_time = int(self.marks[last]) - 1 if last < len(self.marks) else self.end_time
        return int(self.marks[first]), end_time, start - first * self.stride

    def _learn(self, mark: int) -> None:
        """Make marks ``0..mark`` known by reading the time column forward."""
        while self.known <= mark:
            base = self.known - 1  # the last known mark: its row's time starts the read
            t0 = int(self.marks[base])
            rows = (mark - base) * self.stride + 1
            t1 = min(self.end_time, t0 + int(rows * self._step * 1.25) + 1)
            times = self._fetch(t0, t1)
            if not len(times) or times[0] != t0:
                raise TsFileFormatError(self._damaged(base * self.stride, t0, t1, len(times)))
            new = times[self.stride :: self.stride]
            take = min(len(new), len(self.marks) - self.known)
            self.marks[self.known : self.known + take] = new[:take]
            self.known += take
            read_to = base * self.stride + len(times)
            if t1 >= self.end_time and read_to != self.num_rows:
                raise TsFileFormatError(self._damaged(base * self.stride, t0, t1, len(times)))
            if self.known <= mark:
                self._step *= 2  # sampled more sparsely than the mean here: widen the next read

    def _damaged(self, row: int, t0: int, t1: int, got: int) -> str:
        return (
            f"{self._name}: the time column read from row {row} (time {t0}) to time {t1} "
            f"returned {got} timestamps, which disagrees with the metadata's {self.num_rows} rows "
            f"ending at {self.end_time}; the file is damaged or changed"
        )


def _cache_path(directory: str, info: FileInfo, group: ReadGroup, stride: int) -> str | None:
    key = info.source.index_key()  # the source's identity now (None: not cached on disk)
    if key is None:
        return None
    shard = group.shards[0]
    key = repr(
        (
            key,
            shard.device,
            shard.measurement,
            shard.start_time,
            shard.end_time,
            shard.num_rows,
            stride,
        )
    )
    digest = hashlib.sha256(key.encode()).hexdigest()
    return os.path.join(directory, digest[:2], digest + ".npy")


def _load(path: str, expected: int) -> np.ndarray | None:
    try:
        marks = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if marks.dtype != np.int64 or marks.shape != (expected,):
        return None
    return marks


def _save(path: str, marks: np.ndarray) -> None:
    tmp = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            np.save(fh, marks, allow_pickle=False)
        os.replace(tmp, path)  # atomic: concurrent builders write the same bytes
    except OSError as err:
        logger.debug("cannot save a timeline index to %s: %s", path, err)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def open_index(
    fetch,
    info: FileInfo,
    group: ReadGroup,
    stride: int = DEFAULT_INDEX_STRIDE,
    cache_dir: str | None = None,
) -> TimeIndex:
    """Return the group's :class:`TimeIndex`: complete from ``cache_dir``, else learned lazily.

    ``fetch(t0, t1)`` returns the group's timestamps in ``[t0, t1]``.
    """
    name = f"{info.name}: device {'.'.join(map(str, group.device))}"
    path = _cache_path(cache_dir, info, group, stride) if cache_dir else None
    expected = -(-group.num_rows // stride)
    marks = _load(path, expected) if path and os.path.exists(path) else None
    return TimeIndex(
        stride, group.num_rows, group.start_time, group.end_time, fetch, name, marks=marks
    )


def save_index(index: TimeIndex, info: FileInfo, group: ReadGroup, cache_dir: str) -> None:
    """Write a complete index to ``cache_dir`` (atomically) for later processes and runs."""
    path = _cache_path(cache_dir, info, group, index.stride)
    if path and index.complete:
        _save(path, index.marks)
