"""The README's forecasting, alignment and normalization sections run as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parent.parent / "README.md"
SECTIONS = (
    "## Forecasting windows per device",
    "## Columns with different timestamps: `align=`",
    "## Statistics and normalization",
)


def _blocks(text: str, heading: str) -> list[str]:
    body = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", body, flags=re.S)


def test_readme_window_alignment_and_normalization_code_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the snippets write and read "panel/"
    text = README.read_text(encoding="utf-8")
    namespace: dict = {}
    for heading in SECTIONS:
        blocks = _blocks(text, heading)
        assert blocks, heading
        for code in blocks:
            exec(compile(code, f"README.md {heading}", "exec"), namespace)
    epochs, rest = namespace["epochs"], namespace["rest"]  # the window resume example
    assert len(rest) == len(epochs[1]) - 3 and not torch.equal(epochs[0][0][0], epochs[1][0][0])
    assert namespace["x"].shape == (96, 3) and namespace["restored"].shape == (24, 3)
    raw = namespace["TsFileWindowDataset"]("panel/", 96, 24, stride=24, start_time=9001)[0][1]
    torch.testing.assert_close(namespace["restored"], raw)  # inverse undoes the normalization
    assert namespace["values"].shape == (1000, 2) and namespace["exact"]["f0"]["std"] > 0
    assert namespace["stats"]["f0"]["source"] == "metadata"
    assert "WindowInfo(device='meters.s0', start_row=0, start_time=0)" in capsys.readouterr().out
