"""Statistics and normalization on the row datasets (the window dataset's are in test_windows)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tsfile_torch import Normalizer, TsFileDataset, TsFileIterableDataset
from tsfile_torch.data.normalize import RunningMoments


def test_row_dataset_stats_from_metadata_then_exact(small_dir, small_expected):
    ds = TsFileDataset(small_dir, batch_size=1000, columns=["t.d1.*"])
    stats = ds.stats()
    values = small_expected[:, 3:6]
    assert list(stats) == ["t.d1.s0", "t.d1.s1", "t.d1.s2"]
    first = stats["t.d1.s0"]
    assert first["source"] == "metadata" and first["std"] is None and first["count"] == 5000
    assert (first["min"], first["max"]) == (values[:, 0].min(), values[:, 0].max())
    exact = ds.stats(exact=True)
    assert exact["t.d1.s2"]["source"] == "data"
    assert exact["t.d1.s2"]["std"] == pytest.approx(values[:, 2].std(), rel=1e-12)
    assert exact["t.d1.s2"]["mean"] == pytest.approx(values[:, 2].mean(), rel=1e-12)


@pytest.mark.parametrize("method", ["minmax", "standard"])
def test_row_batches_are_normalized_and_validation_reuses_the_numbers(
    small_dir, small_expected, method
):
    ds = TsFileDataset(
        small_dir, batch_size=1000, columns=["t.d0.*"], normalize=method, dtype=torch.float64
    )
    raw = small_expected[:, :3]
    if method == "minmax":
        shift, scale = raw.min(0), raw.max(0) - raw.min(0)
    else:
        shift, scale = raw.mean(0), raw.std(0)
    np.testing.assert_allclose(ds[2].numpy(), (raw[2000:3000] - shift) / scale, rtol=1e-9)
    val = TsFileIterableDataset(
        small_dir, batch_size=500, columns=["t.d0.*"], normalize=ds.normalizer, dtype=torch.float64
    )
    first = next(iter(val))
    np.testing.assert_allclose(first.numpy(), (raw[:500] - shift) / scale, rtol=1e-9)
    np.testing.assert_allclose(ds.normalizer.inverse(first).numpy(), raw[:500], rtol=1e-12)


def test_bad_normalize_is_named(small_dir):
    with pytest.raises(ValueError, match="normalize must be None, 'minmax', 'standard'"):
        TsFileDataset(small_dir, normalize="z")
    with pytest.raises(ValueError, match=r"no numbers for fields \['t.d0.s0'"):
        TsFileDataset(small_dir, columns=["t.d0.*"], normalize=Normalizer(("x",), (0.0,), (1.0,)))
    with pytest.raises(ValueError, match="scale of field 'x' must be finite and != 0"):
        Normalizer(("x",), (0.0,), (0.0,))


def test_running_moments_merge_chunks_exactly_and_skip_nulls():
    rng = np.random.default_rng(0)
    values = rng.normal(5.0, 3.0, 10_000)
    values[::7] = np.nan
    moments = RunningMoments(1)
    for chunk in np.array_split(values, 13):
        moments.add(0, chunk)
    kept = values[~np.isnan(values)]
    assert moments.count[0] == len(kept)
    assert moments.mean[0] == pytest.approx(kept.mean(), rel=1e-12)
    assert moments.std[0] == pytest.approx(kept.std(), rel=1e-12)
