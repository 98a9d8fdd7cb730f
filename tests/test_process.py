"""Process-wide effects (tsfile_torch/process.py): named, switchable, undone after a loader.

A loader made by make_loader changes the main process only while it is being iterated; its
workers write their fatal-signal report to a file quoted in the WorkerError, never to the
terminal; a dataset build never forks a process that runs other Python threads.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import multiprocessing
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from process_support import break_off, process_state

import tsfile_torch
from tsfile_torch import (
    TsFileDataset,
    TsFileFormatError,
    TsFileIterableDataset,
    WorkerError,
    make_loader,
    synthetic,
)


def _user_sigchld(signum, frame):  # a handler of the user's own
    pass


@pytest.fixture
def user_settings():
    """The user's own SIGCHLD handler, faulthandler on, a start method and forkserver preload."""
    from torch.utils.data._utils import signal_handling

    saved = process_state()
    torch_flag = signal_handling._SIGCHLD_handler_set  # torch's handler is put back below
    signal.signal(signal.SIGCHLD, _user_sigchld)
    faulthandler.enable(file=sys.__stderr__)
    multiprocessing.set_start_method("spawn", force=True)
    multiprocessing.set_forkserver_preload(["json"])
    yield
    signal.signal(signal.SIGCHLD, saved["sigchld"])
    signal_handling._SIGCHLD_handler_set = torch_flag
    if saved["faulthandler"]:  # pytest's own, on its stderr
        faulthandler.enable(file=sys.__stderr__)
    else:
        faulthandler.disable()
    multiprocessing.set_start_method(saved["start_method"], force=True)
    multiprocessing.set_forkserver_preload(saved["forkserver_preload"])


def _loader_passes(ds: TsFileIterableDataset, expected: np.ndarray) -> object:
    """Run a 2-worker loader to the end, then break out of another and drop it; return the
    SIGCHLD handler in force during the first pass."""
    during = None
    values, times = [], []
    for v, t in make_loader(ds, num_workers=2):
        during = signal.getsignal(signal.SIGCHLD) if during is None else during
        values.append(v)
        times.append(t)
    order = torch.cat(times).numpy()
    assert sorted(order) == list(range(len(expected)))
    np.testing.assert_array_equal(torch.cat(values).numpy(), expected[order].astype(np.float32))
    break_off(ds)
    return during


def test_a_loader_leaves_the_users_signals_faulthandler_and_multiprocessing_as_they_were(
    small_dir, small_expected, user_settings
):
    ds = TsFileIterableDataset(small_dir, batch_size=500, return_timestamps=True)
    before = process_state()
    during = _loader_passes(ds, small_expected)
    assert during is not _user_sigchld  # the worker-report wrapper was in place meanwhile
    after = process_state()
    # SIGCHLD: torch's handler (which calls the user's), as a plain DataLoader leaves it; a
    # plain DataLoader after it finds it installed and chains no second one
    assert sorted(int(x) for x in tud.DataLoader(list(range(8)), num_workers=2)) == list(range(8))
    assert process_state() == after
    assert {**after, "sigchld": None} == {**before, "sigchld": None}


FRESH = r"""
import json, sys

sys.path.insert(0, sys.argv[2])
from process_support import break_off, process_state

def state():
    return repr(list(process_state().values()))

before = state()
from tsfile_torch import TsFileIterableDataset, make_loader

ds = TsFileIterableDataset(sys.argv[1], batch_size=500)
rows = sum(len(batch) for batch in make_loader(ds, num_workers=2))
after_full = state()
break_off(ds)
after_break = state()
import torch.utils.data as tud

assert sorted(int(x) for x in tud.DataLoader(list(range(8)), num_workers=2)) == list(range(8))
print(json.dumps([before, rows, after_full, after_break, state()]))
"""


