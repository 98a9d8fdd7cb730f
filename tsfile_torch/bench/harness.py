"""The one benchmark harness: checksum, repeated timing, min / median, JSON with the environment.

Every benchmark (``tsfile-torch bench``, the reference workload; in a checkout,
``benchmarks/*.py``) checksums what it reads with :func:`checksum` (through
:func:`consume`), times repeated epochs with :func:`repeat`, reduces seconds with
:func:`later_epochs` and :func:`min_median`, and writes records with :func:`write_json`.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Consumed",
    "Timings",
    "checksum",
    "consume",
    "environment",
    "finish",
    "later_epochs",
    "min_median",
    "repeat",
    "write_json",
]

#: Checksums are exact integers modulo 2**64; sums of them wrap at the same modulus.
MODULUS = 1 << 64


def checksum(values: Any, per_item: bool = False) -> int:
    """Return a position-dependent exact checksum of ``values``, modulo 2**64.

    ``sum(bits[p] * (2 * p + 1))`` over the float32 bit patterns ``bits`` of ``values`` in C
    order: every position has its own odd weight, so a value moved to another row, column or
    time step changes the sum (unless the values there have the same bits), and equal arrays
    give equal sums in every process. Computed as two integer reductions (by leading index and
    by position inside it), cheap enough to run on every batch. Sums of checksums (mod 2**64)
    do not depend on the order of the batches, as workers legitimately interleave them.

    Args:
        values: an array or CPU tensor of any shape; converted to float32.
        per_item: return the sum of the checksums of ``values[0]``, ``values[1]``, ...:
            positions inside an item count, the order of the items does not (windows, whose
            order in and across batches depends on the sampler).
            ``checksum(w) == checksum(w[None], per_item=True)``.

    Returns:
        The checksum, an int in [0, 2**64); 0 for an empty array.
    """
    as32 = np.ascontiguousarray(values, dtype=np.float32)
    if as32.size == 0:
        return 0
    bits = as32.view(np.uint32).reshape(as32.shape[0], -1)
    rows, cols = bits.shape
    # weight(i, j) = 2 * cols * i + 2 * j + 1 splits into a row part and a column part
    by_col = bits.sum(axis=0, dtype=np.uint64)
    col_weight = np.arange(cols, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        total = (by_col * col_weight).sum(dtype=np.uint64)
        if not per_item:
            by_row = bits.sum(axis=1, dtype=np.uint64)
            row_weight = np.arange(rows, dtype=np.uint64) * np.uint64(2 * cols)
            total += (by_row * row_weight).sum(dtype=np.uint64)
    return int(total)


class Consumed(NamedTuple):
    """What one pass over batches delivered."""

    checksum: int  # sum of the batches' checksums, modulo 2**64
    rows: int  # rows (windows, with per_item) along the first axis of each batch


def consume(batches: Iterable, per_item: bool = False, row_step: int = 1) -> Consumed:
    """Iterate ``batches`` once, checksumming each; return the checksum and the row count.

    Args:
        batches: arrays or tensors, or tuples / lists of them (``(x, y)`` windows: each part
            is checksummed, rows are counted on the first).
        per_item: passed to :func:`checksum`.
        row_step: checksum every ``row_step``-th row of each part only; rows still count all.
            The scale benchmark compares cost per value with tsfile's decode floor and keeps
            the check out of that cost this way.
    """
    total, rows = 0, 0
    for batch in batches:
        parts = batch if isinstance(batch, tuple | list) else (batch,)
        for part in parts:
            total += checksum(part[::row_step] if row_step > 1 else part, per_item)
        rows += len(parts[0])
    return Consumed(total % MODULUS, rows)


def min_median(samples: Iterable[float]) -> tuple[float, float]:
    """Return the minimum and the median of ``samples``."""
    values = list(samples)
    return min(values), statistics.median(values)


def later_epochs(seconds: Sequence[float]) -> list[float]:
    """Return the epochs after the first (it pays worker start and reader opens).

    A run of a single epoch returns that epoch, so a quick run still reports something.
    """
    return list(seconds[1:] or seconds)


@dataclass(frozen=True)
class Timings:
    """Seconds of the measured rounds, what each returned, and the warm-ups' seconds."""

    seconds: list[float]
    results: list
    warmup_seconds: list[float]

    @property
    def min(self) -> float:
        return min(self.seconds)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def repeat(
    run: Callable[[int], Any],
    rounds: int,
    *,
    warmup: int = 0,
    before: Callable[[int], Any] | None = None,
    after: Callable[[int, Any], Any] | None = None,
) -> Timings:
    """Call ``run(i)`` for ``i`` in ``range(warmup + rounds)``, each timed with perf_counter.

    The first ``warmup`` calls are reported apart (``warmup_seconds``) and their results
    dropped. ``before(i)`` and ``after(i, result)`` run untimed around each call (set the
    epoch; read memory use).

    Raises:
        ValueError: ``rounds`` is not a positive integer or ``warmup`` a non-negative one.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds should be a positive integer value, but got rounds={rounds!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(
            f"warmup should be a non-negative integer value, but got warmup={warmup!r}"
        )
    seconds, results = [], []
    for i in range(warmup + rounds):
        if before is not None:
            before(i)
        start = time.perf_counter()
        result = run(i)
        seconds.append(time.perf_counter() - start)
        results.append(result)
        if after is not None:
            after(i, result)
    return Timings(seconds[warmup:], results[warmup:], seconds[:warmup])


def environment() -> dict:
    """Return what the numbers depend on: versions, CPU model and count, the native pool
    setting, kernel, platform."""
    import torch
    import tsfile

    from tsfile_torch.native.forkfix import NATIVE_THREADS_ENV

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "tsfile": getattr(tsfile, "__version__", _dist_version("tsfile")),
        "numpy": np.__version__,
        "cpu": cpu,
        "cpus": os.cpu_count(),
        # tsfile's native pool per process: unset = the CPUs' share (Note: native pool size)
        NATIVE_THREADS_ENV: os.environ.get(NATIVE_THREADS_ENV),
        "kernel": platform.release(),
        "platform": platform.platform(),
    }


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "unknown"


def finish(table: str, records: list[dict], json_path: str | None) -> int:
    """Print a benchmark's table, write its records to ``json_path`` when given (saying so), and
    return 0, the exit status of its ``main``."""
    print(table)
    if json_path:
        write_json(records, json_path)
        print(f"wrote {len(records)} records to {json_path}")
    return 0


def write_json(records: Iterable[dict], path: str, append: bool = False) -> None:
    """Write one JSON object per line: each record with the environment attached.

    Every line carries an ``environment`` key (:func:`environment`, taken once per call), so a
    file that several runs append to stays self-describing line by line; a record that already
    has one (read back from an earlier file) keeps it.

    Args:
        records: JSON-serializable dicts, one per cell (configuration, route, set).
        path: the file; created or truncated unless ``append``.
        append: add to the end of ``path`` instead.
    """
    env = environment()
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps({**rec, "environment": rec.get("environment", env)}) + "\n")
