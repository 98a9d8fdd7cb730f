"""Bring your own data: DataFrames, CSV and Parquet into TsFile and back, exactly; refusals."""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd
import pytest
import torch
from tsfile import TsFileReader

from tsfile_torch import TsFileIterableDataset, TsFileWindowDataset, write_dataframe
from tsfile_torch.cli import main
from tsfile_torch.convert import read_frame, sniff_separator

DAY = pd.Timestamp("2024-01-31T00:00:00Z")
#: (site, meter) -> number of rows; meter None is a device whose second tag is missing
DEVICES = {("north", "m1"): 40, ("north", "m2"): 25, ("south", "m1"): 30, ("south", None): 10}


def panel() -> pd.DataFrame:
    """Four devices on their own clocks (every 10 s, offset per device), rows shuffled.

    Each value says where it comes from: temp = device * 1000 + row + 0.25 (NaN every 7th row),
    count = row (int32, missing every 5th), ok = row is even, label = "r{row}",
    seen = the row's time + 1 s (a datetime field).
    """
    frames = []
    for d, ((site, meter), n) in enumerate(DEVICES.items()):
        rows = np.arange(n)
        ts = DAY + pd.to_timedelta(10 * rows + d, unit="s")
        frames.append(
            pd.DataFrame(
                {
                    "site": site,
                    "meter": meter,
                    "ts": ts,
                    "temp": np.where(rows % 7 == 3, np.nan, d * 1000 + rows + 0.25),
                    "count": pd.array(
                        np.where(rows % 5 == 4, None, rows), dtype="Int32"
                    ),  # nullable
                    "ok": rows % 2 == 0,
                    "label": [f"r{r}" for r in rows],
                    "seen": ts + pd.Timedelta(seconds=1),
                }
            )
        )
    df = pd.concat(frames, ignore_index=True)
    return df.sample(frac=1.0, random_state=0)  # the writer needs rows by device and time


def read_back(path, table: str, columns: list[str]) -> pd.DataFrame:
    """Every row of ``table`` through tsfile's own reader, as a DataFrame."""
    reader = TsFileReader(str(path))
    parts = []
    try:
        with reader.query_table(table, columns, -(2**63), 2**63 - 1, batch_size=1024) as rs:
            while (batch := rs.read_arrow_record_batch()) is not None:
                parts.append(batch.to_pandas())
    finally:
        reader.close()
    return pd.concat(parts, ignore_index=True)


def expected_ms(df: pd.DataFrame, column: str) -> np.ndarray:
    return (df[column] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)


def test_a_panel_with_two_tag_levels_reads_back_exactly_through_tsfiles_reader(tmp_path):
    df = panel()
    done = write_dataframe(df, tmp_path / "w.tsfile", table="w", tags=["site", "meter"], time="ts")
    assert done.devices == ["w.north.m1", "w.north.m2", "w.south.null", "w.south.m1"]
    assert done.fields == {
        "temp": "DOUBLE",
        "count": "INT32",
        "ok": "BOOLEAN",
        "label": "STRING",
        "seen": "TIMESTAMP",
    }
    assert done.num_rows == len(df) and done.time_unit == "ms"
    assert "wrote 105 rows of 4 devices" in done.describe()

    got = read_back(tmp_path / "w.tsfile", "w", ["site", "meter", *done.fields])
    want = df.sort_values(["site", "meter", "ts"], na_position="first").reset_index(drop=True)
    got = got.sort_values(["site", "meter", "time"], na_position="first").reset_index(drop=True)
    np.testing.assert_array_equal(got["time"].to_numpy(), expected_ms(want, "ts").to_numpy())
    assert got["site"].tolist() == want["site"].tolist()
    assert [m if isinstance(m, str) else None for m in got["meter"]] == want["meter"].tolist()
    np.testing.assert_array_equal(got["temp"].to_numpy(float), want["temp"].to_numpy(float))
    assert got["count"].isna().tolist() == want["count"].isna().tolist()
    assert (got["count"].dropna() == want["count"].dropna().to_numpy()).all()
    assert got["ok"].tolist() == want["ok"].tolist()
    assert got["label"].tolist() == want["label"].tolist()
    seen = got["seen"].astype("int64")  # TIMESTAMP values: int64 ms, as the time column
    np.testing.assert_array_equal(seen.to_numpy(), expected_ms(want, "seen").to_numpy())


