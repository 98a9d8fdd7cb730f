"""Contracts every dataset kind and order keeps: resume anywhere, passes, DDP sharding.

- Resume (torchdata's contract): for every position ``k`` of an epoch, a state saved after ``k``
  batches, loaded into a freshly built dataset and loader, delivers exactly the rest of the
  uninterrupted epoch (values and timestamps), then the uninterrupted next epoch.
- A pass owns its position: other passes over the same dataset never move it.
- DDP: every rank gets the same number of windows, the ranks together every window.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from resume_support import through_disk

from tsfile_torch import (
    TsFileDataset,
    TsFileIterableDataset,
    TsFileTorchError,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)

pytest.importorskip("torchdata")

NUM_ROWS = 2700  # rows of the row data: 6 batches of 450
PANEL_ROWS = [120, 90, 61]  # rows per device of the window panel: 82 windows, 9 batches of 10


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory):
    """1 file x 1 device x 2 DOUBLE fields x 2,700 rows; row r has timestamp r."""
    directory = tmp_path_factory.mktemp("rows")
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=2, num_rows=NUM_ROWS
    )
    synthetic.write_table_files(directory, spec)
    return directory


@pytest.fixture(scope="module")
def panel_dir(tmp_path_factory):
    """3 devices x 2 fields, PANEL_ROWS rows each, every series continued over 2 files."""
    directory = tmp_path_factory.mktemp("panel")
    synthetic.write_panel(directory, num_devices=3, num_fields=2, num_rows=PANEL_ROWS, num_files=2)
    return directory


ROW_ORDERS = {
    "sequential": {},
    "batches": {"order": "batches"},
    "shuffle": {"shuffle": True, "shuffle_blocks": 2},  # blocks of 600 rows, 2 a buffer
    "random": {"random_batches": 5},
}
WINDOW_ORDERS = {
    "sequential": {},
    "shuffle": {"shuffle": True, "shuffle_blocks": 2},  # blocks of 16 rows, 2 a buffer
    "batches": {"order": "batches"},
    "random": {"order": "random", "num_samples": 40},
}
CASES = [(kind, order) for kind in ("iterable", "map") for order in ROW_ORDERS] + [
    ("window", order) for order in WINDOW_ORDERS
]


def _build(kind: str, order: str, data, num_workers: int):
    """Return a fresh dataset and StatefulDataLoader of ``kind`` in ``order``.

    ``validate=False``: the files are checked elsewhere, and a validation child per rebuild
    would dominate the run.
    """
    if kind == "window":
        ds = TsFileWindowDataset(
            data,
            context_length=8,
            horizon=2,
            stride=3,
            seed=-4,
            block_rows=16,
            return_timestamps=True,
            validate=False,
            **WINDOW_ORDERS[order],
        )
        return ds, make_loader(ds, batch_size=10, num_workers=num_workers, stateful=True)
    cls = TsFileIterableDataset if kind == "iterable" else TsFileDataset
    ds = cls(
        data,
        batch_size=450,
        seed=7,
        block_rows=600,
        return_timestamps=True,
        validate=False,
        **ROW_ORDERS[order],
    )
    return ds, make_loader(ds, num_workers=num_workers, stateful=True)


def _check_rows(batches) -> np.ndarray:
    """Check each row batch holds its timestamps' rows exactly; return every timestamp."""
    for values, times in batches:
        rows = times.numpy()  # row r has timestamp r
        expected = np.stack([synthetic.value_of(0, j, rows) for j in range(2)], axis=1)
        np.testing.assert_array_equal(values.numpy(), expected.astype(np.float32))
    return np.concatenate([times.numpy() for _, times in batches])


def _check_windows(batches) -> list[tuple[int, int]]:
    """Check each window holds its device's rows exactly; return (device, start row) of each."""
    out = []
    for x, y, tx, ty in batches:
        values = torch.cat([x, y], dim=1).numpy()
        times = torch.cat([tx, ty], dim=1).numpy()
        for window, stamps in zip(values, times, strict=True):
            d = int(window[0, 0]) // 64  # value_of(d, j, r) has integer part 64 * d + j
            start = (int(stamps[0]) - d) // (d % 3 + 1)  # panel_device_times inverted
            rows = np.arange(start, start + 10)
            np.testing.assert_array_equal(stamps, synthetic.panel_device_times(d, rows))
            expected = np.stack([synthetic.value_of(d, j, rows) for j in range(2)], axis=1)
            np.testing.assert_array_equal(window, expected.astype(np.float32))
            out.append((d, start))
    return out


