"""Windows for Hugging Face time-series models (issue 24): ``model(**batch)`` as it comes.

Tiny randomly initialised models built from configs (no downloads) take one batch each from
``make_loader``. Data are real TsFiles in tmp_path: a panel from ``synthetic.write_panel``
(field ``f{j}`` of device ``s{d}`` at row ``r`` is ``synthetic.value_of(d, j, r)``), the same
with nulls at known rows, and sines for the training runs.
"""

from __future__ import annotations

import inspect
import runpy
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tsfile_torch import TsFileWindowDataset, hf, make_loader, synthetic

transformers = pytest.importorskip("transformers")

ROWS = [400, 300, 250]  # rows of devices meters.s0, s1, s2
CONTEXT, HORIZON, LAGS = 24, 6, [1, 2, 5]
ALL = sorted(name for name, f in hf.FAMILIES.items() if not f.rows)  # row families: test_foundation
LAG_FAMILY = [name for name in ALL if hf.FAMILIES[name].lags]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "hf_forecast.py"


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models on a shared machine: one thread is 10x faster than contended two."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    directory = tmp_path_factory.mktemp("panel")
    synthetic.write_panel(directory, num_devices=3, num_fields=2, num_rows=ROWS, num_files=2)
    return directory


def _holes(rows: np.ndarray, field: int) -> np.ndarray:
    """Rows where field ``field`` is null in the ``holes`` data."""
    return rows % (37 + 16 * field) == 5 + 2 * field


@pytest.fixture(scope="module")
def holes(tmp_path_factory):
    """The panel's values with nulls: f0 at rows 5, 42, 79...; f1 at rows 7, 60, 113..."""
    path = tmp_path_factory.mktemp("holes") / "holes.tsfile"
    devices = {}
    for d, n in enumerate(ROWS):
        rows = np.arange(n)
        values = np.stack([synthetic.value_of(d, j, rows) for j in range(2)], axis=1)
        for j in range(2):
            values[_holes(rows, j), j] = np.nan
        devices[f"s{d}"] = (synthetic.panel_device_times(d, rows), values)
    synthetic.write_table_devices(path, "meters", ["f0", "f1"], devices)
    return path


def tiny(name: str, channels: int = 2, **overrides):
    """A small randomly initialised model of class ``name`` (seeded)."""
    torch.manual_seed(0)
    common = dict(context_length=CONTEXT, prediction_length=HORIZON)
    if name == "PatchTSTForPrediction":
        config = transformers.PatchTSTConfig(
            **common, num_input_channels=channels, patch_length=4, patch_stride=4, d_model=16,
            num_attention_heads=2, num_hidden_layers=1, ffn_dim=16, **overrides,
        )  # fmt: skip
    elif name == "PatchTSMixerForPrediction":
        config = transformers.PatchTSMixerConfig(
            **common, num_input_channels=channels, patch_length=4, patch_stride=4, d_model=16,
            num_layers=1, **overrides,
        )  # fmt: skip
    else:
        kwargs = dict(
            input_size=channels, lags_sequence=LAGS, num_time_features=1, d_model=16,
            encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        )  # fmt: skip
        config = getattr(transformers, hf.FAMILIES[name].config)(
            **{**common, **kwargs, **overrides}
        )
    return getattr(transformers, name)(config)


def first_batch(ds, batch_size: int = 16, **loader_kwargs) -> dict[str, torch.Tensor]:
    return next(iter(make_loader(ds, batch_size=batch_size, **loader_kwargs)))


def forward_arguments(model) -> set[str]:
    parameters = inspect.signature(model.forward).parameters.values()
    return {p.name for p in parameters if p.kind is not p.VAR_KEYWORD}


def loss(model, batch) -> float:
    with torch.no_grad():
        return float(model(**batch).loss)


@pytest.mark.parametrize("name", ALL)
def test_a_batch_goes_into_each_model_as_it_is_and_every_key_is_a_forward_argument(name, panel):
    model = tiny(name)
    ds = hf.windows_for(model, panel, columns=["f0", "f1"], stride=5, shuffle=True)
    batch = first_batch(ds)
    assert set(batch) <= forward_arguments(model)  # nothing a **kwargs would swallow
    assert list(batch) == ds.forward_keys
    out = model(**batch)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    past = CONTEXT + (max(LAGS) if hf.FAMILIES[name].lags else 0)
    assert batch["past_values"].shape == (16, past, 2)
    assert batch["future_values"].shape == (16, HORIZON, 2)


