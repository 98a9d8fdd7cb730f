"""The Source protocol and the one registry that turns user input into sources.

A source is one TsFile as the rest of the package sees it: a printable ``name``, a ``key`` that
tells two sources apart, what ``TsFileReader`` opens in this process, whether that can be memory
mapped, an identity to detect changes, and what a validation child can open. Three kinds:

- :class:`LocalFile`: a path (also ``file://`` URLs, directories and globs expand into these);
- :class:`FileObject`: a seekable binary file object (``io.BytesIO``, an open file);
- :class:`~tsfile_torch.sources.remote.RemoteFile`: an fsspec URL read through a local copy.

Every other module asks the source, never its type (Note: one registry): adding a kind means one
class and one :func:`register` call in this package, whose ``__init__`` imports the module that
makes the call (URLs: :mod:`tsfile_torch.sources.remote`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import io
import os
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import unquote, urlparse

from tsfile_torch.errors import RemoteError, TsFileFormatError
from tsfile_torch.sources.content import FileIdentity, file_hash, stat_fields

__all__ = [
    "FileObject",
    "LocalFile",
    "Source",
    "SourceLike",
    "as_source",
    "expand_sources",
    "file_url_path",
    "os_error",
    "register",
]

#: What datasets accept as one source (or a list of them).
SourceLike = str | os.PathLike | IO[bytes] | "Source"


class Source:
    """One TsFile. Picklable; holds no native handle (readers live in the process using them)."""

    #: printable name: the path, the URL, or the file object's name
    name: str
    #: True when tsfile can memory-map what :meth:`reader_target` returns (a regular file)
    can_map: bool = False

    @property
    def key(self) -> str:
        """Tell sources apart (duplicates given twice are read once)."""
        return self.name

    def size(self) -> int:
        """Return the size in bytes now."""
        raise NotImplementedError

    def identity(self) -> Any:
        """Return what change detection compares (``None``: this kind cannot be checked)."""
        return None

    def check_unchanged(self, identity: Any) -> Any:
        """Raise TsFileFormatError if the source no longer has ``identity``.

        Returns the identity to compare with from now on (``identity`` itself, or one that
        accepts a change that leaves the content as it was).
        """
        return identity

    def reader_target(self) -> str | IO[bytes]:
        """Return what ``TsFileReader`` opens in this process (a path or a file object)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Do the slow non-native part of :meth:`reader_target` (a download) now; by default
        nothing. Read-ahead calls it before it enters the gate a fork waits on (Note:
        read-ahead and fork in :mod:`tsfile_torch.read.readahead`)."""

    @contextlib.contextmanager
    def metadata_target(self) -> Iterator[str | IO[bytes]]:
        """Yield what the catalog reads metadata through (remote: range reads, no download)."""
        yield self.reader_target()

    def mapped_path(self) -> str | None:
        """Return the path whose mapping ``/proc/self/maps`` shows once a reader is open."""
        return None

    def index_key(self, identity: Any = None) -> str | None:
        """Return a key for caching what was derived from the source at ``identity`` (default:
        its identity now) on disk; ``None``: not cached on disk."""
        return None

    def local_path(self) -> str | None:
        """Return the absolute path a manifest in its directory may list (``None``: none)."""
        return None

    @contextlib.contextmanager
    def for_child(self) -> Iterator[Source]:
        """Yield a source a fresh interpreter can open (picklable by value)."""
        yield self


@dataclass(frozen=True)
class LocalFile(Source):
    """A TsFile on a local file system, by path."""

    path: str

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.path

    @property
    def key(self) -> str:
        return os.path.realpath(self.path)

    @property
    def can_map(self) -> bool:  # type: ignore[override]
        try:
            return stat.S_ISREG(os.stat(self.path).st_mode)
        except OSError:
            return False

    def size(self) -> int:
        return os.stat(self.path).st_size

    def identity(self) -> FileIdentity:
        """Return the file's :class:`~tsfile_torch.sources.content.FileIdentity` now."""
        return FileIdentity.of(self.path)

    def local_path(self) -> str:
        return os.path.abspath(self.path)

    def check_unchanged(self, identity: FileIdentity | None) -> FileIdentity | None:
        """Raise TsFileFormatError unless the file still has ``identity``'s content.

        Size, mtime, inode and device must be equal; a move of ctime alone is resolved as
        Note: content-relevant identity (:mod:`tsfile_torch.sources.content`) says, and the
        identity to compare with from then on is returned.
        """
        try:
            st = os.stat(self.path)
        except OSError as err:
            raise TsFileFormatError(
                f"{self.name}: file disappeared while in use ({err}); files must not be moved "
                f"or deleted while a dataset reads them: rebuild the dataset"
            ) from err
        if identity is None:
            return None
        now = stat_fields(st)
        if now == identity.fields:
            return identity
        if now[:4] != identity.fields[:4]:
            what = [
                n
                for n, a, b in zip(FileIdentity.FIELDS, identity.fields, now, strict=True)
                if a != b
            ]
            raise self._changed(f"{', '.join(what)} changed; size {identity.size} -> {now[0]}")
        return self._ctime_moved(identity, FileIdentity.of(self.path, st))

    def _ctime_moved(self, was: FileIdentity, now: FileIdentity) -> FileIdentity:
        """Accept a move of ctime alone, or raise (Note: content-relevant identity)."""
        if was.content is not None:  # the full content hash is known: compare it
            digest = file_hash(self.path, self.name, now.fields, self.index_key(now))
            if digest != was.content:
                raise self._changed(
                    "ctime changed alone, but the content hash differs from the one verified "
                    "when the dataset was built: the file was rewritten with its mtime restored"
                )
            return dataclasses.replace(now, content=digest)
        if now.attributes != was.attributes and now.tail == was.tail:
            return now  # chmod, chown, a hard link: the bytes that describe the file are intact
        why = (
            "and the file's head or metadata tail differs"
            if now.tail != was.tail
            else "with no change of permissions, owner or link count to explain it, as a chmod, "
            "chown or hard link would; a same-size rewrite with its mtime restored looks like "
            "this (list the files in a manifest, `tsfile-torch manifest DIR`, and a content "
            "hash tells the two apart)"
        )
        raise self._changed(f"ctime changed alone, {why}")

    def _changed(self, what: str) -> TsFileFormatError:
        return TsFileFormatError(
            f"{self.name}: file changed while in use ({what}); files must not be modified, "
            f"replaced or truncated while a dataset reads them: rebuild the dataset"
        )

    def reader_target(self) -> str:
        if not self.can_map:
            try:
                os.stat(self.path)
            except OSError as err:  # the real errno: gone, a symlink loop, no permission...
                raise os_error(self.name, err) from err
            raise TsFileFormatError(
                f"{self.name}: not a regular file; TsFiles are read from regular files or "
                f"seekable binary file objects"
            )
        _check_openable(self.path, self.name)
        return self.path

    def mapped_path(self) -> str:
        return os.path.realpath(self.path)

    def index_key(self, identity: FileIdentity | None = None) -> str:
        fields = identity.fields if identity is not None else stat_fields(os.stat(self.path))
        return repr((self.key, *fields))


