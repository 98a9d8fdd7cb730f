"""make_loader(pin_memory=True): without an accelerator one warning and unpinned batches (as
torch's DataLoader), with one every batch pinned (ring and kept batches included). The
accelerator tests run where torch sees CUDA: ``pytest tests/test_pin_memory.py``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from tsfile_torch import (
    TsFileDataset,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)

CONTEXT, HORIZON, WINDOWS_PER_BATCH = 8, 4, 16
no_accelerator = pytest.mark.skipif(torch.cuda.is_available(), reason="an accelerator is here")
accelerator = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA accelerator")


@pytest.fixture(scope="module")
def panel_dir(tmp_path_factory):
    """Devices meters.s0 (200 rows) and meters.s1 (150), fields f0, f1, across two files."""
    directory = tmp_path_factory.mktemp("panel")
    synthetic.write_panel(directory, num_devices=2, num_fields=2, num_rows=[200, 150], num_files=2)
    return directory


def _rows(source, kind, cache: str, cache_dir=None):
    return kind(source, batch_size=1024, cache=cache, cache_dir=cache_dir, return_timestamps=True)


def _windows(source, cache: str):
    return TsFileWindowDataset(source, CONTEXT, HORIZON, stride=3, cache=cache)


def _expected_windows(ds) -> tuple[np.ndarray, np.ndarray]:
    """Return every window's ``(x, y)`` in order, computed from the panel's values."""
    xs, ys = [], []
    for i in range(len(ds)):
        info = ds.window_info(i)
        d = int(info.device.rsplit(".s", 1)[1])
        rows = np.arange(info.start_row, info.start_row + CONTEXT + HORIZON)
        both = np.stack([synthetic.value_of(d, j, rows) for j in range(2)], axis=1)
        xs.append(both[:CONTEXT])
        ys.append(both[CONTEXT:])
    return np.stack(xs).astype(np.float32), np.stack(ys).astype(np.float32)


def _leaves(batch) -> list[torch.Tensor]:
    return list(batch) if isinstance(batch, (tuple, list)) else [batch]


def _epochs(loader, epochs: int = 2) -> list[list]:
    return [list(loader) for _ in range(epochs)]


def _check_rows(passes, expected: np.ndarray, pinned: bool) -> None:
    """Each pass: every row once, exact (workers deliver their shares in turn: sorted by the
    batches' timestamps, which are the row numbers), and every tensor pinned or not."""
    for batches in passes:
        assert all(t.is_pinned() == pinned for b in batches for t in _leaves(b))
        batches = sorted(batches, key=lambda b: int(b[1][0]))
        np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), np.arange(5000))
        values = torch.cat([v for v, _ in batches]).numpy()
        np.testing.assert_array_equal(values, expected.astype(np.float32))


def _check_windows(passes, ds, pinned: bool) -> None:
    """Each pass: every window once, exact (in the order its batches came: compared sorted),
    and every tensor pinned or not."""
    x, y = _expected_windows(ds)
    expected = _sorted_windows(x, y)
    for batches in passes:
        assert all(t.is_pinned() == pinned for b in batches for t in _leaves(b))
        got = _sorted_windows(*(torch.cat([b[k] for b in batches]).numpy() for k in (0, 1)))
        np.testing.assert_array_equal(got, expected)


def _sorted_windows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    flat = np.concatenate([x.reshape(len(x), -1), y.reshape(len(y), -1)], axis=1)
    return flat[np.lexsort(flat.T[::-1])]


def _pin_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "pin_memory" in str(w.message)]


@no_accelerator
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("cache", ["none", "memory"])
@pytest.mark.parametrize("kind", [TsFileIterableDataset, TsFileDataset])
def test_rows_without_an_accelerator_warn_once_and_arrive_unpinned(
    small_dir, small_expected, num_workers, cache, kind
):
    ds = _rows(small_dir, kind, cache)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(ds, num_workers=num_workers, pin_memory=True)
        passes = _epochs(loader)  # the second of a kept cache: served in the main process
    assert _pin_warnings(caught) == [
        "pin_memory=True but no accelerator is found (or it cannot pin, as MPS): batches are "
        "not pinned"
    ]
    assert caught[0].filename == __file__  # the warning points at the make_loader call
    assert loader.pin_memory is False
    _check_rows(passes, small_expected, pinned=False)


@no_accelerator
@pytest.mark.parametrize("num_workers", [0, 2])
def test_windows_without_an_accelerator_warn_once_and_arrive_unpinned(panel_dir, num_workers):
    ds = _windows(panel_dir, "none")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(
            ds, batch_size=WINDOWS_PER_BATCH, num_workers=num_workers, pin_memory=True
        )
        passes = _epochs(loader)
    assert len(_pin_warnings(caught)) == 1
    _check_windows(passes, ds, pinned=False)


@no_accelerator
def test_pin_memory_left_out_pins_nothing_and_says_nothing(small_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(TsFileIterableDataset(small_dir, batch_size=1024), num_workers=2)
        list(loader)
    assert loader.pin_memory is False and _pin_warnings(caught) == []


def test_pin_memory_must_be_a_bool(small_dir):
    ds = TsFileIterableDataset(small_dir, batch_size=1024)
    with pytest.raises(TypeError, match="pin_memory should be True or False, but got"):
        make_loader(ds, pin_memory="yes")


@accelerator
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("cache", ["none", "memory", "disk"])
@pytest.mark.parametrize("kind", [TsFileIterableDataset, TsFileDataset])
def test_rows_with_an_accelerator_arrive_pinned(
    small_dir, small_expected, tmp_path, num_workers, cache, kind
):
    # 2 workers: ring batches (none), kept batches and kept passes (memory, disk)
    ds = _rows(small_dir, kind, cache, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(ds, num_workers=num_workers, pin_memory=True)
        passes = _epochs(loader)
    assert loader.pin_memory is True and _pin_warnings(caught) == []
    _check_rows(passes, small_expected, pinned=True)
    assert make_loader(ds, num_workers=num_workers).pin_memory is True  # the default


@accelerator
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("cache", ["none", "memory"])
def test_windows_with_an_accelerator_arrive_pinned(panel_dir, num_workers, cache):
    ds = _windows(panel_dir, cache)
    loader = make_loader(ds, batch_size=WINDOWS_PER_BATCH, num_workers=num_workers)
    _check_windows(_epochs(loader), ds, pinned=True)
