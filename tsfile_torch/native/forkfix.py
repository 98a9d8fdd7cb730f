"""Note: tsfile and fork. The one place that writes into tsfile's native library after fork().

Opening a ``TsFileReader`` uses tsfile's native decode thread pool (tsfile 2.5.0: 6 threads, held by
the global pointer ``common::g_thread_pool_`` of libtsfile, created by ``common::init_common`` when
the library loads). Threads do not survive ``fork()``: a forked child that decodes with the
inherited pool waits forever in ``AlignedChunkReader::decode_all_planned_pages``. Nulling the
pointer makes tsfile decode inline in the calling thread, but the inline path is not the pooled one:
on a damaged data page it can spin forever where the pooled path raises ``TsFileCorruptedError``
(see TSFILE_NOTES.md). So, after every fork:

1. the child's copy of the pointer is nulled (the parent's pool object is never touched again;
   its memory is simply left behind in the child), and
2. the first reader opened in the child calls ``common::init_common()``, which sees the null
   pointer and builds a fresh pool in the child, so forked DataLoader workers decode exactly as
   the main process does (and get tsfile's page parallelism back).

Note: fork fix self-test. The fix needs the two symbols in the loaded libtsfile (found through
``/proc/self/maps``: Linux). On the tsfile versions in :data:`TESTED_VERSIONS` that is enough.
On any other version the fix is proved before it is used: the first :func:`fork_safe` (a
loader's start method) or first open of a reader in the process runs :func:`_self_test_child`
in a fresh interpreter (it writes a small TsFile, reads it, forks, and the child must read
the same values within 20 s through a rebuilt, resized pool), and the outcome is
remembered per tsfile version and library file (Note: remembered verdicts in
:mod:`tsfile_torch.sources.content`), so a machine runs it once. Where the self-test fails, or
the symbols are gone from an untested version, the fix stays off and one warning per process
names the version, what is switched off and what that costs (:func:`_warn_off`); off Linux it is
off without a warning (docs/performance.md says what each platform gets). :func:`disable`
switches it off. Where it is not active, :func:`fork_safe` is False:
:func:`tsfile_torch.make_loader` starts workers with ``forkserver``, and a plainly forked child
of a process that used tsfile refuses to open readers (an error, never a hang).

Note: native pool size. tsfile sizes that pool at 6 threads in every process, whatever the
machine, and more decode threads than a process's share of the cores make epochs slower
(benchmarks/RESULTS.md, "tsfile's native pool sized per process"). So the first reader each
process opens through tsfile-torch first sizes the pool to that process's share of the machine,
:func:`tsfile_torch.pids.cpu_share` (the usable CPUs over the workers times the ranks on the
machine), at most tsfile's own 6: through ``common::set_thread_count`` (tsfile's header: it
rebuilds an existing pool at once, "the caller must ensure no read/write is concurrently using the
pool"). That holds at the first open: in a forked child the pool does not exist yet (it is built at
that size), and elsewhere nothing of tsfile-torch has read in the process before; code of your own
reading TsFiles in another thread at that moment is the one case it does not cover.
``TSFILE_TORCH_NATIVE_THREADS`` (in the environment, so spawned workers see it too) asks for a
number of threads in every process instead, ``0`` leaves tsfile's pool as tsfile makes it (as
does ``tsfile_torch.process.disable("native_pool")`` in a process and its fork workers);
:func:`native_threads` says what this process got. Sized once per process.
"""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from importlib import metadata

from tsfile_torch.pids import cpu_share

__all__ = [
    "NATIVE_THREADS_ENV",
    "TESTED_VERSIONS",
    "TSFILE_POOL_THREADS",
    "check_fork_safety",
    "disable",
    "ensure_pool",
    "fork_safe",
    "native_threads",
]

logger = logging.getLogger(__name__)

#: tsfile releases this fix was tested on; any other version runs the self-test first (Note:
#: fork fix self-test).
TESTED_VERSIONS = ("2.5.0",)
#: set in the self-test's own interpreter: the fix is on there without a self-test of its own
SELF_TEST_ENV = "TSFILE_TORCH_FORK_SELF_TEST"

