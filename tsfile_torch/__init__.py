"""tsfile-torch: PyTorch datasets over Apache TsFile files, with selectable read backends."""

from __future__ import annotations

from . import forkfix  # noqa: F401 - the fork fix must be installed at import
from .backend import BACKENDS, open_reader, parse_backend
from .catalog import Catalog, build_catalog
from .datasets import EpochSampler, TsFileDataset, TsFileIterableDataset
from .errors import (
    MappingError,
    RemoteError,
    SchemaError,
    TsFileFormatError,
    TsFileTorchError,
    WorkerError,
)
from .loader import make_loader
from .normalize import Normalizer
from .options import CACHE_MODES, DatasetOptions
from .reader import BatchReader
from .windows import (
    TsFileWindowDataset,
    WindowBatch,
    WindowBatchSampler,
    WindowInfo,
    collate_windows,
    make_window_loader,
)

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
    "Normalizer",
    "SchemaError",
    "TsFileDataset",
    "TsFileFormatError",
    "TsFileIterableDataset",
    "TsFileTorchError",
    "TsFileWindowDataset",
    "WindowBatch",
    "WindowBatchSampler",
    "WindowInfo",
    "WorkerError",
    "build_catalog",
    "collate_windows",
    "make_loader",
    "make_window_loader",
    "open_reader",
    "parse_backend",
]
