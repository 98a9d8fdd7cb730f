"""A training process that ends mid-epoch leaves nothing behind (Note: nothing left behind in
tsfile_torch/process.py): no worker crash reports, no ``pymp-*`` directory a plain DataLoader
would not leave, no traceback at interpreter exit.

Each case runs a child interpreter with ``TMPDIR`` pointing at the test's own directory, so
what it leaves there is counted exactly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, signal, sys, time
import torch.utils.data as tud
from tsfile_torch import TsFileIterableDataset, make_loader

# as in a terminal: a shell's background job (CI) starts with SIGINT ignored; children inherit
signal.signal(signal.SIGINT, signal.default_int_handler)
directory, how, kind = sys.argv[1:4]
ds = TsFileIterableDataset(directory, batch_size=500)
if kind == "plain":
    loader = tud.DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
else:
    loader = make_loader(ds, num_workers=2)
it = iter(loader)
next(it), next(it)
print("in the epoch", flush=True)
if how == "SIGTERM itself":
    os.kill(os.getpid(), signal.SIGTERM)
elif how == "Ctrl-C itself":
    os.kill(os.getpid(), signal.SIGINT)
elif how == "abandoned at exit":
    sys.exit(0)
time.sleep(60)  # "SIGTERM" / "Ctrl-C": signalled from outside
"""

HOWS = ["SIGTERM itself", "Ctrl-C itself", "SIGTERM", "Ctrl-C", "abandoned at exit"]


def _run(directory, how: str, kind: str, tmp: Path) -> tuple[int, str, list[str]]:
    env = {
        **os.environ,
        "TMPDIR": str(tmp),
        "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), how, kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group: Ctrl-C reaches it and its workers
    )
    try:
        assert proc.stdout.readline() == "in the epoch\n"
        if how == "SIGTERM":
            os.kill(proc.pid, signal.SIGTERM)
        elif how == "Ctrl-C":  # the terminal sends SIGINT to the whole foreground group
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # workers outlive the main process for a moment: they clean up when its death reaches
    # them (PR_SET_PDEATHSIG), possibly after the main process is reaped here
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        left = sorted(os.listdir(tmp))
        if not any(name.startswith(("pymp-", "tsfile-torch-crash-")) for name in left):
            break
        time.sleep(0.2)
    return proc.returncode, err, left


def _workers_of(left: list[str]) -> dict[int, object]:
    """For a failure message: whether each worker whose crash report is left still runs, and
    where its threads wait (a slow clean-up, or one that never ran)."""
    out: dict[int, object] = {}
    for name in left:
        if name.startswith("tsfile-torch-crash-"):
            pid = int(name.rsplit("-", 1)[1].split(".")[0])
            task = Path(f"/proc/{pid}/task")
            try:
                out[pid] = [(t.name, (t / "wchan").read_text()) for t in task.iterdir()]
            except OSError:
                out[pid] = "gone"
    return out


def _kinds(left: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in left:
        kind = "crash report" if name.startswith("tsfile-torch-crash-") else name.split("-")[0]
        out[kind] = out.get(kind, 0) + 1
    return out


@pytest.mark.slow  # a child interpreter with two workers per case, ~3 s each
@pytest.mark.parametrize("how", HOWS)
def test_a_main_process_ended_mid_epoch_leaves_nothing_a_plain_dataloader_would_not(
    small_dir, tmp_path, how
):
    (tmp_path / "ours").mkdir()
    (tmp_path / "plain").mkdir()
    code, err, left = _run(small_dir, how, "ours", tmp_path / "ours")
    _, _, plain = _run(small_dir, how, "plain", tmp_path / "plain")
    expected_code = {"SIGTERM": -15, "SIGTERM itself": -15, "abandoned at exit": 0}
    assert code == expected_code.get(how, -2)  # ended as that signal ends a process
    ours = _kinds(left)
    contents = {
        n: (tmp_path / "ours" / n).read_text()[:3000]
        for n in left
        if n.startswith("tsfile-torch-crash-")
    }
    assert "crash report" not in ours, (left, _workers_of(left), contents, err[-3000:])
    assert ours.get("pymp", 0) <= _kinds(plain).get("pymp", 0), (left, plain)
    assert set(ours) <= {"pymp"}, left
    if how == "abandoned at exit":  # an iterator dropped at interpreter exit: silent
        assert err == ""
    else:
        assert "Exception ignored" not in err and "WorkerError" not in err, err


SECOND_SIGTERM = r"""
import os, signal, sys, time
from tsfile_torch import process

path = sys.argv[1]
open(path, "w").close()
unlink = process._remove


def remove_after_a_second_sigterm(p):  # a second SIGTERM lands inside the first one's clean-up
    os.kill(os.getpid(), signal.SIGTERM)
    unlink(p)


process._remove = remove_after_a_second_sigterm
process._made["report"] = path
process._end_cleanly_on_sigterm()
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(10)
print("not ended", flush=True)
"""


def test_a_second_sigterm_during_a_workers_clean_up_does_not_cut_it_short(tmp_path):
    """The parent's death and its terminate can both SIGTERM a worker: the second runs the
    handler inside the first, before its unlink; the first call must finish, or the crash
    report is left behind."""
    report = tmp_path / "tsfile-torch-crash-0-1.txt"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-c", SECOND_SIGTERM, str(report)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stdout, proc.stderr)
    assert not report.exists(), proc.stderr
    assert proc.stderr == ""
