"""make_loader keeps torch's DataLoader contract (issue 47; docs/dataloader.md).

Every DataLoader argument a user may pass is run through ``DataLoader`` and ``make_loader`` side
by side on real files (rows, iterable rows, windows; 0 and 2 workers): both deliver the same
values, or make_loader refuses with an error that names the argument and what works.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading

import numpy as np
import pytest
import torch
import torch.utils.data as tud

from tsfile_torch import (
    TsFileDataset,
    TsFileFormatError,
    TsFileIterableDataset,
    TsFileWindowDataset,
    WorkerError,
    make_loader,
    synthetic,
)
from tsfile_torch.data.window_items import collate_windows
from tsfile_torch.integrity.reports import ReadSlots
from tsfile_torch.loader import default_timeout

SPEC = synthetic.DatasetSpec(num_files=1, devices_per_file=1, fields_per_device=3, num_rows=600)
BATCH = 50  # 12 row batches


@pytest.fixture(scope="module")
def rows_dir(tmp_path_factory):
    """1 file x 1 device x 3 DOUBLE fields x 600 rows (read only: shared)."""
    directory = tmp_path_factory.mktemp("contract")
    synthetic.write_table_files(directory, SPEC)
    return directory


@pytest.fixture(scope="module")
def want(rows_dir, expected_rows):
    """Every row of ``rows_dir`` as the datasets hand them out (float32)."""
    return torch.from_numpy(expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32))


def _rows(rows_dir, kind: str = "map", **options):
    make = TsFileDataset if kind == "map" else TsFileIterableDataset
    return make(rows_dir, batch_size=BATCH, **options)


def _windows(rows_dir, **options):
    return TsFileWindowDataset(rows_dir, context_length=8, horizon=2, **options)


def _plain(dataset, num_workers: int, **options):
    """The DataLoader a user would write for ``dataset`` (whole batches: batch_size=None)."""
    options.setdefault("batch_size", None)
    return tud.DataLoader(dataset, num_workers=num_workers, **options)


def _same(got, want) -> None:
    """Assert two lists of batches (tensors, tuples or dicts of them) are equal, exactly."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        if isinstance(b, dict):
            assert a.keys() == b.keys()
            _same(list(a.values()), list(b.values()))
        elif isinstance(b, (tuple, list)):
            _same(list(a), list(b))
        else:
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(torch.nan_to_num(a.detach()), torch.nan_to_num(b.detach()))
            assert a.requires_grad == b.requires_grad


def _split(b):
    return b[:, :-1], b[:, -1]


def _normalize(b):
    return (b - b.mean(0)) / b.std(0)


def _mask(b):
    return torch.where(b > b.median(), torch.nan, b)


