"""Windows on a time grid (``freq=``): real files with missing timestamps and empty cells, every
value, mask and timestamp of every window checked against a pandas reindex of the same data."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest

from tsfile_torch import SchemaError, TsFileWindowDataset, make_loader, synthetic

Q = 15 * 60 * 1000  # 15 minutes in ms
BASE = 1_704_067_200_000  # 2024-01-01T00:00:00Z
CONTEXT, HORIZON = 12, 4
#: grid steps of each device: a hole longer than a window, single missing steps
STEPS = {
    "m0": np.r_[0:40, 70:90, 91:120, 122:150],
    "m1": np.r_[0:15, 16:100],
    "m2": np.r_[0:60, 61:62, 80:130],
}
#: each device's first timestamp: its own clock (m1 five minutes off the quarter hours)
START = {"m0": BASE, "m1": BASE + 5 * 60 * 1000 + Q, "m2": BASE + 3 * Q}


def value(device: int, field: int, step):
    return 1000.0 * device + 10.0 * field + np.asarray(step, dtype=np.float64)


def nulls(device: int, field: int, step) -> np.ndarray:
    """Empty cells: every 23rd step of x, every 31st of y, shifted per device."""
    return (np.asarray(step) + device) % (23 if field == 0 else 31) == 5


def write_meters(directory, steps=STEPS, start=START, files=2) -> str:
    """Write the meters panel over ``files`` files (each device continued across them)."""
    for f in range(files):
        devices = {}
        for d, (name, s) in enumerate(steps.items()):
            part = s[len(s) * f // files : len(s) * (f + 1) // files]
            values = np.stack([value(d, j, part) for j in range(2)], axis=1)
            for j in range(2):
                values[nulls(d, j, part), j] = np.nan
            devices[name] = (start[name] + part * Q, values)
        synthetic.write_table_devices(
            directory / f"meters{f}.tsfile", "meters", ["x", "y"], devices
        )
    return str(directory)


@pytest.fixture(scope="module")
def meters(tmp_path_factory):
    return write_meters(tmp_path_factory.mktemp("meters"))


def reindexed(d: int, name: str, steps=STEPS, start=START, freq_ms=Q, origin=None) -> pd.DataFrame:
    """The device's data as pandas reindexes it onto its regular grid (NaN where missing)."""
    s = steps[name]
    times = start[name] + s * Q
    frame = pd.DataFrame({"x": value(d, 0, s), "y": value(d, 1, s)}, index=times)
    for j, col in enumerate(("x", "y")):
        frame.loc[nulls(d, j, s), col] = np.nan
    first = times[0] if origin is None else origin + -(-(times[0] - origin) // freq_ms) * freq_ms
    return frame.reindex(np.arange(first, times[-1] + 1, freq_ms))


def expected_windows(frame: pd.DataFrame, stride: int = 1):
    """(times, values) of each window of one device's reindexed frame."""
    n, length = len(frame), CONTEXT + HORIZON
    for s in range(0, n - length + 1, stride):
        yield frame.index[s : s + length].to_numpy(), frame.to_numpy()[s : s + length]


def windows_by_start(batches) -> dict:
    out = {}
    for batch in batches:
        for i in range(len(batch["device_id"])):
            key = (int(batch["device_id"][i]), int(batch["past_time"][i, 0]))
            assert key not in out
            out[key] = {k: v[i] for k, v in batch.items()}
    return out


@pytest.mark.parametrize("freq", ["15min", None])
def test_no_epoch_reads_a_time_column_the_build_read(meters, tmp_path, freq):
    """The build reads each device's time column (its grid; without freq=, the missing-timestamps
    warning): the timeline indexes come from that read (Note: seeded indexes), saved for the
    readers of this process and of its workers."""
    index = tmp_path / "index"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the warning without freq=
        ds = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq=freq, index_cache=str(index))
    assert list(index.rglob("*.npy"))
    for copy in (ds, pickle.loads(pickle.dumps(ds))):  # as a DataLoader worker gets it
        seen = []
        copy.core.reader.on_read = lambda what, seen=seen: seen.append(what) if what else None
        assert sum(len(x) for x, _ in make_loader(copy, batch_size=32)) == len(copy)
        assert [w for w in seen if "rows [" in w]  # the values were read
        assert not [w for w in seen if "timeline index" in w], seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_window_on_the_grid_matches_a_pandas_reindex(meters, num_workers):
    ds = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="15min", return_dict=True, seed=1,
                             shuffle=True)  # fmt: skip
    got = windows_by_start(make_loader(ds, batch_size=32, num_workers=num_workers))
    count = 0
    for d, name in enumerate(ds.devices):
        for times, values in expected_windows(reindexed(d, name.split(".")[1])):
            w = got[d, int(times[0])]
            count += 1
            both = np.concatenate([w["past_values"], w["future_values"]])
            mask = np.concatenate([w["past_observed_mask"], w["future_observed_mask"]])
            stamps = np.concatenate([w["past_time"], w["future_time"]])
            np.testing.assert_array_equal(stamps, times)
            np.testing.assert_array_equal(mask, ~np.isnan(values))
            np.testing.assert_array_equal(both, values)  # NaN where missing (fill="nan")
            assert stamps[-1] - stamps[0] == (CONTEXT + HORIZON - 1) * Q  # spans exactly
    assert count == len(ds) == len(got)


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_tuples_with_fill_zero_on_the_grid_match_the_reindex_through_each_cache(
    meters, cache, tmp_path
):
    ds = TsFileWindowDataset(
        meters, CONTEXT, HORIZON, freq=Q, fill="zero", return_timestamps=True, stride=3,
        cache=cache, cache_dir=str(tmp_path),
    )  # fmt: skip
    i = 0
    for d, name in enumerate(ds.devices):
        for times, values in expected_windows(reindexed(d, name.split(".")[1]), stride=3):
            x, y, xt, yt = ds[i]
            i += 1
            filled = np.nan_to_num(values, nan=0.0)
            np.testing.assert_array_equal(np.concatenate([x, y]), filled)
            np.testing.assert_array_equal(np.concatenate([xt, yt]), times)
    assert i == len(ds)


