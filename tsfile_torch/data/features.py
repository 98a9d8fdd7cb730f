"""Covariates of forecasting windows: calendar features of timestamps, missing-value fills.

Time features follow GluonTS (``gluonts.time_feature``): each is a calendar component scaled
into [-0.5, 0.5], e.g. ``hour_of_day = hour / 23 - 0.5``. They are computed from int64
timestamps in ``time_unit`` with integer arithmetic (UTC, proleptic Gregorian; floor division,
so timestamps before 1970 fall on the right day, hour and minute).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from tsfile_torch.options import TIME_UNITS

__all__ = ["TIME_FEATURES", "check_time_features", "fill_missing", "time_features"]


_DAY_S = 86_400


def _civil(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (year, month 1-12, day 1-31) of days since 1970-01-01 (H. Hinnant's algorithm).

    Integer arithmetic only: faster than datetime64 unit conversions.
    """
    z = days + 719_468
    era = np.floor_divide(z, 146_097)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    return yoe + era * 400 + (month <= 2), month, day


def _january_first(year: np.ndarray) -> np.ndarray:
    """Return days since 1970-01-01 of January 1st of ``year``."""
    y = year - 1  # January counts in the previous March-based year
    era = np.floor_divide(y, 400)
    yoe = y - era * 400
    return era * 146_097 + yoe * 365 + yoe // 4 - yoe // 100 + 306 - 719_468


#: Feature name -> function of (days since the epoch, their civil dates) giving the calendar
#: component scaled into [0, 1]; computed on the distinct days when they are few (Note below).
_DAY_FEATURES = {
    "day_of_week": lambda days, civil: ((days + 3) % 7) / 6.0,  # 1970-01-01: Thursday; Monday 0
    "day_of_month": lambda days, civil: (civil()[2] - 1) / 30.0,
    "day_of_year": lambda days, civil: (days - _january_first(civil()[0])) / 365.0,
    "month_of_year": lambda days, civil: (civil()[1] - 1) / 11.0,
}
#: Feature name -> function of the second of the day giving the component scaled into [0, 1].
_SECOND_FEATURES = {
    "minute_of_hour": lambda second: (second // 60 % 60) / 59.0,
    "hour_of_day": lambda second: (second // 3600) / 23.0,
}
#: Every feature name time_features knows.
TIME_FEATURES = (*_SECOND_FEATURES, *_DAY_FEATURES)


def check_time_features(value) -> tuple[str, ...]:
    """Return ``time_features=`` as a tuple of known names (``None`` -> empty).

    Raises:
        TypeError: not a list of names. ValueError: an unknown name.
    """
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"time_features must be a list of feature names or None; got {value!r}")
    for name in value:
        if name not in TIME_FEATURES:
            raise ValueError(
                f"time_features: unknown feature {name!r}; known features are "
                f"{', '.join(map(repr, TIME_FEATURES))}"
            )
    return tuple(value)


def time_features(times: np.ndarray, names: Sequence[str], time_unit: str) -> np.ndarray:
    """Return features ``names`` of int64 ``times`` in ``time_unit``: shape ``times.shape + (F,)``.

    Each feature is in [-0.5, 0.5] (GluonTS's encoding), float32. Day-level features are
    computed once per distinct day when the timestamps span fewer days than they are many
    (windows: a few days each, many steps), then looked up: integer calendar arithmetic per
    timestamp costs far more than the lookup.
    """
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {list(TIME_UNITS)}; got {time_unit!r}")
    seconds = np.floor_divide(np.asarray(times, dtype=np.int64), TIME_UNITS[time_unit])
    days = np.floor_divide(seconds, _DAY_S)
    out = np.empty(seconds.shape + (len(names),), dtype=np.float32)
    lo, hi = (int(days.min()), int(days.max())) if days.size else (0, -1)
    few = hi - lo + 1 < days.size // 4
    domain = np.arange(lo, hi + 1, dtype=np.int64) if few else days
    civil = functools.cache(lambda: _civil(domain))
    second = None
    for j, name in enumerate(names):
        if name in _SECOND_FEATURES:
            if second is None:
                second = seconds - days * _DAY_S
            out[..., j] = _SECOND_FEATURES[name](second) - 0.5
        else:
            feature = _DAY_FEATURES[name](domain, civil) - 0.5
            out[..., j] = feature[days - lo] if few else feature
    return out


def fill_missing(values: np.ndarray, missing: np.ndarray, fill: str, leading: float) -> None:
    """Fill the ``missing`` cells of windows ``values`` (windows, steps, fields) in place.

    ``"zero"``: 0. ``"ffill"``: the last value read earlier in the same window (a window never
    borrows from outside itself, so an item does not depend on how it was read), ``leading``
    before the first. ``"nan"``: left as they are.
    """
    if fill == "nan" or not missing.any():
        return
    if fill == "ffill":
        steps = np.arange(values.shape[1]).reshape(1, -1, 1)
        last = np.maximum.accumulate(np.where(missing, -1, steps), axis=1)
        taken = np.take_along_axis(values, np.maximum(last, 0), axis=1)
        values[...] = np.where(last < 0, leading, taken)
        return
    values[missing] = 0