#: collate_fns that change the batch (each once broke make_loader's sums or blamed the file)
TRANSFORMS = {
    "x/y split": _split,
    "column subset": lambda b: b[:, [0, 2]],
    "normalize": _normalize,
    "times 2": lambda b: b * 2,
    "half": lambda b: b.half(),
    "long": lambda b: b.long(),
    "NaN mask": _mask,
    "requires grad": lambda b: b.clone().requires_grad_(),
    "dict": lambda b: {"x": b[:, :2], "y": b[:, 2]},
}


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_a_collate_fn_that_changes_the_batch_delivers_what_dataloader_does(
    rows_dir, want, kind, name
):
    fn = TRANSFORMS[name]
    reference = [fn(want[i : i + BATCH]) for i in range(0, len(want), BATCH)]
    _same(list(_plain(_rows(rows_dir, kind), 0, collate_fn=fn)), reference)
    _same(list(make_loader(_rows(rows_dir, kind), collate_fn=fn)), reference)


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_collate_fns_that_change_the_batch_work_in_workers_too(rows_dir, want, kind):
    for name in ("x/y split", "half", "requires grad", "NaN mask"):
        fn = TRANSFORMS[name]
        reference = [fn(want[i : i + BATCH]) for i in range(0, len(want), BATCH)]
        _same(list(_plain(_rows(rows_dir, kind), 2, collate_fn=fn)), reference)
        _same(list(make_loader(_rows(rows_dir, kind), num_workers=2, collate_fn=fn)), reference)


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A file whose values decode plausibly but sum to other than its metadata says."""
    directory = tmp_path_factory.mktemp("damaged")
    synthetic.write_table_files(directory / "src", synthetic.DatasetSpec(1, 1, 4, 30000))
    data = bytearray(next((directory / "src").glob("*.tsfile")).read_bytes())
    data[data.index(b"\x41\x04s1") + 500] ^= 0xFF
    path = directory / "late.tsfile"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_epoch_sums_check_what_the_dataset_made_before_the_users_collate_fn(
    damaged, num_workers, monkeypatch
):
    # the readers' own sums off (a grid too large for memory): the loader sums the epoch. The
    # column the user keeps is sound, the damaged one (s1) is dropped by the collate_fn: the
    # epoch's check still sees the dataset's batches and names the damaged series
    monkeypatch.setattr("tsfile_torch.integrity.checks.MAX_SHARED_CELLS", 1)
    ds = TsFileIterableDataset(damaged, batch_size=5000, block_rows=5000, dtype="float64")
    loader = make_loader(ds, num_workers=num_workers, collate_fn=lambda b: b[:, :1].half())
    with pytest.raises(
        TsFileFormatError, match=r"late\.tsfile: series t\.d0\.s1.*epoch's values sum to"
    ):
        list(loader)


@pytest.mark.parametrize("kind", ["map", "iterable"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_sequential_order_delivers_row_order_whatever_num_workers(
    rows_dir, want, kind, num_workers
):
    got = list(make_loader(_rows(rows_dir, kind), num_workers=num_workers))
    assert torch.equal(torch.cat(got), want)
    if kind == "map":  # DataLoader's SequentialSampler: the same batches in the same order
        _same(got, list(_plain(_rows(rows_dir, kind), num_workers)))


@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_stretches_give_each_worker_a_stretch_of_its_own_delivered_interleaved(
    rows_dir, want, kind
):
    ds = _rows(rows_dir, kind, order="stretches")
    got = list(make_loader(ds, num_workers=2))
    starts = [int(np.flatnonzero((want == b[0]).all(1))[0]) // BATCH for b in got]
    assert starts == [0, 6, 1, 7, 2, 8, 3, 9, 4, 10, 5, 11]  # worker 0: 0-5, worker 1: 6-11
    assert torch.equal(torch.cat(list(make_loader(ds))), want)  # 0 workers: row order


class _Fixed(tud.Sampler):
    """A user's batch sampler: three batches of window indices."""

    batches = [[0, 1], [5], [7, 8, 9]]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def _window_batches(ds, batches):
    """The batches of windows ``batches`` (index lists) as DataLoader collates them."""
    return [collate_windows(ds.__getitems__(b)) for b in batches]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_users_batch_sampler_on_windows_is_honoured(rows_dir, num_workers):
    ds = _windows(rows_dir)
    got = list(make_loader(ds, batch_sampler=_Fixed(), num_workers=num_workers))
    _same(got, _window_batches(ds, _Fixed.batches))
    _same(got, list(tud.DataLoader(ds, batch_sampler=_Fixed(), collate_fn=collate_windows)))
    assert [len(x) for x, _ in got] == [2, 1, 3]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_users_sampler_and_drop_last_on_windows_are_honoured(rows_dir, num_workers, drop_last):
    ds = _windows(rows_dir)

    def weighted():  # oversample the last windows: a common forecasting need
        weights = torch.linspace(0.1, 1.0, len(ds)).tolist()
        return tud.WeightedRandomSampler(weights, 45, generator=torch.Generator().manual_seed(7))

    options = {"batch_size": 8, "drop_last": drop_last}
    got = list(make_loader(ds, sampler=weighted(), num_workers=num_workers, **options))
    plain = tud.DataLoader(ds, sampler=weighted(), collate_fn=collate_windows, **options)
    _same(got, list(plain))
    assert len(got) == (5 if drop_last else 6)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_drop_last_on_windows_in_the_datasets_order_drops_the_short_batch(rows_dir, num_workers):
    ds = _windows(rows_dir)  # 591 windows: 9 batches of 64 and one of 15
    got = list(make_loader(ds, batch_size=64, drop_last=True, num_workers=num_workers))
    plain = tud.DataLoader(ds, batch_size=64, drop_last=True, collate_fn=collate_windows)
    _same(got, list(plain))
    assert len(got) == 9


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_users_sampler_on_rows_is_honoured(rows_dir, num_workers):
    ds = _rows(rows_dir)

    def shuffled():
        return tud.RandomSampler(ds, generator=torch.Generator().manual_seed(3))

    got = list(make_loader(ds, sampler=shuffled(), num_workers=num_workers))
    _same(got, list(_plain(ds, 0, sampler=shuffled())))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_false_and_generator_with_the_sequential_order_change_nothing(
    rows_dir, want, num_workers
):
    got = make_loader(
        _rows(rows_dir), num_workers=num_workers, shuffle=False, generator=torch.Generator()
    )
    assert torch.equal(torch.cat(list(got)), want)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_subset_of_rows_works_with_every_guarantee(rows_dir, want, num_workers):
    ds = _rows(rows_dir)
    subset = tud.Subset(ds, [4, 2, 7])
    loader = make_loader(subset, num_workers=num_workers)
    _same(list(loader), [want[i * BATCH : (i + 1) * BATCH] for i in (4, 2, 7)])
    _same(list(loader), list(_plain(subset, 0)))
    if num_workers:  # the view's worker set-up: timeout, persistent workers
        assert loader.timeout == default_timeout(ds) and loader.persistent_workers


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_random_split_of_windows_works_and_warns_once_about_leaking_the_future(
    rows_dir, num_workers
):
    ds = _windows(rows_dir)
    train, _ = tud.random_split(ds, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match=r"random split .* leaks future values.*split_by_time"):
        loader = make_loader(train, batch_size=32, num_workers=num_workers)
    got = list(loader)
    plain = tud.DataLoader(train, batch_size=32, collate_fn=collate_windows)
    _same(got, list(plain))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per dataset
        make_loader(train, batch_size=32)
        make_loader(tud.Subset(_windows(rows_dir), range(100)), batch_size=32)  # in order


