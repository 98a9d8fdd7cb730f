"""Remote sources: fsspec URLs (``s3://``, ``gs://``, ``memory://``...) read through a local cache.

Note: remote sources. A URL source is listed / globbed with fsspec when the dataset is built and
becomes one :class:`RemoteFile` per object: URL, size and version (ETag, generation or mtime,
whatever the store reports). Then:

- **Catalog (the process that builds the dataset)**: the TsFile metadata is read through an
  fsspec file object with range reads. tsfile reads the 6-byte head and the metadata at the tail
  of the file (~2 KiB for a few dozen series); with :data:`METADATA_BLOCK` blocks that is about
  two ranged GETs per file, whatever the file size. A file already in the cache is read locally:
  no request at all.
- **Reads (each process that reads: the main process with ``num_workers=0``, each DataLoader
  worker, each DDP rank)**: the first time a process opens a file (see ``BatchReader._reader``),
  :func:`local_source` downloads the whole object into ``cache_dir`` and the dataset's read
  backend (mmap / pread) reads that local copy like any local file. A process opens only the
  files its rows need, so a worker or rank whose share lies in some files fetches only those.
  Later epochs reuse the open reader; a reopen finds the local copy: no request.

This is what LitData and MosaicML Streaming do for their shards (download to a local cache,
then memory-map; a bounded cache evicts the least recently used). We follow them and differ in:

- the cache key is the URL *and* the object's version and size, so a changed object gets a new
  local copy (their shard names are immutable by construction; TsFiles are not); an object its
  store gives no version of (no ETag, generation or mtime) is keyed by the dataset build as
  well (a random token made when it is listed, carried to workers with the dataset), so a
  same-size rewrite is never read through an earlier build's copy: each build downloads it;
- one download per file across processes through an ``fcntl`` lock on ``<copy>.lock`` (released
  by the kernel if a process dies: no stale lock files to clean up, unlike LitData's
  ``FileLock(..., timeout=0)``), written to ``<copy>.part.<pid>`` (``O_EXCL | O_NOFOLLOW``, in a
  private ``cache_dir``: Note: private caches in :mod:`tsfile_torch.sources.cachedir`) and
  published with an atomic ``os.replace`` (as Streaming does), so a reader never sees a partial
  file;
- a copy is checked against what was downloaded each time a process opens it: its size,
  mtime, ctime, inode and device are recorded at download in ``<copy>.rec`` (sealed with the
  directory's secret); when they moved (bit rot repaired by a tool, another process, a copy
  put there by hand), the bytes are hashed again against the manifest's hash or the ETag's MD5
  where there is one (a match: recorded anew), else, or on a mismatch, the copy is deleted and
  fetched again with a :class:`~tsfile_torch.errors.CacheMismatchWarning` naming it. (A change
  that keeps all five, writing the disk under the file system, is not seen.) Last use, for
  eviction, is the record's mtime: the copy itself is never touched;
- the object's version is checked against the catalog before download: an object changed after
  the dataset was built is an error, never a mix of old metadata and new data;
- the downloaded bytes are checked before the copy is published: against a manifest
  (``tsfile-torch-manifest.json``, as ``tsfile-torch manifest`` writes it) beside the objects
  (same prefix; read once when the dataset is built), and against the store's own checksum
  where it is one: an S3 ETag of a single-part upload is the MD5 of the bytes (multipart ETags,
  with a ``-``, and ETags of KMS / customer-key encrypted objects are not, and are not
  checked). A mismatch is a :class:`~tsfile_torch.errors.RemoteError` naming the URL, and
  nothing is kept in the cache (streaming's ``validate_hash`` after download, for TsFiles).

Size bound (``cache_limit`` bytes, default :data:`~tsfile_torch.options.DEFAULT_CACHE_LIMIT`):
before a download, under a cache-wide lock, least recently used copies are deleted until the new
file fits (:func:`~tsfile_torch.sources.cachedir.make_room`, shared with the decoded disk
cache). Deleting a copy that another process has open or mapped is safe on POSIX (the data stays
until closed); that process fetches it again the next time it opens it. Downloads of different
files that run at once each reserve their size first, so the bound holds for finished and
in-flight files.

``file://`` URLs are plain local paths: read in place, no copy, no fsspec needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fnmatch
import glob as _glob
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tsfile_torch.errors import CacheMismatchWarning, RemoteError, warn_caller
from tsfile_torch.options import DEFAULT_CACHE_LIMIT, user_cache_dir
from tsfile_torch.pids import alive
from tsfile_torch.sources.base import FileObject, Source, file_url_path, register
from tsfile_torch.sources.cachedir import (
    CacheDir,
    SealError,
    create_file,
    file_lock,
    make_room,
    private_dir,
    seal,
    secret,
    unseal,
)
from tsfile_torch.sources.content import (
    ALGORITHM,
    MANIFEST_NAME,
    ManifestEntry,
    atomic_write,
    hash_file,
    new_hash,
    parse_manifest,
    warn_unlisted,
)

__all__ = [
    "DEFAULT_CACHE_LIMIT",
    "RemoteFile",
    "RemoteOptions",
    "default_cache_dir",
    "expand_url",
    "file_lock",
    "file_url_path",
    "is_url",
    "open_metadata",
]

logger = logging.getLogger(__name__)

#: Block of the range reads that fetch a remote file's metadata (head and tail).
METADATA_BLOCK = 256 * 2**10
#: Bytes per request when downloading a file into the cache.
DOWNLOAD_BLOCK = 32 * 2**20

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "mtime", "LastModified", "created")
_EXTRA_HINT = "pip install 'tsfile-torch[remote]'"


def default_cache_dir() -> str:
    """Return ``$XDG_CACHE_HOME/tsfile-torch/remote`` (default ``~/.cache/...``), where remote
    files are copied by default."""
    return user_cache_dir("remote")


def is_url(source: object) -> bool:
    """Return True when ``source`` is a str of the form ``protocol://...``."""
    return isinstance(source, str) and bool(_URL.match(source))


