"""Hugging Face time-series models: windows whose items are exactly a model's forward arguments.

:func:`windows_for` reads a ``transformers`` config (or a model's) and builds a
:class:`HFWindows`: a :class:`~tsfile_torch.TsFileWindowDataset` with the model's past length,
``horizon = prediction_length`` and dict items, whose batches are reshaped, renamed and cut down
to the arguments that model's ``forward`` takes, so ``model(**batch)`` needs no hand work and
no key is silently dropped by a ``**kwargs``. It reads through the window dataset's own
``__getitems__`` (same reading core, order, DDP sharding, resume, caches and checks);
:func:`config_kwargs` / :func:`config_for` go the other way, from a dataset to a config.

Supported classes (:data:`FAMILIES`): ``PatchTSTForPrediction`` and
``PatchTSMixerForPrediction`` (past values and mask, future values; no lags, no time or static
features, no future mask), and ``TimeSeriesTransformerForPrediction``,
``InformerForPrediction``, ``AutoformerForPrediction`` (lags, time features with the age
feature, static categorical features, both masks; univariate ones take ``(batch, steps)``).

Note: no future mask. PatchTST's and PatchTSMixer's forward take no future observed mask (and
``**kwargs`` would swallow one): a missing target value in a window's horizon would be trained
on as whatever fills it (NaN with ``fill="nan"``: a NaN loss). So by default
(``future_missing="drop"``, what GluonTS-style training does) :func:`windows_for` leaves out
the windows whose horizon has a missing target (``max_future_missing=0.0`` on the window
dataset), keeps the windows with gaps in the past (masked), and says once how many windows it
left out of how many. ``future_missing="error"`` refuses windows with a missing future target
instead (after any ``max_future_missing=`` the caller gave), naming how many and only fixes that
leave windows on the data at hand; ``"keep"`` is an explicit opt-in where the filled values are
targets. For these models ``ds.missing_future`` counts the windows (before filtering) with a
missing target, whichever the option; the window dataset reads each device once at build for
it unless the metadata and the grid show no target value can be missing. Missing past values
are set to 0 and masked for every family (the models scale with the mask; NaN in the past
reaches their loss through the scaler and the lags).

Note: age feature. Hugging Face's recipes for the lag family (GluonTS's ``AddAgeFeature``)
append ``log10(2 + row)`` to the time features, ``row`` the step's row of its device counted
from the first row in range (0 on padded steps), so ``num_time_features`` is
``len(time_features) + 1`` unless ``age=False``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from tsfile_torch.data.windows import TsFileWindowDataset, WindowBatch
from tsfile_torch.errors import SchemaError, warn_caller

__all__ = [
    "FAMILIES",
    "FUTURE_MISSING",
    "Family",
    "HFWindows",
    "ModelInputs",
    "config_for",
    "config_kwargs",
    "windows_for",
]

#: where the model has no future mask (Note: no future mask): ``"drop"`` leaves out windows with
#: a missing future target; ``"error"`` refuses them; ``"keep"`` serves them, the filled values
#: as targets.
FUTURE_MISSING = ("drop", "error", "keep")
#: where static categorical features come from: each device's tag codes, or its index
STATIC_CATEGORICAL = ("tags", "device")
#: keys of the window dataset that no model takes, which ``keep=`` may add to the items
KEEPABLE = ("past_time", "future_time", "device_id")


@dataclasses.dataclass(frozen=True)
class Family:
    """What one model class takes (forward argument names) and how its config says sizes."""

    #: the model class name, e.g. ``"PatchTSTForPrediction"``
    model: str
    #: the config class name, e.g. ``"PatchTSTConfig"``
    config: str
    #: config attribute holding the number of series (``num_input_channels`` / ``input_size``)
    channels: str
    #: forward argument of the past observed mask
    past_mask: str
    #: past = ``context_length + max(lags_sequence)``; time, static features and a future mask
    lags: bool

    @property
    def forward_keys(self) -> tuple[str, ...]:
        """The forward arguments the items hold (static features when the config asks)."""
        if not self.lags:
            return ("past_values", self.past_mask, "future_values")
        return (
            "past_values",
            "past_time_features",
            "past_observed_mask",
            "static_categorical_features",
            "future_values",
            "future_time_features",
            "future_observed_mask",
        )

    @property
    def generate_keys(self) -> tuple[str, ...]:
        """The items' keys that ``model.generate`` takes (it forecasts the future)."""
        return tuple(
            k for k in self.forward_keys if k not in ("future_values", "future_observed_mask")
        )


