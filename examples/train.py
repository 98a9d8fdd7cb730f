"""Train a small forecasting model on TsFiles through tsfile-torch, end to end.

Generates the reference dataset (8 files x 1 device x 8 DOUBLE fields x 131,072 rows) into
``--data`` if it is not there, then trains a linear model that predicts each row's last column
from the other 63, reading 8,192 x 64 batches through ``make_loader``. Prints loss and rows/s.
The order is the dataset's: ``--order batches`` (default) visits contiguous batches in a new
random order each epoch, ``shuffle`` mixes rows from 16 blocks into every batch.

    python examples/train.py                      # defaults: 3 epochs, 2 workers, auto backend
    python examples/train.py --read-backend mmap --num-workers 0 --epochs 2 --order shuffle
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
from tqdm import tqdm

from tsfile_torch import TsFileIterableDataset, make_loader, synthetic


def main(argv: list[str] | None = None) -> list[float]:
    """Train; return the mean loss of each epoch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.path.join(tempfile.gettempdir(), "tsfile-torch-reference"),
        help="directory of TsFiles (the reference dataset is written if absent)",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--read-backend", choices=["auto", "mmap", "pread"], default="auto")
    parser.add_argument("--order", choices=["sequential", "batches", "shuffle"], default="batches")
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args(argv)

    if not os.path.isdir(args.data) or not any(
        n.endswith(".tsfile") for n in os.listdir(args.data)
    ):
        print(f"writing the reference dataset to {args.data}")
        synthetic.write_reference(args.data)
    ds = TsFileIterableDataset(
        args.data, batch_size=args.batch_size, order=args.order, read_backend=args.read_backend
    )
    print(f"{ds}\ncolumns: {ds.columns[:3]} ... {ds.columns[-1]}")
    loader = make_loader(ds, num_workers=args.num_workers)

    torch.manual_seed(0)
    features = len(ds.columns) - 1
    model = torch.nn.Linear(features, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    # standardise with the catalog's metadata statistics: no pass over the data needed
    stats = ds.catalog.describe()
    mean = torch.tensor([c["mean"] for c in stats], dtype=torch.float32)
    scale = torch.tensor([max(c["max"] - c["min"], 1e-6) for c in stats], dtype=torch.float32)

    losses = []
    for epoch in range(args.epochs):
        ds.set_epoch(epoch)
        rows, total, start = 0, 0.0, time.perf_counter()
        bar = tqdm(loader, desc=f"epoch {epoch}", unit="batch", leave=False)
        for batch in bar:
            x = (batch - mean) / scale
            prediction = model(x[:, :features]).squeeze(1)
            loss_t = torch.nn.functional.mse_loss(prediction, x[:, features])
            optimizer.zero_grad()
            loss_t.backward()
            optimizer.step()
            rows += batch.shape[0]
            loss = loss_t.item()
            total += loss * batch.shape[0]
            bar.set_postfix(loss=f"{loss:.4f}")
        seconds = time.perf_counter() - start
        losses.append(total / max(rows, 1))
        print(
            f"epoch {epoch}: mean loss {losses[-1]:.5f}, {rows} rows in {seconds:.2f} s, "
            f"{rows / seconds:,.0f} rows/s"
        )
    return losses


if __name__ == "__main__":
    main()
