"""The forecasting examples, their notebook (in a real Jupyter kernel) and the Lightning example."""

from __future__ import annotations

import math
import os
import re
import runpy
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tsfile_torch import make_loader

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.mark.slow  # trains a model
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


def _statsmodels_series() -> dict[str, pd.Series]:
    """The three public series by date, read from statsmodels here, independently of the example."""
    from statsmodels import datasets  # in the test extra: a missing install fails, not skips

    co2 = datasets.co2.load_pandas().data["co2"]
    nino = datasets.elnino.load_pandas().data.melt(id_vars="YEAR", var_name="m")
    nino.index = pd.to_datetime(nino.YEAR.astype(int).astype(str) + nino.m, format="%Y%b")
    spots = datasets.sunspots.load_pandas().data
    spots.index = pd.to_datetime(spots.YEAR.astype(int).astype(str), format="%Y")
    return {"co2": co2, "elnino": nino["value"], "sunspots": spots["SUNACTIVITY"]}


def _values_at(series: pd.Series, stamps_ms: np.ndarray) -> np.ndarray:
    """Values of ``series`` at int64 ms timestamps (NaN where it has none or a null)."""
    return (
        series.reindex(pd.to_datetime(stamps_ms.ravel(), unit="ms"))
        .to_numpy()
        .reshape(stamps_ms.shape)
    )


@pytest.mark.slow  # trains a model
def test_public_forecast_example_learns_statsmodels_series_from_one_tsfile(tmp_path, capsys):
    module = runpy.run_path(str(EXAMPLES / "public_forecast.py"))
    result = module["main"](["--out", str(tmp_path), "--epochs", "4"])
    assert "wrote 3325 rows of 3 devices" in capsys.readouterr().out
    assert Path(result["path"]).is_file()
    for name in ("co2", "elnino", "sunspots"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = result["history"]
    assert len(history) == 4 and history[-1] < 0.7 * history[0]

    public, split_ms = _statsmodels_series(), pd.Timestamp("1990-01-01").value // 10**6
    train, valid = result["train"], result["valid"]
    assert train.devices == valid.devices == ["public.co2", "public.elnino", "public.sunspots"]
    for series, (times, truth, forecast) in result["forecasts"].items():
        data = public[series.split(".")[-1]]
        # scaled back to the data's units: the truth is statsmodels' own numbers after 1990
        expected = data.reindex(times).to_numpy()
        np.testing.assert_allclose(truth, expected, rtol=1e-6)  # float32 items
        assert times.min() >= pd.Timestamp("1990-01-01") and np.isfinite(truth).sum() >= 8
        error = np.nanmean(np.abs(forecast - truth))
        assert error < data.std(), (series, error)  # on the series' scale, not another

    # masks: 0 exactly where statsmodels has no co2 value (a missing week or left padding)
    items = next(iter(make_loader(train, batch_size=len(train))))
    co2 = items["device_id"] == train.devices.index("public.co2")
    assert int(items["future_time"].max()) < split_ms  # train windows end before 1990
    for side in ("past", "future"):
        stamps = items[f"{side}_time"][co2].numpy()
        observed = ~np.isnan(_values_at(public["co2"], stamps))
        mask = items[f"{side}_observed_mask"][co2][..., 0].numpy()
        np.testing.assert_array_equal(mask, observed.astype(np.float32))
    assert (items["past_observed_mask"][co2] == 0).any()  # missing weeks are in some windows
    # sunspots start in 1700: negative timestamps, read as written
    spots = items["device_id"] == train.devices.index("public.sunspots")
    stamps = items["past_time"][spots][items["past_observed_mask"][spots][..., 0] == 1]
    assert int(stamps.min()) == pd.Timestamp("1700-01-01").value // 10**6 < 0


@pytest.mark.slow  # a Jupyter kernel
def test_forecasting_notebook_runs_in_a_jupyter_kernel(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("TSFILE_TORCH_PANEL", str(tmp_path / "panel"))
    monkeypatch.setenv("TSFILE_TORCH_PUBLIC", str(tmp_path / "public.tsfile"))
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
    assert len(images) == 3  # the loss curve, the forecast, the public series' forecasts
    # the public-data section: statsmodels' series written, trained on, forecast per series
    assert "wrote 3325 rows of 3 devices" in text and (tmp_path / "public.tsfile").is_file()
    losses = [float(v) for v in re.findall(r"public epoch \d+: train loss (\S+)", text)]
    assert len(losses) == 6 and losses[-1] < 0.7 * losses[0]
    errors = dict(re.findall(r"(\w+): public forecast error (\S+)", text))
    assert errors.keys() == {"co2", "elnino", "sunspots"}
    assert float(errors["co2"]) < 5 and float(errors["elnino"]) < 2  # ppm, degrees: in units


@pytest.mark.slow  # trains with Lightning
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


@pytest.mark.slow  # fine-tunes four models
def test_foundation_example_fine_tunes_each_model_and_scores_it_against_naive(tmp_path, capsys):
    pytest.importorskip("chronos")
    pytest.importorskip("gluonts.torch")
    import transformers

    module = runpy.run_path(str(EXAMPLES / "foundation_finetune.py"))
    plot = tmp_path / "errors.png"
    results = module["main"](
        ["--data", str(tmp_path / "meters"), "--steps", "5", "--plot", str(plot)]
    )
    out = capsys.readouterr().out
    expected = ["chronos-bolt", "chronos-2", "deepar"]
    if hasattr(transformers, "TimesFm2_5ModelForPrediction"):
        expected.insert(2, "timesfm-2.5")
        assert "timesfm-2.5: left out" in out  # windows with a hole, said
    assert list(results) == expected
    for name, r in results.items():
        assert re.search(rf"^{re.escape(name)} +{r['windows']} +\d+\.\d{{3}}", out, re.M)
        assert r["windows"] > 0 and math.isfinite(r["mae"]) and math.isfinite(r["naive"])
    # the Chronos families and DeepAR forecast from every hour of the validation days
    assert results["chronos-bolt"]["windows"] == results["deepar"]["windows"]
    assert results["chronos-bolt"]["naive"] == pytest.approx(results["deepar"]["naive"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
