"""The one module that reaches private internals of torch, torchdata and CPython.

Every other module goes through the accessors here. Each entry of :data:`INTERNALS` names what
it reaches, the versions it was checked on and what is lost where it is missing; an accessor
that finds its internal missing warns once (:class:`CompatWarning`) and turns only that
mechanism off, never silently. ``tests/test_compat.py`` checks every entry against the
installed torch, torchdata and CPython and fails (never skips) when one has changed.

8 private names in 4 entries, the limit shared/DESIGN.md sets (``tests/test_compat.py``
counts them). Public routes replaced the rest: torch's SIGCHLD handler is put back rather than
its flag reset (:class:`tsfile_torch.process.LoaderScope`); a worker ended by SIGTERM removes
what it made by name (Note: nothing left behind in :mod:`tsfile_torch.process`).

The native tsfile symbols the fork fix reaches (:mod:`tsfile_torch.native.forkfix`, gated by
its own self-test) are listed in :data:`NATIVE_SYMBOLS` and not counted.

Nothing here imports torch at import time: torch's modules are looked up when asked for.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from typing import NamedTuple

__all__ = [
    "CHECKED_ON",
    "INTERNALS",
    "NATIVE_SYMBOLS",
    "CompatWarning",
    "Internal",
    "batching_fetcher",
    "current_iterator",
    "drop_iterator",
    "forget_worker_pids",
    "iterator_workers",
    "posix_shm",
    "shutdown_workers",
    "wrap_shutdown",
]

#: The versions every entry was checked on (tests/test_compat.py checks the installed ones).
CHECKED_ON = "torch 2.13.0, torchdata 0.11.0, CPython 3.11.7 (Linux)"


class Internal(NamedTuple):
    """One private internal: what it is, where it is used, what is lost without it."""

    names: tuple[str, ...]
    used_by: str
    checked_on: str
    missing: str


INTERNALS = {
    "fetcher": Internal(
        ("torch.utils.data._utils.fetch._IterableDatasetFetcher",),
        "data/rows.py: DataLoader(iterable row dataset) with batch_size set is refused",
        "torch 2.1 to 2.13, torchdata 0.11 (same class name)",
        "the stacked batches (1, batch_size, C) are not refused; make_loader is unaffected",
    ),
    "worker_pids": Internal(
        (
            "torch.utils.data._utils.signal_handling._remove_worker_pids",
            "_MultiProcessingDataLoaderIter._worker_pids_set",
        ),
        "loader.py: workers ended by tsfile-torch leave torch's SIGCHLD check first",
        "torch 2.1 to 2.13, torchdata 0.11",
        "ending a failed pass's workers may raise torch's 'killed by signal' RuntimeError",
    ),
    "iterator": Internal(
        (
            "DataLoader._iterator",
            "_MultiProcessingDataLoaderIter._workers",
            "_MultiProcessingDataLoaderIter._shutdown_workers",
        ),
        "loader.py: a failed pass's workers are ended and the next pass starts new ones; "
        "worker failure reports name the workers; workers ended at interpreter exit; the "
        "shutdown run by a garbage collection ends the workers first (the iterator's class "
        "swapped for a subclass: Note: an iterator collected in a cycle; the torch bug it works "
        "around, with its reproduction: docs/upstream.md)",
        "torch 2.1 to 2.13, torchdata 0.11",
        "a failed pass's workers are left to torch's shutdown (the next pass may wait on "
        "them) and failure reports name no worker",
    ),
    "posix_shm": Internal(
        ("_posixshmem", "multiprocessing.resource_tracker"),
        "data/ring.py: the batch ring's segments (0600, reserved, tracked)",
        "CPython 3.10 to 3.13 (Linux, macOS)",
        "no ring: batches go through torch's own hand-over (Note: ring platforms)",
    ),
}

#: Native tsfile symbols the fork fix reaches (not counted: tsfile's, gated by the fork fix's
#: own version check and self-test in tsfile_torch.native.forkfix).
NATIVE_SYMBOLS = (
    "_ZN6common14g_thread_pool_E",
    "_ZN6common11init_commonEv",
    "_ZN6common16set_thread_countEi",
)


class CompatWarning(RuntimeWarning):
    """A private internal tsfile-torch relies on is missing here: one mechanism is off."""


@functools.cache
def _warn_missing(entry: str, what: str) -> None:
    info = INTERNALS[entry]
    warnings.warn(
        f"tsfile-torch: {what} is missing from this installation (checked on "
        f"{info.checked_on}), so {info.missing}; please report it with your torch and Python "
        f"versions",
        CompatWarning,
        stacklevel=3,
    )


# -- fetcher ------------------------------------------------------------------------------------
_ITERABLE_FETCHER = "_IterableDatasetFetcher"


def batching_fetcher(depth: int = 4) -> bool:
    """Return whether the caller's caller was called by torch's iterable-dataset fetcher that
    batches items (``auto_collation``: a DataLoader with ``batch_size`` set).

    Looks ``depth`` frames above the caller's caller for a ``self`` of that class name.
    """
    frame = inspect.currentframe()
    frame = frame.f_back.f_back if frame is not None and frame.f_back is not None else None
    for _ in range(depth):
        if frame is None:
            return False
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == _ITERABLE_FETCHER:
            return bool(getattr(owner, "auto_collation", False))
        frame = frame.f_back
    return False


# -- torch's SIGCHLD handler --------------------------------------------------------------------
_SIGNALS = "torch.utils.data._utils.signal_handling"


def _signal_handling():
    """torch's DataLoader signal module, None before torch loads it (looked up, never imported:
    a scope closed at interpreter exit must not import)."""
    return sys.modules.get(_SIGNALS)


def forget_worker_pids(it) -> None:
    """Take the workers of iterator ``it`` out of torch's SIGCHLD check (before ending them)."""
    if not getattr(it, "_worker_pids_set", False):
        return
    remove = getattr(_signal_handling(), "_remove_worker_pids", None)
    if remove is None:
        _warn_missing("worker_pids", f"{_SIGNALS}._remove_worker_pids")
        return
    remove(id(it))
    it._worker_pids_set = False


