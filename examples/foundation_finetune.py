"""Fine-tune Chronos-Bolt, Chronos-2, TimesFM 2.5 and GluonTS DeepAR on TsFiles with holes.

Writes three meters of hourly load (a daily cycle, hours never sent, empty cells) into ``--data``
if it holds no TsFiles. Builds each model from a small config (random weights, no download):
the three foundation models take their windows from ``tsfile_torch.hf.windows_for`` on the
``1h`` grid (the loader's batches go into ``model(**batch)`` as they are) and train for
``--steps`` steps with a tqdm bar; DeepAR trains on ``TsFileSeriesDataset`` (whole series) for
as many batches. Then it prints a table of each model's validation MAE, on the windows whose
horizon starts after ``SPLIT``, beside a naive forecast (the last value read, repeated) on the
same windows; ``--plot PATH`` writes the errors as a bar chart (``pip install -e
".[chronos,timesfm,gluonts,plot]"``). Few steps from random weights: the table shows that the
pipeline works, not what the models can do (docs/foundation-models.md loads published weights).

    python examples/foundation_finetune.py                  # every model, about a minute
    python examples/foundation_finetune.py --models chronos-bolt deepar --steps 300 --plot e.png
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import warnings

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from tsfile_torch import TsFileSeriesDataset, TsFileWindowDataset, hf, make_loader, write_dataframe

CONTEXT, HORIZON, FREQ = 64, 16, "1h"  # 2.7 days of hours -> the next 16 hours
SPLIT = "2024-02-04"  # validation forecasts start here (the last six days)
MODELS = ("chronos-bolt", "chronos-2", "timesfm-2.5", "deepar")


def write_demo(directory: str) -> None:
    """Write ``meters.tsfile``: meters m1..m3, hourly load from 2024-01-01 for 40 days, with
    hours never sent (missing timestamps) and empty cells."""
    rng = np.random.default_rng(0)
    hours = np.arange(24 * 40)
    frames = []
    for k, meter in enumerate(["m1", "m2", "m3"]):
        daily = np.sin(2 * np.pi * (hours + 4 * k) / 24)
        load = 10 * (k + 1) + (k + 2) * daily + 0.3 * rng.normal(size=len(hours))
        load[rng.random(len(hours)) < 0.005] = np.nan  # empty cells
        time = pd.Timestamp("2024-01-01") + pd.to_timedelta(hours, "h")
        frame = pd.DataFrame({"time": time, "meter": meter, "load": load})
        lost = 24 * (8 + 9 * k) + np.arange(6)  # six hours never sent
        frames.append(frame.drop(index=lost))
    os.makedirs(directory, exist_ok=True)
    frame = pd.concat(frames, ignore_index=True)
    write_dataframe(frame, os.path.join(directory, "meters.tsfile"), table="meters", tags=["meter"])


def build(name: str, probe: TsFileWindowDataset):
    """Return a tiny model ``name`` from a config in code (the published defaults from
    ``hf.config_for``), or None where the installed transformers has no TimesFM 2.5."""
    if name == "chronos-bolt":
        from chronos.chronos_bolt import ChronosBoltModelForForecasting

        config = hf.config_for(
            ChronosBoltModelForForecasting.__name__, probe, d_model=32, d_ff=64, d_kv=16,
            num_heads=2, num_layers=1, num_decoder_layers=1,
        )  # fmt: skip
        return ChronosBoltModelForForecasting(config)
    if name == "chronos-2":
        from chronos.chronos2.model import Chronos2Model

        config = hf.config_for(
            Chronos2Model.__name__, probe, d_model=32, d_ff=64, d_kv=16, num_heads=2,
            num_layers=1,
        )  # fmt: skip
        return Chronos2Model(config)
    import transformers

    if not hasattr(transformers, "TimesFm2_5ModelForPrediction"):
        return None
    config = hf.config_for(
        "TimesFm2_5ModelForPrediction", probe, patch_length=16, num_hidden_layers=1,
        hidden_size=32, intermediate_size=32, head_dim=16, num_attention_heads=2,
        num_key_value_heads=2, output_quantile_len=HORIZON,
    )  # fmt: skip
    return transformers.TimesFm2_5ModelForPrediction(config)


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


def last_read(past: np.ndarray) -> np.ndarray:
    """Return each row's last value that is not NaN (the naive forecast)."""
    read = ~np.isnan(past)
    last = past.shape[1] - 1 - read[:, ::-1].argmax(axis=1)
    return past[np.arange(len(past)), last]


