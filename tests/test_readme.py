"""Every block of the README runs as written, in order, and does what it says."""

from __future__ import annotations

import pytest
import torch
from doc_blocks import ROOT, run_page

from tsfile_torch import TsFileDataset

README = ROOT / "README.md"


@pytest.mark.slow  # every README block, ~10 s
def test_every_readme_block_runs_and_shows_what_it_says(tmp_path, monkeypatch, capsys):
    import tempfile

    monkeypatch.chdir(tmp_path)  # the blocks write and read "panel/", "readings.csv", "mine/"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # their mkdtemp lands in tmp_path
    ns = run_page(README, tmp_path)
    out = capsys.readouterr().out
    # rows: the column names it prints, batches of the shape it says
    assert "['t.d0.s0', 't.d0.s1', 't.d0.s2']" in out
    assert ns["batch"].shape == (1000, 16)
    # windows: shapes and the first window's origin
    assert "WindowInfo(device='meters.s0', start_row=0, start_time=0)" in out
    assert ns["x"].shape == (96, 3) and ns["y"].shape == (24, 3)  # from the normalization block
    # bring your own data: the devices write_dataframe wrote, the windows of what convert wrote
    assert "['plant.m1', 'plant.m2']" in out and "112 ['load']" in out
    # and the command line wrote what write_dataframe wrote: the same rows and timestamps
    from_csv, from_pandas = (
        TsFileDataset(d, batch_size=4000, return_timestamps=True)[0] for d in ("mine/", "pandas/")
    )
    for a, b in zip(from_csv, from_pandas, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # dict items: the forward arguments, a forecast brought back to the meters' units
    assert "'past_observed_mask'" in out and "'static_categorical_features'" in out
    assert ns["in_units"].shape == ns["naive"].shape == (len(ns["items"]["device_id"]), 24, 1)
    # resume: 12 batches left, equal to the uninterrupted run's (asserted in the block too)
    assert len(ns["rest"]) == 12 and len(ns["uninterrupted"]) == 20
    # normalization: inverse undoes it
    raw = ns["TsFileWindowDataset"]("panel/", 96, 24, stride=24, start_time=9001)[0][1]
    torch.testing.assert_close(ns["restored"], raw)
