"""Small argument edges of issue #42 item 10: each a clear error naming the argument, where a
raw AssertionError / AttributeError or a model's shape error came before."""

from __future__ import annotations

import warnings

import pytest

from tsfile_torch import SchemaError, TsFileIterableDataset, make_loader


def test_make_loader_timeout_without_workers_names_the_argument(small_dir):
    ds = TsFileIterableDataset(small_dir, batch_size=1000)
    with pytest.raises(ValueError, match=r"timeout=60 .*num_workers=0"):
        make_loader(ds, num_workers=0, timeout=60)
    with pytest.raises(ValueError, match="timeout should be a finite number"):
        make_loader(ds, num_workers=1, timeout=-1)
    with pytest.raises(TypeError, match="timeout should be a number"):
        make_loader(ds, num_workers=1, timeout="60")
    assert len(list(make_loader(ds, num_workers=0, timeout=0))) == 5


@pytest.mark.parametrize("lags", [[0], [-1, 1]])
def test_hf_lags_below_one_are_refused(small_dir, lags):
    transformers = pytest.importorskip("transformers")
    from tsfile_torch import hf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.TimeSeriesTransformerConfig(
            prediction_length=8, context_length=16, lags_sequence=lags, input_size=1
        )
    with pytest.raises(ValueError, match=r"lags_sequence=.*every lag must be a whole number >= 1"):
        hf.windows_for(config, small_dir, columns=["s0"])


def test_hf_a_lag_longer_than_the_data_is_named(small_dir):
    transformers = pytest.importorskip("transformers")
    from tsfile_torch import hf

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.TimeSeriesTransformerConfig(
            prediction_length=8, context_length=16, lags_sequence=[1, 100000], input_size=1,
            num_time_features=1,
        )  # fmt: skip
    with pytest.raises(SchemaError, match=r"max\(lags_sequence\) 100000 .*lower the largest lag"):
        hf.windows_for(config, small_dir, columns=["s0"])


def test_ray_remote_args_must_be_a_dict(small_dir):
    pytest.importorskip("ray")
    from tsfile_torch import ray as tsfile_ray

    with pytest.raises(TypeError, match="ray_remote_args should be a dict"):
        tsfile_ray.read_tsfile(small_dir, ray_remote_args="x")
    with pytest.raises(TypeError, match="ray_remote_args should be a dict"):
        tsfile_ray.read_tsfile_windows(small_dir, 16, 4, ray_remote_args=["x"])