def _init_marker(directory, worker_id: int) -> None:
    (directory / f"init-{worker_id}").write_text(str(os.getpid()))


def test_a_worker_init_fn_runs_although_every_batch_is_kept(rows_dir, tmp_path, caplog):
    ds = _rows(rows_dir, cache="memory")
    loader = make_loader(ds, num_workers=2)
    with caplog.at_level(logging.INFO, logger="tsfile_torch.loader"):
        for _ in range(3):  # the first pass keeps every batch; the others are served here
            assert len(list(loader)) == 12
    kept = [r for r in caplog.records if "served by the main process" in r.getMessage()]
    assert len(kept) == 1  # the decision is logged once
    del loader
    init = functools.partial(_init_marker, tmp_path)
    assert len(list(make_loader(ds, num_workers=2, worker_init_fn=init))) == 12
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init-0", "init-1"]


REFUSED = [
    ("map", {"batch_sampler": _Fixed()}, r"batch_sampler= groups items into batches.*sampler="),
    ("map", {"drop_last": True}, r"drop_last=True at the loader.*build it with drop_last=True"),
    ("map", {"batch_size": 8}, r"set batch_size on the dataset"),
    ("map", {"shuffle": True}, r"shuffle=True belongs to the dataset.*RandomSampler"),
    ("iterable", {"sampler": [0, 1]}, r"sampler= cannot order a TsFileIterableDataset"),
    ("iterable", {"batch_sampler": _Fixed()}, r"batch_sampler= cannot order"),
    ("iterable", {"drop_last": True}, r"drop_last=True at the loader"),
    ("windows", {"batch_sampler": _Fixed(), "batch_size": 2}, r"leave out batch_size"),
    ("windows", {"batch_sampler": _Fixed(), "drop_last": True}, r"leave out drop_last"),
    ("windows", {}, r"batch_size is required.*batch_sampler="),
    ("shuffled", {"generator": torch.Generator()}, r"generator= does not seed.*seed="),
]


@pytest.mark.parametrize("kind, options, match", REFUSED)
def test_what_cannot_be_honoured_is_refused_naming_the_argument_and_what_works(
    rows_dir, kind, options, match
):
    if kind == "windows":
        ds = _windows(rows_dir)
    else:
        ds = _rows(rows_dir, "map" if kind == "shuffled" else kind)
        if kind == "shuffled":
            ds = _rows(rows_dir, order="batches")
    with pytest.raises(ValueError, match=match):
        make_loader(ds, **options)


def test_datasets_make_loader_cannot_serve_are_refused_naming_what_to_do(rows_dir):
    ds = _windows(rows_dir)
    with pytest.raises(TypeError, match=r"ConcatDataset.*one dataset.*MixedWindows"):
        make_loader(tud.ConcatDataset([ds, ds]), batch_size=4)
    with pytest.raises(TypeError, match=r"use torch\.utils\.data\.DataLoader for other"):
        make_loader(list(range(10)))


def test_a_read_in_progress_is_recorded_by_the_thread_doing_it():
    slots = ReadSlots()
    started, finish = threading.Event(), threading.Event()

    def other():
        slots.write(0, "b.tsfile: rows [0, 10)")
        started.set()
        finish.wait()
        slots.write(0, None)

    thread = threading.Thread(target=other)
    slots.write(0, "a.tsfile: rows [5, 9)")
    thread.start()
    started.wait()
    slots.write(0, None)  # this thread's read returned: the other's is still in progress
    assert slots.read_all() == {os.getpid(): "b.tsfile: rows [0, 10)"}
    finish.set()
    thread.join()
    assert slots.read_all() == {}


def _kill_on_third(seen: list, batch):
    seen.append(1)
    if tud.get_worker_info() is not None and tud.get_worker_info().id == 0 and len(seen) == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does
    return batch


def _killed_outside_a_read(directory) -> str:
    ds = TsFileIterableDataset(directory, batch_size=250, block_rows=500)
    loader = make_loader(ds, num_workers=2, collate_fn=functools.partial(_kill_on_third, []))
    with pytest.raises(WorkerError) as info:
        list(loader)
    return str(info.value)


def _assert_not_blamed(message: str) -> None:
    assert "killed by SIGKILL" in message
    assert "out-of-memory killer" in message and "the file is not suspected" in message
    assert "probably damaged" not in message and "verify" not in message


def test_a_worker_killed_in_user_code_is_not_blamed_on_the_file(small_dir):
    _assert_not_blamed(_killed_outside_a_read(small_dir))


@pytest.mark.slow
def test_twenty_workers_killed_in_user_code_blame_no_file(small_dir):
    for _ in range(20):
        _assert_not_blamed(_killed_outside_a_read(small_dir))
