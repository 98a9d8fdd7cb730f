"""Forecasting items (issue 15): dict items, masks, fills, codes, time features, scaling.

One real TsFile written through tsfile's table writer (``write_dataframe``): a table with two
tag levels (site, unit), three devices of very different lengths, sampling and scales,
timestamps from before 1970, and nulls in each field. Every expected value below is computed
from the DataFrame that was written, with pandas / numpy only.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from tsfile_torch import TsFileIterableDataset, TsFileWindowDataset, collate_windows, make_loader
from tsfile_torch.convert import write_dataframe
from tsfile_torch.errors import SchemaError

HOUR = 3_600_000
#: (site, unit, rows, step in ms, first timestamp in ms, scale, offset)
DEVICES = [
    ("north", "kw", 240, HOUR, -72 * HOUR - 17 * 60_000, 1.0, 0.0),
    ("north", "mw", 500, 17 * 60_000, -10 * HOUR, 1000.0, 5000.0),
    ("south", "kw", 90, 24 * HOUR, -40 * 24 * HOUR, 0.01, -3.0),
]
FEATURES = [
    "hour_of_day",
    "day_of_week",
    "day_of_month",
    "day_of_year",
    "month_of_year",
    "minute_of_hour",
]


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(15)
    parts = []
    for site, unit, n, step, first, scale, offset in DEVICES:
        load = rng.normal(size=n) * scale + offset
        temp = rng.normal(size=n) * scale * 2 - offset
        holes = rng.random(n) < 0.15
        load[holes] = np.nan
        temp[~holes & (rng.random(n) < 0.1)] = np.nan  # never both null in one row
        parts.append(
            pd.DataFrame(
                {
                    "time": first + step * np.arange(n, dtype=np.int64),
                    "site": site,
                    "unit": unit,
                    "load": load,
                    "temp": temp,
                }
            )
        )
    return pd.concat(parts, ignore_index=True)


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    """(path, DataFrame written, per-device frames in device order)."""
    df = _frame()
    path = tmp_path_factory.mktemp("forecast") / "panel.tsfile"
    write_dataframe(df, path, table="plant", tags=["site", "unit"])
    per_device = [
        df[(df.site == s) & (df.unit == u)].sort_values("time").reset_index(drop=True)
        for s, u, *_ in DEVICES
    ]
    return path, df, per_device


def _expected_windows(per_device, context, horizon, stride=1):
    """Every window as (device, first row), device by device, as the dataset numbers them."""
    return [
        (k, start)
        for k, frame in enumerate(per_device)
        for start in range(0, len(frame) - context - horizon + 1, stride)
    ]


def _calendar(stamps_ms: np.ndarray) -> np.ndarray:
    """GluonTS's time features, computed by pandas."""
    index = pd.DatetimeIndex(pd.to_datetime(stamps_ms, unit="ms", utc=True))
    return np.stack(
        [
            index.hour / 23.0 - 0.5,
            index.day_of_week / 6.0 - 0.5,
            (index.day - 1) / 30.0 - 0.5,
            (index.day_of_year - 1) / 365.0 - 0.5,
            (index.month - 1) / 11.0 - 0.5,
            index.minute / 59.0 - 0.5,
        ],
        axis=-1,
    )


def _all(ds) -> dict[str, torch.Tensor]:
    return collate_windows(ds.__getitems__(list(range(len(ds)))))


def _exact_dicts(path, context, horizon, **kwargs) -> TsFileWindowDataset:
    """Dict items in float64, so they compare exactly with the frame's values."""
    return TsFileWindowDataset(
        path, context, horizon, return_dict=True, dtype=torch.float64, **kwargs
    )


