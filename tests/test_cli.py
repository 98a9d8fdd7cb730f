"""The command line: generate, inspect."""

from __future__ import annotations

import json

from tsfile_torch.cli import main


def test_generate_then_inspect_reports_columns_from_metadata(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--files", "2", "--fields", "3", "--rows", "1000"]) == 0
    assert len(list(tmp_path.glob("*.tsfile"))) == 2
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_rows"] == 1000 and (report["start_time"], report["end_time"]) == (0, 999)
    assert [c["name"] for c in report["columns"]] == [
        "t.d0.s0",
        "t.d0.s1",
        "t.d0.s2",
        "t.d1.s0",
        "t.d1.s1",
        "t.d1.s2",
    ]
    assert main(["inspect", str(tmp_path), "--columns", "t.d1.*"]) == 0
    text = capsys.readouterr().out
    assert "3 columns, 1000 rows" in text and "t.d1.s2" in text and "t.d0.s0" not in text
