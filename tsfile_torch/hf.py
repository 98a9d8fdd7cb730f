"""Hugging Face time-series models: windows whose items are exactly a model's forward arguments.

:func:`windows_for` reads a ``transformers`` config (or a model's) and builds a
:class:`HFWindows`: a :class:`~tsfile_torch.TsFileWindowDataset` with the model's past length,
``horizon = prediction_length`` and dict items, whose batches are reshaped, renamed and cut down
to the arguments that model's ``forward`` takes, so ``model(**batch)`` needs no hand work and
no key is silently dropped by a ``**kwargs``. It reads through the window dataset's own
``__getitems__`` (same reading core, order, DDP sharding, resume, caches and checks);
:func:`config_kwargs` / :func:`config_for` go the other way, from a dataset to a config.

Supported classes (:data:`FAMILIES`, one table entry each): ``PatchTSTForPrediction`` and
``PatchTSMixerForPrediction`` (past values and mask, future values; no lags, no time or static
features, no future mask), ``TimeSeriesTransformerForPrediction``,
``InformerForPrediction``, ``AutoformerForPrediction`` (lags, time features with the age
feature, static categorical features, both masks; univariate ones take ``(batch, steps)``),
and the row families, which read one series per row (a window of C columns is C rows):
Chronos-Bolt's ``ChronosBoltModelForForecasting`` (``context``, ``mask``, ``target``,
``target_mask``), Chronos-2's ``Chronos2Model`` (also ``group_ids``: the columns of a window
are one group, ``num_output_patches``, and ``future_covariates`` for ``known=`` columns) and
``TimesFm2_5ModelForPrediction`` (``past_values``, ``future_values``).

Note: missing values by family. Each family gets missing values (nulls, grid holes, padding)
the way it reads them, whatever ``fill=`` says: ``"mask"`` (patch and lag families): 0 and a
0 in the observed mask; ``"nan"`` (Chronos-Bolt, Chronos-2): NaN and a False mask, because
they scale the context by ``nanmean`` / ``nanstd`` of the values themselves, so a filled 0
would leak into the scale; ``"complete"`` (TimesFM 2.5: no mask, and one NaN makes its loss
NaN): only windows with no missing value (``max_missing=0.0``), and it says how many it left
out of how many.

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
    "MISSING",
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
#: how missing values reach a family (Note: missing values by family)
MISSING = ("mask", "nan", "complete")
#: the first transformers release with TimesFM 2.5 (``TimesFm2_5ModelForPrediction``)
TIMESFM_2_5_TRANSFORMERS = "5.3.0"
#: where static categorical features come from: each device's tag codes, or its index
STATIC_CATEGORICAL = ("tags", "device")
#: keys of the window dataset that no model takes, which ``keep=`` may add to the items
KEEPABLE = ("past_time", "future_time", "device_id")


@dataclasses.dataclass(frozen=True)
class Family:
    """What one model class takes: forward argument names, the items' shape, how missing values
    reach it (Note: missing values by family) and where its config says sizes."""

    #: the model class name, e.g. ``"PatchTSTForPrediction"``
    model: str
    #: the config class name, e.g. ``"PatchTSTConfig"``
    config: str
    #: config attribute holding the number of series (``num_input_channels`` / ``input_size``);
    #: None: the model reads one series per row, so any number of columns
    channels: str | None
    #: forward argument of the past observed mask (None: the model takes none)
    past_mask: str | None
    #: past = ``context_length + max(lags_sequence)``; time, static features and a future mask
    lags: bool = False
    #: forward arguments of the past values, the future values and the future mask (None: none)
    past: str = "past_values"
    future: str = "future_values"
    future_mask: str | None = None
    #: items are rows ``(windows * columns, steps)``, one per column of each window, instead of
    #: ``(windows, steps, columns)``; ``batch_size`` still counts windows
    rows: bool = False
    #: how missing values reach the model: one of :data:`MISSING`
    missing: str = "mask"
    #: config attributes (dotted: into a dict attribute) of the context and the horizon; horizon
    #: None: the config has none, ``horizon=`` gives it
    context: str = "context_length"
    horizon: str | None = "prediction_length"
    #: the config's sizes are the most the model takes: ``context_length=`` / ``horizon=`` may
    #: ask fewer steps
    at_most: bool = False
    #: config attribute of the input patch size: a context shorter than one patch is refused
    patch: str | None = None
    #: config attributes (patches, patch size) whose product bounds ``horizon=``
    max_horizon: tuple[str, str] | None = None
    #: forward arguments of each row's group (the columns of one window are one group), of the
    #: number of output patches and of the known future values (``known=``); None: none, and
    #: without a group the targets are the columns (no covariates)
    group: str | None = None
    patches: str | None = None
    known: str | None = None
    #: where the config class lives, and what :func:`config_for` starts from (published values)
    config_module: str = "transformers"
    defaults: dict = dataclasses.field(default_factory=dict, compare=False)

    @property
    def no_future_mask(self) -> bool:
        """Windows with a missing future target would be trained on their filled values
        (Note: no future mask)."""
        return not self.lags and self.future_mask is None and self.missing != "complete"

    @property
    def forward_keys(self) -> tuple[str, ...]:
        """The forward arguments the items hold (static features when the config asks, known
        future values when ``known=`` names columns)."""
        if not self.lags:
            keys = (self.past, self.past_mask, self.group, self.patches)
            return tuple(k for k in (*keys, self.future, self.future_mask) if k)
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
    def forecast_keys(self) -> tuple[str, ...]:
        """The items' keys that a forecast takes (``model.generate`` of the lag family, a
        forward without targets of the others): all but the future values and mask."""
        future = (self.future, self.future_mask, "future_observed_mask")
        return tuple(k for k in self.forward_keys if k not in future)

    @property
    def generate_keys(self) -> tuple[str, ...]:
        """The items' keys that ``model.generate`` takes (it forecasts the future)."""
        return self.forecast_keys


