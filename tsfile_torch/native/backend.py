"""Read backends: open a ``TsFileReader`` with a chosen backend captured at open.

Note: backend capture. tsfile's backend setting is process-global and read when a reader opens.
:func:`open_reader` sets it, opens, and restores the previous value under one lock, so each reader
keeps the backend it was opened with whatever changes the global later.
"""

from __future__ import annotations

import os
import sys
import threading

import tsfile
from tsfile import FileReadBackend, TsFileReader

from tsfile_torch.errors import MappingError
from tsfile_torch.native.errors import METADATA_ERRORS, native_call
from tsfile_torch.native.forkfix import check_fork_safety
from tsfile_torch.options import READ_BACKENDS, parse_backend
from tsfile_torch.sources.base import Source, SourceLike, as_source

__all__ = [
    "BACKENDS",
    "check_backend",
    "is_mapped",
    "mapped_paths",
    "open_reader",
    "parse_backend",
]

#: Backend names and the tsfile setting each stands for.
BACKENDS: dict[str, FileReadBackend] = {
    name: getattr(FileReadBackend, name.upper()) for name in READ_BACKENDS
}

_OPEN_LOCK = threading.Lock()


def _new_lock_in_child() -> None:  # a thread of the parent may have held it at fork
    global _OPEN_LOCK
    _OPEN_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def mapped_paths() -> set[str] | None:
    """Return the paths of files memory-mapped in this process (``None`` off Linux)."""
    try:
        # decoded as os.fsdecode does, so a name that is not UTF-8 compares equal to its path
        fs_encoding, fs_errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
        with open("/proc/self/maps", encoding=fs_encoding, errors=fs_errors) as maps:
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


def check_backend(source: Source, backend: str) -> None:
    """Raise :class:`MappingError` if ``backend`` is ``"mmap"`` and ``source`` cannot be mapped."""
    if parse_backend(backend) == "mmap" and not source.can_map:
        raise MappingError(
            f"{source.name}: read_backend='mmap' needs a path to a regular file, and "
            f"this source cannot be memory-mapped; pass a file path, or use read_backend='auto' "
            f"(falls back to pread) or 'pread'"
        )


def open_reader(
    source: SourceLike, backend: str, check_mapped: bool = True, name: str | None = None
) -> tuple[TsFileReader, str | None]:
    """Open a reader on ``source`` with ``backend`` captured, and say which backend it really got.

    Args:
        source: a :class:`~tsfile_torch.sources.Source`, a path or a seekable binary file object.
        backend: a name accepted by :func:`parse_backend`.
        check_mapped: look up which backend the reader really got (one scan of
            ``/proc/self/maps`` on Linux); ``False`` skips it and returns ``None`` for it.
        name: what errors call the file (default: the source's name).

    Returns:
        The open reader and the backend it really uses (``"mmap"`` or ``"pread"``; off Linux
        what was asked for), or ``None`` when not checked.

    Raises:
        MappingError: ``backend`` is ``"mmap"`` and the source cannot be mapped (a file object,
            a pipe or another non-regular file), or the file did not end up mapped.
        TsFileFormatError: the source is missing or is not a readable TsFile.
    """
    source = as_source(source)
    backend = parse_backend(backend)
    check_backend(source, backend)
    target = source.reader_target()
    name = name or source.name
    check_fork_safety(name)
    with _OPEN_LOCK:
        previous = tsfile.get_file_read_backend()
        tsfile.set_file_read_backend(BACKENDS[backend])
        try:
            reader = native_call(
                name,
                "opening as a TsFile",
                TsFileReader,
                target,
                hint="the file is empty, truncated, not a TsFile, or damaged",
                also=METADATA_ERRORS,
            )
        finally:
            tsfile.set_file_read_backend(previous)
    if not check_mapped:
        return reader, None
    actual = _actual_backend(source, backend)
    if backend == "mmap" and actual != "mmap":
        reader.close()
        raise MappingError(
            f"{source.name}: read_backend='mmap' was asked for, but tsfile did not map the file; "
            f"use read_backend='auto' or 'pread'"
        )
    return reader, actual


def _actual_backend(source: Source, backend: str) -> str:
    path = source.mapped_path()
    if backend == "pread" or path is None:
        return "pread"
    if sys.platform.startswith("linux"):
        return "mmap" if path in (mapped_paths() or ()) else "pread"
    return backend if backend == "mmap" else "auto"
