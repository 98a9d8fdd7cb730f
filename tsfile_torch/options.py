"""DatasetOptions: every dataset setting in one frozen dataclass, validated once.

Datasets, the CLI and the benchmarks build their settings through :class:`DatasetOptions`, so an
argument is checked in one place with one message.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from tsfile_torch.data.normalize import NORMALIZE_METHODS, Normalizer
from tsfile_torch.native.backend import parse_backend
from tsfile_torch.read.align import check_align
from tsfile_torch.read.openfiles import DEFAULT_MAX_OPEN_FILES
from tsfile_torch.read.reader import DEFAULT_BLOCK_ROWS
from tsfile_torch.read.timeline import default_index_dir
from tsfile_torch.sources.remote import DEFAULT_CACHE_LIMIT, RemoteOptions

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


def _seed(value: Any) -> int:
    """Return ``value`` modulo 2**64, as ``torch.Generator.manual_seed`` takes any integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(
            f"seed should be an integer (any sign; it is taken modulo 2**64), "
            f"but got seed={value!r}"
        )
    return int(value) % (1 << 64)


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
        seed: seed of every random choice: any integer, kept modulo 2**64 (``-1`` is stored
            as ``2**64 - 1``, as ``torch.Generator.manual_seed`` does).
        drop_last: leave out the last, shorter batch.
        read_backend: ``"auto"``, ``"mmap"`` or ``"pread"``.
        dtype: name of the torch floating dtype of batches (``"float32"``...).
        random_batches: if set, each epoch is this many windows of ``batch_size`` rows starting
            at uniformly random rows, instead of a pass over the rows.
        cache: one of :data:`CACHE_MODES`.
        cache_bytes: block-cache budget per process for ``cache="none"`` (``None``: default).
        block_rows: rows decoded per native call.
        return_timestamps: yield ``(values, timestamps)`` instead of ``values``.
        malloc_tuning: apply :func:`tsfile_torch.read.reader.tune_malloc` in each reading process
            (glibc only; keeps decode buffers mapped between queries: faster, may hold up to
            1 GiB of freed heap).
        decode_threads: threads decoding different files / devices at once in a reading
            process; ``None``: up to 4 (the CPU count) with ``num_workers=0``, 1 inside
            DataLoader workers (the workers already use the cores).
        storage_options: fsspec filesystem arguments for URL sources (credentials, endpoint).
        cache_dir: where URL sources are copied before reading (``None``:
            ``~/.cache/tsfile-torch/remote``); see :mod:`tsfile_torch.sources.remote`.
        cache_limit: bytes of copies kept in ``cache_dir`` (least recently used deleted first).
        start_time: first timestamp to read (inclusive, tsfile's convention); ``None``: from
            the start. Pushed down to the reader: only rows in range are read.
        end_time: last timestamp to read (inclusive); ``None``: to the end.
        max_open_files: TsFile readers open at once per process (an LRU; closed mmap readers
            unmap their file).
        index_cache: where timeline indexes are cached across processes and runs: ``True`` for
            ``~/.cache/tsfile-torch/index``, a directory path, or ``False`` for memory only.
        align: ``None``: every column must share one timeline; ``"union"`` / ``"intersect"``:
            rows are the union / intersection of the columns' timestamps (see
            :mod:`tsfile_torch.read.aligned`).
        fill: with ``align``, what a column holds at a row where it has no sample: ``"nan"``,
            ``"ffill"`` (last earlier sample, NaN before the first) or ``"zero"``.
        normalize: ``None``, ``"minmax"`` (metadata min / max), ``"standard"`` (mean / std:
            one pass over the data when the dataset is built) or a
            :class:`~tsfile_torch.data.normalize.Normalizer` naming every column.
        validate: check every file's metadata and first chunks in a child process when the
            dataset is built, so a file that crashes tsfile's native reader is a
            ``TsFileFormatError`` instead (see :mod:`tsfile_torch.integrity.validate`);
            ``False`` skips it for trusted data.
        check_statistics: cross-check every decoded block against the file's metadata
            statistics (see :mod:`tsfile_torch.integrity.checks`).
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
    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    cache_limit: int = DEFAULT_CACHE_LIMIT
    start_time: int | None = None
    end_time: int | None = None
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    index_cache: bool | str = True
    align: str | None = None
    fill: str = "nan"
    normalize: str | Normalizer | None = None
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
        set_("seed", _seed(self.seed))
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
        self.remote  # noqa: B018 (validates storage_options, cache_dir, cache_limit)
        for name in ("start_time", "end_time"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} should be an integer timestamp or None, got {value!r}")
        if (
            self.start_time is not None
            and self.end_time is not None
            and self.start_time > self.end_time
        ):
            raise ValueError(
                f"start_time must not be after end_time; got start_time={self.start_time}, "
                f"end_time={self.end_time}"
            )
        _positive_int("max_open_files", self.max_open_files)
        if not isinstance(self.index_cache, (bool, str)):
            raise TypeError(
                f"index_cache should be True, False or a directory path, got {self.index_cache!r}"
            )
        check_align(self.align, self.fill)
        if not (
            self.normalize is None
            or isinstance(self.normalize, Normalizer)
            or self.normalize in NORMALIZE_METHODS
        ):
            raise ValueError(
                f"normalize must be None, 'minmax', 'standard' or a Normalizer; "
                f"got {self.normalize!r}"
            )
        if self.random_batches is not None and self.shuffle:
            raise ValueError(
                "random_batches draws random windows already; shuffle=True cannot "
                "be combined with it: leave shuffle=False"
            )

    @property
    def remote(self) -> RemoteOptions:
        """The settings of URL sources, validated."""
        return RemoteOptions(self.storage_options, self.cache_dir, self.cache_limit)

    @property
    def index_dir(self) -> str | None:
        """Directory of the timeline-index cache, or ``None`` when disabled."""
        if self.index_cache is True:
            return default_index_dir()
        return self.index_cache or None

    def replace(self, **changes) -> DatasetOptions:
        """Return a copy with ``changes`` applied and validated."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return DatasetOptions(**values)
