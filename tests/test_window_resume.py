"""Window batches: a new epoch every pass, and resume mid-epoch with torchdata's StatefulDataLoader.

Each resume rebuilds the dataset and loader from scratch (as a restarted job would), loads the
state after a trip through ``torch.save`` / ``torch.load``, and must deliver the rest of the
epoch and the next epoch exactly as an uninterrupted run does (values checked against the
panel's known values), without reading the windows of the batches it skips.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from resume_support import read_log, through_disk
from torch.utils.data import DataLoader

from tsfile_torch import EpochSampler, TsFileWindowDataset, collate_windows, make_loader, synthetic

COUNTS = [300, 170, 121]  # rows per device


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    directory = tmp_path_factory.mktemp("panel")
    synthetic.write_panel(directory, num_devices=3, num_fields=2, num_rows=COUNTS, num_files=2)
    return directory


class _LoggedWindows(TsFileWindowDataset):
    """Appends every window index it reads to ``log`` (any process)."""

    log = ""

    def __getitems__(self, indices):
        with open(self.log, "a") as fh:
            fh.writelines(f"{int(i)}\n" for i in indices)
        return super().__getitems__(indices)


def _shuffled(panel, stride=3, kind=TsFileWindowDataset, **kwargs):
    """Shuffled windows of 8 + 2 rows over the panel (``kind``: the dataset class)."""
    return kind(
        panel, context_length=8, horizon=2, stride=stride, block_rows=32, shuffle=True, **kwargs
    )


def _build(data, log: str, num_workers: int, stride: int = 3, **loader_kwargs):
    ds = _shuffled(data, stride, _LoggedWindows, return_timestamps=True, shuffle_blocks=2, seed=-4)
    ds.log = log
    loader = make_loader(ds, batch_size=10, num_workers=num_workers, stateful=True, **loader_kwargs)
    return ds, loader


def _batches(sampler: EpochSampler, epoch: int) -> list[list[int]]:
    """Window indices of each batch of ``epoch``, in the order the loader delivers them."""
    return [b.tolist() for b in sampler.batches(epoch)]


def _expected(ds, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Return the values (x and y rows, both fields) and timestamps of these windows."""
    values, times = [], []
    for i in indices:
        info = ds.window_info(i)
        d = int(info.device.rsplit(".s", 1)[1])
        rows = np.arange(info.start_row, info.start_row + 10)
        values.append(np.stack([synthetic.value_of(d, j, rows) for j in range(2)], axis=1))
        times.append(synthetic.panel_device_times(d, rows))
    return np.stack(values).astype(np.float32), np.stack(times)


def _check(ds, batches, expected_batches: list[list[int]]) -> None:
    """Each delivered batch holds exactly the expected windows, values and timestamps."""
    assert len(batches) == len(expected_batches)
    for (x, y, tx, ty), indices in zip(batches, expected_batches, strict=True):
        values, times = _expected(ds, indices)
        np.testing.assert_array_equal(torch.cat([x, y], dim=1).numpy(), values)
        np.testing.assert_array_equal(torch.cat([tx, ty], dim=1).numpy(), times)


