"""A TsFile in a format version tsfile does not read (version byte 3) is named as such, never as
damage: datasets (with and without the validation child), on_damaged="skip", inspect, verify."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tsfile_torch import TsFileDataset, TsFileFormatError, synthetic
from tsfile_torch.catalog.build import format_version
from tsfile_torch.cli import main

VERSION_3 = r"v3\.tsfile: TsFile format version 3; the installed tsfile .* reads format version 4"


def write_v3(directory) -> str:
    """Write a normal file, then set its format version byte (after the magic) to 3."""
    times = np.arange(100)
    path = synthetic.write_table_devices(
        directory / "v3.tsfile", "p", ["x"], {"d1": (times, times[:, None] * 1.0)}
    )
    with open(path, "r+b") as f:
        assert f.read(7) == b"TsFile\x04"
        f.seek(6)
        f.write(b"\x03")
    return path


@pytest.mark.parametrize("validate", [True, False])
def test_a_version_3_file_is_a_format_error_naming_the_versions(tmp_path, validate):
    path = write_v3(tmp_path)
    with pytest.raises(TsFileFormatError, match=VERSION_3) as err:
        TsFileDataset(path, validate=validate)
    assert "damaged or not a TsFile" not in str(err.value)


def test_a_version_3_file_object_is_named_and_left_where_it_was(tmp_path):
    data = open(write_v3(tmp_path), "rb").read()
    f = io.BytesIO(data)
    f.seek(5)
    assert format_version(f) == 3 and f.tell() == 5


def test_skip_leaves_a_version_3_file_out_and_reads_the_rest(tmp_path):
    write_v3(tmp_path)
    times = np.arange(100, 200)
    synthetic.write_table_devices(
        tmp_path / "w.tsfile", "p", ["x"], {"d1": (times, times[:, None] * 1.0)}
    )
    with pytest.warns(UserWarning, match=VERSION_3):
        ds = TsFileDataset(tmp_path, on_damaged="skip", batch_size=100)
    assert ds.num_rows == 100 and [name for name, _ in ds.skipped][0].endswith("v3.tsfile")


def test_inspect_and_verify_say_unreadable_not_damaged(tmp_path, capsys):
    write_v3(tmp_path)
    times = np.arange(100, 200)
    synthetic.write_table_devices(
        tmp_path / "w.tsfile", "p", ["x"], {"d1": (times, times[:, None] * 1.0)}
    )
    main(["inspect", str(tmp_path)])
    out = capsys.readouterr().out
    assert "UNREADABLE" in out and "DAMAGED" not in out and "format version 3" in out
    assert main(["verify", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "UNREADABLE" in out and "0 damaged, 1 in a format version" in out