@pytest.mark.parametrize(
    "fill",
    [
        "nan",
        pytest.param("zero", marks=pytest.mark.slow),
        pytest.param("ffill", marks=pytest.mark.slow),
    ],
)
def test_dict_items_match_the_written_frame(panel, fill):
    path, _, per_device = panel
    context, horizon = 6, 3
    ds = _exact_dicts(
        path,
        context,
        horizon,
        columns=["load", "temp"],
        targets=["load"],
        time_features=FEATURES,
        fill=fill,
        block_rows=50,
    )
    assert ds.devices == ["plant.north.kw", "plant.north.mw", "plant.south.kw"]
    assert ds.tag_vocab == [["north", "south"], ["kw", "mw"]]
    windows = _expected_windows(per_device, context, horizon)
    assert len(ds) == len(windows)
    batch = _all(ds)
    codes = {"north": 0, "south": 1, "kw": 0, "mw": 1}
    expected: dict[str, list] = {}
    for k, start in windows:
        frame = per_device[k].iloc[start : start + context + horizon]
        raw = frame[["load", "temp"]]
        filled = {"zero": raw.fillna(0.0), "ffill": raw.ffill().fillna(0.0), "nan": raw}[fill]
        parts = {
            "values": filled.to_numpy(),
            "observed_mask": raw.notna().to_numpy(dtype=np.float64),
            "time": frame.time.to_numpy(),
            "time_features": _calendar(frame.time.to_numpy()),
        }
        for name, array in parts.items():
            past, future = array[:context], array[context:]
            if name in ("values", "observed_mask"):
                future = future[:, :1]  # targets=["load"]
            expected.setdefault(f"past_{name}", []).append(past)
            expected.setdefault(f"future_{name}", []).append(future)
        site, unit = DEVICES[k][:2]
        expected.setdefault("device_id", []).append(k)
        expected.setdefault("static_categorical_features", []).append([codes[site], codes[unit]])
    assert set(batch) == set(expected)
    for key, rows in expected.items():
        atol = 1e-6 if key.endswith("time_features") else 0
        np.testing.assert_allclose(batch[key].numpy(), np.array(rows), rtol=0, atol=atol)
    assert batch["device_id"].dtype == batch["past_time"].dtype == torch.int64
    assert batch["static_categorical_features"].dtype == torch.int64


def test_dict_batches_through_make_loader_are_stacked_tensors(panel):
    path, _, per_device = panel
    ds = TsFileWindowDataset(
        path, 8, 2, return_dict=True, time_features=["hour_of_day"], fill="zero"
    )
    seen = 0
    for batch in make_loader(ds, batch_size=64, num_workers=2):
        assert isinstance(batch, dict)
        n = len(batch["device_id"])
        assert batch["past_values"].shape == (n, 8, 2)
        assert batch["future_observed_mask"].shape == (n, 2, 2)
        assert batch["past_time_features"].shape == (n, 8, 1)
        assert batch["static_categorical_features"].shape == (n, 2)
        assert not torch.isnan(batch["past_values"]).any()
        seen += n
    assert seen == len(ds) == len(_expected_windows(per_device, 8, 2))


def test_single_item_is_a_dict_and_default_collate_agrees(panel):
    path, *_ = panel
    ds = TsFileWindowDataset(path, 4, 1, return_dict=True)
    item = ds[7]
    assert set(item) == {
        "past_values",
        "past_observed_mask",
        "past_time",
        "future_values",
        "future_observed_mask",
        "future_time",
        "device_id",
        "static_categorical_features",
    }
    batch = ds.__getitems__([3, 7, 300])
    ours, theirs = collate_windows(batch), torch.utils.data.default_collate(list(batch))
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], equal_nan=True)


def test_horizon_zero_has_no_future_keys(panel):
    path, *_ = panel
    item = TsFileWindowDataset(path, 4, return_dict=True)[0]
    assert not any(key.startswith("future") for key in item)


def test_fill_applies_to_nulls_on_the_tuple_route_too(panel):
    path, _, per_device = panel
    ds = TsFileWindowDataset(path, 5, 0, fill="zero", dtype=torch.float64)
    x = collate_windows(ds.__getitems__(list(range(len(ds)))))
    expected = [
        per_device[k][["load", "temp"]].iloc[s : s + 5].fillna(0.0).to_numpy()
        for k, s in _expected_windows(per_device, 5, 0)
    ]
    np.testing.assert_array_equal(x.numpy(), np.stack(expected))


