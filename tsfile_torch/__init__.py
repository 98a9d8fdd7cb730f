"""tsfile-torch: PyTorch datasets over Apache TsFile files, with selectable read backends."""

from __future__ import annotations

from tsfile_torch.catalog.build import Catalog, build_catalog
from tsfile_torch.data.normalize import Normalizer
from tsfile_torch.data.rows import EpochSampler, TsFileDataset, TsFileIterableDataset
from tsfile_torch.data.windows import (
    TsFileWindowDataset,
    WindowBatch,
    WindowBatchSampler,
    WindowInfo,
    collate_windows,
    make_window_loader,
)
from tsfile_torch.errors import (
    MappingError,
    RemoteError,
    SchemaError,
    TsFileFormatError,
    TsFileTorchError,
    WorkerError,
)
from tsfile_torch.loader import make_loader
from tsfile_torch.native import forkfix  # noqa: F401 - the fork fix must be installed at import
from tsfile_torch.native.backend import BACKENDS, open_reader, parse_backend
from tsfile_torch.options import CACHE_MODES, DatasetOptions
from tsfile_torch.read.reader import BatchReader

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
