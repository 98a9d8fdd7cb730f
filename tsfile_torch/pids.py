"""Process lifetimes: the one liveness check (epoch claims, crash reports, downloads), the
few statements a worker's ending waits for (:func:`ending_deferred`), the CPUs a process may
use (:func:`usable_cpus`) and its share of them beside the other reading processes
(:func:`cpu_share`)."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = ["alive", "cpu_share", "end_now_or_after", "ending_deferred", "usable_cpus", "worker_id"]

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


def worker_id() -> tuple[int, int] | None:
    """Return (worker id, number of workers) in a DataLoader worker, else None.

    Asked of torch only if torch is loaded: without it there is no DataLoader worker (the core
    itself needs no torch).
    """
    tud = sys.modules.get("torch.utils.data")
    info = tud.get_worker_info() if tud is not None else None
    return None if info is None else (info.id, info.num_workers)


def cpu_share(most: int) -> int:
    """Return this process's share of the usable CPUs, at least 1 and at most ``most``: the CPUs
    divided among the processes that read on this machine, the DataLoader workers (when this
    is one) times the ranks torchrun started here (``LOCAL_WORLD_SIZE``)."""
    worker = worker_id()
    processes = 1 if worker is None else max(1, worker[1])
    try:
        processes *= max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        pass  # not torchrun's: one rank on this machine
    return max(1, min(most, usable_cpus() // processes))
