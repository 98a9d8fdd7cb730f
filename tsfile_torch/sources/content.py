"""What a local file's content is: its identity, digests of its bytes, and verdicts kept on disk.

Note: content-relevant identity. Change detection compares a :class:`FileIdentity` taken when
the dataset was built with ``os.stat`` now. Size, mtime, inode and device are compared as they
are: any of them moving means another file or other bytes. ctime alone is not: ``chmod``,
``chown``, ``setfacl`` and a new hard link (``cp -al``, ``rsync --link-dest`` snapshots) move it
without touching the bytes, but so does a same-size rewrite whose mtime was put back with
``touch -d`` / ``os.utime``. When only ctime moved, :meth:`LocalFile.check_unchanged
<tsfile_torch.sources.base.LocalFile.check_unchanged>` decides:

- the file's full content hash is known (it was verified against a manifest): hash it again
  (once per new identity across processes: the hash is remembered, see below) and compare:
  exact;
- else the change is accepted only when it is explained and the bytes that describe the file
  are intact: the permissions, owner, group or link count changed too, *and* a digest of the
  file's head and metadata tail (:func:`tail_digest`, taken with the identity) still matches.
  A restored-mtime rewrite changes none of those attributes, so it is still "file changed";
  ``chmod`` to the mode a file already has, or an extended-attribute change, is reported as a
  change too (a manifest settles those).

An accepted identity replaces the recorded one, so each process resolves a ctime move once.

Note: remembered verdicts. What was learned about a file's content is kept in small JSON files
under ``$XDG_CACHE_HOME/tsfile-torch/verified`` (:func:`tsfile_torch.options.user_cache_dir`),
one per file identity (:meth:`Source.index_key <tsfile_torch.sources.base.Source.index_key>`:
path, size, mtime, ctime, inode, device), so later builds, DataLoader workers and later runs do
not hash again: ``{"algorithm", "hash"}`` once a file was hashed, ``{"damaged": reason}`` once a
read found it damaged (``on_damaged="skip"`` then leaves it out), ``{"validated", "checker"}``
once it passed the validation child: the mode, and the tsfile and tsfile-torch versions that
checked it (later builds with the same versions skip the child:
:mod:`tsfile_torch.integrity.screen`); a file whose key moved while the child checked it is not
remembered. An object its store gives no version of has no key (``None``): nothing is
remembered about it.
Any write to the file moves its ctime and so its key: a verdict never outlives the bytes it was
about.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from tsfile_torch.errors import TsFileFormatError, warn_caller
from tsfile_torch.options import user_cache_dir
from tsfile_torch.sources.cachedir import private_dir, set_mode

__all__ = [
    "ALGORITHM",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "MANIFEST_VERSION",
    "FileIdentity",
    "ManifestEntry",
    "atomic_write",
    "file_hash",
    "hash_file",
    "new_hash",
    "parse_manifest",
    "recall",
    "remember",
    "tail_digest",
    "warn_unlisted",
]

logger = logging.getLogger(__name__)

#: The content hash of manifests and remembered verdicts (hashlib's BLAKE2b, 32-byte digest).
ALGORITHM = "blake2b-256"
_HASH_BLOCK = 4 << 20
#: Bytes of the head and of the tail that :func:`tail_digest` reads. The tail holds a TsFile's
#: metadata (series statistics, chunk offsets), so another TsFile of the same size differs there.
HEAD_BYTES = 4 << 10
TAIL_BYTES = 64 << 10


def new_hash():
    """Return a fresh :data:`ALGORITHM` hash object (``update`` / ``hexdigest``)."""
    return hashlib.blake2b(digest_size=32)


def hash_file(path: str) -> str:
    """Return the hex :data:`ALGORITHM` digest of every byte of ``path``."""
    digest = new_hash()
    buffer = bytearray(_HASH_BLOCK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            digest.update(view[:n])  # hashlib releases the GIL for large updates
    return digest.hexdigest()


def tail_digest(path: str, size: int) -> str:
    """Return a digest of the first :data:`HEAD_BYTES` and last :data:`TAIL_BYTES` of ``path``.

    Cheap (the bytes tsfile reads to open the file anyway); what a ctime-only move is checked
    against when no content hash is known (Note: content-relevant identity).
    """
    digest = new_hash()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        digest.update(os.pread(fd, HEAD_BYTES, 0))
        digest.update(os.pread(fd, TAIL_BYTES, max(0, size - TAIL_BYTES)))
    finally:
        os.close(fd)
    return digest.hexdigest()


@dataclass(frozen=True)
class FileIdentity:
    """A local file as change detection sees it (Note: content-relevant identity).

    Attributes:
        size, mtime_ns, inode, device: compared as they are.
        ctime_ns: moves on content and attribute changes alike.
        attributes: (mode, uid, gid, link count): what explains a ctime move.
        tail: :func:`tail_digest` when the identity was taken.
        content: the full content hash when the file was verified against a manifest.
    """

    size: int
    mtime_ns: int
    inode: int
    device: int
    ctime_ns: int
    attributes: tuple[int, int, int, int]
    tail: str
    content: str | None = None

    #: names of :attr:`fields`, for messages
    FIELDS = ("size", "mtime", "inode", "device", "ctime")

    @property
    def fields(self) -> tuple[int, int, int, int, int]:
        """(size, mtime, inode, device, ctime): what a stat result is compared with."""
        return (self.size, self.mtime_ns, self.inode, self.device, self.ctime_ns)

    @classmethod
    def of(cls, path: str, st: os.stat_result | None = None) -> FileIdentity:
        """Return the identity of ``path`` now (one ``os.stat``, a head and tail read)."""
        st = st or os.stat(path)
        tail = tail_digest(path, st.st_size) if stat.S_ISREG(st.st_mode) else ""
        return cls(*stat_fields(st), attributes=_attributes(st), tail=tail)


def stat_fields(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """Return :attr:`FileIdentity.fields` of a stat result."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, st.st_ctime_ns)


