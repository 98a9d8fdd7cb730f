"""The forecasting example, its notebook (in a real Jupyter kernel) and the Lightning example."""

from __future__ import annotations

import math
import os
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def test_forecast_example_trains_validates_and_plots(tmp_path, capsys):
    module = runpy.run_path(str(EXAMPLES / "forecast.py"))
    plot = tmp_path / "forecast.png"
    result = module["main"](
        ["--data", str(tmp_path / "panel"), "--epochs", "2", "--stride", "24", "--plot", str(plot)]
    )
    out = capsys.readouterr().out
    assert "writing a demo panel" in out and "windows/s" in out and "validation loss" in out
    history = result["history"]
    assert len(history) == 2 and history[1]["train_loss"] < history[0]["train_loss"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_forecasting_notebook_runs_in_a_jupyter_kernel(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("TSFILE_TORCH_PANEL", str(tmp_path / "panel"))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the kernel imports this checkout's tsfile_torch
    notebook = nbformat.read(EXAMPLES / "forecasting.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert "epoch 2:" in text and "(metadata)" in text and "forecast error" in text
    assert "tsfile_torch" not in text or "Error" not in text
    assert len(images) == 2  # the loss curve and the forecast


def test_lightning_example_trains_two_epochs_and_validates(tmp_path, capsys):
    # lightning is in the test extra: a missing install fails here rather than skipping
    module = runpy.run_path(str(EXAMPLES / "lightning_forecast.py"))
    result = module["main"](["--data", str(tmp_path / "panel"), "--epochs", "2"])
    out = capsys.readouterr().out
    assert "epoch 0: train loss" in out and "epoch 1: train loss" in out
    assert "validation loss" in out and "finished 2 epochs" in out
    history = result["history"]
    assert len(history) == 2 and all(math.isfinite(v) for h in history for v in h.values())
    assert history[1]["train_loss"] < history[0]["train_loss"]
    assert result["epoch"] == 1  # the window order followed Lightning's epochs
