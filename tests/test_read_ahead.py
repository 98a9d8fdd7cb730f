"""Read-ahead (Note: read-ahead in tsfile_torch.read.reader): the first read of a pass decodes
only its rows, whole blocks are decoded in the background, each block once, values exact.

Data: ``synthetic.write_table_files`` (value of (file, column, row) known: conftest.expected).
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np
import pytest
import torch

from tsfile_torch import TsFileIterableDataset, make_loader, synthetic

SPEC = synthetic.DatasetSpec(num_files=2, devices_per_file=1, fields_per_device=3, num_rows=70000)


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("long")
    synthetic.write_table_files(directory, SPEC)
    return directory


def _record_decodes(reader) -> list[tuple[str, int]]:
    """Record (thread name, rows) of every decode of ``reader``."""
    seen = []
    decode = reader.decoder.decode

    def recording(plan):
        seen.append((threading.current_thread().name, plan.num_rows))
        return decode(plan)

    reader.decoder.decode = recording
    return seen


def _settle(reader) -> None:
    """Wait for every decode ahead queued so far (a training step that outlasts them): without
    it, a loaded machine may not start a queued decode ahead before the caller needs its block,
    and the caller then decodes it itself (Note: read-ahead), which these tests do not test."""
    ahead = reader.ahead
    for future, _ in [*ahead.pending.values(), *ahead.next.values()]:
        future.result()


def test_a_first_batch_decodes_its_rows_and_the_blocks_follow_in_the_background(
    long_dir, expected_rows
):
    ds = TsFileIterableDataset(long_dir, batch_size=4096, block_rows=32768, read_backend="pread")
    reader = ds.core.reader
    decodes = _record_decodes(reader)
    expected = expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32)
    # the process's first pass decodes small first; later ones (slow consumer or not) do not
    for pass_, small in enumerate([True, False, False]):
        decodes.clear()
        batches = []
        for batch in ds:
            batches.append(batch)
            if pass_ == 1:
                time.sleep(0.004)  # a training step
        np.testing.assert_array_equal(torch.cat(batches).numpy(), expected)
        # the next pass's first blocks, decoded during this one: count them here
        assert sorted(reader.ahead.next) == [(g, 0) for g in range(SPEC.num_files)]
        for future, _ in reader.ahead.next.values():
            future.result()
        rows = sorted(rows for _, rows in decodes)
        ahead = [rows for thread, rows in decodes if thread.startswith("tsfile-read-ahead")]
        nexts = [32768] * SPEC.num_files  # the next pass's first blocks, decoded during this one
        # every block once, whichever thread decodes it: a decode ahead still queued when the
        # caller needs it is decoded by the caller's decode threads instead (Note: read-ahead)
        if small:  # the first batch: its rows only, at once, on the caller's threads
            head = [(thread, rows) for thread, rows in decodes[: SPEC.num_files]]
            assert [rows for _, rows in head] == [4096] * SPEC.num_files, decodes
            assert not any(thread.startswith("tsfile-read-ahead") for thread, _ in head)
            blocks = [4096, 32768, 32768, 70000 - 65536] * SPEC.num_files
        else:  # whole blocks; the first ones were decoded ahead in the pass before
            blocks = [32768, 70000 - 65536] * SPEC.num_files
        assert rows == sorted(blocks + nexts), decodes
        assert len(ahead) >= SPEC.num_files, decodes  # at least the next pass's blocks


def test_read_ahead_with_workers_and_a_range_per_worker(long_dir, expected_rows):
    ds = TsFileIterableDataset(
        long_dir, batch_size=5000, block_rows=16384, return_timestamps=True, read_backend="pread"
    )
    loader = make_loader(ds, num_workers=2)
    for _ in range(2):
        values, times = (torch.cat(x).numpy() for x in zip(*loader, strict=True))
        order = np.argsort(times)
        np.testing.assert_array_equal(times[order], np.arange(SPEC.num_rows))
        expected = expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32)
        np.testing.assert_array_equal(values[order], expected)


def test_no_read_ahead_when_more_files_are_selected_than_may_be_open(long_dir, expected_rows):
    ds = TsFileIterableDataset(
        long_dir, batch_size=4096, block_rows=32768, read_backend="pread", max_open_files=1
    )  # an open-file eviction could close the reader a background decode uses
    decodes = _record_decodes(ds.core.reader)
    got = torch.cat(list(ds)).numpy()
    np.testing.assert_array_equal(got, expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32))
    assert not any(thread.startswith("tsfile-read-ahead") for thread, _ in decodes)
    assert 4096 not in [rows for _, rows in decodes]  # no small first read without read-ahead


@pytest.mark.parametrize("backend", ["auto", "mmap"])
def test_mapped_files_are_decoded_ahead_through_pread_readers_of_their_own(
    long_dir, expected_rows, backend
):
    """A background decode never touches a mapping (a truncation under it would be a SIGBUS):
    the caller's reads go through the mapped readers, the decodes ahead through pread ones."""
    ds = TsFileIterableDataset(long_dir, batch_size=4096, block_rows=32768, read_backend=backend)
    reader = ds.core.reader
    seen = []
    decode = reader.decoder.decode

    def recording(plan):
        seen.append((threading.current_thread().name, plan.num_rows, plan.via, plan.reader))
        return decode(plan)

    reader.decoder.decode = recording
    expected = expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32)
    for _ in range(2):
        seen.clear()
        batches = []
        for batch in ds:
            batches.append(batch)
            _settle(reader)
        np.testing.assert_array_equal(torch.cat(batches).numpy(), expected)
        ahead = [(via, r) for thread, _, via, r in seen if thread.startswith("tsfile-read-ahead")]
        here = [(via, r) for thread, _, via, r in seen if not thread.startswith("tsfile-read")]
        assert ahead and all(via == "pread" for via, _ in ahead), seen
        assert all(via == "" for via, _ in here), seen
        mapped = {id(reader.files.reader(i)) for i in range(SPEC.num_files)}
        assert not {id(r) for _, r in ahead} & mapped  # never a mapped reader in the background
    assert set(reader.backends.values()) == {"mmap"}  # the caller's readers: still mapped
    assert reader.ahead.side.open_count == SPEC.num_files  # one pread reader a file, kept
    reader.close()
    assert len(reader.ahead.side) == 0


