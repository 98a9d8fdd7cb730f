"""Cache directories: private, bounded in bytes, shared by processes: one lock, one eviction.

Three caches keep files on disk for every process of a machine: the local copies of URL sources
(:mod:`tsfile_torch.sources.remote`), the decoded disk cache
(:mod:`tsfile_torch.read.diskcache`) and the timeline indexes
(:mod:`tsfile_torch.read.timeline`). Both byte-bounded ones create an entry under an ``fcntl``
lock (:func:`file_lock`) and, under a directory-wide lock, first delete the least recently used
entries until the new one fits in the bound (:func:`make_room`). Where ``fcntl`` is missing
the lock is another kind (Note: lock kinds). Last use is an entry's mtime
(or its record's): each cache touches an entry when it opens it. Deleting an entry another
process has open or mapped is safe on POSIX: its data stays until closed.

Note: private caches. What a cache hands back is served as if it came from the TsFiles, so only
its user may write it:

- **Directories** are made 0700 (every missing component), files 0600. A directory that exists
  is used only when this user owns it and neither its group nor others may write it
  (:func:`private_dir`); else :class:`~tsfile_torch.errors.CacheDirError` names it and the fix.
- **Group share, on purpose only**: a setgid directory (``chgrp GROUP DIR && chmod 2770 DIR``)
  may be used by its owner and the members of its group; directories made in it are 2770,
  files 0660 (the key 0640): each member can write what the others read, by the owner's choice.
  Others may never write. Without the setgid bit, a group-writable directory is refused (a
  umask of 002 makes those by accident).
- **No link followed**: files are created ``O_CREAT | O_EXCL | O_NOFOLLOW``
  (:func:`create_file`) under the lock that makes their name this process's; a name already
  taken (a file left by a dead process with the same pid, a planted symlink) is unlinked, never
  followed, and created afresh. Lock files are opened ``O_NOFOLLOW`` (a symlink there is
  removed) and must be regular files; temporary files come from ``mkstemp``.
- **Seals** are HMAC-SHA256 with a 32-byte secret kept in each cache directory
  (:data:`KEY_NAME`, 0600; 0640 in a group share; :func:`secret`): who cannot read it cannot
  seal. A key that others could read is replaced (what it sealed is then made again). Small
  files (indexes, records of downloads) carry a trailer (:func:`seal`, :func:`unseal`); the
  decoded cache seals each block (Note: checked blocks in :mod:`tsfile_torch.read.diskcache`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import logging
import os
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from tsfile_torch.errors import CacheDirError

__all__ = [
    "KEY_NAME",
    "SEAL_BYTES",
    "CacheDir",
    "SealError",
    "create_file",
    "file_lock",
    "key_id",
    "lock_kind",
    "mac",
    "make_room",
    "private_dir",
    "seal",
    "secret",
    "set_mode",
    "unseal",
]

logger = logging.getLogger(__name__)

#: The secret that seals a cache directory's files, in that directory (Note: private caches).
KEY_NAME = ".tsfile-torch-key"
_KEY_BYTES = 32
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_SHARE_HINT = "docs/disk-cache.md, 'Sharing a cache directory'"


@dataclass(frozen=True)
class CacheDir:
    """A cache directory checked by :func:`private_dir`: private, or a group share."""

    path: str
    shared: bool = False

    @property
    def file_mode(self) -> int:
        """Mode of the files a cache creates here (0600; 0660 in a group share)."""
        return 0o660 if self.shared else 0o600

    @property
    def dir_mode(self) -> int:
        """Mode of the directories a cache makes here (0700; 2770 in a group share)."""
        return 0o2770 if self.shared else 0o700


def _is_group_share(st: os.stat_result) -> bool:
    return bool(st.st_mode & stat.S_ISGID) and not st.st_mode & stat.S_IWOTH


def private_dir(path: str, tighten: bool = False) -> CacheDir:
    """Return the cache directory ``path``, made if missing, once checked private (Note: private
    caches).

    Args:
        path: the directory.
        tighten: make it 0700 if it is this user's and others may read it (the directories
            under ``$XDG_CACHE_HOME/tsfile-torch`` and ``<cache_dir>/decoded``, which earlier
            versions made 0755; never a ``cache_dir`` the user named).

    Raises:
        CacheDirError: another user owns it, or group / others may write it (not a group share).
        OSError: it cannot be made.
    """
    path = os.path.abspath(path)
    missing = []
    probe = path
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        missing.append(probe)
        probe = os.path.dirname(probe)
    shared = bool(missing) and hasattr(os, "geteuid") and _is_group_share(os.stat(probe))
    for made in reversed(missing):
        try:
            os.mkdir(made, 0o700)
        except FileExistsError:
            continue  # another process made it (checked below if it is the last)
        if shared:  # mkdir's mode passes through the umask and drops setgid
            os.chmod(made, 0o2770)
    return _checked(path, tighten)


def _checked(path: str, tighten: bool) -> CacheDir:
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheDirError(f"cache directory {path!r} is not a directory; pass a directory")
    if not hasattr(os, "geteuid"):  # no POSIX owners and modes (Windows)
        return CacheDir(path)
    uid, mode = os.geteuid(), stat.S_IMODE(st.st_mode)
    if _is_group_share(st) and (st.st_uid == uid or st.st_gid in _groups()):
        return CacheDir(path, shared=True)
    if st.st_uid != uid:
        raise CacheDirError(
            f"cache directory {path!r} is owned by uid {st.st_uid}{_user(st.st_uid)}, not by "
            f"you (uid {uid}): what another user can write into a cache would be handed to you "
            f"as data; use a directory of your own (cache_dir= / index_cache=), or have its "
            f"owner share it with your group on purpose (chgrp GROUP DIR && chmod 2770 DIR; "
            f"{_SHARE_HINT})"
        )
    if mode & 0o022:
        raise CacheDirError(
            f"cache directory {path!r} is writable by {'others' if mode & 0o002 else 'group'} "
            f"(mode {mode:04o}): what they write into it would be handed to you as data; make "
            f"it private (chmod 700 {path!r}) or share it with its group on purpose "
            f"(chmod 2770 {path!r}; {_SHARE_HINT})"
        )
    if tighten and mode & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError as err:  # a read-only file system: nothing can be written there anyway
            logger.info("cannot make %s private (%s)", path, err)
    return CacheDir(path)


def _groups() -> set[int]:
    return {os.getegid(), *os.getgroups()}


def _user(uid: int) -> str:
    try:
        import pwd

        return f" ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return ""


def create_file(path: str, mode: int = 0o600) -> int:
    """Create ``path`` and return a read-write descriptor, never through a link.

    Call it under the lock that makes the name this process's (Note: private caches): a name
    already taken is a leftover or a planted link, unlinked (not followed) and created afresh.
    The mode is set whatever the umask.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        os.unlink(path)
        logger.info("%s existed (a leftover, or a link): removed, created afresh", path)
        fd = os.open(path, flags, mode)
    try:
        set_mode(fd, path, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def set_mode(fd: int, path: str, mode: int) -> None:
    """Set the mode of open file ``fd`` (at ``path``): ``os.fchmod`` where the platform has it,
    else ``os.chmod`` of the path (Windows before Python 3.13, which keeps only a read-only
    bit)."""
    fchmod = getattr(os, "fchmod", None)
    if fchmod is not None:
        fchmod(fd, mode)
    else:
        os.chmod(path, mode)


def _open_lock(path: str) -> int:
    """Open (create) the lock file ``path`` without following a link; a link there is removed."""
    try:  # 0660 in a group share, whose members lock it too
        mode = 0o660 if _is_group_share(os.stat(os.path.dirname(path) or ".")) else 0o600
    except OSError:
        mode = 0o600
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC, mode)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.EMLINK) or not os.path.islink(path):
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            logger.warning("%s was a symbolic link: removed, not followed", path)
            continue
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            if mode != 0o600 and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != mode:
                with contextlib.suppress(OSError):
                    set_mode(fd, path, mode)  # the umask took the group's write bit
            return fd
        os.close(fd)
        raise OSError(errno.EINVAL, "a lock file must be a regular file", path)
    raise OSError(errno.ELOOP, "a symbolic link keeps reappearing at a lock's name", path)


