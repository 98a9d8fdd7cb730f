"""The benchmarks run end to end on a tiny dataset: record shape and checksums, never speed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tsfile_torch import TsFileIterableDataset, synthetic
from tsfile_torch.cli import main

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
    import sys
    from pathlib import Path

    out = tmp_path / "scan.jsonl"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "read_backend.py"
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
def test_scale_benchmark_quick_run_reports_every_target(tmp_path):
    from tsfile_torch.bench import scale as scale

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
    from tsfile_torch.bench.reference import checksum

    batch = torch.cat(list(TsFileIterableDataset(tiny_dir, batch_size=3000))).numpy()[:500]
    base = checksum(batch)
    assert checksum(batch.copy()) == base
    assert checksum(batch[[1, 0, *range(2, 500)]]) != base  # two rows swapped
    assert checksum(batch[:, [1, 0, 2, 3]]) != base  # two columns swapped
    assert checksum(np.roll(batch, 1, axis=0)) != base  # a window shifted by one row
    other = batch.copy()
    other[7, 2], other[9, 3] = other[9, 3], other[7, 2]  # two values traded places
    assert checksum(other) != base
