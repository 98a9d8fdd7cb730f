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

import numpy as np

from tsfile_torch.options import NORMALIZE_METHODS
from tsfile_torch.read.stats import RunningMoments, series_stats  # noqa: F401 - re-exported

__all__ = [
    "NORMALIZE_METHODS",
    "DeviceNormalizer",
    "Normalizer",
    "RunningMoments",
    "make_normalizer",
    "series_stats",
]


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