#: model class name -> what it takes
FAMILIES: dict[str, Family] = {
    f.model: f
    for f in (
        Family(
            "PatchTSTForPrediction",
            "PatchTSTConfig",
            "num_input_channels",
            "past_observed_mask",
            lags=False,
        ),
        Family(
            "PatchTSMixerForPrediction",
            "PatchTSMixerConfig",
            "num_input_channels",
            "observed_mask",
            lags=False,
        ),
        Family(
            "TimeSeriesTransformerForPrediction",
            "TimeSeriesTransformerConfig",
            "input_size",
            "past_observed_mask",
            lags=True,
        ),
        Family(
            "InformerForPrediction", "InformerConfig", "input_size", "past_observed_mask", lags=True
        ),
        Family(
            "AutoformerForPrediction",
            "AutoformerConfig",
            "input_size",
            "past_observed_mask",
            lags=True,
        ),
    )
}
_BY_CONFIG = {f.config: f for f in FAMILIES.values()}


@dataclasses.dataclass(frozen=True)
class ModelInputs:
    """How an :class:`HFWindows` turns the window dataset's dict batches into forward arguments."""

    family: Family
    #: the config's context_length (the windows' past is longer by max(lags_sequence))
    context_length: int
    #: univariate lag-family model: values and masks are (batch, steps)
    squeeze: bool
    #: append the age feature (Note: age feature); lag family only
    age: bool
    #: ``"tags"``, ``"device"`` or None: static_categorical_features given or not
    static: str | None
    future_missing: str
    keep: tuple[str, ...]

    @property
    def keys(self) -> list[str]:
        """The keys of every item, in order: forward arguments, then ``keep``'s."""
        skip = () if self.static else ("static_categorical_features",)
        return [k for k in self.family.forward_keys if k not in skip] + list(self.keep)

    def forward(self, parts: dict[str, torch.Tensor], rows: np.ndarray | None) -> dict:
        """Return the forward arguments of a batch of dict items (``rows``: start row of each
        window, for the age feature)."""
        family, out = self.family, {}
        past, future = parts["past_values"], parts["future_values"]
        # missing values are 0 where masked; in place: these arrays are this batch's own
        past.nan_to_num_(0.0)
        if self.future_missing == "keep" or family.lags:
            future.nan_to_num_(0.0)  # masked (lag family), or kept as targets on purpose
        squeeze = (lambda t: t.squeeze(-1)) if self.squeeze else (lambda t: t)
        out["past_values"] = squeeze(past)
        if family.lags:
            features = _time_features(parts, rows, self.age)
            out["past_time_features"], future_features = features
            out["past_observed_mask"] = squeeze(parts["past_observed_mask"])
            if self.static == "tags":
                out["static_categorical_features"] = parts["static_categorical_features"]
            elif self.static == "device":
                out["static_categorical_features"] = parts["device_id"][:, None]
            out["future_values"] = squeeze(future)
            out["future_time_features"] = future_features
            out["future_observed_mask"] = squeeze(parts["future_observed_mask"])
        else:
            out[family.past_mask] = parts["past_observed_mask"]
            out["future_values"] = future
        for key in self.keep:
            out[key] = parts[key]
        return out