def test_max_missing_counts_missing_timestamps(meters):
    ds = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="15min", max_missing=0.0)
    complete = sum(
        not np.isnan(values).any()
        for d, name in enumerate(ds.devices)
        for _, values in expected_windows(reindexed(d, name.split(".")[1]))
    )
    assert len(ds) == complete
    assert ds.filtered.windows == sum(
        len(reindexed(d, n.split(".")[1])) - CONTEXT - HORIZON + 1 for d, n in enumerate(ds.devices)
    )


def test_max_future_missing_leaves_out_only_windows_with_a_missing_target(meters):
    ds = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="15min", return_dict=True,
                             targets=["x"], max_future_missing=0.0)  # fmt: skip
    kept, missing = set(), 0
    for d, name in enumerate(ds.devices):
        for times, values in expected_windows(reindexed(d, name.split(".")[1])):
            if np.isnan(values[CONTEXT:, 0]).any():
                missing += 1
            else:
                kept.add((d, int(times[0])))
    assert ds.missing_future == missing > 0
    got = windows_by_start(make_loader(ds, batch_size=64))
    assert set(got) == kept
    assert all(w["future_observed_mask"].all() for w in got.values())
    assert any(not w["past_observed_mask"].all() for w in got.values())  # past gaps stay


def test_without_freq_a_device_with_missing_timestamps_is_warned_about(meters):
    with pytest.warns(UserWarning, match=r"3 of 3 devices have missing timestamps") as record:
        ds = TsFileWindowDataset(meters, CONTEXT, HORIZON)
    message = next(str(w.message) for w in record if "missing timestamps" in str(w.message))
    # m0's 30-step hole is the largest gap relative to its step
    assert "device 'meters.m0'" in message and "465min before" in message
    assert "freq='15min'" in message
    assert ds.steps["meters.m0"].typical == Q and ds.steps["meters.m0"].largest == 31 * Q


def test_a_regular_device_is_not_warned_about(tmp_path):
    steps = {"m0": np.arange(100)}
    path = write_meters(tmp_path, steps, {"m0": BASE}, files=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TsFileWindowDataset(path, CONTEXT, HORIZON, columns=["x"], fill="zero")


def test_a_timestamp_off_the_grid_names_the_device_and_the_choices(tmp_path):
    steps = {"m0": np.arange(50)}
    path = write_meters(tmp_path, steps, {"m0": BASE}, files=1)
    with pytest.raises(SchemaError, match=r"device 'meters.m0': timestamp \d+ \(2024-01-01T00:15"):
        TsFileWindowDataset(path, CONTEXT, HORIZON, freq="10min")
    with pytest.raises(SchemaError, match=r"snap=True .* origin="):
        TsFileWindowDataset(path, CONTEXT, HORIZON, freq="10min")


def test_snap_rounds_readings_to_the_nearest_step_and_refuses_two_on_one(tmp_path):
    jitter = np.array([0, 61_000, -59_000, 120_000, 0, -1000] * 10)  # within a minute
    steps = np.arange(60)
    devices = {"m0": (BASE + steps * Q + jitter, np.stack([steps, steps], 1).astype(float))}
    path = synthetic.write_table_devices(tmp_path / "j.tsfile", "meters", ["x", "y"], devices)
    with pytest.raises(SchemaError, match="not on the freq='15min' grid"):
        TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min")
    ds = TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min", snap=True,
                             return_timestamps=True)  # fmt: skip
    assert len(ds) == 60 - CONTEXT - HORIZON + 1
    x, y, xt, yt = ds[5]
    np.testing.assert_array_equal(x[:, 0], np.arange(5, 5 + CONTEXT))
    np.testing.assert_array_equal(xt, BASE + np.arange(5, 5 + CONTEXT) * Q)
    close = {"m0": (np.array([BASE, BASE + Q, BASE + Q + 60_000]), np.ones((3, 2)))}
    path = synthetic.write_table_devices(tmp_path / "c.tsfile", "meters", ["x", "y"], close)
    with pytest.raises(SchemaError, match="two readings round to the same freq='15min' step"):
        TsFileWindowDataset(path, 1, 0, freq="15min", snap=True)


