"""The window benchmark's quick run: every route delivers the reference's windows."""

from __future__ import annotations

from dataclasses import replace

from tsfile_torch.bench import windows as bench_windows
from tsfile_torch.cli import main


def test_quick_window_benchmark_checksums_match_the_reference(tmp_path):
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


def test_cli_bench_windows_quick_writes_json(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    code = main(
        [
            "bench",
            "--windows",
            "--quick",
            "--cache-dir",
            str(tmp_path),
            "--json",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    assert len(out.read_text().splitlines()) == 8  # 5 routes, the dict items, 2 disk routes
    assert "in-memory numpy reference" in capsys.readouterr().out
