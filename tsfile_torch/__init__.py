"""tsfile-torch: PyTorch datasets over Apache TsFile files, with selectable read backends."""

from __future__ import annotations

from . import forkfix  # noqa: F401 - the fork fix must be installed at import
from .backend import BACKENDS, open_reader, parse_backend
from .catalog import Catalog, build_catalog
from .datasets import TsFileDataset, TsFileIterableDataset
from .errors import (
    MappingError,
    SchemaError,
    TsFileFormatError,
    TsFileTorchError,
    WorkerError,
)
from .loader import make_loader
from .options import CACHE_MODES, DatasetOptions
from .reader import BatchReader

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "CACHE_MODES",
    "BatchReader",
    "Catalog",
    "DatasetOptions",
    "MappingError",
    "SchemaError",
    "TsFileDataset",
    "TsFileFormatError",
    "TsFileIterableDataset",
    "TsFileTorchError",
    "WorkerError",
    "build_catalog",
    "make_loader",
    "open_reader",
    "parse_backend",
]
