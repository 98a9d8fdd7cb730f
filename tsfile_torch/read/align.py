"""Time alignment of series with different timestamps: pure numpy functions, no I/O.

Rows of an aligned view are the union (or intersection) of the series' timestamps, in time order.
A series with no sample at a row gets its fill: ``"nan"``, ``"ffill"`` (the last earlier sample,
NaN before the first) or ``"zero"``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ALIGN_MODES", "FILL_MODES", "align_to", "aligned_times", "check_align"]

#: How the rows of an aligned view are chosen; ``None`` (not listed) means "one shared timeline".
ALIGN_MODES = ("union", "intersect")
#: What a series holds at an aligned row where it has no sample.
FILL_MODES = ("nan", "ffill", "zero")


def check_align(align, fill) -> None:
    """Raise ``ValueError`` unless ``align`` / ``fill`` are allowed values."""
    if align is not None and align not in ALIGN_MODES:
        raise ValueError(f"align must be None, 'union' or 'intersect'; got {align!r}")
    if fill not in FILL_MODES:
        raise ValueError(f"fill must be one of 'nan', 'ffill', 'zero'; got {fill!r}")


def aligned_times(times: Sequence[np.ndarray], align: str) -> np.ndarray:
    """Return the sorted union or intersection of increasing int64 timestamp arrays."""
    if align == "union":
        return np.unique(np.concatenate([np.asarray(t, dtype=np.int64) for t in times]))
    out = np.asarray(times[0], dtype=np.int64)
    for t in times[1:]:
        out = np.intersect1d(out, t, assume_unique=True)
    return out


def align_to(target: np.ndarray, times: np.ndarray, values: np.ndarray, fill: str) -> np.ndarray:
    """Return ``values`` (float, shape ``(len(times),)``) at the timestamps ``target``.

    Args:
        target: increasing int64 timestamps of the output rows.
        times: increasing int64 timestamps of the series' samples.
        values: the samples, one per timestamp.
        fill: what rows without a sample get (see :data:`FILL_MODES`). For ``"ffill"`` the
            caller passes the sample before ``target[0]`` too when there is one.
    """
    if fill == "ffill":
        if not len(times):
            return np.full(len(target), np.nan, dtype=values.dtype)
        idx = np.searchsorted(times, target, side="right") - 1
        out = values[np.maximum(idx, 0)].astype(values.dtype, copy=True)
        out[idx < 0] = np.nan
        return out
    out = np.full(len(target), np.nan if fill == "nan" else 0.0, dtype=values.dtype)
    idx = np.searchsorted(times, target, side="left")
    hit = idx < len(times)
    hit[hit] = times[idx[hit]] == target[hit]
    out[hit] = values[idx[hit]]
    return out