def lock_kind() -> str:
    """Return how :func:`file_lock` locks here (Note: lock kinds): ``"flock"`` (POSIX),
    ``"msvcrt"`` (Windows) or ``"exclusive-file"`` (neither)."""
    for module, kind in (("fcntl", "flock"), ("msvcrt", "msvcrt")):
        try:
            __import__(module)
        except ImportError:
            continue
        return kind
    return "exclusive-file"


#: seconds between tries while waiting for a lock that cannot be waited on in the kernel
_LOCK_POLL_S = 0.05


def _try_lock(fd: int, blocking: bool) -> bool:
    """Lock the open lock file ``fd`` (Note: lock kinds); False: held elsewhere, not waited."""
    try:
        import fcntl
    except ImportError:
        import msvcrt  # Windows: a lock on the file's first byte, released at close

        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return True
            except OSError:  # held: LK_LOCK would give up after 10 s, so wait here
                if not blocking:
                    return False
                time.sleep(_LOCK_POLL_S)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def file_lock(path: str, blocking: bool = True) -> Iterator[bool]:
    """Hold an exclusive lock on ``path`` (created if absent) across processes.

    Note: lock kinds. Where ``fcntl`` exists, an ``flock``; on Windows, ``msvcrt.locking`` on
    the file's first byte; both released by the kernel when the process dies: no stale lock
    files to clean up. Where neither exists, ``path + ".held"`` created ``O_EXCL`` holding the
    pid (:func:`_exclusive_lock`). :func:`lock_kind` says which one acts. Yields True once
    held; with ``blocking=False`` it does not wait and yields False when another open file
    holds it (in this process too: ``flock`` locks belong to an open file). A lock file deleted
    while this process waited for it (``tsfile-torch cache clear`` deletes free ones, under
    their lock) is opened again, so two processes never hold two files of one name.
    """
    if lock_kind() == "exclusive-file":
        with _exclusive_lock(path, blocking) as held:
            yield held
        return
    while True:
        fd = _open_lock(path)
        try:
            locked = _try_lock(fd, blocking)
        except BaseException:
            os.close(fd)
            raise
        if not locked:
            os.close(fd)
            yield False
            return
        held = os.fstat(fd)
        try:
            now = os.stat(path, follow_symlinks=False)
            same = (now.st_ino, now.st_dev) == (held.st_ino, held.st_dev)
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the name was deleted (or replaced) while we waited: lock what is there
    try:
        yield True
    finally:
        if lock_kind() == "msvcrt":
            import msvcrt

            with contextlib.suppress(OSError):
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)  # at close "not at once" on Windows
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def _exclusive_lock(path: str, blocking: bool) -> Iterator[bool]:
    """Hold ``path + ".held"``, created ``O_CREAT | O_EXCL | O_NOFOLLOW`` holding this pid
    (Note: lock kinds). Stale rule: a held file whose pid is no running process on this
    machine (a process that died holding it) is removed and taken; one that cannot be read
    (being written) is waited for."""
    held = path + ".held"
    mode = 0o660 if _is_group_share(os.stat(os.path.dirname(path) or ".")) else 0o600
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    while True:
        try:
            fd = os.open(held, flags, mode)
        except FileExistsError:
            if _stale(held):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(held)
                logger.info("%s: its process is gone: a stale lock, removed", held)
                continue
            if not blocking:
                yield False
                return
            time.sleep(_LOCK_POLL_S)
            continue
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)
        break
    try:
        yield True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(held)