def _attributes(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_mode, st.st_uid, st.st_gid, st.st_nlink)


def atomic_write(path: str, write: Callable[[IO[bytes]], Any], cache: bool = True) -> bool:
    """Write ``path`` through a temporary file in its directory and ``os.replace`` it.

    The temporary file is made by ``mkstemp`` (``O_EXCL``, a fresh name: never through a
    link) and removed on every failure path (a full disk, a write limit, an exception in
    ``write``, an interrupt). With ``cache`` the directory is a private cache directory
    (Note: private caches in :mod:`tsfile_torch.sources.cachedir`: made 0700, files 0600, one
    not private is a CacheDirError) and OS errors are logged and return False (a cache is never
    worth failing a read for); without, errors are raised like anything else.

    Raises:
        CacheDirError: with ``cache``, the directory is not private.
    """
    tmp = None
    try:
        directory = os.path.dirname(path)
        if cache:
            mode = private_dir(directory).file_mode
        else:
            os.makedirs(directory, exist_ok=True)
            mode = 0o600
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")  # 0600
        if mode != 0o600:
            set_mode(fd, tmp, mode)  # a group share's
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.replace(tmp, path)  # atomic: concurrent writers write the same bytes
        tmp = None
        return True
    except OSError as err:
        if not cache:
            raise
        logger.debug("cannot write %s: %s", path, err)
        return False
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


# -- manifests (written and checked by tsfile_torch.integrity.manifest) -----------------------
#: A manifest's file name, in the directory (or beside the objects) whose TsFiles it lists.
MANIFEST_NAME = "tsfile-torch-manifest.json"
MANIFEST_FORMAT = "tsfile-torch-manifest"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ManifestEntry:
    """One file a manifest lists: its size and :data:`ALGORITHM` content hash."""

    size: int
    hash: str


def parse_manifest(text: str | bytes, where: str) -> dict[str, ManifestEntry]:
    """Return relative path -> entry of a manifest's text; ``where`` names it in errors.

    Raises:
        TsFileFormatError: not a manifest, another hash algorithm, or a malformed entry.
    """
    try:
        record = json.loads(text)
    except ValueError as err:
        raise TsFileFormatError(f"{where}: cannot read the manifest ({err})") from err
    if not isinstance(record, dict) or record.get("format") != MANIFEST_FORMAT:
        raise TsFileFormatError(
            f"{where}: not a tsfile-torch manifest; write one with `tsfile-torch manifest DIR`"
        )
    if record.get("algorithm") != ALGORITHM:
        raise TsFileFormatError(
            f"{where}: manifest hashes use {record.get('algorithm')!r}; this version of "
            f"tsfile-torch checks {ALGORITHM!r}: write it again with `tsfile-torch manifest DIR`"
        )
    try:
        return {f["path"]: ManifestEntry(int(f["size"]), str(f["hash"])) for f in record["files"]}
    except (KeyError, TypeError, ValueError) as err:
        raise TsFileFormatError(f"{where}: malformed manifest entry ({err!r})") from err


def warn_unlisted(names: Sequence[str], where: str, fix: str = "") -> None:
    """Warn once about files a manifest applies to but does not list (so not checked).

    ``where`` says which manifest ("of their directory", "beside them"); ``fix`` is appended
    to the advice to write it again (" and upload it").
    """
    if not names:
        return
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    warn_caller(
        f"{shown}: not listed in the manifest {where}, so not checked against it (added after "
        f"it was written?); write it again with `tsfile-torch manifest DIR`{fix}"
    )


# -- remembered verdicts (Note: remembered verdicts) -----------------------------------------
def _record_path(key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return os.path.join(user_cache_dir("verified"), digest[:2], digest + ".json")


def recall(key: str | None) -> dict:
    """Return what is remembered about the file identity ``key`` (``{}``: nothing)."""
    if key is None:
        return {}
    try:
        with open(_record_path(key), encoding="utf-8") as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) and record.get("key") == key else {}


def remember(key: str | None, **facts) -> None:
    """Add ``facts`` to what is remembered about the file identity ``key`` (best effort)."""
    if key is None:
        return
    record = {**recall(key), **facts, "key": key}
    atomic_write(_record_path(key), lambda fh: fh.write(json.dumps(record).encode()))


def file_hash(path: str, name: str, expect: tuple, key: str | None, force: bool = False) -> str:
    """Return the content hash of ``path``, remembered under ``key``.

    Hashes only when nothing is remembered (or ``force``); the file must keep the stat
    :attr:`FileIdentity.fields` ``expect`` before and after hashing, so the hash remembered
    belongs to that identity.

    Raises:
        TsFileFormatError: the file changed before or while it was hashed.
    """
    record = recall(key)
    if not force and record.get("algorithm") == ALGORITHM and "hash" in record:
        return record["hash"]
    digest = hash_file(path)
    if stat_fields(os.stat(path)) != tuple(expect):
        raise TsFileFormatError(
            f"{name}: file changed while its content hash was computed; files must not be "
            f"modified while a dataset reads them: rebuild the dataset"
        )
    remember(key, algorithm=ALGORITHM, hash=digest)
    return digest
