"""PyTorch datasets over TsFiles: the only module that builds tensors.

Both datasets build their :class:`~tsfile_torch.catalog.build.Catalog` from metadata when constructed
(every error about paths, files, columns and arguments is raised there), then read through a
:class:`~tsfile_torch.read.reader.BatchReader` created lazily in the process that reads: the main
process with ``num_workers=0``, each DataLoader worker otherwise. With persistent workers the
reader, its open files and memory maps survive from epoch to epoch.

Note: rank capture. DDP rank and world size are fixed when the dataset is built, in the process
that builds it: explicit ``rank=`` / ``world_size=``, else ``torch.distributed`` when it is
initialized, else the ``RANK`` / ``WORLD_SIZE`` environment variables, else (0, 1). They travel
to DataLoader workers by pickling, so fork, forkserver and spawn workers shard alike (a spawned
worker has no process group to ask).

Epochs: every new pass of a loader over a dataset is the next epoch, unless :meth:`set_epoch`
named the epoch of the next pass. The epoch lives in shared memory created with the dataset, so
the main process and workers (persistent or not, any start method) agree; see the note "epoch
word" in :mod:`tsfile_torch.sampling.orders` for how a pass of several workers claims one epoch.
:class:`EpochSampler` does the same for :class:`TsFileDataset` in the main process.

Note: resume. ``state_dict()`` holds the epoch and position (batches delivered) of the pass in
progress in the calling process, with the seed, rank, world size, worker and number of workers
they refer to; ``load_state_dict()`` makes the next pass resume there: order is a pure function
of those, so the skipped batches are sliced off, never read. With DataLoader workers each
worker's copy has its own state: ``torchdata.stateful_dataloader.StatefulDataLoader`` (see
``make_loader(stateful=True)``) collects them. A state only loads into a dataset of the same
rows, batch size, order options, seed, rank and world size, and resumes only with the same
number of workers; anything else is a ``ValueError`` saying what differs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Sequence
from multiprocessing import sharedctypes
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.sampling import orders as sampling
from tsfile_torch.read.aligned import Alignment, several_timelines
from tsfile_torch.native.backend import Source, check_backend
from tsfile_torch.catalog.build import Catalog, build_catalog, expand_sources
from tsfile_torch.data.normalize import Normalizer, make_normalizer, series_stats
from tsfile_torch.options import DatasetOptions, check_random_batches
from tsfile_torch.read.reader import BatchReader, cache_cap
from tsfile_torch.integrity.validate import check_sources
from tsfile_torch.integrity.reports import ReadSlots, die_with_parent, enable_crash_report

__all__ = ["EpochSampler", "TsFileDataset", "TsFileIterableDataset", "resolve_rank"]

# state_dict keys (see Note: resume)
STATE_EPOCH = "epoch"
STATE_POSITION = "position"
STATE_SEED = "seed"
STATE_RANK = "rank"
STATE_WORLD_SIZE = "world_size"
STATE_WORKER = "worker"
STATE_NUM_WORKERS = "num_workers"
STATE_RANDOM_BATCHES = "random_batches"
STATE_LAYOUT = "layout"

_NUMPY_DTYPE = {"float64": np.float64}  # every other torch dtype is read as float32 first


class _TsFileBase:
    """What both datasets share: catalog, options, epoch, and the per-process reader."""

    def __init__(
        self,
        sources: Source | Sequence[Source],
        options: DatasetOptions,
        rank: int | None,
        world_size: int | None,
    ):
        self.options = options
        self.rank, self.world_size = resolve_rank(rank, world_size)
        sources = expand_sources(sources, options.remote)
        if options.validate:  # first contact with each file in a child (Note: validation child)
            check_sources(sources)
        self.catalog: Catalog = build_catalog(
            sources,
            options.columns,
            start_time=options.start_time,
            end_time=options.end_time,
            remote_options=options.remote,
            shared_timeline=options.align is None,
        )
        _warn_inexact_integers(self.catalog, options.dtype)
        for info in self.catalog.files:
            check_backend(info.source, options.read_backend)
        self._warn_if_batch_exceeds_cache()
        # the epoch word (see the note in sampling): latest epoch, set_epoch flag, claimer
        self._epoch = sharedctypes.RawValue("q", sampling.pack_epoch_word(-1, False, 0))
        # -1: options.random_batches decides; 0: full passes; N > 0: N random windows
        self._random = sharedctypes.RawValue("q", -1)
        self._reader: BatchReader | None = None
        self._reader_epoch = None
        #: Time alignment of columns with different timestamps (None: positional rows).
        self.alignment: Alignment | None = None
        if options.align is not None and several_timelines(self.catalog):
            alignment = Alignment.build(
                self.catalog, options.read_backend, options.align, options.fill
            )
            if not alignment.identical:  # else positional rows: the fast path
                if options.cache == "memory":
                    raise ValueError(
                        "cache='memory' keeps positional rows and cannot be combined with "
                        "align= over columns with different timestamps; use cache='none'"
                    )
                self.alignment = alignment
        #: Applied to every batch (``normalize=``); hand it to a validation dataset.
        self.normalizer: Normalizer | None = make_normalizer(
            options.normalize, self.columns, lambda exact: self.stats(exact)
        )
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

    def _warn_if_batch_exceeds_cache(self) -> None:
        o = self.options
        if o.cache != "none" or o.cache_bytes == 0:
            return
        itemsize = 8 if o.dtype == "float64" else 4
        cap = o.cache_bytes if o.cache_bytes is not None else cache_cap()
        batch_bytes = o.batch_size * (len(self.catalog.columns) * itemsize + 8)
        if batch_bytes > cap:
            warnings.warn(
                f"one batch of {o.batch_size} rows x {len(self.catalog.columns)} columns is "
                f"{batch_bytes / 2**20:.0f} MiB, more than the streaming cache's "
                f"{cap / 2**20:.0f} MiB: blocks cannot be cached and pages will be decoded more "
                f"than once; use a smaller batch_size, fewer columns, or a larger cache_bytes",
                stacklevel=3,
            )

    # -- pickling: no native handles, shared epoch only while spawning workers ------------
    # (a plain pickle, e.g. a checkpoint, takes the values: its copy counts epochs alone)
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

    def stats(self, exact: bool = False) -> dict[str, dict]:
        """Return per-column statistics: metadata only, or with ``exact`` one pass adding std.

        See :func:`tsfile_torch.data.normalize.series_stats`; they cover each column's whole series.
        """
        names = {name: [i] for i, name in enumerate(self.columns)}
        return series_stats(
            self.catalog, names, exact, self.options.read_backend, self.options.block_rows
        )

    @property
    def num_rows(self) -> int:
        return self.catalog.num_rows if self.alignment is None else self.alignment.num_rows

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
                max_open_files=self.options.max_open_files,
                index_dir=self.options.index_dir,
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
        """Make the next pass epoch ``epoch`` (later passes count on from it).

        Reaches DataLoader workers, persistent or not. Without it each pass is the next epoch.
        """
        if (
            isinstance(epoch, bool)
            or not isinstance(epoch, int)
            or not 0 <= epoch <= sampling.MAX_EPOCH
        ):
            raise ValueError(
                f"epoch should be an integer in [0, {sampling.MAX_EPOCH}], but got epoch={epoch!r}"
            )
        self._epoch.value = sampling.pack_epoch_word(epoch, True, 0)

    @property
    def epoch(self) -> int | None:
        """Epoch of the latest pass (or the one ``set_epoch`` named); ``None`` before any."""
        epoch = sampling.unpack_epoch_word(int(self._epoch.value))[0]
        return None if epoch < 0 else epoch

    def _claim_epoch(self, tag: int, leader: bool) -> int:
        """Return the epoch of a new pass; the leader records it (see the note in sampling).

        ``tag`` 0 is a pass of the main process (always its own leader).
        """
        word = sampling.unpack_epoch_word(int(self._epoch.value))
        if not leader and tag == word.tag and _alive(word.pid):
            return word.epoch  # this pass's worker 0 has claimed it already
        epoch = sampling.next_epoch(word)
        if leader:
            self._record_epoch(epoch, tag)
        return epoch

    def _record_epoch(self, epoch: int, tag: int = 0) -> None:
        """Record that pass ``tag`` of this process runs ``epoch``; the next is ``epoch + 1``."""
        pid = os.getpid() if tag else 0
        self._epoch.value = sampling.pack_epoch_word(epoch, False, pid, tag)

    def _layout(self) -> list:
        o = self.options
        return [self.num_rows, o.batch_size, o.drop_last, o.shuffle]

    def _base_state(self) -> dict[str, Any]:
        return {
            STATE_SEED: self.options.seed,
            STATE_RANK: self.rank,
            STATE_WORLD_SIZE: self.world_size,
            STATE_RANDOM_BATCHES: self.random_batches,
            STATE_LAYOUT: self._layout(),
        }

    def _check_state(self, state: dict[str, Any], keys: Sequence[str]) -> None:
        """Raise ValueError unless ``state`` was saved by a dataset that orders rows like this."""
        if not isinstance(state, dict) or not set(keys) <= set(state):
            raise ValueError(
                f"state_dict of {type(self).__name__} needs the keys {sorted(keys)}; got "
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__}"
            )
        names = {
            STATE_SEED: "seed",
            STATE_RANK: "rank",
            STATE_WORLD_SIZE: "world_size",
            STATE_LAYOUT: "(num_rows, batch_size, drop_last, shuffle)",
        }
        mine = self._base_state()
        for key, name in names.items():
            got = list(state[key]) if key == STATE_LAYOUT else state[key]
            if got != mine[key]:
                raise ValueError(
                    f"cannot load this state_dict: it was saved with {name}={state[key]!r}, "
                    f"this dataset has {name}={mine[key]!r}; build the dataset (and the "
                    f"process group) as when the state was saved"
                )

    def _restore_random_batches(self, count: int | None) -> None:
        self._random.value = 0 if count is None else count

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
        if self.alignment is None:
            random_access = self.random_batches is not None
            values, times = reader.read(int(start), int(stop), random_access=random_access)
        else:
            values, times = self.alignment.read(reader, int(start), int(stop))
        if self.normalizer is not None:
            values = self.normalizer(values, self.columns)
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


def _alive(pid: int) -> bool:
    """Return whether process ``pid`` (masked as in the epoch word) runs now; 0 never does."""
    if pid == 0:
        return False
    if os.name != "posix":  # os.kill(pid, 0) would terminate it on Windows: trust the tag alone
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


#: Largest integer magnitude below which every integer is exact in each float dtype (2**mantissa).
_EXACT_INTEGERS = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53}


def _warn_inexact_integers(catalog: Catalog, dtype: str) -> None:
    """Warn when metadata min / max show integer columns that ``dtype`` cannot hold exactly."""
    limit = _EXACT_INTEGERS[dtype]
    inexact = [
        c.name
        for c in catalog.columns
        if c.dtype in ("INT32", "INT64", "TIMESTAMP")
        and max(abs(c.min or 0), abs(c.max or 0)) > limit
    ]
    if not inexact:
        return
    shown = ", ".join(inexact[:8]) + (f" and {len(inexact) - 8} more" if len(inexact) > 8 else "")
    hint = (
        "pass dtype=torch.float64 (exact up to 2**53)"
        if dtype != "float64"
        else "their values beyond 2**53 are rounded"
    )
    warnings.warn(
        f"integer columns {shown} hold values beyond {limit:,} (metadata min / max), where "
        f"{dtype} cannot represent every integer: values will be rounded; {hint}",
        stacklevel=4,
    )


def _spawning() -> bool:
    from multiprocessing import context

    return context.get_spawning_popen() is not None


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """Return (rank, world size) as fixed when a dataset is built (see Note: rank capture).

    Raises:
        ValueError: on a rank outside ``[0, world_size)``, one of the two given without the
            other, or unparsable ``RANK`` / ``WORLD_SIZE`` environment variables.
    """
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"rank and world_size go together: give both or neither; got rank={rank!r}, "
            f"world_size={world_size!r}"
        )
    source = "rank / world_size arguments"
    if rank is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
            source = "torch.distributed"
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            source = "the RANK / WORLD_SIZE environment variables"
            try:
                rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
            except ValueError:
                raise ValueError(
                    f"RANK and WORLD_SIZE must be integers; got RANK={os.environ['RANK']!r}, "
                    f"WORLD_SIZE={os.environ['WORLD_SIZE']!r}"
                ) from None
        else:
            return 0, 1
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} should be an integer, but got {name}={value!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank should be in [0, world_size) with world_size >= 1, but got rank={rank}, "
            f"world_size={world_size} (from {source})"
        )
    return rank, world_size


class TsFileIterableDataset(_TsFileBase, tud.IterableDataset):
    """Batches of ``batch_size`` rows x all selected columns, as an ``IterableDataset``.

    Use with ``DataLoader(ds, batch_size=None)`` or :func:`tsfile_torch.make_loader`. Each epoch
    yields every batch exactly once across DataLoader workers (and DDP ranks, which all get the
    same number of batches); see :mod:`tsfile_torch.sampling.orders` for the order. Every pass is the
    next epoch unless :meth:`set_epoch` says otherwise; :meth:`state_dict` /
    :meth:`load_state_dict` resume a pass where it stopped (see Note: resume).

    Args:
        sources: a path, a directory (its ``*.tsfile``, sorted), a glob, a binary file object,
            or a list of them.
        columns: ``None`` for every numeric field, or exact names / glob patterns.
        batch_size: rows per batch.
        shuffle: ``False``: batches in row order; ``True``: a (seed, epoch) permutation.
        seed: seed of the permutation and of random windows (any integer, modulo 2**64).
        drop_last: leave out the last partial batch.
        read_backend: ``"auto"``, ``"mmap"``, ``"pread"`` or a ``tsfile.FileReadBackend``.
        dtype: torch floating dtype of the batches.
        random_batches: if set, each epoch is this many windows at uniformly random rows.
        rank, world_size: this process's DDP rank and the number of ranks; ``None`` (both):
            from ``torch.distributed``, else ``RANK`` / ``WORLD_SIZE``, else (0, 1), fixed now
            (see Note: rank capture).
        **kwargs: further :class:`~tsfile_torch.options.DatasetOptions` fields (``cache``,
            ``cache_bytes``, ``block_rows``, ``return_timestamps``, ``align``, ``fill``,
            ``normalize``).

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
        rank: int | None = None,
        world_size: int | None = None,
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
        _TsFileBase.__init__(self, sources, options, rank, world_size)
        self._passes = 0  # passes begun by this copy (tells persistent workers' passes apart)
        self._pass: tuple[int, int, int] | None = None  # (epoch, worker, num_workers)
        self._position = 0  # batches of the current pass delivered by this process
        self._resume: dict[str, Any] | None = None  # a loaded state, for the next pass

    def items_for(
        self,
        epoch: int,
        rank: int | None = None,
        world_size: int | None = None,
        worker: int = 0,
        num_workers: int = 1,
    ) -> np.ndarray:
        """Return the first rows of the batches one worker of one rank yields in ``epoch``.

        ``rank`` / ``world_size`` default to the dataset's (see Note: rank capture).
        """
        if rank is None and world_size is None:
            rank, world_size = self.rank, self.world_size
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
        return len(
            sampling.shard_for_rank(
                self._windows(0), self.rank, self.world_size, self.options.drop_last
            )
        )

    def __iter__(self) -> Iterator[torch.Tensor]:
        # not a generator: the epoch is claimed (and the state is valid) as soon as the loader
        # asks for the iterator, as StatefulDataLoader reads the state right then
        info = tud.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        self._passes += 1
        tag = 0 if info is None else sampling.pass_tag(info.seed - info.id, self._passes)
        if self._resume is not None:
            epoch, position = self._take_resume(worker, num_workers)
            if worker == 0:
                self._record_epoch(epoch, tag)
        else:
            epoch, position = self._claim_epoch(tag, leader=worker == 0), 0
        self._pass, self._position = (epoch, worker, num_workers), position
        items = self.items_for(epoch, self.rank, self.world_size, worker, num_workers)
        return self._generate(epoch, items, worker, num_workers)

    def _generate(
        self, epoch: int, items: np.ndarray, worker: int, num_workers: int
    ) -> Iterator[torch.Tensor]:
        reader = self._start_epoch(epoch)
        if num_workers > 1:
            # decode only this worker's rows: blocks are clipped to its range (see sampling)
            lo, hi = sampling.worker_row_range(
                self.num_rows, self.options.batch_size, worker, num_workers
            )
            reader.set_range(lo, hi)
        while self._position < len(items):
            batch = self._batch(reader, items[self._position])
            self._position += 1  # before yielding: the state read next counts this batch
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Return where this process's pass stands (see Note: resume).

        ``epoch`` is ``None`` before the first pass here; a loaded state not yet resumed is
        returned as loaded.
        """
        if self._resume is not None:
            return dict(self._resume)
        epoch, worker, num_workers = self._pass or (None, 0, 1)
        return {
            STATE_EPOCH: epoch,
            STATE_POSITION: self._position if self._pass else 0,
            STATE_WORKER: worker,
            STATE_NUM_WORKERS: num_workers,
            **self._base_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass resume where ``state`` stood; later passes count on from it.

        Raises:
            ValueError: ``state`` comes from a dataset with other rows, batch size, order
                options, seed, rank or world size (the number of workers is checked when the
                pass begins).
        """
        keys = (STATE_EPOCH, STATE_POSITION, STATE_WORKER, STATE_NUM_WORKERS)
        self._check_state(state, keys + tuple(self._base_state()))
        self._restore_random_batches(state[STATE_RANDOM_BATCHES])
        self._resume = dict(state) if state[STATE_EPOCH] is not None else None

    def _take_resume(self, worker: int, num_workers: int) -> tuple[int, int]:
        state, self._resume = self._resume, None
        saved = (state[STATE_WORKER], state[STATE_NUM_WORKERS])
        if saved[1] != num_workers or saved[0] != worker:
            raise ValueError(
                f"this state_dict was saved by worker {saved[0]} of {saved[1]} (1: the main "
                f"process) and is resumed by worker {worker} of {num_workers}: resume with the "
                f"same num_workers (each worker's order depends on it)"
            )
        return int(state[STATE_EPOCH]), int(state[STATE_POSITION])


