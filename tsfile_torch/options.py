"""ReadOptions: what every dataset reads and how, in one frozen dataclass validated once.

The row datasets and the window dataset take these settings with the same names, defaults and
messages (Note: one options group); the CLI and the benchmarks build them the same way. This
module is the bottom of the package: it names the allowed values (backends, caches, alignments,
fills, normalizations, dtypes) and holds the argument checks every layer uses, and imports no
implementation.
"""

from __future__ import annotations

import datetime as _dt
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "ALIGN_MODES",
    "CACHE_MODES",
    "DEFAULT_CACHE_LIMIT",
    "DEFAULT_MAX_OPEN_FILES",
    "DTYPES",
    "DUPLICATE_MODES",
    "FILL_MODES",
    "NORMALIZE_METHODS",
    "ON_DAMAGED",
    "READ_BACKENDS",
    "TIME_UNITS",
    "ReadOptions",
    "check_bool",
    "check_int",
    "check_seed",
    "format_timestamp",
    "parse_backend",
    "to_timestamp",
    "user_cache_dir",
]

#: Read backends by name (see :mod:`tsfile_torch.native.backend`).
READ_BACKENDS = ("auto", "mmap", "pread")
#: ``none``: streaming; decoded blocks live in a bounded cache emptied at each epoch.
#: ``memory``: every row read is kept in the process across epochs (decode once).
#: ``disk``: every row read is kept in a memory-mapped file that every process and later run
#: shares (see :mod:`tsfile_torch.read.diskcache`).
CACHE_MODES = ("none", "memory", "disk")
#: How the rows of an aligned view are chosen; ``None`` means "one shared timeline".
ALIGN_MODES = ("union", "intersect")
#: What a series holds at an aligned row where it has no sample.
FILL_MODES = ("nan", "ffill", "zero")
#: What a timestamp stored in more than one file of a series gives (Note: merged shards in
#: :mod:`tsfile_torch.read.merge`): an error, or the earlier / later source's values.
DUPLICATE_MODES = ("error", "first", "last")
#: ``minmax`` maps [min, max] to [0, 1]; ``standard`` maps the mean to 0 and one std to 1.
NORMALIZE_METHODS = ("minmax", "standard")
#: Floating dtypes of the values handed out.
DTYPES = ("float16", "bfloat16", "float32", "float64")
#: What a dataset does with files that fail validation or their manifest when it is built:
#: ``raise`` a TsFileFormatError naming them, or ``skip`` them with one warning.
ON_DAMAGED = ("raise", "skip")
#: Units of int64 timestamps, for converting datetimes (TsFile's default is milliseconds).
TIME_UNITS = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}

#: Default bound of the local copies of URL sources: 100 GiB (LitData's ``max_cache_size``).
DEFAULT_CACHE_LIMIT = 100 * 2**30
#: TsFile readers kept open per process by default: far below the usual ``ulimit -n`` of 1024.
DEFAULT_MAX_OPEN_FILES = 128

_INT64 = (-(2**63), 2**63 - 1)


def user_cache_dir(*parts: str) -> str:
    """Return ``$XDG_CACHE_HOME/tsfile-torch/<parts>`` (``~/.cache`` when the variable is unset).

    Read when called, never at import: tests and users may point ``XDG_CACHE_HOME`` elsewhere.
    """
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tsfile-torch", *parts)