def test_nulls_that_reach_tuples_as_nan_are_announced_once_at_build(panel):
    path, df, _ = panel
    nulls = int(df[["load", "temp"]].isna().sum().sum())
    with pytest.warns(UserWarning, match=rf"{nulls:,} values .* are null .* fill='zero'") as w:
        TsFileWindowDataset(path, 5, 1)
    with pytest.warns(UserWarning, match="torch.isnan") as r:  # rows: NaN whatever fill says
        TsFileIterableDataset(path, batch_size=64, align="union")
    # both point at the line that built the dataset, whatever the kind's depth of calls
    assert {x.filename for x in [*w, *r] if "null" in str(x.message)} == {__file__}
    with warnings.catch_warnings():  # masked, filled or dropped: nothing to announce
        warnings.simplefilter("error")
        TsFileWindowDataset(path, 5, 1, return_dict=True)
        TsFileWindowDataset(path, 5, 1, fill="zero")
        TsFileWindowDataset(path, 5, 1, max_missing=0.0)


def test_time_features_in_seconds(tmp_path):
    stamps = np.array([-86_400 * 400 - 3661, -1, 0, 59, 3600 * 25 + 61, 10**9], dtype=np.int64)
    df = pd.DataFrame({"time": stamps, "v": np.arange(len(stamps), dtype=np.float64)})
    write_dataframe(df, tmp_path / "s.tsfile", table="t", time_unit="s")
    ds = TsFileWindowDataset(
        tmp_path / "s.tsfile", 6, return_dict=True, time_features=FEATURES, time_unit="s"
    )
    got = ds[0]["past_time_features"].numpy()
    np.testing.assert_allclose(got, _calendar(stamps * 1000), atol=1e-6)
    assert ds.tag_vocab == [] and ds[0]["static_categorical_features"].shape == (0,)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"time_features": ["hour"]}, ValueError, "unknown feature 'hour'"),
        ({"time_features": "hour_of_day"}, TypeError, "list of feature names"),
        ({"return_dict": 1}, TypeError, "return_dict should be True or False"),
    ],
)
def test_bad_dict_arguments_are_refused(panel, kwargs, error, match):
    path, *_ = panel
    kwargs = {"return_dict": True, **kwargs}
    with pytest.raises(error, match=match):
        TsFileWindowDataset(path, 4, 1, **kwargs)


def test_time_features_without_dict_items_are_refused(panel):
    path, *_ = panel
    with pytest.raises(ValueError, match="return_dict=True"):
        TsFileWindowDataset(path, 4, 1, time_features=["hour_of_day"])


def test_aligned_gaps_are_masked_and_filled_within_the_window(tmp_path):
    from tsfile_torch import synthetic

    a_times, b_times = np.arange(0, 40, 2), np.arange(1, 41, 3)
    synthetic.write_tree_series(
        tmp_path / "pair.tsfile",
        {"root.sg.d1": {"a": (a_times, a_times * 10.0), "b": (b_times, b_times * 100.0 + 1)}},
    )
    ds = _exact_dicts(tmp_path, 5, 1, align="union", fill="ffill")
    union = np.union1d(a_times, b_times)
    frame = pd.DataFrame(index=union)
    frame["a"] = pd.Series(a_times * 10.0, index=a_times)
    frame["b"] = pd.Series(b_times * 100.0 + 1, index=b_times)
    batch = _all(ds)
    assert len(ds) == len(union) - 5
    for i in range(len(ds)):
        window = frame.iloc[i : i + 6]
        values = window.ffill().fillna(0.0).to_numpy()
        mask = window.notna().to_numpy(dtype=np.float64)
        np.testing.assert_array_equal(batch["past_values"][i].numpy(), values[:5])
        np.testing.assert_array_equal(batch["past_observed_mask"][i].numpy(), mask[:5])
        np.testing.assert_array_equal(batch["future_values"][i].numpy(), values[5:])
        np.testing.assert_array_equal(batch["future_observed_mask"][i].numpy(), mask[5:])
        np.testing.assert_array_equal(batch["past_time"][i].numpy(), union[i : i + 5])


CUT = 30 * HOUR  # end_time of the "training" range: every device has rows on both sides


def _in_range(per_device, end_time):
    return [frame[frame.time <= end_time] for frame in per_device]


