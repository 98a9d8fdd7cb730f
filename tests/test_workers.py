"""Real DataLoader workers: each row once, epochs reaching persistent workers, reader reuse."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_row_arrives_once_across_two_workers(
    small_dir, small_expected, read_backend, shuffle, rows_of
):
    ds = TsFileIterableDataset(
        small_dir, batch_size=600, shuffle=shuffle, read_backend=read_backend
    )
    loader = make_loader(ds, num_workers=2)
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = list(loader)
        values = torch.cat(batches).numpy()
        assert values.shape == small_expected.shape
        order = np.argsort([int(rows_of(b)[0]) for b in batches], kind="stable")
        np.testing.assert_array_equal(
            torch.cat([batches[i] for i in order]).numpy(), small_expected.astype(np.float32)
        )


def test_set_epoch_reaches_persistent_workers(small_dir, small_expected, rows_of):
    ds = TsFileIterableDataset(small_dir, batch_size=250, shuffle=True, seed=7)
    loader = make_loader(ds, num_workers=2)
    for epoch in (0, 1, 5):
        ds.set_epoch(epoch)
        got = [int(rows_of(b)[0]) for b in list(loader)]
        runs = [list(ds.items_for(epoch, worker=w, num_workers=2)) for w in range(2)]
        # the DataLoader takes one batch from each worker in turn
        interleaved = [x for pair in zip(*runs, strict=True) for x in pair]
        assert got == interleaved


def test_map_style_random_windows_follow_set_epoch_in_persistent_workers(
    small_dir, small_expected, rows_of
):
    ds = TsFileDataset(small_dir, batch_size=500, random_batches=4, seed=2)
    loader = make_loader(ds, num_workers=2)
    for epoch in (0, 3):
        ds.set_epoch(epoch)
        got = [int(rows_of(b)[0]) for b in list(loader)]
        assert got == [int(s) for s in ds._windows(epoch)]


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


def test_workers_open_readers_once_and_keep_them_across_epochs(small_dir):
    ds = _Probe(small_dir, batch_size=500, read_backend="mmap")
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


def test_spawn_start_method_works(small_dir, small_expected, rows_of):
    ds = TsFileIterableDataset(small_dir, batch_size=1000, read_backend="mmap")
    next(iter(ds))  # the parent has open readers: they must not travel
    loader = make_loader(ds, num_workers=2, multiprocessing_context="spawn")
    batches = list(loader)
    order = np.argsort([int(rows_of(b)[0]) for b in batches])
    np.testing.assert_array_equal(
        torch.cat([batches[i] for i in order]).numpy(), small_expected.astype(np.float32)
    )