_POOL_SYMBOL = "_ZN6common14g_thread_pool_E"  # common::g_thread_pool_
_INIT_SYMBOL = "_ZN6common11init_commonEv"  # common::init_common()
_SIZE_SYMBOL = "_ZN6common16set_thread_countEi"  # common::set_thread_count(int)

#: the size tsfile gives its pool (``ConfigValue::thread_count_``): the most tsfile-torch asks for
TSFILE_POOL_THREADS = 6
#: threads of the native pool in every reading process (Note: native pool size); 0: tsfile's own
NATIVE_THREADS_ENV = "TSFILE_TORCH_NATIVE_THREADS"


def _tsfile_version() -> str | None:
    try:
        return metadata.version("tsfile")
    except metadata.PackageNotFoundError:
        return None


#: where a process's mappings are listed (Linux); elsewhere the fix is off
_MAPS = "/proc/self/maps"


def _libraries() -> list[tuple[ctypes.c_void_p, object, object]]:
    """Return (pool pointer, init function, size function or None) for every loaded copy of
    libtsfile."""
    try:
        with open(_MAPS, encoding="utf-8", errors="replace") as maps:
            paths = {
                line.split(None, 5)[5].strip()
                for line in maps
                if "libtsfile" in line and len(line.split(None, 5)) == 6
            }
    except OSError:
        return []
    found = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
            pointer = ctypes.c_void_p.in_dll(lib, _POOL_SYMBOL)
            init = getattr(lib, _INIT_SYMBOL)
        except (OSError, ValueError, AttributeError):
            continue
        init.restype = ctypes.c_int
        init.argtypes = []
        size = getattr(lib, _SIZE_SYMBOL, None)
        if size is not None:
            size.restype = ctypes.c_int
            size.argtypes = [ctypes.c_int]
        found.append((pointer, init, size, path))
    return found


import tsfile  # noqa: E402,F401  - loads libtsfile, so its symbols can be found below

_FOUND = _libraries()  # the symbols the fix needs, in every loaded libtsfile
_TESTED = _tsfile_version() in TESTED_VERSIONS or os.environ.get(SELF_TEST_ENV) == "1"
#: None: an untested version whose self-test has not run yet (Note: fork fix self-test)
_enabled: bool | None = bool(_FOUND) if _TESTED or not _FOUND else None
_LIBS = _FOUND if _enabled else []
_IMPORT_PID = os.getpid()
_WARNED = False
#: pid whose native pool is valid (None: the pool must be rebuilt before this process reads).
_POOL_PID: int | None = os.getpid()
#: pid that started using tsfile; its plain forks cannot read when the fix is off.
_USER_PID: int | None = None
#: size the native pool (the process effect ``native_pool``: tsfile_torch.process.disable)
size_pool = True
#: pid whose native pool tsfile-torch sized, and to how many threads (None: tsfile's own)
_SIZED_PID: int | None = None
_SIZED: int | None = None
_SIZE_LOCK = threading.Lock()


def fork_safe() -> bool:
    """Return True when forked children of this process can read TsFiles (on an untested tsfile
    version, after the self-test: Note: fork fix self-test). False where there is no fork()."""
    if not hasattr(os, "fork"):
        return False
    if _enabled is None:
        _resolve()
    elif not _enabled:
        _warn_off()
    return bool(_enabled)


def _resolve() -> None:
    """Decide an untested version's fix by its self-test (remembered per library file)."""
    global _enabled, _LIBS
    if os.getpid() != _IMPORT_PID:  # a fork of an undecided process: the fix did not act
        _enabled = False
        return
    from tsfile_torch.sources.content import recall, remember

    key = _self_test_key()
    passed = recall(key).get("fork_fix")
    if passed is None:
        passed, why = _run_self_test()
        remember(key, fork_fix=passed, why=why)
    _enabled = bool(passed)
    _LIBS = _FOUND if _enabled else []
    _warn_off()


