"""tsfile-torch: PyTorch datasets over Apache TsFile files, with selectable read backends."""

from __future__ import annotations

from .backend import BACKENDS, open_reader, parse_backend
from .catalog import Catalog, build_catalog
from .datasets import EpochSampler, TsFileDataset, TsFileIterableDataset
from .errors import (
    MappingError,
    RemoteError,
    SchemaError,
    TsFileFormatError,
    TsFileTorchError,
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
    "EpochSampler",
    "MappingError",
    "RemoteError",
    "SchemaError",
    "TsFileDataset",
    "TsFileFormatError",
    "TsFileIterableDataset",
    "TsFileTorchError",
    "build_catalog",
    "make_loader",
    "open_reader",
    "parse_backend",
]