def test_each_device_reads_back_exactly_as_rows_and_as_windows(tmp_path):
    df = panel()
    write_dataframe(df, tmp_path / "w.tsfile", table="w", tags=["site", "meter"], time="ts")
    for (site, meter), n in DEVICES.items():
        device = f"w.{site}.{meter or 'null'}"
        own = df[(df.site == site) & (df.meter.isna() if meter is None else df.meter == meter)]
        own = own.sort_values("ts")
        rows = TsFileIterableDataset(
            tmp_path / "w.tsfile",
            columns=[f"{device}.temp", f"{device}.count", f"{device}.ok", f"{device}.seen"],
            batch_size=n,
            dtype=torch.float64,
            return_timestamps=True,
        )
        values, times = next(iter(rows))
        np.testing.assert_array_equal(times.numpy(), expected_ms(own, "ts").to_numpy())
        want = np.stack(
            [
                own["temp"].to_numpy(float),
                own["count"].to_numpy(float, na_value=np.nan),
                own["ok"].to_numpy(float),
                expected_ms(own, "seen").to_numpy(float),
            ],
            1,
        )
        np.testing.assert_array_equal(values.numpy(), want)  # missing values are NaN

    windows = TsFileWindowDataset(
        tmp_path / "w.tsfile", 4, 2, stride=3, columns=["temp", "count"], targets=["temp"]
    )
    windows_per_device = {d: (n - 6) // 3 + 1 for d, n in DEVICES.items()}
    assert len(windows) == sum(windows_per_device.values())
    for i in range(len(windows)):
        info = windows.window_info(i)
        site, meter = info.device.split(".")[1:]
        own = df[(df.site == site) & (df.meter.fillna("null") == meter)].sort_values("ts")
        part = own.iloc[info.start_row : info.start_row + 6]
        x, y = windows[i]
        want_x = part[["temp", "count"]].iloc[:4].to_numpy(np.float32, na_value=np.nan)
        np.testing.assert_array_equal(x.numpy(), want_x)
        np.testing.assert_array_equal(y.numpy()[:, 0], part["temp"].iloc[4:].to_numpy(np.float32))
        assert info.start_time == expected_ms(part, "ts").iloc[0]


def test_integer_times_are_written_as_they_are_and_the_index_can_be_the_time(tmp_path):
    df = pd.DataFrame(
        {"step": np.array([30, 10, 20, 10], dtype=np.uint16), "unit": [2, 1, 1, 2]}
    ).set_index("step")
    df["load"] = np.array([4.5, 1.5, 2.5, 3.5], dtype=np.float32)
    done = write_dataframe(df, tmp_path / "i.tsfile", table="plant", tags=["unit"], time="step")
    assert done.devices == ["plant.1", "plant.2"] and done.fields == {"load": "FLOAT"}
    got = read_back(tmp_path / "i.tsfile", "plant", ["unit", "load"])
    got = got.sort_values(["unit", "time"]).reset_index(drop=True)
    assert got["time"].tolist() == [10, 20, 10, 30] and got["unit"].tolist() == ["1", "1", "2", "2"]
    assert got["load"].tolist() == [1.5, 2.5, 3.5, 4.5]


def test_datetimes_are_written_in_the_unit_asked_for(tmp_path):
    df = pd.DataFrame(
        {"ts": pd.to_datetime(["2024-01-31T00:00:00", "2024-01-31T00:00:02"]), "v": [1.0, 2.0]}
    )
    done = write_dataframe(df, tmp_path / "s.tsfile", table="t", time="ts", time_unit="s")
    assert done.devices == ["t"] and done.time_unit == "s"
    assert read_back(tmp_path / "s.tsfile", "t", ["v"])["time"].tolist() == [
        1706659200,
        1706659202,
    ]
    berlin = df.assign(ts=df["ts"].dt.tz_localize("Europe/Berlin"))  # 01:00 in Berlin = 00:00Z
    write_dataframe(berlin, tmp_path / "b.tsfile", table="t", time="ts")
    times = read_back(tmp_path / "b.tsfile", "t", ["v"])["time"].tolist()
    assert times == [1706659200000 - 3600_000, 1706659202000 - 3600_000]


def test_given_types_replace_the_inferred_ones(tmp_path):
    df = pd.DataFrame({"time": [1, 2], "a": [1.0, 2.0], "b": [3, 4], "c": [5, 6]})
    done = write_dataframe(
        df, tmp_path / "t.tsfile", table="t", types={"a": "int32", "b": "DOUBLE", "c": "STRING"}
    )
    assert done.fields == {"a": "INT32", "b": "DOUBLE", "c": "STRING"}
    got = read_back(tmp_path / "t.tsfile", "t", ["a", "b", "c"])
    assert got["a"].tolist() == [1, 2] and got["b"].tolist() == [3.0, 4.0]
    assert got["c"].tolist() == ["5", "6"]


def _frame(**columns) -> pd.DataFrame:
    base = {"time": [1, 2, 3], "dev": ["a", "a", "b"], "v": [1.0, 2.0, 3.0]}
    base.update(columns)
    return pd.DataFrame({k: v for k, v in base.items() if v is not None})


REFUSALS = {
    "upper-case column": (
        _frame(Temp=[1.0, 2.0, 3.0]),
        {},
        r"column 'Temp': TsFile stores names in lower case .*would write 'temp'.*; pass "
        r"lower_names=True \(command line: --lower-names\) to lower-case the names, or rename "
        r"it first \(pandas: df\.rename\(columns=str\.lower\); a CSV: its header\)",
    ),
    "upper-case table": (
        _frame(),
        {"table": "Weather"},
        r"table 'Weather': TsFile stores names in lower case .*pass table='weather' "
        r"\(command line: --table weather\)",
    ),
    "dot in a field name": (
        _frame(**{"a.b": [1.0, 2.0, 3.0]}),
        {},
        r"column 'a\.b': tsfile-torch names series table\.tag1\.tag2\.field, so a '\.' inside "
        r"a name is ambiguous",
    ),
    "two rows of one device at one time": (
        _frame(time=[1, 1, 3]),
        {},
        r"2 rows share a \(device, timestamp\) with another row, e\.g\. rows at index \[0, 1\] "
        r"of device 't\.a' at timestamp 1; TsFile holds one row per device and timestamp",
    ),
    "null time": (
        _frame(time=[1.0, None, 3.0]),
        {},
        r"time column 'time' has 1 null values \(the first at index 1\); every TsFile row "
        r"needs a timestamp",
    ),
    "float time": (
        _frame(time=[1.0, 2.0, 3.0]),
        {},
        r"time column 'time' has dtype float64; TsFile timestamps are integers, datetimes or "
        r"ISO-8601 strings",
    ),
    "non-ISO time strings": (
        _frame(time=["2024-01-31", "yesterday", "2024-02-01"]),
        {},
        r"time column 'time' holds strings that are not ISO-8601 dates",
    ),
    "time finer than the unit": (
        _frame(time=pd.to_datetime([0, 1_500_000, 2_000_000], unit="ns")),  # 1.5 ms
        {},
        r"time column 'time' holds datetimes finer than time_unit='ms'.*pass a finer time_unit",
    ),
    "mixed object column": (
        _frame(x=pd.Series([1, 2, "3"], dtype=object)),
        {},
        r"column 'x' \(dtype object\) holds values TsFile has no type for",
    ),
    "object column of numbers": (
        _frame(x=pd.Series([1, 2, 3], dtype=object)),
        {},
        r"column 'x' has dtype object but holds 1 \(int\) at index 0; an object column must "
        r"hold strings",
    ),
    "column without values": (
        _frame(x=pd.Series([None, None, None], dtype=object)),
        {},
        r"column 'x' holds no values, so its type cannot be inferred; give it with types=",
    ),
    "complex numbers": (
        _frame(x=np.array([1j, 2j, 3j])),
        {},
        r"column 'x' \(dtype complex128\) holds values TsFile has no type for",
    ),
    "durations": (
        _frame(x=pd.to_timedelta([1, 2, 3], unit="s")),
        {},
        r"column 'x' has dtype timedelta64\[\w+\] \(Arrow duration\[\w+\]\), which TsFile "
        r"cannot hold",
    ),
    "float tags": (
        _frame(dev=[1.5, 1.5, 2.5]),
        {},
        r"tag column 'dev' has dtype float64; TsFile tags are strings: convert it first",
    ),
    "tag values naming one device twice": (
        _frame(dev=["a.b", "a", "a"], sub=["c", "b.c", "b.c"]),
        {"tags": ["dev", "sub"]},
        r"devices \('a', 'b\.c'\) and \('a\.b', 'c'\) would both be named 't\.a\.b\.c'",
    ),
    "no time column": (
        _frame(),
        {"time": "ts"},
        r"time column 'ts' is neither a column nor the index of the data",
    ),
    "a field named time": (
        _frame(ts=[1, 2, 3]),
        {"time": "ts"},
        r"column 'time' is not the time column \('ts' is\): 'time' is the name of TsFile's "
        r"own time column",
    ),
    "unknown tag": (
        _frame(),
        {"tags": ["dev", "nope"]},
        r"tag column 'nope' is not a column of the data",
    ),
    "no fields": (_frame(v=None), {}, r"df has no field columns"),
    "no rows": (_frame().iloc[:0], {}, r"df has no rows"),
    "unknown type": (
        _frame(),
        {"types": {"v": "DECIMAL"}},
        r"types\['v'\] must be one of BOOLEAN, INT32, INT64, FLOAT, DOUBLE, TIMESTAMP, STRING, "
        r"TEXT; got 'DECIMAL'",
    ),
    "type for a tag": (
        _frame(),
        {"types": {"dev": "STRING"}},
        r"types names 'dev', which is not a field column",
    ),
    "lossy given type": (
        _frame(v=[1.5, 2.0, 3.0]),
        {"types": {"v": "INT32"}},
        r"column 'v' cannot be written as INT32: Float value 1\.5\d* was truncated",
    ),
    "unknown time unit": (
        _frame(),
        {"time_unit": "h"},
        r"time_unit must be one of 's', 'ms', 'us', 'ns'; got 'h'",
    ),
}


@pytest.mark.parametrize("df, kwargs, message", REFUSALS.values(), ids=REFUSALS)
def test_what_tsfile_cannot_hold_is_refused_by_name_and_nothing_is_written(
    tmp_path, df, kwargs, message
):
    kwargs = {"table": "t", "tags": ["dev"], **kwargs}
    with pytest.raises(ValueError, match=message):
        write_dataframe(df, tmp_path / "out.tsfile", **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_replaced_only_when_asked(tmp_path):
    target = tmp_path / "out.tsfile"
    target.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match=r"out.tsfile: file exists; pass overwrite=True"):
        write_dataframe(_frame(), target, table="t", tags=["dev"])
    assert target.read_bytes() == b"precious"
    write_dataframe(_frame(), target, table="t", tags=["dev"], overwrite=True)
    assert read_back(target, "t", ["v"])["v"].tolist() == [1.0, 2.0, 3.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.tsfile"]


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz", ".parquet"])
def test_convert_command_reads_csv_and_parquet_with_iso_times(tmp_path, capsys, suffix):
    df = pd.DataFrame(
        {
            "ts": ["2024-01-31T00:00:00Z", "2024-01-31T00:00:01Z", "2024-01-31T00:00:00Z"],
            "site": ["007", "007", "010"],
            "load": [1.5, np.nan, 3.5],
            "n": [1, 2, 3],
        }
    )
    source = tmp_path / f"in{suffix}"
    if suffix == ".parquet":
        df.to_parquet(source)
    else:
        df.to_csv(source, index=False)
    out = tmp_path / "out.tsfile"
    argv = ["convert", str(source), str(out), "--table", "m", "--tags", "site", "--time", "ts"]
    assert main([*argv, "--types", "n=FLOAT"]) == 0
    sniffed = f"{source}: separator ',', sniffed from the header (--sep to choose)\n"
    assert capsys.readouterr().out == (
        ("" if suffix == ".parquet" else sniffed)
        + f"wrote 3 rows of 2 devices to {out}: table 'm', fields load DOUBLE, n FLOAT; "
        f"timestamps in ms\n"
    )
    got = read_back(out, "m", ["site", "load", "n"])
    assert got["site"].tolist() == ["007", "007", "010"]  # CSV tags stay strings
    assert got["time"].tolist() == [1706659200000, 1706659201000, 1706659200000]
    np.testing.assert_array_equal(got["load"].to_numpy(float), [1.5, np.nan, 3.5])
    assert got["n"].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], r"out.tsfile: file exists; pass overwrite=True \(--overwrite\) to replace"),
        (["--types", "n"], r"--types takes COLUMN=TYPE pairs separated by commas; got 'n'"),
        (["--tags", "Site"], r"tag column 'Site' is not a column of the data"),
        (["--sep", "::"], r"sep must be one character other than a quote or a line break"),
    ],
)
def test_convert_command_errors_are_one_line_and_exit_2(tmp_path, capsys, extra, message):
    source = tmp_path / "in.csv"
    pd.DataFrame({"time": [1, 2], "n": [1, 2]}).to_csv(source, index=False)
    (tmp_path / "out.tsfile").write_bytes(b"")
    assert main(["convert", str(source), str(tmp_path / "out.tsfile"), "--table", "m", *extra]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and re.search(rf"^tsfile-torch convert: error: .*{message}", lines[0])


def test_an_input_of_unknown_format_is_refused_by_suffix(tmp_path, capsys):
    (tmp_path / "in.xlsx").write_bytes(b"")
    assert main(["convert", str(tmp_path / "in.xlsx"), str(tmp_path / "o.tsfile"), "--table", "m"])
    err = capsys.readouterr().err
    assert "cannot tell the format from the suffix '.xlsx'; the input must be one of .csv" in err


# -- CSV separators and mixed-case headers -----------------------------------------------------


def write_csv(path, sep: str, header=("ts", "site", "load", "n")) -> None:
    """Six rows; row i: ts = 1000 + i, site "007" (odd i) or "010", load = i + 0.5, n = 10 * i."""
    rows = [[1000 + i, "007" if i % 2 else "010", i + 0.5, 10 * i] for i in range(6)]
    path.write_text("\n".join(sep.join(map(str, r)) for r in [header, *rows]) + "\n")


def assert_six_rows(out) -> None:
    got = read_back(out, "m", ["site", "load", "n"])  # by device, then time
    order = [1, 3, 5, 0, 2, 4]
    assert got["site"].tolist() == ["007"] * 3 + ["010"] * 3  # tags stay strings
    assert got["time"].tolist() == [1000 + i for i in order]
    assert got["load"].tolist() == [i + 0.5 for i in order]
    assert got["n"].tolist() == [10 * i for i in order]


@pytest.mark.parametrize(
    "sep, extra, note",
    [
        (";", ["--sep", ";"], ""),
        (";", [], "separator ';', sniffed from the header"),
        ("\t", [], "separator '\\t', sniffed from the header"),
        ("\t", ["--sep", "tab"], ""),
        ("|", ["--sep", "\\t"], None),  # the wrong separator: refused, naming the right one
    ],
    ids=["semicolon given", "semicolon sniffed", "tab sniffed", "tab given", "wrong sep given"],
)
def test_convert_command_reads_csv_with_the_separator_given_or_sniffed(
    tmp_path, capsys, sep, extra, note
):
    source, out = tmp_path / "in.csv", tmp_path / "out.tsfile"
    write_csv(source, sep)
    argv = ["convert", str(source), str(out), "--table", "m", "--tags", "site", "--time", "ts"]
    code = main([*argv, *extra])
    captured = capsys.readouterr()
    if note is None:
        assert code == 2 and not out.exists()
        assert "its one column holds '|', so the CSV is likely separated by '|': read it with " in (
            captured.err
        )
        assert "sep='|' (command line: --sep '|')" in captured.err
        return
    assert code == 0
    lines = captured.out.splitlines()
    assert lines[-1].startswith(f"wrote 6 rows of 2 devices to {out}")
    assert lines[:-1] == ([f"{source}: {note} (--sep to choose)"] if note else [])
    assert_six_rows(out)


def test_read_frame_sniffs_the_separator_of_a_compressed_csv_and_logs_it(tmp_path, caplog):
    source = tmp_path / "in.csv.gz"
    frame = pd.DataFrame({"ts": [1, 2], "site": ["007", "010"], "load": [0.5, 1.5]})
    frame.to_csv(source, sep=";", index=False)
    with caplog.at_level("INFO", logger="tsfile_torch.convert"):
        got = read_frame(source, ["site"])
    pd.testing.assert_frame_equal(got, frame, check_dtype=False)
    assert got["site"].tolist() == ["007", "010"]
    assert f"{source}: separator ';', sniffed from the header" in caplog.text
    assert sniff_separator(source) == ";"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"sep": ";;"}, r"sep must be one character other than a quote or a line break, e\.g\."),
        ({"sep": "\n"}, r"sep must be one character .*; got '\\n'"),
    ],
)
def test_read_frame_refuses_a_separator_that_is_not_one_character(tmp_path, kwargs, message):
    write_csv(tmp_path / "in.csv", ";")
    with pytest.raises(ValueError, match=message):
        read_frame(tmp_path / "in.csv", **kwargs)


