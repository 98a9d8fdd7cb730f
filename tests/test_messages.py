"""Build-time failures of the machine or the paths are clear errors; odd names just work."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tsfile_torch import TsFileFormatError, TsFileIterableDataset, synthetic

SPEC = synthetic.DatasetSpec(num_files=1, devices_per_file=1, fields_per_device=4, num_rows=3000)

FSIZE = r"""
import resource, signal, sys
from tsfile_torch import TsFileIterableDataset
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal
resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
TsFileIterableDataset(sys.argv[1], batch_size=1000)
"""


def test_a_build_under_a_small_file_size_limit_says_which_limit_and_what_to_do(
    tmp_path, run_python
):
    synthetic.write_table_files(tmp_path, SPEC)
    out = run_python(FSIZE, str(tmp_path), timeout=60)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("tsfile_torch.errors.TsFileTorchError: cannot create the shared memory")
    assert "RLIMIT_FSIZE, `ulimit -f`; now 16384 bytes" in last
    assert "raise the limit (`ulimit -f unlimited`" in last
    assert "OSError" not in last


def test_a_symlink_loop_among_the_sources_is_named_as_one(tmp_path):
    synthetic.write_table_files(tmp_path / "data", SPEC)
    a, b = tmp_path / "data" / "a.tsfile", tmp_path / "data" / "b.tsfile"
    a.symlink_to(b)
    b.symlink_to(a)
    loop = r"a\.tsfile: cannot open: a symlink loop \(ELOOP: .*fix the links\) \[errno 40\]"
    with pytest.raises(TsFileFormatError, match=loop):
        TsFileIterableDataset(a)
    with pytest.raises(TsFileFormatError, match=loop):  # found in a directory
        TsFileIterableDataset(tmp_path / "data")
    with pytest.raises(TsFileFormatError, match=loop):
        TsFileIterableDataset([tmp_path / "data" / "part000.tsfile", a])


@pytest.mark.parametrize(
    "name", ["дані_θ.tsfile", os.fsdecode(b"\xe9t\xe9.tsfile")], ids=["utf-8", "latin-1 bytes"]
)
def test_a_file_with_a_non_ascii_name_reads_exactly(tmp_path, name, read_backend):
    synthetic.write_table_files(tmp_path, SPEC)
    path = tmp_path / "дир" / name
    path.parent.mkdir()
    shutil.move(tmp_path / "part000.tsfile", path)
    ds = TsFileIterableDataset(path, batch_size=1000, read_backend=read_backend, dtype="float64")
    got = np.concatenate([batch.numpy() for batch in ds])
    rows = np.arange(SPEC.num_rows)
    assert np.array_equal(got, np.stack([synthetic.value_of(0, c, rows) for c in range(4)], 1))
    assert ds.catalog.files[0].name.endswith(name)