@dataclass(frozen=True)
class RemoteOptions:
    """How remote sources are reached and cached.

    Attributes:
        storage_options: keyword arguments of the fsspec filesystem (credentials, endpoint:
            ``{"key": ..., "secret": ..., "endpoint_url": ...}`` for s3fs).
        cache_dir: where local copies live (``None``: :func:`default_cache_dir`).
        cache_limit: bytes of local copies kept before the least recently used are deleted.
    """

    storage_options: Mapping[str, Any] | None = field(default=None, hash=False)
    cache_dir: str | None = None
    cache_limit: int = DEFAULT_CACHE_LIMIT

    def __post_init__(self):
        from tsfile_torch.options import ReadOptions

        checked = ReadOptions(
            storage_options=self.storage_options,
            cache_dir=self.cache_dir,
            cache_limit=self.cache_limit,
        )  # one set of checks and messages for these arguments
        object.__setattr__(self, "cache_dir", checked.cache_dir)
        object.__setattr__(self, "storage_options", dict(self.storage_options or {}))

    @classmethod
    def of(cls, options) -> RemoteOptions:
        """Return the remote settings of a :class:`~tsfile_torch.options.ReadOptions`."""
        return cls(options.storage_options, options.cache_dir, options.cache_limit)

    @property
    def directory(self) -> str:
        return self.cache_dir or default_cache_dir()


