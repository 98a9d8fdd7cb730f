"""on_damaged="skip": damaged files are left out at build with one warning (rows and windows);
damage found while reading still raises, naming the file and the fix (Note: damaged files at
build)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tsfile_torch import (
    ReadOptions,
    TsFileDataset,
    TsFileFormatError,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)
from tsfile_torch.cli import main

SPEC = synthetic.DatasetSpec(num_files=3, devices_per_file=1, fields_per_device=4, num_rows=30000)
CONTEXT, STRIDE = 8, 1000


pytestmark = pytest.mark.usefixtures("private_cache")  # a verified-files cache per test


@pytest.fixture
def data(tmp_path) -> Path:
    synthetic.write_table_files(tmp_path / "data", SPEC)
    return tmp_path / "data"


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _expected(files: list[int]) -> np.ndarray:
    rows = np.arange(SPEC.num_rows)
    cols = [synthetic.value_of(f, c, rows) for f in files for c in range(4)]
    return np.stack(cols, axis=1)


def _all_rows(ds: TsFileDataset) -> np.ndarray:
    return np.concatenate([ds[i].numpy() for i in range(len(ds))])


def _check_windows(ds: TsFileWindowDataset, files: list[int]) -> None:
    assert ds.devices == [f"t.d{f}" for f in files]
    assert len(ds) == len(files) * ((SPEC.num_rows - CONTEXT) // STRIDE + 1)
    for i in range(len(ds)):
        info = ds.window_info(i)
        f = int(info.device.rsplit("d", 1)[1])
        rows = np.arange(info.start_row, info.start_row + CONTEXT)
        want = np.stack([synthetic.value_of(f, c, rows) for c in range(4)], axis=1)
        np.testing.assert_array_equal(ds[i].numpy(), want)


def _build_skipping(make):
    """Build with ``make()``; return the dataset and the skip warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = make()
    return ds, [w for w in caught if "on_damaged='skip'" in str(w.message)]


def test_on_damaged_takes_raise_or_skip():
    assert ReadOptions().on_damaged == "raise"
    with pytest.raises(ValueError, match="on_damaged must be one of 'raise', 'skip'; got 'ignore'"):
        ReadOptions(on_damaged="ignore")


def test_by_default_a_damaged_file_fails_the_build_naming_it(data):
    _truncate(data / "part001.tsfile")
    with pytest.raises(TsFileFormatError, match=r"part001\.tsfile"):
        TsFileDataset(data, batch_size=5000)


def test_skip_leaves_a_file_failing_validation_out_of_the_rows_with_one_warning(data):
    _truncate(data / "part001.tsfile")
    ds, warned = _build_skipping(
        lambda: TsFileDataset(data, batch_size=5000, dtype=torch.float64, on_damaged="skip")
    )
    assert len(warned) == 1 and "left out 1 of 3 files" in str(warned[0].message)
    [(name, reason)] = ds.skipped
    assert name == str(data / "part001.tsfile") and "TsFile" in reason
    assert ds.columns == [f"t.d{f}.s{c}" for f in (0, 2) for c in range(4)]
    np.testing.assert_array_equal(_all_rows(ds), _expected([0, 2]))


def test_skip_leaves_a_file_failing_validation_out_of_the_windows(data):
    _truncate(data / "part001.tsfile")
    ds, warned = _build_skipping(
        lambda: TsFileWindowDataset(
            data, CONTEXT, stride=STRIDE, dtype=torch.float64, on_damaged="skip"
        )
    )
    assert len(warned) == 1 and [n for n, _ in ds.skipped] == [str(data / "part001.tsfile")]
    _check_windows(ds, [0, 2])


def test_skip_leaves_out_a_file_that_differs_from_its_manifest(data, flip_value_byte):
    main(["manifest", str(data)])
    # passes validation, then reads as wrong values
    flip_value_byte(data / "part001.tsfile", "s1", 80000)
    ds, warned = _build_skipping(
        lambda: TsFileDataset(data, batch_size=5000, dtype=torch.float64, on_damaged="skip")
    )
    assert len(warned) == 1
    [(name, reason)] = ds.skipped
    assert name.endswith("part001.tsfile") and reason.startswith("content differs from the manif")
    np.testing.assert_array_equal(_all_rows(ds), _expected([0, 2]))


# with workers: slow because torch's DataLoader takes 10 s to shut down workers after one raised
# (their result pipes are full), whatever the dataset
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_damage_found_while_reading_rows_raises_and_a_rebuild_with_skip_leaves_it_out(
    data, workers, flip_value_byte
):
    # passes validation; rows [0, 5000) are wrong
    flip_value_byte(data / "part001.tsfile", "s3", 500)
    ds = TsFileDataset(data, batch_size=5000, dtype=torch.float64, on_damaged="skip")
    assert ds.skipped == []
    with pytest.raises(TsFileFormatError, match=r"part001\.tsfile: .*on_damaged='skip'"):
        for _ in make_loader(ds, num_workers=workers):  # a worker remembers it as well
            pass
    again, warned = _build_skipping(
        lambda: TsFileDataset(data, batch_size=5000, dtype=torch.float64, on_damaged="skip")
    )
    assert len(warned) == 1
    [(name, reason)] = again.skipped
    assert name.endswith("part001.tsfile") and "an earlier read found it damaged" in reason
    np.testing.assert_array_equal(_all_rows(again), _expected([0, 2]))


def test_damage_found_while_reading_windows_raises_and_a_rebuild_with_skip_leaves_it_out(
    data, flip_value_byte
):
    flip_value_byte(data / "part001.tsfile", "s3", 500)
    make = lambda: TsFileWindowDataset(  # noqa: E731
        data, CONTEXT, stride=STRIDE, dtype=torch.float64, on_damaged="skip"
    )
    ds = make()
    first_of_d1 = ds.devices.index("t.d1") * ((SPEC.num_rows - CONTEXT) // STRIDE + 1)
    for i in range(first_of_d1):  # device t.d0 is read ...
        ds[i]
    with pytest.raises(TsFileFormatError, match=r"part001\.tsfile: .*on_damaged='skip'"):
        ds[first_of_d1]  # ... then t.d1, mid-epoch
    again, warned = _build_skipping(make)
    assert len(warned) == 1 and [n for n, _ in again.skipped] == [str(data / "part001.tsfile")]
    _check_windows(again, [0, 2])


def test_with_raise_a_file_found_damaged_by_a_read_is_read_again_and_raises_again(
    data, flip_value_byte
):
    flip_value_byte(data / "part001.tsfile", "s3", 500)
    for _ in range(2):
        ds = TsFileDataset(data, batch_size=5000, dtype=torch.float64)
        with pytest.raises(TsFileFormatError, match=r"part001\.tsfile: series t\.d1\.s3"):
            ds[0]


def test_skip_with_every_file_damaged_is_an_error(data):
    for f in range(SPEC.num_files):
        _truncate(data / f"part{f:03d}.tsfile")
    with pytest.raises(TsFileFormatError, match=r"every file is damaged.*3 damaged files"):
        TsFileDataset(data, batch_size=5000, on_damaged="skip")