def _stale(held: str) -> bool:
    """Whether the lock file ``held`` names a process that no longer runs."""
    try:
        with open(held, "rb") as fh:
            pid = int(fh.read(32) or b"0")
    except (OSError, ValueError):
        return False  # gone or being written: try again
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError):
        return False  # another user's running process, or no way to ask
    return False


# -- the key and seals (Note: private caches) -------------------------------------------------
class SealError(Exception):
    """A sealed file that does not verify. ``forged``: it carries a seal of this directory's
    key that does not match its bytes (not merely an older format or another key)."""

    def __init__(self, text: str, forged: bool = False):
        super().__init__(text)
        self.forged = forged


def secret(directory: CacheDir) -> bytes:
    """Return the secret that seals ``directory``'s files, made on first use.

    Read each time (a few microseconds), so a key made anew by another process is seen.

    Raises:
        OSError: it cannot be read or made (a read-only directory without one).
    """
    path = os.path.join(directory.path, KEY_NAME)
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            _new_secret(directory, path)
            continue
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.EMLINK):
                raise
            fd = -1
        if fd >= 0:
            try:
                st, data = os.fstat(fd), os.read(fd, _KEY_BYTES + 1)
            finally:
                os.close(fd)
            if _trusted_key(st, directory) and len(data) == _KEY_BYTES:
                return data
        logger.warning(
            "%s: the cache key was a link, not %d bytes, or readable / writable by others: "
            "made anew (what it sealed is made again)",
            path,
            _KEY_BYTES,
        )
        os.unlink(path)
    raise OSError(errno.EAGAIN, "the cache key keeps changing", path)


