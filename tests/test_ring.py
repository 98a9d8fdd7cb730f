"""Worker batches through the reused ring of shared-memory slots (Note: ring in
tsfile_torch.data.handover): exact values whether batches are dropped or kept, slots reused,
nothing left in /dev/shm, worker deaths and stops reported and followed by a working epoch.

Row data: ``synthetic.write_table_files`` (value of (file, column, row) known); windows: a panel
(``synthetic.write_panel``).
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from tsfile_torch import (
    TsFileDataset,
    TsFileIterableDataset,
    TsFileWindowDataset,
    WorkerError,
    make_loader,
    synthetic,
)
from tsfile_torch.data import ring as ring_module
from tsfile_torch.data.handover import RING_SLOTS

REPO = Path(__file__).resolve().parents[1]


def _ours() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("tsfile-torch-")}


@pytest.fixture
def counted(monkeypatch):
    """Count the batches that arrive through the ring in this process."""
    seen = []
    unpack = ring_module.RingReceiver.unpack

    def counting(self, batch):
        seen.append(1)
        return unpack(self, batch)

    monkeypatch.setattr(ring_module.RingReceiver, "unpack", counting)
    return seen


def _segments_made(loader) -> int:
    return sum(loader._ring.control.gens)


def test_every_batch_of_an_epoch_kept_by_the_caller_stays_exact(small_dir, small_expected, counted):
    before = _ours()
    ds = TsFileIterableDataset(small_dir, batch_size=500, return_timestamps=True)
    loader = make_loader(ds, num_workers=2)
    for _ in range(3):  # every epoch kept whole: slots are given to the caller, never rewritten
        held = list(loader)
        values = torch.cat([v for v, _ in held]).numpy()
        times = torch.cat([t for _, t in held]).numpy()
        order = np.argsort(times, kind="stable")
        np.testing.assert_array_equal(times[order], np.arange(5000))
        np.testing.assert_array_equal(values[order], small_expected.astype(np.float32))
    assert len(counted) == 30  # every batch came through the ring
    del held, loader
    assert _ours() == before


def test_a_training_loop_reuses_a_few_slots_and_every_batch_is_exact(small_dir, small_expected):
    before = _ours()
    ds = TsFileDataset(small_dir, batch_size=250, shuffle=True, seed=3, return_timestamps=True)
    loader = make_loader(ds, num_workers=2)
    epochs = 4
    for _ in range(epochs):
        for values, times in loader:  # checked while it is the live batch: a slow consumer
            time.sleep(0.002)
            np.testing.assert_array_equal(
                values.numpy(), small_expected[times.numpy()].astype(np.float32)
            )
    batches = epochs * len(loader)
    made = _segments_made(loader)
    assert made <= 2 * RING_SLOTS < batches  # slots made once, reused batch after batch
    del loader
    assert _ours() == before


def _windows(batches, return_dict: bool) -> dict:
    """Every window of ``batches`` by (device, first time): the bytes of each of its parts
    (workers deliver whole batches in another order than the main process)."""
    out = {}
    for batch in batches:
        parts = list(batch.values()) if return_dict else list(batch)
        times = batch["past_time"] if return_dict else parts[2]
        ids = batch["device_id"] if return_dict else torch.zeros(len(times), dtype=torch.int64)
        for i in range(len(times)):
            key = (int(ids[i]), int(times[i, 0]), float(parts[0][i, 0, 0]))
            out[key] = tuple(p[i].numpy().tobytes() for p in parts)
    return out


def test_window_batches_tuple_and_dict_items_from_workers(tmp_path):
    synthetic.write_panel(tmp_path, num_devices=3, num_fields=2, num_rows=600, num_files=2)
    for return_dict in (False, True):
        ds = TsFileWindowDataset(
            tmp_path, 24, 6, stride=5, return_dict=return_dict, return_timestamps=True
        )
        reference = _windows(make_loader(ds, batch_size=32, num_workers=0), return_dict)
        loader = make_loader(ds, batch_size=32, num_workers=2)
        got = list(loader)  # every batch held
        assert _windows(got, return_dict) == reference and len(reference) == len(ds)
        # each part has a storage of its own: a batch from workers saves as one from 0 workers
        buffer = io.BytesIO()
        torch.save(got[0], buffer)
        buffer.seek(0)
        again = torch.load(buffer)
        parts = again.values() if return_dict else again
        for x, y in zip(parts, got[0].values() if return_dict else got[0], strict=True):
            assert torch.equal(x, y)


def test_tensors_made_after_the_read_are_copied_into_a_slot_too(small_dir, small_expected, counted):
    # float16 batches are converted after the read, a user's collate_fn makes new tensors:
    # they are copied into a slot, so no tensor travels as a handle fetched from the worker
    ds = TsFileIterableDataset(small_dir, batch_size=1000, dtype="float16")
    loader = make_loader(ds, num_workers=2)
    for _ in range(2):
        got = torch.cat(list(loader)).float().numpy()
        expected = small_expected.astype(np.float32).astype(np.float16).astype(np.float32)
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, expected.tolist()))
    assert len(counted) == 10  # every batch through the ring
    keep = {}

    def collate(batch):  # new tensors, one of them kept by the caller's code in the worker
        keep["last"] = batch * 2
        return {"twice": keep["last"], "sum": batch.sum(dim=1)}

    ds = TsFileIterableDataset(small_dir, batch_size=1000, dtype="float64")
    out = list(make_loader(ds, num_workers=2, collate_fn=collate))
    assert len(counted) == 15
    twice = torch.cat([o["twice"] for o in out]).numpy()
    assert sorted(twice[:, 0].tolist()) == sorted((2 * small_expected[:, 0]).tolist())
    sums = torch.cat([o["sum"] for o in out]).numpy()
    assert sorted(sums.tolist()) == pytest.approx(sorted(small_expected.sum(axis=1).tolist()))


def test_breaking_out_of_an_epoch_keeps_the_next_epochs_exact(small_dir, small_expected):
    ds = TsFileIterableDataset(small_dir, batch_size=250, return_timestamps=True)
    loader = make_loader(ds, num_workers=2)
    for _ in range(6):  # batches drained by the DataLoader never come back: their slots do
        for i, _batch in enumerate(loader):
            if i == 3:
                break
    assert _segments_made(loader) <= 2 * RING_SLOTS
    values, times = (torch.cat(x).numpy() for x in zip(*loader, strict=True))
    order = np.argsort(times)
    np.testing.assert_array_equal(values[order], small_expected.astype(np.float32))


def test_a_worker_killed_mid_epoch_is_reported_and_the_next_epoch_is_exact(
    small_dir, small_expected
):
    before = _ours()
    ds = TsFileIterableDataset(small_dir, batch_size=250, return_timestamps=True)
    loader = make_loader(ds, num_workers=2, timeout=30)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"killed by signal|exited unexpectedly"):
        for i, _ in enumerate(loader):
            if i == 2:
                os.kill(loader._iterator._workers[0].pid, signal.SIGKILL)
    values, times = (
        torch.cat(x).numpy() for x in zip(*loader, strict=True)
    )  # new workers, a whole epoch
    assert time.monotonic() - start < 25  # neither pass waited for the dead worker
    order = np.argsort(times)
    np.testing.assert_array_equal(times[order], np.arange(5000))
    np.testing.assert_array_equal(values[order], small_expected.astype(np.float32))
    del loader
    assert _ours() == before


@pytest.mark.slow  # waits out a 5-second loader timeout
def test_a_stopped_worker_is_a_worker_error_naming_it_within_the_timeout(small_dir):
    ds = TsFileIterableDataset(small_dir, batch_size=250)
    loader = make_loader(ds, num_workers=2, timeout=5)
    it = iter(loader)
    next(it)
    pid = loader._iterator._workers[1].pid
    os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        with pytest.raises(WorkerError, match=rf"pid\(s\) {pid}\) is stopped.*kill -CONT"):
            for _ in it:
                pass
        assert time.monotonic() - start < 15
        assert not Path(f"/proc/{pid}").exists()  # retired with the error: killed, reaped
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert len(torch.cat(list(loader))) == 5000  # the next epoch has new workers


_CHILD = """
import os, signal, sys, time
from tsfile_torch import TsFileIterableDataset, make_loader

