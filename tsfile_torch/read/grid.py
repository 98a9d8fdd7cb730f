"""Time grid: a table's rows placed on a regular grid of time steps (``freq=``).

Note: time grid. Windows count rows; on a device with missing timestamps a window of rows spans
more time than the model is told. With a grid, row ``i`` of a table is the grid step
``origin + i * step``: a step with a reading holds its values, a step without one is a row of
NaN (missing: masked, filled by ``fill=``, counted by ``max_missing``), so every window spans
exactly ``(length - 1) * step``. The grid is an index mapping, never a copy of the data: it
keeps the runs of consecutive steps (16 bytes per run, one run per hole plus one), and rows
``[a, b)`` of the grid are one read of the table's rows ``[rows_before(a), rows_before(b))``
scattered into NaN. Building it reads the table's time column once (in stretches of
:data:`TIME_STRETCH` rows, none kept).

A device's grid starts at its first reading: with ``origin=`` the steps are
``origin + k * step`` (whole k) and the first one is the reading's step; else the reading's own
timestamp. A timestamp off the grid is a :class:`~tsfile_torch.errors.SchemaError` naming the
device and the timestamp, unless ``snap=True`` rounds each timestamp to the nearest step
(half a step up), where two readings on one step are refused instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from tsfile_torch.catalog.listing import median_step, step_counts
from tsfile_torch.errors import SchemaError
from tsfile_torch.options import format_timestamp

__all__ = ["TIME_STRETCH", "Grid", "GridSpec", "StepSummary", "step_summary"]

#: Timestamps read at a time while a grid is built (8 MiB of int64).
TIME_STRETCH = 1 << 20
#: Most runs of readings a read copies one by one; more: one scatter by position.
_RUN_COPIES = 64
#: Grid steps per reading beyond which a grid is refused as a wrong step or time unit.
SPARSE_STEPS = 1000
#: The time unit timestamps of recent years (1973-2286) have, by their magnitude.
_UNIT_BY_DIGITS = {10: "s", 13: "ms", 16: "us", 19: "ns"}


@dataclass(frozen=True)
class GridSpec:
    """The grid every table of a view is placed on (checked by the view: ``freq=``)."""

    #: grid step in the files' time unit
    step: int
    #: a time the grid passes through (None: each table's first timestamp)
    origin: int | None = None
    #: round timestamps to the nearest step instead of refusing those off the grid
    snap: bool = False
    #: what the step was given as, for messages (``"15min"``)
    label: str = ""
    time_unit: str = "ms"


@dataclass(frozen=True)
class StepSummary:
    """The steps between a table's consecutive timestamps."""

    #: the median step (0 for a table of one row)
    typical: int
    #: the largest step and the timestamp it ends at
    largest: int
    largest_at: int

    @property
    def has_gaps(self) -> bool:
        """Whether a step is at least 1.5 typical steps (a missing timestamp, not jitter)."""
        return self.typical > 0 and 2 * self.largest >= 3 * self.typical


