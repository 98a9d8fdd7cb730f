"""Train Hugging Face forecasters on TsFile windows: PatchTST and a TimeSeriesTransformer.

Writes three meters of hourly load (daily and weekly cycles, an outage per meter, a few lost
readings) into ``--data`` if it holds no TsFiles. Builds each model from a config (random
weights, no download), takes its windows with ``tsfile_torch.hf.windows_for`` (the loader's
batches go into ``model(**batch)`` as they are) and trains for ``--steps`` steps with a tqdm
bar. Then prints the validation MSE on the last week against a naive forecast (the last value
read, repeated) and, with ``--plot DIR``, writes a PNG per meter and model
(``pip install -e ".[hf,plot]"``).

    python examples/hf_forecast.py                       # both models, under a minute
    python examples/hf_forecast.py --steps 500 --plot plots/
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm
from transformers import (
    PatchTSTConfig,
    PatchTSTForPrediction,
    TimeSeriesTransformerForPrediction,
)

from tsfile_torch import TsFileWindowDataset, collate_windows, hf, make_loader, write_dataframe

CONTEXT, HORIZON = 96, 24  # four days of hours -> the next day
SPLIT = "2024-03-04"  # validation forecasts from here on (the last week)


def write_demo(directory: str) -> None:
    """Write ``plant.tsfile``: meters m1..m3, hourly load from 2024-01-01, some missing."""
    rng = np.random.default_rng(0)
    hours = np.arange(24 * 70)
    frames = []
    for k, meter in enumerate(["m1", "m2", "m3"]):
        daily = np.sin(2 * np.pi * (hours + 3 * k) / 24)
        weekly = 0.5 * np.sin(2 * np.pi * hours / 168)
        load = (k + 1) * 10 + (k + 2) * (daily + weekly) + 0.3 * rng.normal(size=len(hours))
        outage = 24 * (10 + 15 * k) + np.arange(18)  # an 18-hour outage per meter
        load[outage] = np.nan  # nulls in the file
        load[rng.random(len(hours)) < 0.002] = np.nan  # and a few readings lost
        time = pd.date_range("2024-01-01", periods=len(hours), freq="h")
        frames.append(pd.DataFrame({"time": time, "meter": meter, "load": load}))
    os.makedirs(directory, exist_ok=True)
    frame = pd.concat(frames, ignore_index=True)
    write_dataframe(frame, os.path.join(directory, "plant.tsfile"), table="plant", tags=["meter"])


def train(model, windows, steps: int, num_workers: int, lr: float, desc: str) -> list[float]:
    """Train ``model`` for ``steps`` batches of ``windows`` (epoch after epoch)."""
    loader = make_loader(windows, batch_size=32, num_workers=num_workers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = itertools.chain.from_iterable(loader for _ in itertools.count())
    losses = []
    model.train()
    with tqdm(total=steps, desc=desc) as bar:
        for batch in itertools.islice(batches, steps):
            loss = model(**batch).loss  # the batch as it comes: every key a forward argument
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    return losses


@torch.no_grad()
def forecast(model, valid, every: int = 6) -> tuple[torch.Tensor, dict]:
    """Return (point forecasts, the batch) for every ``every``-th validation window."""
    model.eval()
    batch = collate_windows(valid.__getitems__(range(0, len(valid), every)))
    if isinstance(model, PatchTSTForPrediction):
        return model(**valid.generate_inputs(batch)).prediction_outputs, batch
    samples = model.generate(**valid.generate_inputs(batch)).sequences  # (windows, samples, h)
    return samples.median(dim=1).values, batch  # student-t samples: the median is steadier


def scores(prediction: torch.Tensor, batch: dict) -> tuple[float, float]:
    """Return (MSE of ``prediction``, MSE of the naive forecast) over the observed targets.

    Univariate windows: PatchTST's values are (windows, steps, 1), the transformer's
    (windows, steps); PatchTST's have no future mask (its windows have no missing value).
    """
    n = len(prediction)
    truth = batch["future_values"].reshape(n, -1)
    mask = batch.get("future_observed_mask", torch.ones_like(truth)).reshape(n, -1)
    past, read = batch["past_values"].reshape(n, -1), batch["past_observed_mask"].reshape(n, -1)
    last = read.shape[1] - 1 - read.flip(1).argmax(dim=1)  # the last step read in the past
    naive = past[torch.arange(n), last][:, None].expand_as(truth)
    prediction = prediction.reshape(n, -1)
    return tuple(float((((g - truth) ** 2) * mask).sum() / mask.sum()) for g in (prediction, naive))


def plot(directory: str, name: str, prediction, batch, valid, every: int = 6) -> None:
    """Write one PNG per meter: the past and truth of its last validation window, and the
    forecast; missing values are gaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(directory, exist_ok=True)
    n = len(prediction)
    devices = [valid.window_info(i).device for i in range(0, len(valid), every)]
    past, read = batch["past_values"].reshape(n, -1), batch["past_observed_mask"].reshape(n, -1)
    truth = batch["future_values"].reshape(n, -1)
    mask = batch.get("future_observed_mask", torch.ones_like(truth)).reshape(n, -1)
    for meter in valid.devices:
        i = max(j for j, d in enumerate(devices) if d == meter)
        steps = np.arange(-past.shape[1], 0)
        fig, ax = plt.subplots(figsize=(8, 3))
        ax.plot(steps, np.where(read[i] > 0, past[i], np.nan), label="past (gaps: missing)")
        ax.plot(np.arange(HORIZON), np.where(mask[i] > 0, truth[i], np.nan), label="truth")
        ax.plot(np.arange(HORIZON), prediction[i].reshape(-1), label=f"{name} forecast")
        ax.set(title=f"{meter}: {name}", xlabel="hours from the forecast start", ylabel="load")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(directory, f"{name}-{meter}.png"))
        plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "tsfile-torch-hf"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--plot", help="directory for a PNG per meter and model")
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data) or not any(
        n.endswith(".tsfile") for n in os.listdir(args.data)
    ):
        print(f"writing demo data to {args.data}")
        write_demo(args.data)
    # tiny models: one thread beats several, which mostly wait on each other
    torch.set_num_threads(1)
    torch.manual_seed(0)

    # PatchTST takes no future mask: max_missing=0.0 leaves out windows with a missing value
    # (without it windows_for refuses the windows whose horizon holds one)
    patch = PatchTSTForPrediction(
        PatchTSTConfig(
            context_length=CONTEXT, prediction_length=HORIZON, num_input_channels=1,
            patch_length=12, patch_stride=12, d_model=32, num_attention_heads=4,
            num_hidden_layers=2, ffn_dim=64,
        )
    )  # fmt: skip
    patch_windows = hf.windows_for(
        patch, args.data, columns=["load"], stride=2, shuffle=True, max_missing=0.0,
    )  # fmt: skip
    # the TimeSeriesTransformer masks both sides: every window trains, gaps masked; its config
    # comes from the data (tags -> cardinality, time features + age -> num_time_features)
    features = ["hour_of_day", "day_of_week"]
    plain = TsFileWindowDataset(
        args.data, CONTEXT, HORIZON, columns=["load"], return_dict=True, time_features=features
    )
    config = hf.config_for(
        TimeSeriesTransformerForPrediction, plain, lags_sequence=[1, 2, 3, 24], d_model=32,
        encoder_layers=2, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        num_parallel_samples=10,
    )  # fmt: skip
    tst = TimeSeriesTransformerForPrediction(config)
    tst_windows = hf.windows_for(
        tst, args.data, columns=["load"], stride=2, shuffle=True, time_features=features,
    )  # fmt: skip

    results = {}
    for name, model, windows in (
        ("PatchTSTForPrediction", patch, patch_windows),
        ("TimeSeriesTransformerForPrediction", tst, tst_windows),
    ):
        train_windows, valid = windows.split_by_time(SPLIT)
        print(f"{name}: {len(train_windows)} training windows, keys {train_windows.forward_keys}")
        losses = train(model, train_windows, args.steps, args.num_workers, args.lr, name)
        print(f"{name}: step {len(losses)} loss {np.mean(losses[-10:]):.4f}")
        prediction, batch = forecast(model, valid)
        mse, naive = scores(prediction, batch)
        print(f"{name}: validation MSE {mse:.3f}, naive forecast {naive:.3f}")
        results[name] = {"losses": losses, "mse": mse, "naive": naive}
        if args.plot:
            plot(args.plot, name, prediction, batch, valid)
    return results


if __name__ == "__main__":
    main()