@pytest.mark.slow  # a fresh interpreter (fast: tests/test_process_state.py)
def test_the_first_loader_of_a_fresh_process_leaves_what_a_plain_dataloader_leaves(
    small_dir, run_python
):
    """Python's defaults, but for torch's SIGCHLD handler: a plain DataLoader installs it once
    per process and leaves it; so does make_loader's (never a second one chained onto it)."""
    proc = run_python(FRESH, str(small_dir), str(Path(__file__).parent), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, rows, after_full, after_break, after_plain = json.loads(proc.stdout.splitlines()[-1])
    assert before.startswith("[<Handlers.SIG_DFL: 0>, False, None, ")  # Python's defaults
    assert rows == 5000
    assert after_full == after_break
    assert after_plain.split(",")[0] == after_full.split(",")[0]  # torch's, the same one
    assert "handler" in after_full.split(",")[0]  # torch's function, not ours or the default
    assert after_full.split(",")[1:] == before.split(",")[1:]


class _CrashesInNativeRead(TsFileIterableDataset):
    """In DataLoader workers, the native read of rows [2500, 5000) dies of SIGSEGV."""

    def __iter__(self):
        reader = self.core.reader.decoder  # this process's decoder: hooked once, in workers
        if tud.get_worker_info() is not None and "_decode_native" not in reader.__dict__:
            decode = reader._decode_native

            def crash_at_2500(plan):
                if plan.start == 2500:
                    ctypes.string_at(0)  # a real segmentation fault, in native code
                return decode(plan)

            reader._decode_native = crash_at_2500
        return super().__iter__()


@pytest.mark.slow  # torch notices a crashed worker after seconds
def test_a_worker_killed_in_native_code_is_a_worker_error_with_its_report_not_terminal_noise(
    small_dir, capfd
):
    assert sorted(int(x) for x in tud.DataLoader(list(range(4)), num_workers=2)) == [0, 1, 2, 3]
    before = signal.getsignal(signal.SIGCHLD)  # torch's, as a plain DataLoader leaves it
    ds = _CrashesInNativeRead(small_dir, batch_size=2500, block_rows=2500)
    loader = make_loader(ds, num_workers=2)
    with pytest.raises(WorkerError) as info:
        list(loader)
    message = str(info.value)
    assert "killed by signal" in message or "exited unexpectedly" in message
    read = "part00\\d.tsfile: reading device t.d\\d, rows [2500, 5000) via auto"
    assert _matches(rf"worker pid \d+ was reading \S*{read}", message), message
    # the worker's fatal-signal report, from its file: the named frame of the native read
    assert "fatal-signal report ---" in message
    assert _matches(rf'File "<tsfile-torch was reading \S*{read}>"', message), message
    del loader, info
    gc.collect()
    out, err = capfd.readouterr()
    assert "Fatal Python error" not in out + err
    assert signal.getsignal(signal.SIGCHLD) == before


def _matches(pattern: str, text: str) -> bool:
    import re

    return re.search(pattern.replace("[2500, 5000)", r"\[2500, 5000\)"), text) is not None


def test_effects_switch_by_name_and_unknown_names_are_value_errors(small_dir):
    process = tsfile_torch.process
    assert process.EFFECTS == (
        "fork_fix",
        "native_pool",
        "malloc",
        "worker_reports",
        "crash_report",
        "parent_guard",
    )
    for call in (process.disable, process.enable, process.enabled):
        with pytest.raises(ValueError, match=r"unknown process effects \['nope'\]; they are "):
            call("nope")
    with pytest.raises(ValueError, match=r"\['nope'\]"):
        process.disable("crash_report", "nope")
    assert process.enabled("crash_report")  # nothing switched by a call that failed
    process.disable("crash_report")
    try:
        assert not process.enabled("crash_report")
        ds = _CrashesInNativeRead(small_dir, batch_size=2500, block_rows=2500)
        with pytest.raises(WorkerError) as info:
            list(make_loader(ds, num_workers=2))
        assert "rows [2500, 5000)" in str(info.value)  # still named
        assert "fatal-signal report" not in str(info.value)  # but no report was written
    finally:
        process.enable("crash_report")
    assert process.enabled("crash_report")


@pytest.mark.slow  # a fresh interpreter
def test_a_build_in_a_thread_beside_another_thread_validates_without_forking(tmp_path):
    synthetic.write_table_files(tmp_path / "src", synthetic.DatasetSpec(1, 1, 4, 30000))
    data = bytearray(next((tmp_path / "src").glob("*.tsfile")).read_bytes())
    (tmp_path / "data").mkdir()
    good = tmp_path / "data" / "a-good.tsfile"
    good.write_bytes(bytes(data))
    data[len(data) - 8] ^= 0xFF  # the metadata-size field: SIGSEGV in tsfile's reader at open
    bad = tmp_path / "data" / "b-bad.tsfile"
    bad.write_bytes(bytes(data))

    forks = []
    os.register_at_fork(after_in_parent=lambda: forks.append(threading.get_ident()))
    pid = os.fork()  # the counter counts
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    assert len(forks) == 1
    forks.clear()

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # another Python thread runs meanwhile
    results: dict = {}

    def build() -> None:
        try:
            TsFileIterableDataset(tmp_path / "data", validate=True)
        except TsFileFormatError as err:
            results["error"] = str(err)
        ds = TsFileDataset(good, batch_size=30000, validate=True, dtype="float64")
        results["values"] = ds[0].numpy()

    other.start()
    try:
        builder = threading.Thread(target=build)
        builder.start()
        builder.join()
    finally:
        stop.set()
        other.join()
    assert forks == []  # validated in a fresh interpreter
    # the crash stayed in the child, and the file is named
    assert results["error"].startswith(f"{bad}: tsfile's native reader crashed on this file")
    assert "(signal SIGSEGV)" in results["error"] and str(good) not in results["error"]
    want = np.stack([synthetic.value_of(0, c, np.arange(30000)) for c in range(4)], axis=1)
    np.testing.assert_array_equal(results["values"], want)
