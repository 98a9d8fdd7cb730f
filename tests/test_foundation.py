"""Foundation models on TsFiles: Chronos-Bolt, Chronos-2, TimesFM 2.5 windows (``hf.windows_for``)
and whole series for GluonTS and ``Chronos2Pipeline`` (``TsFileSeriesDataset``).

The data: a real TsFile in tmp_path with two devices on their own clocks (one second grid),
grid holes (missing timestamps) and empty cells, where the value of device ``d``, field ``j``
at grid step ``s`` is ``1000 * d + 100 * j + s`` (so every expected item is one line). Models
are tiny, built from configs in code (no hub).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from tsfile_torch import TsFileSeriesDataset, hf, make_loader, synthetic

STEP = 1000  # ms
FIELDS = ["f0", "f1", "f2"]
STEPS = {0: 120, 1: 90}  # grid steps of devices s0, s1
FIRST = {0: 0, 1: 5 * STEP}  # their first timestamps
HOLES = {0: [30, 31, 32], 1: []}  # grid steps without a timestamp
EMPTY = {0: [(50, 0), (70, 1)], 1: [(20, 2)]}  # (step, field) cells written null
CONTEXT, HORIZON = 16, 4


def value(d: int, j: int, s: int) -> float:
    """The value of device d, field j at grid step s (NaN where missing)."""
    if s < 0 or s >= STEPS[d] or s in HOLES[d] or (s, j) in EMPTY[d]:
        return math.nan
    return 1000.0 * d + 100.0 * j + s


def expected(d: int, fields: list[int], start: int, steps: int) -> np.ndarray:
    """(steps, len(fields)) values of device d from grid step ``start``."""
    return np.array([[value(d, j, s) for j in fields] for s in range(start, start + steps)])


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    path = tmp_path_factory.mktemp("foundation") / "meters.tsfile"
    devices = {}
    for d, n in STEPS.items():
        steps = np.array([s for s in range(n) if s not in HOLES[d]])
        values = np.array([[value(d, j, s) for j in range(3)] for s in steps])
        for s, j in EMPTY[d]:
            values[np.flatnonzero(steps == s), j] = np.nan
        devices[f"s{d}"] = (FIRST[d] + steps * STEP, values)
    synthetic.write_table_devices(path, "meters", FIELDS, devices)
    return str(path)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def probe(path: str, horizon: int = HORIZON):
    return hf.TsFileWindowDataset(path, CONTEXT, horizon, return_dict=True, freq=STEP)


def bolt(path: str, **overrides):
    chronos_bolt = pytest.importorskip("chronos.chronos_bolt")
    torch.manual_seed(0)
    config = hf.config_for(
        "ChronosBoltModelForForecasting", probe(path), d_model=16, d_ff=32, d_kv=8,
        num_heads=2, num_layers=1, num_decoder_layers=1,
        chronos_config={"input_patch_size": 4, "input_patch_stride": 4, **overrides},
    )  # fmt: skip
    return chronos_bolt.ChronosBoltModelForForecasting(config)


def chronos2(path: str, max_output_patches: int | None = None):
    model = pytest.importorskip("chronos.chronos2.model")
    torch.manual_seed(0)
    patches = {"max_output_patches": max_output_patches} if max_output_patches else {}
    config = hf.config_for(
        "Chronos2Model", probe(path), d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1,
        chronos_config={
            "input_patch_size": 4, "input_patch_stride": 4, "output_patch_size": 4, **patches
        },
    )  # fmt: skip
    return model.Chronos2Model(config)


def timesfm(path: str):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "TimesFm2_5ModelForPrediction"):
        pytest.skip(f"transformers>={hf.TIMESFM_2_5_TRANSFORMERS} has TimesFM 2.5")
    torch.manual_seed(0)
    config = hf.config_for(
        "TimesFm2_5ModelForPrediction", probe(path), patch_length=4, num_hidden_layers=1,
        hidden_size=16, intermediate_size=16, head_dim=8, num_attention_heads=2,
        num_key_value_heads=2, output_quantile_len=8,
    )  # fmt: skip
    return transformers.TimesFm2_5ModelForPrediction(config)


def windows_of(ds, n: int) -> list[tuple[int, int]]:
    """(device index, first grid step) of windows 0..n-1."""
    out = []
    for i in range(n):
        info = ds.window_info(i)
        out.append((ds.devices.index(info.device), info.start_row))
    return out


def nan_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a, dtype=np.float64), np.asarray(b), equal_nan=True)


def test_chronos_bolt_gets_one_row_per_column_with_nan_and_a_false_mask_where_missing(panel):
    model = bolt(panel)
    assert model.config.initializer_factor == 0.05  # the published value, not T5's 1.0
    ds = hf.windows_for(model, panel, ["f0", "f1"], freq=STEP, fill="zero")
    batch = next(iter(make_loader(ds, batch_size=4)))
    assert list(batch) == ["context", "mask", "target", "target_mask"]
    assert batch["context"].shape == (8, CONTEXT) and batch["target"].shape == (8, HORIZON)
    for b, (d, start) in enumerate(windows_of(ds, 4)):
        for j in range(2):
            past = expected(d, [j], start, CONTEXT)[:, 0]
            future = expected(d, [j], start + CONTEXT, HORIZON)[:, 0]
            # NaN even with fill="zero": Chronos scales by nanmean of the values themselves
            assert nan_equal(batch["context"][2 * b + j], past)
            assert torch.equal(batch["mask"][2 * b + j], torch.from_numpy(~np.isnan(past)))
            assert nan_equal(batch["target"][2 * b + j], future)
            assert torch.equal(batch["target_mask"][2 * b + j], torch.from_numpy(~np.isnan(future)))


def test_chronos_bolt_windows_with_holes_are_served_and_masked(panel):
    ds = hf.windows_for(bolt(panel), panel, ["f0", "f1"], freq=STEP)
    holes = [i for i in range(len(ds)) if ds.window_info(i).start_row == 20]
    batch = ds.__getitems__(holes)  # device s0 from step 20: grid holes 30-32 in its context
    context = dict(zip(batch.keys, batch.parts, strict=True))["context"]
    assert torch.isnan(context[0, 10:13]).all() and not torch.isnan(context[0, :10]).any()
    assert len(ds) == sum(n - CONTEXT - HORIZON + 1 for n in STEPS.values())


def test_chronos2_groups_a_window_s_columns_and_leaves_covariates_out_of_the_loss(panel):
    model = chronos2(panel, max_output_patches=2)
    ds = hf.windows_for(
        model, panel, ["f1", "f2", "f0"], targets=["f0"], known=["f2"], freq=STEP, horizon=6
    )
    assert ds.columns == ["f0", "f1", "f2"]  # targets, past-only covariates, known ones
    batch = next(iter(make_loader(ds, batch_size=2)))
    assert batch["num_output_patches"] == 2  # ceil(6 / 4)
    assert batch["group_ids"].tolist() == [0, 0, 0, 1, 1, 1]
    for b, (d, start) in enumerate(windows_of(ds, 2)):
        future = expected(d, [0, 1, 2], start + CONTEXT, 6)
        rows = slice(3 * b, 3 * b + 3)
        assert nan_equal(batch["context"][rows], expected(d, [0, 1, 2], start, CONTEXT).T)
        assert nan_equal(batch["future_target"][3 * b], future[:, 0])
        assert torch.isnan(batch["future_target"][3 * b + 1 : 3 * b + 3]).all()
        assert not batch["future_target_mask"][3 * b + 1 : 3 * b + 3].any()
        assert torch.isnan(batch["future_covariates"][3 * b : 3 * b + 2]).all()
        assert nan_equal(batch["future_covariates"][3 * b + 2], future[:, 2])
    out = model(**batch)
    assert torch.isfinite(out.loss) and out.quantile_preds.shape == (6, 21, 8)


def test_timesfm_gets_only_complete_windows_and_says_how_many_it_left_out(panel):
    with pytest.warns(UserWarning, match=r"left out (\d+) of (\d+) windows") as caught:
        ds = hf.windows_for(timesfm(panel), panel, ["f0", "f1"], freq=STEP)
    complete = [
        (d, s)
        for d, n in STEPS.items()
        for s in range(n - CONTEXT - HORIZON + 1)
        if not np.isnan(expected(d, [0, 1], s, CONTEXT + HORIZON)).any()
    ]
    total = sum(n - CONTEXT - HORIZON + 1 for n in STEPS.values())
    message = str(caught[0].message)
    assert f"left out {total - len(complete)} of {total} windows" in message
    assert len(ds) == len(complete) and windows_of(ds, len(ds)) == complete
    batch = next(iter(make_loader(ds, batch_size=3)))
    assert list(batch) == ["past_values", "future_values"]
    d, s = complete[0]
    assert nan_equal(batch["past_values"][1], expected(d, [1], s, CONTEXT)[:, 0])
    assert not torch.isnan(batch["past_values"]).any()


def test_timesfm_refuses_a_max_missing_that_would_feed_it_nan(panel):
    with pytest.raises(ValueError, match=r"max_missing=0.2.*complete windows only"):
        hf.windows_for(timesfm(panel), panel, ["f0"], freq=STEP, max_missing=0.2)


@pytest.mark.parametrize(
    "make, kwargs, message",
    [
        (bolt, {"context_length": 3}, r"context_length 3 is shorter than one patch .* = 4"),
        (bolt, {"context_length": 17}, r"context_length=17 is longer than .*context_length = 16"),
        (bolt, {"horizon": 5}, r"horizon=5 is longer than .*prediction_length = 4"),
        (chronos2, {}, r"has no horizon: pass horizon= .* at most 4"),
        (chronos2, {"horizon": 9}, r"horizon=9 is longer than .*max_output_patches \* "),
        (bolt, {"known": ["f1"]}, r"takes no future covariates"),
        (bolt, {"targets": ["f0"]}, r"forecasts the series it reads"),
        (bolt, {"keep": ["device_id"]}, r"items are rows"),
    ],
)
def test_a_row_family_config_that_does_not_fit_is_an_error_naming_both(
    panel, make, kwargs, message
):
    kwargs = {"columns": ["f0", "f1"], **kwargs}
    with pytest.raises(ValueError, match=message):
        hf.windows_for(make(panel), panel, freq=STEP, **kwargs)


def test_a_shorter_context_and_horizon_than_the_config_s_train_the_same_model(panel):
    model = bolt(panel)
    ds = hf.windows_for(model, panel, ["f0"], freq=STEP, context_length=8, horizon=2)
    batch = next(iter(make_loader(ds, batch_size=4)))
    assert batch["context"].shape == (4, 8) and batch["target"].shape == (4, 2)
    assert torch.isfinite(model(**batch).loss)


def test_a_pipeline_is_resolved_to_its_model(panel):
    pipeline = pytest.importorskip("chronos.chronos_bolt")
    model = bolt(panel)
    ds = hf.windows_for(pipeline.ChronosBoltPipeline(model), panel, ["f0"], freq=STEP)
    assert ds.inputs.family.model == "ChronosBoltModelForForecasting"


# -- whole series ------------------------------------------------------------------------------
def test_a_series_item_is_a_gluonts_entry_of_the_device_s_grid(panel):
    ds = TsFileSeriesDataset(panel, ["f0", "f1", "f2"], targets=["f0", "f1"], freq="1s")
    assert len(ds) == 4 and ds.freq == "s"
    item = ds[1]  # device s0, target f1
    assert item["item_id"] == "meters.s0/f1"
    assert item["start"] == pd.Period("1970-01-01 00:00:00", freq="s")
    assert nan_equal(item["target"], expected(0, [1], 0, STEPS[0])[:, 0])
    assert item["target"].dtype == np.float32
    assert nan_equal(item["past_feat_dynamic_real"], expected(0, [2], 0, STEPS[0]).T)
    assert "feat_dynamic_real" not in item
    assert item["feat_static_cat"].tolist() == [0]
    other = ds[2]  # device s1, its own clock
    assert other["start"] == pd.Period("1970-01-01 00:00:05", freq="s")
    assert other["feat_static_cat"].tolist() == [1]
    assert [e["item_id"] for e in ds] == [e["item_id"] for e in ds]  # re-iterable


def test_series_known_columns_multivariate_targets_and_max_length(panel):
    ds = TsFileSeriesDataset(
        panel, targets=["f0", "f1"], known=["f2"], freq=STEP, multivariate=True, max_length=50
    )
    assert len(ds) == 2
    item = ds[0]
    assert item["item_id"] == "meters.s0" and item["target"].shape == (2, 50)
    assert nan_equal(item["target"], expected(0, [0, 1], STEPS[0] - 50, 50).T)
    assert nan_equal(item["feat_dynamic_real"], expected(0, [2], STEPS[0] - 50, 50).T)
    assert item["start"] == pd.Period(pd.Timestamp((STEPS[0] - 50) * STEP, unit="ms"), "s")


def test_series_split_by_time_cuts_train_and_keeps_test_whole(panel):
    ds = TsFileSeriesDataset(panel, ["f0"], freq=STEP)
    train, test = ds.split_by_time(60 * STEP)
    assert nan_equal(train[0]["target"], expected(0, [0], 0, 60)[:, 0])
    assert nan_equal(train[1]["target"], expected(1, [0], 0, 55)[:, 0])
    assert nan_equal(test[0]["target"], ds[0]["target"])


def test_series_need_a_freq(panel):
    with pytest.raises(ValueError, match="freq is required"):
        TsFileSeriesDataset(panel, ["f0"], freq=None)


def test_chronos2_inputs_are_per_device_dicts_that_chronos_accepts(panel):
    preprocess = pytest.importorskip("chronos.chronos2.preprocess")
    ds = TsFileSeriesDataset(panel, ["f0", "f1", "f2"], targets=["f0"], known=["f2"], freq=STEP)
    inputs = ds.chronos2_inputs()
    assert len(inputs) == 2
    assert nan_equal(inputs[1]["target"], expected(1, [0], 0, STEPS[1])[:, 0])
    assert sorted(inputs[1]["past_covariates"]) == ["f1", "f2"]
    assert inputs[1]["future_covariates"] == {"f2": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = preprocess.from_list_of_dicts(inputs, prediction_length=HORIZON)
    assert len(prepared) == 2 and int(prepared[0]["n_future_covariates"]) == 1


# -- training ----------------------------------------------------------------------------------
def _train(model, ds, steps: int = 8, lr: float = 1e-2) -> list[float]:
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    loader = make_loader(ds, batch_size=8, num_workers=2)
    while len(losses) < steps:
        for batch in loader:
            loss = model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if len(losses) == steps:
                break
    return losses


def _check_learns(losses: list[float]) -> None:
    assert all(math.isfinite(x) for x in losses), losses
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), losses


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bolt", "chronos2", "timesfm"])
def test_each_row_family_trains_through_two_workers_and_forecasts(panel, name):
    make = {"bolt": bolt, "chronos2": chronos2, "timesfm": timesfm}[name]
    model = make(panel)
    options = {"horizon": HORIZON} if name == "chronos2" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TimesFM: the windows left out
        ds = hf.windows_for(
            model, panel, ["f0", "f1"], freq=STEP, order="shuffle", seed=0, **options
        )
    _check_learns(_train(model, ds))
    model.eval()
    batch = next(iter(make_loader(ds, batch_size=4)))
    with torch.no_grad():
        out = model(**ds.forecast_inputs(batch))
    assert out.loss is None
    forecast = out.mean_predictions if name == "timesfm" else out.quantile_preds
    assert forecast.shape[0] == 8 and torch.isfinite(forecast).all()


@pytest.mark.slow
def test_a_gluonts_estimator_trains_on_the_series_and_forecasts_every_device(panel, tmp_path):
    deepar = pytest.importorskip("gluonts.torch")
    ds = TsFileSeriesDataset(panel, ["f0"], freq="1s")
    train, _ = ds.split_by_time(60 * STEP)
    estimator = deepar.DeepAREstimator(
        freq=ds.freq, prediction_length=HORIZON, context_length=CONTEXT, num_layers=1,
        hidden_size=8, batch_size=8, num_batches_per_epoch=3,
        trainer_kwargs={
            "max_epochs": 1, "enable_progress_bar": False, "enable_model_summary": False,
            "logger": False, "accelerator": "cpu", "default_root_dir": str(tmp_path),
        },
    )  # fmt: skip
    predictor = estimator.train(train)
    forecasts = list(predictor.predict(train))
    assert [f.item_id for f in forecasts] == ["meters.s0/f0", "meters.s1/f0"]
    assert forecasts[0].start_date == pd.Period("1970-01-01 00:01:00", freq="s")
    assert all(np.isfinite(f.mean).all() and f.mean.shape == (HORIZON,) for f in forecasts)


@pytest.mark.slow
def test_chronos2_pipeline_fits_on_the_series_inputs(panel, tmp_path):
    pipeline = pytest.importorskip("chronos.chronos2")
    ds = TsFileSeriesDataset(panel, ["f0", "f1"], targets=["f0"], freq=STEP)
    fitted = pipeline.Chronos2Pipeline(chronos2(panel)).fit(
        ds.chronos2_inputs(), prediction_length=HORIZON, num_steps=3, batch_size=8,
        learning_rate=1e-3, output_dir=str(tmp_path), report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    forecasts = fitted.predict(ds.chronos2_inputs(), prediction_length=HORIZON)
    assert len(forecasts) == 2 and all(torch.isfinite(f).all() for f in forecasts)