if __name__ == "__main__":
    # as in a terminal: a shell's background job (CI) starts with SIGINT ignored, inherited here
    signal.signal(signal.SIGINT, signal.default_int_handler)
    ds = TsFileIterableDataset(sys.argv[1], batch_size=250)
    loader = make_loader(ds, num_workers=2)
    for i, batch in enumerate(loader):
        if i == 3:
            print("reading", flush=True)
            time.sleep(60)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_a_main_process_interrupted_or_killed_mid_epoch_leaves_no_slot(small_dir, tmp_path, how):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(_CHILD))
    before = _ours()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, str(script), str(small_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "reading"
        child.send_signal(how)
        try:
            child.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # say where it hangs before failing
            threads = [
                (t.name, (t / "wchan").read_text())
                for t in Path(f"/proc/{child.pid}/task").iterdir()
            ]
            pytest.fail(f"the child did not end within 120 s after {how!r}; its threads: {threads}")
    finally:
        child.kill()
    # the child's own segments (named after its pid): other runs' are none of this test's
    assert ring_module.RingControl(1).name(0, 0, 1).startswith(f"/tsfile-torch-{os.getpid()}-")

    def left() -> set[str]:
        return {n for n in _ours() - before if n.startswith(f"tsfile-torch-{child.pid}-")}

    deadline = time.monotonic() + 20  # the resource tracker cleans up after a SIGKILL
    while left() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left()


def test_a_plain_dataloader_over_our_dataset_is_untouched(small_dir, small_expected):
    ds = TsFileIterableDataset(small_dir, batch_size=1000)
    got = torch.cat(list(tud.DataLoader(ds, batch_size=None, num_workers=2)))
    assert sorted(got[:, 0].tolist()) == sorted(small_expected[:, 0].astype(np.float32).tolist())