def test_origin_puts_devices_on_one_phase(tmp_path):
    steps = {"m0": np.arange(40), "m1": np.arange(40)}
    start = {"m0": BASE + 5 * 60_000, "m1": BASE + 2 * Q + 5 * 60_000}
    path = write_meters(tmp_path, steps, start, files=1)
    origin = BASE + 5 * 60_000  # the grid of :05, :20, :35, :50
    ds = TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min", origin=origin,
                             return_dict=True)  # fmt: skip
    for d, name in enumerate(ds.devices):
        frame = reindexed(d, name.split(".")[1], steps, start, origin=origin)
        w = next(expected_windows(frame))
        first = ds[int(ds.index.first[d])]
        assert int(first["past_time"][0]) == w[0][0]
    with pytest.raises(SchemaError, match="origin="):
        TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min", origin=BASE)


def test_split_by_time_counts_grid_steps_across_a_hole(meters):
    ds = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="15min", return_dict=True)
    cut = START["m0"] + 60 * Q  # inside m0's hole (steps 40..69 are missing)
    train, validation = ds.split_by_time(cut)
    for d in range(len(ds.devices)):
        lo, hi = int(validation.index.first[d]), int(validation.index.first[d + 1])
        if hi > lo:
            first = validation[lo]
            assert int(first["future_time"][0]) >= cut
            assert int(first["future_time"][0]) - int(first["past_time"][-1]) == Q
    m0 = validation[int(validation.index.first[0])]
    assert int(m0["future_time"][0]) == cut  # the first forecast step is the cut, a hole's step
    assert int(m0["future_observed_mask"].sum()) == 0
    t_last = max(int(b["future_time"].max()) for b in make_loader(train, batch_size=256))
    assert t_last < cut


def test_min_context_pads_on_the_grid(meters):
    ds = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="15min", min_context=4,
                             return_dict=True)  # fmt: skip
    w = ds[0]
    np.testing.assert_array_equal(
        np.diff(np.r_[w["past_time"].numpy(), w["future_time"].numpy()]), Q
    )
    assert int(w["past_observed_mask"][: CONTEXT - 4].sum()) == 0


def test_a_tree_model_device_aligned_then_placed_on_the_grid(tmp_path):
    a_steps, b_steps = np.r_[0:30, 35:60], np.r_[0:20, 22:60]
    series = {
        "root.sg.d1": {
            "a": (BASE + a_steps * Q, a_steps.astype(float)),
            "b": (BASE + b_steps * Q, -b_steps.astype(float)),
        }
    }
    path = synthetic.write_tree_series(tmp_path / "tree.tsfile", series)
    ds = TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min", align="union",
                             return_dict=True)  # fmt: skip
    frame = pd.DataFrame(index=BASE + np.arange(60) * Q)
    frame["a"] = pd.Series(a_steps.astype(float), index=BASE + a_steps * Q)
    frame["b"] = pd.Series(-b_steps.astype(float), index=BASE + b_steps * Q)
    assert len(ds) == 60 - CONTEXT - HORIZON + 1
    for s, (times, values) in enumerate(expected_windows(frame[ds.columns])):
        w = ds[s]
        mask = np.concatenate([w["past_observed_mask"], w["future_observed_mask"]])
        np.testing.assert_array_equal(mask, ~np.isnan(values))
        np.testing.assert_array_equal(np.concatenate([w["past_time"], w["future_time"]]), times)


@pytest.mark.parametrize(
    ("freq", "message"),
    [
        ("1MS", "a fixed step"),
        ("fortnight", "a fixed step"),
        (0, "a positive step"),
        (True, "an offset alias"),
        ("1us", "not a whole number of the files' time unit 'ms'"),
    ],
)
def test_a_bad_freq_is_refused_naming_it(meters, freq, message):
    with pytest.raises((ValueError, TypeError), match=message):
        TsFileWindowDataset(meters, CONTEXT, HORIZON, freq=freq)


