"""DatasetOptions: every dataset setting in one frozen dataclass, validated once.

Datasets, the CLI and the benchmarks build their settings through :class:`DatasetOptions`, so an
argument is checked in one place with one message.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .backend import parse_backend
from .reader import DEFAULT_BLOCK_ROWS

__all__ = ["CACHE_MODES", "MAX_RANDOM_BATCHES", "DatasetOptions", "check_random_batches"]

#: Most random windows per epoch: their start rows are one int64 array (2 GiB at this bound).
MAX_RANDOM_BATCHES = 1 << 28


def check_random_batches(name: str, value) -> None:
    """Raise ValueError if ``value`` windows per epoch exceed :data:`MAX_RANDOM_BATCHES`."""
    if value is not None and value > MAX_RANDOM_BATCHES:
        raise ValueError(
            f"{name}={value} random windows per epoch is beyond the limit of "
            f"{MAX_RANDOM_BATCHES} (their start rows alone would take {value * 8 / 2**30:.0f} "
            f"GiB); use fewer windows per epoch and more epochs"
        )


#: ``none``: streaming; decoded blocks live in a bounded cache emptied at each epoch.
#: ``memory``: every row read is kept, assembled, in the process across epochs (decode once;
#: ``num_rows * (num_columns * itemsize + 8)`` bytes per process).
CACHE_MODES = ("none", "memory")

_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def _positive_int(name: str, value: Any, allow_none: bool = False, allow_zero: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} should be a positive integer value, but got {name}={value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value!r}")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} should be True or False, but got {name}={value!r}")
    return value


def _dtype_name(value: Any) -> str:
    name = str(value).replace("torch.", "")
    if name not in _FLOAT_DTYPES:
        raise ValueError(
            f"dtype must be one of torch.float16, torch.bfloat16, torch.float32, "
            f"torch.float64; got {value!r}"
        )
    return name


@dataclass(frozen=True)
class DatasetOptions:
    """Settings shared by every tsfile-torch dataset.

    Attributes:
        columns: ``None`` for every numeric field, else exact names or glob patterns.
        batch_size: rows per batch.
        shuffle: batches in a (seed, epoch) permutation instead of row order.
        seed: seed of every random choice.
        drop_last: leave out the last, shorter batch.
        read_backend: ``"auto"``, ``"mmap"`` or ``"pread"``.
        dtype: name of the torch floating dtype of batches (``"float32"``...).
        random_batches: if set, each epoch is this many windows of ``batch_size`` rows starting
            at uniformly random rows, instead of a pass over the rows.
        cache: one of :data:`CACHE_MODES`.
        cache_bytes: block-cache budget per process for ``cache="none"`` (``None``: default).
        block_rows: rows decoded per native call.
        return_timestamps: yield ``(values, timestamps)`` instead of ``values``.
        malloc_tuning: apply :func:`tsfile_torch.reader.tune_malloc` in each reading process
            (glibc only; keeps decode buffers mapped between queries: faster, may hold up to
            1 GiB of freed heap).
        decode_threads: threads decoding different files / devices at once in a reading
            process; ``None``: up to 4 (the CPU count) with ``num_workers=0``, 1 inside
            DataLoader workers (the workers already use the cores).
        validate: check every file's metadata and first chunks in a child process when the
            dataset is built, so a file that crashes tsfile's native reader is a
            ``TsFileFormatError`` instead (see :mod:`tsfile_torch.validate`); ``False`` skips it
            for trusted data.
        check_statistics: cross-check every decoded block against the file's metadata
            statistics (see :mod:`tsfile_torch.integrity`).
    """

    columns: tuple[str, ...] | None = None
    batch_size: int = 8192
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    read_backend: str = "auto"
    dtype: str = "float32"
    random_batches: int | None = None
    cache: str = "none"
    cache_bytes: int | None = None
    block_rows: int = DEFAULT_BLOCK_ROWS
    return_timestamps: bool = False
    malloc_tuning: bool = True
    decode_threads: int | None = None
    validate: bool = True
    check_statistics: bool = True

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        cols = self.columns
        if isinstance(cols, str):
            cols = (cols,)
        if cols is not None:
            if not isinstance(cols, (list, tuple)) or not cols:
                raise ValueError(
                    f"columns must be None or a non-empty list of names / glob "
                    f"patterns; got {self.columns!r}"
                )
            for c in cols:
                if not isinstance(c, str):
                    raise TypeError(f"columns must hold str names or patterns; got {c!r}")
            cols = tuple(cols)
        set_("columns", cols)
        _positive_int("batch_size", self.batch_size)
        _bool("shuffle", self.shuffle)
        _bool("drop_last", self.drop_last)
        _bool("return_timestamps", self.return_timestamps)
        _bool("malloc_tuning", self.malloc_tuning)
        _bool("validate", self.validate)
        _bool("check_statistics", self.check_statistics)
        _positive_int("decode_threads", self.decode_threads, allow_none=True)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise TypeError(f"seed should be a non-negative integer, but got seed={self.seed!r}")
        set_("read_backend", parse_backend(self.read_backend))
        set_("dtype", _dtype_name(self.dtype))
        _positive_int("random_batches", self.random_batches, allow_none=True)
        check_random_batches("random_batches", self.random_batches)
        if self.cache not in CACHE_MODES:
            raise ValueError(
                f"cache must be one of {', '.join(map(repr, CACHE_MODES))}; got {self.cache!r}"
            )
        _positive_int("cache_bytes", self.cache_bytes, allow_none=True, allow_zero=True)
        _positive_int("block_rows", self.block_rows)
        if self.random_batches is not None and self.shuffle:
            raise ValueError(
                "random_batches draws random windows already; shuffle=True cannot "
                "be combined with it: leave shuffle=False"
            )

    def replace(self, **changes) -> DatasetOptions:
        """Return a copy with ``changes`` applied and validated."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return DatasetOptions(**values)
