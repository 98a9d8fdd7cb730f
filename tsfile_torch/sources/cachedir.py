"""Cache directories bounded in bytes, shared by processes: one lock and one eviction.

Two caches keep files on disk for every process of a machine: the local copies of URL sources
(:mod:`tsfile_torch.sources.remote`) and the decoded disk cache
(:mod:`tsfile_torch.read.diskcache`). Both create an entry under an ``fcntl`` lock
(:func:`file_lock`) and, under a directory-wide lock, first delete the least recently used
entries until the new one fits in the bound (:func:`make_room`). Last use is an entry's mtime:
each cache touches an entry when it opens it. Deleting an entry another process has open or
mapped is safe on POSIX: its data stays until closed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator

__all__ = ["file_lock", "make_room"]

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def file_lock(path: str, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``fcntl`` lock on ``path`` (created if absent) across processes.

    The kernel releases it when the process dies: no stale lock files to clean up. Yields
    True once held; with ``blocking=False`` it does not wait and yields False when another
    open file holds it (in this process too: ``flock`` locks belong to an open file).
    """
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def make_room(
    entries: Iterable[tuple[float, int, str]],
    need: int,
    limit: int,
    keep: Callable[[str], bool] | None = None,
    what: str = "cache",
) -> int:
    """Delete least recently used entries until ``need`` more bytes fit in ``limit`` bytes.

    Call it under the directory's lock. An entry already gone counts as deleted.

    Args:
        entries: ``(last use, bytes, path)`` of every entry the bound counts (in-flight
            downloads included: they reserved their size).
        need: bytes of the entry about to be created.
        limit: the bound.
        keep: ``keep(path)`` is True for an entry that must stay (another process is writing
            it); ``None``: none.
        what: what log messages call the cache.

    Returns:
        The bytes the remaining entries use (more than ``limit - need`` when kept entries, or
        ``need`` itself, leave no room).
    """
    entries = sorted(entries)
    used = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if used + need <= limit:
            break
        if keep is not None and keep(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            logger.debug("%s full: deleted %s (%d bytes)", what, path, size)
        used -= size
    return used
