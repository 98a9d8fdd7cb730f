"""The training example and the quick-start notebook run end to end on small generated data."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tsfile_torch import synthetic

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_training_example_runs_and_learns(tmp_path, monkeypatch, capsys):
    spec = synthetic.DatasetSpec(
        num_files=2, devices_per_file=1, fields_per_device=4, num_rows=6000
    )
    synthetic.write_table_files(tmp_path, spec)
    module = runpy.run_path(str(EXAMPLES / "train.py"))
    losses = module["main"](
        ["--data", str(tmp_path), "--epochs", "3", "--num-workers", "0", "--batch-size", "1000"]
    )
    out = capsys.readouterr().out
    assert "epoch 2:" in out and "rows/s" in out and "6000 rows" in out
    assert len(losses) == 3 and all(np.isfinite(losses))
    # from random weights down towards the target's variance (1/12 after scaling by the range)
    assert losses[2] < 0.8 * losses[0] and losses[2] < losses[1] < losses[0]


@pytest.mark.slow  # a Jupyter kernel
def test_quickstart_notebook_runs_in_a_kernel_with_jupyter_nbconvert_and_plots(tmp_path):
    # the command the docs give for the [notebook] extra, on a real Jupyter kernel
    synthetic.write_table_files(tmp_path, synthetic.DatasetSpec(num_files=2, num_rows=9000))
    path = os.pathsep.join(p for p in (str(EXAMPLES.parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TSFILE_TORCH_DATA": str(tmp_path), "PYTHONPATH": path}
    command = ["jupyter", "nbconvert", "--to", "notebook", "--execute", "--output-dir"]
    subprocess.run(
        [sys.executable, "-m", *command, str(tmp_path / "out"), str(EXAMPLES / "quickstart.ipynb")],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
    )
    notebook = json.loads((tmp_path / "out" / "quickstart.ipynb").read_text())
    outputs = [o for c in notebook["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    text = "".join("".join(o.get("text", "")) for o in outputs if o["output_type"] == "stream")
    assert "epoch 1: 3 batches of" in text and "backends in use" in text
    assert re.search(r"epoch 2: loss \d+\.\d+, [\d,]+ rows/s", text)
    assert [o["output_type"] for o in outputs if "image/png" in o.get("data", {})] == [
        "display_data"  # the loss and rows/s figure
    ]


def test_readme_resume_example_runs_on_its_own(tmp_path, monkeypatch):
    import tempfile

    import torch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its mkdtemp lands in tmp_path
    readme = (EXAMPLES.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    (block,) = [b for b in blocks if "load_state_dict" in b]  # the resume example
    namespace: dict = {"__name__": "readme"}  # alone, as a reader copies it
    exec(compile(block, "README.md resume example", "exec"), namespace)
    rest, uninterrupted = namespace["rest"], namespace["uninterrupted"]
    assert 0 < len(rest) < len(uninterrupted)
    skipped = len(uninterrupted) - len(rest)
    assert all(torch.equal(a, b) for a, b in zip(uninterrupted[skipped:], rest, strict=True))