@torch.no_grad()
def forecast_windows(name: str, model, valid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (point forecasts, truth, naive forecasts), each ``(windows, HORIZON)``, over every
    validation window (the Chronos families: the median; TimesFM: its mean)."""
    model.eval()
    past_key, future_key = valid.inputs.family.past, valid.inputs.family.future
    out = {"forecast": [], "truth": [], "naive": []}
    for batch in make_loader(valid, batch_size=64):
        result = model(**valid.forecast_inputs(batch))
        if name == "timesfm-2.5":
            point = result.mean_predictions
        else:
            median = model.chronos_config.quantiles.index(0.5)
            point = result.quantile_preds[:, median]
        past = batch[past_key].numpy()  # NaN where missing (the Chronos families)
        out["forecast"].append(point[:, :HORIZON].numpy())
        out["truth"].append(batch[future_key].numpy())
        out["naive"].append(np.repeat(last_read(past)[:, None], HORIZON, axis=1))
    return tuple(np.concatenate(out[k]) for k in ("forecast", "truth", "naive"))


def deepar(data: str, steps: int, workdir: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train GluonTS DeepAR on the series before ``SPLIT``; return (median forecasts, truth,
    naive forecasts) from every hour from ``SPLIT`` on, as the windows above."""
    from gluonts.torch import DeepAREstimator
    from lightning.pytorch.callbacks import TQDMProgressBar

    series = TsFileSeriesDataset(data, ["load"], freq=FREQ)
    before, whole = series.split_by_time(SPLIT)
    estimator = DeepAREstimator(
        freq=series.freq, prediction_length=HORIZON, context_length=CONTEXT, num_layers=1,
        hidden_size=16, dropout_rate=0.0, batch_size=32, num_batches_per_epoch=steps,
        num_parallel_samples=50,
        trainer_kwargs={
            "max_epochs": 1, "enable_progress_bar": True, "enable_model_summary": False,
            "logger": False, "accelerator": "cpu", "default_root_dir": workdir,
            "callbacks": [TQDMProgressBar()],  # tqdm, as the loops above (not rich's bar)
        },
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Using a non-tuple sequence", UserWarning)  # gluonts'
        predictor = estimator.train(before)
    entries, truth = [], []
    for entry in whole:
        first = (pd.Period(SPLIT, series.freq) - entry["start"]).n
        for cut in range(first, len(entry["target"]) - HORIZON + 1):
            entries.append({**entry, "target": entry["target"][:cut]})
            truth.append(entry["target"][cut : cut + HORIZON])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Using a non-tuple sequence", UserWarning)
        forecasts = [f.median for f in predictor.predict(entries)]
    naive = [np.full(HORIZON, last_read(e["target"][None])[0]) for e in entries]
    return np.stack(forecasts), np.stack(truth), np.stack(naive)


def mae(prediction: np.ndarray, truth: np.ndarray) -> float:
    """Mean absolute error over the truth's values that were read (not NaN)."""
    read = ~np.isnan(truth)
    return float(np.abs(prediction - truth)[read].mean())


def plot(path: str, results: dict) -> None:
    """Write a bar chart of each model's MAE beside the naive forecast's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    at = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.bar(at - 0.2, [results[n]["mae"] for n in names], 0.4, label="model")
    ax.bar(at + 0.2, [results[n]["naive"] for n in names], 0.4, label="naive (last value)")
    ax.set(xticks=at, xticklabels=names, ylabel="validation MAE (load)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", default=os.path.join(tempfile.gettempdir(), "tsfile-torch-foundation")
    )
    parser.add_argument("--steps", type=int, default=100, help="training batches per model")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--num-workers", type=int, default=0)
    # 1e-2: the published initializer_factor=0.05 starts Chronos with small weights
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--plot", help="PNG path for a bar chart of the errors")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps should be a positive integer, but got --steps={args.steps}")
    if not os.path.isdir(args.data) or not any(
        n.endswith(".tsfile") for n in os.listdir(args.data)
    ):
        print(f"writing demo data to {args.data}")
        write_demo(args.data)
    # tiny models: one thread beats several, which mostly wait on each other
    torch.set_num_threads(1)
    probe = TsFileWindowDataset(
        args.data, CONTEXT, HORIZON, columns=["load"], return_dict=True, freq=FREQ
    )

    results = {}
    for name in args.models:
        torch.manual_seed(0)
        if name == "deepar":
            with tempfile.TemporaryDirectory() as workdir:
                prediction, truth, naive = deepar(args.data, args.steps, workdir)
        else:
            model = build(name, probe)
            if model is None:
                print(f"{name}: skipped, transformers>={hf.TIMESFM_2_5_TRANSFORMERS} has it")
                continue
            options = {"horizon": HORIZON} if name == "chronos-2" else {}
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")  # TimesFM: the windows with a hole left out
                windows = hf.windows_for(
                    model, args.data, ["load"], freq=FREQ, order="shuffle", seed=0, **options
                )
                train_windows, valid = windows.split_by_time(SPLIT)
            for warning in said[:1]:
                print(f"{name}: {warning.message}")
            print(f"{name}: {len(train_windows)} training windows, keys {windows.forward_keys}")
            losses = train(model, train_windows, args.steps, args.num_workers, args.lr, name)
            print(f"{name}: step {len(losses)} loss {np.mean(losses[-5:]):.4f}")
            prediction, truth, naive = forecast_windows(name, model, valid)
        results[name] = {
            "windows": len(truth), "mae": mae(prediction, truth), "naive": mae(naive, truth)
        }  # fmt: skip

    print(f"\n{'model':<14}{'windows':>8}{'MAE':>8}{'naive MAE':>11}{'ratio':>7}")
    for name, r in results.items():
        ratio = r["mae"] / r["naive"]
        print(f"{name:<14}{r['windows']:>8}{r['mae']:>8.3f}{r['naive']:>11.3f}{ratio:>7.2f}")
    if args.plot and results:
        plot(args.plot, results)
        print(f"wrote {args.plot}")
    return results


if __name__ == "__main__":
    main()
