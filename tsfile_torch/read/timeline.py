"""Timeline index: row -> time for one read group, so rows ``[a, b)`` become one time range.

(Note: reads by time range.) tsfile decodes from ``offset`` to the end of a series whatever
``limit`` says, so reading rows far into a long series by offset costs O(rows after them). A time
range prunes pages instead. The index keeps the timestamp of every ``stride``-th row of a group
(``stride`` = 1,024 by default: 8 bytes per 1,024 rows, 78 KiB for 10M rows); rows ``[a, b)`` are
then read as the time range ``[time(a // stride * stride), time(ceil(b / stride) * stride) - 1]``
and the few rows before ``a`` dropped. Reads that start at a group's first row or end at its last
row need no index entry (the group's time range comes from metadata).

Building an index reads the time column of the group once, through its first series queried as two
columns (see :func:`tsfile_torch.native.queries.query_times`; cheaper than reading every series), in
the process that reads, before its first read through the index, and is kept for the life of that
process; with an index cache directory it is also saved there, so later builds of the same dataset,
other DataLoader workers and later runs load it instead of reading.

Note: whole time column first. The index is learned to the group's end (in stretches of at most
:data:`LEARN_ROWS` rows) before any row is read through it, and must then hold exactly the
metadata's row count, in strictly increasing timestamps. A damaged chunk or page header can make
tsfile skip a chunk and carry on: every later row then comes from the wrong place, with timestamps
and values that agree with each other, so only the row count at the end shows it. Learned whole, the
missing rows are a TsFileFormatError before the first batch, not after wrong rows went out. Cost:
one pass over the time column per group and process (or a cache load).

Note: index cache. A saved index is keyed by the identity of the file its marks were read from:
the identity the reader was opened on (path, size, mtime, ctime, inode, device; see
:class:`~tsfile_torch.read.openfiles.OpenFiles`), never by ``os.stat`` at save time, plus the
series, time range and stride. It is saved only once complete and after the file was checked
unchanged since, through a temporary file removed on every failure path, sealed with the
index directory's secret under its own name (Note: private caches in
:mod:`tsfile_torch.sources.cachedir`). When loaded the seal is checked, then the marks against
the file (:func:`_agrees`: a few stretches between marks re-read, four small queries), so marks
of another file that somehow got the key (an inode reused with equal times, a copied cache),
changed on disk, or written by someone without the secret are dropped (deleted, then learned
from the file and saved again) instead of turning into wrong rows or a damage verdict against
the TsFile; a seal that does not match is a
:class:`~tsfile_torch.errors.CacheMismatchWarning` naming the entry.

Note: seeded indexes. A series whose files overlap in time reads each file's whole time column
at build, to merge them (Note: merged shards in :mod:`tsfile_torch.read.merge`). The marks are
taken from those timestamps (:func:`marks_of`, after the checks of Note: whole time column
first) and kept with the merge, 8 bytes per ``stride`` rows, pickled into workers; each
process's reader takes them as complete indexes (:func:`seeded_index`) instead of reading the
time columns again. The building process saves them to the index cache where one is set.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os

import numpy as np

from tsfile_torch.catalog.build import FileInfo, ReadGroup
from tsfile_torch.errors import SKIP_HINT, CacheMismatchWarning, TsFileFormatError, warn_caller
from tsfile_torch.sources.cachedir import SealError, private_dir, seal, secret, unseal
from tsfile_torch.sources.content import atomic_write

__all__ = [
    "DEFAULT_INDEX_STRIDE",
    "TimeIndex",
    "clear_index_cache",
    "marks_of",
    "open_index",
    "save_index",
    "seeded_index",
]

logger = logging.getLogger(__name__)

#: Rows between two index entries.
DEFAULT_INDEX_STRIDE = 1024
#: Most timestamps read by one query while learning an index (8 MiB of int64).
LEARN_ROWS = 1 << 20


class TimeIndex:
    """Timestamps of rows ``0, stride, 2 * stride, ...`` of one group.

    The marks are filled forward, all of them before the first :meth:`time_range` answers
    (Note: whole time column first): each query reads the time column from the last known mark
    over at most :data:`LEARN_ROWS` rows (a time range sized from the mean sampling step,
    widened if it falls short), the last one to the group's end time, where the rows read must
    add up to the metadata's row count.

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
        #: where a complete index is saved (:func:`open_index`; ``None``: not saved)
        self.cache_path: str | None = None
        count = -(-num_rows // stride)
        #: whether the rows from the last mark to the end were counted (loaded marks: by
        #: the check on load)
        self._to_end = marks is not None
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
        self.learn()
        end_time = int(self.marks[last]) - 1 if last < len(self.marks) else self.end_time
        return int(self.marks[first]), end_time, start - first * self.stride

    def learn(self) -> None:
        """Learn every mark, reading the time column to the group's end (Note: whole time
        column first).

        Raises:
            TsFileFormatError: the time column disagrees with the metadata's row count or its
                timestamps do not increase strictly (a damaged file).
        """
        step = max(1, LEARN_ROWS // self.stride)
        while not self.complete:
            self._learn(min(self.known - 1 + step, len(self.marks) - 1))
        if not self._to_end:  # the last mark was learned by a read that stopped short of the end
            base = len(self.marks) - 1
            t0 = int(self.marks[base])
            times = self._fetch(t0, self.end_time)
            increasing = not bool(np.any(times[1:] <= times[:-1]))
            if len(times) != self.num_rows - base * self.stride or times[0] != t0 or not increasing:
                raise TsFileFormatError(
                    self._damaged(base * self.stride, t0, self.end_time, len(times))
                )
            self._to_end = True

    def _learn(self, mark: int) -> None:
        """Make marks ``0..mark`` known by reading the time column forward."""
        while self.known <= mark:
            base = self.known - 1  # the last known mark: its row's time starts the read
            t0 = int(self.marks[base])
            rows = (mark - base) * self.stride + 1
            t1 = min(self.end_time, t0 + int(rows * self._step * 1.25) + 1)
            if mark == len(self.marks) - 1:
                t1 = self.end_time  # the last mark: read on to the end, where rows are counted
            times = self._fetch(t0, t1)
            if not len(times) or times[0] != t0 or bool(np.any(times[1:] <= times[:-1])):
                raise TsFileFormatError(self._damaged(base * self.stride, t0, t1, len(times)))
            new = times[self.stride :: self.stride]
            take = min(len(new), len(self.marks) - self.known)
            self.marks[self.known : self.known + take] = new[:take]
            self.known += take
            read_to = base * self.stride + len(times)
            if t1 >= self.end_time:
                if read_to != self.num_rows:
                    raise TsFileFormatError(self._damaged(base * self.stride, t0, t1, len(times)))
                self._to_end = True
            if self.known <= mark:
                self._step *= 2  # sampled more sparsely than the mean here: widen the next read

    def _damaged(self, row: int, t0: int, t1: int, got: int) -> str:
        return time_column_damaged(self._name, row, t0, t1, got, self.num_rows, self.end_time)


def time_column_damaged(
    name: str, row: int, t0: int, t1: int, got: int, num_rows: int, end_time: int
) -> str:
    """The message of a time column whose read disagrees with its metadata (a damaged file)."""
    return (
        f"{name}: the time column read from row {row} (time {t0}) to time {t1} "
        f"returned {got} timestamps, which disagrees with the metadata's {num_rows} rows "
        f"ending at {end_time}; the file is damaged or changed; {SKIP_HINT}"
    )


def _cache_path(directory: str, key: str, group: ReadGroup, stride: int) -> str:
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


def _secret(path: str) -> bytes | None:
    """Return the secret of the index directory holding ``path`` (None: it cannot be made).

    Raises:
        CacheDirError: the directory is not private (Note: private caches).
    """
    try:
        return secret(private_dir(os.path.dirname(os.path.dirname(path))))
    except OSError as err:
        logger.info("timeline index cache beside %s not used: %s", path, err)
        return None


def _drop(path: str, why: str, warn: bool = False) -> None:
    """Delete a cached index that cannot be used; it is learned from the file again."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    text = (
        f"timeline index cache entry {path}: {why}; deleted, the index is read from the TsFile "
        f"again (the TsFile is not at fault)"
    )
    if warn:
        warn_caller(text, CacheMismatchWarning)
    else:
        logger.info("%s", text)


def _load(path: str, expected: int, key: bytes) -> np.ndarray | None:
    """Return the ``expected`` int64 marks of a saved index (a sealed ``.npy`` file), or None
    (a file that does not verify is dropped).

    The header is checked as text, not parsed with ``np.load`` (whose ``ast.literal_eval`` can
    fail with "AST constructor recursion depth mismatch" in a process forked while another
    thread was parsing: CPython 3.11 keeps that depth per interpreter, not per thread).
    """
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    try:
        data = unseal(key, raw, os.path.basename(path))
    except SealError as err:
        _drop(path, str(err), warn=err.forged)
        return None
    if data[:8] != b"\x93NUMPY\x01\x00" or len(data) < 10:
        _drop(path, "not an index")
        return None
    size = int.from_bytes(data[8:10], "little")
    header = data[10 : 10 + size].decode("latin-1")
    want = ("'descr': '<i8'", "'fortran_order': False", f"'shape': ({expected},)")
    if not all(part in header for part in want) or len(data) != 10 + size + 8 * expected:
        _drop(path, "not an index of this group's shape")
        return None
    return np.frombuffer(data, dtype="<i8", offset=10 + size).astype(np.int64)


def _agrees(marks: np.ndarray, group: ReadGroup, stride: int, fetch) -> bool:
    """Return whether loaded ``marks`` agree with the file (Note: index cache).

    The marks must start at the group's first timestamp, increase and stay inside its time
    range; then the rows between a few pairs of neighbouring marks (first, last, two between)
    are read: each stretch must hold exactly ``stride`` rows and start at its mark.
    """
    if marks[0] != group.start_time or marks[-1] > group.end_time:
        return False
    if len(marks) > 1 and not bool(np.all(marks[1:] > marks[:-1])):
        return False
    n = len(marks)
    for k in sorted({0, n // 3, 2 * n // 3, n - 1}):
        t1 = int(marks[k + 1]) - 1 if k + 1 < n else group.end_time
        times = fetch(int(marks[k]), t1)
        if len(times) != min(stride, group.num_rows - k * stride) or times[0] != marks[k]:
            return False
    return True


def open_index(
    fetch,
    info: FileInfo,
    group: ReadGroup,
    stride: int = DEFAULT_INDEX_STRIDE,
    cache_dir: str | None = None,
    key: str | None = None,
) -> TimeIndex:
    """Return the group's :class:`TimeIndex`: complete from ``cache_dir``, else learned lazily.

    ``fetch(t0, t1)`` returns the group's timestamps in ``[t0, t1]``; ``key`` is the
    :meth:`~tsfile_torch.sources.Source.index_key` of the file as the reader that ``fetch``
    reads through was opened on (``None``: no cache). Marks loaded from the cache are checked
    against the file first (:func:`_agrees`) and ignored if they disagree.
    """
    name = _name(info, group)
    path = _cache_path(cache_dir, key, group, stride) if cache_dir and key else None
    expected = -(-group.num_rows // stride)
    secret_key = _secret(path) if path else None
    marks = None
    if secret_key is None:
        path = None
    elif os.path.exists(path):
        marks = _load(path, expected, secret_key)
    if marks is not None and not _agrees(marks, group, stride, fetch):
        _drop(path, f"{name}: disagrees with the file")
        marks = None
    index = TimeIndex(
        stride, group.num_rows, group.start_time, group.end_time, fetch, name, marks=marks
    )
    index.cache_path = path
    return index


def marks_of(
    times: np.ndarray, num_rows: int, start_time: int, end_time: int, stride: int
) -> np.ndarray | None:
    """Return the index marks of a group from its whole time column ``times`` (Note: seeded
    indexes), or None where ``times`` disagree with the metadata (``num_rows`` rows from
    ``start_time`` to ``end_time``, strictly increasing): the index is then learned from the
    file, which reports the damage (Note: whole time column first)."""
    if len(times) != num_rows or not num_rows or times[0] != start_time or times[-1] != end_time:
        return None
    if bool(np.any(times[1:] <= times[:-1])):
        return None
    return np.array(times[::stride], dtype=np.int64)


def seeded_index(
    fetch,
    info: FileInfo,
    group: ReadGroup,
    marks: np.ndarray,
    stride: int = DEFAULT_INDEX_STRIDE,
    cache_dir: str | None = None,
    key: str | None = None,
) -> TimeIndex | None:
    """Return the group's complete :class:`TimeIndex` of ``marks`` (:func:`marks_of`; Note:
    seeded indexes), its ``cache_path`` set where ``cache_dir`` and ``key`` are (as in
    :func:`open_index`; save it with :func:`save_index`), or None where ``marks`` do not fit
    the group (another stride, row count or first timestamp)."""
    if len(marks) != -(-group.num_rows // stride) or marks[0] != group.start_time:
        return None
    index = TimeIndex(
        stride, group.num_rows, group.start_time, group.end_time, fetch, _name(info, group), marks
    )
    path = _cache_path(cache_dir, key, group, stride) if cache_dir and key else None
    index.cache_path = path if path and _secret(path) is not None else None
    return index


def _name(info: FileInfo, group: ReadGroup) -> str:
    return f"{info.name}: device {'.'.join(map(str, group.device))}"


def save_index(index: TimeIndex) -> None:
    """Write a complete index to its cache file (atomically) for later processes and runs.

    Call only once the file was checked unchanged after the marks were read (Note: index
    cache).
    """
    if not (index.cache_path and index.complete):
        return
    key = _secret(index.cache_path)
    if key is None:
        return
    buffer = io.BytesIO()
    np.save(buffer, index.marks, allow_pickle=False)
    data = seal(key, buffer.getvalue(), os.path.basename(index.cache_path))
    atomic_write(index.cache_path, lambda fh: fh.write(data))


def clear_index_cache(directory: str) -> tuple[int, int]:
    """Delete every saved index in ``directory``: ``(indexes, bytes)`` (files being written, by
    :func:`~tsfile_torch.sources.content.atomic_write` under other names, stay)."""
    count = nbytes = 0
    with contextlib.suppress(FileNotFoundError):
        for shard in sorted(os.scandir(directory), key=lambda e: e.name):
            if len(shard.name) != 2 or not shard.is_dir(follow_symlinks=False):
                continue
            for entry in os.scandir(shard.path):
                if entry.name.endswith(".npy") and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(FileNotFoundError):
                        size = entry.stat(follow_symlinks=False).st_size
                        os.unlink(entry.path)
                        count, nbytes = count + 1, nbytes + size
    return count, nbytes