def _self_test_key() -> str:
    """The remembered-verdict key of the self-test: this tsfile and its library files."""
    parts = [f"fork fix self-test, tsfile {_tsfile_version()}"]
    for *_, path in _FOUND:
        try:
            st = os.stat(path)
            parts.append(f"{path} {st.st_size} {st.st_mtime_ns}")
        except OSError:
            parts.append(path)
    return "; ".join(parts)


def _run_self_test() -> tuple[bool, str]:
    """Run :func:`_self_test_child` in a fresh interpreter; return (passed, how it ended)."""
    env = {**os.environ, SELF_TEST_ENV: "1"}
    code = "from tsfile_torch.native import forkfix; forkfix._self_test_child()"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as err:
        return False, f"the self-test could not run ({err})"
    if done.returncode == 0:
        return True, "passed"
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
    return False, f"the self-test ended with status {done.returncode} {tail[0][:200]}".strip()


_PROBE_ROWS = 20000


def _self_test_child() -> None:
    """The self-test (Note: fork fix self-test), in its own interpreter with the fix on: write a
    small TsFile, read it (tsfile's pool now runs), fork; the child reads it again through the
    fix. Exit 0 when the child built its own pool threads and read the same sum within 20 s."""
    import tempfile

    import pyarrow as pa
    from tsfile import ColumnCategory, ColumnSchema, TableSchema, TSDataType, TsFileTableWriter

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.tsfile")
        schema = TableSchema(
            "t",
            [
                ColumnSchema("device", TSDataType.STRING, ColumnCategory.TAG),
                ColumnSchema("s0", TSDataType.DOUBLE, ColumnCategory.FIELD),
            ],
        )
        writer = TsFileTableWriter(path, schema)
        rows = pa.array(range(_PROBE_ROWS), pa.int64())
        table = pa.table(
            {"time": rows, "device": pa.array(["d"] * _PROBE_ROWS), "s0": rows.cast(pa.float64())}
        )
        writer.writer.write_arrow_batch("t", table, 0)
        writer.close()
        expected = _probe_sum(path)
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                before = len(os.listdir("/proc/self/task"))
                check_fork_safety(path)  # the fix: a fresh pool, sized
                same = _probe_sum(path) == expected
                built = len(os.listdir("/proc/self/task")) > before  # its threads run
                status = 0 if same and built else 2
            finally:
                os._exit(status)
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                sys.exit(os.waitstatus_to_exitcode(status) or 0)
            time.sleep(0.05)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        sys.exit("the forked child made no progress for 20 s")


def _probe_sum(path: str) -> float:
    from tsfile import TsFileReader

    reader = TsFileReader(path)
    total = 0.0
    try:
        with reader.query_table("t", ["s0"], 0, _PROBE_ROWS, batch_size=4096) as result:
            while (batch := result.read_arrow_record_batch()) is not None:
                total += float(sum(batch.column(batch.schema.get_field_index("s0")).to_pylist()))
    finally:
        reader.close()
    return total


def _warn_off() -> None:
    """Warn once per process that an untested tsfile version left the fix off (Note: fork fix
    self-test); off Linux, or switched off by the user, nothing is said."""
    global _WARNED
    if _enabled or _WARNED or _TESTED or _disabled_by_user or not os.path.exists(_MAPS):
        return
    _WARNED = True
    from tsfile_torch.sources.content import recall

    why = recall(_self_test_key()).get("why") if _FOUND else None
    why = why or "the symbols it needs are not in its library"
    warnings.warn(
        f"tsfile {_tsfile_version()}: tsfile-torch's fork fix (tested on tsfile "
        f"{', '.join(TESTED_VERSIONS)}) is off ({why}), so DataLoader workers start with "
        f"forkserver (a run's first batch takes seconds, not ~0.2 s), each dataset build "
        f"validates its files in a fresh interpreter (~0.5 s, not ~0.04 s), fork workers do "
        f"not share the memory cache (each holds its own copy) and tsfile's native pool is not "
        f"sized to the CPUs; tsfile_torch.process.enabled() says what is on. Install tsfile "
        f"{TESTED_VERSIONS[-1]} to have them",
        RuntimeWarning,
        stacklevel=3,
    )


_disabled_by_user = False