# -- the DataLoader's multi-process iterator ----------------------------------------------------
def _require(obj, name: str, default=None):
    """Return ``obj.name``; where torch has no such attribute, warn once and return
    ``default``."""
    if not hasattr(obj, name):
        _warn_missing("iterator", f"{type(obj).__name__}.{name}")
        return default
    return getattr(obj, name)


def current_iterator(loader):
    """Return the iterator a DataLoader keeps (persistent workers), or None."""
    return _require(loader, "_iterator")


def drop_iterator(loader, it) -> None:
    """Make ``loader`` forget ``it`` (if it keeps it): its next pass starts new workers."""
    if current_iterator(loader) is it:
        loader._iterator = None


def iterator_workers(it) -> list:
    """Return the worker processes of a DataLoader iterator ([] for one without workers)."""
    if it is None or not hasattr(type(it), "_shutdown_workers"):
        return []  # the single-process iterator
    return list(_require(it, "_workers", ()))


def shutdown_workers(it) -> None:
    """Run torch's shutdown of ``it``'s workers (idempotent in torch)."""
    if it is not None and hasattr(type(it), "_shutdown_workers"):
        it._shutdown_workers()


def wrap_shutdown(it, before) -> None:
    """Make ``it``'s shutdown call ``before(it)`` first (a multi-process iterator only): its
    class is swapped for a subclass, made once per class."""
    cls = type(it)
    if hasattr(cls, "_shutdown_workers") and not getattr(cls, "_tsfile_torch_wrapped", False):
        it.__class__ = _wrapped(cls, before)


@functools.cache
def _wrapped(cls: type, before) -> type:
    def _shutdown_workers(self) -> None:
        before(self)
        cls._shutdown_workers(self)

    body = {"_shutdown_workers": _shutdown_workers, "_tsfile_torch_wrapped": True}
    return type(cls.__name__, (cls,), body)


# -- POSIX shared memory ------------------------------------------------------------------------
@functools.cache
def posix_shm():
    """Return ``(_posixshmem, resource_tracker)``, or None where the platform has no POSIX
    shared memory (Windows; elsewhere its absence warns once)."""
    try:
        import _posixshmem
        from multiprocessing import resource_tracker
    except ImportError:
        if os.name == "posix":
            _warn_missing("posix_shm", "_posixshmem")
        return None
    return _posixshmem, resource_tracker
