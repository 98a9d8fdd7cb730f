"""The decoded disk cache (``cache="disk"``): the MemoryStore's arrays in memory-mapped files.

Note: decoded disk cache. ``cache="disk"`` is :class:`~tsfile_torch.read.memory.MemoryStore`
with its three arrays (values, timestamps, a per-row ``filled`` flag) backed by one file instead
of anonymous memory, so every process that opens the same entry (DataLoader workers, later
epochs, later runs, other jobs on the machine) shares one decoded copy through the page cache.

- **Where**: ``<cache_dir>/decoded/`` when ``cache_dir`` is given, else
  ``$XDG_CACHE_HOME/tsfile-torch/decoded`` (``~/.cache/tsfile-torch/decoded``); the local copies
  of URL sources live beside it (``cache_dir`` itself, or ``~/.cache/tsfile-torch/remote``).
  Files: ``<digest>.tsc`` (an entry), ``<digest>.lock`` (its creation lock), ``.cache.lock``,
  the key that seals its blocks. The directory is private (0700, files 0600) or a group share
  the user made on purpose; any other is refused (Note: private caches in
  :mod:`tsfile_torch.sources.cachedir`).
- **Key**: the SHA-256 of everything that shapes the values (:func:`fingerprint`): each
  source's ``index_key()`` (path, size, mtime, ctime, inode, device; URL, ETag and size), the
  columns, the tables' layout, the stored dtype, the time range, alignment and fill, and the
  normalization numbers. A file rewritten in place changes its ctime (and a replaced one its
  inode), whatever was done to its mtime, so it gets a new entry; the old one ages out.
- **Entry**: a header (magic, JSON: shape, dtype, ``check_rows``, boot id, the id of the key
  that seals it; the key text), then the ``filled`` bytes, one seal word per checked block, the
  int64 timestamps and the values ``(rows, columns)``, each page aligned. Created once under an
  ``fcntl`` lock on ``<digest>.lock``, at full size with ``posix_fallocate`` (so a full disk is
  an error at creation, never a SIGBUS while writing a page; where it is missing, macOS, the
  file is sized with ``ftruncate`` and a full disk shows as SIGBUS when a page is written),
  written to ``<digest>.tsc.part.<pid>`` (``O_EXCL | O_NOFOLLOW``) and published with
  ``os.replace``. A part file left by a creator killed before publishing is
  counted in ``cache_limit`` while its lock is held and deleted once it is free (Note: part
  files, :func:`sweep_parts`).
- **Filling**: whichever process reads rows first writes them into the mapping, then sets their
  ``filled`` flags, with a memory fence between (:meth:`MemoryStore.put`), then seals each block
  the put left complete. Two processes filling the same rows at once write the same bytes (and
  the same seal). After a reboot an entry is started afresh (its header's boot id differs): data
  pages and flag pages reach the disk in no fixed order, so a crash could have kept flags
  without their data.
- **Checks** (Note: checked blocks, :class:`BlockSeals`): rows are served only from sealed blocks
  (``check_rows`` = :data:`CHECK_ROWS` rows of one table): a block passes the statistics checks
  fresh decodes get (timestamps increasing and inside the series' range, values inside [min, max]:
  :class:`~tsfile_torch.integrity.checks.KeptRowsCheck`) before it is sealed with an HMAC-SHA256 of
  its values, timestamps and flags (with the entry's key and the block number) under the directory's
  secret, and each process verifies that seal once per block before serving it: who cannot read the
  secret cannot seal rows of their own. A mismatch warns once per process and entry
  (:class:`~tsfile_torch.errors.CacheMismatchWarning`, naming the entry file) and the block is
  decoded from the TsFile again and rewritten. Cost: one HMAC-SHA256 pass per block and process (the
  statistics once per block, when it is sealed); nothing in later epochs of a process
  (benchmarks/RESULTS.md, "Keyed cache seals (issue #42, 2026-12-06)"). What it cannot catch: with
  ``check_statistics=False``, a ``filled`` flag set on rows never written, in a block that a later
  put completes, is sealed over what those rows hold.
- **Bound**: before an entry is created, the least recently used entries (by mtime: an open
  touches it) are deleted until it fits in ``cache_limit`` bytes (the same number bounds the
  remote copies, separately, with the same eviction:
  :func:`~tsfile_torch.sources.cachedir.make_room`). An entry larger than the bound is not
  created. Deleting an entry that a process has mapped is safe: its pages live until unmapped.
- **Fallback**: a cache directory that cannot be written, a full disk or an entry that cannot
  be created make the dataset decode as with ``cache="none"``, with one warning per process
  and directory; a damaged entry (bad header, a header naming another key, wrong size) is
  deleted and created again. A read-only directory still serves the sealed blocks an existing
  entry holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import mmap
import os
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tsfile_torch.errors import CacheMismatchWarning, warn_caller
from tsfile_torch.options import user_cache_dir
from tsfile_torch.read.memory import MemoryStore, fence
from tsfile_torch.sources.cachedir import (
    CacheDir,
    create_file,
    file_lock,
    key_id,
    make_room,
    private_dir,
    secret,
)

__all__ = [
    "CHECK_ROWS",
    "BlockSeals",
    "CacheEntry",
    "block_starts",
    "clear",
    "decoded_dir",
    "entries",
    "fingerprint",
    "open_store",
    "sweep_parts",
]

logger = logging.getLogger(__name__)

_MAGIC = b"TSFTDC03"
_PAGE = 4096
_SUFFIX = ".tsc"
#: Rows per checked block (Note: checked blocks) when the reader decodes more at once.
CHECK_ROWS = 8192
#: What a block's seal covers besides its bytes: whether the statistics checks passed before
#: it was sealed (or, unchecked, by a process with ``check_statistics=False``).
_CHECKED, _UNCHECKED = b"\x01", b"\x00"
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


def block_starts(sizes: Sequence[int], check_rows: int) -> np.ndarray:
    """Return the first store row of every checked block: each table's rows in ``check_rows``
    steps (a table's last block may be short; a block never spans two tables)."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    starts = [np.arange(offsets[k], offsets[k + 1], check_rows) for k in range(len(sizes))]
    return np.concatenate([*starts, offsets[-1:]]).astype(np.int64)  # + the end


def _layout(
    head: int, rows: int, columns: int, itemsize: int, blocks: int
) -> tuple[int, int, int, int, int]:
    """Return (filled, seals, times, values offsets, file size) of an entry."""
    seals = head + _round(rows)
    times = seals + _round(blocks * 8)
    values = times + _round(rows * 8)
    return head, seals, times, values, values + _round(rows * columns * itemsize)


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


def _check(fd: int, key: str, sizes: Sequence[int], columns: int, dtype: np.dtype, sealer: str):
    """Return (header bytes, block starts) of a valid entry of ``key`` sealed by the key named
    ``sealer``; raise _Damaged if not."""
    meta, stored, head = _header(fd)
    expected = (key.encode(), int(sum(sizes)), columns, dtype.str)
    if (stored, meta.get("rows"), meta.get("columns"), meta.get("dtype")) != expected:
        raise _Damaged("header of another entry")
    if meta.get("sealer") != sealer:
        raise _Damaged("sealed with another cache key (its key file was made anew)")
    check_rows = meta.get("check_rows")
    if not isinstance(check_rows, int) or check_rows <= 0:
        raise _Damaged("bad header (no check_rows)")
    starts = block_starts(sizes, check_rows)
    size = _layout(head, expected[1], columns, dtype.itemsize, len(starts) - 1)[4]
    if os.fstat(fd).st_size != size:
        raise _Damaged("wrong size (truncated?)")
    if meta.get("boot") != _boot_id():
        raise _Damaged("written before the last reboot")
    return head, starts


def _warn_once(directory: str, text: str, quiet: bool = False) -> None:
    if quiet or directory in _warned:
        logger.info("%s", text)
        return
    _warned.add(directory)
    warn_caller(text)


def _make_room(directory: str, need: int, limit: int, keep: str) -> None:
    """Delete least recently used entries (but ``keep``) until ``need`` more bytes fit.

    Part files being written count (they reserved their size) and stay; stale ones are
    deleted first (Note: part files).
    """
    held = os.path.basename(keep)[: -len(_SUFFIX)]
    found = [(e.last_used, e.nbytes, e.path) for e in entries(directory) if e.path != keep]
    found += sweep_parts(directory, held)
    make_room(found, need, limit, keep=_is_part, what="decoded cache")


def _is_part(path: str) -> bool:
    return f"{_SUFFIX}.part." in os.path.basename(path)


def sweep_parts(directory: str, held: str | None = None) -> list[tuple[float, int, str]]:
    """Delete the part files no process is writing; return ``(mtime, bytes, path)`` of the rest.

    Note: part files. An entry is written to ``<digest>.tsc.part.<pid>`` while its creator
    holds ``<digest>.lock``: a part whose lock is free was left by a creator that died between
    allocating and publishing (the kernel dropped its lock), and is deleted here, under that
    lock. The lock, not the pid, decides: a pid may have been reused. ``held``: the digest
    whose lock this process holds (its parts from other pids are stale, none is its own yet).
    """
    out = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    for name in names:
        if not _is_part(name):
            continue
        path = os.path.join(directory, name)
        digest = name.split(".", 1)[0]
        if digest == held:
            stale = not name.endswith(f".part.{os.getpid()}")
            lock = contextlib.nullcontext(True)
        else:
            stale, lock = True, file_lock(os.path.join(directory, digest + ".lock"), False)
        try:
            with lock as free:
                if stale and free:
                    os.unlink(path)
                    logger.info("decoded cache: deleted %s, left by a killed fill", path)
                    continue
        except FileNotFoundError:
            continue
        except OSError as err:  # a read-only directory: counted, left for a writable run
            logger.info("decoded cache: cannot check %s (%s)", path, err)
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(path)
            out.append((st.st_mtime, st.st_size, path))
    return out


def _reserve(fd: int, size: int) -> None:
    """Give ``fd`` ``size`` bytes: allocated where ``posix_fallocate`` exists (a full disk is an
    error now, never a SIGBUS later), else (macOS) sized with ``ftruncate``."""
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is None:
        os.ftruncate(fd, size)
    else:
        allocate(fd, 0, size)


def _create(
    path: str, key: str, sizes, columns: int, dtype: np.dtype, where: CacheDir, sealer: str
):
    rows = int(sum(sizes))
    meta = json.dumps(
        {
            "rows": rows,
            "columns": columns,
            "dtype": dtype.str,
            "check_rows": CHECK_ROWS,
            "boot": _boot_id(),
            "sealer": sealer,
            "created": time.time(),
        }
    ).encode()
    raw_key = key.encode()
    head = _MAGIC + struct.pack("<II", len(meta), len(raw_key)) + meta + raw_key
    blocks = len(block_starts(sizes, CHECK_ROWS)) - 1
    size = _layout(_round(len(head)), rows, columns, dtype.itemsize, blocks)[4]
    part = f"{path}.part.{os.getpid()}"
    fd = create_file(part, where.file_mode)  # under the entry's lock: the name is ours
    try:
        _reserve(fd, size)  # space reserved now: no SIGBUS on a full disk later
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


def _map(path: str, sizes, columns: int, dtype: np.dtype, writable: bool, key: str, sealer: str):
    """Return (mmap, (values, times, filled), seals, block starts) of a valid entry; raise
    _Damaged or OSError."""
    rows = int(sum(sizes))
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if os.path.islink(path):  # never followed: made again in its place
            raise _Damaged("a symbolic link, not an entry") from err
        raise
    try:
        head, starts = _check(fd, key, sizes, columns, dtype, sealer)
        blocks = len(starts) - 1
        filled_at, seals_at, times_at, values_at, size = _layout(
            head, rows, columns, dtype.itemsize, blocks
        )
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        with contextlib.suppress(OSError, NotImplementedError):
            os.utime(fd if os.utime in os.supports_fd else path)  # last use, for eviction
    finally:
        os.close(fd)
    buf = memoryview(mapped)
    values = np.frombuffer(buf, dtype, rows * columns, values_at).reshape(rows, columns)
    times = np.frombuffer(buf, np.int64, rows, times_at)
    filled = np.frombuffer(buf, np.bool_, rows, filled_at)
    seals = np.frombuffer(buf, np.uint64, blocks, seals_at)
    return mapped, (values, times, filled), seals, starts


#: ``check(table, start, times, values)`` -> what is wrong with rows kept from ``start`` on
#: (None: nothing): the statistics checks of decoded blocks, for kept ones (Note: checked blocks)
BlockCheck = Callable[[int, int, np.ndarray, np.ndarray], "str | None"]


class BlockSeals:
    """Note: checked blocks. The seals of an entry's blocks, and which ones this process has
    verified.

    An entry's rows are checked in blocks: each table's rows in steps of the header's
    ``check_rows`` (:data:`CHECK_ROWS`, so a batch of the reference workload is one block; a
    table shorter than that is one block). Each block has a seal word in the entry: the first
    8 bytes of the HMAC-SHA256, under the cache directory's secret (Note: private caches in
    :mod:`tsfile_torch.sources.cachedir`), of the entry's key, the block's number, whether the
    block passed the statistics checks, and its values, timestamps and ``filled`` bytes (so a
    block of another entry, from another place, or sealed by someone without the secret, does
    not match). Zero: not sealed.

    - **Sealing**: a process whose :meth:`MemoryStore.put_rows` leaves every row of a block
      filled checks the block (``check``: the statistics checks of decoded blocks), computes
      its seal and writes the word after the data and flags it covers (one aligned 8-byte
      store). Two processes completing a block at once see the same bytes and write the same
      word.
    - **Serving**: a row is served only from a sealed block whose seal this process verified
      (once per process and block, remembered: later reads test one flag). The seal proves the
      bytes are those a holder of the secret checked, so the statistics checks run again only
      on a block sealed unchecked (by a process with ``check_statistics=False``). Flags without
      a seal are never trusted: those rows are decoded again (and a complete block is then
      sealed).
    - **Mismatch**: a seal or a check that fails is one warning per process and entry naming
      the entry file and what was wrong; the block's seal and flags are cleared, so its rows
      are decoded from the TsFile again and rewritten (a read-only entry: decoded every time
      in this process). A TsFile that really is damaged then fails its own decode, naming it.
    """

    def __init__(self, path, key: str, seals, starts, arrays, writable, check=None, secret=b""):
        self.path = path
        self.seals = seals
        self.starts = starts
        self.values, self.times, self.filled = arrays
        self.writable = writable
        self.check = check
        self._mac = hmac.new(secret, hashlib.sha256(key.encode()).digest(), hashlib.sha256)
        self._ok = np.zeros(len(seals), dtype=bool)  # verified in this process
        self._num_ok = 0  # == len(seals): every block verified, reads skip the lookup
        self._bad = np.zeros(len(seals), dtype=bool)  # mismatched, cannot be cleared
        self._warned = False
        self.table_starts: np.ndarray | None = None  # set by the store: its tables' offsets

    def blocks(self, lo: int, hi: int) -> tuple[int, int]:
        """Return the blocks ``[b0, b1)`` holding store rows ``[lo, hi)``."""
        b0 = int(np.searchsorted(self.starts, lo, side="right")) - 1
        return b0, int(np.searchsorted(self.starts, hi, side="left"))

    def ready(self, b0: int, b1: int) -> bool:
        """Return True if blocks ``[b0, b1)`` are sealed and verified (verifying them now)."""
        if self._num_ok == len(self._ok):
            return True
        ok = self._ok[b0:b1]
        if ok.all():
            return True
        return all(self._verify(b0 + int(b)) for b in np.flatnonzero(~ok))

    def ready_rows(self, rows: np.ndarray) -> bool:
        """Return True if the blocks of store rows ``rows`` are sealed and verified."""
        if not len(rows) or self._num_ok == len(self._ok):
            return True
        found = np.unique(np.searchsorted(self.starts, rows, side="right") - 1)
        ok = self._ok[found]
        return bool(ok.all()) or all(self._verify(int(b)) for b in found[~ok])

    def sealed_after(self, rows) -> None:
        """Seal the blocks that the rows just put (a slice or positions) left complete."""
        if isinstance(rows, slice):
            found = range(*self.blocks(rows.start, rows.stop))
        else:
            found = np.unique(np.searchsorted(self.starts, rows, side="right") - 1)
        for b in found:
            b = int(b)
            lo, hi = int(self.starts[b]), int(self.starts[b + 1])
            if self._ok[b] or self.seals[b] or not self.filled[lo:hi].all():
                continue  # verified, sealed by another process (verified when read), or partial
            problem = self._problem(b, lo, hi)
            if problem is not None:
                self._mismatch(b, lo, hi, problem)
                continue
            self.seals[b] = self._seal(self._digest(b, lo, hi), self.check is not None)
            self._verified(b)

    def _digest(self, b: int, lo: int, hi: int):
        digest = self._mac.copy()
        digest.update(struct.pack("<Q", b))
        digest.update(self.values[lo:hi])
        digest.update(self.times[lo:hi])
        digest.update(self.filled[lo:hi])
        return digest

    @staticmethod
    def _seal(digest, checked: bool) -> int:
        """The seal word of a block whose bytes ``digest`` holds (never 0: not sealed)."""
        digest = digest.copy()
        digest.update(_CHECKED if checked else _UNCHECKED)
        return int.from_bytes(digest.digest()[:8], "little") or 1

    def _problem(self, b: int, lo: int, hi: int) -> str | None:
        if self.check is None:
            return None
        table = int(np.searchsorted(self.table_starts, lo, side="right")) - 1
        start = lo - int(self.table_starts[table])
        return self.check(table, start, self.times[lo:hi], self.values[lo:hi])

    def _verify(self, b: int) -> bool:
        if self._bad[b]:
            return False
        word = int(self.seals[b])
        if not word:
            return False  # not sealed: its rows are decoded (Note: checked blocks)
        lo, hi = int(self.starts[b]), int(self.starts[b + 1])
        problem = None
        digest = None if not self.filled[lo:hi].all() else self._digest(b, lo, hi)
        if digest is None:
            problem = "sealed with rows not filled"
        elif word == self._seal(digest, True):
            pass
        elif word != self._seal(digest, False):
            problem = (
                "seal mismatch (its values, timestamps or flags changed after they were "
                "written, or were sealed without this cache's key)"
            )
        else:  # sealed by a process without the checks
            problem = self._problem(b, lo, hi)
        if problem is not None:
            self._mismatch(b, lo, hi, problem)
            return False
        self._verified(b)
        return True

    def _verified(self, b: int) -> None:
        if not self._ok[b]:
            self._ok[b] = True
            self._num_ok += 1

    def _mismatch(self, b: int, lo: int, hi: int, problem: str) -> None:
        table = int(np.searchsorted(self.table_starts, lo, side="right")) - 1
        start = lo - int(self.table_starts[table])
        what = f"block {b} (rows [{start}, {start + hi - lo}) of table {table})"
        if self.writable:
            self.seals[b] = 0
            fence()
            self.filled[lo:hi] = False
            done = "decoding them again from the TsFile and rewriting them"
        else:
            self._bad[b] = True
            done = "decoding them from the TsFile instead (the entry is read-only)"
        text = (
            f"decoded cache entry {self.path}: {what}: {problem}; {done}. The TsFile is not "
            f"at fault; if this repeats, check the disk and run `tsfile-torch cache clear`"
        )
        if self._warned:
            logger.info("%s", text)
            return
        self._warned = True
        warn_caller(text, CacheMismatchWarning)


def open_store(
    sizes: Sequence[int],
    num_columns: int,
    dtype,
    key: str | None,
    cache_dir: str | None,
    cache_limit: int,
    quiet: bool = False,
    check: BlockCheck | None = None,
) -> MemoryStore | None:
    """Return a :class:`MemoryStore` over the entry of ``key``, created if needed.

    ``None`` (after one warning per process and directory, logged only with ``quiet``: a
    DataLoader worker, whose dataset warned when it was built) when the entry cannot be used:
    the caller decodes instead (see the module note: fallback). ``check``: the statistics
    checks a block passes before it is sealed and when it is first served (Note: checked
    blocks).
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
    blocks = len(block_starts(sizes, CHECK_ROWS)) - 1
    size = _layout(_round(len(key) + 512), rows, num_columns, dtype.itemsize, blocks)[4]
    if size > cache_limit:
        _warn_once(
            directory,
            f'cache="disk": the decoded data needs {size / 2**20:.0f} MiB, more than '
            f"cache_limit={cache_limit}: decoding every epoch instead; raise cache_limit",
            quiet,
        )
        return None
    sealed_by = b""
    try:
        where = private_dir(directory, tighten=True)  # CacheDirError: refused, raised
        sealed_by = secret(where)
        sealer = key_id(sealed_by)
        with file_lock(os.path.join(directory, digest + ".lock")):
            sweep_parts(directory, digest)  # Note: part files
            try:
                arrays = _map(path, sizes, num_columns, dtype, True, key, sealer)
            except (_Damaged, FileNotFoundError) as why:
                if not isinstance(why, FileNotFoundError):
                    logger.warning("decoded cache entry %s: %s; creating it again", path, why)
                with file_lock(os.path.join(directory, ".cache.lock")):
                    _make_room(directory, size, cache_limit, path)
                    _create(path, key, sizes, num_columns, dtype, where, sealer)
                arrays = _map(path, sizes, num_columns, dtype, True, key, sealer)
        writable = True
    except (OSError, _Damaged) as err:  # _Damaged: an entry just created reads back wrong
        arrays = None
        if sealed_by:  # the key was read: an entry sealed with it can still be served
            arrays = _read_only(path, sizes, num_columns, dtype, key, key_id(sealed_by))
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
    mapped, kept_arrays, seals, starts = arrays
    checked = BlockSeals(path, key, seals, starts, kept_arrays, writable, check, sealed_by)
    return MemoryStore(sizes, num_columns, dtype, kept_arrays, mapped, writable, checked)


def _read_only(path, sizes, columns, dtype, key, sealer):
    try:
        return _map(path, sizes, columns, dtype, False, key, sealer)
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


def clear(directory: str) -> tuple[int, int, int]:
    """Delete every entry (and leftover part / lock file) in ``directory`` that no process is
    creating: ``(entries deleted, their bytes, entries left because a fill holds their lock)``.

    Each entry goes under its own lock, taken without waiting: a held lock and the part file of
    the fill holding it stay, so a concurrent fill keeps its entry (Note: part files). A
    process that waited on a lock deleted here opens the new one (:func:`file_lock`).
    """
    count = nbytes = busy = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0, 0, 0
    groups: dict[str, list[str]] = {}
    for name in names:
        if name.endswith((_SUFFIX, ".lock")) or _is_part(name):
            groups.setdefault(name.split(".", 1)[0], []).append(name)
    for digest, found in sorted(groups.items()):
        lock = os.path.join(directory, (digest or ".cache") + ".lock")
        with file_lock(lock, blocking=False) as free:
            if not free:
                busy += any(name.endswith(_SUFFIX) or _is_part(name) for name in found)
                continue
            for name in sorted(found, key=lambda name: name.endswith(".lock")):  # lock last
                path = os.path.join(directory, name)
                with contextlib.suppress(FileNotFoundError):
                    size = os.stat(path).st_size
                    os.unlink(path)
                    if name.endswith(_SUFFIX):
                        count, nbytes = count + 1, nbytes + size
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock)  # under the lock: a waiter opens the next one
    return count, nbytes, busy
