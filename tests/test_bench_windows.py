"""The window benchmark's quick run: every route delivers the reference's windows."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "windows.py"


def test_quick_window_benchmark_checksums_match_the_reference(tmp_path, bench_script):
    bench_windows = bench_script("windows")
    plan = replace(bench_windows.QUICK_WINDOWS, cache_dir=str(tmp_path), workers=(0, 2))
    records = bench_windows.run_window_benchmark(plan)
    routes = [r["route"] for r in records]
    assert routes == [
        "in-memory numpy reference",
        "in-memory numpy reference, workers=2",
        "tsfile-torch sequential streaming, workers=0",
        "tsfile-torch streaming shuffled, workers=0",
        "tsfile-torch streaming shuffled, workers=2",
        "tsfile-torch shuffled dict items, workers=0",
        "tsfile-torch shuffled dict items, workers=2",
        "tsfile-torch cached (memory), workers=0",
        "tsfile-torch cached (memory), workers=2",
        "tsfile-torch disk shuffled, first run, workers=0",
        "tsfile-torch disk shuffled, later run, workers=0",
        "tsfile-torch disk shuffled, first run, workers=2",
        "tsfile-torch disk shuffled, later run, workers=2",
        "TsFileDataFrame windows one by one (scaled)",
    ]
    assert all(r["checksum_ok"] for r in records)
    windows = {r["windows"] for r in records}
    assert windows == {8 * ((12_000 - 120) // 24 + 1)}
    text = bench_windows.format_window_table(records)
    assert "MISMATCH" not in text and "TsFileDataFrame" in text


def test_the_window_script_run_from_the_checkout_writes_json(tmp_path):
    out = tmp_path / "w.jsonl"
    argv = ["--quick", "--cache-dir", str(tmp_path), "--json", str(out), "--no-progress"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        cwd=tmp_path,  # a checkout's script, run from anywhere
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert len(out.read_text().splitlines()) == 8  # 5 routes, the dict items, 2 disk routes
    assert "in-memory numpy reference" in run.stdout