@dataclass(frozen=True, eq=False)
class FileObject(Source):
    """A seekable binary file object; read through tsfile's Python callbacks (never mapped)."""

    fileobj: Any = field(repr=False)
    #: what messages call it (default: the file object's name)
    shown: str | None = None

    @property
    def name(self) -> str:  # type: ignore[override]
        name = self.shown or getattr(self.fileobj, "name", None)
        return name if isinstance(name, str) else f"<{type(self.fileobj).__name__} object>"

    @property
    def key(self) -> str:
        return f"fileobj:{id(self.fileobj)}"

    def size(self) -> int:
        pos = self.fileobj.tell()
        size = self.fileobj.seek(0, os.SEEK_END)
        self.fileobj.seek(pos)
        return size

    def reader_target(self) -> IO[bytes]:
        fh = self.fileobj
        if isinstance(fh, io.IOBase) and not fh.seekable():
            raise TsFileFormatError(
                f"{self.name}: file object is not seekable; TsFileReader needs seek()"
            )
        fh.seek(0)
        return fh

    @contextlib.contextmanager
    def for_child(self) -> Iterator[Source]:
        """A temporary copy of the bytes: a fresh interpreter cannot share a file object."""
        fd, path = tempfile.mkstemp(suffix=".tsfile")
        try:
            with os.fdopen(fd, "wb") as out:
                self.fileobj.seek(0)
                while chunk := self.fileobj.read(1 << 20):
                    out.write(chunk)
            self.fileobj.seek(0)
            yield _NamedCopy(path, self.name)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)


@dataclass(frozen=True)
class _NamedCopy(LocalFile):
    """A local copy that keeps the original's name in messages."""

    shown: str = ""

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.shown


#: errno -> what to say and what to do, for errors opening a file by path.
_ERRNO_HINTS = {
    errno.EMFILE: "too many open files (raise ulimit -n or lower max_open_files)",
    errno.ENFILE: "too many open files in the system (raise fs.file-max or lower max_open_files)",
    errno.EACCES: "permission denied (check the file's permissions)",
    errno.EPERM: "operation not permitted (check the file's permissions)",
    errno.ENOENT: "no such file (it was moved or deleted; check the path)",
    errno.ELOOP: "a symlink loop (ELOOP: its symbolic links point at each other; fix the links)",
}


