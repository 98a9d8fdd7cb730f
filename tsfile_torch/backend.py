"""Read backends: open a ``TsFileReader`` with a chosen backend captured at open.

tsfile's backend setting is process-global and read when a reader opens (Note: backend capture).
:func:`open_reader` sets it, opens, and restores the previous value under one lock, so each reader
keeps the backend it was opened with whatever changes the global later.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import threading
from typing import IO

import tsfile
from tsfile import FileReadBackend, TsFileReader

from .errors import MappingError, TsFileFormatError, TsFileTorchError
from .remote import RemoteFile

__all__ = [
    "BACKENDS",
    "Source",
    "parse_backend",
    "check_backend",
    "open_reader",
    "source_name",
    "is_mapped",
    "mapped_paths",
]

#: Backend names and the tsfile setting each stands for.
BACKENDS: dict[str, FileReadBackend] = {
    "auto": FileReadBackend.AUTO,
    "mmap": FileReadBackend.MMAP,
    "pread": FileReadBackend.PREAD,
}

Source = str | os.PathLike | IO[bytes]

_OPEN_LOCK = threading.Lock()

# Note: tsfile and fork. Opening a TsFileReader starts tsfile's native decode thread pool
# (tsfile 2.5.0: 6 threads, held by the global pointer ``common::g_thread_pool_`` of
# libtsfile). Threads do not survive fork(): a forked child that decodes with the inherited pool
# waits forever in AlignedChunkReader::decode_all_planned_pages (seen in DataLoader workers).
# With the pointer null, tsfile decodes in the calling thread. So after every fork we null the
# child's copy of the pointer (the parent's pool object is left alone, never touched again), and
# the child decodes inline, which is also what a DataLoader worker wants: the workers are the
# parallelism. If the symbol cannot be found (another tsfile build), we remember which process
# started the pool and refuse to open readers in its forked children: an error, never a hang;
# make_loader then starts workers with forkserver instead of fork.
_POOL_PID: int | None = None


def _native_pool_pointers() -> list:
    """Return ctypes views of ``common::g_thread_pool_`` in every loaded copy of libtsfile."""
    import ctypes

    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {
                line.split(None, 5)[5].strip()
                for line in maps
                if "libtsfile" in line and len(line.split(None, 5)) == 6
            }
    except OSError:
        return []
    pointers = []
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL)
            pointers.append(ctypes.c_void_p.in_dll(lib, "_ZN6common14g_thread_pool_E"))
        except (OSError, ValueError):
            continue
    return pointers


_POOL_POINTERS = _native_pool_pointers()


def _after_fork_in_child() -> None:
    global _POOL_PID
    if _POOL_POINTERS:
        for pointer in _POOL_POINTERS:
            pointer.value = None
        _POOL_PID = None


def fork_safe() -> bool:
    """Return True when forked children of this process can read TsFiles (see the note above)."""
    return bool(_POOL_POINTERS)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_fork_safety(name: str) -> None:
    if _POOL_PID is not None and _POOL_PID != os.getpid():
        raise TsFileTorchError(
            f"{name}: this process was forked from process {_POOL_PID} after that process had "
            f"opened TsFile readers; tsfile's native thread pool does not survive fork() and "
            f"reading here would hang. Start DataLoader workers with "
            f"multiprocessing_context='forkserver' or 'spawn' (tsfile_torch.make_loader does "
            f"when it cannot make fork safe)"
        )


def parse_backend(value: object) -> str:
    """Return the backend name for ``value``.

    Args:
        value: ``"auto"``, ``"mmap"`` or ``"pread"`` in any case, or a ``tsfile.FileReadBackend``.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(value, FileReadBackend):
        for name, member in BACKENDS.items():
            if member == value:
                return name
    if isinstance(value, str) and value.lower() in BACKENDS:
        return value.lower()
    raise ValueError(
        f"read_backend must be one of 'auto', 'mmap', 'pread' or a tsfile.FileReadBackend; "
        f"got {value!r}"
    )


def source_name(source: Source) -> str:
    """Return a printable name for a path or file object."""
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else f"<{type(source).__name__} object>"


