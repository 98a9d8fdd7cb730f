"""Note: tsfile and fork. The one place that writes into tsfile's native library after fork().

Opening a ``TsFileReader`` uses tsfile's native decode thread pool (tsfile 2.5.0: 6 threads, held
by the global pointer ``common::g_thread_pool_`` of libtsfile, created by ``common::init_common``
when the library loads). Threads do not survive ``fork()``: a forked child that decodes with the
inherited pool waits forever in ``AlignedChunkReader::decode_all_planned_pages``. Nulling the
pointer makes tsfile decode inline in the calling thread, but the inline path is not the pooled
one: on a damaged data page it was seen to spin forever at 100% CPU where the pooled path raises
``TsFileCorruptedError`` (see TSFILE_NOTES.md). So, after every fork:

1. the child's copy of the pointer is nulled (the parent's pool object is never touched again;
   its memory is simply left behind in the child), and
2. the first reader opened in the child calls ``common::init_common()``, which sees the null
   pointer and builds a fresh pool in the child, so forked DataLoader workers decode exactly as
   the main process does (and get tsfile's page parallelism back).

This is gated by :data:`TESTED_VERSIONS` (the tsfile versions it was tested on) and by the two
symbols being found in the loaded libtsfile; :func:`disable` switches it off. Where it is not
active, :func:`fork_safe` is False: :func:`tsfile_torch.make_loader` starts workers with
``forkserver``, and a plainly forked child of a process that used tsfile refuses to open readers
(an error, never a hang).
"""

from __future__ import annotations

import ctypes
import logging
import os
from importlib import metadata

__all__ = ["TESTED_VERSIONS", "fork_safe", "disable", "ensure_pool", "check_fork_safety"]

logger = logging.getLogger(__name__)

#: tsfile releases this fix was tested on; any other version gets forkserver workers.
TESTED_VERSIONS = ("2.5.0",)

_POOL_SYMBOL = "_ZN6common14g_thread_pool_E"  # common::g_thread_pool_
_INIT_SYMBOL = "_ZN6common11init_commonEv"  # common::init_common()


def _tsfile_version() -> str | None:
    try:
        return metadata.version("tsfile")
    except metadata.PackageNotFoundError:
        return None


def _libraries() -> list[tuple[ctypes.c_void_p, object]]:
    """Return (pool pointer, init function) for every loaded copy of libtsfile."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
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
        found.append((pointer, init))
    return found


import tsfile  # noqa: E402,F401  - loads libtsfile, so its symbols can be found below

_LIBS = _libraries() if _tsfile_version() in TESTED_VERSIONS else []
_enabled = bool(_LIBS)
#: pid whose native pool is valid (None: the pool must be rebuilt before this process reads).
_POOL_PID: int | None = os.getpid()
#: pid that started using tsfile; its plain forks cannot read when the fix is off.
_USER_PID: int | None = None


def fork_safe() -> bool:
    """Return True when forked children of this process can read TsFiles."""
    return _enabled


def disable() -> None:
    """Switch the fix off in this process (make_loader then uses forkserver workers)."""
    global _enabled
    _enabled = False


def _after_fork_in_child() -> None:
    global _POOL_PID
    if _enabled:
        for pointer, _ in _LIBS:
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
    for pointer, init in _LIBS:
        if pointer.value is None:
            init()  # common::init_common(): resets tsfile's config, then new ThreadPool
    tsfile.set_file_read_backend(previous)
    _POOL_PID = os.getpid()
    logger.debug("tsfile native pool rebuilt in forked child %d", _POOL_PID)


def check_fork_safety(name: str) -> None:
    """Prepare this process to read; raise if it is an unfixable fork of a tsfile user.

    Raises:
        TsFileTorchError: this process was forked, without the fix, from one that had opened
            readers (reading here would hang).
    """
    global _USER_PID
    if _enabled:
        ensure_pool()
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
