"""The command line: generate, inspect, --version, a help line for everything."""

from __future__ import annotations

import argparse
import json
import re
from importlib import metadata

import pytest

from tsfile_torch import SchemaError, TsFileIterableDataset, synthetic
from tsfile_torch.cli import build_parser, main


def test_generate_then_inspect_reports_columns_from_metadata(tmp_path, capsys, column_names):
    assert main(["generate", str(tmp_path), "--files", "2", "--fields", "3", "--rows", "1000"]) == 0
    assert len(list(tmp_path.glob("*.tsfile"))) == 2
    capsys.readouterr()
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_rows"] == 1000 and (report["start_time"], report["end_time"]) == (0, 999)
    assert [c["name"] for c in report["columns"]] == column_names(2, 3)
    assert main(["inspect", str(tmp_path), "--columns", "t.d1.*"]) == 0
    text = capsys.readouterr().out
    assert "3 columns, 1000 rows" in text and "t.d1.s2" in text and "t.d0.s0" not in text


def _two_timelines(directory) -> None:
    """Table ``a``: 2 devices x 2 fields x 1,000 rows from time 0; ``b``: 1 x 1 x 500 from 10."""
    synthetic.write_table_files(
        directory, synthetic.DatasetSpec(1, 2, 2, 1000, table="a"), prefix="a"
    )
    spec_b = synthetic.DatasetSpec(1, 1, 1, 500, table="b")
    synthetic.write_table_files(directory, spec_b, prefix="b", start_time=10)


def test_inspect_lists_devices_and_which_columns_share_each_timeline(tmp_path, capsys):
    _two_timelines(tmp_path)
    with pytest.raises(SchemaError, match="do not share one timeline"):
        TsFileIterableDataset(tmp_path)  # what the user could not build
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in report["devices"]] == ["a.d0", "a.d1", "b.d0"]
    assert report["timelines"] == [
        {
            "num_rows": 1000,
            "start_time": 0,
            "end_time": 999,
            "start_date": "1970-01-01T00:00:00.000Z",
            "end_date": "1970-01-01T00:00:00.999Z",
            "columns": ["a.d0.s0", "a.d0.s1", "a.d1.s0", "a.d1.s1"],
        },
        {
            "num_rows": 500,
            "start_time": 10,
            "end_time": 509,
            "start_date": "1970-01-01T00:00:00.010Z",
            "end_date": "1970-01-01T00:00:00.509Z",
            "columns": ["b.d0.s0"],
        },
    ]
    assert "num_rows" not in report  # no single row count: the columns are on two timelines
    assert [c["timeline"] for c in report["columns"]] == [0, 0, 0, 0, 1]
    assert main(["inspect", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "3 devices, 5 columns on 2 timelines" in text
    assert (
        "[1] 500 rows, time [10, 509] = [1970-01-01T00:00:00.010Z, 1970-01-01T00:00:00.509Z] "
        "(read as ms):\n      b.d0: s0\n"
    ) in text
    assert "a.d1: s0 s1" in text


def test_inspect_shows_iso_utc_dates_beside_the_raw_timestamps_in_the_unit_given(tmp_path, capsys):
    day = 1_706_659_200_000  # 2024-01-31T00:00:00Z in ms
    spec = synthetic.DatasetSpec(1, 1, 1, 3)
    synthetic.write_table_files(tmp_path, spec, start_time=day, interval=60_000)
    assert main(["inspect", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["start_time"], report["end_time"]) == (day, day + 120_000)
    assert report["start_date"] == "2024-01-31T00:00:00.000Z"
    assert report["end_date"] == "2024-01-31T00:02:00.000Z" and report["time_unit"] == "ms"
    assert main(["inspect", str(tmp_path)]) == 0
    assert (
        f"3 rows, time [{day}, {day + 120000}] = [2024-01-31T00:00:00.000Z, "
        f"2024-01-31T00:02:00.000Z] (read as ms)"
    ) in capsys.readouterr().out
    assert main(["inspect", str(tmp_path), "--json", "--time-unit", "us"]) == 0
    report = json.loads(capsys.readouterr().out)  # the same numbers read as microseconds
    assert report["start_date"] == "1970-01-20T18:04:19.200000Z"
    assert report["time_unit"] == "us"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "{dir}/nope.tsfile"], r"nope.tsfile: no such file or directory"),
        (["inspect", "{dir}", "--columns", "zz"], r"column 'zz' matches no series"),
        (["inspect", "{dir}", "--storage-options", "{"], r"--storage-options must be a JSON"),
        (["bench", "--data", "{dir}/nope.tsfile", "--quick"], r"nope.tsfile: no such file"),
    ],
)
def test_a_user_error_prints_one_line_and_exits_2(tmp_path, capsys, argv, message):
    _two_timelines(tmp_path)
    assert main([a.replace("{dir}", str(tmp_path)) for a in argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err
    assert re.search(rf"^tsfile-torch {argv[0]}: error: .*{message}", lines[0])


def test_version_prints_the_installed_package_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"tsfile-torch {metadata.version('tsfile-torch')}\n"


def _actions(parser: argparse.ArgumentParser, where: str):
    """Yield (command, action) for every action of ``parser`` and its subcommands but -h."""
    # argparse has no public way to list a parser's actions; _actions and _choices_actions have
    # held them since Python 2.7
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        yield where, action
        if isinstance(action, argparse._SubParsersAction):
            for command in action._choices_actions:  # what `tsfile-torch -h` lists
                yield where, command
            for name, subparser in action.choices.items():
                yield from _actions(subparser, f"{where} {name}")


def test_every_subcommand_and_argument_has_a_help_line():
    found = list(_actions(build_parser(), "tsfile-torch"))
    assert {"tsfile-torch convert", "tsfile-torch inspect"} <= {w for w, _ in found}
    missing = [
        f"{where} {action.option_strings or action.dest}"
        for where, action in found
        if not (action.help or "").strip()
    ]
    assert missing == []