def test_snap_or_origin_without_freq_is_refused(meters):
    with pytest.raises(ValueError, match="pass freq= with them"):
        TsFileWindowDataset(meters, CONTEXT, HORIZON, snap=True)


def test_a_mixture_refuses_parts_on_different_grids_and_keeps_one_grid(meters):
    from tsfile_torch import MixedWindows

    a = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="15min", return_dict=True)
    b = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="5min", return_dict=True)
    with pytest.raises(ValueError, match=r"freq='5min' and datasets\[0\] on freq='15min'"):
        MixedWindows([a, b], num_samples=8)
    mix = MixedWindows([a, a], num_samples=64, seed=3)
    for batch in make_loader(mix, batch_size=16):
        steps = np.diff(np.concatenate([batch["past_time"], batch["future_time"]], 1), axis=1)
        assert (steps == Q).all()


@pytest.mark.parametrize("name", ["PatchTSTForPrediction", "PatchTSMixerForPrediction"])
def test_patch_models_train_on_the_grid_with_their_defaults(meters, name):
    transformers = pytest.importorskip("transformers")
    import torch

    from tsfile_torch import hf

    config = getattr(transformers, name.replace("ForPrediction", "Config"))(
        context_length=CONTEXT, prediction_length=HORIZON, num_input_channels=2,
        patch_length=4, patch_stride=4, d_model=16, num_hidden_layers=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, name)(config)
    with pytest.warns(UserWarning, match="left out"):
        ds = hf.windows_for(model, meters, freq="15min", keep=["device_id", "past_time"])
    complete, missing = set(), 0
    for d, device in enumerate(ds.devices):
        for times, values in expected_windows(reindexed(d, device.split(".")[1])):
            if np.isnan(values[CONTEXT:]).any():
                missing += 1
            else:
                complete.add((d, int(times[0])))
    assert ds.missing_future == missing
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    seen = set()
    for batch in make_loader(ds, batch_size=32, num_workers=2):
        starts = zip(batch.pop("device_id"), batch.pop("past_time")[:, 0], strict=True)
        seen |= {(int(d), int(t)) for d, t in starts}
        loss = model(**batch).loss
        assert torch.isfinite(loss)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert seen == complete  # exactly the windows with complete horizons


@pytest.mark.slow
def test_ray_windows_on_the_grid_match_the_dataset(meters):
    pytest.importorskip("ray")
    import ray

    from tsfile_torch.ray import read_tsfile_windows

    ray.init(num_cpus=2, include_dashboard=False, ignore_reinit_error=True)
    try:
        data = read_tsfile_windows(meters, CONTEXT, HORIZON, freq="15min", fill="zero")
        rows = data.take_all()
    finally:
        ray.shutdown()
    ds = TsFileWindowDataset(meters, CONTEXT, HORIZON, freq="15min", fill="zero")
    assert len(rows) == len(ds)
    x, y = ds[len(ds) - 1]
    last = rows[-1]
    got = [np.asarray(v) for v in last.values() if np.asarray(v).shape == tuple(x.shape)]
    assert any(np.array_equal(g, x.numpy()) for g in got)


@pytest.mark.parametrize("block_rows", [32, 32768])  # few runs per read: copies; many: scatter
def test_many_short_runs_and_few_long_ones_read_the_same(tmp_path, block_rows):
    steps = {"m0": np.array([s for s in range(300) if s % 3 != 1]), "m1": np.r_[0:120, 130:300]}
    start = {"m0": BASE, "m1": BASE}
    path = write_meters(tmp_path, steps, start, files=1)
    ds = TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min", return_dict=True,
                             block_rows=block_rows)  # fmt: skip
    i = 0
    for d, name in enumerate(ds.devices):
        for times, values in expected_windows(reindexed(d, name.split(".")[1], steps, start)):
            w = ds[i]
            i += 1
            got = np.concatenate([w["past_values"], w["future_values"]])
            np.testing.assert_array_equal(got, values)
            np.testing.assert_array_equal(np.concatenate([w["past_time"], w["future_time"]]), times)
    assert i == len(ds)


def test_a_grid_in_the_wrong_time_unit_is_refused_naming_the_unit(tmp_path):
    steps = np.arange(50)
    devices = {"m0": (BASE * 1_000_000 + steps * Q * 1_000_000, np.ones((50, 2)))}  # ns
    path = synthetic.write_table_devices(tmp_path / "ns.tsfile", "meters", ["x", "y"], devices)
    with pytest.raises(SchemaError, match=r"look like 'ns': pass time_unit='ns'"):
        TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min")
    ds = TsFileWindowDataset(path, CONTEXT, HORIZON, freq="15min", time_unit="ns")
    assert len(ds) == 50 - CONTEXT - HORIZON + 1
