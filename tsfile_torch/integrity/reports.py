"""Worker reports: a DataLoader worker that dies or stalls is named, with what it was reading.

Note: worker reports. Each dataset owns a small shared-memory table, one slot per DataLoader
worker. Before every native read the thread doing it (the worker's own, a decode or read-ahead
thread) records what it reads ("file X: device D, rows [a, b)"), and clears its record when the
read returns; the worker's slot holds ``pid`` and a read still in progress, empty when none is.
When the DataLoader reports a dead worker ("exited unexpectedly", "killed by signal") or times
out, the loader made by :func:`tsfile_torch.make_loader` reads the slots and raises
:class:`WorkerError`. A death is blamed on a file only when that worker was inside a native read
of it and died of a signal a crash raises (SIGSEGV, SIGBUS, ...), with the worker's fatal-signal
report when it left one (see :mod:`tsfile_torch.process`); a worker that died outside a read,
or was killed from outside (SIGKILL: usually the out-of-memory killer; SIGTERM...), is reported
with its signal and "the file is not suspected".
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import tempfile
import threading
from multiprocessing import sharedctypes

from tsfile_torch.errors import WorkerError, shared_memory
from tsfile_torch.native.errors import worker_memory_hint
from tsfile_torch.pids import alive

__all__ = ["ReadSlots", "crash_report_path", "crash_reports", "explain_worker_failure"]

_SLOT_BYTES = 400
_NUM_SLOTS = 64


def crash_report_path(pid: int) -> str:
    """Return where worker ``pid`` writes its fatal-signal report (Note: fatal-signal report)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"tsfile-torch-crash-{uid}-{pid}.txt")


class ReadSlots:
    """Shared memory: per worker, the read in progress (created before workers start)."""

    def __init__(self):
        self.buffer = shared_memory(
            sharedctypes.RawArray, ctypes.c_char, _SLOT_BYTES * _NUM_SLOTS, what="worker reports"
        )
        self._local()

    def _local(self) -> None:
        """This process's reads in progress, by thread (none after a fork or unpickling)."""
        self._pid, self._lock, self._reading = os.getpid(), threading.Lock(), {}

    def __getstate__(self):
        return {"buffer": self.buffer}

    def __setstate__(self, state):
        self.buffer = state["buffer"]
        self._local()

    def write(self, worker: int, text: str | None) -> None:
        """Record (``text``) or clear (None) the calling thread's read in progress in the slot
        of ``worker``; the slot shows a read while any thread of this process is in one."""
        if self._pid != os.getpid():  # forked: the parent's threads are not here
            self._local()
        with self._lock:
            if text is None:
                self._reading.pop(threading.get_ident(), None)
            else:
                self._reading[threading.get_ident()] = text
            shown = next(reversed(self._reading.values()), None)
            slot = worker % _NUM_SLOTS
            data = b"" if shown is None else f"{os.getpid()}|{shown}".encode()[: _SLOT_BYTES - 1]
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