class Grid:
    """Rows ``0 .. num_rows - 1`` of one table on a regular time grid (see the module notes).

    Picklable, no handles. Build it with :meth:`build`.
    """

    def __init__(self, spec: GridSpec, origin: int, run_pos, run_row, num_read: int, name: str):
        self.spec = spec
        self.step = spec.step
        #: time of grid row 0 (the table's first reading, on the grid)
        self.origin = origin
        #: each run of consecutive grid rows that hold readings: its first grid row and the
        #: table row read there; rows ``run_row[j] .. run_row[j + 1] - 1`` lie on grid rows
        #: ``run_pos[j] ..``
        self.run_pos = np.asarray(run_pos, dtype=np.int64)
        self.run_row = np.append(np.asarray(run_row, dtype=np.int64), num_read)
        self.name = name

    @property
    def num_rows(self) -> int:
        """Grid rows, from the first reading to the last."""
        last = len(self.run_pos) - 1
        return int(self.run_pos[last] + self.run_row[last + 1] - self.run_row[last])

    @property
    def num_read(self) -> int:
        """Rows of the table (grid rows that hold a reading)."""
        return int(self.run_row[-1])

    @property
    def holes(self) -> int:
        """Grid rows without a reading."""
        return self.num_rows - self.num_read

    def rows_before(self, pos: int) -> int:
        """Return how many table rows lie on grid rows before ``pos``."""
        j = int(np.searchsorted(self.run_pos, pos, side="right")) - 1
        if j < 0:
            return 0
        length = int(self.run_row[j + 1] - self.run_row[j])
        return int(self.run_row[j]) + min(pos - int(self.run_pos[j]), length)

    def steps_before(self, t: int) -> int:
        """Return how many grid rows lie before time ``t`` (0 before the origin)."""
        return max(0, -(-(t - self.origin) // self.step))

    def positions(self, times: np.ndarray) -> np.ndarray:
        """Return the grid rows of timestamps read from this table."""
        offset = times - self.origin
        if self.spec.snap:
            offset = offset + self.step // 2
        return offset // self.step

    def times(self, start: int, stop: int) -> np.ndarray:
        """Return the timestamps of grid rows ``[start, stop)``."""
        return self.origin + self.step * np.arange(start, stop, dtype=np.int64)

    def read(
        self, read_rows: Callable, start: int, stop: int, width: int, dtype
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return grid rows ``[start, stop)``: values ``(n, width)`` (NaN on steps without a
        reading) and the grid's timestamps; ``read_rows(a, b)`` reads table rows ``[a, b)``."""
        if not 0 <= start < stop <= self.num_rows:
            raise ValueError(
                f"row range [{start}, {stop}) is outside the {self.num_rows} grid rows of "
                f"{self.name} or empty"
            )
        lo, hi = self.rows_before(start), self.rows_before(stop)
        if hi - lo == stop - start:  # no hole here: the rows as read
            values, _ = read_rows(lo, hi)
            return values, self.times(start, stop)
        if hi == lo:
            return np.full((stop - start, width), np.nan, dtype=dtype), self.times(start, stop)
        read, times = read_rows(lo, hi)
        first = max(int(np.searchsorted(self.run_pos, start, side="right")) - 1, 0)
        last = int(np.searchsorted(self.run_pos, stop, side="left"))
        if last - first > _RUN_COPIES:  # many short runs: one scatter by position
            values = np.full((stop - start, width), np.nan, dtype=dtype)
            values[self.positions(times) - start] = read
            return values, self.times(start, stop)
        values = np.empty((stop - start, width), dtype=dtype)
        done = start  # grid rows before this one are written
        for j in range(first, last):  # one copy per run of readings, NaN between them
            p0, r0 = int(self.run_pos[j]), int(self.run_row[j])
            a, b = max(p0, start), min(p0 + int(self.run_row[j + 1]) - r0, stop)
            if a >= b:
                continue
            values[done - start : a - start] = np.nan
            values[a - start : b - start] = read[r0 + a - p0 - lo : r0 + b - p0 - lo]
            done = b
        values[done - start :] = np.nan
        return values, self.times(start, stop)

    @classmethod
    def build(cls, spec: GridSpec, stretches: Iterable[np.ndarray], name: str) -> Grid:
        """Return the grid of a table whose timestamps come in ``stretches`` (in order).

        Raises:
            SchemaError: a timestamp off the grid (without ``snap``), or two readings on one
                step (with ``snap``); the message names ``name`` and the timestamp.
        """
        anchor = spec.origin
        run_pos, run_row, row, prev = [], [], 0, None
        for times in stretches:
            if not len(times):
                continue
            if anchor is None:
                anchor = int(times[0])
            offset = times - anchor
            if spec.snap:
                pos = (offset + spec.step // 2) // spec.step
            else:
                pos, rest = np.divmod(offset, spec.step)
                if rest.any():
                    _off_grid(spec, name, int(times[np.flatnonzero(rest)[0]]), anchor)
            full = pos if prev is None else np.r_[prev, pos]
            steps = np.diff(full)
            if (steps <= 0).any():
                at = int(np.flatnonzero(steps <= 0)[0]) + (0 if prev is None else -1)
                _two_on_one(spec, name, times, at + 1, anchor)
            breaks = np.flatnonzero(steps != 1) + (1 if prev is None else 0)
            if prev is None:
                breaks = np.r_[0, breaks]
            run_pos.append(pos[breaks])
            run_row.append(row + breaks)
            row += len(pos)
            prev = int(pos[-1])
        if not run_pos:
            raise SchemaError(f"{name}: no rows to place on the {spec.label} grid")
        run_pos = np.concatenate(run_pos)
        first = int(run_pos[0])
        grid = cls(spec, anchor + first * spec.step, run_pos - first, np.concatenate(run_row),
                   row, name)  # fmt: skip
        if grid.num_rows > SPARSE_STEPS * max(row, 1):
            _too_sparse(spec, name, grid, anchor)
        return grid


def step_summary(stretches: Iterable[np.ndarray]) -> StepSummary:
    """Return the steps between consecutive timestamps given in ``stretches`` (in order): the
    exact median step (as :func:`tsfile_torch.list_devices` gives it) and the largest."""
    values, counts, largest, largest_at, prev = [], [], 0, 0, None
    for times in stretches:
        if not len(times):
            continue
        full = times if prev is None else np.r_[prev, times]
        steps = np.diff(full)
        if len(steps):
            distinct, n = step_counts(steps)
            values.append(distinct)
            counts.append(n)
            i = int(np.argmax(steps))
            if steps[i] > largest:
                largest, largest_at = int(steps[i]), int(full[i + 1])
        prev = int(times[-1])
    if not values:
        return StepSummary(0, 0, 0)
    return StepSummary(
        median_step(np.concatenate(values), np.concatenate(counts)), largest, largest_at
    )


def _off_grid(spec: GridSpec, name: str, t: int, anchor: int) -> None:
    raise SchemaError(
        f"{name}: timestamp {t} ({format_timestamp(t, spec.time_unit)}) is not on the "
        f"freq={spec.label!r} grid through {anchor} "
        f"({'origin=' if spec.origin is not None else 'the first timestamp'}); pass the "
        f"step the data is sampled at as freq= (tsfile_torch.list_devices shows each "
        f"device's typical step), snap=True to round each timestamp to the nearest step, or "
        f"origin= a time on the data's grid"
    )


def _too_sparse(spec: GridSpec, name: str, grid: Grid, anchor: int) -> None:
    digits = len(str(abs(anchor)))
    guess = next((u for d, u in _UNIT_BY_DIGITS.items() if digits <= d), "ns")
    hint = ""
    if guess != spec.time_unit:
        hint = f"; its timestamps ({anchor}) look like {guess!r}: pass time_unit={guess!r}"
    raise SchemaError(
        f"{name}: freq={spec.label!r} in time unit {spec.time_unit!r} places its "
        f"{grid.num_read:,} readings on {grid.num_rows:,} grid steps (over {SPARSE_STEPS} "
        f"steps per reading){hint}, or pass the step the data is sampled at as freq="
    )


def _two_on_one(spec: GridSpec, name: str, times: np.ndarray, i: int, anchor: int) -> None:
    t = int(times[min(i, len(times) - 1)])
    raise SchemaError(
        f"{name}: two readings round to the same freq={spec.label!r} step near {t} "
        f"({format_timestamp(t, spec.time_unit)}) with snap=True; pass a finer freq= (the "
        f"data holds readings closer than one step)"
    )
