"""The peers benchmark on a tiny dataset: output structure and verified rows, never speed."""

from __future__ import annotations

import json

import pytest

from tsfile_torch import synthetic

TINY = synthetic.DatasetSpec(num_files=2, devices_per_file=1, fields_per_device=2, num_rows=2000)


@pytest.fixture(scope="module")
def peers(bench_script):
    """``benchmarks/peers.py``."""
    return bench_script("peers")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny-peers")
    synthetic.write_table_files(directory, TINY)
    return directory


def test_peers_benchmark_writes_table_jsonl_and_verified_rows(tiny_dir, tmp_path, capsys, peers):
    out = tmp_path / "out"
    code = peers.main(
        [
            "--quick",
            "--data",
            str(tiny_dir),
            "--batch-size",
            "500",
            "--workers",
            "0",
            "--peer-list",
            "tsfile-torch",
            "numpy",
            "parquet",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    lines = [json.loads(line) for line in (out / "peers.jsonl").read_text().splitlines()]
    records, summary = lines[:-1], lines[-1]["summary"]
    names = [r["config"] for r in records]
    assert names[0] == peers.BASELINE
    assert len(names) == len(set(names)) == 3 * 2 + 2 + 2  # ours: 3 caches; each: 2 orders
    assert {r["peer"] for r in records} == {"tsfile-torch", "numpy", "parquet"}
    for rec in records:
        assert rec["epoch_rows"] == [2000, 2000]  # every epoch counted every row
        assert rec["rows_ok"] and rec["checksum_ok"], rec["config"]
        assert set(rec["x_stream0"]) >= {"build", "first", "later"}
        assert {"python", "torch", "cpu"} <= set(rec["environment"])
    base = next(r for r in records if r["config"] == peers.BASELINE)
    assert base["x_stream0"]["later"] == 1.0
    assert set(summary["conversions"]) == {"numpy", "parquet", "tsfile-torch disk"}
    table = (out / "peers.txt").read_text()
    assert "parquet, shuffled, workers=0" in table
    assert "10 of 10 runs delivered every row" in table
    assert "wrote" in capsys.readouterr().out
    assert not list(tiny_dir.glob("*.parquet"))  # conversions stay out of the data folder


def test_a_peer_that_drops_rows_is_marked(tiny_dir, monkeypatch, peers):
    real = peers._NumpyReader.order
    monkeypatch.setattr(peers._NumpyReader, "order", lambda self, epoch: real(self, epoch)[:-1])
    plan = peers.PeerPlan(
        str(tiny_dir),
        batch_size=500,
        rounds=1,
        epochs=2,
        workers=(0,),
        peers=("tsfile-torch", "numpy"),
    )
    records, summary = peers.run_peer_benchmark(plan, progress=False)
    by = {r["config"]: r for r in records}
    assert by["numpy, sequential, workers=0"]["epoch_rows"] == [1500, 1500]
    assert not by["numpy, sequential, workers=0"]["rows_ok"]
    assert "ROWS MISSING" in peers.format_peer_table(records, summary)


def test_unknown_peers_and_a_plan_without_the_baseline_are_refused(tiny_dir, peers):
    with pytest.raises(ValueError, match="peers must be among"):
        peers.PeerPlan(str(tiny_dir), peers=("tsfile-torch", "lance"))
    with pytest.raises(ValueError, match="must include 'tsfile-torch'"):
        peers.PeerPlan(str(tiny_dir), peers=("numpy",))


def test_a_peer_that_cannot_be_imported_is_skipped_with_the_install_line(monkeypatch, peers):
    monkeypatch.setitem(peers.PEERS, "litdata", ("no_such_module_here", "pip install litdata"))
    found, skipped = peers.available_peers(["tsfile-torch", "litdata"])
    assert found == ["tsfile-torch"]
    assert "pip install litdata" in skipped["litdata"]


@pytest.mark.slow
def test_every_installed_peer_delivers_every_row(tiny_dir, tmp_path, peers):
    plan = peers.PeerPlan(str(tiny_dir), batch_size=500, rounds=1, epochs=2, workers=(0, 2))
    records, summary = peers.run_peer_benchmark(plan, progress=False)
    ran = {r["peer"] for r in records}
    assert ran | set(summary["skipped"]) == set(peers.PEERS)
    for rec in records:
        assert rec["epoch_rows"] == [2000, 2000], rec["config"]
        assert rec["rows_ok"] and rec["checksum_ok"], rec["config"]
    written = peers.write_peer_results(records, summary, str(tmp_path))
    assert set(written) >= {"txt", "jsonl"}
