"""PyTorch datasets over TsFiles: the only module that builds tensors.

Both datasets build their :class:`~tsfile_torch.catalog.Catalog` from metadata when constructed
(every error about paths, files, columns and arguments is raised there), then read through a
:class:`~tsfile_torch.reader.BatchReader` created lazily in the process that reads: the main
process with ``num_workers=0``, each DataLoader worker otherwise. With persistent workers the
reader, its open files and memory maps survive from epoch to epoch.

Epochs: :meth:`set_epoch` writes the epoch into shared memory created with the dataset, so it
reaches persistent workers. Until ``set_epoch`` is first called, each new pass over an
:class:`TsFileIterableDataset` in a process counts as the next epoch.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from multiprocessing import sharedctypes

import numpy as np
import torch
import torch.utils.data as tud

from . import sampling
from .backend import Source, check_backend
from .catalog import Catalog, build_catalog, expand_sources
from .options import DatasetOptions, check_random_batches
from .reader import BatchReader
from .validate import check_sources
from .workers import ReadSlots, die_with_parent, enable_crash_report

__all__ = ["TsFileDataset", "TsFileIterableDataset"]

_NUMPY_DTYPE = {"float64": np.float64}  # every other torch dtype is read as float32 first


class _TsFileBase:
    """What both datasets share: catalog, options, epoch, and the per-process reader."""

    def __init__(self, sources: Source | Sequence[Source], options: DatasetOptions):
        self.options = options
        sources = expand_sources(sources)
        if options.validate:  # first contact with each file in a child (Note: validation child)
            check_sources(sources)
        self.catalog: Catalog = build_catalog(sources, options.columns)
        for info in self.catalog.files:
            check_backend(info.source, options.read_backend)
        self._epoch = sharedctypes.RawValue("q", -1)
        # -1: options.random_batches decides; 0: full passes; N > 0: N random windows
        self._random = sharedctypes.RawValue("q", -1)
        self._local_epoch = -1
        self._reader: BatchReader | None = None
        self._reader_epoch = None
        self._slots: ReadSlots | None = ReadSlots()  # Note: worker reports (workers.py)
        if options.random_batches is None and not sampling.num_batches(
            self.num_rows, options.batch_size, options.drop_last
        ):
            warnings.warn(
                f"the dataset yields no batches: drop_last=True and batch_size="
                f"{options.batch_size} is more than its {self.num_rows} rows; lower batch_size "
                f"or set drop_last=False",
                stacklevel=3,
            )

    # -- pickling: no native handles, shared epoch only while spawning workers ------------
    def __getstate__(self):
        state = self.__dict__.copy()
        state["_reader"] = None
        state["_reader_epoch"] = None
        if not _spawning():
            state["_epoch"] = int(self._epoch.value)
            state["_random"] = int(self._random.value)
            state["_slots"] = None
        return state

    def __setstate__(self, state):
        for key in ("_epoch", "_random"):
            if isinstance(state[key], int):
                state[key] = sharedctypes.RawValue("q", state[key])
        self.__dict__.update(state)

    # -- public surface -------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        """Column names, in output order (tsfile series naming: ``table.tag.field``)."""
        return self.catalog.column_names

    @property
    def num_rows(self) -> int:
        return self.catalog.num_rows

    @property
    def reader(self) -> BatchReader:
        """This process's reader, opened on first use and kept until :meth:`close`."""
        if self._reader is None or self._reader.pid != os.getpid():
            self._reader = BatchReader(
                self.catalog,
                self.options.read_backend,
                _NUMPY_DTYPE.get(self.options.dtype, np.float32),
                block_rows=self.options.block_rows,
                malloc_tuning=self.options.malloc_tuning,
                decode_threads=self._decode_threads(),
                cache_bytes=self.options.cache_bytes,
                check_statistics=self.options.check_statistics,
            )
            if self.options.cache == "memory":
                self._reader.keep_all()
            enable_crash_report()  # Note: fatal-signal report (workers.py)
            info = tud.get_worker_info()
            if info is not None:  # Note: worker reports (workers.py)
                die_with_parent()
                if self._slots is not None:
                    slots, worker = self._slots, info.id
                    self._reader.on_read = lambda text: slots.write(worker, text)
        return self._reader

    def _decode_threads(self) -> int:
        if self.options.decode_threads is not None:
            return self.options.decode_threads
        if tud.get_worker_info() is not None:
            return 1
        return max(1, min(4, os.cpu_count() or 1))

    @property
    def backends(self) -> dict[str, str]:
        """File name -> backend its open reader really uses, in this process."""
        if self._reader is None:
            return {}
        return {self.catalog.files[i].name: b for i, b in self._reader.backends.items()}

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch that seeds the order; reaches DataLoader workers, persistent or not."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch should be a non-negative integer, but got epoch={epoch!r}")
        self._epoch.value = epoch

    def set_random_batches(self, count: int | None) -> None:
        """Switch later epochs to ``count`` random windows, or back to full passes with ``None``.

        Like :meth:`set_epoch` it reaches persistent workers, so one loader (and its open
        readers and caches) can alternate sequential epochs and random-window epochs.
        """
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count <= 0
        ):
            raise ValueError(
                f"count should be a positive integer value or None, but got count={count!r}"
            )
        check_random_batches("count", count)
        self._random.value = 0 if count is None else count

    @property
    def random_batches(self) -> int | None:
        """Random windows per epoch now in force (``None``: full passes over the rows)."""
        value = int(self._random.value)
        if value < 0:
            return self.options.random_batches
        return value or None

    def close(self) -> None:
        """Close this process's readers (they reopen on the next read)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _start_epoch(self, epoch: int) -> BatchReader:
        reader = self.reader
        if self._reader_epoch != epoch:
            reader.check_unchanged()
            if self.options.cache == "none":
                reader.clear_cache()
            self._reader_epoch = epoch
        return reader

    def _windows(self, epoch: int) -> np.ndarray:
        """Return the first row of every item of ``epoch``, before sharding, in order."""
        o = self.options
        if self.random_batches is not None:
            return sampling.random_window_starts(
                self.num_rows, o.batch_size, self.random_batches, o.seed, epoch
            )
        starts = sampling.batch_starts(self.num_rows, o.batch_size, o.drop_last)
        return starts[sampling.epoch_items(len(starts), o.shuffle, o.seed, epoch)]

    def _batch(self, reader: BatchReader, start: int):
        stop = min(start + self.options.batch_size, self.num_rows)
        values, times = reader.read(int(start), int(stop))
        tensor = torch.from_numpy(values)
        if self.options.dtype not in ("float32", "float64"):
            tensor = tensor.to(getattr(torch, self.options.dtype))
        if self.options.return_timestamps:
            return tensor, torch.from_numpy(times)
        return tensor

    def __repr__(self) -> str:
        o = self.options
        return (
            f"{type(self).__name__}({len(self.catalog.files)} files, {len(self.columns)} "
            f"columns, {self.num_rows} rows, batch_size={o.batch_size}, "
            f"read_backend={o.read_backend!r}, cache={o.cache!r})"
        )


def _spawning() -> bool:
    from multiprocessing import context

    return context.get_spawning_popen() is not None


def _rank_and_world() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class TsFileIterableDataset(_TsFileBase, tud.IterableDataset):
    """Batches of ``batch_size`` rows x all selected columns, as an ``IterableDataset``.

    Use with ``DataLoader(ds, batch_size=None)`` or :func:`tsfile_torch.make_loader`. Each epoch
    yields every batch exactly once across DataLoader workers (and DDP ranks, which all get the
    same number of batches); see :mod:`tsfile_torch.sampling` for the order.

    Args:
        sources: a path, a directory (its ``*.tsfile``, sorted), a glob, a binary file object,
            or a list of them.
        columns: ``None`` for every numeric field, or exact names / glob patterns.
        batch_size: rows per batch.
        shuffle: ``False``: batches in row order; ``True``: a (seed, epoch) permutation.
        seed: seed of the permutation and of random windows.
        drop_last: leave out the last partial batch.
        read_backend: ``"auto"``, ``"mmap"``, ``"pread"`` or a ``tsfile.FileReadBackend``.
        dtype: torch floating dtype of the batches.
        random_batches: if set, each epoch is this many windows at uniformly random rows.
        **kwargs: further :class:`~tsfile_torch.options.DatasetOptions` fields (``cache``,
            ``cache_bytes``, ``block_rows``, ``return_timestamps``).

    Raises:
        TsFileFormatError, SchemaError, MappingError, ValueError, TypeError: on bad input.
    """

    def __init__(
        self,
        sources: Source | Sequence[Source],
        columns: Sequence[str] | None = None,
        batch_size: int = 8192,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        read_backend="auto",
        dtype=torch.float32,
        random_batches: int | None = None,
        **kwargs,
    ):
        options = DatasetOptions(
            columns=columns,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            read_backend=read_backend,
            dtype=dtype,
            random_batches=random_batches,
            **kwargs,
        )
        _TsFileBase.__init__(self, sources, options)

    def _epoch_for_iteration(self) -> int:
        if self._epoch.value >= 0:
            return int(self._epoch.value)
        self._local_epoch += 1
        return self._local_epoch

    def items_for(
        self, epoch: int, rank: int = 0, world_size: int = 1, worker: int = 0, num_workers: int = 1
    ) -> np.ndarray:
        """Return the first rows of the batches one worker of one rank yields in ``epoch``."""
        items = sampling.shard_for_rank(
            self._windows(epoch), rank, world_size, self.options.drop_last
        )
        if num_workers == 1:
            return items
        lo, hi = sampling.worker_row_range(
            self.num_rows, self.options.batch_size, worker, num_workers
        )
        return sampling.shard_by_rows(items, lo, hi)

    def __len__(self) -> int:
        """Batches per epoch on this rank (all workers together)."""
        rank, world = _rank_and_world()
        return len(sampling.shard_for_rank(self._windows(0), rank, world, self.options.drop_last))

    def __iter__(self) -> Iterator[torch.Tensor]:
        epoch = self._epoch_for_iteration()
        rank, world = _rank_and_world()
        info = tud.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        reader = self._start_epoch(epoch)
        if num_workers > 1:
            # decode only this worker's rows: one block spans its whole range (see sampling)
            lo, hi = sampling.worker_row_range(
                self.num_rows, self.options.batch_size, worker, num_workers
            )
            reader.set_block_rows(min(self.options.block_rows, max(hi - lo, 1)))
        for start in self.items_for(epoch, rank, world, worker, num_workers):
            yield self._batch(reader, start)


class TsFileDataset(_TsFileBase, tud.Dataset):
    """Map-style dataset: ``len(ds)`` batches, ``ds[i]`` is batch ``i`` (rows in time order).

    Works with ``DataLoader(ds, batch_size=None, sampler=...)``: ``RandomSampler`` shuffles
    batches, ``DistributedSampler`` shards them. With ``random_batches=N``, ``ds[i]`` is the
    i-th random window of the epoch set by :meth:`set_epoch`.

    Takes the arguments of :class:`TsFileIterableDataset` except ``shuffle``.
    """

    def __init__(
        self,
        sources: Source | Sequence[Source],
        columns: Sequence[str] | None = None,
        batch_size: int = 8192,
        seed: int = 0,
        drop_last: bool = False,
        read_backend="auto",
        dtype=torch.float32,
        random_batches: int | None = None,
        **kwargs,
    ):
        if "shuffle" in kwargs:
            raise TypeError(
                "TsFileDataset takes no shuffle argument: shuffle with a sampler, "
                "e.g. DataLoader(ds, batch_size=None, sampler=RandomSampler(ds))"
            )
        options = DatasetOptions(
            columns=columns,
            batch_size=batch_size,
            seed=seed,
            drop_last=drop_last,
            read_backend=read_backend,
            dtype=dtype,
            random_batches=random_batches,
            **kwargs,
        )
        _TsFileBase.__init__(self, sources, options)
        self._window_cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        o = self.options
        if self.random_batches is not None:
            return self.random_batches
        return sampling.num_batches(self.num_rows, o.batch_size, o.drop_last)

    def __getitem__(self, index: int):
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer batch number; got {index!r}")
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"batch index {index} out of range for {n} batches")
        index = int(index) % n
        epoch = max(int(self._epoch.value), 0)
        reader = self._start_epoch(epoch)
        if self.random_batches is None:
            start = index * self.options.batch_size
        else:
            key = (epoch, self.random_batches)
            if self._window_cache is None or self._window_cache[0] != key:
                self._window_cache = (key, self._windows(epoch))
            start = self._window_cache[1][index]
        return self._batch(reader, start)