def os_error(name: str, err: OSError) -> TsFileFormatError:
    """Return a TsFileFormatError for ``err`` that keeps its errno and says what to do."""
    hint = _ERRNO_HINTS.get(err.errno, err.strerror or str(err))
    out = TsFileFormatError(f"{name}: cannot open: {hint} [errno {err.errno}]")
    out.errno = err.errno
    return out


def _check_openable(path: str, name: str) -> None:
    """Open and close ``path`` once so that errno survives (tsfile's own error drops it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise os_error(name, err) from err
    os.close(fd)


def file_url_path(url: str) -> str:
    """Return the local path (or glob) of a ``file://`` URL."""
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise RemoteError(f"{url}: a file:// URL names a local path: file:///abs/path")
    return unquote(parsed.path)


# -- the registry -----------------------------------------------------------------------------
#: (recognizer, expander): the first recognizer that accepts an item expands it into sources
_KINDS: list[tuple[Callable[[Any], bool], Callable[[Any, Any], list[Source]]]] = []


def register(recognizes: Callable[[Any], bool], expand: Callable[[Any, Any], list[Source]]) -> None:
    """Add a source kind: ``expand(item, remote_options)`` for items ``recognizes(item)`` accepts.

    Kinds registered later are tried first.
    """
    _KINDS.insert(0, (recognizes, expand))


def _expand_local(item: str | os.PathLike, remote_options) -> list[Source]:
    path = os.fspath(item)
    if path.startswith("file://"):
        path = file_url_path(path)
    if os.path.isdir(path):
        pattern = os.path.join(glob.escape(path), "*.tsfile")
        found = sorted(p for p in glob.glob(pattern) if not os.path.isdir(p))
        if not found:
            raise TsFileFormatError(
                f"{path}: directory holds no *.tsfile files; point at a directory of "
                f"TsFiles, a file, or a glob pattern"
            )
        return [LocalFile(p) for p in found]
    if os.path.exists(path):
        return [LocalFile(path)]
    if glob.has_magic(path):  # "**" matches any depth of folders, none included
        found = sorted(p for p in glob.glob(path, recursive=True) if not os.path.isdir(p))
        if not found:
            raise TsFileFormatError(f"{path}: glob pattern matches no files")
        return [LocalFile(p) for p in found]
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise os_error(path, err) from err
    raise TsFileFormatError(f"{path}: no such file or directory; check the path")


register(lambda item: isinstance(item, (str, os.PathLike)), _expand_local)
register(lambda item: hasattr(item, "read") and hasattr(item, "seek"), lambda f, _: [FileObject(f)])
register(lambda item: isinstance(item, Source), lambda s, _: [s])


def as_source(item: Any) -> Source:
    """Return one path or file object as a :class:`Source` (no directory or glob expansion)."""
    if isinstance(item, Source):
        return item
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        if path.startswith("file://"):
            path = file_url_path(path)
        return LocalFile(path)
    if hasattr(item, "read") and hasattr(item, "seek"):
        return FileObject(item)
    raise TypeError(f"a source must be a path or a binary file object; got {item!r}")


def expand_sources(sources: Any, remote_options=None) -> list[Source]:
    """Expand paths, directories (their ``*.tsfile``, sorted), globs, URLs and file objects.

    Local globs are recursive: ``data/**/*.tsfile`` is every ``*.tsfile`` under ``data/``.

    Args:
        sources: one item or a list of them.
        remote_options: :class:`~tsfile_torch.sources.remote.RemoteOptions` for URLs.

    Raises:
        TypeError: an item of no known kind.
        TsFileFormatError: a path does not exist, a directory holds no ``*.tsfile``, a glob
            matches nothing, or nothing was given. RemoteError: a URL cannot be listed.
    """
    if isinstance(sources, (str, os.PathLike, Source)) or hasattr(sources, "read"):
        sources = [sources]
    if not isinstance(sources, Sequence) or isinstance(sources, (bytes, bytearray)):
        raise TypeError(
            f"sources must be a path, a directory, a glob pattern, a URL, a binary file object "
            f"or a list of them; got {type(sources).__name__}"
        )
    out: dict[str, Source] = {}
    for item in sources:
        for recognizes, expand in _KINDS:
            if recognizes(item):
                for source in expand(item, remote_options):
                    out.setdefault(source.key, source)
                break
        else:
            raise TypeError(
                f"each source must be a path, a URL or a binary file object; got {item!r}"
            )
    if not out:
        raise TsFileFormatError("no sources given; pass at least one TsFile path")
    return list(out.values())
