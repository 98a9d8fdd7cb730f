"""Validate TsFiles in a short-lived child process, so a native crash or hang stays there.

tsfile's C++ reader crashes (SIGSEGV) on some damaged metadata and chunk headers, and can decode
forever on some damaged pages. We cannot fix tsfile, so the first contact with each file happens
in a child process (Note: validation child):

- ``headers`` (what a dataset does when it is built, ``validate=True``): open, read the metadata,
  prepare every series and decode the first row of every device and series, which reads the
  header of the first chunk of every series and its first page; the row must match the
  metadata's first timestamp and first values. Costs about an open per file. In a local file
  whose series have several chunks, also read every device's time column to its end (as the
  timeline index does before a read: Note: whole time column first in
  :mod:`tsfile_torch.read.timeline`): a later time-chunk header that crashes tsfile's reader
  crashes the child, not the training process; cheap beside decoding the values.
- ``full`` (``tsfile-torch verify``): additionally decode every row of every series, with every
  check of :mod:`tsfile_torch.integrity.checks` (timestamps, min / max, first / last, sum).

One child checks all files in turn, telling the parent which file it is on. If the child dies by
a signal or stops making progress (``timeout`` seconds for one file), the parent names that file,
starts a new child for the files after it, and goes on. The child is a fork of the caller where
forked children can read TsFiles (:mod:`tsfile_torch.native.forkfix`), else a fresh interpreter.

Note: a validation child short of memory. Running out of memory says nothing about a file
(Note: damage and exhaustion in :mod:`tsfile_torch.native.guard`), so it is never a damage
verdict: a check that fails with a memory error (tsfile's ``OOMError``, ``MemoryError``, a
ResourceError, ``std::bad_alloc`` anywhere in its chain), or a child that dies (a signal, an
exit without a verdict) while an address-space limit is set (``ulimit -v``, ``RLIMIT_AS``: the
parent's, inherited, or the child's own), raises a
:class:`~tsfile_torch.errors.ResourceError` naming the file, memory and the limit; nothing is
remembered and ``on_damaged="skip"`` leaves nothing out. Under such a limit tsfile's reader
aborts (``std::bad_alloc``) or crashes (SIGSEGV, nothing printed) when an allocation fails, so
a crash there cannot be told from damage: it is told as memory, with the check that tells them
apart (``tsfile-torch verify`` without the limit). It may also raise its generic "TsFile is
corrupted" for a failed allocation: a damage verdict found under a limit says so and names the
limit and that check. The child's stderr is kept in a temporary
file (and copied to this process's stderr) to see what it said while it died.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tsfile_torch.catalog.build import build_catalog, chunk_count
from tsfile_torch.errors import FileProblem, ResourceError, TsFileFormatError
from tsfile_torch.native.backend import open_reader
from tsfile_torch.native.errors import MEMORY_ERRORS, address_space_limit
from tsfile_torch.native.forkfix import fork_safe
from tsfile_torch.native.queries import prepare_handles, query_times
from tsfile_torch.read.reader import BatchReader
from tsfile_torch.read.timeline import DEFAULT_INDEX_STRIDE, TimeIndex
from tsfile_torch.sources import FileObject, Source

__all__ = ["MODES", "FileProblem", "check_sources", "damaged_error", "validate_sources"]

MODES = ("headers", "full")
#: seconds a ``headers`` check of one file may take before the file is reported as hanging
HEADERS_TIMEOUT_S = 60.0
#: rows decoded per native call by a ``full`` check
FULL_BLOCK_ROWS = 1 << 20
_CHILD_MAIN = "from tsfile_torch.integrity.validate import _main; _main()"
_DOING = {"headers": "reading its metadata and first chunks", "full": "decoding it"}


def _file_timeout(source: Source, mode: str) -> float:
    if mode == "headers":
        return HEADERS_TIMEOUT_S
    try:
        size = source.size()
    except (OSError, ValueError):
        size = 0
    return HEADERS_TIMEOUT_S + size / 2e6  # a generous 2 MB/s of decoding


# -- in the child -------------------------------------------------------------------------
def _check_headers(source: Source) -> None:
    """Open, read metadata, decode the first row of every series (may crash: child only)."""
    with source.metadata_target() as target:  # a URL: range reads, no download
        # one opened target for the metadata and the first rows (a URL's blocks fetched once)
        probe = source if isinstance(target, str) else FileObject(target, shown=source.name)
        catalog = build_catalog([probe], shared_timeline=False)
        reader, _ = open_reader(target, "pread", check_mapped=False, name=source.name)
        _check_first_rows(reader, catalog, catalog.files[0], whole_times=isinstance(target, str))


def _check_first_rows(reader, catalog, info, whole_times: bool = False) -> None:
    """Decode the first row of every device; with ``whole_times``, in a file whose series have
    several chunks, also read every device's time column to its end (see the module notes)."""
    try:
        if whole_times:
            metadata = reader.get_timeseries_metadata(None)
            whole_times = any(
                chunk_count(ts) != 1  # unknown (0): as several
                for group in metadata.values()
                for ts in group.timeseries
            )
        for group in catalog.groups:
            handles = prepare_handles(reader, 0, info.nbytes, info.name, group.shards)
            if whole_times:
                _check_time_column(reader, info, group, handles[0])
            t0 = group.shards[0].start_time
            if group.aligned:
                queries = [(reader.query_prepared_multi(handles, start_time=t0, end_time=t0), 0)]
            else:
                queries = [
                    (reader.query_prepared(h, start_time=t0, end_time=t0), k)
                    for k, h in enumerate(handles)
                ]
            for result, k0 in queries:
                with result:
                    batch = result.read_arrow_record_batch()
                if batch is None or batch.num_rows != 1:
                    got = 0 if batch is None else batch.num_rows
                    raise TsFileFormatError(
                        f"device {'.'.join(map(str, group.device))}: {got} rows at its first "
                        f"timestamp {t0}, metadata says 1"
                    )
                for k in range(1, batch.num_columns):
                    shard = group.shards[k0 + k - 1]
                    column = batch.column(k)
                    if pa.types.is_timestamp(column.type):  # TIMESTAMP: int64 statistics
                        column = column.cast(pa.int64())
                    value = column[0].as_py()
                    if value is not None and shard.first is not None:
                        if float(value) != shard.first:
                            raise TsFileFormatError(
                                f"series {'.'.join(map(str, shard.device))}."
                                f"{shard.measurement}: first value {value!r}, metadata says "
                                f"{shard.first!r}"
                            )
    finally:
        reader.close()


