"""Every process-wide effect of tsfile-torch, named, version-gated and switchable in one place.

A library that reads files has no business changing its user's process; these are the few
things that make reading TsFiles in DataLoader workers safe and fast, each documented where it
lives, each tested on the versions in :data:`TESTED_ON`, each switched off with
:func:`disable` (one name, several, or all), and each kept out of the user's process where it
can be:

=================  ==========================================================================
``fork_fix``       after ``fork()`` the child's copy of tsfile's native pool pointer is nulled
                   and rebuilt at its first read (Note: tsfile and fork,
                   :mod:`tsfile_torch.native.forkfix`); off: workers start with forkserver.
                   Registered at import (``os.register_at_fork``), acts in children only.
``native_pool``    tsfile's native decode pool (6 threads in every process) sized at a
                   process's first open to its share of the CPUs, at most 6 (Note: native pool
                   size, :mod:`tsfile_torch.native.forkfix`); ``TSFILE_TORCH_NATIVE_THREADS``
                   in the environment sets it for every process, spawned workers included.
``malloc``         glibc ``mallopt`` in processes that read (Note: malloc tuning,
                   :mod:`tsfile_torch.native.malloc`): decode buffers stay mapped. Per dataset:
                   ``malloc_tuning=False``.
``worker_reports`` while a loader made by :func:`tsfile_torch.make_loader` is being iterated in
                   the main thread, torch's SIGCHLD handler is wrapped so a worker killed by a
                   signal is a :class:`~tsfile_torch.WorkerError` naming its read; torch's
                   handler is put back when the iteration ends (exhausted, closed or
                   dropped; dropped in a cycle that another thread collects: at the main
                   thread's next loader start, Note: scopes closed elsewhere).
``crash_report``   in DataLoader workers only: ``faulthandler`` writes a fatal-signal report
                   (with the named frame of the native read, Note: fatal-signal report in
                   :mod:`tsfile_torch.native.errors`) to a file that the main process quotes in
                   the WorkerError, never to the terminal.
``parent_guard``   in DataLoader workers only: a worker ends when the process that started it
                   dies, even stuck in native code: ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` when
                   the loader was started from the main thread (the kernel sends it when the
                   starting *thread* exits, and the main thread lives as long as the process),
                   else a watchdog thread that polls the parent. A worker ended by SIGTERM
                   (the parent's death, multiprocessing's exit, torch's shutdown) first removes
                   what it made (Note: nothing left behind).
=================  ==========================================================================

Nothing here runs at import except registering the fork fix; nothing is left behind in the
user's process after a loader finishes: its signal handlers, ``faulthandler`` state and
``multiprocessing`` settings are what they were before (workers are ours: they keep theirs).
A dataset build never forks a process that runs other threads (see
:mod:`tsfile_torch.integrity.validate`).
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import functools
import os
import shutil
import signal
import sys
import tempfile
import threading
import weakref

from tsfile_torch import mechanisms
from tsfile_torch.integrity.reports import (
    ReadSlots,
    crash_report_path,
    explain_worker_failure,
    remove_stale_reports,
)
from tsfile_torch.native import forkfix, malloc
from tsfile_torch.pids import end_now_or_after

__all__ = [
    "EFFECTS",
    "TESTED_ON",
    "LoaderScope",
    "disable",
    "enable",
    "enabled",
    "restore_due",
    "start_worker",
]

#: The effects by name (see the module notes).
EFFECTS = ("fork_fix", "native_pool", "malloc", "worker_reports", "crash_report", "parent_guard")
#: Versions each effect was tested on. The fork fix and the pool size act on another tsfile only
#: once a self-test proved them (Note: fork fix self-test in tsfile_torch.native.forkfix).
TESTED_ON = {
    "fork_fix": f"tsfile {', '.join(forkfix.TESTED_VERSIONS)} (Linux); others: self-test",
    "native_pool": f"tsfile {', '.join(forkfix.TESTED_VERSIONS)} (Linux); others: self-test",
    "malloc": malloc.TESTED_ON,
    "worker_reports": "torch 2.1 to 2.13 (its SIGCHLD handler)",
    "crash_report": "CPython 3.10 to 3.13 (faulthandler)",
    "parent_guard": "Linux (prctl); elsewhere a watchdog thread",
}
_on = {name: True for name in EFFECTS}
_on["worker_reports"] = hasattr(signal, "SIGCHLD") and mechanisms.on("sigchld")


def _check(names) -> tuple[str, ...]:
    names = names or EFFECTS
    unknown = [n for n in names if n not in EFFECTS]
    if unknown:
        raise ValueError(f"unknown process effects {unknown}; they are {', '.join(EFFECTS)}")
    return tuple(names)


def disable(*names: str) -> None:
    """Switch effects off in this process (no names: all of them)."""
    for name in _check(names):
        _on[name] = False
    if "fork_fix" in names or not names:
        forkfix.disable()
    if "native_pool" in names or not names:
        forkfix.size_pool = False
    if "malloc" in names or not names:
        malloc.enabled = False


def enable(*names: str) -> None:
    """Switch effects back on (the fork fix cannot be switched on again once off)."""
    for name in _check(names):
        _on[name] = name not in ("fork_fix", "native_pool") or forkfix.fork_safe()
    if "native_pool" in names or not names:
        forkfix.size_pool = forkfix.fork_safe()
    if "malloc" in names or not names:
        malloc.enabled = True


def enabled(name: str) -> bool:
    """Return whether effect ``name`` is on: switched on and able to act here (the fork fix and
    the pool size on this tsfile and platform, malloc tuning where glibc is)."""
    name = _check([name])[0]
    if not _on[name]:
        return False
    if name in ("fork_fix", "native_pool"):
        return forkfix.fork_safe() and (name == "fork_fix" or forkfix.size_pool)
    if name == "malloc":
        return malloc.enabled and _has_mallopt()
    return True


@functools.cache
def _has_mallopt() -> bool:
    """Whether glibc's ``mallopt`` is there for malloc tuning (Linux with glibc)."""
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallopt")
    except OSError:
        return False


