"""Running out is not damage (issue #42 items 5, 7, 10): memory, open files and time are never a
file's remembered verdict; an error stops its read-ahead; a worker short of memory or of
/dev/shm is a clear error naming what ran out, with nothing left in /dev/shm.

Data: ``synthetic.write_table_files`` (value of (file, column, row) known: conftest.expected).
Limits are real: ``RLIMIT_AS`` set in a worker, a private small tmpfs on /dev/shm through
``unshare -m`` where root allows it.
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from tsfile.exceptions import OOMError

from tsfile_torch import (
    ResourceError,
    TsFileFormatError,
    TsFileIterableDataset,
    synthetic,
)
from tsfile_torch.native.errors import native_call
from tsfile_torch.native.guard import damage_remembered
from tsfile_torch.sources.content import recall

SPEC = synthetic.DatasetSpec(num_files=2, devices_per_file=1, fields_per_device=3, num_rows=70000)


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("long")
    synthetic.write_table_files(directory, SPEC)
    return directory


def _raised_from(cause: BaseException, kind=TsFileFormatError) -> BaseException:
    try:
        raise kind("part000.tsfile: reading failed") from cause
    except kind as err:
        return err


@pytest.mark.parametrize(
    "cause",
    [OOMError(), MemoryError(), OSError(errno.EMFILE, "Too many open files"), TimeoutError()],
    ids=["tsfile-oom", "memory", "emfile", "timeout"],
)
def test_running_out_is_never_remembered_as_damage(small_dir, private_cache, cause):
    info = TsFileIterableDataset(small_dir, batch_size=1000).core.catalog.files[0]
    for err in (_raised_from(cause), _raised_from(cause, ResourceError)):
        with pytest.raises(type(err)), damage_remembered(info):
            raise err
        assert "damaged" not in recall(info.index_key)
    with pytest.raises(TsFileFormatError), damage_remembered(info):  # damage is remembered
        raise TsFileFormatError(f"{info.name}: a corrupted page")
    assert recall(info.index_key)["damaged"].endswith("a corrupted page")


def test_tsfile_out_of_memory_is_a_resource_error_naming_memory_and_the_file():
    def decode():
        raise OOMError()

    with pytest.raises(ResourceError, match=r"part000.tsfile: reading rows .* ran out of memory"):
        native_call("part000.tsfile", "reading rows [0, 8192)", decode)
    with pytest.raises(ResourceError, match="verify"):  # a damaged size field: how to tell
        native_call("part000.tsfile", "reading", decode)


def _slow_decodes(reader, fail_group: int | None = None) -> dict:
    """Make ``reader``'s decodes slow (0.2 s) and count those running; ``fail_group``'s
    decodes raise after their sleep."""
    state = {"running": 0}
    lock = threading.Lock()
    decode = reader.decoder.decode

    def slow(plan):
        with lock:
            state["running"] += 1
        try:
            time.sleep(0.2)
            if plan.group_index == fail_group:
                raise TsFileFormatError(f"group {fail_group}: a damaged page")
            return decode(plan)
        finally:
            with lock:
                state["running"] -= 1

    reader.decoder.decode = slow
    return state


def test_an_error_stops_the_decodes_ahead_before_it_reaches_the_caller(long_dir):
    ds = TsFileIterableDataset(long_dir, batch_size=4096, block_rows=16384, read_backend="pread")
    reader = ds.core.reader
    reader.read(0, 4096)  # the first pass's first read: its blocks follow in the background
    state = _slow_decodes(reader)
    reader.read(4096, 8192)
    futures = [f for f, _ in reader.ahead.pending.values()]
    assert futures, "nothing decoded ahead"
    with pytest.raises(ValueError, match="out must have shape"):
        reader.read(8192, 12288, out=np.empty((1, 1), dtype=np.float32))
    assert state["running"] == 0 and all(f.done() for f in futures)
    assert not reader.ahead.pending
    values, _ = reader.read(8192, 12288)  # the reader reads on after the error
    assert values.shape == (4096, SPEC.num_files * SPEC.fields_per_device)


def test_a_failed_decode_is_raised_once_the_others_have_ended(long_dir):
    ds = TsFileIterableDataset(
        long_dir, batch_size=4096, block_rows=16384, read_backend="pread", decode_threads=2
    )
    reader = ds.core.reader
    reader.read(0, 4096)
    reader.ahead.new_pass()
    reader.clear_cache()
    state = _slow_decodes(reader, fail_group=0)
    with pytest.raises(TsFileFormatError, match="a damaged page"):
        reader.read(20000, 24000)  # two groups missing: decoded on the two decode threads
    assert state["running"] == 0


_OOM_CHILD = """
import os, resource, sys
from tsfile_torch import TsFileIterableDataset, make_loader

def tight(worker_id):  # the worker's address space: what it has now and 4 MiB
    pages = int(open("/proc/self/statm").read().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + (4 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

if __name__ == "__main__":
    ds = TsFileIterableDataset(sys.argv[1], batch_size=8192)
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vm + (4 << 30)  # `ulimit -v` for the whole tree, roomy for this process
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for batch in make_loader(ds, num_workers=1, worker_init_fn=tight, timeout=60):
        pass
"""


@pytest.mark.slow  # a child interpreter and a worker: about 3.5 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and RLIMIT_AS")
def test_a_worker_out_of_memory_is_a_clear_error_and_no_verdict(
    long_dir, private_cache, tmp_path, run_python
):
    script = tmp_path / "oom.py"
    script.write_text(_OOM_CHILD)
    done = subprocess.run(
        [sys.executable, str(script), str(long_dir)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stderr[-3000:]  # an error, not a signal
    # the last error raised (a crash report the WorkerError quotes may follow it)
    raised = [line for line in done.stderr.splitlines() if line.startswith("tsfile_torch.")]
    assert raised, done.stderr[-3000:]
    assert "ResourceError" in raised[-1] or "WorkerError" in raised[-1], raised[-1]
    assert "ran out of memory" in raised[-1], raised[-1]
    ds = TsFileIterableDataset(long_dir, batch_size=8192, on_damaged="skip")  # none remembered
    assert ds.skipped == [] and len(ds.core.catalog.files) == SPEC.num_files


_SHM_CHILD = """
import os, sys
from tsfile_torch import ResourceError, TsFileIterableDataset, make_loader
ds = TsFileIterableDataset(sys.argv[1], batch_size=70000)  # 1.6 MiB a batch, 1 MiB of /dev/shm
try:
    for batch in make_loader(ds, num_workers=1):
        pass
except ResourceError as err:
    print("ERROR", err)
print("LEFT", sorted(os.listdir("/dev/shm")))
"""


def _can_mount_private_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = "mount -t tmpfs -o size=1m tmpfs /dev/shm"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.slow  # a child interpreter and a worker: about 3.5 s
@pytest.mark.skipif(not _can_mount_private_tmpfs(), reason="needs unshare -m and mount (root)")
def test_a_full_dev_shm_is_a_clear_error_and_leaves_nothing(long_dir, tmp_path):
    script = tmp_path / "shm.py"
    script.write_text(_SHM_CHILD)
    command = (
        f"mount -t tmpfs -o size=1m tmpfs /dev/shm && {sys.executable} {script} {long_dir}"
        f" && echo AFTER $(ls -A /dev/shm)"
    )
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "ERROR" in out, out + done.stderr[-3000:]
    error = out.split("ERROR", 1)[1]
    for said in ("/dev/shm has", "MiB free", "--shm-size", "num_workers=0", "cache='disk'"):
        assert said in error, error
    assert "LEFT []" in out and out.rstrip().endswith("AFTER"), out