def _trusted_key(st: os.stat_result, directory: CacheDir) -> bool:
    if not stat.S_ISREG(st.st_mode):
        return False
    if not hasattr(os, "geteuid"):
        return True
    if directory.shared:
        return not st.st_mode & 0o027
    return st.st_uid == os.geteuid() and not st.st_mode & 0o077


def _new_secret(directory: CacheDir, path: str) -> None:
    """Write a new key beside ``path`` and link it there, unless another process was first."""
    fd, tmp = tempfile.mkstemp(dir=directory.path, prefix=".key-")
    try:
        set_mode(fd, tmp, 0o640 if directory.shared else 0o600)
        os.write(fd, secrets.token_bytes(_KEY_BYTES))
        os.close(fd)
        fd = -1
        try:
            os.link(tmp, path)  # never replaces a key another process made meanwhile
        except FileExistsError:
            pass
        except OSError:  # a file system without hard links
            if not os.path.exists(path):
                os.rename(tmp, path)
    finally:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def mac(key: bytes, *parts) -> bytes:
    """Return the HMAC-SHA256 of ``parts`` (bytes-like) under ``key``."""
    digest = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        digest.update(part)
    return digest.digest()


def key_id(key: bytes) -> str:
    """Return a public name of ``key`` (16 hex digits): which key sealed a file."""
    return mac(key, b"tsfile-torch cache key id").hex()[:16]


_SEAL_MAGIC = b"TSFTMAC1"
#: Bytes :func:`seal` appends: magic, key id, HMAC-SHA256.
SEAL_BYTES = 8 + 8 + 32


def seal(key: bytes, data: bytes, context: str) -> bytes:
    """Return ``data`` followed by its seal under ``key``; ``context`` (the file's name in its
    cache) is sealed too, so the bytes of one entry do not verify under another's name."""
    tag = mac(key, context.encode(), b"\0", data)
    return data + _SEAL_MAGIC + bytes.fromhex(key_id(key)) + tag


def unseal(key: bytes, raw: bytes, context: str) -> bytes:
    """Return the data of ``raw`` as :func:`seal` made it.

    Raises:
        SealError: no seal (an older format), another key's, or (``forged``) a seal of this key
            that does not match the bytes.
    """
    data, trailer = raw[:-SEAL_BYTES], raw[-SEAL_BYTES:]
    if len(raw) < SEAL_BYTES or not trailer.startswith(_SEAL_MAGIC):
        raise SealError("not sealed (written by an earlier version?)")
    if trailer[8:16].hex() != key_id(key):
        raise SealError("sealed with another cache key (its key file was made anew)")
    if not hmac.compare_digest(trailer[16:], mac(key, context.encode(), b"\0", data)):
        raise SealError("its seal does not match its bytes (changed after written)", True)
    return data


def make_room(
    entries: Iterable[tuple[float, int, str]],
    need: int,
    limit: int,
    keep: Callable[[str], bool] | None = None,
    what: str = "cache",
) -> int:
    """Delete least recently used entries until ``need`` more bytes fit in ``limit`` bytes.

    Call it under the directory's lock. An entry already gone counts as deleted.

    Args:
        entries: ``(last use, bytes, path)`` of every entry the bound counts (in-flight
            downloads included: they reserved their size).
        need: bytes of the entry about to be created.
        limit: the bound.
        keep: ``keep(path)`` is True for an entry that must stay (another process is writing
            it); ``None``: none.
        what: what log messages call the cache.

    Returns:
        The bytes the remaining entries use (more than ``limit - need`` when kept entries, or
        ``need`` itself, leave no room).
    """
    entries = sorted(entries)
    used = sum(size for _, size, _ in entries)
    for _, size, path in entries:
        if used + need <= limit:
            break
        if keep is not None and keep(path):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            logger.debug("%s full: deleted %s (%d bytes)", what, path, size)
        used -= size
    return used
