"""Resume mid-epoch with torchdata's StatefulDataLoader: exactly the uninterrupted run's batches.

Each resume rebuilds the dataset and loader from scratch (as a restarted job would), loads the
state after a trip through ``torch.save`` / ``torch.load``, and must deliver the rest of the
epoch and the next epoch as an uninterrupted run does, without reading the batches it skips.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from resume_support import read_log, through_disk

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader, synthetic

pytest.importorskip("torchdata")


class _LogsBatches:
    """Appends the first timestamp of every batch it reads to ``log`` (any process)."""

    log = ""

    def _read_items(self, items, *order):
        values, times = super()._read_items(items, *order)
        with open(self.log, "a") as fh:
            fh.write(f"{int(times[0])}\n")
        return values, times


class _LoggedIterable(_LogsBatches, TsFileIterableDataset):
    pass


class _LoggedMap(_LogsBatches, TsFileDataset):
    pass


def _build(kind: str, data, log: str, num_workers: int, **loader_kwargs):
    if kind == "iterable":  # rows shuffled within the buffer: 450 rows from all over a batch
        ds = _LoggedIterable(data, batch_size=450, shuffle=True, seed=-5, return_timestamps=True)
    else:  # map-style random windows: the epoch decides which rows each index reads
        ds = _LoggedMap(data, batch_size=450, random_batches=9, seed=8, return_timestamps=True)
    ds.log = log
    loader = make_loader(ds, num_workers=num_workers, stateful=True, **loader_kwargs)
    return ds, loader


def _timestamps(batches) -> list[tuple[int, ...]]:
    """Timestamps of each batch, after checking each value of column 0 is its row's."""
    out = []
    for values, times in batches:
        rows = times.numpy()  # the synthetic data's row r has timestamp r
        np.testing.assert_array_equal(
            values[:, 0].numpy(), synthetic.value_of(0, 0, rows).astype(np.float32)
        )
        out.append(tuple(rows.tolist()))
    return out


def _resume_run(kind, data, tmp_path, num_workers, epoch, k, **loader_kwargs):
    """Run ``epoch`` passes, ``k`` batches more, save; rebuild, load, finish + one more pass."""
    log = str(tmp_path / f"reads-{kind}-{num_workers}-{epoch}-{k}.txt")
    ds, loader = _build(kind, data, log, num_workers, **loader_kwargs)
    for _ in range(epoch):
        _timestamps(loader)
    it = iter(loader)
    head = _timestamps(next(it) for _ in range(k))
    state = through_disk(loader.state_dict())
    del it, loader, ds
    if os.path.exists(log):
        os.remove(log)
    ds, loader = _build(kind, data, log, num_workers, **loader_kwargs)
    loader.load_state_dict(state)
    rest = _timestamps(loader)
    resumed_reads = read_log(log)
    following = _timestamps(loader)
    return head, rest, following, resumed_reads


def _uninterrupted(kind, data, tmp_path, num_workers, passes):
    _, loader = _build(kind, data, str(tmp_path / f"full-{kind}.txt"), num_workers)
    return [_timestamps(loader) for _ in range(passes)]


@pytest.mark.parametrize(
    "kind, num_workers",
    [("iterable", 0), ("map", 0), ("iterable", 2), pytest.param("map", 2, marks=pytest.mark.slow)],
)
def test_resume_in_epoch_0_and_1_gives_the_uninterrupted_batches(
    small_dir, tmp_path, kind, num_workers
):
    full = _uninterrupted(kind, small_dir, tmp_path, num_workers, 3)
    assert full[0] != full[1] != full[2]
    for epoch in (0, 1):
        k = 5
        head, rest, following, reads = _resume_run(kind, small_dir, tmp_path, num_workers, epoch, k)
        assert head + rest == full[epoch]
        assert following == full[epoch + 1]
        # the resumed pass read what it delivered and nothing else: the skipped batches
        # were sliced off, never read
        assert sorted(reads) == sorted(batch[0] for batch in rest)