def check_int(
    name: str,
    value: Any,
    low: int = 1,
    high: int = _INT64[1],
    allow_none: bool = False,
) -> int | None:
    """Return ``value`` as an int in ``[low, high]`` (numpy integers too; ``bool`` refused).

    Raises:
        TypeError: not an integer. ValueError: outside the range, with the range in the message.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} should be an integer, but got {name}={value!r}")
    value = int(value)
    if not low <= value <= high:
        bound = f">= {low}" if high == _INT64[1] else f"in [{low}, {high}]"
        raise ValueError(f"{name} should be an integer {bound}, but got {name}={value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is True or False, else raise TypeError naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} should be True or False, but got {name}={value!r}")
    return value


def check_choice(name: str, value: Any, allowed, allow_none: bool = False) -> Any:
    """Return ``value`` if it is one of ``allowed`` (or None when allowed), else ValueError."""
    if (value is None and allow_none) or (isinstance(value, str) and value in allowed):
        return value
    shown = ", ".join(map(repr, allowed)) + (" or None" if allow_none else "")
    raise ValueError(f"{name} must be one of {shown}; got {value!r}")


def check_seed(value: Any) -> int:
    """Return ``value`` modulo 2**64, as ``torch.Generator.manual_seed`` takes any integer."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"seed should be an integer (any sign; it is taken modulo 2**64), "
            f"but got seed={value!r}"
        )
    return int(value) % (1 << 64)


def parse_backend(value: object) -> str:
    """Return the backend name for ``value``: a name in any case, or a ``tsfile.FileReadBackend``.

    Raises:
        ValueError: for anything else.
    """
    name = getattr(value, "name", value) if type(value).__name__ == "FileReadBackend" else value
    if isinstance(name, str) and name.lower() in READ_BACKENDS:
        return name.lower()
    raise ValueError(
        f"read_backend must be one of 'auto', 'mmap', 'pread' or a tsfile.FileReadBackend; "
        f"got {value!r}"
    )


