"""``tsfile-torch inspect`` on the device listing: clocks, nulls, timelines, damaged files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tsfile_torch import synthetic
from tsfile_torch.cli import main

ONE = np.array([0, 1, 2, 5])
OTHER = np.array([0, 3, 4, 5])  # the same count and range as ONE, other timestamps


@pytest.fixture
def twins(tmp_path):
    """Table ``t``: devices ``a`` and ``c`` on ONE, ``b`` on OTHER; field ``v`` null in row 1
    of ``a``; table ``u``: device ``z`` of 2 rows in a second file."""
    values = ONE * 1.0
    values[1] = np.nan
    devices = {"a": (ONE, values), "b": (OTHER, OTHER * 1.0), "c": (ONE, ONE * 2.0)}
    synthetic.write_table_devices(tmp_path / "x.tsfile", "t", ["v"], devices)
    z = {"z": (np.array([100, 107]), np.array([1.0, 2.0]))}
    synthetic.write_table_devices(tmp_path / "y.tsfile", "u", ["w"], z)
    return tmp_path


def test_columns_with_the_same_count_and_range_but_other_timestamps_are_not_one_timeline(
    twins, capsys
):
    assert main(["inspect", str(twins), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [t["columns"] for t in report["timelines"]] == [["t.a.v", "t.c.v"], ["t.b.v"], ["u.z.w"]]
    assert [c["timeline"] for c in report["columns"]] == [0, 1, 0, 2]
    assert main(["inspect", str(twins)]) == 0
    text = capsys.readouterr().out
    assert "4 columns on 3 timelines" in text
    assert (
        "[1] 4 rows, time [0, 5]" in text and "as [0] but other timestamps:\n      t.b: v\n" in text
    )


def test_inspect_shows_each_devices_clock_and_each_columns_nulls(twins, capsys):
    assert main(["inspect", str(twins), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    a = report["devices"][0]
    assert (a["name"], a["tags"], a["fields"]) == ("t.a", {"id": "a"}, {"v": "DOUBLE"})
    assert (a["num_rows"], a["median_step"], a["max_gap"], a["nulls"]) == (4, 1, 3, {"v": 1})
    assert [c["num_nulls"] for c in report["columns"]] == [1, 0, 0, 0]
    assert report["damaged"] == []
    assert main(["inspect", str(twins)]) == 0
    text = capsys.readouterr().out
    assert "step 1 (median), largest gap 3; 1 columns in" in text
    assert "step 7 (median), largest gap 7" in text  # u.z: two rows 7 apart
    lines = [line.split() for line in text.splitlines() if line.startswith("  t.a.v ")]
    assert lines and "nulls=1" in lines[0]


def test_a_file_that_is_not_a_tsfile_is_listed_as_damaged_and_the_good_files_shown(twins, capsys):
    (twins / "bad.tsfile").write_bytes(b"not a TsFile" * 100)
    assert main(["inspect", str(twins)]) == 1  # shown, and the status says a file was left out
    text = capsys.readouterr().out
    bad = str(twins / "bad.tsfile")
    assert f"DAMAGED {bad} (left out): " in text and "tsfile-torch verify" in text
    assert "2 files, 4 devices, 4 columns" in text and "t.a.v" in text
    assert main(["inspect", str(twins), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [d["file"] for d in report["damaged"]] == [bad]
    assert "verify" in report["damaged"][0]["reason"]
    assert [d["name"] for d in report["devices"]] == ["t.a", "t.b", "t.c", "u.z"]


def test_columns_before_the_path_parse_and_repeat(twins, capsys):
    assert main(["inspect", "--columns", "t.b.*", str(twins)]) == 0
    text = capsys.readouterr().out
    assert "1 devices, 1 columns, 4 rows" in text and "t.a.v" not in text
    assert main(["inspect", "--columns", "t.a.v", "--columns", "u.*", str(twins), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in report["columns"]] == ["t.a.v", "u.z.w"]