@pytest.mark.parametrize("method", ["standard", "minmax"])
def test_device_statistics_come_from_each_devices_rows_in_range(panel, method):
    path, _, per_device = panel
    ds = _exact_dicts(path, 6, 2, normalize=method, normalize_by="device", end_time=CUT)
    norm = ds.normalizer
    assert norm.devices == tuple(ds.devices) and norm.device_fields == ("load", "temp")
    shift = np.asarray(norm.shift).reshape(3, 2)
    scale = np.asarray(norm.scale).reshape(3, 2)
    for k, frame in enumerate(_in_range(per_device, CUT)):
        for j, field in enumerate(["load", "temp"]):
            series = frame[field].dropna()
            if method == "standard":
                want = (series.mean(), series.std(ddof=0))
            else:
                want = (series.min(), series.max() - series.min())
            np.testing.assert_allclose((shift[k, j], scale[k, j]), want, rtol=1e-12)
    batch = _all(ds)
    frames = _in_range(per_device, CUT)
    for i, (k, start) in enumerate(_expected_windows(frames, 6, 2)):
        raw = frames[k][["load", "temp"]].iloc[start : start + 8].to_numpy()
        scaled = (raw - shift[k]) / scale[k]
        np.testing.assert_allclose(batch["past_values"][i].numpy(), scaled[:6], rtol=1e-12)
        np.testing.assert_allclose(batch["future_values"][i].numpy(), scaled[6:], rtol=1e-12)
    back = norm.inverse(batch["future_values"], batch["device_id"])
    expected = np.stack(
        [
            frames[k][["load", "temp"]].iloc[s + 6 : s + 8].to_numpy()
            for k, s in _expected_windows(frames, 6, 2)
        ]
    )
    np.testing.assert_allclose(back.numpy(), expected, rtol=1e-12, atol=1e-9)
    one = norm.inverse(batch["future_values"][0].numpy(), "plant.north.kw")
    np.testing.assert_allclose(one, expected[0], rtol=1e-12, atol=1e-9)


def test_column_statistics_ignore_rows_after_end_time(panel):
    path, _, per_device = panel
    ds = TsFileWindowDataset(path, 6, 2, normalize="minmax", end_time=CUT)
    rows = pd.concat(_in_range(per_device, CUT))
    lo, hi = rows.load.min(), rows.load.max()
    assert ds.normalizer.fields == ("load", "temp")
    np.testing.assert_allclose((ds.normalizer.shift[0], ds.normalizer.scale[0]), (lo, hi - lo))


def test_a_validation_dataset_takes_the_training_devices_numbers(panel):
    path, *_ = panel
    train = TsFileWindowDataset(
        path, 6, 2, normalize="standard", normalize_by="device", end_time=CUT
    )
    valid = TsFileWindowDataset(path, 6, 2, normalize=train.normalizer, start_time=CUT + 1)
    assert valid.normalize_by == "device" and valid.normalizer is train.normalizer
    with pytest.raises(ValueError, match="DeviceNormalizer"):
        TsFileWindowDataset(
            path,
            6,
            2,
            normalize=TsFileWindowDataset(path, 6, 2, normalize="minmax").normalizer,
            normalize_by="device",
        )
    with pytest.raises(ValueError, match="normalize_by must be one of"):
        TsFileWindowDataset(path, 6, 2, normalize="minmax", normalize_by="series")


@pytest.mark.parametrize("stride", [1, 4])
def test_split_by_time_trains_before_t_and_forecasts_from_t(panel, stride):
    path, _, per_device = panel
    context, horizon = 6, 2
    ds = _exact_dicts(
        path,
        context,
        horizon,
        stride=stride,
        normalize="standard",
        normalize_by="device",
        block_rows=40,
    )
    cut = pd.Timestamp(CUT + 1, unit="ms")  # any form of time; the first row >= t varies
    train, valid = ds.split_by_time(cut)
    assert train.devices == valid.devices == ds.devices
    assert valid.normalizer is train.normalizer
    before = _in_range(per_device, CUT)
    want = _expected_windows(before, context, horizon, stride)
    assert len(train) == len(want)
    got = _all(train)
    assert int(got["future_time"].max()) <= CUT
    expected_valid = []
    for k, frame in enumerate(per_device):
        first = max(len(before[k]) - context, 0)
        expected_valid += [(k, s) for s in range(first, len(frame) - context - horizon + 1, stride)]
    assert len(valid) == len(expected_valid)
    batch = _all(valid)
    shift = np.asarray(train.normalizer.shift).reshape(3, 2)
    scale = np.asarray(train.normalizer.scale).reshape(3, 2)
    for i, (k, s) in enumerate(expected_valid):
        frame = per_device[k].iloc[s : s + context + horizon]
        assert int(batch["device_id"][i]) == k
        np.testing.assert_array_equal(batch["past_time"][i].numpy(), frame.time[:context])
        np.testing.assert_array_equal(batch["future_time"][i].numpy(), frame.time[context:])
        scaled = ((frame[["load", "temp"]].to_numpy() - shift[k]) / scale[k])[context:, :]
        np.testing.assert_allclose(batch["future_values"][i].numpy(), scaled, rtol=1e-12)
    assert int(batch["future_time"][:, 0].min()) > CUT
    firsts = [expected_valid.index(next(w for w in expected_valid if w[0] == k)) for k in range(3)]
    for k, i in enumerate(firsts):  # each device's first validation window forecasts from t
        if len(before[k]) >= context:
            assert int(batch["future_time"][i, 0]) == per_device[k].time[len(before[k])]