def _check_epoch(kind: str, order: str, batches) -> None:
    """Check an uninterrupted epoch: exact values, and (but for random) every item once."""
    if kind == "window":
        seen = _check_windows(batches)
        if order != "random":
            every = [(d, r) for d, n in enumerate(PANEL_ROWS) for r in range(0, n - 9, 3)]
            assert sorted(seen) == every
    else:
        times = _check_rows(batches)
        if order != "random":
            assert sorted(times.tolist()) == list(range(NUM_ROWS))


def _assert_same(got: list, expected: list, what: str) -> None:
    """The same batches: every tensor equal, values and timestamps."""
    assert len(got) == len(expected), f"{what}: {len(got)} batches, not {len(expected)}"
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y), f"{what}: batch {i} differs"


def _contract(kind: str, order: str, data, num_workers: int) -> None:
    _, loader = _build(kind, order, data, num_workers)
    epoch0 = list(loader)
    between = through_disk(loader.state_dict())  # epoch 0 done, epoch 1 not begun
    it = iter(loader)
    states = [through_disk(loader.state_dict())]  # states[k]: saved after k batches
    epoch1 = []
    for batch in it:
        epoch1.append(batch)
        states.append(through_disk(loader.state_dict()))
    epoch2 = list(loader)
    for epoch in (epoch0, epoch1, epoch2):
        _check_epoch(kind, order, epoch)
    if order != "sequential":
        assert [b[-1].tolist() for b in epoch0] != [b[-1].tolist() for b in epoch1]
    saved = [("between epochs 0 and 1", 0, between)]
    saved += [(f"after {k} batches of epoch 1", k, state) for k, state in enumerate(states)]
    for what, k, state in saved:
        _, fresh = _build(kind, order, data, num_workers)
        fresh.load_state_dict(state)
        _assert_same(list(fresh), epoch1[k:], f"resumed from the state saved {what}")
        # the next pass is the next epoch
        _assert_same(list(fresh), epoch2, f"epoch 2 after the state saved {what}")


@pytest.mark.parametrize("kind, order", CASES)
def test_resume_after_any_batch_gives_the_rest_of_the_uninterrupted_epoch(
    rows_dir, panel_dir, kind, order
):
    _contract(kind, order, panel_dir if kind == "window" else rows_dir, num_workers=0)


@pytest.mark.slow  # 2 workers forked for each of ~10 resumed loaders: ~1 s a case
@pytest.mark.parametrize("kind, order", CASES)
def test_resume_after_any_batch_with_two_workers_gives_the_rest_of_the_epoch(
    rows_dir, panel_dir, kind, order
):
    _contract(kind, order, panel_dir if kind == "window" else rows_dir, num_workers=2)


# -- a pass owns its position -----------------------------------------------------------------
def _batch_rows(ds, epoch: int, num_workers: int = 1) -> list[list[int]]:
    """Rows of each batch of ``epoch`` with ``order="batches"`` as a loader delivers them.

    Workers yield their runs (``items_for``) and the loader takes one batch of each in turn.
    """
    runs = [ds.items_for(epoch, w, num_workers) for w in range(num_workers)]
    batches = [r[i] for i in range(max(map(len, runs))) for r in runs if i < len(r)]
    bs = ds.batch_size
    return [list(range(int(b[0]) * bs, min((int(b[0]) + 1) * bs, NUM_ROWS))) for b in batches]


