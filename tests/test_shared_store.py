"""cache="memory" under make_loader's fork workers: one store in anonymous shared memory that the
main process made before they started (Note: shared memory store in tsfile_torch.read.memory)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from tsfile_torch import (
    MixedWindows,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
)
from tsfile_torch.loader import _InMainIterable


def _ds(directory, **kw):
    return TsFileIterableDataset(
        directory, batch_size=700, block_rows=1024, cache="memory", dtype="float64", **kw
    )


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_fork_workers_fill_one_store_the_main_process_serves_later_passes(
    small_dir, small_expected
):
    before = _shm()
    ds = _ds(small_dir)
    loader = make_loader(ds, num_workers=2, multiprocessing_context="fork")
    want = small_expected
    served = []
    for _ in range(3):
        passing = iter(loader)
        served.append(isinstance(passing._inner, _InMainIterable))
        got = torch.cat(list(passing)).numpy()
        assert np.array_equal(np.sort(got[:, 0]), np.sort(want[:, 0]))
        assert np.array_equal(got[np.argsort(got[:, 0])], want[np.argsort(want[:, 0])])
    assert served == [False, True, True]  # the workers' rows are the main process's
    ds.close()  # the persistent workers still hold the store: it stays shared
    assert isinstance(iter(loader)._inner, _InMainIterable)
    store = ds.core.store()
    assert bool(store.filled.all()) and np.array_equal(store.values, want)
    del loader, passing
    assert _shm() <= before  # anonymous: no /dev/shm entry, whatever ends the processes


def test_rows_kept_before_the_workers_start_move_into_the_shared_store(small_dir, small_expected):
    ds = _ds(small_dir)
    assert torch.cat(list(make_loader(ds))).shape == (5000, 18)  # kept in this process
    loader = make_loader(ds, num_workers=2, multiprocessing_context="fork")
    passing = iter(loader)
    assert isinstance(passing._inner, _InMainIterable)  # already whole: no worker reads
    got = torch.cat(list(passing)).numpy()
    want = small_expected
    assert np.array_equal(got[np.argsort(got[:, 0])], want[np.argsort(want[:, 0])])


@pytest.mark.slow  # spawn workers import torch anew (~3 s each)
def test_spawn_workers_keep_a_store_each_and_stay_exact(small_dir, small_expected):
    ds = _ds(small_dir)
    loader = make_loader(ds, num_workers=2, multiprocessing_context="spawn")
    want = small_expected
    for _ in range(2):
        passing = iter(loader)
        assert not isinstance(passing._inner, _InMainIterable)  # nothing shared to serve from
        got = torch.cat(list(passing)).numpy()
        assert np.array_equal(got[np.argsort(got[:, 0])], want[np.argsort(want[:, 0])])


def test_fork_workers_of_a_memory_cached_mixture_decode_it_not_the_main_process(ragged_panel):
    """A mixture's workers fill their datasets' shared stores before they hand windows over by
    reference (Note: hand-over): the main process only gathers, it decodes nothing."""

    def mix(cache):
        parts = [
            TsFileWindowDataset(ragged_panel, 24, 8, stride=4, devices=[d], cache=cache)
            for d in ("meters.s0", "meters.s1")
        ]
        return MixedWindows(parts, [1.0, 2.0], num_samples=200, seed=5)

    want = list(make_loader(mix("none"), batch_size=32, num_workers=2))
    ds = mix("memory")
    loader = make_loader(ds, batch_size=32, num_workers=2, multiprocessing_context="fork")
    got = list(loader)
    assert [d.core.reader.decoded_rows for d in ds.datasets] == [0, 0]  # nothing decoded here
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
        np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())
    assert all(bool(d.core.store().filled.all()) for d in ds.datasets)