def test_patch_models_get_past_values_mask_and_future_values_only(panel):
    patchtst = first_batch(hf.windows_for(tiny("PatchTSTForPrediction"), panel))
    mixer = first_batch(hf.windows_for(tiny("PatchTSMixerForPrediction"), panel))
    assert list(patchtst) == ["past_values", "past_observed_mask", "future_values"]
    assert list(mixer) == ["past_values", "observed_mask", "future_values"]  # its name


def test_values_masks_and_time_features_are_the_files_own(panel):
    model = tiny(
        "TimeSeriesTransformerForPrediction", channels=1, num_time_features=2,
        num_static_categorical_features=1, cardinality=[3],
    )  # fmt: skip
    ds = hf.windows_for(
        model, panel, columns=["f1"], stride=7, order="batches", time_features=["hour_of_day"]
    )
    indices = [0, 3, len(ds) - 1, 40, 41]
    batch = ds.__getitems__(indices)
    items = dict(zip(batch.keys, batch.parts, strict=True))
    past = CONTEXT + max(LAGS)
    assert items["past_values"].shape == (5, past)  # univariate: squeezed
    for n, i in enumerate(indices):
        info = ds.window_info(i)
        d = int(info.device[-1])
        rows = np.arange(info.start_row, info.start_row + past + HORIZON)
        values = synthetic.value_of(d, 1, rows).astype(np.float32)
        assert np.array_equal(items["past_values"][n].numpy(), values[:past])
        assert np.array_equal(items["future_values"][n].numpy(), values[past:])
        assert items["past_observed_mask"][n].eq(1).all()
        age = np.log10(2.0 + rows).astype(np.float32)
        np.testing.assert_allclose(items["past_time_features"][n, :, 1], age[:past], rtol=1e-6)
        np.testing.assert_allclose(items["future_time_features"][n, :, 1], age[past:], rtol=1e-6)
        assert items["static_categorical_features"][n].tolist() == [d]  # tag s{d}: code d
    assert ds.tag_vocab == [["s0", "s1", "s2"]]


