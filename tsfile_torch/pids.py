"""Process lifetimes: the one liveness check (epoch claims, crash reports, downloads), the
few statements a worker's ending waits for (:func:`ending_deferred`), and the CPUs a process may
use (:func:`usable_cpus`)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

__all__ = ["alive", "end_now_or_after", "ending_deferred", "usable_cpus"]

_deferred = 0  # ending_deferred blocks running in the main thread
_pending: Callable[[], None] | None = None  # the ending they hold off


def alive(pid: int) -> bool:
    """Return whether process ``pid`` runs now (0 and negative pids never do).

    Off POSIX, where ``os.kill(pid, 0)`` would end the process, every positive pid counts as
    alive.
    """
    if pid <= 0:
        return False
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def ending_deferred() -> Iterator[None]:
    """Run the block whole even when the process is asked to end meanwhile: an ending asked
    through :func:`end_now_or_after` inside it (a worker's SIGTERM clean-up, Note: nothing left
    behind in :mod:`tsfile_torch.process`) runs at its end. For steps another process relies on
    seeing together (a ring segment made and announced: the main process unlinks what it was
    told of). Main thread only, where Python runs signal handlers; elsewhere it does nothing."""
    global _deferred, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
        if not _deferred and _pending is not None:
            end, _pending = _pending, None
            end()


def end_now_or_after(end: Callable[[], None]) -> None:
    """Call ``end`` now, or when the outermost :func:`ending_deferred` block running ends."""
    global _pending
    if _deferred:
        _pending = end
    else:
        end()


def usable_cpus() -> int:
    """Return the CPUs this process may run on (its affinity where the OS says, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1
