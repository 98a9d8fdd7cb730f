"""Every Python block of the README runs as written, in order, and does what it says."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"


def test_every_readme_block_runs_and_shows_what_it_says(tmp_path, monkeypatch, capsys):
    import tempfile

    monkeypatch.chdir(tmp_path)  # the snippets write and read "panel/"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # their mkdtemp lands in tmp_path
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 7
    ns: dict = {"__name__": "readme"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"README.md block {i}", "exec"), ns)
    out = capsys.readouterr().out
    # rows: the column names it prints, batches of the shape it says
    assert "['t.d0.s0', 't.d0.s1', 't.d0.s2']" in out
    assert ns["batch"].shape == (1000, 16)
    # windows: shapes and the first window's origin
    assert "WindowInfo(device='meters.s0', start_row=0, start_time=0)" in out
    assert ns["x"].shape == (96, 3) and ns["y"].shape == (24, 3)  # from the normalization block
    # bring your own data: the converted devices and their windows
    assert "['plant.m1', 'plant.m2']" in out and "112 ['load']" in out
    # dict items: the forward arguments, a forecast brought back to the meters' units
    assert "'past_observed_mask'" in out and "'static_categorical_features'" in out
    assert ns["in_units"].shape == ns["naive"].shape == (len(ns["items"]["device_id"]), 24, 1)
    # resume: 12 batches left, equal to the uninterrupted run's (asserted in the block too)
    assert len(ns["rest"]) == 12 and len(ns["uninterrupted"]) == 20
    # alignment: aligned values and their timestamps
    assert ns["values"].shape == (1000, 2) and bool((ns["times"][1:] > ns["times"][:-1]).all())
    # statistics and normalization: inverse undoes the normalization
    assert ns["stats"]["f0"]["source"] == "metadata" and ns["exact"]["f0"]["std"] > 0
    raw = ns["TsFileWindowDataset"]("panel/", 96, 24, stride=24, start_time=9001)[0][1]
    torch.testing.assert_close(ns["restored"], raw)
