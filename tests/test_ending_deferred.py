"""A worker's SIGTERM clean-up waits for steps the main process must see together
(``tsfile_torch.pids.ending_deferred``): a ring segment made and announced. Before, a worker
ended between the two left a segment the main process was never told of, and the resource
tracker warned at exit ("There appear to be 1 leaked shared_memory objects", the rare failure
of ``test_left_behind.py``'s "abandoned at exit" case)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

from tsfile_torch.pids import end_now_or_after, ending_deferred

REPO = Path(__file__).resolve().parents[1]

# a process with a DataLoader worker's SIGTERM handling (tsfile_torch.process) that signals
# itself inside a deferred block: the block runs whole, then the process ends as SIGTERM ends it
CHILD = r"""
import os, signal, sys, time
from tsfile_torch import process
from tsfile_torch.pids import ending_deferred
marker = sys.argv[1]
process._end_cleanly_on_sigterm()
with ending_deferred():
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # bytecodes after the signal: a handler not held off runs here
        sum(range(10))
    time.sleep(0.05)
    with open(marker, "w") as f:
        f.write("the block ran whole")
time.sleep(5)
with open(marker, "a") as f:
    f.write(", then the process went on")
"""


def test_a_sigterm_inside_a_deferred_block_ends_the_worker_after_the_block(tmp_path):
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert marker.read_text() == "the block ran whole", done.stderr


def test_an_ending_outside_a_block_runs_at_once_and_inside_one_at_its_end():
    ended = []
    end_now_or_after(lambda: ended.append("now"))
    assert ended == ["now"]
    with ending_deferred():
        with ending_deferred():  # nested: the outermost block's end runs it
            end_now_or_after(lambda: ended.append("deferred"))
        assert ended == ["now"]
    assert ended == ["now", "deferred"]
    with ending_deferred():
        pass
    assert ended == ["now", "deferred"]  # run once, not again


def test_a_block_on_another_thread_defers_nothing():
    ended = []

    def other() -> None:
        with ending_deferred():
            end_now_or_after(lambda: ended.append("now"))
            ended.append("inside")

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert ended == ["now", "inside"]
