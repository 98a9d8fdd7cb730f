"""Note: guarded read. The one path of every native read of a file a catalog describes.

:func:`guarded_call` runs one native call on a file (an open, a stretch of its time column, a
block of values) and does, in this order:

1. **change check before**: ``file.check_unchanged()`` (Note: content-relevant identity in
   :mod:`tsfile_torch.sources.content`): the reader opens or reads the file the catalog was
   built from;
2. **the call**, announced to ``on_read`` before it starts and after it ends (Note: worker
   reports), with tsfile's exceptions turned into a TsFileFormatError naming the file
   (:func:`~tsfile_torch.native.errors.native_call`, Note: native errors);
3. **change check after**: the file did not change during the call, so nothing read while it
   was being written is handed out (what the call returned is released first, e.g. a reader
   just opened is closed);
4. **verification** of what was read (the statistics check of a decoded block);
5. **damage memory** around 2-4 (:func:`damage_remembered`): a TsFileFormatError there while
   the file is unchanged, and not an OS or a store's error, is remembered as the file's damage
   (Note: remembered verdicts, in :mod:`tsfile_torch.sources.content`; ``on_damaged="skip"``
   then leaves it out).

Note: damage and exhaustion. Only damage is remembered. Running out of something is a fact
about the process, not the file, and is never stored as the file's verdict (a later run with
``on_damaged="skip"`` would drop a healthy file): memory (a ``MemoryError``, tsfile's
``OOMError``: a :class:`~tsfile_torch.errors.ResourceError`), open files (``EMFILE``), any OS
error, a timeout, a store's error while fetching a URL. :func:`damage_remembered` looks at the
error and every error it was raised from.

The file is anything with a ``name``, an ``index_key`` and ``check_unchanged()``: the
catalog's ``FileInfo``, which lives above this layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tsfile_torch.errors import RemoteError, ResourceError, TsFileFormatError
from tsfile_torch.native.errors import MEMORY_ERRORS, native_call
from tsfile_torch.sources.content import remember

__all__ = ["CheckedFile", "announced", "damage_remembered", "guarded_call"]


class CheckedFile(Protocol):
    """A file that can say whether it is still the one a catalog was built from."""

    name: str

    @property
    def index_key(self) -> str | None:
        """Key of what was learned about the file as it was (remembered verdicts)."""

    def check_unchanged(self) -> None:
        """Raise TsFileFormatError if the file changed."""


def announced(
    name: str, what: str, fn: Callable[..., Any], *args, on_read: Callable | None = None
) -> Any:
    """Return ``native_call(name, what, fn, *args)``, announced to ``on_read`` (Note: worker
    reports): called with ``"{name}: {what}"`` before the call and with None after it."""
    if on_read is not None:
        on_read(f"{name}: {what}")
    try:
        return native_call(name, what, fn, *args)
    finally:
        if on_read is not None:
            on_read(None)


@contextlib.contextmanager
def damage_remembered(file: CheckedFile) -> Iterator[None]:
    """Remember ``file`` as damaged when the block raises TsFileFormatError while the file is
    unchanged (step 5 of the module note). Not remembered: a change (its own error replaces the
    first one), what ran out (Note: damage and exhaustion: memory, an OS error such as too many
    open files or an I/O error, a timeout) and a store's error while fetching a URL (a
    RemoteError raised from the client's exception: access denied, throttled, unreachable), none
    of which says anything about the file's bytes. Nested blocks remember an error once."""
    try:
        yield
    except TsFileFormatError as err:
        file.check_unchanged()  # a change: its own error replaces this one
        if not getattr(err, "_remembered", False) and _is_damage(err):
            remember(file.index_key, damaged=str(err))
            err._remembered = True
        raise


def _is_damage(err: TsFileFormatError) -> bool:
    if getattr(err, "errno", None) is not None:
        return False
    if isinstance(err, RemoteError) and err.__cause__ is not None:
        return False
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:  # the error and all it came from
        if isinstance(cause, _EXHAUSTION):
            return False
        seen.add(id(cause))
        cause = cause.__cause__
    return True


#: What running out of something raises (Note: damage and exhaustion).
_EXHAUSTION: tuple[type[BaseException], ...] = (
    *MEMORY_ERRORS,
    ResourceError,
    OSError,
    TimeoutError,
)


def guarded_call(
    file: CheckedFile,
    what: str,
    fn: Callable[..., Any],
    *args,
    on_read: Callable | None = None,
    verify: Callable[[Any], None] | None = None,
    release: Callable[[Any], None] | None = None,
    translate: bool = True,
) -> Any:
    """Return ``fn(*args)``, one native call on ``file`` guarded as the module note says.

    Args:
        file: the file read (the catalog's ``FileInfo``).
        what: what the call does, for errors and announcements ("reading device t.d0, rows
            [0, 8192) via mmap").
        fn, args: the call.
        on_read: announcement hook (Note: worker reports); ``None``: not announced.
        verify: called with the result once the file is known unchanged; a TsFileFormatError
            it raises is damage.
        release: called with the result when the file changed during the call.
        translate: run ``fn`` through :func:`announced`; ``False`` for a call that names and
            translates its own native errors (:func:`~tsfile_torch.native.backend.open_reader`).

    Raises:
        TsFileFormatError: the file changed, tsfile failed on it, or ``verify`` refused what
            was read.
    """
    file.check_unchanged()
    with damage_remembered(file):
        result = announced(file.name, what, fn, *args, on_read=on_read) if translate else fn(*args)
        try:
            file.check_unchanged()  # changed during the call?
        except TsFileFormatError:
            if release is not None:
                release(result)
            raise
        if verify is not None:
            verify(result)
    return result
