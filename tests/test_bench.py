"""The benchmarks run end to end on a tiny dataset: record shape and checksums, never speed."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tsfile_torch import TsFileIterableDataset, synthetic
from tsfile_torch.cli import main

ROOT = Path(__file__).resolve().parent.parent
TINY = synthetic.DatasetSpec(num_files=2, devices_per_file=1, fields_per_device=2, num_rows=3000)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny")
    synthetic.write_table_files(directory, TINY)
    return directory


def test_bench_quick_writes_records_with_matching_checksums(tiny_dir, tmp_path, capsys):
    out = tmp_path / "bench.jsonl"
    plot = tmp_path / "bench.png"
    assert (
        main(
            [
                "bench",
                "--quick",
                "--data",
                str(tiny_dir),
                "--batch-size",
                "500",
                "--no-progress",
                "--json",
                str(out),
                "--plot",
                str(plot),
            ]
        )
        == 0
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = {r["kind"] for r in records}
    assert kinds == {"dataframe", "memcopy", "tsfile-torch"}
    for rec in records:
        assert rec["checksum_ok"] is True
        assert rec["seq_rows"] == [3000, 3000] and rec["random_rows"] == 8 * 500
        assert len(set(rec["seq_checksums"])) == 1
        assert rec["columns"] == 4 and rec["rows"] == 3000
        assert {"python", "torch", "tsfile", "cpu", "kernel"} <= set(rec["environment"])
        assert "TsFileDataFrame(use_index=False)" in rec["speedup_vs"]
        assert rec["peak_rss_mib"] > 0
    sums = {r["seq_checksums"][0] for r in records}
    assert len(sums) == 1  # every configuration delivered the same values
    assert plot.stat().st_size > 0
    table = capsys.readouterr().out
    assert "tsfile-torch mmap, workers=0, cache=none" in table
    assert not list(tiny_dir.glob("*.tsidx")) and not list(tiny_dir.glob("*.lock"))


def test_set_random_batches_switches_a_live_dataset(tiny_dir):
    ds = TsFileIterableDataset(tiny_dir, batch_size=500)
    assert len(list(ds)) == 6
    ds.set_random_batches(3)
    assert len(ds) == 3 and len(list(ds)) == 3
    ds.set_random_batches(None)
    assert len(list(ds)) == 6
    with pytest.raises(ValueError, match="count=0"):
        ds.set_random_batches(0)


def test_read_backend_benchmark_quick_reports_every_state(tiny_dir, tmp_path):
    import subprocess

    out = tmp_path / "scan.jsonl"
    script = ROOT / "benchmarks" / "read_backend.py"
    run = subprocess.run(
        [
            sys.executable,
            str(script),
            "--quick",
            "--no-progress",
            "--data",
            str(tiny_dir),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    records = [json.loads(line) for line in out.read_text().splitlines()]
    states = {(r["state"], r["method"]) for r in records}
    assert ("warm, fresh mapping", "mmap") in states and (
        "warm, pre-touched mapping",
        "pread",
    ) in states
    total = sum(p.stat().st_size for p in tiny_dir.glob("*.tsfile"))
    assert all(r["bytes"] == total for r in records)  # every scan read every byte
    assert "mmap/pread" in run.stdout


@pytest.mark.slow
def test_scale_benchmark_quick_run_reports_every_target(tmp_path, bench_script):
    scale = bench_script("scale")
    records = scale.run_scale(str(tmp_path / "scale"), quick=True, dataframe_budget_s=10)
    assert all("error" not in r["ours"] for r in records), records
    table = scale.format_scale(records)
    for needle in (
        "epoch cost per row",
        "first batch",
        "random window cost",
        "peak fds",
        "cost per value by columns",
        "decode floor",
    ):
        assert needle in table


def test_checksum_sees_rows_and_columns_moved(tiny_dir):
    from tsfile_torch.bench.harness import checksum

    batch = torch.cat(list(TsFileIterableDataset(tiny_dir, batch_size=3000))).numpy()[:500]
    base = checksum(batch)
    assert checksum(batch.copy()) == base
    assert checksum(np.asfortranarray(batch)) == base  # equal values, other memory layout
    assert checksum(torch.from_numpy(batch)) == base
    assert checksum(batch[[1, 0, *range(2, 500)]]) != base  # two rows swapped
    assert checksum(batch[:, [1, 0, 2, 3]]) != base  # two columns swapped
    assert checksum(np.roll(batch, 1, axis=0)) != base  # a window shifted by one row
    other = batch.copy()
    other[7, 2], other[9, 3] = other[9, 3], other[7, 2]  # two values traded places
    assert checksum(other) != base


def test_checksum_weighs_each_bit_pattern_by_its_flat_position():
    from tsfile_torch.bench.harness import checksum

    values = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)
    bits = values.view(np.uint32).ravel().tolist()
    expected = sum(b * (2 * p + 1) for p, b in enumerate(bits)) % 2**64
    assert checksum(values) == expected  # the same number in every process and version
    assert checksum(values[:0]) == 0


def test_checksum_per_item_ignores_window_order_not_steps_inside_a_window():
    from tsfile_torch.bench.harness import checksum

    windows = np.random.default_rng(1).standard_normal((6, 10, 3)).astype(np.float32)
    base = checksum(windows, per_item=True)
    assert base == sum(checksum(w) for w in windows) % 2**64
    assert checksum(windows[::-1], per_item=True) == base  # windows in another order
    assert checksum(windows[::-1]) != checksum(windows)  # but not for a whole batch
    steps = windows.copy()
    steps[2, [0, 1]] = steps[2, [1, 0]]  # two time steps of one window swapped
    assert checksum(steps, per_item=True) != base
    fields = windows[:, :, [1, 0, 2]]  # two fields swapped
    assert checksum(fields, per_item=True) != base


def test_repeat_reports_warmups_apart_and_rejects_bad_rounds():
    from tsfile_torch.bench.harness import repeat

    calls = []
    timings = repeat(lambda i: i * 10, 3, warmup=2, before=calls.append)
    assert calls == [0, 1, 2, 3, 4]
    assert timings.results == [20, 30, 40]
    assert len(timings.seconds) == 3 and len(timings.warmup_seconds) == 2
    assert timings.min <= timings.median <= max(timings.seconds)
    with pytest.raises(ValueError, match="rounds=0"):
        repeat(lambda i: i, 0)


def test_write_json_puts_the_environment_on_every_line_and_appends(tmp_path):
    from tsfile_torch.bench.harness import write_json

    out = tmp_path / "records.jsonl"
    write_json([{"route": "a"}, {"route": "b"}], str(out))
    write_json([{"route": "c", "environment": {"cpus": 1}}], str(out), append=True)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["route"] for r in records] == ["a", "b", "c"]
    assert {"python", "torch", "tsfile", "cpu", "kernel"} <= set(records[0]["environment"])
    assert records[2]["environment"] == {"cpus": 1}  # a record read back keeps its own
    write_json([{"route": "d"}], str(out))
    assert len(out.read_text().splitlines()) == 1


def test_startup_benchmark_runs_in_new_interpreters_and_reports_its_ratios(
    tiny_dir, tmp_path, capsys, bench_script
):
    out = tmp_path / "startup.jsonl"
    argv = ["--quick", "--data", str(tiny_dir), "--workers", "0", "--backends", "pread"]
    assert bench_script("startup").main([*argv, "--no-progress", "--json", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["workers"], record["backend"], record["batches"]) == (0, "pread", 1)
    for key in ("build", "first_batch", "first_epoch", "later", "stepped", "stepped_first"):
        assert record[key] > 0, key
    assert record["first_batch"] <= record["first_epoch"]
    assert record["step"] == 0.02  # the step asked (its length is calibrated: never asserted)
    table = capsys.readouterr().out
    assert "epoch 1st batch after steps / steady" in table and "pread" in table


@pytest.mark.parametrize(
    "argv, script",
    [
        (["--scale"], "benchmarks/scale.py"),
        (["--windows", "--quick"], "benchmarks/windows.py"),
        (["--startup", "--workers", "0"], "benchmarks/startup.py"),
        (["--peers", "--peer-list", "numpy", "--out", "x"], "benchmarks/peers.py"),
        (["--data", "s3://bucket/data/", "--storage-options", "{}"], "benchmarks/remote.py"),
    ],
)
def test_a_benchmark_that_left_the_package_is_named_with_its_script(argv, script, capsys):
    assert main(["bench", *argv]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"tsfile-torch bench: error: {argv[0]}") and f"python {script}" in line
    assert (ROOT / script).is_file()


@pytest.mark.parametrize("name", ["scale", "windows", "startup", "peers", "remote", "decode_floor"])
def test_each_benchmark_script_runs_from_the_checkout(name, bench_script, monkeypatch, capsys):
    bench_script("scale")  # the directory on sys.path, as running a script puts it
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / f"{name}.py"), "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(sys.argv[0], run_name="__main__")
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


@pytest.mark.slow  # builds a wheel: about 20 s
def test_bench_quick_runs_from_the_wheel_alone(tiny_dir, tmp_path):
    """What a user installs: the wheel's files only (no checkout, no benchmarks/ folder)."""
    import importlib.util
    import os
    import subprocess
    import zipfile

    # setuptools here: build with it (no download); else as pip install does, isolated
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
         "-w", str(tmp_path / "dist"), str(ROOT)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tsfile_torch-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        zf.extractall(site)
    assert not [n for n in names if n.startswith("benchmarks/")]
    bench_lines = sum(
        len((site / n).read_text().splitlines())
        for n in names
        if n.startswith("tsfile_torch/bench/") and n.endswith(".py")
    )
    assert bench_lines <= 900  # the user's diagnostic only (issue #44)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    args = ["bench", "--quick", "--data", str(tiny_dir), "--no-progress", "--workers", "0"]
    done = subprocess.run(
        [sys.executable, "-m", "tsfile_torch", *args],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "memcopy reference" in done.stdout and "TsFileDataFrame" in done.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import tsfile_torch; print(tsfile_torch.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert probe.stdout.strip().startswith(str(site)), probe.stdout
