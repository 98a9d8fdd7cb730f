"""Error types raised by tsfile-torch.

Every error names the file, column or argument at fault, the rule that was broken and what to do.
"""

from __future__ import annotations

__all__ = [
    "SKIP_HINT",
    "TsFileTorchError",
    "TsFileFormatError",
    "MappingError",
    "SchemaError",
    "RemoteError",
    "WorkerError",
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


#: What to do about a file found damaged while a dataset reads it: the end of every such message.
SKIP_HINT = (
    "rebuild the dataset with on_damaged='skip' to leave damaged files out (a file a read "
    "found damaged is remembered), or check the files with `tsfile-torch verify`"
)