def _time_features(parts, rows, age: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (past, future) time features: the calendar ones, then the age feature."""
    past_steps, future_steps = parts["past_values"].shape[1], parts["future_values"].shape[1]
    n = parts["past_values"].shape[0]
    calendar = [parts.get("past_time_features"), parts.get("future_time_features")]
    if calendar[0] is None:
        calendar = [torch.zeros(n, past_steps, 0), torch.zeros(n, future_steps, 0)]
    if not age:
        return calendar[0], calendar[1]
    steps = rows[:, None] + np.arange(past_steps + future_steps)
    ages = np.where(steps >= 0, np.log10(2.0 + np.maximum(steps, 0)), 0.0)
    ages = torch.from_numpy(ages.astype(np.float32))[..., None]
    return (
        torch.cat([calendar[0], ages[:, :past_steps]], dim=-1),
        torch.cat([calendar[1], ages[:, past_steps:]], dim=-1),
    )


class HFWindows(TsFileWindowDataset):
    """Windows whose items are one model class's forward arguments (build it with
    :func:`windows_for`).

    A :class:`~tsfile_torch.TsFileWindowDataset` with ``return_dict=True`` whose
    ``__getitems__`` passes each batch of its windows through :class:`ModelInputs`: every
    option, order, DDP, resume and check of the window dataset holds, and
    ``make_loader(ds, batch_size=..., num_workers=...)`` batches it. ``window_info(i)`` still
    says where window ``i`` comes from (device, first row, its time).
    """

    kind = "model window dataset"
    inputs: ModelInputs | None = None  # (split_by_time builds its parts without __init__)

    def __init__(self, *args, inputs: ModelInputs | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        #: how items become forward arguments (None: plain dict items)
        self.inputs = inputs

    @property
    def forward_keys(self) -> list[str]:
        """The keys of every item: forward arguments of the model (then ``keep=``'s keys)."""
        return self.inputs.keys

    def generate_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return the arguments of ``model.generate`` from a batch: it forecasts the future,
        so the future values and mask are left out (it takes no other key)."""
        return {k: v for k, v in batch.items() if k in self.inputs.family.generate_keys}

    def __getitems__(self, indices: Sequence[int]):
        batch = super().__getitems__(indices)
        if self.inputs is None or not isinstance(batch, WindowBatch):
            return batch  # a kept batch is served again in the main process (hand-over)
        parts = dict(zip(batch.keys, batch.parts, strict=True))
        rows = None
        if self.inputs.family.lags and self.inputs.age:
            rows = self._start_rows(np.asarray(indices, dtype=np.int64), parts["device_id"])
        out = self.inputs.forward(parts, rows)
        return WindowBatch(tuple(out.values()), tuple(out))

    def _start_rows(self, indices: np.ndarray, device_id: torch.Tensor) -> np.ndarray:
        """Return the first device row of each window (for the age feature)."""
        return self.index.locate(indices)[1]

    def split_by_time(self, t) -> tuple[HFWindows, HFWindows]:
        """Return ``(train, validation)`` split at ``t``, as the window dataset's
        :meth:`~tsfile_torch.TsFileWindowDataset.split_by_time`, both with this model's items
        (and, where the model has no future mask, each checked again)."""
        train, validation = super().split_by_time(t)
        for part in (train, validation):
            part.inputs = self.inputs
            _check_future(part)
        return train, validation

    def __repr__(self) -> str:
        name = self.inputs.family.model if self.inputs is not None else None
        return f"HFWindows({name}, {super().__repr__()})"


def _resolve(config_or_model) -> tuple[Family, Any]:
    """Return (family, config) of a supported model or config instance."""
    names = [c.__name__ for c in type(config_or_model).__mro__]
    config = getattr(config_or_model, "config", None)
    for name in names:
        if name in FAMILIES and config is not None:
            return FAMILIES[name], config
        if name in _BY_CONFIG:
            return _BY_CONFIG[name], config_or_model
    raise TypeError(
        f"config_or_model must be a model or config of one of the supported classes "
        f"{sorted(FAMILIES)} (configs {sorted(_BY_CONFIG)}); got {type(config_or_model).__name__}"
    )


def _family_of(model) -> Family:
    """Return the family of a model class, its name, a model or a config."""
    if isinstance(model, str):
        name = model
    elif isinstance(model, type):
        name = model.__name__
    else:
        return _resolve(model)[0]
    family = FAMILIES.get(name) or _BY_CONFIG.get(name)
    if family is None:
        raise ValueError(
            f"model must be one of the supported classes {sorted(FAMILIES)} (or its name); "
            f"got {name!r}"
        )
    return family


def _count(config, name: str) -> int:
    value = getattr(config, name, 0)
    return 0 if value is None else int(value)


def windows_for(
    config_or_model,
    sources,
    columns: Sequence[str] | str | None = None,
    targets: Sequence[str] | str | None = None,
    *,
    future_missing: str = "drop",
    age: bool = True,
    static_categorical: str = "tags",
    keep: Sequence[str] = (),
    **window_options,
) -> HFWindows:
    """Return windows of ``sources`` whose items are the forward arguments of a model.

    The config (a model's ``.config``) says the window: ``context_length`` rows of past (plus
    ``max(lags_sequence)`` for the lag family), ``horizon = prediction_length``; the number of
    series (``num_input_channels`` / ``input_size``), ``num_time_features``,
    ``num_static_categorical_features`` / ``cardinality`` are checked against the data. Items
    hold the forward arguments only (see :data:`FAMILIES` and ``docs/huggingface.md``), so
    ``model(**batch)`` takes every key it is given.

    Args:
        config_or_model: a supported model (``PatchTSTForPrediction(config)``...) or config.
        sources: as for :class:`~tsfile_torch.TsFileWindowDataset`.
        columns: field names of the series the model reads and forecasts (``None``: every
            numeric field the devices share).
        targets: ``None`` or the same fields as ``columns`` (these models forecast the series
            they read).
        future_missing: for models with no future mask (PatchTST, PatchTSMixer; Note: no
            future mask): ``"drop"`` (default) leaves out the windows whose horizon has a
            missing target value and warns once how many of how many; ``"error"`` refuses
            them; ``"keep"`` serves them, and the model LEARNS THE FILLED VALUE there as if it
            had been read: 0 with ``fill="nan"`` / ``"zero"``, the last value of the window
            with ``fill="ffill"``. Ignored by the lag family, whose loss takes the mask.
        age: lag family: append the age feature to the time features (Note: age feature).
        static_categorical: lag family with ``num_static_categorical_features > 0``:
            ``"tags"`` (each device's tag codes, one feature per tag level, indices into
            ``ds.tag_vocab``) or ``"device"`` (one feature: the device's index in
            ``ds.devices``).
        keep: keys the models do not take to add to the items anyway, from
            ``"past_time"``, ``"future_time"``, ``"device_id"``; ``model(**batch)`` would
            ignore them, so take them out of the batch first.
        **window_options: the window dataset's other arguments (``stride``, ``devices``,
            ``order``, ``seed``, ``rank``, ``time_features``, ``normalize``, ``fill``,
            ``min_context``, ``max_missing``, ``start_time``, ``cache``...).

    Raises:
        TypeError: not a supported model or config.
        ValueError: the config does not fit the data or the options (the message names both
            numbers and the fix); windows with missing future targets for a model without a
            future mask (``future_missing="error"``).
    """
    family, config = _resolve(config_or_model)
    future_missing = _choice("future_missing", future_missing, FUTURE_MISSING)
    static_categorical = _choice("static_categorical", static_categorical, STATIC_CATEGORICAL)
    if not isinstance(age, bool):
        raise TypeError(f"age should be True or False, but got age={age!r}")
    keep = (keep,) if isinstance(keep, str) else tuple(keep)
    for key in keep:
        if key not in KEEPABLE:
            raise ValueError(f"keep takes keys from {list(KEEPABLE)}; got {key!r}")
    for name, source in (
        ("context_length", "context_length (+ max(lags_sequence))"),
        ("horizon", "prediction_length"),
        ("return_dict", "the model: items are dicts"),
    ):
        if name in window_options:
            raise ValueError(
                f"{name} comes from {source} of the {family.config}; drop {name}= (build the "
                f"config with the value you want)"
            )
    context, horizon = _count(config, "context_length"), _count(config, "prediction_length")
    if context < 1 or horizon < 1:
        raise ValueError(
            f"{family.config} needs context_length >= 1 and prediction_length >= 1; got "
            f"{context} and {horizon}"
        )
    past = context
    if family.lags:
        lags = list(getattr(config, "lags_sequence", None) or [])
        if not lags:
            raise ValueError(
                f"{family.config}.lags_sequence is empty; give it at least one lag (default: "
                f"[1, ..., 7])"
            )
        past = context + max(lags)
    time_features = window_options.get("time_features") or []
    if not family.lags and time_features:
        raise ValueError(
            f"time_features: {family.model}'s forward takes no time features; drop "
            f"time_features={list(time_features)}"
        )
    if targets is not None and columns is not None:
        if _listed(targets) != _listed(columns):
            raise ValueError(
                f"targets {_listed(targets)} must be the columns {_listed(columns)}: "
                f"{family.model} forecasts the series it reads; drop targets="
            )
    columns = columns if columns is not None else targets
    if not family.lags:  # Note: no future mask: count (and with "drop" leave out) such windows
        given = window_options.get("max_future_missing")
        window_options["max_future_missing"] = (
            given if given is not None else (0.0 if future_missing == "drop" else 1.0)
        )
    try:
        ds = HFWindows(
            sources, past, horizon, columns=columns, targets=columns, return_dict=True,
            **window_options,
        )  # fmt: skip
    except SchemaError as err:
        if not family.lags and future_missing == "drop" and "max_future_missing" in str(err):
            raise SchemaError(
                f"every window has a missing target value in its horizon, and {family.model} "
                f"takes no future mask, so future_missing='drop' leaves none ({err}). Pass "
                f"future_missing='keep' to train on the filled values, or check the targets' "
                f"null counts (tsfile_torch.list_devices) and freq="
            ) from err
        raise
    series = _count(config, family.channels)
    if series != len(ds.columns):
        raise ValueError(
            f"{family.config}.{family.channels} is {series} but the windows hold "
            f"{len(ds.columns)} series (columns {ds.columns}); pass {series} columns or build "
            f"the config with {family.channels}={len(ds.columns)}"
        )
    static = None
    if family.lags:
        _check_lag_config(family, config, ds, time_features, age)
        static = _check_static(family, config, ds, static_categorical)
    scaling = getattr(config, "scaling", None)
    if ds.normalizer is not None and scaling not in (None, False, "none"):
        warn_caller(
            f"both scale: the windows are normalized (normalize=) and {family.config}."
            f"scaling={scaling!r} scales each window again; pass scaling=None to the config "
            f"or leave normalize= out"
        )
    squeeze = family.lags and series == 1
    ds.inputs = ModelInputs(family, context, squeeze, age, static, future_missing, keep)
    _check_future(ds)
    return ds


def _check_lag_config(family: Family, config, ds: HFWindows, time_features, age: bool) -> None:
    given = len(time_features) + (1 if age else 0)
    wanted = _count(config, "num_time_features")
    if wanted != given:
        what = f"time_features={list(time_features)}" + (" and the age feature" if age else "")
        raise ValueError(
            f"{family.config}.num_time_features is {wanted} but the windows give {given} "
            f"({what}); build the config with num_time_features={given}, or pass "
            f"{wanted - (1 if age else 0)} time_features (age=False leaves the age feature out)"
        )
    for name in ("num_dynamic_real_features", "num_static_real_features"):
        if _count(config, name):
            raise ValueError(
                f"{family.config}.{name} is {_count(config, name)} but the windows give none "
                f"(only calendar and age features, and static categorical ones); build the "
                f"config with {name}=0"
            )


def _check_static(family: Family, config, ds: HFWindows, source: str) -> str | None:
    """Return where static categorical features come from (None: the config takes none)."""
    wanted = _count(config, "num_static_categorical_features")
    if not wanted:
        return None
    if source == "tags":
        sizes, what = [len(v) for v in ds.tag_vocab], "tag levels (tag_vocab sizes {})"
    else:
        sizes, what = [len(ds.devices)], "device index (devices: {})"
    what = what.format(sizes)
    if wanted != len(sizes):
        raise ValueError(
            f"{family.config}.num_static_categorical_features is {wanted} but "
            f"static_categorical={source!r} gives {len(sizes)} ({what}); build the config with "
            f"num_static_categorical_features={len(sizes)} and cardinality={sizes}"
            + (", or pass static_categorical='device'" if source == "tags" else "")
        )
    cardinality = list(getattr(config, "cardinality", None) or [])
    if len(cardinality) != len(sizes) or any(
        c < s for c, s in zip(cardinality, sizes, strict=True)
    ):
        raise ValueError(
            f"{family.config}.cardinality is {cardinality} but the {what} need at least "
            f"{sizes}; build the config with cardinality={sizes}"
        )
    return source


def _check_future(ds: HFWindows) -> None:
    """Say how many windows with a missing future target were left out, or refuse those left
    where the model has no future mask and ``future_missing="error"`` (Note: no future mask)."""
    inputs = ds.inputs
    if inputs.family.lags or ds.filtered is None:
        return  # masked by the loss
    f, model = ds.filtered, inputs.family.model
    if f.over_future and inputs.future_missing == "drop":
        warn_caller(
            f"left out {f.over_future:,} of {f.windows:,} windows whose horizon has a missing "
            f"target value ({model} takes no future mask); {len(ds):,} windows are served, "
            f"their missing past values masked. future_missing='keep' serves them with filled "
            f"targets instead"
        )
    if inputs.future_missing != "error" or not f.kept_missing_future:
        return
    bad = f.kept_missing_future
    fixes = []
    complete = len(ds) - bad
    if complete:
        fixes.append(
            f"future_missing='drop' (the default) to leave them out and train on the "
            f"{complete:,} others"
        )
    fixes.append("future_missing='keep' to train on the filled values")
    raise ValueError(
        f"{bad:,} of {len(ds):,} windows have a missing target value in their horizon and "
        f"{model} takes no future mask: it would train on the filled value (NaN with "
        f"fill='nan'). Pass {', or '.join(fixes)}"
    )


def _choice(name: str, value, allowed) -> str:
    if isinstance(value, str) and value in allowed:
        return value
    raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def _listed(names) -> list[str]:
    return [names] if isinstance(names, str) else list(names)


def config_kwargs(ds: TsFileWindowDataset, model) -> dict[str, Any]:
    """Return the config arguments of ``model``'s class that the dataset ``ds`` decides.

    ``prediction_length`` (``ds.horizon``), ``context_length`` (``ds.context_length``: for
    the lag family the model's context; :func:`windows_for` then reads ``max(lags_sequence)``
    rows more), the number of series (``num_input_channels`` / ``input_size``) and, for the
    lag family, ``num_time_features`` (``ds.time_features`` and the age feature),
    ``num_static_categorical_features`` and ``cardinality`` (one per tag level of
    ``ds.tag_vocab``; none without tags).

    Args:
        ds: a window dataset over the data the model will train on.
        model: a supported model class or its name (``"PatchTSTForPrediction"``).
    """
    family = _family_of(model)
    if not ds.horizon:
        raise ValueError(
            f"{family.model} forecasts: ds needs horizon >= 1 (prediction_length); got 0"
        )
    inputs = getattr(ds, "inputs", None)  # an HFWindows reads the model's lags too
    out = {
        "context_length": ds.context_length if inputs is None else inputs.context_length,
        "prediction_length": ds.horizon,
        family.channels: len(ds.columns),
    }
    if family.lags:
        out["num_time_features"] = len(ds.time_features or ()) + 1
        sizes = [len(v) for v in ds.tag_vocab]
        out["num_static_categorical_features"] = len(sizes)
        if sizes:
            out["cardinality"] = sizes
    return out


def config_for(model, ds: TsFileWindowDataset, **overrides):
    """Return a ``transformers`` config for ``model``'s class from the dataset ``ds``:
    :func:`config_kwargs`, then ``overrides`` (``d_model=16``, ``lags_sequence=[1, 2]``...).
    """
    import transformers

    family = _family_of(model)
    config_class = getattr(transformers, family.config)
    return config_class(**{**config_kwargs(ds, family.model), **overrides})