def _resume_run(data, tmp_path, num_workers, epoch, k, stride=3, finish=False):
    """Run ``epoch`` passes, ``k`` batches more (or the whole pass), save; rebuild, load, run on.

    Returns the batches before the save, the rest of the pass after loading, the pass after
    that, and the windows the resumed pass read.
    """
    log = str(tmp_path / f"reads-{num_workers}-{epoch}-{k}.txt")
    ds, loader = _build(data, log, num_workers, stride)
    for _ in range(epoch):
        list(loader)
    if finish:
        head = list(loader)
    else:
        it = iter(loader)
        head = [next(it) for _ in range(k)]
    state = through_disk(loader.state_dict())
    del loader, ds
    if not finish:
        del it
    if os.path.exists(log):
        os.remove(log)
    ds, loader = _build(data, log, num_workers, stride)
    loader.load_state_dict(state)
    rest = list(loader)
    resumed_reads = read_log(log)
    following = list(loader)
    return ds, loader.batch_sampler, head, rest, following, resumed_reads


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_window_resume_in_epoch_0_and_1_gives_the_uninterrupted_batches(
    panel, tmp_path, num_workers
):
    _, loader = _build(panel, str(tmp_path / "full.txt"), num_workers)
    full = [list(loader) for _ in range(3)]
    sampler = loader.batch_sampler
    orders = [_batches(sampler, e) for e in range(3)]
    assert orders[0] != orders[1] != orders[2]  # no set_epoch: every pass is the next epoch
    for epoch in (0, 1):
        k = 7
        ds, resumed, head, rest, following, reads = _resume_run(
            panel, tmp_path, num_workers, epoch, k
        )
        assert _batches(resumed, epoch) == orders[epoch]
        _check(ds, head + rest, orders[epoch])  # exact values, in the uninterrupted order
        _check(ds, following, orders[epoch + 1])
        for a, b in zip(head + rest, full[epoch], strict=True):
            assert all(torch.equal(u, v) for u, v in zip(a, b, strict=True))
        # the resumed pass read the windows it delivered, each once, and nothing else: the
        # skipped batches were sliced off the order, never read
        assert sorted(reads) == sorted(i for batch in orders[epoch][k:] for i in batch)


@pytest.mark.slow  # a resume from every position (one resume, fast: the test above)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_window_contract_save_at_every_position_of_an_epoch(panel, tmp_path, num_workers):
    """The torchdata contract: for every k, k batches + resumed rest == one whole epoch."""
    _, loader = _build(panel, str(tmp_path / "full.txt"), num_workers, stride=9)
    sampler = loader.batch_sampler
    orders = [_batches(sampler, e) for e in range(3)]
    assert 5 <= len(orders[1]) <= 10  # a small epoch
    for k in range(len(orders[1]) + 1):
        ds, _, head, rest, following, reads = _resume_run(
            panel, tmp_path, num_workers, 1, k, stride=9
        )
        assert len(head) == k and len(rest) == len(orders[1]) - k, k
        _check(ds, head + rest, orders[1])
        _check(ds, following, orders[2])
        assert sorted(reads) == sorted(i for batch in orders[1][k:] for i in batch), k


@pytest.mark.slow  # starting forkserver / spawn workers takes seconds; the order is the main
# process's either way
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_window_resume_with_workers_of_another_start_method(panel, method):
    def build():
        ds = _shuffled(panel, shuffle_blocks=2)
        loader = make_loader(ds, 10, num_workers=2, stateful=True, multiprocessing_context=method)
        return ds, loader

    ds, loader = build()
    list(loader)
    it = iter(loader)
    head = [next(it) for _ in range(4)]
    state = through_disk(loader.state_dict())
    del it, loader
    ds, loader = build()
    loader.load_state_dict(state)
    sampler = loader.batch_sampler
    batches = [(x, y) for x, y in head + list(loader)]
    assert [len(x) for x, _ in batches] == [len(b) for b in _batches(sampler, 1)]
    for (x, y), indices in zip(batches, _batches(sampler, 1), strict=True):
        expected = collate_windows(ds.__getitems__(indices))
        assert torch.equal(x, expected[0]) and torch.equal(y, expected[1])


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_state_saved_after_a_pass_ran_out_resumes_with_the_next_epoch(
    panel, tmp_path, num_workers
):
    ds, sampler, head, rest, following, reads = _resume_run(
        panel, tmp_path, num_workers, 1, 0, finish=True
    )
    _check(ds, head, _batches(sampler, 1))
    _check(ds, rest, _batches(sampler, 2))
    _check(ds, following, _batches(sampler, 3))


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_pass_begun_after_one_broken_off_resumes_as_the_next_epoch(panel, tmp_path, num_workers):
    log = str(tmp_path / "log")
    _, loader = _build(panel, log, num_workers)
    it = iter(loader)
    [next(it) for _ in range(3)]  # epoch 0, broken off
    it = iter(loader)  # epoch 1 begins; saved before its first batch
    state = through_disk(loader.state_dict())
    del it, loader
    ds, loader = _build(panel, log, num_workers)
    loader.load_state_dict(state)
    sampler = loader.batch_sampler
    _check(ds, list(loader), _batches(sampler, 1))
    _check(ds, list(loader), _batches(sampler, 2))