# -- in the main process, while a loader runs ---------------------------------------------------
#: read slots of the datasets whose loaders are being iterated (for the SIGCHLD path)
_LIVE: weakref.WeakSet = weakref.WeakSet()
_SCOPES = 0
_PREVIOUS_SIGCHLD = None  # the DataLoader's handler, which _sigchld wraps
_ORIGINAL_SIGCHLD = None  # the handler before the first open scope
#: the last scope was closed off the main thread (a dropped pass collected there): the handler
#: is put back by the main thread's next call here (Note: scopes closed elsewhere)
_RESTORE_DUE = False
#: held while the scope count changes (a garbage collection may close a scope on any thread, and
#: inside a call here on this one: reentrant)
_SCOPE_LOCK = threading.RLock()


class _AllSlots:
    def read_all(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for scope in list(_LIVE):
            if scope.slots is not None:
                out.update(scope.slots.read_all())
        return out


def _sigchld(signum, frame):
    previous = _PREVIOUS_SIGCHLD
    if previous is None:  # a signal that arrived while the handler was being put back
        return
    try:
        previous(signum, frame)
    except RuntimeError as err:
        better = explain_worker_failure(err, _AllSlots())
        if better is None:
            raise
        raise better from err
    finally:
        restore_due()  # signal handlers run on the main thread


def restore_due() -> None:
    """Put back the SIGCHLD handler if the last scope closed off the main thread.

    Note: scopes closed elsewhere. A pass dropped in a reference cycle is closed by whichever
    thread runs the garbage collection that finds it (a pin-memory thread, a read-ahead thread, a
    user's thread), and only the main thread may set a signal handler. The scope count drops at
    once; the handler (still the wrapper, which calls torch's) is put back by the main thread's
    next loader start, by the wrapper itself, or by this call (main thread only; a no-op
    otherwise and when nothing is due).
    """
    global _RESTORE_DUE, _PREVIOUS_SIGCHLD
    if threading.current_thread() is not threading.main_thread():
        return
    with _SCOPE_LOCK:
        if not _RESTORE_DUE or _SCOPES:
            return
        _RESTORE_DUE = False
        # torch's handler, which a plain DataLoader leaves installed too, else the one before
        back = _PREVIOUS_SIGCHLD if _PREVIOUS_SIGCHLD is not None else _ORIGINAL_SIGCHLD
        if signal.getsignal(signal.SIGCHLD) is not back:
            signal.signal(signal.SIGCHLD, back)
        _PREVIOUS_SIGCHLD = None


class LoaderScope:
    """The main-process effects of one loader iteration, undone by :meth:`close`.

    Open it before the DataLoader creates its iterator: the first open scope records the
    SIGCHLD handler in force then. torch's DataLoader installs its own SIGCHLD handler when its
    first multi-process iterator starts (and never removes it); it raises "worker ... is killed
    by signal" from there, anywhere in the main thread, so while scopes are open that handler is
    wrapped to raise a WorkerError naming the read instead (:meth:`watch`). When the last scope
    closes, torch's handler is put back, as a plain DataLoader leaves it (torch installs it once
    per process and never again: removing it would leave later DataLoaders without it), or the
    handler of the first open where none was wrapped.
    """

    def __init__(self, slots: ReadSlots | None, has_workers: bool = True):
        global _SCOPES, _ORIGINAL_SIGCHLD
        self.slots = slots
        in_main = threading.current_thread() is threading.main_thread()
        self.open = has_workers and _on["worker_reports"] and in_main
        with _SCOPE_LOCK:  # (a collection on another thread may close the last scope meanwhile)
            restore_due()  # a scope closed off the main thread: its handler back first
            if not self.open:
                return
            if _SCOPES == 0:
                _close_at_exit()
                _ORIGINAL_SIGCHLD = signal.getsignal(signal.SIGCHLD)
            _SCOPES += 1
            _LIVE.add(self)

    def watch(self, has_workers: bool) -> None:
        """Wrap the DataLoader's SIGCHLD handler (call once its iterator exists)."""
        global _PREVIOUS_SIGCHLD
        if not (self.open and has_workers):
            return
        current = signal.getsignal(signal.SIGCHLD)
        if callable(current) and current is not _sigchld:
            _PREVIOUS_SIGCHLD = current
            signal.signal(signal.SIGCHLD, _sigchld)

    def close(self) -> None:
        """Undo this scope's effects (idempotent; on any thread: the handler itself is put back
        on the main thread, at once or by :func:`restore_due`)."""
        global _SCOPES, _RESTORE_DUE
        with _SCOPE_LOCK:
            if not self.open:
                return
            self.open = False
            _LIVE.discard(self)
            _SCOPES -= 1
            if _SCOPES:
                return
            _RESTORE_DUE = True
        remove_stale_reports()
        restore_due()

    __del__ = close


@functools.cache
def _close_at_exit() -> None:
    """Close the scopes still open when the interpreter exits, before multiprocessing's exit
    function terminates the DataLoader workers (atexit runs the later registration first): a
    worker it ends is then no WorkerError raised from a SIGCHLD handler at exit."""

    def close_all() -> None:
        for scope in list(_LIVE):
            scope.close()

    atexit.register(close_all)


# -- in DataLoader workers ----------------------------------------------------------------------
_PR_SET_PDEATHSIG = 1


#: what this worker made and removes when SIGTERM ends it (Note: nothing left behind)
_made: dict[str, str] = {}


def start_worker(parent_pid: int, started_from_main_thread: bool) -> None:
    """Set up a DataLoader worker of a :func:`tsfile_torch.make_loader` loader (its init)."""
    if _on["crash_report"]:
        path = crash_report_path(os.getpid())
        try:  # a worker's own report, quoted by the main process (Note: fatal-signal report)
            report = open(path, "w")  # noqa: SIM115 - open for the worker's life
            # off first: a fork inherits "enabled" from a parent that has it on, and enable()
            # would then only switch files, leaving the DataLoader's own SIGSEGV handler on top
            faulthandler.disable()
            faulthandler.enable(file=report)
        except (OSError, RuntimeError, ValueError):
            pass
        else:  # a worker that ends normally leaves nothing behind (a crash skips this)
            from multiprocessing import util

            util.Finalize(None, _remove, args=(path,), exitpriority=0)
            _made["report"] = path
    if _on["parent_guard"]:
        own = _own_temp_dir()
        if own is not None:
            _made["temp"] = own
        # the process that started this worker: the loader's (fork, spawn) or the fork server,
        # which exits with it (forkserver); prctl fires when the starting *thread* exits
        parent = os.getppid()
        _guard_parent(parent, started_from_main_thread or parent != parent_pid)


def _own_temp_dir() -> str | None:
    """Make this worker's multiprocessing temporary directory now, so its name is known, and
    return it; None where it is the loader's process's, inherited by fork (it was there before
    the call), or where that cannot be told: it is never this worker's to remove then."""
    from multiprocessing import util

    base = tempfile.gettempdir()
    try:
        before = set(os.listdir(base))
    except OSError:
        return None
    temp = util.get_temp_dir()
    if os.path.dirname(temp) != base or os.path.basename(temp) in before:
        return None
    return temp


def _prctl():
    """Return libc's ``prctl`` where the platform has it (Linux), else None: the parent guard
    then watches the parent from a thread (docs/performance.md, platforms)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    except (OSError, TypeError):
        return None


def _guard_parent(parent_pid: int, use_prctl: bool) -> None:
    _end_cleanly_on_sigterm()
    prctl = _prctl() if use_prctl else None
    if prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) == 0:
        if os.getppid() != parent_pid:  # it died before prctl
            _end_terminated()
        return

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                _end_terminated()
            threading.Event().wait(0.5)

    threading.Thread(target=watch, name="tsfile-torch-parent-guard", daemon=True).start()


def _end_cleanly_on_sigterm() -> None:
    """Note: nothing left behind. A DataLoader worker is ended by SIGTERM when its parent dies
    (``PR_SET_PDEATHSIG``), when the main process exits (multiprocessing terminates daemonic
    children) and by torch's shutdown of workers that do not stop in time; by default that skips
    every exit clean-up: the worker's crash report and multiprocessing's ``pymp-*`` temporary
    directory (made for torch's file-descriptor sharing) stayed behind. Here SIGTERM removes
    both (nothing that can block: no queue is joined) and then ends the worker as SIGTERM would.
    Both are known by name from the worker's start: the report's path, and the temporary
    directory, made then (:func:`_own_temp_dir`; a fork may inherit the loader's process's,
    which is not the worker's to remove). The Python handler runs in the main thread between
    bytecodes; a main thread inside a native call (a stuck read) is covered by a thread woken
    through ``signal.set_wakeup_fd``, which the C-level handler writes at once. A SIGTERM that
    lands in steps the main process must see together (a ring segment made and announced) waits
    for their end (:func:`tsfile_torch.pids.ending_deferred`; the woken thread still ends the
    worker after a second).
    """
    signal.signal(signal.SIGTERM, lambda signum, frame: end_now_or_after(_end_terminated))
    try:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    except (OSError, ValueError):
        return

    def wait() -> None:
        while True:
            if signal.SIGTERM in os.read(wake_read, 64):
                threading.Event().wait(1.0)  # the handler ends a main thread running Python
                _end_terminated()

    threading.Thread(target=wait, name="tsfile-torch-sigterm", daemon=True).start()


_ending = threading.Lock()  # held by the one call of _end_terminated that ends this worker


def _end_terminated() -> None:
    """Remove what this worker made (its crash report, its multiprocessing temporary directory: the
    clean-ups of a normal exit that cannot block), then end as SIGTERM ends a process.

    Called once per ending: a second SIGTERM (the parent's death and the parent's own terminate
    can both send one) runs the Python handler again *inside* the first call; ending the process
    there could leave the crash report behind. So a nested call in the main thread returns at
    once and the first call finishes; another thread (the wake-up thread, the parent watchdog)
    waits a moment for a call already under way, then ends the worker itself.
    """
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        if not _ending.acquire(blocking=False):
            return  # nested in the call under way, which ends the worker
    else:
        _ending.acquire(timeout=2.0)  # a call under way ends the worker first; else this one
    _remove(_made.get("report", ""))
    if "temp" in _made:
        shutil.rmtree(_made["temp"], ignore_errors=True)
    if in_main:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:  # signal.signal is for the main thread only: libc's, then
        ctypes.CDLL(None).signal(int(signal.SIGTERM), 0)  # SIG_DFL
    os.kill(os.getpid(), signal.SIGTERM)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
