"""The decoded disk cache (``cache="disk"``): the MemoryStore's arrays in memory-mapped files.

Note: decoded disk cache. ``cache="disk"`` is :class:`~tsfile_torch.read.memory.MemoryStore`
with its three arrays (values, timestamps, a per-row ``filled`` flag) backed by one file instead
of anonymous memory, so every process that opens the same entry (DataLoader workers, later
epochs, later runs, other jobs on the machine) shares one decoded copy through the page cache.

- **Where**: ``<cache_dir>/decoded/`` when ``cache_dir`` is given, else
  ``$XDG_CACHE_HOME/tsfile-torch/decoded`` (``~/.cache/tsfile-torch/decoded``); the local copies
  of URL sources live beside it (``cache_dir`` itself, or ``~/.cache/tsfile-torch/remote``).
  Files: ``<digest>.tsc`` (an entry), ``<digest>.lock`` (its creation lock), ``.cache.lock``.
- **Key**: the SHA-256 of everything that shapes the values (:func:`fingerprint`): each
  source's ``index_key()`` (path, size, mtime, ctime, inode, device; URL, ETag and size), the
  columns, the tables' layout, the stored dtype, the time range, alignment and fill, and the
  normalization numbers. A file rewritten in place changes its ctime (and a replaced one its
  inode), whatever was done to its mtime, so it gets a new entry; the old one ages out.
- **Entry**: a header (magic, JSON: shape, dtype, boot id; the key), then the ``filled``
  bytes, the int64 timestamps and the values ``(rows, columns)``, each page aligned. Created
  once under an ``fcntl`` lock on ``<digest>.lock``, at full size with ``posix_fallocate`` (so a
  full disk is an error at creation, never a SIGBUS while writing a page), written to
  ``<digest>.tsc.part.<pid>`` and published with ``os.replace``.
- **Filling**: whichever process reads rows first writes them into the mapping, then sets their
  ``filled`` flags, with a memory fence between (:meth:`MemoryStore.put`); readers trust set
  flags only, so a half-written block is never served. Two processes filling the same rows at
  once write the same bytes. After a reboot an entry is started afresh (its header's boot id
  differs): data pages and flag pages reach the disk in no fixed order, so a crash could have
  kept flags without their data.
- **Bound**: before an entry is created, the least recently used entries (by mtime: an open
  touches it) are deleted until it fits in ``cache_limit`` bytes (the same number bounds the
  remote copies, separately, with the same eviction:
  :func:`~tsfile_torch.sources.cachedir.make_room`). An entry larger than the bound is not
  created. Deleting an entry that a process has mapped is safe: its pages live until unmapped.
- **Fallback**: a cache directory that cannot be written, a full disk or an entry that cannot
  be created make the dataset decode as with ``cache="none"``, with one warning per process
  and directory; a damaged entry (bad header, wrong size) is deleted and created again. A
  read-only directory still serves the rows an existing entry holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import mmap
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tsfile_torch.errors import warn_caller
from tsfile_torch.options import user_cache_dir
from tsfile_torch.read.memory import MemoryStore
from tsfile_torch.sources.cachedir import file_lock, make_room

__all__ = ["CacheEntry", "clear", "decoded_dir", "entries", "fingerprint", "open_store"]

logger = logging.getLogger(__name__)

_MAGIC = b"TSFTDC01"
_PAGE = 4096
_SUFFIX = ".tsc"
_warned: set[str] = set()


def decoded_dir(cache_dir: str | None = None) -> str:
    """Return the decoded cache's directory for a dataset's ``cache_dir`` (see the module note)."""
    return os.path.join(cache_dir, "decoded") if cache_dir else user_cache_dir("decoded")


def fingerprint(parts: dict) -> str:
    """Return the key text of an entry: ``parts`` as canonical JSON (``repr`` for the rest)."""
    return json.dumps(parts, sort_keys=True, default=repr)


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _round(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


def _layout(head: int, rows: int, columns: int, itemsize: int) -> tuple[int, int, int, int]:
    """Return (filled offset, times offset, values offset, file size) of an entry."""
    times = head + _round(rows)
    values = times + _round(rows * 8)
    return head, times, values, values + _round(rows * columns * itemsize)


class _Damaged(Exception):
    """An entry whose header or size does not match what is expected of it."""


def _header(fd: int) -> tuple[dict, bytes, int]:
    """Return (metadata, key, header bytes) of an entry: magic, two lengths, JSON, key."""
    raw = os.pread(fd, 16, 0)
    if len(raw) < 16 or not raw.startswith(_MAGIC):
        raise _Damaged("bad header")
    meta_len, key_len = struct.unpack("<II", raw[8:16])
    body = os.pread(fd, meta_len + key_len, 16) if meta_len + key_len < 1 << 28 else b""
    if len(body) != meta_len + key_len:
        raise _Damaged("bad header (truncated?)")
    try:
        meta = json.loads(body[:meta_len])
    except ValueError as err:
        raise _Damaged(f"bad header ({err})") from err
    return meta, body[meta_len:], _round(16 + meta_len + key_len)


def _check(fd: int, key: str, rows: int, columns: int, dtype: np.dtype) -> int:
    """Return the header bytes of a valid entry of ``key``; raise _Damaged otherwise."""
    meta, stored, head = _header(fd)
    expected = (key.encode(), rows, columns, dtype.str)
    if (stored, meta.get("rows"), meta.get("columns"), meta.get("dtype")) != expected:
        raise _Damaged("header of another entry")
    if os.fstat(fd).st_size != _layout(head, rows, columns, dtype.itemsize)[3]:
        raise _Damaged("wrong size (truncated?)")
    if meta.get("boot") != _boot_id():
        raise _Damaged("written before the last reboot")
    return head


def _warn_once(directory: str, text: str, quiet: bool = False) -> None:
    if quiet or directory in _warned:
        logger.info("%s", text)
        return
    _warned.add(directory)
    warn_caller(text)


def _make_room(directory: str, need: int, limit: int, keep: str) -> None:
    """Delete least recently used entries (but ``keep``) until ``need`` more bytes fit."""
    found = [(e.last_used, e.nbytes, e.path) for e in entries(directory) if e.path != keep]
    make_room(found, need, limit, what="decoded cache")


def _create(path: str, key: str, rows: int, columns: int, dtype: np.dtype) -> None:
    meta = json.dumps(
        {
            "rows": rows,
            "columns": columns,
            "dtype": dtype.str,
            "boot": _boot_id(),
            "created": time.time(),
        }
    ).encode()
    raw_key = key.encode()
    head = _MAGIC + struct.pack("<II", len(meta), len(raw_key)) + meta + raw_key
    size = _layout(_round(len(head)), rows, columns, dtype.itemsize)[3]
    part = f"{path}.part.{os.getpid()}"
    fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)  # space reserved now: no SIGBUS on a full disk later
        os.pwrite(fd, head, 0)
        os.close(fd)
        fd = -1
        os.replace(part, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise


def _map(path: str, rows: int, columns: int, dtype: np.dtype, writable: bool, key: str):
    """Return (mmap, values, times, filled) of a valid entry; raise _Damaged or OSError."""
    fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    try:
        head = _check(fd, key, rows, columns, dtype)
        filled_at, times_at, values_at, size = _layout(head, rows, columns, dtype.itemsize)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.utime(path)  # last use, for least-recently-used eviction
    buf = memoryview(mapped)
    values = np.frombuffer(buf, dtype, rows * columns, values_at).reshape(rows, columns)
    times = np.frombuffer(buf, np.int64, rows, times_at)
    filled = np.frombuffer(buf, np.bool_, rows, filled_at)
    return mapped, values, times, filled


def open_store(
    sizes: Sequence[int],
    num_columns: int,
    dtype,
    key: str | None,
    cache_dir: str | None,
    cache_limit: int,
    quiet: bool = False,
) -> MemoryStore | None:
    """Return a :class:`MemoryStore` over the entry of ``key``, created if needed.

    ``None`` (after one warning per process and directory, logged only with ``quiet``: a
    DataLoader worker, whose dataset warned when it was built) when the entry cannot be used:
    the caller decodes instead (see the module note: fallback).
    """
    directory = decoded_dir(cache_dir)
    dtype = np.dtype(dtype)
    rows = int(sum(sizes))
    if key is None:
        _warn_once(
            directory,
            'cache="disk" needs sources with an identity on disk (paths or URLs); file objects '
            "have none: decoding every epoch instead (use a path, or cache='memory')",
            quiet,
        )
        return None
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    path = os.path.join(directory, digest + _SUFFIX)
    size = _layout(_round(len(key) + 512), rows, num_columns, dtype.itemsize)[3]
    if size > cache_limit:
        _warn_once(
            directory,
            f'cache="disk": the decoded data needs {size / 2**20:.0f} MiB, more than '
            f"cache_limit={cache_limit}: decoding every epoch instead; raise cache_limit",
            quiet,
        )
        return None
    try:
        os.makedirs(directory, exist_ok=True)
        with file_lock(os.path.join(directory, digest + ".lock")):
            try:
                arrays = _map(path, rows, num_columns, dtype, True, key)
            except (_Damaged, FileNotFoundError) as why:
                if not isinstance(why, FileNotFoundError):
                    logger.warning("decoded cache entry %s: %s; creating it again", path, why)
                with file_lock(os.path.join(directory, ".cache.lock")):
                    _make_room(directory, size, cache_limit, path)
                    _create(path, key, rows, num_columns, dtype)
                arrays = _map(path, rows, num_columns, dtype, True, key)
        writable = True
    except (OSError, _Damaged) as err:  # _Damaged: an entry just created reads back wrong
        arrays = _read_only(path, rows, num_columns, dtype, key)
        writable = False
        kept = "reading the rows it holds, " if arrays else ""
        _warn_once(
            directory,
            f'cache="disk": cannot write the decoded cache in {directory!r} ({err}); '
            f"{kept}decoding the rest every epoch; free space, or pass a writable cache_dir",
            quiet,
        )
        if arrays is None:
            return None
    mapped, values, times, filled = arrays
    return MemoryStore(sizes, num_columns, dtype, (values, times, filled), mapped, writable)


def _read_only(path, rows, columns, dtype, key):
    try:
        return _map(path, rows, columns, dtype, False, key)
    except (_Damaged, OSError):
        return None


@dataclass(frozen=True)
class CacheEntry:
    """One entry of the decoded cache, as ``tsfile-torch cache info`` shows it."""

    path: str
    nbytes: int
    last_used: float
    rows: int | None
    columns: int | None
    filled_rows: int | None
    sources: list[str] | None


def entries(directory: str, details: bool = False) -> list[CacheEntry]:
    """Return the entries in ``directory`` (with ``details``: shape, rows filled, sources)."""
    out = []
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    for name in names:
        if not name.endswith(_SUFFIX):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        rows = columns = filled = sources = None
        if details:
            rows, columns, filled, sources = _describe(path)
        out.append(CacheEntry(path, st.st_size, st.st_mtime, rows, columns, filled, sources))
    return out


def _describe(path: str):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None, None, None, None
    try:
        meta, key, head = _header(fd)
        rows, columns = int(meta["rows"]), int(meta["columns"])
        flags = np.frombuffer(os.pread(fd, rows, head), np.bool_)
        key = json.loads(key)
        return rows, columns, int(flags.sum()), list(key.get("names", []))
    except (_Damaged, KeyError, TypeError, ValueError, OSError):
        return None, None, None, None
    finally:
        os.close(fd)


def clear(directory: str) -> tuple[int, int]:
    """Delete every entry (and leftover part / lock file) in ``directory``: (entries, bytes)."""
    count = nbytes = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0, 0
    for name in names:
        if not (name.endswith((_SUFFIX, ".lock")) or f"{_SUFFIX}.part." in name):
            continue
        path = os.path.join(directory, name)
        with contextlib.suppress(FileNotFoundError):
            size = os.stat(path).st_size
            os.unlink(path)
            if name.endswith(_SUFFIX):
                count, nbytes = count + 1, nbytes + size
    return count, nbytes
