"""Forecast public series from one TsFile: statsmodels' co2, El Nino and sunspots.

Needs statsmodels and matplotlib (``pip install "tsfile-torch[examples]"``). Three series with
their own sampling become three devices of one table, tagged by ``series``: weekly CO2 at Mauna
Loa (59 weeks missing), monthly El Nino sea temperatures and yearly sunspot counts from 1700
(timestamps before 1970 are negative). One small MLP learns past 24 steps -> next 8 on windows
of all three, each series scaled by its own statistics, missing values masked out of the loss;
the split at 1990 validates it, and one PNG per series shows forecast vs truth in its units.

    python examples/public_forecast.py --out forecasts/ --epochs 30
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import pandas as pd
import torch

from tsfile_torch import TsFileWindowDataset, make_loader, write_dataframe

CONTEXT, HORIZON = 24, 8
SPLIT = "1990-01-01"  # any form of time: ISO string, datetime, pd.Timestamp, int ms
TIME_FEATURES = ["month_of_year", "day_of_year"]
#: the items' keys the model takes (the dict also holds future_values, masks, times, tags)
INPUTS = [
    "past_values",
    "past_observed_mask",
    "past_time_features",
    "future_time_features",
    "device_id",
]
UNITS = {"co2": "CO2 (ppm)", "elnino": "sea surface temperature (°C)", "sunspots": "sunspot number"}


def public_series() -> pd.DataFrame:
    """Return statsmodels' co2, elnino and sunspots as one long frame: time, series, value."""
    from statsmodels import datasets

    co2 = datasets.co2.load_pandas().data["co2"]  # weekly, NaN where a week is missing
    nino = datasets.elnino.load_pandas().data.melt(id_vars="YEAR", var_name="month")
    nino.index = pd.to_datetime(nino.YEAR.astype(int).astype(str) + nino.month, format="%Y%b")
    spots = datasets.sunspots.load_pandas().data
    spots.index = pd.to_datetime(spots.YEAR.astype(int).astype(str), format="%Y")
    series = {"co2": co2, "elnino": nino["value"], "sunspots": spots["SUNACTIVITY"]}
    return pd.concat(
        pd.DataFrame({"time": s.index, "series": name, "value": s.to_numpy()})
        for name, s in series.items()
    )


def masked_mse(prediction: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean squared error over the future values that were read (mask 1), not the filled ones."""
    mask = batch["future_observed_mask"]
    return ((prediction - batch["future_values"]) ** 2 * mask).sum() / mask.sum().clamp(min=1)


class Forecaster(torch.nn.Module):
    """MLP: past values relative to the last one, their mask, time features and a per-series
    embedding -> the change from the last value (so co2, above its training range after 1990,
    needs no new levels)."""

    def __init__(self, num_series: int, num_features: int, hidden: int = 64):
        super().__init__()
        self.embed = torch.nn.Embedding(num_series, 4)
        width = 2 * CONTEXT + (CONTEXT + HORIZON) * num_features + 4
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, HORIZON)
        )

    def forward(
        self, past_values, past_observed_mask, past_time_features, future_time_features, device_id
    ):
        last = past_values[:, -1:, :]  # ffill: the last value read (0, the mean, if none)
        parts = [past_values - last, past_observed_mask, past_time_features, future_time_features]
        x = torch.cat([p.flatten(1) for p in parts] + [self.embed(device_id)], dim=1)
        return last + self.mlp(x)[..., None]  # (batch, horizon, 1 target)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "public-forecast"))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    path = os.path.join(args.out, "public.tsfile")
    written = write_dataframe(
        public_series(), path, table="public", tags=["series"], overwrite=True
    )
    print(written.describe())
    ds = TsFileWindowDataset(
        path,
        CONTEXT,
        HORIZON,
        return_dict=True,  # past_values, past_observed_mask, ..., device_id
        normalize="standard",
        normalize_by="device",  # co2 ~350 ppm, sunspots ~50: each series its own scale
        fill="ffill",  # missing weeks carry the last value; the masks still say 0 there
        min_context=CONTEXT // 2,  # early windows left-padded, masked
        max_missing=0.25,  # drop windows with more than a quarter of their values missing
        time_features=TIME_FEATURES,
        shuffle=True,
    )
    train, valid = ds.split_by_time(SPLIT)  # statistics from the rows before 1990 only
    print(f"train: {train}\nvalidation: {valid}\nseries: {train.devices}")

    torch.manual_seed(0)
    model = Forecaster(len(train.devices), len(TIME_FEATURES))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = make_loader(train, batch_size=args.batch_size)
    history, start = [], time.perf_counter()
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        total, count = 0.0, 0
        for batch in loader:
            loss = masked_mse(model(**{k: batch[k] for k in INPUTS}), batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch["device_id"])
            count += len(batch["device_id"])
        history.append(total / count)
        print(f"epoch {epoch}: train loss {history[-1]:.4f} (scaled units)")
    print(f"trained {args.epochs} epochs in {time.perf_counter() - start:.1f} s")

    # every validation window at once, forecasts scaled back to each series' units
    batch = next(iter(make_loader(valid, batch_size=len(valid))))
    with torch.no_grad():
        prediction = model(**{k: batch[k] for k in INPUTS})
    val_loss = masked_mse(prediction, batch).item()
    print(f"validation loss {val_loss:.4f} (scaled units)")
    inverse = valid.normalizer.inverse  # undoes each window's own device's scaling
    forecast = inverse(prediction, batch["device_id"])[..., 0].numpy()
    truth = inverse(batch["future_values"], batch["device_id"])[..., 0].numpy()
    truth[batch["future_observed_mask"][..., 0].numpy() == 0] = np.nan  # not read: not truth
    times = batch["future_time"].numpy()

    plots, forecasts = [], {}
    for k, series in enumerate(valid.devices):
        rows = _back_to_back(times, np.flatnonzero(batch["device_id"].numpy() == k))
        t = pd.to_datetime(times[rows].ravel(), unit="ms")
        forecasts[series] = (t, truth[rows].ravel(), forecast[rows].ravel())
        name = series.split(".")[-1]  # the device public.co2: tag value co2
        plots.append(_plot(os.path.join(args.out, f"{name}.png"), name, *forecasts[series]))
    print(f"wrote {', '.join(plots)}")
    return dict(
        path=path,
        history=history,
        val_loss=val_loss,
        plots=plots,
        forecasts=forecasts,
        train=train,
        valid=valid,
    )


def _back_to_back(times: np.ndarray, windows: np.ndarray) -> list[int]:
    """Pick windows in time order whose horizons do not overlap: a forecast every HORIZON."""
    picked, end = [], None
    for i in windows[np.argsort(times[windows, 0])]:
        if end is None or times[i, 0] > end:
            picked.append(int(i))
            end = times[i, -1]
    return picked


def _plot(path: str, series: str, t, truth: np.ndarray, forecast: np.ndarray) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot(t, truth, color="k", label="truth")
    ax.plot(t, forecast, color="tab:red", label=f"forecast ({HORIZON} steps at a time)")
    ax.set(title=f"{series}: forecast vs truth after {SPLIT}", xlabel="date", ylabel=UNITS[series])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()