def test_split_by_time_without_horizon_validates_the_windows_ending_from_t(panel):
    # horizon=0 (context only, e.g. an autoencoder): train windows end before t, validation
    # windows end at or after t; at stride 1 the two are every window of the dataset, once
    path, _, per_device = panel
    ds = TsFileWindowDataset(
        path, 6, normalize="standard", normalize_by="device", min_context=4, return_dict=True
    )
    train, valid = ds.split_by_time(CUT + 1)
    assert valid.normalizer is train.normalizer

    def ends(d):
        items = _all(d)
        ids, last = items["device_id"].tolist(), items["past_time"][:, -1].tolist()
        return list(zip(ids, last, strict=True))

    train_ends, valid_ends = ends(train), ends(valid)
    assert max(t for _, t in train_ends) <= CUT < min(t for _, t in valid_ends)
    assert sorted(train_ends + valid_ends) == sorted(ends(ds))
    before = _in_range(per_device, CUT)
    for k, frame in enumerate(per_device):  # each device's first one ends at its first row >= t
        first = min(t for d, t in valid_ends if d == k)
        assert first == frame.time[len(before[k])]


def test_split_by_time_refuses_what_cannot_split(panel):
    path, df, _ = panel
    after_all = int(df.time.max()) + 1
    with pytest.raises(SchemaError, match="no device has a whole window ending at or after t"):
        TsFileWindowDataset(path, 6).split_by_time(after_all)
    with pytest.raises(SchemaError, match="no device has a whole window forecasting from t"):
        TsFileWindowDataset(path, 6, 1).split_by_time(after_all)
    with pytest.raises(ValueError, match="must lie in"):
        TsFileWindowDataset(path, 6, 1, start_time=0).split_by_time(0)


def _padded_windows(per_device, context, horizon, stride, min_context, max_missing, targets):
    """Expected windows with GluonTS padding: (devices, starts, times, x, y), numpy only."""
    pad = context - (min_context or context)
    cols = {"device": [], "start": [], "times": [], "x": [], "y": []}
    for k, frame in enumerate(per_device):
        step = int(frame.time[1] - frame.time[0])
        times = np.r_[frame.time[0] - step * np.arange(pad, 0, -1), frame.time]
        x = np.r_[np.full((pad, 2), np.nan), frame[["load", "temp"]].to_numpy()]
        y = np.r_[np.full((pad, len(targets)), np.nan), frame[targets].to_numpy()]
        for start in range(0, len(times) - context - horizon + 1, stride):
            past, future = (
                slice(start, start + context),
                slice(start + context, start + context + horizon),
            )
            missing = np.isnan(x[past]).sum() + np.isnan(y[future]).sum()
            if (
                max_missing is None
                or missing / (context * 2 + horizon * len(targets)) <= max_missing
            ):
                cols["device"].append(k)
                cols["start"].append(start - pad)
                cols["times"].append(times[start : start + context + horizon])
                cols["x"].append(x[past])
                cols["y"].append(y[future])
    return {key: np.array(value) for key, value in cols.items()}


