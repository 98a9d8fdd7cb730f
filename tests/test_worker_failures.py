"""Workers that crash, stall or lose their parent are reported, never waited on forever."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from tsfile_torch import TsFileIterableDataset, WorkerError, make_loader, synthetic

REPO = Path(__file__).resolve().parents[1]


class _FailsInNativeRead(TsFileIterableDataset):
    """In workers, the read of rows [2500, ...) fails as ``how`` says: ``"stall"`` blocks in
    native code (libc sleep) for an hour, ``"segv"`` dies of SIGSEGV in native code, ``"kill"``
    of SIGKILL, ``"kill later"`` of SIGKILL 1.5 s into the read."""

    how = "segv"

    def __iter__(self):
        if tud.get_worker_info() is not None:  # the worker's reader, hooked once
            reader = self.core.reader
            if not getattr(reader, "_fails", False):
                note = reader.on_read

                def on_read(text):
                    note(text)
                    if text is not None and "rows [2500," in text:
                        if self.how == "stall":
                            ctypes.CDLL(None).sleep(3600)
                        elif self.how == "kill":
                            os.kill(os.getpid(), signal.SIGKILL)
                        elif self.how == "kill later":  # once the main thread is in a step
                            time.sleep(1.5)
                            os.kill(os.getpid(), signal.SIGKILL)
                        else:
                            ctypes.string_at(0)  # a real segmentation fault, in native code

                reader.on_read, reader._fails = on_read, True
        return super().__iter__()


def test_a_worker_killed_during_the_training_step_is_a_worker_error_naming_its_read(small_dir):
    """torch's SIGCHLD handler raises wherever the main thread is (here in the training step,
    outside the loader): wrapped while a make_loader pass runs, it names the read; without the
    wrapping (TSFILE_TORCH_OFF=sigchld) this is torch's bare RuntimeError."""
    ds = _FailsInNativeRead(small_dir, batch_size=2500, block_rows=2500)
    ds.how = "kill later"
    loader = make_loader(ds, num_workers=2)
    batches = iter(loader)
    assert len(next(batches)) == 2500
    with pytest.raises(
        WorkerError, match=r"part00\d\.tsfile: reading device t\.d\d, rows \[2500, 5000\)"
    ):
        time.sleep(10)  # the training step: the worker dies meanwhile
        next(batches)
    del batches, loader


@pytest.mark.slow  # waits out a loader timeout
def test_a_worker_stuck_in_native_code_is_reported_within_the_loader_timeout(small_dir):
    ds = _FailsInNativeRead(small_dir, batch_size=2500, block_rows=2500)
    ds.how = "stall"
    loader = make_loader(ds, num_workers=2, timeout=5)
    with pytest.raises(
        WorkerError,
        match=r"timed out after 5 seconds.*part00\d\.tsfile: reading device t\.d\d, "
        r"rows \[2500, 5000\).*raise timeout=",
    ):
        list(loader)
    del loader


@pytest.mark.parametrize("how", [pytest.param("segv", marks=pytest.mark.slow), "kill"])
def test_a_worker_killed_in_native_code_is_reported_with_the_file_and_rows(small_dir, how):
    ds = _FailsInNativeRead(small_dir, batch_size=2500, block_rows=2500)
    ds.how = how
    loader = make_loader(ds, num_workers=2)
    with pytest.raises(
        WorkerError, match=r"part00\d\.tsfile: reading device t\.d\d, rows \[2500, 5000\)"
    ):
        list(loader)


def test_building_a_dataset_on_that_file_is_a_format_error_naming_it(tmp_path):
    from tsfile_torch import TsFileFormatError

    synthetic.write_table_files(tmp_path, synthetic.DatasetSpec(1, 1, 4, 30000))
    path = next(tmp_path.glob("*.tsfile"))
    data = bytearray(path.read_bytes())
    data[len(data) - 8] ^= 0xFF  # the metadata-size field: SIGSEGV in tsfile's reader
    path.write_bytes(bytes(data))
    with pytest.raises(TsFileFormatError, match=r"part000\.tsfile: tsfile's native reader crashed"):
        TsFileIterableDataset(path)