def test_a_pass_inside_a_running_loop_leaves_the_loop_its_epoch(rows_dir):
    ds = TsFileIterableDataset(
        rows_dir, batch_size=450, order="batches", seed=3, return_timestamps=True
    )
    got = []
    for _, times in make_loader(ds):
        inner_values, _ = next(iter(ds))  # another pass: the next epoch
        assert inner_values.shape == (450, 2)
        got.append(times.tolist())
    _check_rows([(v, t) for v, t in make_loader(ds)])  # still reads right afterwards
    assert len(got) == len(ds) == 6
    assert got == _batch_rows(ds, 0)
    assert _batch_rows(ds, 0) != _batch_rows(ds, 1)


@pytest.mark.parametrize("cls", [TsFileIterableDataset, TsFileDataset])
def test_two_loaders_stepped_alternately_each_get_a_whole_epoch(rows_dir, cls):
    ds = cls(rows_dir, batch_size=450, order="batches", seed=3, return_timestamps=True)
    twin = TsFileIterableDataset(rows_dir, batch_size=450, order="batches", seed=3)
    first, second = iter(make_loader(ds)), iter(make_loader(ds))
    a, b = [], []
    for batch_a, batch_b in zip(first, second, strict=True):  # one batch of each in turn
        a.append(batch_a)
        b.append(batch_b)
    for batches in (a, b):
        _check_rows(batches)
    # the first loader's pass began first: epoch 0; the second's is epoch 1
    assert [t.tolist() for _, t in a] == _batch_rows(twin, 0)
    assert [t.tolist() for _, t in b] == _batch_rows(twin, 1)


@pytest.mark.parametrize("cls", [TsFileIterableDataset, TsFileDataset])
def test_a_second_loader_with_workers_mid_epoch_is_refused_and_the_first_goes_on(rows_dir, cls):
    ds = cls(rows_dir, batch_size=450, order="batches", seed=3, return_timestamps=True)
    twin = TsFileIterableDataset(rows_dir, batch_size=450, order="batches", seed=3)
    first = make_loader(ds, num_workers=2)
    it = iter(first)
    got = [next(it), next(it)]
    for workers in (2, 0):
        with pytest.raises(TsFileTorchError, match="already being iterated by another loader"):
            iter(make_loader(ds, num_workers=workers))
    got += list(it)
    _check_rows(got)
    assert [t.tolist() for _, t in got] == _batch_rows(twin, 0, num_workers=2)
    # once the first is done, a second loader iterates: the next epoch
    again = list(make_loader(ds, num_workers=2))
    assert [t.tolist() for _, t in again] == _batch_rows(twin, 1, num_workers=2)


# -- DDP sharding of windows --------------------------------------------------------------------
DDP_ROWS = [200, 150, 101, 80]  # with context_length 6: 195 + 145 + 96 + 75 = 511 windows


