"""The timeline-index cache: keyed by the identity the reader was opened on, checked when loaded,
and never leaving temporary files behind (Note: index cache)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tsfile_torch import TsFileFormatError, TsFileIterableDataset, synthetic

ROWS = 20000
FIELDS = ["s0", "s1"]


def _times(version: int) -> np.ndarray:
    """Version 0 samples every 10 time units; version 1 has the same row count, first and last
    timestamp, and every other timestamp elsewhere (denser, then one long gap)."""
    rows = np.arange(ROWS, dtype=np.int64)
    if version == 0:
        return rows * 10
    times = rows * 5 + 5
    times[0], times[-1] = 0, (ROWS - 1) * 10
    return times


def _write(path: Path, version: int) -> Path:
    values = np.stack([synthetic.value_of(version, j, np.arange(ROWS)) for j in range(2)], axis=1)
    synthetic.write_table_devices(path, "t", FIELDS, {"d0": (_times(version), values)})
    return path


# Reads a file through a fresh dataset in a new process; saves what it read.
READ = r"""
import json, resource, signal, sys
import numpy as np
from tsfile_torch import TsFileIterableDataset
args = json.loads(sys.argv[1])
ds = TsFileIterableDataset(args["path"], batch_size=2048, block_rows=2048, dtype="float64",
                           return_timestamps=True, index_cache=args["index"])
_, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
if args["full_disk"]:  # while reading, no file can grow past 64 bytes: writes fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
values, times = (np.concatenate(p) for p in zip(*[(v.numpy(), t.numpy()) for v, t in ds]))
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
np.savez(args["out"], values=values, times=times)
"""


def _read_in_new_process(run_python, path: Path, index: Path, version: int, full_disk=False):
    """Read ``path`` in a new process; assert it read version ``version`` exactly."""
    out = path.with_suffix(".read.npz")
    args = {"path": str(path), "index": str(index), "out": str(out), "full_disk": full_disk}
    proc = run_python(READ, json.dumps(args))
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out) as got:
        np.testing.assert_array_equal(got["times"], _times(version))
        want = [synthetic.value_of(version, j, np.arange(ROWS)) for j in range(2)]
        np.testing.assert_array_equal(got["values"], np.stack(want, axis=1))


def _dataset(path: Path, index: Path) -> TsFileIterableDataset:
    return TsFileIterableDataset(
        path,
        batch_size=2048,
        block_rows=2048,
        dtype="float64",
        return_timestamps=True,
        index_cache=str(index),
    )


@pytest.mark.slow  # fresh interpreters
def test_a_file_published_over_a_live_one_mid_epoch_is_read_exactly_by_a_new_process(
    tmp_path, run_python
):
    live, index = _write(tmp_path / "live.tsfile", 0), tmp_path / "index"
    ds = _dataset(live, index)
    assert sum(len(times) for _, times in ds) == ROWS  # a pass: the index is complete, saved
    saved = sorted(index.rglob("*.npy"))
    assert len(saved) == 1
    new = _write(tmp_path / "new.tsfile", 1)
    with pytest.raises(TsFileFormatError, match=r"live\.tsfile: file changed while in use"):
        for i, _ in enumerate(ds):
            if i == 1:
                os.replace(new, live)  # a pipeline publishes the next version
    assert sorted(index.rglob("*.npy")) == saved  # nothing learned from the old file was saved
    _read_in_new_process(run_python, live, index, 1)
    assert len(list(index.rglob("*.npy"))) == 2  # the new file's index, under its own key


@pytest.mark.slow  # fresh interpreters
def test_cached_marks_that_disagree_with_the_file_are_ignored(tmp_path, run_python):
    index = tmp_path / "index"
    old = _write(tmp_path / "old.tsfile", 0)
    list(_dataset(old, index))
    [old_marks] = index.rglob("*.npy")
    path = _write(tmp_path / "live.tsfile", 1)
    list(_dataset(path, index))
    [marks] = set(index.rglob("*.npy")) - {old_marks}
    marks.write_bytes(old_marks.read_bytes())  # another file's marks under this file's key
    _read_in_new_process(run_python, path, index, 1)  # checked when loaded, and ignored
    assert marks.read_bytes() != old_marks.read_bytes()  # and replaced by the right ones


def test_an_index_cache_that_cannot_be_written_leaves_no_temporary_files(tmp_path, run_python):
    path, index = _write(tmp_path / "live.tsfile", 0), tmp_path / "index"
    _read_in_new_process(run_python, path, index, 0, full_disk=True)
    assert [p.name for p in index.iterdir() if p.is_dir()]  # a save was tried
    assert not list(index.rglob("*.tmp"))  # mkstemp succeeded, the write failed: removed
    assert not list(index.rglob("*.npy"))