def mapped_paths() -> set[str] | None:
    """Return the paths of files memory-mapped in this process (``None`` off Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            return {
                parts[5].rstrip("\n")
                for parts in (line.split(None, 5) for line in maps)
                if len(parts) == 6
            }
    except OSError:
        return None


def is_mapped(path: str) -> bool:
    """Return True when ``path`` is memory-mapped in this process (Linux ``/proc/self/maps``)."""
    return os.path.realpath(path) in (mapped_paths() or ())


def _can_map(source: Source) -> bool:
    if isinstance(source, RemoteFile):
        return True  # read from its local copy (Note: remote sources)
    if not isinstance(source, (str, os.PathLike)):
        return False
    try:
        return stat.S_ISREG(os.stat(source).st_mode)
    except OSError:
        return False


def check_backend(source: Source, backend: str) -> None:
    """Raise :class:`MappingError` if ``backend`` is ``"mmap"`` and ``source`` cannot be mapped."""
    if parse_backend(backend) == "mmap" and not _can_map(source):
        raise MappingError(
            f"{source_name(source)}: read_backend='mmap' needs a path to a regular file, and "
            f"this source cannot be memory-mapped; pass a file path, or use read_backend='auto' "
            f"(falls back to pread) or 'pread'"
        )


def open_reader(
    source: Source, backend: str, check_mapped: bool = True
) -> tuple[TsFileReader, str | None]:
    """Open a reader on ``source`` with ``backend`` captured, and say which backend it really got.

    Args:
        source: a path to a TsFile or a seekable binary file object.
        backend: a name accepted by :func:`parse_backend`.
        check_mapped: look up which backend the reader really got (one scan of
            ``/proc/self/maps`` on Linux); ``False`` skips it and returns ``None`` for it.

    Returns:
        The open reader and the backend it really uses: ``"mmap"`` or ``"pread"`` (on Linux this
        is read from ``/proc/self/maps``; elsewhere it is what was asked for), or ``None`` when
        not checked.

    Raises:
        MappingError: ``backend`` is ``"mmap"`` and the source cannot be mapped (a file object,
            a pipe or another non-regular file), or the file did not end up mapped.
        TsFileFormatError: the source is missing or is not a readable TsFile.
    """
    backend = parse_backend(backend)
    name = source_name(source)
    check_backend(source, backend)
    if isinstance(source, (str, os.PathLike)) and not _can_map(source):
        if not os.path.exists(source):
            raise TsFileFormatError(f"{name}: no such file; check the path")
        raise TsFileFormatError(
            f"{name}: not a regular file; TsFiles are read from regular files or seekable "
            f"binary file objects"
        )
    if isinstance(source, io.IOBase) and not source.seekable():
        raise TsFileFormatError(f"{name}: file object is not seekable; TsFileReader needs seek()")
    target = os.fspath(source) if isinstance(source, os.PathLike) else source
    global _POOL_PID
    _check_fork_safety(name)
    with _OPEN_LOCK:
        _POOL_PID = os.getpid()
        previous = tsfile.get_file_read_backend()
        tsfile.set_file_read_backend(BACKENDS[backend])
        try:
            reader = TsFileReader(target)
        except Exception as err:
            raise TsFileFormatError(
                f"{name}: cannot open as a TsFile ({type(err).__name__}: {err}); the file is "
                f"empty, truncated, not a TsFile, or unreadable"
            ) from err
        finally:
            tsfile.set_file_read_backend(previous)
    if not check_mapped:
        return reader, None
    actual = _actual_backend(source, backend)
    if backend == "mmap" and actual != "mmap":
        reader.close()
        raise MappingError(
            f"{name}: read_backend='mmap' was asked for, but tsfile did not map the file; "
            f"use read_backend='auto' or 'pread'"
        )
    return reader, actual


def _actual_backend(source: Source, backend: str) -> str:
    if backend == "pread" or not _can_map(source):
        return "pread"
    if sys.platform.startswith("linux"):
        return "mmap" if is_mapped(os.fspath(source)) else "pread"
    return backend if backend == "mmap" else "auto"