ORPHAN = r"""
import ctypes, json, sys
import torch.utils.data as tud
from tsfile_torch import TsFileIterableDataset, make_loader

class Stuck(TsFileIterableDataset):
    def __iter__(self):
        if tud.get_worker_info() is not None:
            self.core.reader.on_read = lambda text: ctypes.CDLL(None).sleep(3600)
        return super().__iter__()

ds = Stuck(sys.argv[1], batch_size=1000)
it = iter(make_loader(ds, num_workers=2))
print(json.dumps([w.pid for w in it._workers]), flush=True)
next(it)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@pytest.mark.slow  # a subprocess, then seconds of waiting
def test_no_worker_outlives_a_killed_parent(small_dir):
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, str(small_dir)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        pids = json.loads(proc.stdout.readline())
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        time.sleep(2)  # the workers are now blocked in native code
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()


def _process_figures(pid: int | str = "self") -> dict:
    with open(f"/proc/{pid}/status") as fh:
        status = dict(line.split(":", 1) for line in fh)
    with open(f"/proc/{pid}/maps") as fh:
        maps = sum(1 for _ in fh)
    return {
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "maps": maps,
        "rss_kib": int(status["VmRSS"].split()[0]),
        "threads": int(status["Threads"]),
    }


@pytest.mark.parametrize(
    "num_workers, order",
    [
        pytest.param(0, {}, marks=pytest.mark.slow),
        (2, {}),
        # a new stretch per worker each epoch; gathers through the block exchange
        pytest.param(2, {"random_batches": 3}, marks=pytest.mark.slow),
        pytest.param(2, {"shuffle": True}, marks=pytest.mark.slow),
    ],
)
def test_100_epochs_leak_no_fds_maps_memory_or_threads(small_dir, num_workers, order):
    ds = TsFileIterableDataset(small_dir, batch_size=2500, read_backend="mmap", **order)
    loader = make_loader(ds, num_workers=num_workers) if num_workers else ds
    figures = []
    for epoch in range(100):
        ds.set_epoch(epoch)
        total = sum(float(b[0, 0]) for b in loader)
        assert np.isfinite(total)
        if epoch in (9, 99):
            pids = ["self"]
            if num_workers:
                pids += [w.pid for w in loader._iterator._workers]
            figures.append([_process_figures(p) for p in pids])
    for before, after in zip(*figures, strict=True):
        assert after["fds"] <= before["fds"], (before, after)
        assert after["threads"] <= before["threads"], (before, after)
        assert after["maps"] <= before["maps"] + 8, (before, after)
        assert after["rss_kib"] <= before["rss_kib"] + 32 * 1024, (before, after)


CRASH_IN_PROCESS = r"""
import ctypes, sys
from tsfile_torch import TsFileIterableDataset
from tsfile_torch.read.decode import GroupDecoder