@pytest.fixture(scope="module")
def ddp_panel(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ddp-panel")
    synthetic.write_panel(directory, num_devices=4, num_fields=3, num_rows=DDP_ROWS, num_files=2)
    return directory


def _window_indices(ds: TsFileWindowDataset, batches) -> list[int]:
    """Check every window's values exactly; return the window numbers, in delivered order."""
    counts = ds.window_counts()
    offsets = np.cumsum([0] + [counts[d] for d in ds.devices])
    out = []
    for x, tx in batches:
        for window, stamps in zip(x.numpy(), tx.numpy(), strict=True):
            d = int(window[0, 0]) // 64  # value_of(d, j, r) has integer part 64 * d + j
            start = (int(stamps[0]) - d) // (d % 3 + 1)  # panel_device_times inverted
            rows = np.arange(start, start + ds.context_length)
            np.testing.assert_array_equal(stamps, synthetic.panel_device_times(d, rows))
            expected = np.stack([synthetic.value_of(d, j, rows) for j in range(3)], axis=1)
            np.testing.assert_array_equal(window, expected.astype(np.float32))
            assert ds.devices[d] == f"meters.s{d}"
            out.append(int(offsets[d]) + start // ds.stride)
    return out


def _ranks(data, context_length: int, batch_size: int, **kwargs) -> list[list[list[int]]]:
    """Windows of epochs 0 and 1 on ranks 0 and 1 (2 workers each): ``[rank][epoch]``."""
    out = []
    for rank in (0, 1):
        ds = TsFileWindowDataset(
            data,
            context_length,
            rank=rank,
            world_size=2,
            shuffle=True,
            seed=5,
            block_rows=32,
            return_timestamps=True,
            **kwargs,
        )
        loader = make_loader(ds, batch_size=batch_size, num_workers=2)
        epochs = []
        for _ in range(2):
            batches = list(loader)
            assert len(batches) == len(loader)
            epochs.append(_window_indices(ds, batches))
        out.append(epochs)
    return out


def test_ddp_ranks_split_shuffled_windows_into_equal_halves(ddp_panel):
    total = sum(n - 5 for n in DDP_ROWS)  # 511
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 1 window of 511 repeated: no padding warning
        per_rank = _ranks(ddp_panel, 6, 15)
    for epoch in (0, 1):
        runs = [per_rank[r][epoch] for r in (0, 1)]
        assert [len(r) for r in runs] == [256, 256]  # ceil(511 / 2): one window repeated
        assert set(runs[0] + runs[1]) == set(range(total))
    for r in (0, 1):
        assert per_rank[r][0] != per_rank[r][1]  # a new order each epoch


def test_ddp_ranks_with_drop_last_get_equal_disjoint_shares(ddp_panel):
    per_rank = _ranks(ddp_panel, 6, 15, drop_last=True)  # 255 a rank: 17 batches of 15
    for epoch in (0, 1):
        runs = [per_rank[r][epoch] for r in (0, 1)]
        assert [len(r) for r in runs] == [255, 255]
        both = runs[0] + runs[1]
        assert len(set(both)) == 510 and set(both) <= set(range(511))  # one window left out
    for r in (0, 1):
        assert per_rank[r][0] != per_rank[r][1]


def test_ddp_ranks_get_halves_of_a_panel_with_fewer_blocks_than_ranks(tmp_path):
    # one device of 30 rows: one block of windows for 2 ranks; 27 windows of 4 rows
    synthetic.write_panel(tmp_path, num_devices=1, num_fields=3, num_rows=30, num_files=1)
    per_rank = _ranks(tmp_path, 4, 4)
    for epoch in (0, 1):
        runs = [per_rank[r][epoch] for r in (0, 1)]
        assert [len(r) for r in runs] == [14, 14]  # ceil(27 / 2)
        assert set(runs[0] + runs[1]) == set(range(27))
    for r in (0, 1):
        assert per_rank[r][0] != per_rank[r][1]


# -- set-ups that cannot be sharded well --------------------------------------------------------
def test_drop_last_that_leaves_every_rank_nothing_is_a_value_error(tmp_path, rows_dir):
    synthetic.write_panel(tmp_path, num_devices=1, num_fields=1, num_rows=6, num_files=1)
    match = "cannot be shared by 4 ranks with drop_last=True"
    with pytest.raises(ValueError, match=match):  # 3 windows, 4 ranks
        TsFileWindowDataset(tmp_path, 4, rank=0, world_size=4, drop_last=True)
    with pytest.raises(ValueError, match=match):  # 3 batches of 1000 rows, 4 ranks
        TsFileIterableDataset(rows_dir, batch_size=1000, rank=3, world_size=4, drop_last=True)
    with pytest.raises(ValueError, match=match):
        TsFileDataset(rows_dir, batch_size=1000, rank=0, world_size=4, drop_last=True)


def test_padding_above_five_percent_warns(tmp_path, rows_dir):
    synthetic.write_panel(tmp_path, num_devices=1, num_fields=1, num_rows=6, num_files=1)
    with pytest.warns(UserWarning, match=r"1 are repeated .*\(33%\); drop_last=True trims"):
        ds = TsFileWindowDataset(tmp_path, 4, rank=1, world_size=2)  # 3 windows, 2 ranks
    assert len(list(make_loader(ds, batch_size=2))) == 1
    with pytest.warns(UserWarning, match=r"1 are repeated"):  # 3 batches of 1000 rows
        TsFileIterableDataset(rows_dir, batch_size=1000, rank=0, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 6 batches over 2 ranks: nothing repeated
        TsFileIterableDataset(rows_dir, batch_size=450, rank=0, world_size=2)
