"""Error types raised by tsfile-torch.

Every error names the file, column or argument at fault, the rule that was broken and what to do.
"""

from __future__ import annotations

import errno
import inspect
import os
import sys
import warnings
from dataclasses import dataclass

__all__ = [
    "SKIP_HINT",
    "TsFileTorchError",
    "TsFileFormatError",
    "MappingError",
    "SchemaError",
    "RemoteError",
    "WorkerError",
    "ResourceError",
    "CacheDirError",
    "CacheMismatchWarning",
    "FileProblem",
    "shared_memory",
    "warn_caller",
]


class TsFileTorchError(Exception):
    """Base class of every error raised by tsfile-torch."""


class TsFileFormatError(TsFileTorchError):
    """A source is missing, unreadable, not a TsFile, truncated or changed while in use."""


class MappingError(TsFileTorchError):
    """The ``mmap`` read backend was asked for a source that cannot be memory-mapped."""


class SchemaError(TsFileTorchError):
    """The selected columns cannot form one table: unknown, non-numeric or misaligned columns."""


class RemoteError(TsFileFormatError):
    """A remote source (fsspec URL) cannot be listed or fetched, or fsspec is not installed."""


class WorkerError(TsFileTorchError):
    """A DataLoader worker died or stalled; the message names the file and rows it was reading."""


class ResourceError(TsFileTorchError):
    """This process ran short of memory, shared memory (``/dev/shm``) or threads.

    Nothing is wrong with the files: a ResourceError is never remembered as a file's damage
    (Note: damage and exhaustion in :mod:`tsfile_torch.native.guard`). The message names what
    ran out, how much there is, and what to change.
    """


class CacheDirError(TsFileTorchError):
    """A cache directory is not private: another user owns it, or group / others may write it.

    Decoded rows, local copies of URL sources and timeline indexes in such a directory could
    be swapped by someone else (Note: private caches in :mod:`tsfile_torch.sources.cachedir`).
    The message names the directory and how to make it private or share it with a group.
    """


class CacheMismatchWarning(UserWarning):
    """A cache entry failed its seal or checks: it was read from the source again.

    A block of the decoded disk cache (decoded again), a saved timeline index (learned again)
    or the local copy of a URL source (downloaded again). The message names the cache entry
    file (the TsFile is not at fault). Turn it into an error with
    ``warnings.simplefilter("error", CacheMismatchWarning)``.
    """


#: What to do about a file found damaged while a dataset reads it: the end of every such message.
SKIP_HINT = (
    "rebuild the dataset with on_damaged='skip' to leave damaged files out (a file a read "
    "found damaged is remembered), or check the files with `tsfile-torch verify`"
)


@dataclass(frozen=True)
class FileProblem:
    """A file found damaged (by its manifest, the validation child or its metadata) and why.

    Defined here, below every layer that finds one: the catalog (unreadable metadata) and
    :mod:`tsfile_torch.integrity` (manifests, validation, screening).
    """

    name: str
    reason: str

    def error(self) -> TsFileFormatError:
        return TsFileFormatError(f"{self.name}: {self.reason}")

    @classmethod
    def of(cls, name: str, err: BaseException) -> FileProblem:
        """Return the problem ``err`` describes (its message without the leading file name)."""
        text = str(err)
        reason = text[len(name) + 2 :] if text.startswith(f"{name}: ") else text
        if not isinstance(err, TsFileTorchError):
            reason = f"{type(err).__name__}: {reason}"
        return cls(name, reason)


def warn_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn at the first frame outside tsfile_torch: the user's line that built the dataset.

    How many frames lie between a warning and the user's call depends on the dataset kind and
    on the path taken (rows build through one more constructor than windows, a check may run in
    a helper of a helper); counting them by hand pointed warnings one frame too far.
    """
    if sys.version_info >= (3, 12):
        warnings.warn(message, category, skip_file_prefixes=(_PACKAGE_DIR,))
        return
    frame, level = inspect.currentframe(), 1  # level 1 is this function's frame
    while frame is not None and frame.f_globals.get("__name__", "").startswith("tsfile_torch"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


#: the package's directory: frames of files under it are tsfile_torch's (warn_caller)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def shared_memory(make, *args, what: str):
    """Return ``make(*args)``: a ``multiprocessing.sharedctypes`` array or value for ``what``.

    Shared memory is a file (in ``/dev/shm``, else the temporary directory) that
    multiprocessing extends to its size, so a process file-size limit (``ulimit -f``,
    ``RLIMIT_FSIZE``) smaller than it stops a dataset build with a bare ``[Errno 27] File too
    large``: that is a :class:`TsFileTorchError` saying which limit and what to do.
    """
    try:
        return make(*args)
    except OSError as err:
        if err.errno != errno.EFBIG:
            raise
        try:
            import resource

            soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
        except (ImportError, OSError, ValueError):
            limit = "unknown"
        raise TsFileTorchError(
            f"cannot create the shared memory for {what}: this process's file-size limit "
            f"(RLIMIT_FSIZE, `ulimit -f`; now {limit}) is smaller than the file that "
            f"multiprocessing backs it with; raise the limit (`ulimit -f unlimited`, or "
            f"resource.setrlimit(resource.RLIMIT_FSIZE, ...) in the launcher) [errno "
            f"{err.errno}]"
        ) from err
