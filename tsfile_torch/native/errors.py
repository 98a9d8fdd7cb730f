"""Note: native errors. The one place that turns tsfile's exceptions into ours.

tsfile raises many exception types on damaged or changed files, not only
``TsFileCorruptedError``: ``OOMError`` (a flipped chunk-size byte), ``PartialReadError``,
``FileReadError``, ``InvalidArgumentError`` (all :class:`tsfile.exceptions.LibraryError`),
``UnicodeDecodeError`` from a flipped name byte, OS errors, and pyarrow errors on garbage
batches. :func:`native_call` catches exactly those and raises a
:class:`~tsfile_torch.errors.TsFileFormatError` naming the file and what was being done, chained
to the original; anything else (our own bugs, ``KeyboardInterrupt``) passes through unchanged.
Running out of memory is not damage: tsfile's ``OOMError`` and a ``MemoryError`` (pyarrow's
``ArrowMemoryError`` included) become a :class:`~tsfile_torch.errors.ResourceError` naming the
file, the process's memory limit and what to change (:func:`memory_error`), which is never
remembered as the file's damage (Note: damage and exhaustion in
:mod:`tsfile_torch.native.guard`). A damaged size field can make tsfile ask for more memory than
there is, so the message also points at ``tsfile-torch verify``.

Note: fatal-signal report. Where ``faulthandler`` is on (in DataLoader workers while a loader
runs, see :mod:`tsfile_torch.process`), each native call runs in a frame whose file name says
what it reads, so a native crash prints ``File "<tsfile-torch was reading data/part000.tsfile:
device t.d0, rows [0, 131072) via mmap>"``.
"""

from __future__ import annotations

import faulthandler
import os
import types
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from tsfile.exceptions import LibraryError, OOMError

from tsfile_torch.errors import SKIP_HINT, ResourceError, TsFileFormatError

__all__ = [
    "MEMORY_ERRORS",
    "METADATA_ERRORS",
    "NATIVE_ERRORS",
    "address_space_limit",
    "memory_error",
    "native_call",
    "worker_memory_hint",
]

#: What running out of memory raises in tsfile's reader, pyarrow or numpy (not damage).
MEMORY_ERRORS: tuple[type[BaseException], ...] = (OOMError, MemoryError)

#: What tsfile's native reader raises on damaged, truncated or changed files.
NATIVE_ERRORS: tuple[type[BaseException], ...] = (
    LibraryError,
    UnicodeDecodeError,
    OSError,
    pa.ArrowException,
)


#: What a native error means unless the caller knows better.
DAMAGED = f"the file is damaged, truncated or was changed while in use; {SKIP_HINT}"


#: What tsfile's Python layer raises on damaged metadata besides :data:`NATIVE_ERRORS`
#: (an enum value out of range: "254 is not a valid ColumnCategory"); caught only around
#: metadata reads, where no code of ours runs.
METADATA_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, IndexError)


def native_call(
    name: str,
    what: str,
    fn: Callable[..., Any],
    *args,
    hint: str = DAMAGED,
    also: tuple[type[BaseException], ...] = (),
    **kwargs,
) -> Any:
    """Return ``fn(*args, **kwargs)``; a native error becomes TsFileFormatError naming ``name``.

    The message reads ``"{name}: {what} failed ({error}); {hint}"``: ``what`` says what was
    being done ("reading device t.d0, rows [0, 8192) via mmap"); ``also`` adds exception
    types to catch where only tsfile's code runs (:data:`METADATA_ERRORS`).
    """
    try:
        if faulthandler.is_enabled():
            return _in_named_frame(f"{name}: {what}", fn, args, kwargs)
        return fn(*args, **kwargs)
    except MEMORY_ERRORS as err:
        raise memory_error(f"{name}: {what}", err) from err
    except NATIVE_ERRORS + also as err:
        raise TsFileFormatError(
            f"{name}: {what} failed ({type(err).__name__}: {err}); {hint}"
        ) from err


def memory_error(doing: str, err: BaseException) -> ResourceError:
    """Return the ResourceError for ``err``, memory run out while ``doing`` ("{file}: {what}").

    It names the process's address-space limit where one is set (``ulimit -v``), the fixes, and,
    since a damaged size field can ask tsfile for more memory than any machine has, the check
    that tells the two apart. Never remembered as damage.
    """
    return ResourceError(
        f"{doing} ran out of memory ({type(err).__name__}: {err}); this process's memory is "
        f"short ({_memory_limit()}): free memory, or lower what each process holds "
        f"(num_workers, batch_size, cache_bytes / cache='disk'); a file is not remembered as "
        f"damaged for this, but if memory is ample a damaged size field may be asking for too "
        f"much: check the file with `tsfile-torch verify`"
    )


def address_space_limit() -> int | None:
    """Return this process's address-space limit in bytes (``ulimit -v``, ``RLIMIT_AS``), or
    None where there is none or the platform cannot say."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def worker_memory_hint() -> str:
    """Return what to add to a dead worker's explanation under an address-space limit ("" when
    there is none): a worker short of memory may die without a Python error, since tsfile's
    native reader crashes (SIGSEGV) or aborts (``std::bad_alloc``) on some failed allocations and
    glibc aborts a thread it cannot give memory to."""
    limit = address_space_limit()
    if limit is None:
        return ""
    return (
        f"; or the worker ran out of memory: this process has an address-space limit "
        f"(`ulimit -v`, RLIMIT_AS) of {limit >> 20} MiB, inherited by its workers, and tsfile's "
        f"native reader crashes or aborts when an allocation fails; raise the limit or give "
        f"each worker less to hold (fewer num_workers, a smaller batch_size or cache)"
    )


def _memory_limit() -> str:
    """Say the address-space limit (``ulimit -v``) and the free memory, as far as known."""
    parts = []
    limit = address_space_limit()
    if limit is not None:
        parts.append(f"address-space limit RLIMIT_AS / `ulimit -v` {limit >> 20} MiB")
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        parts.append(f"{available >> 20} MiB of memory free")
    except (ValueError, OSError, AttributeError):
        pass
    return "; ".join(parts) or "limits unknown"


def _reading(fn, args, kwargs):
    return fn(*args, **kwargs)


def _in_named_frame(what: str, fn, args, kwargs):
    """Return ``fn(*args, **kwargs)`` called in a frame named after ``what`` (a crash report).

    The frame's code is ``_reading``'s with another file name (``CodeType.replace``): no
    compilation per call.
    """
    code = _reading.__code__.replace(co_filename=f"<tsfile-torch was reading {what}>")
    return types.FunctionType(code, {})(fn, args, kwargs)