@dataclass(frozen=True)
class RemoteFile(Source):
    """One remote object as listed when the dataset was built. Picklable, no handles.

    Read through its local copy (:meth:`reader_target` downloads it once per machine), which
    is keyed by URL, version and size and so never changes under a reader.
    """

    url: str
    nbytes: int
    version: str
    options: RemoteOptions = field(default_factory=RemoteOptions, repr=False, compare=False)
    #: the manifest beside the object (its URL) and what it lists for the object, if any
    listed: tuple[str, ManifestEntry] | None = field(default=None, repr=False, compare=False)
    #: MD5 (hex) of the bytes, where the store's checksum is one (S3 single-part ETag)
    md5: str | None = field(default=None, repr=False, compare=False)
    #: for an object without a version: a token of the dataset build that listed it, part of
    #: its local copy's key (Note: remote sources)
    build: str = field(default="", repr=False, compare=False)

    @property
    def name(self) -> str:
        """The URL (what error messages and ``FileInfo.name`` show)."""
        return self.url

    @property
    def key(self) -> str:
        return self.url

    can_map = True  # its local copy

    @property
    def protocol(self) -> str:
        return self.url.split("://", 1)[0]

    def size(self) -> int:
        return self.nbytes

    def identity(self) -> tuple:
        return (self.version, self.nbytes)

    def reader_target(self) -> str:
        return fetch(self)

    def prepare(self) -> None:
        fetch(self)

    def metadata_target(self):
        return open_metadata(self)

    def mapped_path(self) -> str:
        return os.path.realpath(self.cache_path)

    def index_key(self, identity=None) -> str | None:
        """``None`` for an object its store gives no version of (no ETag, generation or mtime):
        a rewrite of the same size would have the same key, so nothing is kept under it."""
        version, nbytes = identity or self.identity()
        return repr((self.url, version, nbytes)) if version else None

    @contextlib.contextmanager
    def for_child(self) -> Iterator[Source]:
        """A ``memory://`` object lives in this process only: a fresh interpreter gets a copy."""
        if self.protocol != "memory":
            yield self
            return
        with open_metadata(self) as fh, FileObject(fh).for_child() as copy:
            yield dataclasses.replace(copy, shown=self.url)

    @property
    def lock_path(self) -> str:
        """The lock its download holds: one per copy, and one per URL for the copies of an
        object without a version (one per build would leave a lock file per build)."""
        if self.version:
            return self.cache_path + ".lock"
        return os.path.join(self.options.directory, f"{self._url_key}-unversioned.lock")

    @property
    def _url_key(self) -> str:
        return hashlib.sha256(self.url.encode()).hexdigest()[:16]

    @property
    def cache_path(self) -> str:
        """Local copy: ``<cache_dir>/<hash of URL>-<hash of version and size>-<basename>``
        (and of the build token for an object without a version)."""
        ver = f"{self.version}\0{self.nbytes}" + (f"\0{self.build}" if not self.version else "")
        ver_key = hashlib.sha256(ver.encode()).hexdigest()[:12]
        base = os.path.basename(self.url.rstrip("/")) or "object"
        return os.path.join(self.options.directory, f"{self._url_key}-{ver_key}-{base}")


# -- fsspec access ----------------------------------------------------------------------------
def _filesystem(url: str, options: RemoteOptions):
    """Return the fsspec filesystem for ``url`` (cached per process by fsspec itself)."""
    try:
        import fsspec
    except ImportError as err:
        raise RemoteError(
            f"{url}: reading URLs needs fsspec, which is not installed; {_EXTRA_HINT} "
            f"(fsspec + s3fs; for gs:// also pip install gcsfs)"
        ) from err
    protocol = url.split("://", 1)[0]
    try:
        return fsspec.filesystem(protocol, **options.storage_options)
    except (ImportError, ValueError) as err:  # ValueError: protocol unknown to fsspec
        raise RemoteError(
            f"{url}: fsspec cannot open {protocol}:// URLs ({err}); {_EXTRA_HINT} installs "
            f"s3fs for s3://, other stores need their fsspec package (gcsfs for gs://...)"
        ) from err
    except TypeError as err:
        raise RemoteError(
            f"{url}: storage_options {sorted(options.storage_options)} are not accepted by "
            f"the {protocol}:// filesystem ({err})"
        ) from err


