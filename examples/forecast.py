"""Train a small forecaster on per-device TsFile windows: past ``context`` -> next ``horizon``.

Writes a panel (devices with their own timestamps, series split across files) into ``--data`` if
it holds no TsFiles, then trains an MLP on windows of the first 80% of the time range and
validates on the rest with the training normalizer. Prints loss and windows/s per epoch and
writes a PNG of forecast vs truth for one device.

    python examples/forecast.py                         # 3 epochs on generated data
    python examples/forecast.py --data my_tsfiles/ --columns load volt --targets load
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
from tqdm import tqdm

from tsfile_torch import TsFileWindowDataset, build_catalog, make_loader, synthetic


def write_demo_panel(directory: str) -> None:
    """Write 8 devices x 3 fields of noisy cycles; device ``d`` samples at ``10 * row + d``."""
    rows = np.arange(6000)
    devices = {}
    for d in range(8):
        phase = d * 0.7
        base = np.sin(2 * np.pi * rows / 96 + phase) + 0.3 * np.sin(2 * np.pi * rows / 672)
        noise = synthetic.value_of(d, 0, rows) % 1 - 0.5
        load = 10 + 3 * base + 0.3 * noise
        values = np.stack([load, 0.5 * load + 1, np.cos(2 * np.pi * rows / 96 + phase)], axis=1)
        devices[f"s{d}"] = (10 * rows + d, values)
    os.makedirs(directory, exist_ok=True)
    for f, part in enumerate((slice(0, 3000), slice(3000, None))):
        synthetic.write_table_devices(
            os.path.join(directory, f"panel{f:03d}.tsfile"),
            "meters",
            ["load", "volt", "phase"],
            {k: (t[part], v[part]) for k, (t, v) in devices.items()},
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "tsfile-torch-demo"))
    parser.add_argument("--columns", nargs="+", help="input fields (default: all shared)")
    parser.add_argument("--targets", nargs="+", default=["load"], help="fields to forecast")
    parser.add_argument("--context", type=int, default=96)
    parser.add_argument("--horizon", type=int, default=24)
    parser.add_argument("--stride", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--plot", default=os.path.join(tempfile.gettempdir(), "forecast.png"))
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401 - checked before training, used at the end
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[plot]' for one)")
        args.plot = None

    if not os.path.isdir(args.data) or not any(
        n.endswith(".tsfile") for n in os.listdir(args.data)
    ):
        print(f"writing a demo panel to {args.data}")
        write_demo_panel(args.data)
    catalog = build_catalog(args.data, shared_timeline=False)  # metadata only
    split = catalog.start_time + int(0.8 * (catalog.end_time - catalog.start_time))
    common = dict(
        context_length=args.context,
        horizon=args.horizon,
        columns=args.columns,
        targets=args.targets,
        max_missing=0.0,  # your data may hold nulls: a window with one would make the loss NaN
    )
    # shuffle=True: windows shuffled within a buffer of 16 blocks, a new order each epoch
    train = TsFileWindowDataset(
        args.data, stride=args.stride, end_time=split, normalize="minmax", shuffle=True, **common
    )
    val = TsFileWindowDataset(
        args.data,
        stride=args.horizon,
        start_time=split + 1,
        normalize=train.normalizer,  # the training numbers, not the validation range's
        return_timestamps=True,
        **common,
    )
    print(f"train: {train}\nvalidation: {val}")
    loader = make_loader(train, batch_size=args.batch_size, num_workers=args.num_workers)
    val_loader = make_loader(val, batch_size=args.batch_size)

    torch.manual_seed(0)
    n_in, n_out = args.context * len(train.columns), args.horizon * len(train.targets)
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(n_in, 128), torch.nn.ReLU(), torch.nn.Linear(128, n_out)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    history = []
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        model.train()
        windows, total, start = 0, 0.0, time.perf_counter()
        bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", leave=False)
        for x, y in bar:
            loss = torch.nn.functional.mse_loss(model(x), y.flatten(1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            windows += len(x)
            total += loss.item() * len(x)
            bar.set_postfix(loss=f"{loss.item():.4f}")
        seconds = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            val_loss = sum(
                torch.nn.functional.mse_loss(model(x), y.flatten(1), reduction="sum").item()
                for x, y, _, _ in val_loader
            ) / (len(val) * n_out)
        history.append({"train_loss": total / windows, "val_loss": val_loss})
        print(
            f"epoch {epoch}: loss {total / windows:.5f}, validation loss {val_loss:.5f}, "
            f"{windows} windows in {seconds:.2f} s, {windows / seconds:,.0f} windows/s"
        )

    # forecast vs truth for the first validation window of one device, in the data's units
    x, y, tx, ty = val[0]
    with torch.no_grad():
        prediction = model(x[None]).reshape(args.horizon, len(val.targets))
    inverse = val.normalizer.inverse
    context = inverse(x[:, [val.columns.index(t) for t in val.targets]], val.targets)
    if args.plot is None:
        return {"history": history, "plot": None}
    _plot(
        args.plot,
        val.window_info(0).device,
        tx,
        ty,
        context,
        inverse(y, val.targets),
        inverse(prediction, val.targets),
        val.targets[0],
    )
    print(f"wrote {args.plot}")
    return {"history": history, "plot": args.plot}


def _plot(path, device, tx, ty, context, truth, forecast, name) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3))
    ax.plot(tx.numpy(), context[:, 0].numpy(), label="context", color="0.5")
    ax.plot(ty.numpy(), truth[:, 0].numpy(), label="truth", color="k")
    ax.plot(ty.numpy(), forecast[:, 0].numpy(), label="forecast", color="tab:red")
    ax.set(title=f"{device}.{name}: forecast vs truth", xlabel="time", ylabel=name)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
