"""Note: native errors. The one place that turns tsfile's exceptions into ours.

tsfile raises many exception types on damaged or changed files, not only
``TsFileCorruptedError``: ``OOMError`` (a flipped chunk-size byte), ``PartialReadError``,
``FileReadError``, ``InvalidArgumentError`` (all :class:`tsfile.exceptions.LibraryError`),
``UnicodeDecodeError`` from a flipped name byte, OS errors, and pyarrow errors on garbage
batches. :func:`native_call` catches exactly those and raises a
:class:`~tsfile_torch.errors.TsFileFormatError` naming the file and what was being done, chained
to the original; anything else (our own bugs, ``MemoryError``, ``KeyboardInterrupt``) passes
through unchanged.

Note: fatal-signal report. Where ``faulthandler`` is on (in DataLoader workers while a loader
runs, see :mod:`tsfile_torch.process`), each native call runs in a frame whose file name says
what it reads, so a native crash prints ``File "<tsfile-torch was reading data/part000.tsfile:
device t.d0, rows [0, 131072) via mmap>"``.
"""

from __future__ import annotations

import faulthandler
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from tsfile.exceptions import LibraryError

from tsfile_torch.errors import SKIP_HINT, TsFileFormatError

__all__ = ["METADATA_ERRORS", "NATIVE_ERRORS", "native_call"]

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
    except NATIVE_ERRORS + also as err:
        raise TsFileFormatError(
            f"{name}: {what} failed ({type(err).__name__}: {err}); {hint}"
        ) from err


_FRAME = "def _reading(fn, args, kwargs):\n    return fn(*args, **kwargs)\n"


def _in_named_frame(what: str, fn, args, kwargs):
    """Return ``fn(*args, **kwargs)`` called in a frame named after ``what`` (a crash report)."""
    namespace: dict = {}
    exec(compile(_FRAME, f"<tsfile-torch was reading {what}>", "exec"), namespace)
    return namespace["_reading"](fn, args, kwargs)