#: Chronos's published quantile levels: Chronos-Bolt's nine, Chronos-2's 21
_BOLT_QUANTILES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
_CHRONOS2_QUANTILES = [0.01, *(round(0.05 * i, 2) for i in range(1, 20)), 0.99]

#: model class name -> what it takes
FAMILIES: dict[str, Family] = {
    f.model: f
    for f in (
        Family(
            "PatchTSTForPrediction",
            "PatchTSTConfig",
            "num_input_channels",
            "past_observed_mask",
            patch="patch_length",
        ),
        Family(
            "PatchTSMixerForPrediction",
            "PatchTSMixerConfig",
            "num_input_channels",
            "observed_mask",
            patch="patch_length",
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
        Family(
            "ChronosBoltModelForForecasting",
            "T5Config",
            None,
            "mask",
            past="context",
            future="target",
            future_mask="target_mask",
            rows=True,
            missing="nan",
            context="chronos_config.context_length",
            horizon="chronos_config.prediction_length",
            at_most=True,
            patch="chronos_config.input_patch_size",
            defaults={  # amazon/chronos-bolt-*: T5's initializer_factor=1.0 starts near 5,000
                "initializer_factor": 0.05,
                "decoder_start_token_id": 0,
                "pad_token_id": 0,
                "is_encoder_decoder": True,
                "chronos_config": {
                    "input_patch_size": 16,
                    "input_patch_stride": 16,
                    "quantiles": _BOLT_QUANTILES,
                    "use_reg_token": True,
                },
            },
        ),
        Family(
            "Chronos2Model",
            "Chronos2CoreConfig",
            None,
            "context_mask",
            past="context",
            future="future_target",
            future_mask="future_target_mask",
            rows=True,
            missing="nan",
            context="chronos_config.context_length",
            horizon=None,
            at_most=True,
            patch="chronos_config.input_patch_size",
            max_horizon=("chronos_config.max_output_patches", "chronos_config.output_patch_size"),
            group="group_ids",
            patches="num_output_patches",
            known="future_covariates",
            config_module="chronos.chronos2.config",
            defaults={  # amazon/chronos-2 (initializer_factor 0.05 is the class default)
                "chronos_config": {
                    "input_patch_size": 16,
                    "input_patch_stride": 16,
                    "output_patch_size": 16,
                    "quantiles": _CHRONOS2_QUANTILES,
                    "use_reg_token": True,
                    "use_arcsinh": True,
                },
            },
        ),
        Family(
            "TimesFm2_5ModelForPrediction",
            "TimesFm2_5Config",
            None,
            None,
            rows=True,
            missing="complete",
            horizon="horizon_length",
            at_most=True,
            patch="patch_length",
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
    #: row families: the first ``targets`` columns are forecast (0: all), the others are
    #: covariates; positions of the columns known in the future; output patches per batch
    targets: int = 0
    known: tuple[int, ...] = ()
    num_output_patches: int = 0

    @property
    def keys(self) -> list[str]:
        """The keys of every item, in order: forward arguments, then ``keep``'s."""
        skip = () if self.static else ("static_categorical_features",)
        keys = [k for k in self.family.forward_keys if k not in skip]
        if self.known:
            at = keys.index(self.family.patches)
            keys[at:at] = [self.family.known, f"{self.family.known}_mask"]
        return keys + list(self.keep)

    def forward(self, parts: dict[str, torch.Tensor], rows: np.ndarray | None) -> dict:
        """Return the forward arguments of a batch of dict items (``rows``: start row of each
        window, for the age feature)."""
        if self.family.rows:
            return self.rows(parts)
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

    def rows(self, parts: dict[str, torch.Tensor]) -> dict:
        """Return the forward arguments of a row family: one row per column of each window,
        missing values as the family reads them (Note: missing values by family)."""
        family, out = self.family, {}
        n, columns = parts["past_values"].shape[0], parts["past_values"].shape[2]

        def rows(t: torch.Tensor) -> torch.Tensor:  # (n, steps, columns) -> (n * columns, steps)
            return t.transpose(1, 2).reshape(n * columns, t.shape[1])

        seen, ahead = rows(parts["past_observed_mask"]) > 0, rows(parts["future_observed_mask"]) > 0
        past, future = rows(parts["past_values"]), rows(parts["future_values"])
        nan = family.missing == "nan"
        out[family.past] = past.masked_fill(~seen, float("nan")) if nan else past
        if family.past_mask:
            out[family.past_mask] = seen
        if family.group:
            out[family.group] = torch.arange(n).repeat_interleave(columns)
        if self.known:
            known = torch.zeros(columns, dtype=torch.bool)
            known[list(self.known)] = True
            values = future.masked_fill(~(ahead & known.repeat(n)[:, None]), float("nan"))
            out[family.known] = values  # its mask in the values' dtype, as Chronos-2 makes it
            out[f"{family.known}_mask"] = torch.isnan(values).logical_not().to(values.dtype)
        if family.patches:
            out[family.patches] = self.num_output_patches
        if self.targets:  # covariates are read, not forecast: no loss on them
            ahead &= (torch.arange(columns) < self.targets).repeat(n)[:, None]
        out[family.future] = future.masked_fill(~ahead, float("nan")) if nan else future
        if family.future_mask:
            out[family.future_mask] = ahead
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

    def forecast_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return the arguments of a forecast from a batch: ``model(**...)`` of the Chronos
        families, TimesFM and the patch models, ``model.generate(**...)`` of the lag family.
        The future values and mask are left out (known future covariates stay)."""
        keys = self.inputs.family.forecast_keys
        known = self.inputs.family.known
        return {k: v for k, v in batch.items() if k in keys or (known and k.startswith(known))}

    def generate_inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Return the arguments of ``model.generate`` from a batch (lag family): as
        :meth:`forecast_inputs`."""
        return self.forecast_inputs(batch)

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
    """Return (family, config) of a supported model or config instance (or of the model a
    Chronos pipeline holds: ``pipeline.model``)."""
    inner = getattr(config_or_model, "model", None)
    if inner is not None and type(inner).__name__ in FAMILIES:
        config_or_model = inner
    names = [c.__name__ for c in type(config_or_model).__mro__]
    config = getattr(config_or_model, "config", None)
    for name in names:
        if name in FAMILIES and config is not None:
            return FAMILIES[name], config
        family = _BY_CONFIG.get(name)
        if family is not None and _size(config_or_model, family.context) is not None:
            return family, config_or_model  # (a T5Config without chronos_config is not one)
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


def _size(config, path: str) -> int | None:
    """Return the config's size at ``path`` (dotted: ``chronos_config.context_length`` reads
    a dict attribute), None where it has none."""
    value = config
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else getattr(value, part, None)
        if value is None:
            return None
    return int(value)


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
    known: Sequence[str] | str = (),
    **window_options,
) -> HFWindows:
    """Return windows of ``sources`` whose items are the forward arguments of a model.

    The config (a model's ``.config``) says the window: ``context_length`` rows of past (plus
    ``max(lags_sequence)`` for the lag family), ``horizon = prediction_length``; the number of
    series (``num_input_channels`` / ``input_size``), ``num_time_features``,
    ``num_static_categorical_features`` / ``cardinality`` are checked against the data. Items
    hold the forward arguments only (see :data:`FAMILIES` and ``docs/huggingface.md``), so
    ``model(**batch)`` takes every key it is given.

    Row families (Chronos-Bolt, Chronos-2, TimesFM 2.5) read one series per row: a batch of
    ``batch_size`` windows of C columns is ``batch_size * C`` rows. Their configs' context and
    horizon are the most they take: ``context_length=`` / ``horizon=`` may ask fewer steps
    (Chronos-2's config has no horizon: ``horizon=`` is needed, at most ``max_output_patches *
    output_patch_size``). Missing values reach each family as it reads them (Note: missing
    values by family).

    Args:
        config_or_model: a supported model (``PatchTSTForPrediction(config)``...), its
            config, or a Chronos pipeline (its ``.model``).
        sources: as for :class:`~tsfile_torch.TsFileWindowDataset`.
        columns: field names of the series the model reads (``None``: every numeric field the
            devices share; Chronos-2: ``targets`` and ``known``).
        targets: ``None`` or the same fields as ``columns`` (these models forecast the series
            they read); Chronos-2: the columns it forecasts, the others being covariates.
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
            ignore them, so take them out of the batch first (not for row families).
        known: Chronos-2: covariate columns known in the future (calendar, set points): their
            horizon reaches the model as ``future_covariates``, and its loss leaves them out.
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
    if keep and family.rows:
        raise ValueError(
            f"keep={list(keep)}: {family.model}'s items are rows (one per column of each "
            f"window), not windows; drop keep= (ds.window_info(i) says where window i is from)"
        )
    if "return_dict" in window_options:
        raise ValueError(f"return_dict comes from {family.model}: items are dicts; drop it")
    context, horizon = _sizes(family, config, window_options)
    past = context
    if family.lags:
        lags = list(getattr(config, "lags_sequence", None) or [])
        if not lags:
            raise ValueError(
                f"{family.config}.lags_sequence is empty; give it at least one lag (default: "
                f"[1, ..., 7])"
            )
        bad = [lag for lag in lags if isinstance(lag, bool) or not isinstance(lag, int) or lag < 1]
        if bad:
            raise ValueError(
                f"{family.config}.lags_sequence={lags}: every lag must be a whole number >= 1 "
                f"(lag 1 is the step before; 0 would be the value itself and a negative lag a "
                f"future value); got {bad}"
            )
        past = context + max(lags)
    time_features = window_options.get("time_features") or []
    if not family.lags and time_features:
        raise ValueError(
            f"time_features: {family.model}'s forward takes no time features; drop "
            f"time_features={list(time_features)}"
        )
    columns, n_targets, known = _columns(family, columns, targets, known)
    if family.no_future_mask:  # Note: no future mask: count (and with "drop" leave out) those
        given = window_options.get("max_future_missing")
        window_options["max_future_missing"] = (
            given if given is not None else (0.0 if future_missing == "drop" else 1.0)
        )
    if family.missing == "complete":  # Note: missing values by family
        if window_options.get("max_missing") not in (None, 0, 0.0):
            raise ValueError(
                f"max_missing={window_options['max_missing']!r}: {family.model} reads no mask "
                f"and a NaN makes its loss NaN, so it gets complete windows only "
                f"(max_missing=0.0); drop max_missing="
            )
        window_options["max_missing"] = 0.0
    try:
        ds = HFWindows(
            sources, past, horizon, columns=columns, targets=columns, return_dict=True,
            **window_options,
        )  # fmt: skip
    except SchemaError as err:
        if family.lags and past > context and "no device has" in str(err):  # a long lag
            raise SchemaError(
                f"{family.config}: a window reads context_length {context} + max(lags_sequence) "
                f"{past - context} + prediction_length {horizon} = {past + horizon} rows, and "
                f"{err}; lower the largest lag (lags_sequence) or context_length"
            ) from err
        if family.no_future_mask and future_missing == "drop" and "max_future_missing" in str(err):
            raise SchemaError(
                f"every window has a missing target value in its horizon, and {family.model} "
                f"takes no future mask, so future_missing='drop' leaves none ({err}). Pass "
                f"future_missing='keep' to train on the filled values, or check the targets' "
                f"null counts (tsfile_torch.list_devices) and freq="
            ) from err
        raise
    series = _count(config, family.channels) if family.channels else len(ds.columns)
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
    patches = 0
    if family.max_horizon:
        patches = -(-horizon // _size(config, family.max_horizon[1]))
    ds.inputs = ModelInputs(
        family, context, squeeze, age, static, future_missing, keep,
        targets=n_targets, known=known, num_output_patches=patches,
    )  # fmt: skip
    _check_future(ds)
    return ds


def _sizes(family: Family, config, window_options: dict) -> tuple[int, int]:
    """Return (context, horizon) of the windows from the config (and, where the config's
    sizes are maxima, ``context_length=`` / ``horizon=`` popped from ``window_options``)."""
    wanted = {}
    for name, path in (("context_length", family.context), ("horizon", family.horizon)):
        given = window_options.pop(name, None) if family.at_most else None
        if name in window_options:
            where = "context_length (+ max(lags_sequence))" if name != "horizon" else path
            raise ValueError(
                f"{name} comes from {where} of the {family.config}; drop {name}= (build the "
                f"config with the value you want)"
            )
        most = _size(config, path) if path else None
        if given is not None and (isinstance(given, bool) or not isinstance(given, int)):
            raise TypeError(f"{name} should be a positive integer, but got {name}={given!r}")
        if given is not None and most is not None and given > most:
            raise ValueError(
                f"{name}={given} is longer than {family.config}.{path} = {most}, the most "
                f"{family.model} takes; pass {name}<={most} or build the config with {most} "
                f"raised"
            )
        wanted[name] = given if given is not None else most
    context, horizon = wanted["context_length"], wanted["horizon"]
    if horizon is None:
        raise ValueError(
            f"{family.config} has no horizon: pass horizon= (the steps {family.model} learns to "
            f"forecast, at most {_max_horizon(family, config)})"
        )
    if not context or context < 1 or horizon < 1:
        raise ValueError(
            f"{family.config} needs {family.context} >= 1 and "
            f"{family.horizon or 'horizon'} >= 1; got {context} and {horizon}"
        )
    patch = _size(config, family.patch) if family.patch else None
    if patch and context < patch:
        raise ValueError(
            f"context_length {context} is shorter than one patch ({family.config}.{family.patch}"
            f" = {patch}); pass context_length>={patch} or build the config with "
            f"{family.patch.rsplit('.', 1)[-1]}<={context}"
        )
    most = _max_horizon(family, config)
    if most is not None and horizon > most:
        patches, size = family.max_horizon
        raise ValueError(
            f"horizon={horizon} is longer than {family.config}.{patches} * {size} = {most}; "
            f"pass horizon<={most} or build the config with "
            f"{patches.rsplit('.', 1)[-1]}>={-(-horizon // _size(config, size))}"
        )
    return context, horizon


def _max_horizon(family: Family, config) -> int | None:
    """Return the longest horizon the config allows where it says one by patches."""
    if not family.max_horizon:
        return None
    patches, size = (_size(config, path) for path in family.max_horizon)
    return (patches or 1) * size


def _columns(family: Family, columns, targets, known) -> tuple[list | None, int, tuple]:
    """Return (columns in the order the model takes them, number of targets (0: all), known
    columns' positions): targets first, then the covariates read only, then the known ones."""
    known = [known] if isinstance(known, str) else list(known)
    if not family.group:
        if known:
            raise ValueError(
                f"known={known}: {family.model} takes no future covariates; drop known="
            )
        if targets is not None and columns is not None and _listed(targets) != _listed(columns):
            raise ValueError(
                f"targets {_listed(targets)} must be the columns {_listed(columns)}: "
                f"{family.model} forecasts the series it reads; drop targets="
            )
        return (columns if columns is not None else targets), 0, ()
    if columns is None:
        columns = None if targets is None else _listed(targets) + known
    if columns is None:
        if known:
            raise ValueError(f"known={known} needs targets= (the columns to forecast)")
        return None, 0, ()
    columns = _listed(columns)
    targets = [c for c in columns if c not in known] if targets is None else _listed(targets)
    for name, names in (("targets", targets), ("known", known)):
        if not set(names) <= set(columns):
            raise ValueError(f"{name} {names} must be among the columns {columns}")
    if set(targets) & set(known):
        raise ValueError(
            f"known {known} and targets {targets} overlap: a known column is a covariate, "
            f"not forecast"
        )
    rest = [c for c in columns if c not in targets and c not in known]
    ordered = list(targets) + rest + known
    n = len(targets) if len(targets) < len(columns) else 0
    return ordered, n, tuple(range(len(ordered) - len(known), len(ordered)))


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
    if inputs.family.missing == "complete" and ds.filtered is not None:
        f = ds.filtered
        if f.over_missing:
            warn_caller(
                f"left out {f.over_missing:,} of {f.windows:,} windows with a missing value "
                f"({inputs.family.model} reads no mask and no NaN: complete windows only); "
                f"{len(ds):,} windows are served"
            )
        return
    if not inputs.family.no_future_mask or ds.filtered is None:
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
    ``ds.tag_vocab``; none without tags). Each family's sizes go where its config keeps them
    (Chronos: in ``chronos_config``; TimesFM 2.5: ``horizon_length``; Chronos-2:
    ``max_output_patches`` enough for ``ds.horizon`` with the published patch size).

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
    out: dict[str, Any] = {}
    _put(out, family.context, ds.context_length if inputs is None else inputs.context_length)
    if family.horizon:
        _put(out, family.horizon, ds.horizon)
    if family.max_horizon:
        patches, size = family.max_horizon
        _put(out, patches, -(-ds.horizon // _size(family.defaults, size)))
    if family.channels:
        out[family.channels] = len(ds.columns)
    if family.lags:
        out["num_time_features"] = len(ds.time_features or ()) + 1
        sizes = [len(v) for v in ds.tag_vocab]
        out["num_static_categorical_features"] = len(sizes)
        if sizes:
            out["cardinality"] = sizes
    return out


def _put(out: dict, path: str, value) -> None:
    """Set ``out[path]``, a dotted path making nested dicts (``chronos_config.context_length``)."""
    *parents, name = path.split(".")
    for part in parents:
        out = out.setdefault(part, {})
    out[name] = value


def _merged(*dicts: dict) -> dict:
    """Return the dicts merged left to right, dict values merged key by key."""
    out: dict = {}
    for d in dicts:
        for key, value in d.items():
            old = out.get(key)
            out[key] = (
                _merged(old, value) if isinstance(old, dict) and isinstance(value, dict) else value
            )
    return out


def config_for(model, ds: TsFileWindowDataset, **overrides):
    """Return a config for ``model``'s class from the dataset ``ds``: the family's published
    defaults (Chronos-Bolt: ``initializer_factor=0.05``, patches of 16, nine quantiles...),
    :func:`config_kwargs`, then ``overrides`` (``d_model=16``, ``lags_sequence=[1, 2]``...;
    a dict such as ``chronos_config`` is merged key by key).
    """
    import importlib

    family = _family_of(model)
    config_class = getattr(importlib.import_module(family.config_module), family.config, None)
    if config_class is None:
        raise ImportError(
            f"{family.config} is not in the installed {family.config_module}; {family.model} "
            f"needs a newer one (TimesFM 2.5: transformers>={TIMESFM_2_5_TRANSFORMERS})"
        )
    kwargs = _merged(family.defaults, config_kwargs(ds, family.model), overrides)
    if family.max_horizon and _size(overrides, family.max_horizon[0]) is None:
        patches, size = family.max_horizon  # enough patches of the size the config ends with
        _put(kwargs, patches, -(-ds.horizon // _size(kwargs, size)))
    return config_class(**kwargs)