def test_a_fork_during_a_decode_ahead_waits_for_it_and_the_child_reads(long_dir, expected_rows):
    """Note: read-ahead and fork: the fork waits for the decode running in the background, the
    child drops the parent's pending decodes and pools (it would wait on them forever) and
    reads exactly; the parent's pass goes on."""
    ds = TsFileIterableDataset(long_dir, batch_size=4096, block_rows=32768)  # auto: mapped
    reader = ds.core.reader
    decode = reader.decoder.decode
    started = threading.Event()

    def slow(plan):
        if threading.current_thread().name.startswith("tsfile-read-ahead"):
            started.set()
            time.sleep(0.3)  # a long decode: the fork below lands inside one
        return decode(plan)

    reader.decoder.decode = slow
    expected = expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32)
    passing = iter(ds)
    batches = [next(passing)]
    assert started.wait(30)
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            ds.close()
            code = 0 if np.array_equal(torch.cat(list(ds)).numpy(), expected) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on decodes it copied from its parent")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    batches.extend(passing)
    np.testing.assert_array_equal(torch.cat(batches).numpy(), expected)


FEW_FDS = r"""
import json, os, resource, sys
import numpy as np, torch
from tsfile_torch import TsFileIterableDataset
ds = TsFileIterableDataset(sys.argv[1], batch_size=4096, block_rows=32768, read_backend="auto")
used = {int(x) for x in os.listdir("/proc/self/fd")}
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
limit = 1
while limit - sum(1 for fd in used if fd < limit) < 1:  # one descriptor left free
    limit += 1
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
ahead = ds.core.reader.ahead


def settled(ds):  # each batch waits for the decodes ahead queued so far (tests/_settle)
    for batch in ds:
        for future, _ in [*ahead.pending.values(), *ahead.next.values()]:
            future.result()
        yield batch


try:
    passes = [torch.cat(list(settled(ds))).numpy() for _ in range(2)]
finally:
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
np.save(sys.argv[2], np.stack(passes))
print(json.dumps(sorted(ds.core.reader.ahead.no_side)))
"""


def test_a_pread_reader_for_read_ahead_that_cannot_open_only_turns_read_ahead_off(
    expected_rows, run_python, tmp_path
):
    """Mapped readers keep no descriptor, a read-ahead reader keeps one: with one descriptor
    free, the read-ahead readers of some of 4 files cannot open; those files are read without
    read-ahead, exactly, and nothing raises."""
    spec = synthetic.DatasetSpec(
        num_files=4, devices_per_file=1, fields_per_device=3, num_rows=70000
    )
    synthetic.write_table_files(tmp_path, spec)
    out = tmp_path / "passes.npy"
    proc = run_python(FEW_FDS, str(tmp_path), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    no_side = json.loads(proc.stdout.splitlines()[-1])
    assert no_side and set(no_side) <= set(range(4)), proc.stdout
    expected = expected_rows(spec, 0, spec.num_rows).astype(np.float32)
    for got in np.load(out):
        np.testing.assert_array_equal(got, expected)


def test_the_gate_lets_decodes_run_side_by_side_and_a_fork_wait_for_them():
    from tsfile_torch.read.readahead import _Gate

    gate, inside, peak, lock = _Gate(), [0], [0], threading.Lock()
    release = threading.Event()

    def decode():
        with gate:
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            release.wait(10)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=decode) for _ in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while peak[0] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peak[0] == 3  # side by side, not one at a time
    closing = threading.Thread(target=gate.close)  # a fork: waits for the three
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()
    release.set()
    closing.join(10)
    assert not closing.is_alive() and inside[0] == 0
    late = threading.Thread(target=decode)  # a decode while the fork is under way waits
    late.start()
    late.join(0.2)
    assert late.is_alive() and inside[0] == 0
    gate.reopen()
    late.join(10)
    assert not late.is_alive()
    for t in threads:
        t.join(10)