def _check_time_column(reader, info, group, handle) -> None:
    """Read ``group``'s time column to its end, as a timeline index learns it (may crash)."""

    def fetch(t0: int, t1: int):
        return query_times(reader, handle, group.aligned, t0, t1)

    name = f"device {'.'.join(map(str, group.device))}"
    TimeIndex(
        DEFAULT_INDEX_STRIDE, group.num_rows, group.start_time, group.end_time, fetch, name
    ).learn()


def _check_full(source: Source) -> None:
    _check_headers(source)
    catalog = build_catalog([source], shared_timeline=False)
    reader = BatchReader(catalog, "pread", np.float64, cache_bytes=0, malloc_tuning=False)
    try:
        for gi, group in enumerate(catalog.groups):
            for start in range(0, group.num_rows, FULL_BLOCK_ROWS):
                reader.read_group(gi, start, min(start + FULL_BLOCK_ROWS, group.num_rows))
    finally:
        reader.close()


#: What a dying child's stderr says when an allocation failed (C++, glibc, Python, tsfile).
_ALLOCATION = re.compile(
    r"bad_alloc|MemoryError|OOMError|out of memory|[Cc]annot allocate|allocat(e|ion) fail"
)


def _short_of_memory(err: BaseException) -> bool:
    """Whether ``err`` or an error it came from says memory ran out (a note of the module)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (*MEMORY_ERRORS, ResourceError)) or "bad_alloc" in str(cause):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _child(sources: Sequence[Source], mode: str, fd: int) -> None:
    """Check each source, writing ``{"i": n, "limit": ...}`` before and ``{"i": n, "reason":
    ..., "memory": ...}`` after (``limit``: this child's address-space limit)."""
    check = _check_full if mode == "full" else _check_headers
    for i, source in enumerate(sources):
        os.write(fd, (json.dumps({"i": i, "limit": address_space_limit()}) + "\n").encode())
        reason, memory = None, False
        try:
            check(source)
        except Exception as err:  # noqa: BLE001 - in the child, any failure is this file's
            reason = FileProblem.of(source.name, err).reason
            memory = _short_of_memory(err)
        os.write(fd, (json.dumps({"i": i, "reason": reason, "memory": memory}) + "\n").encode())


def _main() -> None:  # the fresh-interpreter child: python -c "...; _main()" < pickled job
    import pickle

    mode, sources = pickle.load(sys.stdin.buffer)
    _child(sources, mode, sys.stdout.fileno())


#: Python threads known to hold no lock a validation child needs while they idle: our own
#: decode pool (waiting on its queue) and tqdm's monitor (sleeping between checks).
IDLE_THREADS = ("tsfile-decode", "tsfile-read-ahead", "tqdm_monitor")


def can_fork() -> bool:
    """Return whether a validation child may be a fork of this process.

    Only where forked children can read TsFiles (:mod:`tsfile_torch.native.forkfix`) and no
    other Python thread runs (but :data:`IDLE_THREADS`): a thread may hold a lock the child
    would need. Native threads (tsfile's pool, OpenMP, CUDA) are left behind safely: the child
    runs only tsfile's reader, whose pool the fork fix rebuilds, and pure-Python checks, then
    exits with ``os._exit``.
    """
    others = [
        t
        for t in threading.enumerate()
        if t is not threading.main_thread() and not t.name.startswith(IDLE_THREADS)
    ]
    return fork_safe() and threading.current_thread() is threading.main_thread() and not others


# -- in the parent ------------------------------------------------------------------------
class _Child:
    def __init__(self, sources: Sequence[Source], mode: str):
        self.proc = None
        self.pid = None
        self.stderr = tempfile.TemporaryFile()  # what it says while it dies (see the notes)
        if can_fork():
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: never returns
                code = 0
                try:
                    os.close(read_fd)
                    os.dup2(self.stderr.fileno(), 2)
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    faulthandler.disable()  # a crash here is reported by the parent, by name
                    _child(sources, mode, write_fd)
                except BaseException:  # noqa: BLE001
                    code = 1
                finally:
                    os._exit(code)
            os.close(write_fd)
            self.pid, self.fd = pid, read_fd
        else:
            import pickle

            self.proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD_MAIN],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
            )
            with self.proc.stdin:
                pickle.dump((mode, list(sources)), self.proc.stdin)
            self.fd = self.proc.stdout.fileno()
        self.buffer = b""

    def line(self, timeout: float) -> dict | None:
        """Return the next message, None at end of output; raise TimeoutError if none came."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        try:
            if self.proc is not None:
                self.proc.kill()
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def said(self, start: int = 0) -> str:
        """Return what the child wrote to its stderr from byte ``start`` on."""
        self.stderr.seek(start)
        return self.stderr.read().decode(errors="replace")

    def said_bytes(self) -> int:
        """Return how many bytes the child has written to its stderr so far."""
        return os.fstat(self.stderr.fileno()).st_size

    def end(self) -> str:
        """Reap the child, copy its stderr to ours; return how it ended ("exit 0", "signal
        SIGSEGV", ...)."""
        if self.proc is not None:
            self.proc.stdout.close()
            code = self.proc.wait()
        else:
            os.close(self.fd)
            _, status = os.waitpid(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
        with self.stderr:
            text = self.said()
        if text:  # where it went before it was kept: a crash's own report stays visible
            with contextlib.suppress(OSError):
                os.write(2, text.encode())
        if code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        return f"exit {code}"


def validate_sources(
    sources: Sequence[Source], mode: str = "headers", timeout: float | None = None
) -> list[FileProblem]:
    """Check ``sources`` in child processes; return one :class:`FileProblem` per bad file.

    Args:
        sources: sources of any kind (a file object is checked through a temporary copy where
            the child is a fresh interpreter).
        mode: ``"headers"`` or ``"full"`` (see the module docstring).
        timeout: seconds one file may take; ``None`` for a default by mode and file size.

    Raises:
        ResourceError: the child ran out of memory on a file (Note: a validation child short
            of memory): no verdict on it.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")
    with contextlib.ExitStack() as stack:
        if not can_fork():  # a fresh interpreter opens what it is given by value
            sources = [stack.enter_context(s.for_child()) for s in sources]
        return _validate(list(sources), mode, timeout)


def _validate(todo: list[Source], mode: str, timeout: float | None) -> list[FileProblem]:
    problems: list[FileProblem] = []
    while todo:
        child = _Child(todo, mode)
        current, done_upto = None, 0
        said_from, as_limit = 0, address_space_limit()  # the child's, once it says
        try:
            while True:
                limit = timeout or _file_timeout(todo[current or 0], mode)
                msg = child.line(limit)
                if msg is None:
                    break
                if "reason" in msg:
                    if msg.get("memory"):
                        child.kill()
                        child.end()
                        raise _memory_error(todo[msg["i"]].name, mode, msg["reason"], as_limit)
                    if msg["reason"] is not None:
                        reason = msg["reason"] + _limit_hint(as_limit)
                        problems.append(FileProblem(todo[msg["i"]].name, reason))
                    current, done_upto = None, msg["i"] + 1
                else:
                    current, said_from = msg["i"], child.said_bytes()
                    as_limit = msg.get("limit", as_limit)
        except TimeoutError:
            child.kill()
            child.end()
            problems.append(
                FileProblem(
                    todo[current or 0].name,
                    f"tsfile's reader made no progress on this file for {limit:.0f} s (killed); "
                    f"the file is damaged",
                )
            )
            todo = todo[(current or 0) + 1 :]
            continue
        said = child.said(said_from)
        ended = child.end()
        died_on = current if current is not None else done_upto
        if ended != "exit 0" and died_on < len(todo):
            limit = as_limit or address_space_limit()
            if limit is not None or _ALLOCATION.search(said):  # not damage: the module notes
                what = f"the validation child died ({ended})"
                if _ALLOCATION.search(said):
                    what += f" saying {_ALLOCATION.search(said).group(0)!r}"
                raise _memory_error(todo[died_on].name, mode, what, limit)
        if current is not None:  # the child died while on this file
            problems.append(
                FileProblem(
                    todo[current].name,
                    f"tsfile's native reader crashed on this file ({ended}) while "
                    f"{_DOING[mode]}; the file is damaged or not a TsFile",
                )
            )
            todo = todo[current + 1 :]
        elif done_upto < len(todo):
            raise RuntimeError(f"validation child ended early ({ended}) before any file")
        else:
            todo = []
    return problems


def _limit_hint(limit: int | None) -> str:
    """Return what to add to a damage verdict found under an address-space limit ("" without
    one): tsfile's reader may also call a healthy file corrupted when an allocation fails."""
    if limit is None:
        return ""
    return (
        f" (found under an address-space limit, RLIMIT_AS / `ulimit -v`, of {limit >> 20} MiB, "
        f"where tsfile's reader may also report a healthy file as corrupted when an allocation "
        f"fails: if `tsfile-torch verify` passes the file without the limit, raise the limit)"
    )


def _memory_error(name: str, mode: str, what: str, limit: int | None) -> ResourceError:
    """Return the ResourceError of a validation child short of memory while checking ``name``
    (Note: a validation child short of memory)."""
    if limit is not None:
        short = (
            f"the address-space limit (RLIMIT_AS, `ulimit -v`) of {limit >> 20} MiB, which "
            f"the validation child inherits, is too small for it; raise the limit"
        )
    else:
        short = "this machine's free memory is too small for it; free memory"
    return ResourceError(
        f"{name}: validating it ({_DOING[mode]}) ran out of memory: {what}; {short}, or build "
        f"with validate=False (the dataset's reads still check each block); tsfile's reader "
        f"aborts or crashes when an allocation fails, so this is no verdict on the file and "
        f"is not remembered; if memory is ample, check the file with `tsfile-torch verify` "
        f"(without the limit): a damaged size field can ask for more memory than any machine "
        f"has"
    )


def check_sources(sources: Sequence[Source]) -> None:
    """Raise TsFileFormatError for the first damaged source (``headers`` mode, in a child).

    Raises:
        TsFileFormatError: naming each damaged file and why.
    """
    problems = validate_sources(sources, "headers")
    if problems:
        raise damaged_error(problems)


def damaged_error(problems: Sequence[FileProblem]) -> TsFileFormatError:
    """Return one TsFileFormatError naming every file in ``problems`` and why."""
    if len(problems) == 1:
        return problems[0].error()
    return TsFileFormatError(
        f"{len(problems)} damaged files: " + "; ".join(f"{p.name}: {p.reason}" for p in problems)
    )
