"""The fork fix (Note: tsfile and fork, tsfile_torch/forkfix.py): forked children read with a pool.

Tests of the fix itself skip where it is not active (another tsfile build or version).
"""

from __future__ import annotations

import os

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


def _sorted_rows(batches) -> np.ndarray:
    values = torch.cat(batches).numpy()
    return values[np.lexsort(values.T[::-1])]


@needs_fix
def test_plain_fork_after_reading_in_the_parent_reads_exact_values(small_dir, small_expected):
    ds = TsFileIterableDataset(small_dir, batch_size=1000, read_backend="mmap")
    next(iter(ds))  # tsfile's native thread pool now runs in this process
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    want = small_expected.astype(np.float32)
    np.testing.assert_array_equal(_sorted_rows(list(loader)), want[np.lexsort(want.T[::-1])])


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


def test_fork_without_the_fix_is_an_error_not_a_hang(small_dir, monkeypatch):
    monkeypatch.setattr(forkfix, "_enabled", False)  # as with a tsfile build we cannot fix
    ds = TsFileIterableDataset(small_dir, batch_size=1000)  # validation: a fresh interpreter
    next(iter(ds))
    loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(TsFileTorchError, match="does not survive fork"):
        next(iter(loader))
    assert worker_context().get_start_method() == "forkserver"


def test_the_fix_is_gated_by_the_tested_tsfile_versions():
    assert forkfix.fork_safe() == (
        forkfix._tsfile_version() in forkfix.TESTED_VERSIONS and bool(forkfix._LIBS)
    )


@needs_fix
def test_make_loader_starts_workers_with_fork_when_it_is_safe():
    assert worker_context().get_start_method() == "fork"
