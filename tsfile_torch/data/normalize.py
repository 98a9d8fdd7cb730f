"""Per-field statistics and the :class:`Normalizer` that applies them (numpy and torch).

Statistics come from TsFile metadata (count, min, max, sum per series and file: no value is
read); the standard deviation is not in the metadata and takes one streaming pass
(:class:`RunningMoments`). A :class:`Normalizer` maps ``v -> (v - shift) / scale`` per field and
back with :meth:`Normalizer.inverse`; build it once on the training data and hand the same object
to the validation dataset so both use the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tsfile_torch.catalog.build import Catalog
from tsfile_torch.options import NORMALIZE_METHODS

__all__ = [
    "NORMALIZE_METHODS",
    "DeviceNormalizer",
    "Normalizer",
    "RunningMoments",
    "make_normalizer",
    "series_stats",
]


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


@dataclass(frozen=True)
class Normalizer:
    """Per-field affine map ``(v - shift) / scale``; picklable, no state but its numbers.

    Attributes:
        fields: field names, in the order of ``shift`` and ``scale``.
        shift: value subtracted per field.
        scale: divisor per field (never 0: a constant field gets 1).
        method: ``"minmax"``, ``"standard"`` or ``"custom"``.
    """

    fields: tuple[str, ...]
    shift: tuple[float, ...]
    scale: tuple[float, ...]
    method: str = "custom"

    def __post_init__(self):
        if not (len(self.fields) == len(self.shift) == len(self.scale)):
            raise ValueError(
                f"Normalizer needs one shift and one scale per field; got {len(self.fields)} "
                f"fields, {len(self.shift)} shifts, {len(self.scale)} scales"
            )
        for name, s in zip(self.fields, self.scale, strict=True):
            if not np.isfinite(s) or s == 0:
                raise ValueError(f"Normalizer scale of field {name!r} must be finite and != 0")

    @classmethod
    def from_stats(cls, stats: Mapping[str, Mapping], method: str) -> Normalizer:
        """Build from ``ds.stats()`` output: ``minmax`` uses min/max, ``standard`` mean/std."""
        if method not in NORMALIZE_METHODS:
            raise ValueError(
                f"normalize must be one of 'minmax', 'standard', a Normalizer or None; "
                f"got {method!r}"
            )
        shift, scale = [], []
        for name, s in stats.items():
            if method == "minmax":
                lo, hi = s.get("min"), s.get("max")
                if lo is None or hi is None:
                    raise ValueError(f"field {name!r} has no min/max in its statistics")
                shift.append(float(lo))
                scale.append(float(hi - lo) or 1.0)
            else:
                mean, std = s.get("mean"), s.get("std")
                if mean is None or std is None or not np.isfinite(std):
                    raise ValueError(
                        f"field {name!r} has no mean/std; 'standard' needs stats(exact=True)"
                    )
                shift.append(float(mean))
                scale.append(float(std) or 1.0)
        return cls(tuple(stats), tuple(shift), tuple(scale), method)

    def _params(self, fields: Sequence[str] | None) -> tuple[np.ndarray, np.ndarray]:
        if fields is None:
            return np.asarray(self.shift), np.asarray(self.scale)
        index = {f: i for i, f in enumerate(self.fields)}
        unknown = [f for f in fields if f not in index]
        if unknown:
            raise ValueError(
                f"Normalizer has no numbers for fields {unknown}; it knows {list(self.fields)}"
            )
        pick = [index[f] for f in fields]
        return np.asarray(self.shift)[pick], np.asarray(self.scale)[pick]

    def __call__(self, values, fields: Sequence[str] | None = None):
        """Normalize ``values`` whose last axis is ``fields`` (default: all, in order)."""
        shift, scale = self._params(fields)
        return _affine(values, shift, scale, inverse=False)

    def inverse(self, values, fields: Sequence[str] | None = None):
        """Undo :meth:`__call__` (e.g. ``normalizer.inverse(prediction, ds.targets)``)."""
        shift, scale = self._params(fields)
        return _affine(values, shift, scale, inverse=True)


@dataclass(frozen=True)
class DeviceNormalizer(Normalizer):
    """Per-device statistics (``normalize_by="device"``, like pytorch-forecasting's
    GroupNormalizer): a :class:`Normalizer` whose fields are ``device.field`` names.

    Attributes:
        devices: device names; an integer ``device_id`` is an index into them (the training
            dataset's ``ds.devices``).
        device_fields: field names, in the order of each device's numbers.
        targets: the fields :meth:`inverse` assumes by default (the dataset's targets).
    """

    devices: tuple[str, ...] = ()
    device_fields: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()

    @classmethod
    def from_normalizer(
        cls,
        flat: Normalizer,
        devices: Sequence[str],
        fields: Sequence[str],
        targets: Sequence[str],
    ) -> DeviceNormalizer:
        """Wrap ``flat``, whose fields are ``device.field`` for each device then field."""
        return cls(
            flat.fields,
            flat.shift,
            flat.scale,
            flat.method,
            tuple(devices),
            tuple(fields),
            tuple(targets),
        )

    def device_index(self, device_id) -> np.ndarray:
        """Return indices into :attr:`devices` of ``device_id`` (ints, names, tensors)."""
        if hasattr(device_id, "detach"):  # a torch tensor
            device_id = device_id.detach().cpu().numpy()
        ids = np.asarray(device_id)
        if ids.dtype.kind in "US":
            index = {d: i for i, d in enumerate(self.devices)}
            unknown = [d for d in ids.ravel().tolist() if d not in index]
            if unknown:
                raise ValueError(
                    f"DeviceNormalizer has no numbers for devices {unknown[:5]}; it knows "
                    f"{list(self.devices)[:8]}"
                )
            ids = np.vectorize(index.__getitem__, otypes=[np.int64])(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"device_id must be integers or device names; got {device_id!r}")
        if ids.size and (ids.min() < 0 or ids.max() >= len(self.devices)):
            raise ValueError(
                f"device_id must index the {len(self.devices)} devices of this normalizer; "
                f"got {ids.ravel().tolist()[:8]}"
            )
        return ids.astype(np.int64)

    def device_params(self, device_id, fields: Sequence[str] | None = None):
        """Return (shift, scale) arrays of shape ``device_id.shape + (len(fields),)``."""
        fields = self.targets if fields is None else tuple(fields)
        unknown = [f for f in fields if f not in self.device_fields]
        if unknown:
            raise ValueError(
                f"DeviceNormalizer has no numbers for fields {unknown}; it knows "
                f"{list(self.device_fields)}"
            )
        cols = [self.device_fields.index(f) for f in fields]
        shape = (len(self.devices), len(self.device_fields))
        ids = self.device_index(device_id)
        shift = np.asarray(self.shift).reshape(shape)[:, cols][ids]
        scale = np.asarray(self.scale).reshape(shape)[:, cols][ids]
        return shift, scale

    def inverse(self, values, device_id=None, fields: Sequence[str] | None = None):
        """Undo the normalization of ``values`` of devices ``device_id``.

        ``values``: (..., len(fields)) for one device, or (batch, ..., len(fields)) with
        ``device_id`` of shape (batch,) (a batch's ``device_id``); ``fields`` default to the
        targets. ``inverse(values, ["dev.field", ...])`` works as :meth:`Normalizer.inverse`.
        """
        if device_id is None or (
            isinstance(device_id, (list, tuple))
            and device_id
            and all(isinstance(f, str) and f in self.fields for f in device_id)
        ):
            return super().inverse(values, device_id)
        shift, scale = self.device_params(device_id, fields)
        if shift.ndim == 2:  # one row per batch item: broadcast over its steps
            extra = values.ndim - 2
            shift = shift.reshape(shift.shape[:1] + (1,) * extra + shift.shape[1:])
            scale = scale.reshape(scale.shape[:1] + (1,) * extra + scale.shape[1:])
        return _affine(values, shift, scale, inverse=True)


def _affine(values, shift: np.ndarray, scale: np.ndarray, inverse: bool):
    if isinstance(values, np.ndarray):
        shift, scale = shift.astype(values.dtype), scale.astype(values.dtype)
    else:  # a torch tensor: same dtype and device as the values
        import torch

        shift = torch.as_tensor(shift, dtype=values.dtype, device=values.device)
        scale = torch.as_tensor(scale, dtype=values.dtype, device=values.device)
    return values * scale + shift if inverse else (values - shift) / scale


def series_stats(
    catalog: Catalog,
    names: Mapping[str, Sequence[int]],
    exact: bool,
    make_reader: Callable[[Catalog], Any],
    block_rows: int = 131072,
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


def make_normalizer(
    normalize, names: Sequence[str], stats: Callable[[bool], Mapping[str, Mapping]]
) -> Normalizer | None:
    """Resolve a ``normalize=`` argument for a dataset whose values are ``names``.

    ``None`` stays None; a :class:`Normalizer` must know every name; ``"minmax"`` builds one
    from ``stats(False)`` (metadata, no read) unless a time range cuts a series (then the
    metadata's min / max are the whole file's: one pass over the rows in range), ``"standard"``
    from ``stats(True)`` (one pass over the rows in range).
    """
    if normalize is None:
        return None
    if isinstance(normalize, Normalizer):
        normalize._params(list(names))  # raises if a name is unknown
        return normalize
    if normalize not in NORMALIZE_METHODS:
        raise ValueError(
            f"normalize must be None, 'minmax', 'standard' or a Normalizer; got {normalize!r}"
        )
    found = stats(normalize == "standard")
    if any(s["count"] is None for s in found.values()):  # a time cut: min / max from the rows
        found = stats(True)
    return Normalizer.from_stats(found, normalize)
