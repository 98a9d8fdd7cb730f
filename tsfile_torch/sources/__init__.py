"""Sources: the :class:`Source` protocol and its one registry (local path, file object, URL)."""

from tsfile_torch.sources import remote  # noqa: F401 - registers URL sources (Note: one registry)
from tsfile_torch.sources.base import (
    FileObject,
    LocalFile,
    Source,
    SourceLike,
    as_source,
    expand_sources,
)

__all__ = ["FileObject", "LocalFile", "Source", "SourceLike", "as_source", "expand_sources"]