def to_timestamp(name: str, value: Any, time_unit: str) -> int | None:
    """Return a time bound as an int64 timestamp in ``time_unit``.

    Accepts an integer, a ``datetime`` (naive = UTC), a ``pandas.Timestamp``, a
    ``numpy.datetime64`` or an ISO-8601 string; ``None`` stays None.
    """
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return check_int(name, value, *_INT64)
    per_second = TIME_UNITS[time_unit]
    if type(value).__name__ == "datetime64":
        value = int(value.astype(f"datetime64[{time_unit}]").astype("int64"))
        return check_int(name, value, *_INT64)
    if isinstance(value, str):
        try:
            value = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError as err:
            raise ValueError(
                f"{name}={value!r} is not an ISO-8601 date / time (e.g. '2024-01-31T12:00:00')"
            ) from err
    if isinstance(value, _dt.datetime):  # pandas.Timestamp is one too
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        delta = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
        micros = (delta.days * 86400 + delta.seconds) * 10**6 + delta.microseconds
        nanos = micros * 1000 + int(getattr(value, "nanosecond", 0))
        return check_int(name, nanos * per_second // 10**9, *_INT64)
    raise TypeError(
        f"{name} should be an integer timestamp, a datetime, a numpy.datetime64, an ISO-8601 "
        f"string or None; got {value!r}"
    )


def format_timestamp(value: int, time_unit: str = "ms") -> str:
    """Return an int64 timestamp in ``time_unit`` as an ISO-8601 UTC string.

    The inverse of :func:`to_timestamp` for display: ``format_timestamp(1000, "ms")`` is
    ``'1970-01-01T00:00:01.000Z'`` (as many fraction digits as the unit has).
    """
    import numpy as np

    check_choice("time_unit", time_unit, tuple(TIME_UNITS))
    return str(np.datetime_as_string(np.datetime64(int(value), time_unit), timezone="UTC"))


def _dtype_name(value: Any) -> str:
    name = str(value).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(
            f"dtype must be one of torch.float16, torch.bfloat16, torch.float32, "
            f"torch.float64; got {value!r}"
        )
    return name


@dataclass(frozen=True)
class ReadOptions:
    """What a dataset reads and how: shared by every dataset, the CLI and the benchmarks.

    Attributes:
        read_backend: ``"auto"``, ``"mmap"`` or ``"pread"`` (or a ``tsfile.FileReadBackend``),
            captured when each reader opens.
        dtype: torch floating dtype of the values (by name: ``"float32"``...).
        cache: ``"none"`` (streaming: a bounded block cache, emptied each epoch),
            ``"memory"`` (every row read kept in the process across epochs) or ``"disk"``
            (every row read kept in a memory-mapped file under ``cache_dir``, shared by
            workers, epochs and later runs; Note: decoded disk cache).
        cache_bytes: block-cache budget per process, for every kind of view (``None``: two
            blocks of every read group, at least 256 MiB, at most 1 GiB or a quarter of RAM).
        block_rows: rows decoded per native call and cache entry (``None``: 131,072 for rows,
            32,768 for windows).
        return_timestamps: add the int64 timestamps to each item.
        storage_options: fsspec filesystem arguments for URL sources (credentials, endpoint).
        cache_dir: where URL sources are copied before reading (``None``:
            ``~/.cache/tsfile-torch/remote``); ``cache="disk"`` keeps its entries in
            ``<cache_dir>/decoded`` (``None``: ``$XDG_CACHE_HOME/tsfile-torch/decoded``).
        cache_limit: bytes of URL copies kept in ``cache_dir``, and separately bytes of
            decoded entries kept (least recently used deleted first in each).
        start_time, end_time: first / last timestamp read (inclusive; ``None``: unbounded):
            an integer in ``time_unit``, a datetime (naive = UTC), a numpy.datetime64 or an
            ISO-8601 string. Pushed down to the reader: only rows in range are read.
        time_unit: unit of the files' timestamps, for converting datetimes (``"ms"``...).
        max_open_files: TsFile readers open at once per process (an LRU).
        index_cache: where timeline indexes are cached across processes and runs: ``True`` for
            ``$XDG_CACHE_HOME/tsfile-torch/index``, a directory path, or ``False`` for memory.
        align: ``None``: columns (of a device, for windows) must share one timeline;
            ``"union"`` / ``"intersect"``: rows are the union / intersection of timestamps.
        fill: what a missing value holds: ``"nan"``, ``"ffill"`` or ``"zero"``. With
            ``align``, a row where a series has no sample: its last earlier sample (NaN before
            the first) or 0. A null: 0, or the last value read earlier in the same batch (row
            datasets, Note: row fill in :mod:`tsfile_torch.data.rows`) or window (windows).
        duplicates: a timestamp stored in more than one file of a series (files that overlap
            in time are merged by timestamp: Note: merged shards in
            :mod:`tsfile_torch.read.merge`): ``"error"`` (a SchemaError naming the series,
            both files and the timestamp), ``"first"`` / ``"last"`` (the earlier / later
            source in the order given wins, cell by cell: a null never replaces a value).
        normalize: ``None``, ``"minmax"`` (metadata min / max), ``"standard"`` (mean / std: one
            pass when the dataset is built) or a ``Normalizer`` naming every column.
        validate: check every file's metadata and first chunks in a child process when the
            dataset is built, so a file that crashes tsfile's native reader is an error instead
            (once per file version: a file that passed is remembered by identity, and later
            builds skip it); ``"full"``: decode every series there too (what ``tsfile-torch
            verify`` does: the cost of one streaming epoch), which also finds a damaged later
            value chunk that would crash a ``num_workers=0`` reader.
        on_damaged: ``"raise"``: a file that fails validation or its manifest when the dataset
            is built is a TsFileFormatError; ``"skip"``: such files (and files an earlier read
            found damaged) are left out with one warning, and ``ds.skipped`` lists them with
            the reason. Damage found while reading raises either way.
        check_statistics: cross-check decoded blocks against the files' metadata statistics.
        malloc_tuning: keep glibc from returning decode buffers to the OS in reading processes
            (see :mod:`tsfile_torch.process`).
        decode_threads: threads decoding different files at once in a reading process;
            ``None``: the usable CPUs split among the reading processes, at most 4 each (up to
            4 with ``num_workers=0``; ``cpus // num_workers`` in each DataLoader worker, so 1
            on a machine with no more CPUs than workers; divided again by torchrun's
            ``LOCAL_WORLD_SIZE`` ranks on the machine).
    """

    read_backend: str = "auto"
    dtype: str = "float32"
    cache: str = "none"
    cache_bytes: int | None = None
    block_rows: int | None = None
    return_timestamps: bool = False
    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | None = None
    cache_limit: int = DEFAULT_CACHE_LIMIT
    start_time: Any = None
    end_time: Any = None
    time_unit: str = "ms"
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    index_cache: bool | str = True
    align: str | None = None
    fill: str = "nan"
    duplicates: str = "error"
    normalize: Any = None
    validate: bool | str = True
    on_damaged: str = "raise"
    check_statistics: bool = True
    malloc_tuning: bool = True
    decode_threads: int | None = None

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("read_backend", parse_backend(self.read_backend))
        set_("dtype", _dtype_name(self.dtype))
        check_choice("cache", self.cache, CACHE_MODES)
        set_("cache_bytes", check_int("cache_bytes", self.cache_bytes, 0, allow_none=True))
        set_("block_rows", check_int("block_rows", self.block_rows, 1, 2**40, allow_none=True))
        for name in ("return_timestamps", "check_statistics", "malloc_tuning"):
            check_bool(name, getattr(self, name))
        if not isinstance(self.validate, bool) and self.validate != "full":
            error = ValueError if isinstance(self.validate, str) else TypeError
            raise error(
                f"validate should be True, False or 'full', but got validate={self.validate!r}"
            )
        if self.storage_options is not None and not isinstance(self.storage_options, Mapping):
            raise TypeError(
                f"storage_options must be a dict of fsspec filesystem arguments or None; got "
                f"{self.storage_options!r}"
            )
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)):
                raise TypeError(f"cache_dir must be a path or None; got {self.cache_dir!r}")
            set_("cache_dir", os.fspath(self.cache_dir))
        set_("cache_limit", check_int("cache_limit", self.cache_limit, 1))
        check_choice("time_unit", self.time_unit, tuple(TIME_UNITS))
        for name in ("start_time", "end_time"):
            set_(name, to_timestamp(name, getattr(self, name), self.time_unit))
        if None not in (self.start_time, self.end_time) and self.start_time > self.end_time:
            raise ValueError(
                f"start_time must not be after end_time; got start_time={self.start_time}, "
                f"end_time={self.end_time}"
            )
        set_("max_open_files", check_int("max_open_files", self.max_open_files, 1))
        if not isinstance(self.index_cache, (bool, str, os.PathLike)):
            raise TypeError(
                f"index_cache should be True, False or a directory path, got {self.index_cache!r}"
            )
        if isinstance(self.index_cache, os.PathLike):
            set_("index_cache", os.fspath(self.index_cache))
        check_choice("on_damaged", self.on_damaged, ON_DAMAGED)
        check_choice("align", self.align, ALIGN_MODES, allow_none=True)
        check_choice("fill", self.fill, FILL_MODES)
        check_choice("duplicates", self.duplicates, DUPLICATE_MODES)
        if not (
            self.normalize is None
            or (isinstance(self.normalize, str) and self.normalize in NORMALIZE_METHODS)
            or (callable(self.normalize) and hasattr(self.normalize, "inverse"))
        ):
            raise ValueError(
                f"normalize must be None, 'minmax', 'standard' or a Normalizer; "
                f"got {self.normalize!r}"
            )
        set_("decode_threads", check_int("decode_threads", self.decode_threads, allow_none=True))

    @property
    def index_dir(self) -> str | None:
        """Directory of the timeline-index cache, or ``None`` when disabled."""
        if self.index_cache is True:
            return user_cache_dir("index")
        return self.index_cache or None

    @property
    def itemsize(self) -> int:
        """Bytes per value as decoded (float64 for ``float64``, float32 otherwise)."""
        return 8 if self.dtype == "float64" else 4

    def replace(self, **changes) -> ReadOptions:
        """Return a copy with ``changes`` applied and validated."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ReadOptions(**values)

    @classmethod
    def split(cls, kwargs: dict[str, Any]) -> tuple[ReadOptions, dict[str, Any]]:
        """Return ReadOptions built from the keys of ``kwargs`` it knows, and the other keys."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in kwargs.items() if k in names}), {
            k: v for k, v in kwargs.items() if k not in names
        }