def test_a_separator_given_for_parquet_is_refused(tmp_path):
    pd.DataFrame({"ts": [1], "v": [1.0]}).to_parquet(tmp_path / "in.parquet")
    with pytest.raises(ValueError, match=r"in\.parquet: sep applies to CSV input; this file is"):
        read_frame(tmp_path / "in.parquet", sep=";")


def test_a_data_frame_of_one_column_holding_separators_is_refused_with_the_separator(tmp_path):
    df = pd.read_csv(io.StringIO("ts;v\n1;2.5\n"))  # read with the wrong separator
    message = (
        r"time column 'ts' is neither a column nor the index of the data \(columns: "
        r"\['ts;v'\]\); its one column holds ';', so the CSV is likely separated by ';': read it "
        r"with sep=';' \(command line: --sep ';'\); else pass time="
    )
    with pytest.raises(ValueError, match=message):
        write_dataframe(df, tmp_path / "o.tsfile", table="t", time="ts")


def test_mixed_case_headers_are_written_in_lower_case_with_lower_names(tmp_path, capsys):
    source, out = tmp_path / "in.csv", tmp_path / "out.tsfile"
    write_csv(source, ",", header=("TS", "Site", "Load", "nCount"))
    argv = ["convert", str(source), str(out), "--table", "m", "--tags", "Site", "--time", "TS"]
    assert main([*argv, "--types", "nCount=INT64", "--lower-names"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"wrote 6 rows of 2 devices to {out}: table 'm', fields load DOUBLE, ncount INT64; "
        f"timestamps in ms"
    )
    got = read_back(out, "m", ["site", "load", "ncount"])
    order = [1, 3, 5, 0, 2, 4]
    assert got["site"].tolist() == ["007"] * 3 + ["010"] * 3  # 'Site' was read as strings
    assert got["time"].tolist() == [1000 + i for i in order]
    assert got["load"].tolist() == [i + 0.5 for i in order]
    assert got["ncount"].tolist() == [10 * i for i in order]
    rows = TsFileIterableDataset(out, columns=["m.007.load", "m.007.ncount"], batch_size=3)
    values = next(iter(rows)).numpy()
    np.testing.assert_array_equal(values, [[1.5, 10.0], [3.5, 30.0], [5.5, 50.0]])


def test_mixed_case_headers_without_lower_names_are_refused_naming_the_flag(tmp_path, capsys):
    source, out = tmp_path / "in.csv", tmp_path / "out.tsfile"
    write_csv(source, ";", header=("ts", "site", "Load", "n"))
    argv = ["convert", str(source), str(out), "--table", "m", "--tags", "site", "--time", "ts"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tsfile-torch convert: error: column 'Load': ")
    assert "pass lower_names=True (command line: --lower-names) to lower-case the names" in err[0]
    assert list(tmp_path.iterdir()) == [source]


def test_lower_names_in_python_lowers_the_names_given_too_and_refuses_a_clash(tmp_path):
    df = pd.DataFrame({"Step": [2, 1], "Unit": ["a", "a"], "Load": [2.5, 1.5]}).set_index("Step")
    done = write_dataframe(
        df,
        tmp_path / "l.tsfile",
        table="t",
        tags=["Unit"],
        time="Step",
        types={"Load": "FLOAT"},
        lower_names=True,
    )
    assert done.devices == ["t.a"] and done.fields == {"load": "FLOAT"}
    got = read_back(tmp_path / "l.tsfile", "t", ["unit", "load"])
    assert got["time"].tolist() == [1, 2] and got["load"].tolist() == [1.5, 2.5]
    assert list(df.columns) == ["Unit", "Load"]  # the caller's frame is left as it was

    clash = pd.DataFrame({"time": [1], "Temp": [1.0], "temp": [2.0]})
    message = r"columns \['Temp', 'temp'\] would all be named 'temp' with lower-case names"
    with pytest.raises(ValueError, match=message):
        write_dataframe(clash, tmp_path / "c.tsfile", table="t", lower_names=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l.tsfile"]