def test_age_counts_rows_from_the_device_start_after_max_missing_drops_windows(holes):
    model = tiny("InformerForPrediction", channels=1)
    ds = hf.windows_for(model, holes, columns=["f0"], max_missing=0.0)
    batch = first_batch(ds, batch_size=len(ds))
    ages = batch["past_time_features"][:, 0, 0].double()
    starts = np.array([ds.window_info(i).start_row for i in range(len(ds))])
    assert len(np.unique(np.diff(starts))) > 1  # windows over nulls were dropped
    np.testing.assert_allclose(ages.numpy(), np.log10(2.0 + starts), rtol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_the_loss_sees_the_past_observed_mask(name, panel):
    model = tiny(name).eval()
    batch = first_batch(hf.windows_for(model, panel, columns=["f0", "f1"], stride=9))
    key = hf.FAMILIES[name].past_mask
    masked = {**batch, key: batch[key].clone()}
    masked[key][:, -CONTEXT // 2 :] = 0.0
    assert loss(model, masked) != loss(model, batch)


@pytest.mark.parametrize("name", LAG_FAMILY)
def test_the_loss_of_the_lag_family_skips_masked_future_values(name, holes):
    model = tiny(name).eval()
    ds = hf.windows_for(model, holes, columns=["f0", "f1"])  # fill="nan": NaN where null
    batch = first_batch(ds, batch_size=len(ds))
    assert (batch["future_observed_mask"] == 0).any()
    assert not any(v.isnan().any() for v in batch.values())
    assert np.isfinite(loss(model, batch))
    # the last step of the horizon masked: no later step reads it as a lag, so whatever fills
    # it there cannot change the loss
    masked = {k: v.clone() for k, v in batch.items()}
    masked["future_observed_mask"][:, -1] = 0.0
    filled = {k: v.clone() for k, v in masked.items()}
    filled["future_values"][:, -1] = 1e6
    assert loss(model, filled) == loss(model, masked) != loss(model, batch)


def _future_holes() -> tuple[int, list[tuple[int, int]]]:
    """Return (all windows, (device, start) of each window whose horizon holds a null of f0 or
    f1) of the ``holes`` panel."""
    windows, bad = 0, []
    for d, n in enumerate(ROWS):
        r = np.arange(n)
        null = _holes(r, 0) | _holes(r, 1)
        for s in range(n - CONTEXT - HORIZON + 1):
            windows += 1
            if null[s + CONTEXT : s + CONTEXT + HORIZON].any():
                bad.append((d, s))
    return windows, bad


@pytest.mark.parametrize("name", ["PatchTSTForPrediction", "PatchTSMixerForPrediction"])
def test_a_model_without_future_mask_leaves_out_exactly_the_windows_with_missing_targets(
    name, holes
):
    model = tiny(name)
    windows, bad = _future_holes()
    with pytest.warns(UserWarning, match=rf"left out {len(bad)} of {windows} windows whose"):
        ds = hf.windows_for(model, holes, columns=["f0", "f1"], keep=["device_id", "past_time"])
    assert ds.missing_future == len(bad) and len(ds) == windows - len(bad)
    batch = first_batch(ds, batch_size=len(ds))
    got = {
        (int(d), (int(t) - int(d)) // (int(d) % 3 + 1))  # synthetic.panel_device_times
        for d, t in zip(batch.pop("device_id"), batch.pop("past_time")[:, 0], strict=True)
    }
    every = {(d, s) for d, n in enumerate(ROWS) for s in range(n - CONTEXT - HORIZON + 1)}
    assert got == every - set(bad)  # exactly the windows with complete horizons
    mask = next(v for k, v in batch.items() if k.endswith("observed_mask"))
    assert (mask == 0).any()  # past gaps kept, masked
    assert not any(v.isnan().any() for v in batch.values())
    assert np.isfinite(loss(model.eval(), batch))


@pytest.mark.parametrize("name", ["PatchTSTForPrediction", "PatchTSMixerForPrediction"])
def test_future_missing_error_refuses_and_proposes_a_fix_that_leaves_windows(name, holes):
    model = tiny(name)
    windows, bad = _future_holes()
    with pytest.raises(ValueError, match=rf"^{len(bad)} of {windows} windows have a missing") as e:
        hf.windows_for(model, holes, columns=["f0", "f1"], future_missing="error")
    assert f"train on the {windows - len(bad)} others" in str(e.value)
    # the fix it proposes works on this data
    clean = hf.windows_for(model, holes, columns=["f0", "f1"], future_missing="drop")
    assert len(clean) == windows - len(bad) > 0
    plain = TsFileWindowDataset(holes, CONTEXT, HORIZON, return_dict=True, max_future_missing=0.0)
    assert len(plain) == len(clean)
    assert first_batch(plain, batch_size=len(plain))["future_observed_mask"].eq(1).all()


def test_keeping_missing_future_values_is_an_opt_in_that_trains_on_the_fill(holes):
    model = tiny("PatchTSTForPrediction").eval()
    ds = hf.windows_for(model, holes, columns=["f0", "f1"], future_missing="keep", keep="device_id")
    windows, bad = _future_holes()
    assert ds.missing_future == len(bad) and len(ds) == windows  # counted, all served
    batch = first_batch(ds, batch_size=len(ds))
    assert not any(v.isnan().any() for v in batch.values())  # fill="nan" became 0
    assert (batch["future_values"] == 0).any() and (batch["past_observed_mask"] == 0).any()
    assert batch.pop("device_id").shape == (len(ds),)
    assert np.isfinite(loss(model, batch))


def test_two_workers_and_a_disk_cache_give_the_items_one_process_does(panel, tmp_path):
    def items(workers=0, **options):
        model = tiny("TimeSeriesTransformerForPrediction", num_time_features=2)
        ds = hf.windows_for(
            model, panel, columns=["f0", "f1"], stride=3, shuffle=True, seed=4,
            time_features=["minute_of_hour"], keep=["device_id", "past_time"], **options,
        )  # fmt: skip
        out = {}  # the order depends on the number of workers: items by window
        for batch in make_loader(ds, batch_size=32, num_workers=workers):
            for i, (d, t) in enumerate(
                zip(batch["device_id"], batch["past_time"][:, 0], strict=True)
            ):
                out[int(d), int(t)] = [batch[k][i] for k in batch]
        assert len(out) == len(ds)
        return out

    alone = items()
    for other in (items(workers=2), items(workers=2, cache="disk", cache_dir=tmp_path)):
        assert other.keys() == alone.keys()
        assert all(
            torch.equal(a, b) for w in alone for a, b in zip(alone[w], other[w], strict=True)
        )


def test_a_loader_resumes_mid_epoch_with_model_items(panel):
    pytest.importorskip("torchdata")

    def build():
        ds = hf.windows_for(tiny("PatchTSTForPrediction"), panel, stride=4, shuffle=True, seed=2)
        return make_loader(ds, batch_size=16, stateful=True)

    uninterrupted = list(build())
    loader = build()
    for step, _ in enumerate(loader):
        if step == 4:
            state = loader.state_dict()
            break
    loader = build()
    loader.load_state_dict(state)
    rest = list(loader)
    assert len(rest) == len(uninterrupted) - 5
    for a, b in zip(uninterrupted[5:], rest, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)


KEYS = ["device_id", "past_time"]


def _windows(batch) -> list[tuple[int, int]]:
    """(device, first timestamp) of each window of a batch made with keep=KEYS."""
    return list(zip(batch["device_id"].tolist(), batch["past_time"][:, 0].tolist(), strict=True))


def test_ddp_ranks_share_the_windows_out(panel):
    model = tiny("PatchTSMixerForPrediction")
    seen = []
    for rank in range(2):
        ds = hf.windows_for(model, panel, stride=10, rank=rank, world_size=2, keep=KEYS)
        seen += [window for batch in make_loader(ds, batch_size=8) for window in _windows(batch)]
    every = hf.windows_for(model, panel, stride=10, keep=KEYS)
    assert len(seen) == 2 * -(-len(every) // 2)  # each rank the same count (DDP padding)
    assert set(seen) == set(_windows(first_batch(every, batch_size=len(every))))


@pytest.mark.parametrize("name", [*LAG_FAMILY, "PatchTSTForPrediction"])
def test_generate_on_a_validation_split_returns_samples_per_window(name, panel):
    probabilistic = {"loss": "nll", "distribution_output": "normal"}
    model = tiny(name, **(probabilistic if not hf.FAMILIES[name].lags else {}))
    ds = hf.windows_for(model, panel, columns=["f0", "f1"], stride=5)
    train, valid = ds.split_by_time(500)
    assert isinstance(valid, hf.HFWindows) and list(first_batch(valid)) == list(first_batch(train))
    batch = first_batch(valid, batch_size=4)
    samples = model.eval().generate(**valid.generate_inputs(batch)).sequences
    assert samples.shape == (4, model.config.num_parallel_samples, HORIZON, 2)


def test_config_from_the_dataset_builds_models_that_take_its_windows(panel):
    plain = TsFileWindowDataset(
        panel, CONTEXT, HORIZON, columns=["f0"], return_dict=True, time_features=["day_of_week"]
    )
    kwargs = hf.config_kwargs(plain, "TimeSeriesTransformerForPrediction")
    assert kwargs == {
        "context_length": CONTEXT,
        "prediction_length": HORIZON,
        "input_size": 1,
        "num_time_features": 2,  # day_of_week and the age feature
        "num_static_categorical_features": 1,  # the tag level "id"
        "cardinality": [3],
    }
    small = {"d_model": 16, "encoder_layers": 1, "decoder_layers": 1, "lags_sequence": [1, 2]}
    config = hf.config_for("TimeSeriesTransformerForPrediction", plain, **small)
    model = transformers.TimeSeriesTransformerForPrediction(config)
    windows = hf.windows_for(model, panel, columns=["f0"], time_features=["day_of_week"])
    assert hf.config_kwargs(windows, type(model)) == kwargs  # the model's context, not the past
    assert windows.context_length == CONTEXT + 2
    assert np.isfinite(loss(model.eval(), first_batch(windows)))
    config = hf.config_for(transformers.PatchTSTForPrediction, plain, patch_length=4, d_model=16)
    assert (config.context_length, config.num_input_channels) == (CONTEXT, 1)
    model = transformers.PatchTSTForPrediction(config)
    assert np.isfinite(loss(model.eval(), first_batch(hf.windows_for(model, panel, columns="f0"))))


def test_static_features_come_from_the_device_index_when_asked(panel):
    model = tiny(
        "AutoformerForPrediction", num_static_categorical_features=1, cardinality=[3]
    ).eval()
    by_device = hf.windows_for(model, panel, static_categorical="device", stride=50)
    batch = first_batch(by_device, batch_size=len(by_device))
    assert batch["static_categorical_features"].flatten().unique().tolist() == [0, 1, 2]
    assert np.isfinite(loss(model, batch))
    plain = tiny("AutoformerForPrediction")  # num_static_categorical_features=0: none given
    assert "static_categorical_features" not in first_batch(hf.windows_for(plain, panel))


@pytest.mark.parametrize(
    "name, change, options, message",
    [
        ("PatchTSTForPrediction", {}, {"columns": ["f0"]},
         r"PatchTSTConfig.num_input_channels is 2 but the windows hold 1 series .* "
         r"num_input_channels=1"),
        ("InformerForPrediction", {"input_size": 3}, {},
         r"InformerConfig.input_size is 3 but the windows hold 2 series .*input_size=2"),
        ("TimeSeriesTransformerForPrediction", {}, {"time_features": ["hour_of_day"]},
         r"num_time_features is 1 but the windows give 2 \(time_features=\['hour_of_day'\] and "
         r"the age feature\); build the config with num_time_features=2"),
        ("TimeSeriesTransformerForPrediction", {"num_time_features": 2}, {},
         r"num_time_features is 2 but the windows give 1"),
        ("AutoformerForPrediction",
         {"num_static_categorical_features": 1, "cardinality": [2]}, {},
         r"cardinality is \[2\] but the tag levels \(tag_vocab sizes \[3\]\) need at least \[3\]"),
        ("AutoformerForPrediction",
         {"num_static_categorical_features": 2, "cardinality": [3, 3]}, {},
         r"num_static_categorical_features is 2 but static_categorical='tags' gives 1"),
        ("InformerForPrediction", {"num_static_real_features": 1}, {},
         r"num_static_real_features is 1 but the windows give none"),
        ("PatchTSTForPrediction", {}, {"time_features": ["hour_of_day"]},
         r"PatchTSTForPrediction's forward takes no time features"),
        ("PatchTSTForPrediction", {}, {"context_length": 48},
         r"context_length comes from context_length \(\+ max\(lags_sequence\)\)"),
        ("PatchTSMixerForPrediction", {}, {"targets": ["f0"]},
         r"targets \['f0'\] must be the columns \['f0', 'f1'\]"),
        ("PatchTSMixerForPrediction", {}, {"future_missing": "skip"},
         r"future_missing must be one of 'drop', 'error', 'keep'; got 'skip'"),
    ],
)  # fmt: skip
def test_a_config_that_does_not_fit_the_windows_is_an_error_naming_both(
    name, change, options, message, panel
):
    model = tiny(name, **change)
    options = {"columns": ["f0", "f1"], **options}
    with pytest.raises(ValueError, match=message):
        hf.windows_for(model, panel, **options)


def test_an_unsupported_model_is_an_error_naming_the_supported_ones(panel):
    config = transformers.PatchTSTConfig(num_input_channels=2, context_length=CONTEXT)
    with pytest.raises(TypeError, match=r"supported classes \['AutoformerForPrediction', .*got "):
        hf.windows_for(transformers.PatchTSTForClassification(config), panel)
    with pytest.raises(ValueError, match="model must be one of the supported classes"):
        hf.config_kwargs(TsFileWindowDataset(panel, 8, 2), "LlamaForCausalLM")


def test_the_model_and_the_windows_both_scaling_is_a_warning(panel):
    model = tiny("PatchTSTForPrediction")
    with pytest.warns(UserWarning, match=r"both scale: .*PatchTSTConfig.scaling='std'") as w:
        hf.windows_for(model, panel, normalize="minmax")
    assert [x.filename for x in w if "both scale" in str(x.message)] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hf.windows_for(tiny("PatchTSTForPrediction", scaling=None), panel, normalize="minmax")


def _sines(directory) -> Path:
    path = Path(directory) / "sines.tsfile"
    devices = {}
    for d, n in enumerate([700, 600]):
        rows = np.arange(n)
        wave = np.stack([np.sin(rows / 5 + d), np.cos(rows / 7 + d)], axis=1)
        wave[rows % 41 == 3, 0] = np.nan  # nulls in the past and the future of some windows
        devices[f"s{d}"] = (rows * 1000, wave)
    return Path(synthetic.write_table_devices(path, "waves", ["a", "b"], devices))


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_each_family_learns_in_50_steps_through_two_workers(name, tmp_path):
    path = _sines(tmp_path)
    model = tiny(name)
    options = {"max_missing": 0.0} if not hf.FAMILIES[name].lags else {}
    ds = hf.windows_for(model, path, shuffle=True, seed=0, **options)
    loader = make_loader(ds, batch_size=32, num_workers=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    while len(losses) < 50:
        for batch in loader:
            out = model(**batch)
            optimizer.zero_grad()
            out.loss.backward()
            optimizer.step()
            losses.append(out.loss.item())
            if len(losses) == 50:
                break
    assert np.isfinite(losses).all()
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


@pytest.mark.slow
def test_the_example_trains_both_models_and_scores_them_against_naive(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    module = runpy.run_path(str(EXAMPLE))
    results = module["main"](
        ["--data", str(tmp_path / "data"), "--steps", "12", "--num-workers", "0",
         "--plot", str(tmp_path / "plots")]
    )  # fmt: skip
    out = capsys.readouterr().out
    for name in ("PatchTSTForPrediction", "TimeSeriesTransformerForPrediction"):
        assert f"{name}: step 12 loss" in out and f"{name}: validation MSE" in out
        assert np.isfinite(results[name]["losses"]).all() and np.isfinite(results[name]["mse"])
    assert len(list((tmp_path / "plots").glob("*.png"))) == 2 * 3  # a PNG per meter and model
