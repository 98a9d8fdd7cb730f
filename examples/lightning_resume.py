"""Resume a Lightning run mid-epoch, on another number of DataLoader workers.

Lightning (2.x) saves the state of a stateful DataLoader in its checkpoints and restores it with
``Trainer.fit(ckpt_path=...)``; ``make_loader(ds, stateful=True)`` is such a loader, and its
state loads under another ``num_workers`` or world size (the rest of the epoch, every row once).
This script trains, stops in the middle of epoch 1 (a preemption), resumes from the last
checkpoint with another number of workers, and prints which rows each run saw.

    python examples/lightning_resume.py                 # 2 workers, then resumed on 0
    python examples/lightning_resume.py --workers 0 --resume-workers 2
"""

from __future__ import annotations

import argparse
import glob
import os
import tempfile

import lightning as L
import torch

from tsfile_torch import TsFileIterableDataset, make_loader, synthetic


class Model(L.LightningModule):
    """A linear model of the last column from the others; records the rows of every batch."""

    def __init__(self, num_columns: int, stop_at: tuple[int, int] | None = None):
        super().__init__()
        self.linear = torch.nn.Linear(num_columns - 1, 1)
        self.stop_at = stop_at
        self.rows: list[tuple[int, list[int]]] = []  # (epoch, timestamps of the batch)

    def training_step(self, batch, index):
        values, times = batch
        self.rows.append((self.current_epoch, times.tolist()))
        if (self.current_epoch, index) == self.stop_at:
            self.trainer.should_stop = True  # a preemption: the run ends after this step
        prediction = self.linear(values[:, :-1]).squeeze(1)
        return torch.nn.functional.mse_loss(prediction, values[:, -1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(data: str, workers: int, checkpoints: str, epochs: int, stop_at=None, ckpt_path=None):
    dataset = TsFileIterableDataset(
        data, batch_size=1000, shuffle=True, seed=7, return_timestamps=True
    )
    loader = make_loader(dataset, num_workers=workers, stateful=True)
    model = Model(len(dataset.columns), stop_at)
    every_step = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=checkpoints, every_n_train_steps=1, save_top_k=-1
    )
    trainer = L.Trainer(
        max_epochs=epochs,
        callbacks=[every_step],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, loader, ckpt_path=ckpt_path)
    return model.rows


def main(argv: list[str] | None = None) -> dict:
    """Run the three trainings; return the rows each saw, by epoch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="TsFiles (default: 2 generated files of 10,000 rows)")
    parser.add_argument("--workers", type=int, default=2, help="workers of the first run")
    parser.add_argument("--resume-workers", type=int, default=0, help="workers when resumed")
    parser.add_argument("--stop-step", type=int, default=3, help="batch of epoch 1 to stop after")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="tsfile-torch-lightning-")
    data = args.data or os.path.join(work, "data")
    if not args.data:
        synthetic.write_table_files(data, synthetic.DatasetSpec(num_files=2, num_rows=10_000))
    L.seed_everything(0, verbose=False)
    whole = _fit(data, args.workers, os.path.join(work, "whole"), epochs=2)
    stopped = _fit(
        data, args.workers, os.path.join(work, "ckpt"), epochs=2, stop_at=(1, args.stop_step)
    )
    last = max(glob.glob(os.path.join(work, "ckpt", "*.ckpt")), key=os.path.getmtime)
    resumed = _fit(data, args.resume_workers, os.path.join(work, "resumed"), 2, ckpt_path=last)
    epoch1 = lambda rows: sorted(t for e, ts in rows if e == 1 for t in ts)  # noqa: E731
    before, after = epoch1(stopped), epoch1(resumed)
    print(
        f"stopped after {len(before)} rows of epoch 1 ({args.workers} workers), resumed from "
        f"{os.path.basename(last)} on {args.resume_workers} workers: {len(after)} more rows"
    )
    print(
        f"epoch 1 rows once each: {sorted(before + after) == epoch1(whole)}; repeats: "
        f"{len(set(before) & set(after))}"
    )
    return {"whole": epoch1(whole), "before": before, "after": after}


if __name__ == "__main__":
    main()
