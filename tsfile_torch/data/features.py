"""Covariates of forecasting windows: calendar features of timestamps, missing-value fills.

Time features follow GluonTS (``gluonts.time_feature``): each is a calendar component scaled
into [-0.5, 0.5], e.g. ``hour_of_day = hour / 23 - 0.5``. They are computed from int64
timestamps in ``time_unit`` with numpy's datetime64 (UTC, proleptic Gregorian; timestamps
before 1970 floor to the right day, hour and minute).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tsfile_torch.options import TIME_UNITS

__all__ = ["TIME_FEATURES", "check_time_features", "fill_missing", "time_features"]


def _minute_of_hour(t: np.ndarray) -> np.ndarray:
    return (t.astype("datetime64[m]") - t.astype("datetime64[h]")).astype(np.int64) / 59.0


def _hour_of_day(t: np.ndarray) -> np.ndarray:
    return (t.astype("datetime64[h]") - t.astype("datetime64[D]")).astype(np.int64) / 23.0


def _day_of_week(t: np.ndarray) -> np.ndarray:
    days = t.astype("datetime64[D]").astype(np.int64)
    return ((days + 3) % 7) / 6.0  # 1970-01-01 was a Thursday; Monday = 0 as in pandas


def _day_of_month(t: np.ndarray) -> np.ndarray:
    days = t.astype("datetime64[D]")
    return (days - days.astype("datetime64[M]")).astype(np.int64) / 30.0


def _day_of_year(t: np.ndarray) -> np.ndarray:
    days = t.astype("datetime64[D]")
    return (days - days.astype("datetime64[Y]")).astype(np.int64) / 365.0


def _month_of_year(t: np.ndarray) -> np.ndarray:
    return (t.astype("datetime64[M]").astype(np.int64) % 12) / 11.0


#: Feature name -> function of datetime64 values giving the component scaled into [0, 1].
TIME_FEATURES = {
    "minute_of_hour": _minute_of_hour,
    "hour_of_day": _hour_of_day,
    "day_of_week": _day_of_week,
    "day_of_month": _day_of_month,
    "day_of_year": _day_of_year,
    "month_of_year": _month_of_year,
}


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

    Each feature is in [-0.5, 0.5] (GluonTS's encoding), float32.
    """
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {list(TIME_UNITS)}; got {time_unit!r}")
    stamps = np.asarray(times, dtype=np.int64).view(f"datetime64[{time_unit}]")
    out = np.empty(stamps.shape + (len(names),), dtype=np.float32)
    for j, name in enumerate(names):
        out[..., j] = TIME_FEATURES[name](stamps) - 0.5
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