@pytest.mark.parametrize(
    "min_context, max_missing, stride", [(2, None, 1), (None, 0.1, 1), (3, 0.25, 3), (1, 0.0, 2)]
)
def test_min_context_pads_and_max_missing_drops_windows(panel, min_context, max_missing, stride):
    path, _, per_device = panel
    context, horizon = 5, 2
    ds = _exact_dicts(
        path,
        context,
        horizon,
        stride=stride,
        targets=["temp"],
        min_context=min_context,
        max_missing=max_missing,
        block_rows=64,
    )
    want = _padded_windows(per_device, context, horizon, stride, min_context, max_missing, ["temp"])
    assert len(ds) == len(want["device"]) == sum(ds.window_counts().values())
    batch = _all(ds)
    np.testing.assert_array_equal(batch["device_id"].numpy(), want["device"])
    assert [ds.window_info(i).start_row for i in (0, len(ds) - 1)] == [
        want["start"][0],
        want["start"][-1],
    ]
    times = torch.cat([batch["past_time"], batch["future_time"]], dim=1).numpy()
    np.testing.assert_array_equal(times, want["times"])
    np.testing.assert_array_equal(batch["past_values"].numpy(), want["x"])
    np.testing.assert_array_equal(batch["past_observed_mask"].numpy(), ~np.isnan(want["x"]))
    np.testing.assert_array_equal(batch["future_values"].numpy(), want["y"])
    seen = sum(len(b["device_id"]) for b in make_loader(ds, batch_size=50, num_workers=2))
    assert seen == len(ds)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"min_context": 0}, ValueError, r"min_context should be an integer in \[1, 5\]"),
        ({"min_context": 6}, ValueError, "min_context should be"),
        ({"max_missing": 1.5}, ValueError, r"max_missing should be a fraction in \[0, 1\]"),
        ({"max_missing": "half"}, TypeError, "max_missing should be a fraction"),
    ],
)
def test_bad_missing_value_policies_are_refused(panel, kwargs, error, match):
    path, *_ = panel
    with pytest.raises(error, match=match):
        TsFileWindowDataset(path, 5, 1, **kwargs)


def test_uniform_device_weights_draw_each_device_equally_often(panel):
    path, _, per_device = panel
    draws = 30_000
    uniform = TsFileWindowDataset(
        path, 6, 2, order="random", num_samples=draws, device_weights="uniform", seed=3
    )
    length = TsFileWindowDataset(path, 6, 2, order="random", num_samples=draws, seed=3)
    counts = np.array([len(f) - 7 for f in per_device])  # windows per device
    for ds, share in ((uniform, np.full(3, 1 / 3)), (length, counts / counts.sum())):
        (items,) = ds.epoch_batches(0, draws)
        device = np.searchsorted(np.cumsum(counts), items, side="right")
        got = np.bincount(device, minlength=3)
        bound = 5 * np.sqrt(draws * share * (1 - share))  # five binomial standard deviations
        assert (np.abs(got - draws * share) < bound).all(), (got, draws * share)
        smallest = items[device == 2] - counts[:2].sum()
        assert set(smallest.tolist()) == set(range(counts[2]))  # every window of it is drawn
    assert not np.array_equal(
        uniform.epoch_batches(0, draws)[0], uniform.epoch_batches(1, draws)[0]
    )


def test_uniform_device_weights_resume_mid_epoch(panel):
    from tsfile_torch import EpochSampler

    path, *_ = panel
    ds = TsFileWindowDataset(
        path, 6, 2, order="random", num_samples=500, device_weights="uniform", seed=9
    )
    sampler = EpochSampler(ds, 32, num_workers=2)
    whole = list(sampler)
    again = EpochSampler(ds, 32, num_workers=2)
    ds.set_epoch(0)
    it = iter(again)
    head = [next(it) for _ in range(5)]
    saved = again.state_dict()
    resumed = EpochSampler(ds, 32, num_workers=2)
    resumed.load_state_dict(saved)
    assert head + list(resumed) == whole
    with pytest.raises(ValueError, match="device_weights='uniform' goes with order='random'"):
        TsFileWindowDataset(path, 6, 2, device_weights="uniform")


def _mixture(path, **kwargs):
    from tsfile_torch import MixedWindows

    north = TsFileWindowDataset(
        path,
        6,
        2,
        devices=["plant.north.*"],
        return_dict=True,
        order="random",
        num_samples=10,
        device_weights="uniform",
    )
    south = TsFileWindowDataset(path, 6, 2, devices=["plant.south.kw"], return_dict=True)
    return north, south, MixedWindows([north, south], **kwargs)


