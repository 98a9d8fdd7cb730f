"""The forecasting example with PyTorch Lightning: a LightningDataModule over TsFile windows.

Needs ``pip install "tsfile-torch[lightning]"``. Uses the demo panel of ``forecast.py`` (written
into ``--data`` if it holds no TsFiles); trains on the first 80% of the time range and validates
on the rest with the training normalizer.

    python examples/lightning_forecast.py --epochs 2
"""

from __future__ import annotations

import argparse
import os
import runpy
import tempfile

import lightning as L
import torch

from tsfile_torch import TsFileWindowDataset, build_catalog, make_window_loader


class WindowDataModule(L.LightningDataModule):
    """Train / validation window datasets split by time; one normalizer for both."""

    def __init__(self, data: str, context: int, horizon: int, batch_size: int, workers: int):
        super().__init__()
        self.data, self.context, self.horizon = data, context, horizon
        self.batch_size, self.workers = batch_size, workers

    def setup(self, stage: str | None = None) -> None:
        catalog = build_catalog(self.data, shared_timeline=False)  # metadata only
        split = catalog.start_time + int(0.8 * (catalog.end_time - catalog.start_time))
        common = dict(context_length=self.context, horizon=self.horizon, targets=["load"])
        self.train = TsFileWindowDataset(
            self.data, stride=4, end_time=split, normalize="minmax", **common
        )
        self.val = TsFileWindowDataset(
            self.data,
            stride=self.horizon,
            start_time=split + 1,
            normalize=self.train.normalizer,
            **common,
        )

    def train_dataloader(self):
        # WindowBatchSampler shards by DDP rank itself (Trainer(use_distributed_sampler=False))
        self.train_loader = make_window_loader(
            self.train, self.batch_size, num_workers=self.workers
        )
        return self.train_loader

    def val_dataloader(self):
        return make_window_loader(self.val, self.batch_size, shuffle=False)


class Forecaster(L.LightningModule):
    def __init__(self, context: int, fields: int, horizon: int):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(context * fields, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, horizon),
        )

    def on_train_epoch_start(self):
        # Lightning sets the epoch of dataloader.sampler, not of a batch_sampler: a new window
        # order each epoch needs this call
        self.trainer.datamodule.train_loader.batch_sampler.set_epoch(self.current_epoch)

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y.flatten(1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y.flatten(1)))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "tsfile-torch-demo"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=0)
    args = parser.parse_args(argv)
    if not os.path.isdir(args.data) or not any(
        n.endswith(".tsfile") for n in os.listdir(args.data)
    ):
        here = os.path.dirname(os.path.abspath(__file__))
        runpy.run_path(os.path.join(here, "forecast.py"))["write_demo_panel"](args.data)
    data = WindowDataModule(args.data, 96, 24, 256, args.num_workers)
    model = Forecaster(96, 3, 24)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        use_distributed_sampler=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, datamodule=data)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    print(f"validation loss {metrics['val_loss']:.5f}, train loss {metrics['train_loss']:.5f}")
    return metrics


if __name__ == "__main__":
    main()
