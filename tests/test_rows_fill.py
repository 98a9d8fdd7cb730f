"""fill= on the row datasets fills nulls, with or without align= (Note: row fill in
tsfile_torch/data/rows.py): exact values on every make_loader path, orders and caches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader, synthetic

NUM_ROWS = 1000
BATCH = 64


def _raw() -> np.ndarray:
    """Column ``j`` at row ``r`` is ``10_000 * j + r``, null where the pattern says: ``a`` none,
    ``b`` runs of 5 (rows 0-4, 20-24, ...), ``c`` single rows and a long run (rows 100-229)."""
    rows = np.arange(NUM_ROWS)
    raw = np.stack([10_000.0 * j + rows for j in range(3)], axis=1)
    raw[(rows // 5) % 4 == 0, 1] = np.nan
    raw[(rows % 7 == 3) | ((rows >= 100) & (rows < 230)), 2] = np.nan
    return raw


RAW = _raw()


@pytest.fixture(scope="module")
def nulls_dir(tmp_path_factory):
    """One device ``t.d`` with fields a, b, c (RAW; NaN written as null), timestamps = rows."""
    directory = tmp_path_factory.mktemp("nulls")
    synthetic.write_table_devices(
        directory / "nulls.tsfile", "t", ["a", "b", "c"], {"d": (np.arange(NUM_ROWS), RAW)}
    )
    return directory


def _filled(rows: np.ndarray, fill: str) -> np.ndarray:
    """Return RAW at ``rows`` (one batch, in time order) filled as the batch is, one cell at a
    time: zero 0; ffill the last value of the column earlier in the batch, NaN before."""
    out = RAW[rows].copy()
    for j in range(out.shape[1]):
        last = np.nan
        for i in range(len(out)):
            if not np.isnan(out[i, j]):
                last = out[i, j]
            else:
                out[i, j] = 0.0 if fill == "zero" else last
    return out


def _check(batches, fill: str, consecutive: bool = True) -> np.ndarray:
    """Assert every batch ``(values, times)`` is RAW at its rows filled; return all rows."""
    seen = []
    for values, times in batches:
        rows = times.numpy()
        if consecutive:
            assert np.array_equal(rows, np.arange(rows[0], rows[0] + len(rows)))
        np.testing.assert_array_equal(values.numpy(), _filled(rows, fill).astype(np.float32))
        seen.append(rows)
    return np.sort(np.concatenate(seen))


def test_the_helper_fills_a_batch_cell_by_cell():
    np.testing.assert_array_equal(_filled(np.arange(0, 6), "zero")[:, 1], [0, 0, 0, 0, 0, 10_005])
    ffill = _filled(np.arange(3, 26), "ffill")[:, 1]
    np.testing.assert_array_equal(ffill[:2], [np.nan, np.nan])  # rows 3, 4: none earlier
    np.testing.assert_array_equal(ffill[16:23], [10_019] * 6 + [10_025])  # 20-24 carry 19


@pytest.mark.parametrize("fill", ["zero", "ffill"])
def test_map_dataset_fills_nulls_without_align(nulls_dir, fill):
    ds = TsFileDataset(nulls_dir, batch_size=BATCH, fill=fill, return_timestamps=True)
    assert ds.alignment is None
    rows = _check([ds[i] for i in range(len(ds))], fill)
    np.testing.assert_array_equal(rows, np.arange(NUM_ROWS))


def test_nan_leaves_nulls_as_they_are(nulls_dir):
    with pytest.warns(UserWarning, match="pass fill='zero'"):
        ds = TsFileIterableDataset(nulls_dir, batch_size=BATCH, dtype="float64")
    np.testing.assert_array_equal(torch.cat(list(ds)).numpy(), RAW)


def test_zero_fill_says_no_null_reaches_a_batch(nulls_dir, recwarn):
    TsFileIterableDataset(nulls_dir, batch_size=BATCH, fill="zero")
    assert not [w for w in recwarn if "null" in str(w.message)]


def test_ffill_carries_within_a_batch_only(nulls_dir):
    # c is null on rows 100-229. Batch 1 (rows 64-127) carries row 99 into 100-127; batch 2
    # (128-191) lies inside the run: nothing earlier in it, so NaN, not row 99's value; batch 3
    # (192-255) is NaN up to row 229, then row 234 (a single null) carries row 233
    ds = TsFileDataset(nulls_dir, batch_size=BATCH, fill="ffill", dtype="float64")
    np.testing.assert_array_equal(ds[1].numpy()[36:, 2], [20_099.0] * 28)
    assert np.isnan(ds[2].numpy()[:, 2]).all()
    third = ds[3].numpy()[:, 2]
    assert np.isnan(third[:38]).all()
    np.testing.assert_array_equal(third[38:43], [20_230.0, 20_231.0, 20_232.0, 20_233.0, 20_233.0])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("cache", ["none", "memory", "disk"])
@pytest.mark.parametrize("fill", ["zero", "ffill"])
def test_every_loader_path_hands_out_filled_batches(nulls_dir, tmp_path, num_workers, cache, fill):
    for kind in (TsFileIterableDataset, TsFileDataset):
        ds = kind(
            nulls_dir,
            batch_size=BATCH,
            order="batches",
            fill=fill,
            cache=cache,
            cache_dir=tmp_path,
            block_rows=256,
            return_timestamps=True,
        )
        loader = make_loader(ds, num_workers=num_workers)
        for _ in range(2):  # the second epoch: kept rows (memory, disk) served as kept
            rows = _check(loader, fill)
            np.testing.assert_array_equal(rows, np.arange(NUM_ROWS))
        del loader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_sequential_and_random_batches_are_filled(nulls_dir, num_workers):
    ds = TsFileIterableDataset(
        nulls_dir, batch_size=BATCH, fill="ffill", block_rows=256, return_timestamps=True
    )
    rows = _check(make_loader(ds, num_workers=num_workers), "ffill")
    np.testing.assert_array_equal(rows, np.arange(NUM_ROWS))
    ds.set_random_batches(12)  # windows at random rows: a batch starts anywhere in a run
    assert len(_check(make_loader(ds, num_workers=num_workers), "ffill")) == 12 * BATCH


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("cache", ["none", "memory"])
def test_shuffled_rows_are_zero_filled(nulls_dir, num_workers, cache):
    ds = TsFileIterableDataset(
        nulls_dir,
        batch_size=BATCH,
        order="shuffle",
        fill="zero",
        cache=cache,
        block_rows=256,
        return_timestamps=True,
    )
    rows = _check(make_loader(ds, num_workers=num_workers), "zero", consecutive=False)
    np.testing.assert_array_equal(rows, np.arange(NUM_ROWS))


def test_ffill_over_shuffled_rows_with_nulls_is_refused(nulls_dir):
    for kind in (TsFileIterableDataset, TsFileDataset):
        with pytest.raises(ValueError, match=r"fill='ffill' .* order='shuffle' .*t\.d\.b \(250\)"):
            kind(nulls_dir, batch_size=BATCH, shuffle=True, fill="ffill")


def test_ffill_over_shuffled_rows_without_nulls_keeps_filling_alignment_gaps(tmp_path):
    a_times, b_times = np.arange(0, 400, 2), np.arange(1, 401, 3)
    synthetic.write_table_devices(tmp_path / "a.tsfile", "a", ["v"], {"d": (a_times, a_times)})
    synthetic.write_table_devices(tmp_path / "b.tsfile", "b", ["v"], {"d": (b_times, -b_times)})
    ds = TsFileIterableDataset(
        tmp_path, batch_size=32, shuffle=True, align="union", fill="ffill", return_timestamps=True
    )
    for values, times in ds:
        t = times.numpy()
        a_last = a_times[np.searchsorted(a_times, t, side="right") - 1]
        np.testing.assert_array_equal(values[:, 0].numpy(), a_last)
        b_at = np.searchsorted(b_times, t, side="right") - 1
        expected = np.where(b_at < 0, np.nan, -b_times[np.maximum(b_at, 0)].astype(np.float64))
        np.testing.assert_array_equal(values[:, 1].numpy(), expected.astype(np.float32))


@pytest.mark.parametrize("fill", ["zero", "ffill"])
def test_nulls_of_aligned_columns_are_filled_too(tmp_path, fill):
    # b has its own clock and nulls: alignment gaps take the series' fill, nulls the batch's
    a_times, b_times = np.arange(0, 300), np.arange(0, 300, 2)
    b_values = b_times * 1.0
    b_values[(b_times // 10) % 3 == 0] = np.nan
    synthetic.write_table_devices(tmp_path / "a.tsfile", "a", ["v"], {"d": (a_times, a_times)})
    synthetic.write_table_devices(tmp_path / "b.tsfile", "b", ["v"], {"d": (b_times, b_values)})
    ds = TsFileDataset(
        tmp_path, batch_size=40, align="union", fill=fill, dtype="float64", return_timestamps=True
    )
    for i in range(len(ds)):
        values, times = ds[i]
        t = times.numpy()
        got = values[:, 1].numpy()
        expected = np.full(len(t), np.nan)
        last = np.nan
        for k, time in enumerate(t):
            if time % 2 == 0 and not np.isnan(b_values[time // 2]):
                last = expected[k] = b_values[time // 2]
            elif fill == "zero":
                expected[k] = 0.0
            elif time % 2 == 1 and not np.isnan(b_values[time // 2]):
                last = expected[k] = b_values[time // 2]  # a gap: the last earlier sample
            else:
                expected[k] = last  # a null (or a gap after one): the batch's last value
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(values[:, 0].numpy(), t)
