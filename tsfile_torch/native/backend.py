"""Read backends: open a ``TsFileReader`` with a chosen backend captured at open.

tsfile's backend setting is process-global and read when a reader opens (Note: backend capture).
:func:`open_reader` sets it, opens, and restores the previous value under one lock, so each reader
keeps the backend it was opened with whatever changes the global later.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
import threading
from typing import IO

import tsfile
from tsfile import FileReadBackend, TsFileReader

from tsfile_torch.errors import MappingError, TsFileFormatError
from tsfile_torch.native.forkfix import check_fork_safety, fork_safe  # noqa: F401 - fork_safe re-exported
from tsfile_torch.sources.remote import RemoteFile

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


def _new_lock_in_child() -> None:  # a thread of the parent may have held it at fork
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


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
            raise os_error(name, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT)))
        raise TsFileFormatError(
            f"{name}: not a regular file; TsFiles are read from regular files or seekable "
            f"binary file objects"
        )
    if isinstance(source, io.IOBase) and not source.seekable():
        raise TsFileFormatError(f"{name}: file object is not seekable; TsFileReader needs seek()")
    target = os.fspath(source) if isinstance(source, os.PathLike) else source
    check_fork_safety(name)
    if isinstance(target, str):
        _check_openable(target, name)
    with _OPEN_LOCK:
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


#: errno -> what to say and what to do, for errors opening a file by path.
_ERRNO_HINTS = {
    errno.EMFILE: "too many open files (raise ulimit -n or lower max_open_files)",
    errno.ENFILE: "too many open files in the system (raise fs.file-max or lower max_open_files)",
    errno.EACCES: "permission denied (check the file's permissions)",
    errno.EPERM: "operation not permitted (check the file's permissions)",
    errno.ENOENT: "no such file (it was moved or deleted; check the path)",
}


def os_error(name: str, err: OSError) -> TsFileFormatError:
    """Return a TsFileFormatError for ``err`` that keeps its errno and says what to do."""
    hint = _ERRNO_HINTS.get(err.errno, err.strerror or str(err))
    out = TsFileFormatError(f"{name}: cannot open: {hint} [errno {err.errno}]")
    out.errno = err.errno
    return out


def _check_openable(path: str, name: str) -> None:
    """Open and close ``path`` once so that errno survives (tsfile's own error drops it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise os_error(name, err) from err
    os.close(fd)


def _actual_backend(source: Source, backend: str) -> str:
    if backend == "pread" or not _can_map(source):
        return "pread"
    if sys.platform.startswith("linux"):
        return "mmap" if is_mapped(os.fspath(source)) else "pread"
    return backend if backend == "mmap" else "auto"
