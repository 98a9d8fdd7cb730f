"""Resume mid-epoch with torchdata's StatefulDataLoader: exactly the uninterrupted run's batches.

Each resume rebuilds the dataset and loader from scratch (as a restarted job would), loads the
state after a trip through ``torch.save`` / ``torch.load``, and must deliver the rest of the
epoch and the next epoch as an uninterrupted run does, without reading the batches it skips.
"""

from __future__ import annotations

import os

import pytest
from resume_support import read_log, through_disk

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader

pytest.importorskip("torchdata")


class _LoggedIterable(TsFileIterableDataset):
    """Appends the first row of every batch it reads to ``log`` (any process)."""

    log = ""

    def _batch(self, reader, start):
        with open(self.log, "a") as fh:
            fh.write(f"{int(start)}\n")
        return super()._batch(reader, start)


class _LoggedMap(TsFileDataset):
    log = ""

    def _batch(self, reader, start):
        with open(self.log, "a") as fh:
            fh.write(f"{int(start)}\n")
        return super()._batch(reader, start)


def _build(kind: str, data, log: str, num_workers: int, **loader_kwargs):
    if kind == "iterable":
        ds = _LoggedIterable(data, batch_size=450, shuffle=True, seed=-5, return_timestamps=True)
        shuffle = False
    else:  # map-style random windows: the epoch decides which rows each index reads
        ds = _LoggedMap(data, batch_size=450, random_batches=9, seed=8, return_timestamps=True)
        shuffle = True
    ds.log = log
    loader = make_loader(
        ds, num_workers=num_workers, shuffle=shuffle, stateful=True, **loader_kwargs
    )
    return ds, loader


def _firsts(batches) -> list[int]:
    return [int(times[0]) for _, times in batches]


def _resume_run(kind, data, tmp_path, num_workers, epoch, k, **loader_kwargs):
    """Run ``epoch`` passes, ``k`` batches more, save; rebuild, load, finish + one more pass."""
    log = str(tmp_path / f"reads-{kind}-{num_workers}-{epoch}-{k}.txt")
    ds, loader = _build(kind, data, log, num_workers, **loader_kwargs)
    for _ in range(epoch):
        _firsts(loader)
    it = iter(loader)
    head = _firsts(next(it) for _ in range(k))
    state = through_disk(loader.state_dict())
    del it, loader, ds
    if os.path.exists(log):
        os.remove(log)
    ds, loader = _build(kind, data, log, num_workers, **loader_kwargs)
    loader.load_state_dict(state)
    rest = _firsts(loader)
    resumed_reads = read_log(log)
    following = _firsts(loader)
    return head, rest, following, resumed_reads


def _uninterrupted(kind, data, tmp_path, num_workers, passes):
    _, loader = _build(kind, data, str(tmp_path / f"full-{kind}.txt"), num_workers)
    return [_firsts(loader) for _ in range(passes)]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["iterable", "map"])
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
        assert sorted(reads) == sorted(rest)


def test_resume_with_non_persistent_workers(small_dir, tmp_path):
    full = _uninterrupted("iterable", small_dir, tmp_path, 2, 2)
    head, rest, following, _ = _resume_run(
        "iterable", small_dir, tmp_path, 2, 1, 3, persistent_workers=False
    )
    assert head + rest == full[1]
    assert following == _uninterrupted("iterable", small_dir, tmp_path, 2, 3)[2]


@pytest.mark.parametrize(
    "kind, num_workers",
    [
        ("iterable", 0),
        ("iterable", 2),
        ("map", 0),
        pytest.param("map", 2, marks=pytest.mark.slow),  # the sampler's state, as with 0
    ],
)
def test_contract_save_at_every_position_of_an_epoch(tmp_path, kind, num_workers):
    """The torchdata contract: for every k, k batches + resumed rest == one whole epoch."""
    from tsfile_torch import synthetic

    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=2, num_rows=2700
    )
    synthetic.write_table_files(tmp_path / "data", spec)  # 6 batches of 450
    data = tmp_path / "data"
    full = _uninterrupted(kind, data, tmp_path, num_workers, 3)
    for k in range(len(full[1]) + 1):
        head, rest, following, reads = _resume_run(kind, data, tmp_path, num_workers, 1, k)
        assert head + rest == full[1], k
        assert following == full[2], k
        assert sorted(reads) == sorted(rest), k  # skipped batches never read


def test_state_dict_names_epoch_position_and_what_they_refer_to(small_dir, rows_of):
    ds = TsFileIterableDataset(small_dir, batch_size=1000, shuffle=True, seed=-1)
    assert ds.state_dict()["epoch"] is None
    list(ds)
    it = iter(ds)
    next(it), next(it)
    state = ds.state_dict()
    assert state == {
        "epoch": 1,
        "position": 2,
        "worker": 0,
        "num_workers": 1,
        "seed": 2**64 - 1,
        "rank": 0,
        "world_size": 1,
        "random_batches": None,
        "layout": [5000, 1000, False, True],
    }
    again = TsFileIterableDataset(small_dir, batch_size=1000, shuffle=True, seed=-1)
    again.load_state_dict(state)
    assert [int(rows_of(b)[0]) for b in again] == list(ds.items_for(1)[2:])
    assert again.epoch == 1 and again.state_dict()["position"] == 5


@pytest.mark.parametrize(
    "change, match",
    [
        ({"seed": 1}, "seed=2, this dataset has seed=1"),
        ({"batch_size": 500}, "batch_size"),
        ({"rank": 1, "world_size": 2}, "saved with rank=0, this dataset has rank=1"),
        ({"rank": 0, "world_size": 2}, "world_size=1, this dataset has world_size=2"),
    ],
)
def test_a_state_of_another_dataset_is_a_clear_error(small_dir, change, match):
    ds = TsFileIterableDataset(small_dir, batch_size=1000, shuffle=True, seed=2)
    next(iter(ds))
    state = ds.state_dict()
    kwargs = {"batch_size": 1000, "shuffle": True, "seed": 2, **change}
    with pytest.raises(ValueError, match=match):
        TsFileIterableDataset(small_dir, **kwargs).load_state_dict(state)


def test_resuming_with_another_number_of_workers_is_a_clear_error(small_dir, tmp_path):
    ds, loader = _build("iterable", small_dir, str(tmp_path / "log"), 2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it, loader
    for workers in (0, 1):
        _, other = _build("iterable", small_dir, str(tmp_path / "log"), workers)
        with pytest.raises(ValueError, match="saved with num_workers=2"):
            other.load_state_dict(state)
    # the dataset checks too: worker 0's state of that 2-worker run, resumed in one process
    worker_state = state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]
    assert (worker_state["worker"], worker_state["num_workers"]) == (0, 2)
    alone = TsFileIterableDataset(small_dir, batch_size=450, shuffle=True, seed=-5)
    alone.load_state_dict(worker_state)
    with pytest.raises(ValueError, match="saved by worker 0 of 2 .* resume with the same"):
        next(iter(alone))
