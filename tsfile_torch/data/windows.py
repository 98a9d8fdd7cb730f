"""Forecasting windows per device: :class:`TsFileWindowDataset`, the window kind of the core.

A device is a table-model device (table + tag values, ``meters.s0``) or a tree-model device
(``root.sg.d1``); its rows are one table of the reading core (its fields, positional or aligned
on time with ``align=``; a device continued across files is one device). Item ``i`` is
``context_length`` consecutive rows of ``columns`` and the next ``horizon`` rows of ``targets``
of one device; windows start at device rows 0, stride, 2 * stride, ... (rows inside
``start_time`` / ``end_time``) and are numbered device by device in device order.

Note: window blocks. Values are read in blocks of ``block_rows`` consecutive rows of one device
plus the ``context_length + horizon - 1`` rows after them, so every window starting in a block
lies inside it; a block is normalized once and kept in a per-process
:class:`~tsfile_torch.read.blockcache.BlockCache` of ``cache_bytes`` (default 256 MiB). A batch
of windows (``__getitems__``) fetches each block it needs once and gathers its windows with one
numpy indexing operation per block. The orders of :mod:`tsfile_torch.sampling.orders` see a
block as the windows starting in it, so ``order="shuffle"`` mixes ``shuffle_blocks`` blocks at
a time and a process decodes each block about once per epoch. ``cache="memory"`` keeps every
device whole in the :class:`~tsfile_torch.read.memory.MemoryStore` instead (first read of a
device decodes it), and a batch from any devices is then one gather; ``cache="disk"`` is the
same store in a file mapped by every worker and later run (Note: decoded disk cache).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.catalog.build import device_name, lay_out, subset_catalog
from tsfile_torch.data.core import DatasetCore
from tsfile_torch.errors import SchemaError
from tsfile_torch.options import ReadOptions, check_int
from tsfile_torch.read.blockcache import Block, BlockCache
from tsfile_torch.sampling import orders
from tsfile_torch.sampling.orders import OrderSpec

__all__ = ["TsFileWindowDataset", "WindowBatch", "WindowInfo", "collate_windows"]

#: Device rows per decoded block (Note: window blocks): ~3 pages of the writer's defaults.
DEFAULT_WINDOW_BLOCK_ROWS = 32768
_DEFAULT_CACHE_BYTES = 256 << 20


class WindowInfo(NamedTuple):
    """Where window ``i`` comes from (``start_row``: the device's row, counted in range)."""

    device: str
    start_row: int
    start_time: int


class WindowBatch(Sequence):
    """Windows of one batch, stored stacked: a sequence of items that are views into it.

    ``default_collate`` stacks its items again (correct, one copy and one object per window);
    :func:`collate_windows` hands the stacked tensors over as they are.
    """

    def __init__(self, parts: tuple[torch.Tensor, ...]):
        self.parts = parts

    def __len__(self) -> int:
        return len(self.parts[0])

    def __getitem__(self, i):
        if len(self.parts) == 1:
            return self.parts[0][i]
        return tuple(p[i] for p in self.parts)


def collate_windows(batch):
    """``collate_fn`` for window batches: stacked tensors without a Python object per window.

    A :class:`WindowBatch` becomes ``x`` or the tuple ``(x, y, ...)`` of batched tensors;
    anything else goes to ``default_collate``.
    """
    if isinstance(batch, WindowBatch):
        return batch.parts[0] if len(batch.parts) == 1 else batch.parts
    return tud.default_collate(batch)


def _names(name: str, value) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise ValueError(f"{name} must be None or a non-empty list of names; got {value!r}")
    for v in value:
        if not isinstance(v, str):
            raise TypeError(f"{name} must hold names (str); got {v!r}")
    return tuple(dict.fromkeys(value))


def _match_devices(all_devices: list[str], patterns) -> list[str]:
    if patterns is None:
        return all_devices
    chosen: dict[str, None] = {}
    for item in patterns:
        matches = [d for d in all_devices if d == item or fnmatch.fnmatchcase(d, item)]
        if not matches:
            shown = ", ".join(all_devices[:8]) + (" ..." if len(all_devices) > 8 else "")
            raise SchemaError(f"devices: {item!r} matches no device; devices are {shown}")
        chosen.update(dict.fromkeys(matches))
    return list(chosen)


class TsFileWindowDataset(DatasetCore, tud.Dataset):
    """Map-style dataset of forecasting windows, one device at a time.

    Item ``i`` is ``(x, y)``: ``x`` of shape ``(context_length, len(columns))`` and ``y`` the next
    ``horizon`` rows of ``targets``, shape ``(horizon, len(targets))``; with ``horizon=0`` the
    item is ``x``. With ``return_timestamps=True`` the int64 timestamps of ``x`` (and ``y``)
    follow: ``(x, y, x_times, y_times)`` or ``(x, x_times)``. Batch it with
    :func:`tsfile_torch.make_loader` (``make_loader(ds, batch_size=256)``): this rank's windows
    in the dataset's order, a new epoch per pass, resumable, every guarantee of the row datasets.

    Args:
        sources: paths, directories, globs, URLs or binary file objects (as the row datasets).
        context_length: rows of ``x``, >= 1.
        horizon: rows of ``y`` after ``x``, >= 0.
        stride: rows between the starts of consecutive windows of a device, >= 1.
        columns: field names of ``x``; ``None``: every numeric field all selected devices have.
        targets: field names of ``y``; ``None``: ``columns``.
        devices: device names or glob patterns (``"meters.*"``, ``"root.sg.d1"``); ``None``: all
            devices that have every field asked for (with ``columns=None``: all devices).
        order: ``"sequential"`` (default), ``"shuffle"`` (windows shuffled within a buffer of
            ``shuffle_blocks`` blocks), ``"batches"`` (a full permutation of the windows) or
            ``"random"`` (``num_samples`` windows drawn with replacement).
        shuffle: ``True`` means ``order="shuffle"``.
        seed, drop_last, shuffle_blocks, rank, world_size: as for the row datasets.
        num_samples: windows per epoch of ``order="random"``.
        **read_options: :class:`~tsfile_torch.options.ReadOptions` fields (``read_backend``,
            ``dtype``, ``normalize`` (per field, every device alike), ``align`` / ``fill`` (for
            fields of one device with different timestamps), ``cache``, ``cache_bytes`` (the
            window-block cache, default 256 MiB), ``block_rows`` (default 32,768),
            ``start_time`` / ``end_time``, ``storage_options``, ``validate``...).

    Raises:
        ValueError, TypeError: bad arguments. SchemaError: unknown devices or fields, a device
        without a field asked for, fields on different timelines without ``align``, or no
        device long enough for one window. TsFileFormatError: unreadable sources.
    """

    kind = "window dataset"
    default_block_rows = DEFAULT_WINDOW_BLOCK_ROWS

    def __init__(
        self,
        sources,
        context_length: int,
        horizon: int = 0,
        stride: int = 1,
        columns: Sequence[str] | str | None = None,
        targets: Sequence[str] | str | None = None,
        devices: Sequence[str] | str | None = None,
        *,
        order: str | None = None,
        shuffle: bool | None = None,
        seed: int = 0,
        drop_last: bool = False,
        shuffle_blocks: int = 16,
        num_samples: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        **read_options,
    ):
        read = ReadOptions(**read_options)
        self.context_length = check_int("context_length", context_length, 1, 2**40)
        self.horizon = check_int("horizon", horizon, 0, 2**40)
        self.stride = check_int("stride", stride, 1, 2**40)
        columns, targets = _names("columns", columns), _names("targets", targets)
        patterns = _names("devices", devices)
        spec = OrderSpec(
            orders.resolve_order(order, shuffle), seed, drop_last, shuffle_blocks, num_samples
        )
        meta = self._setup(sources, read, spec, rank, world_size)

        fields_of: dict[str, dict[str, str]] = {}  # device -> field -> column name
        for col in meta.numeric:
            shard = col.shards[0]
            fields_of.setdefault(device_name(shard.device), {})[shard.measurement] = col.name
        names = _match_devices(list(fields_of), patterns)
        if columns is None:
            shared = [f for f in fields_of[names[0]] if all(f in fields_of[d] for d in names)]
            if not shared:
                raise SchemaError(
                    f"devices {names[:5]} share no numeric field; pass columns=[...] and devices="
                )
            columns = tuple(shared)
        self.columns_x = list(columns)
        self.targets = list(targets) if targets is not None else list(columns)
        self.fields = list(dict.fromkeys(self.columns_x + self.targets))
        known = set().union(*(set(fields_of[d]) for d in names))
        unknown = [f for f in self.fields if f not in known]
        if unknown:
            raise SchemaError(
                f"fields {unknown} are not numeric fields of the selected devices; their "
                f"fields are {sorted(known)}"
            )
        if patterns is None:  # every device that has the fields asked for
            names = [d for d in names if all(f in fields_of[d] for f in self.fields)]
            if not names:
                raise SchemaError(
                    f"no device has all of the fields {self.fields}; pick fields one device "
                    f"has, or name devices= to see which field each one lacks"
                )
        missing = [(d, f) for d in names for f in self.fields if f not in fields_of[d]]
        if missing:
            d, f = missing[0]
            raise SchemaError(
                f"device {d!r} has no numeric field {f!r}; select devices that have every "
                f"field in columns / targets"
            )
        catalog = lay_out(
            meta,
            [fields_of[d][f] for d in names for f in self.fields],
            read.start_time,
            read.end_time,
            shared_timeline=False,
            drop_empty=True,
        )
        kept = set(catalog.column_names)  # a device with a field empty in range has no windows
        names = [d for d in names if all(fields_of[d][f] in kept for f in self.fields)]
        if len(names) * len(self.fields) != len(kept):
            catalog = subset_catalog(catalog, [fields_of[d][f] for d in names for f in self.fields])
        width = len(self.fields)
        tables = [
            self._table(catalog, tuple(range(k * width, (k + 1) * width)), f"device {d!r}: fields")
            for k, d in enumerate(names)
        ]
        self._devices = names
        self._x_pos = [self.fields.index(f) for f in self.columns_x]
        self._y_pos = [self.fields.index(f) for f in self.targets]
        length = self.context_length + self.horizon
        spans = np.array([t.num_rows for t in tables], dtype=np.int64)
        counts = np.where(spans >= length, (spans - length) // self.stride + 1, 0)
        self._first = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if self._first[-1] == 0:
            raise SchemaError(
                f"no device has {length} rows (context_length {self.context_length} + horizon "
                f"{self.horizon}) in range; the longest has {int(spans.max())}: use shorter "
                f"windows, more data or a wider time range"
            )
        self._blocks: BlockCache | None = None
        self._finish(catalog, tables, self.fields)
        self._check_sharding(1)

    # -- items ------------------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        """Field names of ``x``."""
        return self.columns_x

    @property
    def devices(self) -> list[str]:
        """Selected device names, in window order."""
        return list(self._devices)

    def __len__(self) -> int:
        return int(self._first[-1])

    def window_counts(self) -> dict[str, int]:
        """Windows per device."""
        return {d: int(self._first[k + 1] - self._first[k]) for k, d in enumerate(self._devices)}

    def _layout(self) -> tuple[np.ndarray, int]:
        """Block starts: windows whose first row lies in one ``block_rows`` run of a device."""
        if self.order_spec.order in ("sequential", "shuffle"):
            bounds = []
            for k in range(len(self._devices)):
                first, count = int(self._first[k]), int(self._first[k + 1] - self._first[k])
                if count:
                    block = np.arange(count) * self.stride // self.block_rows
                    cuts = np.flatnonzero(np.diff(block)) + 1
                    bounds.extend((first + np.r_[0, cuts]).tolist())
            return np.array(bounds + [len(self)], dtype=np.int64), 1
        return np.array([0, len(self)], dtype=np.int64), 1

    def _batch_key(self, items: np.ndarray, batch_size: int | None) -> list[int]:
        return items.tolist()

    def _locate(self, indices) -> tuple[np.ndarray, np.ndarray]:
        """Return (device, first device row) of each window index (negative ones count back)."""
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            bad = next(
                i
                for i in np.ravel(indices)
                if isinstance(i, bool) or not isinstance(i, (int, np.integer))
            )
            raise TypeError(f"index must be an integer window number; got {bad!r}")
        idx = idx.astype(np.int64)
        n = len(self)
        bad = (idx < -n) | (idx >= n)
        if bad.any():
            raise IndexError(f"window index {int(idx[bad][0])} out of range for {n} windows")
        idx = idx % n
        k = np.searchsorted(self._first, idx, side="right") - 1
        return k, (idx - self._first[k]) * self.stride

    def window_info(self, index: int) -> WindowInfo:
        """Return (device, first device row, first timestamp) of window ``index``."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        k, row = (int(a[0]) for a in self._locate([index]))
        _, times = self._block(k, row // self.block_rows)
        return WindowInfo(self._devices[k], row, int(times[row % self.block_rows]))

    def __getitem__(self, index):
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch:
        """Return the windows ``indices`` as a :class:`WindowBatch` (Note: window blocks)."""
        if not len(indices):
            raise IndexError("__getitems__ needs at least one window index")
        self._start_epoch(self.epoch or 0)
        length = self.context_length + self.horizon
        k, row = self._locate(indices)
        steps = np.arange(length)
        dtype = np.float64 if self.options.dtype == "float64" else np.float32
        values = _batch_array((len(k), length, len(self.fields)), dtype)
        times = (
            np.empty((len(k), length), dtype=np.int64) if self.options.return_timestamps else None
        )
        store = self._device_store()
        if store is not None:  # every device kept whole, in one array: one gather
            for dk in np.unique(k):
                self._whole_device(int(dk))
            pick = (store.offsets[k] + row)[:, None] + steps
            np.take(store.values, pick, axis=0, out=values)
            if times is not None:
                times[:] = store.times[pick]
            return self._items(values, times)
        first_block = row // self.block_rows
        key = k * (1 << 40) + first_block
        order = np.argsort(key, kind="stable")
        groups = np.split(order, np.flatnonzero(np.diff(key[order])) + 1)
        # cached blocks first: decoding a missing block then evicts blocks this batch is done
        # with, never one it still needs (else a batch spanning two shuffle groups thrashes)
        cache = self._block_cache()
        groups.sort(key=lambda m: (int(k[m[0]]), int(first_block[m[0]])) not in cache)
        for members in groups:
            dk, b = int(k[members[0]]), int(first_block[members[0]])
            block_values, block_times = self._block(dk, b)
            pick = (row[members] - b * self.block_rows)[:, None] + steps
            values[members] = block_values[pick]
            if times is not None:
                times[members] = block_times[pick]
        return self._items(values, times)

    def _items(self, values: np.ndarray, times: np.ndarray | None) -> WindowBatch:
        c = self.context_length
        identity = self._x_pos == list(range(len(self.fields)))
        x = torch.from_numpy(values[:, :c] if identity else values[:, :c, self._x_pos])
        parts = [x]
        if self.horizon:
            identity = self._y_pos == list(range(len(self.fields)))
            parts.append(
                torch.from_numpy(values[:, c:] if identity else values[:, c:, self._y_pos])
            )
        if self.options.dtype not in ("float32", "float64"):
            parts = [p.to(getattr(torch, self.options.dtype)) for p in parts]
        if times is not None:
            stamps = torch.from_numpy(times)
            parts += [stamps[:, :c], stamps[:, c:]] if self.horizon else [stamps]
        return WindowBatch(tuple(parts))

    # -- blocks -----------------------------------------------------------------------------
    def _reader_overrides(self) -> dict:
        return {"cache_bytes": 0}  # blocks are cached here, assembled (Note: window blocks)

    def _block_cache(self) -> BlockCache:
        self.reader  # noqa: B018 - the cache belongs to this process's reader
        if self._blocks is None or self._blocks_pid != self._reader.pid:
            budget = self.options.cache_bytes
            budget = _DEFAULT_CACHE_BYTES if budget is None else budget
            self._blocks = BlockCache(budget, self._dtype, recycle=False)
            self._blocks_pid = self._reader.pid
        return self._blocks

    def _block(self, k: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Return block ``b`` of device ``k`` with its windows' tails: values, times."""
        store = self._device_store()
        if store is not None:
            self._whole_device(k)
            lo = b * self.block_rows
            return store.get(
                k,
                lo,
                min(
                    lo + self.block_rows + self.context_length + self.horizon - 1,
                    self.tables[k].num_rows,
                ),
            )
        cache = self._block_cache()
        block = cache.get((k, b))
        if block is None:
            lo = b * self.block_rows
            hi = min(
                lo + self.block_rows + self.context_length + self.horizon - 1,
                self.tables[k].num_rows,
            )
            values, times = self._rows(k, lo, hi)
            block = Block(times, values.astype(self._dtype, copy=False))
            cache.put((k, b), block)
        return block.values, block.times

    @property
    def _dtype(self):
        return np.float64 if self.options.dtype == "float64" else np.float32

    def _device_store(self):
        """Return the store when devices can be kept whole in it (else None: read blocks).

        A read-only disk cache (Note: decoded disk cache) serves only when it holds every
        device already: rows it lacks could not be kept, and a gather must not read them.
        """
        store = self._memory()
        if store is None or store.writable:
            return store
        if store is not self._checked_store:
            whole = all(store.has_whole(k) for k in range(len(self.tables)))
            self._checked_store, self._whole_store = store, whole
        return store if self._whole_store else None

    _checked_store = None
    _whole_store = False

    def _whole_device(self, k: int) -> None:
        """Decode device ``k`` into the memory store (``cache="memory"``), once per process."""
        store = self._memory()
        if store.has_whole(k):
            return
        n = self.tables[k].num_rows
        for lo in range(0, n, self.block_rows):
            hi = min(lo + self.block_rows, n)
            if not store.has(k, lo, hi):  # another process may have filled it (cache="disk")
                self._rows(k, lo, hi)

    def _table_names(self, table: int) -> list[str]:
        return self.fields

    @property
    def cached_bytes(self) -> int:
        """Bytes of decoded values held in this process (blocks, or the memory store)."""
        if self._store:
            return self._store.nbytes
        return self._blocks.nbytes if self._blocks is not None else 0

    def close(self) -> None:
        super().close()
        self._blocks = None

    def __getstate__(self):
        out = super().__getstate__()
        out["_blocks"] = None
        out.pop("_checked_store", None)
        return out

    # -- statistics -------------------------------------------------------------------------
    def stats(self, exact: bool = False) -> dict[str, dict]:
        """Return per-field statistics over the selected devices.

        Without ``exact``: ``count``, ``min``, ``max``, ``mean`` from the files' metadata, no
        value read (``"source": "metadata"``; ``std`` is ``None``). With ``exact=True``: one
        streaming pass over the values adds ``std`` (population) and recounts the rest
        (``"source": "data"``). Both count samples, not filled rows.
        """
        names = {f: [t.columns[j] for t in self.tables] for j, f in enumerate(self.fields)}
        return self._stats(names, exact)

    def __repr__(self) -> str:
        return (
            f"TsFileWindowDataset({len(self._devices)} devices, {len(self)} windows, "
            f"context_length={self.context_length}, horizon={self.horizon}, "
            f"stride={self.stride}, columns={self.columns_x}, targets={self.targets}, "
            f"order={self.order_spec.order!r})"
        )


def _batch_array(shape: tuple[int, ...], dtype) -> np.ndarray:
    """Return an empty array for a batch; in a DataLoader worker, in shared memory.

    A worker's batch travels to the main process through shared memory: allocating it there
    from the start (as ``default_collate`` does) saves copying it at pickling.
    """
    if tud.get_worker_info() is None:
        return np.empty(shape, dtype=dtype)
    return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name)).share_memory_().numpy()
