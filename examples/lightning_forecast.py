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

from tsfile_torch import TsFileWindowDataset, build_catalog, make_loader


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
            self.data, stride=4, end_time=split, normalize="minmax", shuffle=True, **common
        )
        self.val = TsFileWindowDataset(
            self.data,
            stride=self.horizon,
            start_time=split + 1,
            normalize=self.train.normalizer,
            **common,
        )

    def train_dataloader(self):
        # the dataset shards by DDP rank itself (Trainer(use_distributed_sampler=False))
        return make_loader(self.train, batch_size=self.batch_size, num_workers=self.workers)

    def val_dataloader(self):
        return make_loader(self.val, batch_size=self.batch_size)


class Forecaster(L.LightningModule):
    def __init__(self, context: int, fields: int, horizon: int):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(context * fields, 128),
            torch.nn.ReLU(),
            torch.nn.Linear(128, horizon),
        )
        self.history: list[dict] = []  # per epoch: mean train loss, validation loss

    def on_train_epoch_start(self):
        # each pass is the dataset's next epoch anyway; naming Lightning's epoch keeps the window
        # order in step with it when a run resumes from a checkpoint (Lightning calls set_epoch
        # on a loader's sampler, not on its batch sampler)
        self.trainer.datamodule.train.set_epoch(self.current_epoch)

    def training_step(self, batch, _):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y.flatten(1))
        self.log("train_loss", loss, on_step=False, on_epoch=True)  # the epoch's mean
        return loss

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y.flatten(1)))

    def on_train_epoch_end(self):
        # validation of this epoch has run: both losses are in callback_metrics
        metrics = self.trainer.callback_metrics
        losses = {k: float(metrics[k]) for k in ("train_loss", "val_loss")}
        self.history.append(losses)
        print(
            f"epoch {self.current_epoch}: train loss {losses['train_loss']:.5f}, "
            f"validation loss {losses['val_loss']:.5f}"
        )

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main(argv: list[str] | None = None) -> dict:
    """Train; return each epoch's losses and the training dataset's latest epoch."""
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
    torch.manual_seed(0)
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
    print(f"finished {trainer.current_epoch} epochs")
    return {"history": model.history, "epoch": data.train.epoch}


if __name__ == "__main__":
    main()
