"""What a window is: :class:`WindowSpec`, one frozen group validated once.

The three groups of a window dataset's arguments are each one frozen dataclass: what is read
(:class:`~tsfile_torch.options.ReadOptions`), how items are ordered
(:class:`~tsfile_torch.sampling.orders.OrderSpec`) and what a window is (this). A dataset is a
function of (sources, the three groups, rank, world size), so ``split_by_time`` is the same
dataset with ``dataclasses.replace`` of the read options' time range, and a Ray datasource
forwards the same groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pandas as pd

from tsfile_torch.data.features import check_time_features
from tsfile_torch.options import TIME_UNITS, check_bool, check_choice, check_int, to_timestamp
from tsfile_torch.read.grid import GridSpec

__all__ = ["DEVICE_WEIGHTS", "NORMALIZE_BY", "WindowSpec"]

#: ``column``: one scale per field over every device; ``device``: per device and field.
NORMALIZE_BY = ("column", "device")
#: ``length``: every window equally likely (a device in proportion to its windows);
#: ``uniform``: every device equally likely, then one of its windows (order="random").
DEVICE_WEIGHTS = ("length", "uniform")


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """What a window is (the arguments of :class:`~tsfile_torch.TsFileWindowDataset` that are
    neither read options nor order; see its docstring for each). Names are tuples, duplicates
    dropped; ``normalize_by=None`` is resolved by the dataset (it depends on ``normalize``).

    Raises:
        ValueError, TypeError: a bad value, naming the argument.
    """

    context_length: int
    horizon: int = 0
    stride: int = 1
    columns: Sequence[str] | str | None = None
    targets: Sequence[str] | str | None = None
    devices: Sequence[str] | str | None = None
    return_dict: bool = False
    time_features: Sequence[str] | None = None
    normalize_by: str | None = None
    min_context: int | None = None
    max_missing: float | None = None
    device_weights: str = "length"
    #: the time grid (Note: time grid in :mod:`tsfile_torch.read.grid`): a fixed pandas
    #: offset alias (``"15min"``), a ``timedelta`` or a number in the files' time unit
    freq: str | int | None = None
    origin: object = None
    snap: bool = False
    #: fraction of the horizon's target values a window may miss (None: any)
    max_future_missing: float | None = None

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("context_length", check_int("context_length", self.context_length, 1, 2**40))
        set_("horizon", check_int("horizon", self.horizon, 0, 2**40))
        set_("stride", check_int("stride", self.stride, 1, 2**40))
        for name in ("columns", "targets", "devices"):
            set_(name, _names(name, getattr(self, name)))
        set_("return_dict", check_bool("return_dict", self.return_dict))
        set_("time_features", check_time_features(self.time_features))
        if self.time_features and not self.return_dict:
            raise ValueError(
                "time_features are part of dict items: pass return_dict=True with time_features"
            )
        if self.normalize_by is not None:
            set_("normalize_by", check_choice("normalize_by", self.normalize_by, NORMALIZE_BY))
        #: observed context rows the first windows of a device need (the rest is padding)
        set_(
            "min_context",
            check_int("min_context", self.min_context, 1, self.context_length, allow_none=True),
        )
        set_("max_missing", _fraction("max_missing", self.max_missing))
        set_("device_weights", check_choice("device_weights", self.device_weights, DEVICE_WEIGHTS))
        set_("freq", _freq(self.freq))
        set_("snap", check_bool("snap", self.snap))
        if self.freq is None and (self.snap or self.origin is not None):
            raise ValueError(
                f"snap= and origin= place rows on the time grid of freq=; pass freq= with them "
                f"(got snap={self.snap!r}, origin={self.origin!r})"
            )
        set_("max_future_missing", _fraction("max_future_missing", self.max_future_missing))
        if self.max_future_missing is not None and not self.horizon:
            raise ValueError(
                "max_future_missing counts missing targets in the horizon; it needs horizon >= 1"
            )

    def grid(self, time_unit: str) -> GridSpec | None:
        """Return the time grid in ``time_unit`` (None without ``freq``).

        Raises:
            ValueError: a step that is not a whole number of ``time_unit``.
        """
        if self.freq is None:
            return None
        step = self.freq
        if not isinstance(step, int):
            nanos = int(step.value if isinstance(step, pd.Timedelta) else step)
            per_unit = 10**9 // TIME_UNITS[time_unit]
            if nanos % per_unit:
                raise ValueError(
                    f"freq={self.freq!s} is not a whole number of the files' time unit "
                    f"{time_unit!r}; pass time_unit= the unit the files are written in"
                )
            step = nanos // per_unit
        origin = to_timestamp("origin", self.origin, time_unit)
        label = str(self.freq) if isinstance(self.freq, int) else _alias(self.freq)
        return GridSpec(step, origin, self.snap, label, time_unit)

    @property
    def padding(self) -> int:
        """Rows of left padding the first window of a device may have (``min_context``)."""
        return 0 if self.min_context is None else self.context_length - self.min_context

    def replace(self, **changes) -> WindowSpec:
        """Return this spec with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


def _names(name: str, value) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be None or a non-empty list of names; got {value!r}")
    for v in value:
        if not isinstance(v, str):
            raise TypeError(f"{name} must hold names (str); got {v!r}")
    return tuple(dict.fromkeys(value))


def _freq(value) -> int | pd.Timedelta | None:
    """Return ``freq=`` as a step in the files' unit (int) or a Timedelta, checked."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"freq should be an offset alias like '15min', got freq={value!r}")
    if isinstance(value, (int, np.integer)):
        if value < 1:
            raise ValueError(f"freq should be a positive step, but got freq={value!r}")
        return int(value)
    try:
        if isinstance(value, str):
            offset = pd.tseries.frequencies.to_offset(value)
            step = pd.Timedelta(offset)  # fails for calendar offsets (months, business days)
        else:
            step = pd.Timedelta(value)
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"freq should be a fixed step: a pandas offset alias like '15min', '1h', '1s', "
            f"a timedelta or a number in the files' time unit; got freq={value!r} ({err})"
        ) from err
    if step <= pd.Timedelta(0):
        raise ValueError(f"freq should be a positive step, but got freq={value!r}")
    return step


def _alias(step: pd.Timedelta) -> str:
    """Return a short name of a step (``"15min"``)."""
    return step_alias(step) or str(step)


def step_alias(step: pd.Timedelta) -> str | None:
    """Return a step as a pandas offset alias (``"15min"``, ``"1h"``), or None if it has none."""
    try:
        alias = pd.tseries.frequencies.to_offset(step).freqstr
    except ValueError:
        return None
    return alias if alias[:1].isdigit() else f"1{alias}"  # "1h", not "h"


def _fraction(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} should be a fraction in [0, 1] or None, but got {name}={value!r}")
    if not 0 <= value <= 1:
        raise ValueError(f"{name} should be a fraction in [0, 1], but got {name}={value!r}")
    return float(value)