@pytest.mark.slow  # workers started every pass
def test_resume_with_non_persistent_workers(small_dir, tmp_path):
    full = _uninterrupted("iterable", small_dir, tmp_path, 2, 3)
    head, rest, following, _ = _resume_run(
        "iterable", small_dir, tmp_path, 2, 1, 3, persistent_workers=False
    )
    assert head + rest == full[1]
    assert following == full[2]


def test_state_dict_names_epoch_position_and_what_they_refer_to(small_dir):
    ds = TsFileIterableDataset(
        small_dir, batch_size=1000, shuffle=True, seed=-1, return_timestamps=True
    )
    assert ds.state_dict()["epoch"] is None
    list(ds)
    it = iter(ds)
    next(it), next(it)
    state = ds.state_dict()
    assert set(state) == {
        "epoch", "position", "worker", "num_workers", "order", "rank", "world_size", "layout",
        "history", "data", "finished",
    }  # fmt: skip
    # what the rows are made of: a fingerprint per part (Note: state identity)
    assert sorted(state["data"]) == ["columns", "content", "files", "rows"]
    assert all(isinstance(v, str) and len(v) == 16 for v in state["data"].values())
    assert {k: v for k, v in state.items() if k not in ("layout", "data")} == {
        "epoch": 1,
        "position": 2,
        "worker": 0,
        "num_workers": 1,
        "order": {
            "order": "shuffle",
            "seed": 2**64 - 1,
            "drop_last": False,
            "shuffle_blocks": 16,
            "num_samples": None,
        },
        "rank": 0,
        "world_size": 1,
        "history": [],
        "finished": False,
    }
    assert through_disk(state) == state  # plain data: it survives torch.save / torch.load
    again = TsFileIterableDataset(
        small_dir, batch_size=1000, shuffle=True, seed=-1, return_timestamps=True
    )
    again.load_state_dict(state)
    rest = [times.tolist() for _, times in again]  # row r has timestamp r
    assert rest == [sorted(rows.tolist()) for rows in ds.items_for(1)[2:]]
    assert again.epoch == 1 and again.state_dict()["position"] == 5


@pytest.mark.parametrize(
    "change, match",
    [
        ({"seed": 1}, r"saved with order=\{.*'seed': 2.*this one has order=\{.*'seed': 1"),
        ({"order": "batches"}, r"saved with order=\{'order': 'shuffle'"),
        ({"batch_size": 500}, "saved with layout="),
    ],
)
def test_a_state_of_another_dataset_is_a_clear_error(small_dir, change, match):
    ds = TsFileIterableDataset(small_dir, batch_size=1000, shuffle=True, seed=2)
    next(iter(ds))
    state = ds.state_dict()
    kwargs = {"batch_size": 1000, "order": "shuffle", "seed": 2, **change}
    other = TsFileIterableDataset(small_dir, **kwargs)
    with pytest.raises(ValueError, match="cannot load this state_dict into TsFileIterableDataset"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match=match):
        other.load_state_dict(state)


def test_one_workers_state_cannot_resume_elsewhere_but_the_loaders_can(small_dir, tmp_path):
    ds, loader = _build("iterable", small_dir, str(tmp_path / "log"), 2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it, loader
    # worker 0's own state of that 2-worker run does not say what worker 1 delivered
    worker_state = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert (worker_state["worker"], worker_state["num_workers"]) == (0, 2)
    alone = TsFileIterableDataset(small_dir, batch_size=450, shuffle=True, seed=-5)
    alone.load_state_dict(worker_state)
    with pytest.raises(ValueError, match="saved by worker 0 of 2 .* load the loader's state_dict"):
        next(iter(alone))
    # the loader's state holds every worker's: it resumes under 0 or 1 workers (tests/test_elastic)
    for workers in (0, 1):
        _, other = _build("iterable", small_dir, str(tmp_path / "log"), workers)
        other.load_state_dict(state)
