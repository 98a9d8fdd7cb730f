"""Real DataLoader workers: each row once, epochs reaching persistent workers, reader reuse."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tsfile_torch import (
    EpochSampler,
    TsFileDataset,
    TsFileIterableDataset,
    make_loader,
    synthetic,
)


@pytest.mark.other_backends_slow
@pytest.mark.parametrize("order", ["sequential", "batches", "shuffle"])
def test_each_row_arrives_once_across_two_workers(small_dir, small_expected, read_backend, order):
    ds = TsFileIterableDataset(
        small_dir, batch_size=600, order=order, read_backend=read_backend, return_timestamps=True
    )
    loader = make_loader(ds, num_workers=2)
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(ds) == 9
        values = torch.cat([v for v, _ in batches]).numpy()
        times = torch.cat([t for _, t in batches]).numpy()  # row r has timestamp r
        assert values.shape == small_expected.shape
        assert sorted(times) == list(range(5000))  # each row once
        np.testing.assert_array_equal(values, small_expected[times].astype(np.float32))


def _interleave(runs: list[list]) -> list:
    """The DataLoader's order over its workers: one batch from each worker in turn."""
    return [r[i] for i in range(max(map(len, runs))) for r in runs if i < len(r)]


@pytest.mark.parametrize("order", ["batches", "shuffle"])
def test_set_epoch_reaches_persistent_workers(small_dir, order):
    ds = TsFileIterableDataset(
        small_dir, batch_size=250, order=order, seed=7, return_timestamps=True
    )
    loader = make_loader(ds, num_workers=2)
    for epoch in (0, 1, 5):
        ds.set_epoch(epoch)
        got = [t.tolist() for _, t in loader]  # row r has timestamp r
        runs = [list(ds.items_for(epoch, worker=w, num_workers=2)) for w in range(2)]
        if order == "batches":  # an item is a batch number
            rows = [list(range(b[0] * 250, (b[0] + 1) * 250)) for b in _interleave(runs)]
        else:  # an item is a row; rows inside a batch come in time order
            rows = [sorted(b.tolist()) for b in _interleave(runs)]
        assert got == rows
        assert ds.epoch == epoch


def test_map_style_random_windows_follow_set_epoch_in_persistent_workers(
    small_dir, small_expected, rows_of
):
    ds = TsFileDataset(small_dir, batch_size=500, random_batches=4, seed=2)
    probe = TsFileDataset(small_dir, batch_size=500, random_batches=4, seed=2)
    loader = make_loader(ds, num_workers=2)
    sampler = EpochSampler(probe, None, num_workers=2)  # the order make_loader delivers
    seen = []
    for epoch in (0, 3):
        ds.set_epoch(epoch)
        batches = list(loader)
        got = [int(rows_of(b)[0]) for b in batches]
        assert got == [int(items[0]) for items in sampler.batches(epoch)]
        probe.set_epoch(epoch)  # probe[i]: the i-th random window of the current epoch
        assert sorted(got) == sorted(int(rows_of(probe[i])[0]) for i in range(4))
        for batch, start in zip(batches, got, strict=True):
            np.testing.assert_array_equal(
                batch.numpy(), small_expected[start : start + 500].astype(np.float32)
            )
        seen.append(got)
    assert seen[0] != seen[1]


class _Probe(TsFileIterableDataset):
    """Yields, with each batch, what the worker's reader looks like right now."""

    def __iter__(self):
        for batch in super().__iter__():
            reader = self.reader
            maps = open("/proc/self/maps").read().splitlines()
            mapped = [sum(line.endswith(info.name) for line in maps) for info in self.catalog.files]
            yield {
                "batch": batch,
                "pid": os.getpid(),
                "reader": id(reader),
                "opens": reader.open_count,
                "mapped": mapped,
            }


@pytest.fixture
def unshared_dir(tmp_path):
    """Files no other test reads: a forked worker inherits the parent's mappings, and a dataset
    an earlier test dropped can keep its files mapped there until the garbage collector runs."""
    synthetic.write_table_files(tmp_path, synthetic.DatasetSpec(3, 2, 3, 5000))
    return tmp_path


def test_workers_open_readers_once_and_keep_them_across_epochs(unshared_dir):
    ds = _Probe(unshared_dir, batch_size=500, read_backend="mmap")
    loader = make_loader(ds, num_workers=2)
    seen = {}
    for epoch in range(3):
        ds.set_epoch(epoch)
        for item in loader:
            pid = int(item["pid"])
            state = (int(item["reader"]), int(item["opens"]))
            seen.setdefault(pid, set()).add(state)
            assert item["mapped"] == [1, 1, 1]  # each file mapped once, never twice
    assert len(seen) == 2 and os.getpid() not in seen
    for states in seen.values():
        assert states == {next(iter(states))}  # same reader, no new open, every epoch
        assert next(iter(states))[1] == 3


def test_in_process_reader_is_kept_across_epochs(small_dir):
    ds = TsFileIterableDataset(small_dir, batch_size=1000, read_backend="mmap")
    list(ds)
    reader, opens = ds.reader, ds.reader.open_count
    for _ in range(2):
        list(ds)
    assert ds.reader is reader and reader.open_count == opens == 3


@pytest.mark.slow  # spawned workers
def test_spawn_start_method_works(small_dir, small_expected, rows_of):
    ds = TsFileIterableDataset(small_dir, batch_size=1000, read_backend="mmap")
    next(iter(ds))  # the parent has open readers: they must not travel
    loader = make_loader(ds, num_workers=2, multiprocessing_context="spawn")
    batches = list(loader)
    order = np.argsort([int(rows_of(b)[0]) for b in batches])
    np.testing.assert_array_equal(
        torch.cat([batches[i] for i in order]).numpy(), small_expected.astype(np.float32)
    )