def _remote_error(url: str, action: str, err: BaseException) -> RemoteError:
    """Turn an fsspec / store error into one message naming the URL, the cause and the fix."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, FileNotFoundError):
        why = "no such bucket, prefix or object; check the URL"
    elif isinstance(err, PermissionError) or re.search(
        r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|Forbidden|credential|403",
        text,
        re.IGNORECASE,
    ):
        why = "access denied; check the credentials passed in storage_options (or the environment)"
    else:
        why = "the store could not be reached or refused the request; check the endpoint"
    return RemoteError(f"{url}: cannot {action} ({text}); {why}")


def store_errors() -> tuple[type[BaseException], ...]:
    """Return the exception types a store's client raises (never our own bugs).

    OS errors (fsspec's FileNotFoundError / PermissionError, connection and timeout errors),
    plus botocore's and aiohttp's bases where installed (s3fs lets some through untranslated).
    """
    found: list[type[BaseException]] = [OSError, TimeoutError]
    with contextlib.suppress(ImportError):
        import botocore.exceptions as boto

        found += [boto.BotoCoreError, boto.ClientError]
    with contextlib.suppress(ImportError):
        import aiohttp

        found.append(aiohttp.ClientError)
    return tuple(found)


def _version(info: Mapping[str, Any]) -> str:
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value not in (None, ""):
            if hasattr(value, "timestamp"):  # a datetime (listings give floats, info datetimes)
                value = value.timestamp()
            return str(value).strip('"')
    return ""


def _full_url(protocol: str, path: str) -> str:
    return path if is_url(path) else f"{protocol}://{path}"


_MD5 = re.compile(r"[0-9a-f]{32}")


def _md5_of(protocol: str, info: Mapping[str, Any]) -> str | None:
    """Return the MD5 of the object's bytes where its S3 ETag may be one, else None.

    An ETag is the MD5 of the content for a single-part upload stored unencrypted or with
    SSE-S3; a multipart ETag has a ``-``, and SSE-KMS / SSE-C ETags are something else (a
    listing may not say which: :func:`_etag_is_md5` asks when the MD5 disagrees).
    """
    if protocol not in ("s3", "s3a"):
        return None
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
    encryption = str(info.get("ServerSideEncryption") or "").lower()
    if "kms" in encryption or info.get("SSECustomerAlgorithm"):
        return None
    return etag if _MD5.fullmatch(etag) else None


def _entry(protocol: str, info: Mapping[str, Any], options: RemoteOptions) -> RemoteFile:
    version = _version(info)
    return RemoteFile(
        _full_url(protocol, info["name"]),
        int(info.get("size") or 0),
        version,
        options,
        md5=_md5_of(protocol, info),
        build="" if version else secrets.token_hex(8),
    )


def _with_manifests(fs, protocol: str, files: list[RemoteFile]) -> list[RemoteFile]:
    """Attach to each file what the manifest beside it (same prefix) lists, if there is one.

    One small read per prefix when the dataset is built; a missing manifest costs one request.
    """
    out = []
    by_prefix: dict[str, dict[str, ManifestEntry] | None] = {}
    unlisted = []
    for remote in files:
        prefix, _, base = remote.url.rpartition("/")
        if prefix not in by_prefix:
            url = f"{prefix}/{MANIFEST_NAME}"
            try:
                by_prefix[prefix] = parse_manifest(fs.cat_file(fs._strip_protocol(url)), url)
            except FileNotFoundError:
                by_prefix[prefix] = None
            except store_errors() as err:
                raise _remote_error(url, "read the manifest", err) from err
        entries = by_prefix[prefix]
        if entries is None:
            out.append(remote)
        elif base in entries:
            listed = (f"{prefix}/{MANIFEST_NAME}", entries[base])
            out.append(dataclasses.replace(remote, listed=listed))
        else:
            unlisted.append(remote.url)
            out.append(remote)
    warn_unlisted(unlisted, "beside them", " and upload it")
    return out


def expand_url(url: str, options: RemoteOptions | None = None) -> list[RemoteFile]:
    """Expand one URL into remote files, sorted: an object, a "directory" or a glob pattern.

    A directory (or bucket / prefix) gives its ``*.tsfile`` objects (not recursive, like a local
    directory); a glob its matching objects. (``file://`` URLs are local paths: see
    :func:`file_url_path`.)

    Raises:
        RemoteError: fsspec (or the store's package) is missing, the bucket / object does not
            exist, access is denied, nothing matches, or ``cache_dir`` exists and is read-only.
    """
    options = options or RemoteOptions()
    _check_writable(url, options.directory)
    fs = _filesystem(url, options)
    protocol = url.split("://", 1)[0]
    path = fs._strip_protocol(url)
    fs.invalidate_cache()  # a listing cached by an earlier dataset may be stale
    try:
        if _glob.has_magic(path):
            found = fs.glob(path, detail=True)
            files = [i for i in found.values() if i.get("type") == "file"]
            if not files:
                root = re.split(r"[*?\[]", path, maxsplit=1)[0].rsplit("/", 1)[0] or path
                fs.info(root)  # raises for a missing bucket / prefix: the clearer message
                raise RemoteError(f"{url}: glob pattern matches no objects")
        else:
            info = fs.info(path)
            if info.get("type") == "directory":
                found = fs.ls(path, detail=True)
                files = [
                    i
                    for i in found
                    if i.get("type") == "file" and fnmatch.fnmatch(i["name"], "*.tsfile")
                ]
                if not files:
                    raise RemoteError(
                        f"{url}: holds no *.tsfile objects; point at a prefix of TsFiles, an "
                        f"object, or a glob pattern"
                    )
            else:
                files = [info]
    except RemoteError:
        raise
    except store_errors() as err:
        raise _remote_error(url, "list", err) from err
    files = [i for i in files if not i["name"].endswith("/" + MANIFEST_NAME)]
    if not files:
        raise RemoteError(f"{url}: holds no TsFile objects, only a manifest")
    found = sorted((_entry(protocol, i, options) for i in files), key=lambda r: r.url)
    return _with_manifests(fs, protocol, found)


def _cache_dir_error(url: str, directory: str, err: OSError) -> RemoteError:
    return RemoteError(
        f"{url}: cannot write into cache_dir={directory!r} ({type(err).__name__}: {err}); local "
        f"copies of URL sources need a writable cache_dir: pass another one"
    )


def _check_writable(url: str, directory: str) -> None:
    """Raise RemoteError if ``directory`` exists and a file cannot be created in it.

    Checked when a dataset is built, so a read-only cache is one clear error then, not a
    failure in every process at its first read (a missing directory is created at the first
    download).

    Raises:
        CacheDirError: ``directory`` exists and is not private (Note: private caches).
    """
    if not os.path.isdir(directory):
        return
    private_dir(directory)
    try:
        with tempfile.TemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as err:
        raise _cache_dir_error(url, directory, err) from err


@contextlib.contextmanager
def open_metadata(remote: RemoteFile) -> Iterator[Any]:
    """Yield a seekable binary file of ``remote`` for reading its metadata (range reads).

    A file already in the cache, as it was downloaded, is opened locally instead (no request).
    """
    local = remote.cache_path
    if os.path.lexists(local):  # checked against its download (fetched again if changed)
        with open(os.open(fetch(remote), os.O_RDONLY | _NOFOLLOW | _CLOEXEC), "rb") as fh:
            yield fh
        return
    fs = _filesystem(remote.url, remote.options)
    try:
        fh = fs.open(
            remote.url,
            "rb",
            block_size=METADATA_BLOCK,
            cache_type="blockcache",
            size=remote.nbytes,
        )
    except store_errors() as err:
        raise _remote_error(remote.url, "open", err) from err
    with fh:
        yield fh


# -- the local cache --------------------------------------------------------------------------
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Suffix of the record of a copy's download (Note: remote sources).
_RECORD = ".rec"


def _copies(directory: str) -> list[tuple[float, int, str]]:
    """Return (last use, bytes, path) of every copy and in-flight download in ``directory``.

    Last use: the mtime of the copy's record (touched on each use) where it has one.
    """
    found, used = [], {}
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith((".lock", ".tmp")) or entry.name.startswith("."):
                continue  # locks, the key, records being written
            if entry.is_dir(follow_symlinks=False):  # decoded/: the decoded cache's own bound
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if entry.name.endswith(_RECORD):
                used[entry.path[: -len(_RECORD)]] = st.st_mtime
            else:
                found.append((st.st_mtime, st.st_size, entry.path))
    return [(max(t, used.get(path, t)), size, path) for t, size, path in found]


def _being_written(path: str) -> bool:
    """Return whether ``path`` is a download another live process is writing."""
    writer = path.rsplit(".part.", 1)[1] if ".part." in os.path.basename(path) else ""
    return writer.isdigit() and alive(int(writer))  # a dead one's part is deleted


def _make_room(remote: RemoteFile) -> None:
    """Delete least recently used copies until ``remote`` fits in the cache limit."""
    limit = remote.options.cache_limit
    directory = remote.options.directory
    make_room(_copies(directory), remote.nbytes, limit, keep=_being_written)
    for name in os.listdir(directory):  # records of copies evicted here or elsewhere
        if name.endswith(_RECORD) and not os.path.lexists(os.path.join(directory, name[:-4])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
    if remote.nbytes > limit:
        logger.warning(
            "%s: %d bytes exceed cache_limit=%d; kept anyway (raise cache_limit)",
            remote.url,
            remote.nbytes,
            limit,
        )


def _drop_old_versions(remote: RemoteFile) -> None:
    if not remote.version:
        return  # other builds' copies may still be in use: the cache limit evicts them
    prefix = os.path.basename(remote.cache_path).split("-", 1)[0] + "-"
    keep = os.path.basename(remote.cache_path)
    for name in os.listdir(remote.options.directory):
        if name.startswith(prefix) and name not in (keep, keep + _RECORD) and ".part." not in name:
            if not name.endswith(".lock"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(remote.options.directory, name))


def _download(remote: RemoteFile, target: str) -> None:
    fs = _filesystem(remote.url, remote.options)
    part = f"{target}.part.{os.getpid()}"
    try:
        fs.invalidate_cache(fs._strip_protocol(remote.url))  # ask the store, not a listing
        # without size=, fsspec's buffered files look the object up once (s3fs: one HEAD, then
        # every GET carries If-Match with that ETag, so the bytes are that version's)
        with (
            fs.open(remote.url, "rb", block_size=DOWNLOAD_BLOCK, cache_type="none") as src,
            # created at full size by fetch (space reserved), never opened through a link
            open(os.open(part, os.O_RDWR | _NOFOLLOW | _CLOEXEC), "r+b") as dst,
        ):
            info = getattr(src, "details", None) or fs.info(remote.url)
            version, nbytes = _version(info), int(info.get("size") or 0)
            if (version, nbytes) != (remote.version, remote.nbytes):
                raise RemoteError(
                    f"{remote.url}: object changed since the dataset was built (version "
                    f"{remote.version!r} -> {version!r}, size {remote.nbytes} -> {nbytes}); "
                    f"objects must not change while a dataset reads them: rebuild the dataset"
                )
            digests = _copy_hashing(src, dst, remote)
            got = dst.tell()
        if got != remote.nbytes:
            raise RemoteError(
                f"{remote.url}: downloaded {got} bytes, the store listed {remote.nbytes}; the "
                f"object changed during the download: rebuild the dataset"
            )
        _check_digests(remote, digests)
        os.replace(part, target)
    except RemoteError:
        raise
    except OSError as err:
        if err.errno == errno.ENOSPC:
            raise RemoteError(
                f"{remote.url}: no space left in cache_dir={remote.options.directory!r}; "
                f"lower cache_limit or point cache_dir at a larger disk"
            ) from err
        raise _remote_error(remote.url, "fetch", err) from err
    except store_errors() as err:
        raise _remote_error(remote.url, "fetch", err) from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)


def _copy_hashing(src, dst, remote: RemoteFile) -> dict[str, Any]:
    """Copy ``src`` to ``dst``; return the hash objects of the checks ``remote`` has."""
    digests: dict[str, Any] = {}
    if remote.listed is not None:
        digests[ALGORITHM] = new_hash()
    if remote.md5 is not None:
        digests["md5"] = hashlib.md5(usedforsecurity=False)
    if not digests:
        shutil.copyfileobj(src, dst, DOWNLOAD_BLOCK)
        return digests
    while block := src.read(DOWNLOAD_BLOCK):
        dst.write(block)
        for digest in digests.values():
            digest.update(block)
    return digests


def _etag_is_md5(remote: RemoteFile) -> bool:
    """Return whether the object's ETag is the MD5 of its bytes, asked of the store (one HEAD).

    Not for SSE-KMS or SSE-C encrypted objects, whose ETags are something else; s3fs's listings
    do not say how an object is encrypted, so this is asked only when the MD5 disagrees.
    """
    fs = _filesystem(remote.url, remote.options)
    if not hasattr(fs, "call_s3"):
        return True
    bucket, key, _ = fs.split_path(remote.url)
    head = fs.call_s3("head_object", Bucket=bucket, Key=key)
    encrypted = "kms" in str(head.get("ServerSideEncryption", "")).lower()
    return not (encrypted or head.get("SSECustomerAlgorithm"))


def _check_digests(remote: RemoteFile, digests: dict[str, Any]) -> None:
    """Raise RemoteError if the downloaded bytes differ from the manifest or the ETag."""
    if remote.listed is not None:
        manifest, entry = remote.listed
        got = digests[ALGORITHM].hexdigest()
        if (remote.nbytes, got) != (entry.size, entry.hash):
            raise RemoteError(
                f"{remote.url}: content differs from the manifest {manifest} ({ALGORITHM} "
                f"{got[:16]}..., {remote.nbytes} bytes; listed {entry.hash[:16]}..., "
                f"{entry.size} bytes): the object is damaged or was changed since the manifest "
                f"was written; not kept in the cache"
            )
    if remote.md5 is not None:
        got = digests["md5"].hexdigest()
        if got != remote.md5 and _etag_is_md5(remote):
            raise RemoteError(
                f"{remote.url}: the downloaded bytes have MD5 {got}, the store's ETag says "
                f"{remote.md5}: the download was corrupted; not kept in the cache, the next "
                f"read fetches it again"
            )


def _stat(path: str) -> list[int] | None:
    """What a copy's record holds of it: size, mtime, ctime, inode, device (None: not a file)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None  # a link or anything else at a copy's name is never read
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def _record(remote: RemoteFile, target: str, key: bytes) -> dict | None:
    """Return the record of ``target``'s download (None: none, or it does not verify)."""
    try:
        fd = os.open(target + _RECORD, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    except OSError:
        return None
    with open(fd, "rb") as fh:
        raw = fh.read()
    try:
        record = json.loads(unseal(key, raw, os.path.basename(target)))
    except (SealError, ValueError) as err:
        logger.info("%s%s: not used (%s)", target, _RECORD, err)
        return None
    return record if record.get("url") == remote.url else None


def _intact(remote: RemoteFile, target: str, key: bytes) -> bool:
    """Return whether ``target`` is the copy of ``remote`` as it was downloaded."""
    record = _record(remote, target, key)
    if record is None:
        return False
    now = _stat(target)
    return now is not None and record.get("stat") == now and now[0] == remote.nbytes


def _write_record(remote: RemoteFile, target: str, key: bytes) -> None:
    record = {"url": remote.url, "version": remote.version, "stat": _stat(target)}
    data = seal(key, json.dumps(record).encode(), os.path.basename(target))
    atomic_write(target + _RECORD, lambda fh: fh.write(data))


def _expected_hash(remote: RemoteFile) -> tuple[str, str] | None:
    """Return (algorithm, hex digest) the bytes of ``remote`` are known to have, if any."""
    if remote.listed is not None:
        return ALGORITHM, remote.listed[1].hash
    if remote.md5 is not None:
        return "md5", remote.md5
    return None


def _still_good(remote: RemoteFile, target: str, key: bytes) -> bool:
    """Return whether the copy at ``target`` may be read, under its lock: as downloaded, or
    moved on disk with the bytes the manifest or ETag says (recorded anew). Else delete it.
    """
    if _intact(remote, target, key):
        return True
    record, now = _record(remote, target, key), _stat(target)
    expected = _expected_hash(remote)
    if now is not None and now[0] == remote.nbytes and expected is not None:
        algorithm, digest = expected
        if algorithm == ALGORITHM:
            got = hash_file(target)
        else:
            got = _md5(target)
        if got == digest:
            _write_record(remote, target, key)
            logger.info("%s: moved on disk, bytes still those of %s: kept", target, remote.url)
            return True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(target)
    if record is None:  # made by an earlier version, or its record was lost
        logger.info("%s: no record of its download: fetching %s again", target, remote.url)
        return False
    names = ("size", "mtime", "ctime", "inode", "device")
    was = record.get("stat") or [None] * len(names)
    moved = [n for n, a, b in zip(names, was, now, strict=True) if a != b] if now else []
    moved = moved or ["not a regular file now"]
    checked = f"; its bytes differ from the {expected[0]} known for it" if expected else ""
    warn_caller(
        f"local copy {target} of {remote.url} changed since it was downloaded "
        f"({', '.join(moved)}{checked}): deleted, fetching it again (the object is not at "
        f"fault; if this repeats, check the disk and what else writes into cache_dir)",
        CacheMismatchWarning,
    )
    return False


def _md5(path: str) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb", buffering=0) as fh:
        while block := fh.read(DOWNLOAD_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def fetch(remote: RemoteFile) -> str:
    """Return the path of the local copy of ``remote``, downloading it once across processes
    and checking it against its download each time (Note: remote sources)."""
    target = remote.cache_path
    directory = remote.options.directory
    try:
        where: CacheDir = private_dir(directory)
    except OSError as err:
        raise RemoteError(
            f"{remote.url}: cannot create cache_dir={directory!r} ({err}); pass a writable "
            f"cache_dir"
        ) from err
    try:
        key = secret(where)
        if _intact(remote, target, key):
            with contextlib.suppress(OSError):
                os.utime(target + _RECORD)  # last use, for least-recently-used eviction
            return target
        with file_lock(remote.lock_path):
            if os.path.lexists(target) and _still_good(remote, target, key):
                return target  # fetched by another process while we waited, or re-checked
            with file_lock(os.path.join(directory, ".cache.lock")):
                _make_room(remote)
                fd = create_file(f"{target}.part.{os.getpid()}", where.file_mode)
                try:
                    os.ftruncate(fd, remote.nbytes)  # counted by _make_room in other processes
                finally:
                    os.close(fd)
            logger.debug("fetching %s (%d bytes) into %s", remote.url, remote.nbytes, target)
            _download(remote, target)  # raises RemoteError for its own failures
            _write_record(remote, target, key)
    except OSError as err:  # locks, eviction, the part file: writing into cache_dir
        raise _cache_dir_error(remote.url, directory, err) from err
    with contextlib.suppress(OSError):
        _drop_old_versions(remote)
    return target


register(lambda item: is_url(item) and not item.startswith("file://"), expand_url)
