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

from tsfile_torch.data.features import check_time_features
from tsfile_torch.options import check_bool, check_choice, check_int

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


def _fraction(name: str, value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} should be a fraction in [0, 1] or None, but got {name}={value!r}")
    if not 0 <= value <= 1:
        raise ValueError(f"{name} should be a fraction in [0, 1], but got {name}={value!r}")
    return float(value)