class TsFileDataset(_TsFileBase, tud.Dataset):
    """Map-style dataset: ``len(ds)`` batches, ``ds[i]`` is batch ``i`` (rows in time order).

    Works with ``DataLoader(ds, batch_size=None, sampler=...)``: ``RandomSampler`` shuffles
    batches, ``DistributedSampler`` shards them; :class:`EpochSampler` (what
    :func:`~tsfile_torch.make_loader` uses) does both from (seed, epoch) and the captured rank,
    makes each pass the next epoch, and resumes. With ``random_batches=N``, ``ds[i]`` is the
    i-th random window of the current epoch (:attr:`epoch`: the latest pass's, or the one
    :meth:`set_epoch` named; 0 before any).

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
        rank: int | None = None,
        world_size: int | None = None,
        **kwargs,
    ):
        if "shuffle" in kwargs:
            raise TypeError(
                "TsFileDataset takes no shuffle argument: shuffle with a sampler, "
                "e.g. make_loader(ds, shuffle=True) or DataLoader(ds, batch_size=None, "
                "sampler=RandomSampler(ds))"
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
        _TsFileBase.__init__(self, sources, options, rank, world_size)
        self._window_cache: tuple[tuple[int, int], np.ndarray] | None = None

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
        epoch = self.epoch or 0
        reader = self._start_epoch(epoch)
        if self.random_batches is None:
            start = index * self.options.batch_size
        else:
            key = (epoch, self.random_batches)
            if self._window_cache is None or self._window_cache[0] != key:
                self._window_cache = (key, self._windows(epoch))
            start = self._window_cache[1][index]
        return self._batch(reader, start)

    def state_dict(self) -> dict[str, Any]:
        """Return the current epoch with what it refers to (the position is the sampler's)."""
        return {STATE_EPOCH: self.epoch, **self._base_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make ``state``'s epoch current (random windows follow it); see Note: resume.

        Raises:
            ValueError: ``state`` comes from a dataset with other rows, batch size, seed, rank
                or world size.
        """
        self._check_state(state, (STATE_EPOCH, *self._base_state()))
        self._restore_random_batches(state[STATE_RANDOM_BATCHES])
        if state[STATE_EPOCH] is not None:
            self._record_epoch(int(state[STATE_EPOCH]))


class EpochSampler(tud.Sampler[int]):
    """Batch indices of a :class:`TsFileDataset` for this rank, one epoch per pass.

    The first index of each pass claims the dataset's next epoch in the main process (or the
    one ``set_epoch`` named), so random windows follow the epoch; ``shuffle=True`` visits the
    batches in a (seed, epoch) permutation. Batches are dealt to DDP ranks like
    :class:`TsFileIterableDataset` deals them (rank captured by the dataset; same count on every
    rank). Its iterator saves and loads (epoch, position), so ``StatefulDataLoader`` resumes a
    pass by slicing the order.
    """

    def __init__(self, dataset: TsFileDataset, shuffle: bool = False):
        if not isinstance(dataset, TsFileDataset):
            raise TypeError(f"EpochSampler needs a TsFileDataset; got {type(dataset).__name__}")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle should be True or False, but got shuffle={shuffle!r}")
        self.dataset, self.shuffle = dataset, shuffle

    def indices(self, epoch: int) -> np.ndarray:
        """Return the batch indices this rank visits in ``epoch``, in order."""
        ds = self.dataset
        order = sampling.epoch_items(len(ds), self.shuffle, ds.options.seed, epoch)
        return sampling.shard_for_rank(order, ds.rank, ds.world_size, ds.options.drop_last)

    def __len__(self) -> int:
        ds = self.dataset
        return len(
            sampling.shard_for_rank(
                np.arange(len(ds)), ds.rank, ds.world_size, ds.options.drop_last
            )
        )

    def __iter__(self) -> Iterator[int]:
        return _EpochSamplerIterator(self)


class _EpochSamplerIterator(Iterator[int]):
    """One pass of an :class:`EpochSampler`; claims its epoch at the first index (lazily: a
    DataLoader may create an iterator it never uses)."""

    def __init__(self, sampler: EpochSampler):
        self.sampler = sampler
        self.epoch: int | None = None
        self.position = 0
        self._order: np.ndarray | None = None

    def _begin(self, epoch: int | None) -> None:
        ds = self.sampler.dataset
        if epoch is None:
            epoch = ds._claim_epoch(0, leader=True)
        else:
            ds._record_epoch(epoch)
        self.epoch, self._order = epoch, self.sampler.indices(epoch)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        if self._order is None:
            self._begin(None)
        if self.position >= len(self._order):
            raise StopIteration
        self.position += 1
        return int(self._order[self.position - 1])

    def state_dict(self) -> dict[str, Any]:
        return {STATE_EPOCH: self.epoch, STATE_POSITION: self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state[STATE_EPOCH] is None:
            self.epoch, self.position, self._order = None, 0, None
            return
        self._begin(int(state[STATE_EPOCH]))
        self.position = int(state[STATE_POSITION])