def _stopped_workers(workers) -> list[int]:
    """Return the pids of worker processes stopped by a signal (state ``T`` in /proc)."""
    stopped = []
    for w in workers:
        try:
            with open(f"/proc/{w.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError, TypeError):
            continue
        if state in (b"T", b"t"):
            stopped.append(w.pid)
    return stopped


def explain_worker_failure(
    err: BaseException, slots: ReadSlots | None, workers=(), start_method: str | None = None
) -> WorkerError | None:
    """Return a WorkerError naming the read in progress if ``err`` is a worker death / timeout.

    Args:
        err: what the DataLoader iterator raised.
        slots: the dataset's read slots.
        workers: the iterator's worker processes; a broken pipe or connection counts as a
            worker death when one of them has exited.
        start_method: how the workers were started (``"fork"``, ``"forkserver"``, ``"spawn"``).
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
    # a death names its workers: only their reads count (another worker's read in progress
    # says nothing about this one's death); a timeout names none
    named = {p: w for p, w in reads.items() if not pids or p in pids}
    timed_out = "timed out" in message
    if not timed_out:
        killed = _killed_from_outside(message, workers)
        if killed is not None:
            return WorkerError(f"{message.strip()}: {_outside_kill(killed, named)}")
    stopped = _stopped_workers(workers) if timed_out else []
    if stopped:
        pids = set(stopped)
        listed = ", ".join(map(str, stopped))
        message = f"{message.strip()}: DataLoader worker (pid(s) {listed})"
        message += " is stopped (SIGSTOP / SIGTSTP: a debugger, a job control stop or a signal)"
        named = {p: w for p, w in reads.items() if p in pids}
        hint = "resume it (kill -CONT PID) or end it; the loader's workers are restarted next epoch"
        what = "; ".join(f"worker pid {p} was reading {w}" for p, w in sorted(named.items()))
        return WorkerError(f"{message}: {what or 'it was not inside a native read'}; {hint}")
    if named:
        what = "; ".join(f"worker pid {p} was reading {w}" for p, w in sorted(named.items()))
        hint = (
            "a read took longer than the loader's timeout: the file may be damaged (check it "
            "with `tsfile-torch verify PATH`) or the machine overloaded (raise timeout=)"
            if timed_out
            else "the worker died inside tsfile's native reader: the file is probably damaged "
            "or was truncated while memory-mapped; check it with `tsfile-torch verify PATH`"
        )
    else:
        what = "no worker was inside a native read"
        hint = (
            "the stall is not in tsfile's reader (raise timeout= if the machine is overloaded)"
            if timed_out
            else "the failure is not in tsfile's reader, and the file is not suspected: look "
            "in your code that runs in workers (collate_fn, worker_init_fn, the training "
            "loop's transforms) or for a signal sent to the worker"
        )
        if start_method in ("spawn", "forkserver"):
            hint += (
                f"; workers started by {start_method} import your script first: if it builds "
                f"and iterates the loader at module level, move that under "
                f"`if __name__ == '__main__':` (an error saying so is printed above)"
            )
    if not timed_out:
        hint += worker_memory_hint()  # Note: damage and exhaustion in tsfile_torch.native.guard
    report = crash_reports(pids or set(named)) if not timed_out else ""
    return WorkerError(f"{message.strip()}: {what}; {hint}{report}")


#: signals a crash in the process itself raises: a native reader on damaged bytes among them
_CRASHES = {"SIGSEGV", "SIGBUS", "SIGABRT", "SIGILL", "SIGFPE", "SIGSYS", "SIGTRAP"}


def _killed_from_outside(message: str, workers) -> str | None:
    """Return the name of the signal (``SIGKILL``...) that ended the dead worker(s) when it is
    not one a crash raises: sent by another process (the kernel's out-of-memory killer, a
    job scheduler, a user); None for a crash, an exit status, or not known."""
    names = set()
    for how in _dead_workers(workers).values():
        if how.startswith("killed by signal "):
            names.add(how.rsplit(" ", 1)[1])
    said = re.search(r"killed by signal: ([^.]+)", message)  # torch: strsignal's text
    if said:
        text = said.group(1).strip()
        for sig in signal.Signals:
            if signal.strsignal(sig) == text:
                names.add(sig.name)
    if not names or names & _CRASHES:
        return None
    return sorted(names)[0]


def _outside_kill(name: str, reads: dict[int, str]) -> str:
    """Explain a worker killed by signal ``name`` sent from outside (Note: worker reports)."""
    what = "; ".join(f"worker pid {p} was reading {w}" for p, w in sorted(reads.items()))
    where = f"{what} when it was killed" if what else "it was not inside a native read"
    if name == "SIGKILL":
        cause = (
            "SIGKILL comes from outside the process, most often the kernel's out-of-memory "
            "killer: memory ran short (see `dmesg`; use fewer workers, a smaller batch_size or "
            "prefetch_factor, or more memory)"
        )
    else:
        cause = f"{name} was sent to the worker by another process (a user, a job scheduler)"
    return f"killed by {name}; {where}; {cause}; the file is not suspected"


#: reports already read (and their files removed), by worker pid: a death is often explained
#: twice (torch's SIGCHLD handler, then the iterator's own error)
_READ: dict[int, str] = {}


def crash_reports(pids) -> str:
    """Return the fatal-signal reports the workers ``pids`` left (Note: fatal-signal report)."""
    out = []
    for pid in sorted(pids):
        if pid not in _READ:
            path = crash_report_path(pid)
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read().strip()
            except OSError:
                continue
            if not text:  # not (yet) written: the process may still be dying
                continue
            _READ[pid] = text
            with contextlib.suppress(OSError):
                os.unlink(path)
        out.append(f"\n--- worker pid {pid} fatal-signal report ---\n{_READ[pid]}")
    return "".join(out)


def remove_stale_reports() -> None:
    """Delete the empty report files of workers that have ended (their own cleanup skipped)."""
    prefix = os.path.basename(crash_report_path(0)).rsplit("-", 1)[0] + "-"
    directory = os.path.dirname(crash_report_path(0))
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if not (entry.name.startswith(prefix) and entry.name.endswith(".txt")):
                continue
            try:
                pid = int(entry.name[len(prefix) : -4])
                if entry.stat().st_size == 0 and not alive(pid):
                    os.unlink(entry.path)
            except (ValueError, OSError):
                continue
