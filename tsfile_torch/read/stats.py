"""Statistics of catalog columns: from metadata, or exact from one streaming pass.

:func:`series_stats` is what ``stats()`` of every view and ``normalize=`` are built on; the
reading core calls it with a reader of its own settings (:meth:`ReadingCore.stats`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tsfile_torch.catalog.build import Catalog

__all__ = ["RunningMoments", "series_stats"]


class RunningMoments:
    """Count, mean, sum of squared deviations, min and max per field, merged chunk by chunk
    (Chan et al.). NaN values (nulls) are skipped.
    """

    def __init__(self, num_fields: int):
        self.count = np.zeros(num_fields, dtype=np.int64)
        self.mean = np.zeros(num_fields, dtype=np.float64)
        self.m2 = np.zeros(num_fields, dtype=np.float64)
        self.min = np.full(num_fields, np.inf)
        self.max = np.full(num_fields, -np.inf)

    def add(self, field: int, values: np.ndarray) -> None:
        """Fold the 1-D ``values`` of field ``field`` in."""
        values = np.asarray(values, dtype=np.float64)
        values = values[~np.isnan(values)]
        n = len(values)
        if not n:
            return
        mean = values.mean()
        self.min[field] = min(self.min[field], values.min())
        self.max[field] = max(self.max[field], values.max())
        m2 = float(((values - mean) ** 2).sum())
        total = self.count[field] + n
        delta = mean - self.mean[field]
        self.m2[field] += m2 + delta * delta * self.count[field] * n / total
        self.mean[field] += delta * n / total
        self.count[field] = total

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation per field (NaN where no values)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, np.sqrt(self.m2 / self.count), np.nan)


def series_stats(
    catalog: Catalog,
    names: Mapping[str, Sequence[int]],
    exact: bool,
    make_reader: Callable[[Catalog], Any],
    block_rows: int,
) -> dict[str, dict]:
    """Return statistics per name, each over the catalog columns listed for it.

    Without ``exact``: ``count``, ``min``, ``max``, ``mean`` from the files' metadata, no value
    read (``"source": "metadata"``, ``std`` None; min / max of whole files even where a time
    range cuts a series, whose ``count`` is then None). With ``exact``: one streaming pass over
    the values in range (float64, ``block_rows`` rows per read, nulls skipped) adds the
    population ``std`` and recounts ``count``, ``min``, ``max`` and ``mean``
    (``"source": "data"``).
    """
    out = {}
    for name, cols in names.items():
        columns = [catalog.columns[c] for c in cols]
        counts = [c.num_values for c in columns]
        count = None if None in counts else sum(counts)  # None: a time range cut a series
        totals = [c.sum for c in columns]
        out[name] = {
            "count": count,
            "min": min((c.min for c in columns if c.min is not None), default=None),
            "max": max((c.max for c in columns if c.max is not None), default=None),
            "mean": sum(totals) / count if count and None not in totals else None,
            "std": None,
            "source": "metadata",
        }
    if not exact:
        return out
    slot = {c: j for j, cols in enumerate(names.values()) for c in cols}
    moments = RunningMoments(len(names))
    reader = make_reader(catalog)
    try:
        for gi, group in enumerate(catalog.groups):
            wanted = [(r, slot[c]) for r, c in enumerate(group.columns) if c in slot]
            for a in range(0, group.num_rows if wanted else 0, block_rows):
                _, values = reader.read_group(gi, a, min(a + block_rows, group.num_rows))
                for r, j in wanted:
                    moments.add(j, values[r])
    finally:
        reader.close()
    for j, name in enumerate(names):
        counted = int(moments.count[j])
        out[name].update(
            count=counted,
            min=float(moments.min[j]) if counted else None,
            max=float(moments.max[j]) if counted else None,
            mean=float(moments.mean[j]) if counted else None,
            std=float(moments.std[j]) if counted else None,
            source="data",
        )
    return out