def disable() -> None:
    """Switch the fix off in this process (make_loader then uses forkserver workers)."""
    global _enabled, _disabled_by_user
    _enabled, _disabled_by_user = False, True


def _after_fork_in_child() -> None:
    global _POOL_PID, _SIZE_LOCK, _enabled
    _SIZE_LOCK = threading.Lock()  # a thread of the parent may have held it
    if _enabled is None:
        _enabled = False  # undecided in the parent: the fix does not act here
    if _enabled:
        for pointer, *_ in _LIBS:
            pointer.value = None
        _POOL_PID = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def ensure_pool() -> None:
    """Build a fresh native pool in a forked child before its first read (no-op elsewhere)."""
    global _POOL_PID
    if _POOL_PID == os.getpid():
        return
    previous = tsfile.get_file_read_backend()
    with _SIZE_LOCK:
        threads = _size_pools()  # no pool yet: only the size is kept, for init_common
        for pointer, init, *_ in _LIBS:
            if pointer.value is None:
                init()  # common::init_common(): resets tsfile's config, then new ThreadPool
    tsfile.set_file_read_backend(previous)
    _POOL_PID = os.getpid()
    logger.debug("tsfile native pool rebuilt in forked child %d (%s threads)", _POOL_PID, threads)


def _threads_asked() -> int | None:
    """Return the pool size this process should have (None: tsfile's own; see the notes).

    Raises:
        ValueError: ``TSFILE_TORCH_NATIVE_THREADS`` is not a whole number from 0 to 64.
    """
    if not size_pool:
        return None
    raw = os.environ.get(NATIVE_THREADS_ENV, "").strip()
    if not raw:
        return cpu_share(TSFILE_POOL_THREADS)
    try:
        threads = int(raw)
    except ValueError:
        threads = -1
    if not 0 <= threads <= 64:
        raise ValueError(
            f"{NATIVE_THREADS_ENV}={raw!r}: expected the threads of tsfile's native decode pool "
            f"in each reading process, a whole number from 1 to 64 (0: leave tsfile's own pool, "
            f"{TSFILE_POOL_THREADS} threads); unset it for a share of the CPUs"
        )
    return threads or None


def _size_pools() -> int | None:
    """Size this process's native pools once (Note: native pool size), under ``_SIZE_LOCK``;
    return the threads asked (None: tsfile's own)."""
    global _SIZED_PID, _SIZED
    if _SIZED_PID == os.getpid():
        return _SIZED
    threads = _threads_asked()
    if threads is not None:
        for _, _, size, _ in _LIBS:
            if size is not None and size(threads) != 0:
                raise RuntimeError(f"tsfile refused a native pool of {threads} threads")
    _SIZED_PID, _SIZED = os.getpid(), threads
    return threads


def native_threads() -> int | None:
    """Return the threads of tsfile's native decode pool in this process as tsfile-torch sized
    it (Note: native pool size), or None where it did not (no reader opened here yet,
    ``TSFILE_TORCH_NATIVE_THREADS=0``, the ``native_pool`` or ``fork_fix`` effect switched off,
    or an untested tsfile: tsfile's own pool)."""
    return _SIZED if _SIZED_PID == os.getpid() else None


def check_fork_safety(name: str) -> None:
    """Prepare this process to read; raise if it is an unfixable fork of a tsfile user.

    Raises:
        TsFileTorchError: this process was forked, without the fix, from one that had opened
            readers (reading here would hang).
    """
    global _USER_PID
    if fork_safe():
        ensure_pool()
        if _SIZED_PID != os.getpid():
            with _SIZE_LOCK:
                _size_pools()
        return
    if _USER_PID is not None and _USER_PID != os.getpid():
        from tsfile_torch.errors import TsFileTorchError

        raise TsFileTorchError(
            f"{name}: this process was forked from process {_USER_PID} after that process had "
            f"opened TsFile readers; tsfile's native thread pool does not survive fork() and "
            f"reading here would hang. Start DataLoader workers with "
            f"multiprocessing_context='forkserver' or 'spawn' (tsfile_torch.make_loader does "
            f"when it cannot make fork safe)"
        )
    _USER_PID = os.getpid()