@pytest.mark.parametrize("persistent", [True, False])
def test_a_plain_loader_gives_a_new_order_every_pass_without_set_epoch(panel, persistent):
    ds = _shuffled(panel, shuffle_blocks=2, seed=1)
    sampler = EpochSampler(ds, batch_size=10, num_workers=2)
    loader = DataLoader(ds, batch_sampler=sampler, num_workers=2, persistent_workers=persistent)
    lookup = {ds[i][0].numpy().tobytes(): i for i in range(len(ds))}
    passes = [[[lookup[x.numpy().tobytes()] for x in xs] for xs, _ in loader] for _ in range(3)]
    assert passes == [_batches(sampler, e) for e in range(3)]
    assert passes[0] != passes[1] != passes[2] != passes[0]
    assert ds.epoch == 2
    sampler.set_epoch(0)  # set_epoch still names the next pass; later passes count on
    assert [list(b) for b in sampler] == passes[0]
    assert [list(b) for b in sampler] == passes[1]


def test_sampler_state_names_epoch_position_and_what_the_order_depends_on(panel):
    ds = _shuffled(panel, seed=-1, rank=1, world_size=2)
    sampler = EpochSampler(ds, batch_size=10)
    assert sampler.state_dict()["epoch"] is None and ds.epoch is None
    list(sampler)
    assert ds.epoch == 0
    it = iter(sampler)
    first = [next(it), next(it), next(it)]
    state = through_disk(sampler.state_dict())
    assert {k: state[k] for k in ("epoch", "position", "rank", "world_size", "num_workers")} == {
        "epoch": 1,
        "position": 3,
        "rank": 1,
        "world_size": 2,
        "num_workers": 0,
    }
    assert state["order"]["seed"] == 2**64 - 1 and state["order"]["order"] == "shuffle"
    assert state["layout"][0] == len(ds)  # windows per epoch
    again = EpochSampler(_shuffled(panel, seed=-1, rank=1, world_size=2), batch_size=10)
    again.load_state_dict(state)
    assert first + list(again) == _batches(sampler, 1)  # rank 1's epoch 1, resumed
    assert list(again) == _batches(sampler, 2)


def test_a_sampler_state_saved_after_a_pass_ran_out_resumes_with_the_next_epoch(panel):
    sampler = EpochSampler(_shuffled(panel, seed=-1, rank=1, world_size=2), batch_size=10)
    list(sampler)
    finished = through_disk(sampler.state_dict())
    fresh = EpochSampler(_shuffled(panel, seed=-1, rank=1, world_size=2), batch_size=10)
    fresh.load_state_dict(finished)
    # a pass that ran out: the next pass is the next epoch, as in an uninterrupted run
    assert [list(b) for b in fresh] == _batches(sampler, 1)
    assert [list(b) for b in fresh] == _batches(sampler, 2)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"seed": 1}, r"saved with order=.*'seed': 2.*this one has order=.*'seed': 1"),
        ({"shuffle_blocks": 3}, r"saved with order=.*'shuffle_blocks': 2.*'shuffle_blocks': 3"),
        ({"stride": 4}, "other windows settings: saved with stride=3, this one stride=4"),
        ({"batch_size": 8}, r"saved with layout=\[.*, 10\], this one has layout=\[.*, 8\]"),
    ],
)
def test_a_state_of_another_order_is_a_clear_error(panel, change, match):
    def sampler(stride=3, batch_size=10, num_workers=0, **kwargs):
        ds = _shuffled(panel, stride=stride, **{"seed": 2, "shuffle_blocks": 2, **kwargs})
        return EpochSampler(ds, batch_size=batch_size, num_workers=num_workers)

    saved = sampler()
    next(iter(saved))
    with pytest.raises(ValueError, match=match):
        sampler(**change).load_state_dict(saved.state_dict())


def test_a_window_loader_state_loads_under_another_number_of_workers(panel, tmp_path):
    _, loader = _build(panel, str(tmp_path / "log"), 2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it, loader
    for workers in (0, 1):  # the rest of the epoch: tests/test_elastic.py checks what it holds
        _, other = _build(panel, str(tmp_path / "log"), workers)
        other.load_state_dict(state)
