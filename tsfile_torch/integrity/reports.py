"""DataLoader workers that cannot die or stall unexplained, nor outlive their parent.

Note: worker reports. Each dataset owns a small shared-memory table, one slot per DataLoader
worker. Before every native read a worker writes ``pid`` and what it reads ("file X: device D,
rows [a, b)") into its slot, and clears it after. When the DataLoader reports a dead worker
("exited unexpectedly", "killed by signal") or times out, the loader made by
:func:`tsfile_torch.make_loader` reads the slots and raises :class:`WorkerError` naming the file
and rows that were being read. A worker also asks the kernel to send it SIGTERM when the process
that started it dies (Linux ``prctl(PR_SET_PDEATHSIG)``): a worker stuck in native code never
polls its parent, and SIGTERM ends it there (the kernel sends it when the *thread* that started
the worker exits; DataLoaders are iterated from a long-lived thread in practice).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import re
import signal
import threading
import weakref
from multiprocessing import sharedctypes

from tsfile_torch.errors import WorkerError

__all__ = [
    "ReadSlots",
    "die_with_parent",
    "disable_crash_report",
    "enable_crash_report",
    "explain_worker_failure",
    "reading",
]

_SLOT_BYTES = 400
_NUM_SLOTS = 64
_PR_SET_PDEATHSIG = 1


class ReadSlots:
    """Shared memory: per worker, the read in progress (created before workers start)."""

    def __init__(self):
        self.buffer = sharedctypes.RawArray(ctypes.c_char, _SLOT_BYTES * _NUM_SLOTS)

    def write(self, worker: int, text: str | None) -> None:
        slot = worker % _NUM_SLOTS
        data = b"" if text is None else f"{os.getpid()}|{text}".encode()[: _SLOT_BYTES - 1]
        base = slot * _SLOT_BYTES
        self.buffer[base : base + len(data) + 1] = data + b"\0"

    def read_all(self) -> dict[int, str]:
        """Return pid -> read in progress, for every worker that is reading."""
        out = {}
        raw = bytes(self.buffer)
        for slot in range(_NUM_SLOTS):
            text = raw[slot * _SLOT_BYTES : (slot + 1) * _SLOT_BYTES].split(b"\0", 1)[0]
            if text:
                pid, _, what = text.decode(errors="replace").partition("|")
                out[int(pid)] = what
        return out


_DEATH_SIGNAL_SET: int | None = None


def die_with_parent() -> bool:
    """Ask Linux to send SIGTERM to this process when its parent dies (once per process).

    Returns:
        True where ``prctl`` is available (Linux glibc), else False.
    """
    global _DEATH_SIGNAL_SET
    if _DEATH_SIGNAL_SET == os.getpid():
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    _DEATH_SIGNAL_SET = os.getpid()
    if os.getppid() == 1:  # the parent died before prctl: we were re-parented to init
        os.kill(os.getpid(), signal.SIGTERM)
    return True


_DEATH = re.compile(r"exited unexpectedly|killed by signal|timed out after")


def _dead_workers(workers) -> dict[int, str]:
    """Return pid -> how it ended, for DataLoader worker processes that have exited."""
    dead = {}
    for w in workers:
        w.join(timeout=1.0)  # its pipe closed first: give the exit a moment to be reaped
        code = w.exitcode
        if code is not None and code != 0:
            try:
                dead[w.pid] = (
                    f"killed by signal {signal.Signals(-code).name}"
                    if code < 0
                    else (f"exit status {code}")
                )
            except ValueError:
                dead[w.pid] = f"killed by signal {-code}"
    return dead


def explain_worker_failure(
    err: BaseException, slots: ReadSlots | None, workers=()
) -> WorkerError | None:
    """Return a WorkerError naming the read in progress if ``err`` is a worker death / timeout.

    Args:
        err: what the DataLoader iterator raised.
        slots: the dataset's read slots.
        workers: the iterator's worker processes; a broken pipe or connection counts as a
            worker death when one of them has exited.
    """
    message = str(err)
    if isinstance(err, RuntimeError):
        if not _DEATH.search(message):
            return None
    elif isinstance(err, (ConnectionError, EOFError, BrokenPipeError)):
        dead = _dead_workers(workers)
        if not dead:
            return None
        message = "DataLoader worker (pid(s) {}) {} ({}: {})".format(
            ", ".join(map(str, dead)), ", ".join(dead.values()), type(err).__name__, err
        )
    else:
        return None
    reads = slots.read_all() if slots is not None else {}
    found = re.search(r"\(pids?(?:\(s\))? ([\d, ]+)\)", message)
    pids = {int(p) for p in re.findall(r"\d+", found.group(1))} if found else set()
    named = {p: w for p, w in reads.items() if not pids or p in pids} or reads
    if named:
        what = "; ".join(f"worker pid {p} was reading {w}" for p, w in sorted(named.items()))
    else:
        what = "no worker was inside a native read (the failure is not in tsfile's reader)"
    timed_out = "timed out" in message
    hint = (
        "a read took longer than the loader's timeout: the file may be damaged (check it with "
        "`tsfile-torch verify PATH`) or the machine overloaded (raise timeout=)"
        if timed_out
        else "the worker died inside tsfile's native reader: the file is probably damaged or "
        "was truncated while memory-mapped; check it with `tsfile-torch verify PATH`"
    )
    return WorkerError(f"{message.strip()}: {what}; {hint}")


_CRASH_REPORT = True
_FRAME = "def _reading(fn, args):\n    return fn(*args)\n"


def enable_crash_report() -> bool:
    """Turn on ``faulthandler`` (stderr) unless switched off or already on; return if it is on."""
    if _CRASH_REPORT and not faulthandler.is_enabled():
        try:
            faulthandler.enable()
        except (RuntimeError, ValueError, OSError):  # no usable stderr
            return False
    return faulthandler.is_enabled()


def disable_crash_report() -> None:
    """Leave ``faulthandler`` alone from now on in this process (Note: fatal-signal report)."""
    global _CRASH_REPORT
    _CRASH_REPORT = False


def reading(what: str, fn, *args):
    """Return ``fn(*args)``, called in a frame that names ``what`` in a fatal-signal report."""
    if not faulthandler.is_enabled():
        return fn(*args)
    namespace: dict = {}
    exec(compile(_FRAME, f"<tsfile-torch was reading {what}>", "exec"), namespace)
    return namespace["_reading"](fn, args)


#: read slots of the datasets whose loaders are being iterated (for the SIGCHLD path)
_LIVE_SLOTS: weakref.WeakSet = weakref.WeakSet()


class _AllSlots:
    def read_all(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for slots in list(_LIVE_SLOTS):
            out.update(slots.read_all())
        return out


def watch_worker_deaths(slots: ReadSlots | None) -> None:
    """Make torch's SIGCHLD error a WorkerError naming the read in progress.

    torch's DataLoader raises "worker ... is killed by signal" from a SIGCHLD handler, so the
    error may surface anywhere in the main thread, outside the loader's ``__next__``. This wraps
    that handler (once per process, main thread only, chaining to it) so the error raised is a
    :class:`WorkerError` naming the file and rows.
    """
    if slots is not None:
        _LIVE_SLOTS.add(slots)
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGCHLD"):
        return
    previous = signal.getsignal(signal.SIGCHLD)
    if not callable(previous) or getattr(previous, "_tsfile_torch", False):
        return

    def handler(signum, frame):
        try:
            previous(signum, frame)
        except RuntimeError as err:
            better = explain_worker_failure(err, _AllSlots())
            if better is None:
                raise
            raise better from err

    handler._tsfile_torch = True
    signal.signal(signal.SIGCHLD, handler)
