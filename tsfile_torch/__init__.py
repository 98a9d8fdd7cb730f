"""tsfile-torch: PyTorch datasets over Apache TsFile files, with selectable read backends.

Public names are imported on first use (PEP 562), so ``import tsfile_torch.sources`` or a
validation child does not pay for torch.
"""

from __future__ import annotations

import importlib

from tsfile_torch.native import forkfix  # noqa: F401 - the fork fix is registered at import

__version__ = "0.1.0"

_PUBLIC = {
    "BACKENDS": "tsfile_torch.native.backend",
    "open_reader": "tsfile_torch.native.backend",
    "parse_backend": "tsfile_torch.native.backend",
    "Catalog": "tsfile_torch.catalog.build",
    "build_catalog": "tsfile_torch.catalog.build",
    "DeviceInfo": "tsfile_torch.catalog.listing",
    "DeviceListing": "tsfile_torch.catalog.listing",
    "list_devices": "tsfile_torch.catalog.listing",
    "EpochSampler": "tsfile_torch.data.view",
    "TsFileDataset": "tsfile_torch.data.rows",
    "TsFileIterableDataset": "tsfile_torch.data.rows",
    "TsFileWindowDataset": "tsfile_torch.data.windows",
    "TsFileSeriesDataset": "tsfile_torch.data.series",
    "WindowBatch": "tsfile_torch.data.windows",
    "MixedWindows": "tsfile_torch.data.mixture",
    "WindowInfo": "tsfile_torch.data.windows",
    "collate_windows": "tsfile_torch.data.windows",
    "Normalizer": "tsfile_torch.data.normalize",
    "DeviceNormalizer": "tsfile_torch.data.normalize",
    "CacheDirError": "tsfile_torch.errors",
    "CacheMismatchWarning": "tsfile_torch.errors",
    "MappingError": "tsfile_torch.errors",
    "RemoteError": "tsfile_torch.errors",
    "ResourceError": "tsfile_torch.errors",
    "SchemaError": "tsfile_torch.errors",
    "TsFileFormatError": "tsfile_torch.errors",
    "TsFileTorchError": "tsfile_torch.errors",
    "WorkerError": "tsfile_torch.errors",
    "make_loader": "tsfile_torch.loader",
    "CACHE_MODES": "tsfile_torch.options",
    "ReadOptions": "tsfile_torch.options",
    "ORDERS": "tsfile_torch.sampling.orders",
    "synthetic": "tsfile_torch.synthetic",
    "hf": "tsfile_torch.hf",
    "process": "tsfile_torch.process",
    "write_dataframe": "tsfile_torch.convert",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'tsfile_torch' has no attribute {name!r}")
    if module == f"tsfile_torch.{name}":
        value = importlib.import_module(module)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
