"""Process state after a make_loader loader is what a plain DataLoader leaves (process.py).

What a loader could leave behind in its user's process: the SIGCHLD handler (torch's, as a
plain DataLoader leaves it, never a second one chained onto it), torch's flag saying it
installed its own, faulthandler (on or off, and its file) and the multiprocessing start method.
Each test runs make_loader loaders with workers over real TsFiles, then a plain DataLoader, and
compares the state before and after.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import multiprocessing
import signal
import sys
import threading

import pytest
import torch.utils.data as tud
from torch.utils.data._utils import signal_handling

from tsfile_torch import (
    TsFileDataset,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
    process,
)


def _state() -> dict:
    return {
        "sigchld": signal.getsignal(signal.SIGCHLD),
        "torch_flag": signal_handling._SIGCHLD_handler_set,
        "faulthandler": faulthandler.is_enabled(),
        "start_method": multiprocessing.get_start_method(allow_none=True),
    }


def _plain_loader_pass() -> None:
    """One pass of a plain DataLoader with two workers (torch's own SIGCHLD handling)."""
    assert sorted(int(x) for x in tud.DataLoader(list(range(8)), num_workers=2)) == list(range(8))


def _settle() -> None:
    """Close, here on the main thread, the passes earlier tests dropped (a pass in a reference
    cycle is closed by whichever thread's garbage collection finds it; the test below covers
    that case) and put their handler back."""
    gc.collect()
    process.restore_due()


KINDS = {
    "rows": lambda d: make_loader(TsFileIterableDataset(d, batch_size=1000), num_workers=2),
    "map": lambda d: make_loader(TsFileDataset(d, batch_size=1000), num_workers=2),
    "windows": lambda d: make_loader(TsFileWindowDataset(d, 16, 4, stride=500), 4, num_workers=2),
}


@pytest.mark.parametrize(
    "kind",
    [
        "rows",
        pytest.param("map", marks=pytest.mark.slow),
        pytest.param("windows", marks=pytest.mark.slow),
    ],
)
def test_a_plain_dataloader_after_a_make_loader_loader_keeps_the_handler_it_had(small_dir, kind):
    _settle()
    _plain_loader_pass()  # torch's handler installed and its flag set, as in a user's script
    before = _state()
    assert before["torch_flag"] is True and callable(before["sigchld"])
    loader = KINDS[kind](small_dir)
    for _ in range(2):  # two passes: the second reaches the persistent workers
        during = None
        for _batch in loader:
            during = signal.getsignal(signal.SIGCHLD) if during is None else during
        assert during is not before["sigchld"]  # the worker-report wrapper was in place
        assert _state() == before
    passing = iter(loader)  # a pass broken off and dropped
    next(passing)
    del passing
    gc.collect()
    assert _state() == before
    _plain_loader_pass()
    assert _state() == before  # not a new handler chained onto the old one


def _drop_a_pass_collected_on_a_thread(loader, before: dict) -> None:
    """Start a pass, take a batch, drop it in a reference cycle that another thread collects."""
    was_enabled = gc.isenabled()
    gc.disable()  # the cycle is found by the thread below, not by this one
    try:
        passing = iter(loader)
        next(passing)
        assert signal.getsignal(signal.SIGCHLD) is not before["sigchld"]  # the wrapper
        passing.cycle = passing
        del passing
        collector = threading.Thread(target=gc.collect)
        collector.start()
        collector.join()
    finally:
        if was_enabled:
            gc.enable()


def test_a_pass_dropped_in_a_cycle_and_collected_on_another_thread_puts_the_handler_back(
    small_dir,
):
    _settle()
    _plain_loader_pass()
    before = _state()
    loader = make_loader(TsFileIterableDataset(small_dir, batch_size=1000), num_workers=2)
    _drop_a_pass_collected_on_a_thread(loader, before)
    assert process._SCOPES == 0  # closed there, though only this thread may set a handler
    assert sum(len(batch) for batch in loader) == 5000  # the next pass, started here
    assert _state() == before
    _plain_loader_pass()
    assert _state() == before
    # and with nothing started after the drop: the main thread's next call puts it back
    _drop_a_pass_collected_on_a_thread(loader, before)
    process.restore_due()
    assert _state() == before


FRESH = r"""
import faulthandler, json, multiprocessing, signal, sys

report = open(sys.argv[2], "w")
faulthandler.enable(file=report)
import torch.utils.data as tud
from torch.utils.data._utils import signal_handling
from tsfile_torch import TsFileIterableDataset, make_loader

def state():
    handler = signal.getsignal(signal.SIGCHLD)
    return [
        f"handler {id(handler)}" if callable(handler) else repr(handler),
        signal_handling._SIGCHLD_handler_set,
        faulthandler.is_enabled(),
        multiprocessing.get_start_method(allow_none=True),
    ]

def make_loader_passes():
    ds = TsFileIterableDataset(sys.argv[1], batch_size=1000)
    loader = make_loader(ds, num_workers=2)
    assert sum(len(batch) for _ in range(2) for batch in loader) == 10000

def plain_pass():
    assert sorted(int(x) for x in tud.DataLoader(list(range(8)), num_workers=2)) == list(range(8))

states = [state()]
for step in (make_loader_passes, plain_pass, make_loader_passes, plain_pass):
    step()
    states.append(state())
print(json.dumps(states), flush=True)
faulthandler._sigsegv()  # the report goes to the file enabled above, if it is still in force
"""


def test_a_fresh_process_keeps_its_defaults_and_its_faulthandler_file(
    small_dir, run_python, tmp_path
):
    report = tmp_path / "faulthandler.txt"
    proc = run_python(FRESH, str(small_dir), str(report), timeout=300)
    assert proc.returncode == -signal.SIGSEGV, proc.stderr[-3000:]
    start, after_make, after_plain, after_make_again, after_plain_again = json.loads(
        proc.stdout.splitlines()[-1]
    )
    assert start == ["<Handlers.SIG_DFL: 0>", False, True, None]  # Python's, faulthandler on
    assert after_make[1:] == [True, True, None]  # torch's handler, as a plain DataLoader's
    assert after_plain[:3] == after_make[:3]  # torch's, the same: not a second one
    assert after_make_again == after_plain_again == after_plain  # torch's, not a second one
    assert "Fatal Python error: Segmentation fault" in report.read_text()
    assert "Fatal Python error" not in proc.stderr


def test_a_loader_leaves_faulthandler_off_when_it_was_off(small_dir):
    was_on = faulthandler.is_enabled()  # pytest's own, on its stderr
    faulthandler.disable()
    try:
        before = _state()
        ds = TsFileIterableDataset(small_dir, batch_size=1000)
        assert sum(len(b) for b in make_loader(ds, num_workers=2)) == 5000
        _plain_loader_pass()
        after = _state()
    finally:
        if was_on:
            faulthandler.enable(file=sys.__stderr__)
    assert after["faulthandler"] is before["faulthandler"] is False
    assert after["start_method"] == before["start_method"]


def test_a_loader_leaves_the_start_method_the_user_set(small_dir):
    before_method = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    try:
        ds = TsFileIterableDataset(small_dir, batch_size=1000)
        assert sum(len(b) for b in make_loader(ds, num_workers=2)) == 5000  # forked workers
        assert multiprocessing.get_start_method(allow_none=True) == "spawn"
    finally:
        multiprocessing.set_start_method(before_method, force=True)
