"""Train the rows model of examples/train.py with Ray Train, decoding TsFiles in Ray Data tasks.

The same linear model as ``examples/train.py`` (each row's last column from the other columns,
standardised with the catalog's metadata statistics), trained by ``ray.train.torch.TorchTrainer``
on a local Ray cluster: ``tsfile_torch.ray.read_tsfile`` plans read tasks from the files'
metadata, Ray runs them on its CPUs, and each training worker streams its shard with
``get_dataset_shard("train").iter_torch_batches(batch_size=8192)``. Prints loss and rows/s.

    python examples/ray_train.py                  # the reference dataset, 2 workers, 2 epochs
    python examples/ray_train.py --data DIR --num-workers 1 --epochs 3
    python examples/ray_train.py --address auto   # on a running cluster (`ray start --head`)
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import ray
import ray.train
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from tsfile_torch import synthetic
from tsfile_torch.ray import TsFileDatasource, stack_columns


def train_loop(config: dict) -> None:
    """One Ray Train worker: its shard of the rows, batches of ``batch_size``, SGD."""
    columns, features = config["columns"], len(config["columns"]) - 1
    mean, scale = torch.tensor(config["mean"]), torch.tensor(config["scale"])
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Linear(features, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    shard = ray.train.get_dataset_shard("train")
    rank = ray.train.get_context().get_world_rank()
    losses = []
    for epoch in range(config["epochs"]):
        rows, total, start = 0, 0.0, time.perf_counter()
        batches = shard.iter_torch_batches(
            batch_size=config["batch_size"], collate_fn=stack_columns(columns)
        )
        for batch in batches:  # (batch_size, columns) float32, as TsFileIterableDataset gives
            x = (batch - mean) / scale
            prediction = model(x[:, :features]).squeeze(1)
            loss = torch.nn.functional.mse_loss(prediction, x[:, features])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows += batch.shape[0]
            total += loss.item() * batch.shape[0]
        seconds = time.perf_counter() - start
        losses.append(total / max(rows, 1))
        if rank == 0:
            print(
                f"epoch {epoch}: mean loss {losses[-1]:.5f}, {rows} rows on rank 0 in "
                f"{seconds:.2f} s, {rows / seconds:,.0f} rows/s",
                flush=True,
            )
        metrics = {"epoch": epoch, "loss": losses[-1], "rows": rows, "losses": losses}
        if rank == 0 and epoch == config["epochs"] - 1:  # the trained model, as a checkpoint
            with tempfile.TemporaryDirectory() as directory:
                torch.save(model.state_dict(), os.path.join(directory, "model.pt"))
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(directory))
        else:
            ray.train.report(metrics)


def main(argv: list[str] | None = None) -> list[float]:
    """Train; return rank 0's mean loss of each epoch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        default=os.path.join(tempfile.gettempdir(), "tsfile-torch-reference"),
        help="directory (or URL) of TsFiles (the reference dataset is written if absent)",
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=2, help="Ray Train workers")
    parser.add_argument(
        "--cpus-per-worker",
        type=float,
        default=0.5,
        help="CPUs each training worker reserves; the rest run the read tasks",
    )
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--address", default=None, help="a Ray cluster to join ('auto')")
    parser.add_argument("--num-cpus", type=int, default=2, help="CPUs of a local cluster")
    parser.add_argument("--storage", default=None, help="Ray Train's storage_path")
    args = parser.parse_args(argv)

    if "://" not in args.data and not (
        os.path.isdir(args.data) and any(n.endswith(".tsfile") for n in os.listdir(args.data))
    ):
        print(f"writing the reference dataset to {args.data}")
        synthetic.write_reference(args.data)
    t0 = time.perf_counter()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    print(f"ray.init: {time.perf_counter() - t0:.1f} s")

    source = TsFileDatasource(args.data)  # the catalog, built here from metadata only
    train = ray.data.read_datasource(source)
    print(f"{source.num_rows} rows x {len(source.columns)} columns: {source.columns[:3]} ...")
    stats = source.catalog.describe()  # metadata statistics: no pass over the data
    config = {
        "columns": source.columns,
        "mean": [c["mean"] for c in stats],
        "scale": [max(c["max"] - c["min"], 1e-6) for c in stats],
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
    }
    storage = args.storage or tempfile.mkdtemp(prefix="ray-train-")
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=args.num_workers, resources_per_worker={"CPU": args.cpus_per_worker}
        ),
        run_config=RunConfig(name="tsfile-torch-rows", storage_path=storage),
        datasets={"train": train},
    )
    t0 = time.perf_counter()
    result = trainer.fit()
    losses = result.metrics["losses"]
    print(
        f"trained {len(losses)} epochs in {time.perf_counter() - t0:.1f} s (workers' start "
        f"included): losses {[round(x, 5) for x in losses]}; model in {result.checkpoint.path}"
    )
    return losses


if __name__ == "__main__":
    main()