def test_mixed_windows_draw_datasets_by_weight_and_read_them_exactly(panel):
    path, *_ = panel
    draws = 20_000
    north, south, mix = _mixture(path, weights=[1, 3], num_samples=draws, seed=5)
    assert mix.devices == north.devices + south.devices and len(mix) == len(north) + len(south)
    (items,) = mix.epoch_batches(0, draws)
    from_south = items >= len(north)
    north_device = np.searchsorted(north.index.first, items[~from_south], side="right") - 1
    got = np.array([(north_device == 0).sum(), (north_device == 1).sum(), from_south.sum()])
    share = np.array([0.125, 0.125, 0.75])  # north's two devices uniform within its quarter
    assert (np.abs(got - draws * share) < 5 * np.sqrt(draws * share * (1 - share))).all(), got
    pick = [0, len(north) - 1, len(north), len(mix) - 1, 3]
    batch = collate_windows(mix.__getitems__(pick))
    for row, i in enumerate(pick):
        own, local = (north, i) if i < len(north) else (south, i - len(north))
        item = own[local]
        shift = 0 if own is north else len(north.devices)
        assert int(batch["device_id"][row]) == int(item["device_id"]) + shift
        for key in ("past_values", "future_values", "past_time", "static_categorical_features"):
            torch.testing.assert_close(batch[key][row], item[key], equal_nan=True)


def test_mixed_windows_resume_and_load_through_workers(panel):
    from tsfile_torch import EpochSampler

    path, *_ = panel
    *_, mix = _mixture(path, num_samples=300, seed=2)
    whole = list(EpochSampler(mix, 16, num_workers=2))
    mix.set_epoch(0)
    first = EpochSampler(mix, 16, num_workers=2)
    it = iter(first)
    head = [next(it) for _ in range(7)]
    resumed = EpochSampler(mix, 16, num_workers=2)
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == whole
    mix.set_epoch(0)
    times = torch.cat([b["past_time"] for b in make_loader(mix, batch_size=16, num_workers=2)])
    expected = torch.cat([collate_windows(mix.__getitems__(items))["past_time"] for items in whole])
    torch.testing.assert_close(times, expected)


def test_mixed_windows_refuse_windows_that_do_not_stack(panel):
    from tsfile_torch import MixedWindows

    path, *_ = panel
    a = TsFileWindowDataset(path, 6, 2)
    with pytest.raises(ValueError, match=r"datasets\[1\].context_length=5 differs"):
        MixedWindows([a, TsFileWindowDataset(path, 5, 2)], num_samples=10)
    with pytest.raises(ValueError, match="one finite weight >= 0 per dataset"):
        MixedWindows([a, a], weights=[1, -1], num_samples=10)
    with pytest.raises(TypeError, match="mixes TsFileWindowDatasets"):
        MixedWindows([a, "b"], num_samples=10)


@pytest.mark.parametrize("unit, per_ms", [("ms", 1), ("us", 1000), ("ns", 10**6)])
def test_time_features_agree_with_pandas_over_centuries(unit, per_ms):
    from tsfile_torch.data.features import time_features

    rng = np.random.default_rng(1)
    ms = np.r_[
        rng.integers(-(9 * 10**12), 9 * 10**12, 50_000), -1, 0, 951_782_400_000, 951_868_799_999
    ]
    got = time_features(ms * per_ms, FEATURES, unit)
    np.testing.assert_allclose(got, _calendar(ms), atol=1e-6)


def test_memory_cache_gives_the_same_padded_dict_items_as_streaming(panel):
    path, *_ = panel
    kwargs = dict(min_context=2, max_missing=0.3, return_dict=True, time_features=FEATURES)
    streaming = _all(TsFileWindowDataset(path, 5, 2, block_rows=32, **kwargs))
    memory = _all(TsFileWindowDataset(path, 5, 2, cache="memory", **kwargs))
    assert streaming.keys() == memory.keys()
    for key in streaming:
        torch.testing.assert_close(streaming[key], memory[key], equal_nan=True)
    half = TsFileWindowDataset(path, 5, 2, dtype=torch.float16, fill="zero", **kwargs)[0]
    assert half["past_values"].dtype == half["past_observed_mask"].dtype == torch.float16