GroupDecoder._decode_native = lambda self, *args: ctypes.string_at(0)  # a native crash
list(TsFileIterableDataset(sys.argv[1], batch_size=1000))
"""


@pytest.mark.slow  # a fresh interpreter
def test_a_native_crash_in_the_reading_process_names_the_file_and_rows(small_dir):
    """With faulthandler on (the user's choice: tsfile-torch leaves the main process alone), the
    report names the read in progress."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", CRASH_IN_PROCESS, str(small_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert "<tsfile-torch was reading " in proc.stderr
    assert "part000.tsfile: reading device t.d0, rows [0, 5000)" in proc.stderr


@pytest.mark.slow  # ~30 s of builds
def test_datasets_created_and_dropped_leak_no_fds_threads_or_children(small_dir):
    def build_and_read():
        ds = TsFileIterableDataset(small_dir, batch_size=2500)  # one validation child each
        next(iter(ds))
        ds.close()

    for _ in range(3):
        build_and_read()
    before, children_before = _process_figures(), _children()
    for _ in range(30):
        build_and_read()
    after = _process_figures()
    # a leak grows with the 30 datasets; +2 leaves room for threads / fds of earlier tests in
    # this process (a server or pin-memory thread) that end while this test runs
    assert after["fds"] <= before["fds"] + 2 and after["threads"] <= before["threads"] + 2
    assert _children() <= children_before  # every validation child was reaped


def _children() -> set[int]:
    return {
        int(p) for p in os.listdir("/proc") if p.isdigit() and _parent_of(int(p)) == os.getpid()
    }


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


@pytest.mark.slow  # spawned workers
def test_a_script_without_a_main_guard_is_told_where_spawned_workers_fail(tmp_path, small_dir):
    """Spawned workers import the script: one that iterates its loader at module level kills
    them while they start; the WorkerError says where to put the guard."""
    script = tmp_path / "train.py"
    script.write_text(
        "from tsfile_torch import TsFileIterableDataset, make_loader\n"
        f"ds = TsFileIterableDataset({str(small_dir)!r}, batch_size=500)\n"
        "for batch in make_loader(ds, num_workers=1, multiprocessing_context='spawn', "
        "timeout=5):\n"
        "    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode != 0
    assert "WorkerError" in done.stderr, done.stderr[-2000:]
    assert "workers started by spawn import your script first" in done.stderr
    assert "if __name__ == '__main__':" in done.stderr


class _RaisesInWorker(TsFileIterableDataset):
    """In workers, while ``fail``, the read of rows [2500, ...) raises a ValueError (an error
    of a well worker)."""

    fail = True

    def __iter__(self):
        if tud.get_worker_info() is not None and self.fail:
            reader = self.core.reader
            note = reader.on_read

            def on_read(text):
                note(text)
                if text is not None and "rows [2500," in text:
                    raise ValueError("bad rows [2500, ...)")

            reader.on_read = on_read
        return super().__iter__()


@contextlib.contextmanager
def _collected_here():
    """No automatic garbage collection inside (at some allocation): the cycles made here are
    collected by :func:`_collect_without_waiting`, called inside too, where it is timed."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _collect_without_waiting(workers) -> None:
    """Collect the garbage, which must not wait on torch's MP_STATUS_CHECK_INTERVAL (60 s in
    these tests, per worker), then let ``workers`` end."""
    start = time.monotonic()
    gc.collect()
    took = time.monotonic() - start
    assert took < 30, took
    for w in workers:
        w.join(timeout=30)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_kept_error_of_a_pass_with_workers_stalls_no_later_collection(
    small_dir, small_expected, monkeypatch, persistent
):
    """Note: an iterator collected in a cycle (tsfile_torch.loader): an error from a worker,
    kept with its traceback (here by ``pytest.raises``), holds the pass's iterator in a cycle;
    its collection ends the workers instead of waiting on them (torch waits
    MP_STATUS_CHECK_INTERVAL per worker: 60 s here, so a wait cannot pass); a new loader then
    reads every row exactly."""
    monkeypatch.setattr(tud._utils, "MP_STATUS_CHECK_INTERVAL", 60.0)
    # each worker its own stretch: worker 1's first read is rows [2500, ...)
    ds = _RaisesInWorker(small_dir, batch_size=250, return_timestamps=True, order="stretches")
    loader = make_loader(ds, num_workers=2, persistent_workers=persistent)
    it = iter(loader)
    workers = list(it._workers)
    with _collected_here():
        with pytest.raises(ValueError, match=r"bad rows \[2500") as kept:
            for _ in it:
                pass
        assert "Caught ValueError in DataLoader worker" in str(kept.value)
        del loader, it, kept  # the error's traceback: a cycle holding the pass's iterator
        _collect_without_waiting(workers)
    assert not any(w.is_alive() for w in workers)
    ds.fail = False
    batches = list(make_loader(ds, num_workers=2, persistent_workers=persistent))
    values, times = (torch.cat(x).numpy() for x in zip(*batches, strict=True))
    order = np.argsort(times, kind="stable")
    np.testing.assert_array_equal(times[order], np.arange(5000))
    np.testing.assert_array_equal(values[order], small_expected.astype(np.float32))


def test_an_iterator_collected_in_a_reference_cycle_does_not_wait_on_its_workers(
    small_dir, monkeypatch
):
    """Note: an iterator collected in a cycle: its queue finalizers stop the feeder threads torch's
    shutdown would ask the workers to stop through; the workers are ended instead of waited for
    (torch waits MP_STATUS_CHECK_INTERVAL per worker: 60 s here, so a wait cannot pass)."""
    monkeypatch.setattr(tud._utils, "MP_STATUS_CHECK_INTERVAL", 60.0)
    ds = TsFileIterableDataset(small_dir, batch_size=250)
    loader = make_loader(ds, num_workers=2)
    it = iter(loader)
    next(it)
    workers = list(it._workers)
    with _collected_here():
        cycle = {"loader": loader, "iterator": it}  # the loader holds its iterator too
        cycle["self"] = cycle
        del loader, it, cycle
        _collect_without_waiting(workers)
    assert [w.exitcode for w in workers] == [-signal.SIGTERM] * 2  # ended, not waited for
    assert len(torch.cat(list(make_loader(ds, num_workers=2)))) == 5000
