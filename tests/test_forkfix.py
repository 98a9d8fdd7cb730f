"""The fork fix (Note: tsfile and fork, tsfile_torch/native/forkfix.py): forked children read.

On the tsfile versions the fix was tested on, a plain ``fork()`` of a process that has read
TsFiles reads exact values; without the fix (another tsfile, or ``process.disable("fork_fix")``)
such a child raises TsFileTorchError instead of hanging, and make_loader starts its workers with
forkserver. Tests of the fix's mechanism itself skip where it is not active.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tsfile_torch import TsFileIterableDataset, TsFileTorchError
from tsfile_torch.loader import worker_context
from tsfile_torch.native import forkfix

needs_fix = pytest.mark.skipif(
    not forkfix.fork_safe(), reason="fork fix inactive: tsfile version or symbols differ"
)


def _sorted_rows(values: np.ndarray) -> np.ndarray:
    return values[np.lexsort(values.T[::-1])]


def test_a_plain_fork_reads_exactly_on_a_tested_tsfile_and_raises_elsewhere(
    small_dir, small_expected
):
    tested = sys.platform == "linux" and metadata.version("tsfile") in forkfix.TESTED_VERSIONS
    ds = TsFileIterableDataset(small_dir, batch_size=1000, read_backend="mmap")
    next(iter(ds))  # tsfile's native thread pool now runs in this process
    # a plain DataLoader: nothing of make_loader's set-up; timeout: a hang would be an error
    loader = DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120
    )
    if tested:
        got = torch.cat(list(loader)).numpy()
        want = small_expected.astype(np.float32)
        np.testing.assert_array_equal(_sorted_rows(got), _sorted_rows(want))
    else:
        with pytest.raises(TsFileTorchError, match="does not survive fork"):
            next(iter(loader))


@needs_fix
def test_a_forked_child_decodes_with_a_fresh_native_pool(small_dir):
    ds = TsFileIterableDataset(small_dir, batch_size=1000)
    first = next(iter(ds)).numpy()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            ds.close()
            before = len(os.listdir("/proc/self/task"))
            same = np.array_equal(next(iter(ds)).numpy(), first)
            after = len(os.listdir("/proc/self/task"))
            os.write(write_fd, f"{before} {after} {int(same)}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    before, after, same = map(int, os.read(read_fd, 100).split())
    os.close(read_fd)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert same == 1
    assert after > before  # the child built its own decode threads (tsfile 2.5: 6)


# Switching the fix off cannot be undone in a process: it runs in a child interpreter.
WITHOUT_FIX = r"""
import json, sys
import numpy as np, torch
from torch.utils.data import DataLoader
import tsfile_torch
from tsfile_torch import TsFileIterableDataset, TsFileTorchError, make_loader
from tsfile_torch.loader import worker_context

tsfile_torch.process.disable("fork_fix")
out = {"enabled": tsfile_torch.process.enabled("fork_fix")}
ds = TsFileIterableDataset(sys.argv[1], batch_size=1000, dtype="float64")
next(iter(ds))  # this process has used tsfile: a plain fork of it cannot read
plain = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork", timeout=120)
try:
    next(iter(plain))
    out["plain_fork"] = "read"
except TsFileTorchError as err:
    out["plain_fork"] = f"{type(err).__name__}: {err}"
del plain
out["start_method"] = worker_context().get_start_method()
loader = make_loader(ds, num_workers=2)
out["loader_start_method"] = loader.multiprocessing_context.get_start_method()
out["rows"] = torch.cat(list(loader)).numpy().tolist()
print(json.dumps(out))
"""


@pytest.mark.slow  # forkserver workers
def test_without_the_fix_a_plain_fork_raises_and_make_loader_uses_forkserver(
    small_dir, small_expected, run_python
):
    proc = run_python(WITHOUT_FIX, str(small_dir), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["enabled"] is False
    assert out["plain_fork"].startswith("TsFileTorchError: ")
    assert "tsfile's native thread pool does not survive fork()" in out["plain_fork"]
    assert "multiprocessing_context='forkserver'" in out["plain_fork"]
    assert out["start_method"] == out["loader_start_method"] == "forkserver"
    got = np.array(out["rows"])
    np.testing.assert_array_equal(_sorted_rows(got), _sorted_rows(small_expected))


@needs_fix
def test_make_loader_starts_workers_with_fork_when_it_is_safe():
    assert worker_context().get_start_method() == "fork"
