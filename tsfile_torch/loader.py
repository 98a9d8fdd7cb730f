"""make_loader: a DataLoader set up right for tsfile-torch datasets."""

from __future__ import annotations

import multiprocessing
import warnings

import torch
import torch.utils.data as tud

from .datasets import TsFileDataset, TsFileIterableDataset
from .forkfix import fork_safe
from .integrity import EpochSums
from .workers import explain_worker_failure, watch_worker_deaths

__all__ = ["make_loader", "worker_context", "default_timeout", "TsFileDataLoader"]

#: seconds every worker batch may take at least (starting a worker and opening files included)
MIN_TIMEOUT_S = 120.0
#: seconds per decoded value added on top: 20x the ~0.1 us per value measured, for slow disks
TIMEOUT_S_PER_VALUE = 2e-6

_PRELOAD = ["torch", "tsfile_torch"]


def worker_context() -> multiprocessing.context.BaseContext:
    """Return the start method for DataLoader workers.

    ``fork`` where tsfile-torch can make forked children safe for tsfile (Linux with tsfile
    2.5's library; see the note "tsfile and fork" in :mod:`tsfile_torch.backend`): workers start
    fast and scripts need no ``__main__`` guard. Otherwise ``forkserver`` (preloading torch and
    tsfile_torch, no tsfile threads in the server), else ``spawn``.
    """
    methods = multiprocessing.get_all_start_methods()
    if fork_safe() and "fork" in methods:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


def default_timeout(dataset: TsFileIterableDataset | TsFileDataset) -> float:
    """Return the DataLoader ``timeout`` make_loader sets: generous for one block of reads.

    A batch may have to decode one block of every read group first: ``block_rows`` rows of
    every column. ``MIN_TIMEOUT_S + TIMEOUT_S_PER_VALUE * block_rows * num_columns`` seconds.
    """
    values = dataset.options.block_rows * len(dataset.columns)
    return MIN_TIMEOUT_S + TIMEOUT_S_PER_VALUE * values


_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


class _GuardedIterator:
    """Wraps a DataLoader iterator: a dead or stalled worker becomes a WorkerError."""

    def __init__(self, inner, dataset, sums: EpochSums | None = None):
        self._inner = inner
        self._dataset = dataset
        self._sums = sums
        if getattr(inner, "_workers", None):  # torch has set its SIGCHLD handler by now
            watch_worker_deaths(getattr(dataset, "_slots", None))

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._inner)

    def __next__(self):
        try:
            batch = next(self._inner)
        except StopIteration:
            if self._sums is not None:
                sums, self._sums = self._sums, None
                sums.check()
            raise
        except (RuntimeError, ConnectionError, EOFError) as err:
            better = explain_worker_failure(
                err, getattr(self._dataset, "_slots", None), getattr(self._inner, "_workers", ())
            )
            if better is None:
                raise
            raise better from err
        if self._sums is not None:
            values = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
            if not isinstance(values, torch.Tensor) or values.ndim != 2:
                self._sums = None  # a subclass yields something else: nothing to check
                return batch
            if values.dtype in (torch.float16, torch.bfloat16):
                values = values.float()
            self._sums.add(values.numpy())
        return batch

    def __getattr__(self, name):
        return getattr(self._inner, name)


class TsFileDataLoader(tud.DataLoader):
    """A DataLoader whose worker deaths and timeouts name the file and rows being read.

    With ``check_statistics`` on, an epoch that hands out every row once (a full pass in row or
    shuffled order, one process group rank, no random windows) is also checked at its end: each
    column's sum against the metadata (:class:`~tsfile_torch.integrity.EpochSums`), which covers
    what workers decoded.
    """

    def __iter__(self):
        return _GuardedIterator(super().__iter__(), self.dataset, self._epoch_sums())

    def _epoch_sums(self) -> EpochSums | None:
        ds = self.dataset
        options = getattr(ds, "options", None)
        if options is None or not options.check_statistics or ds.random_batches is not None:
            return None
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_world_size() > 1:
                return None
        if isinstance(ds, TsFileDataset):  # only samplers known to visit every batch once
            sampler = self.sampler
            once = type(sampler) is tud.SequentialSampler or (
                type(sampler) is tud.RandomSampler
                and not sampler.replacement
                and sampler.num_samples == len(ds)
            )
            if not once:
                return None
        return EpochSums(ds.catalog, _EPS[options.dtype])


def make_loader(
    dataset: TsFileIterableDataset | TsFileDataset,
    num_workers: int = 0,
    *,
    shuffle: bool = False,
    pin_memory: bool | None = None,
    **kwargs,
) -> tud.DataLoader:
    """Return a DataLoader that yields the dataset's batches as they are.

    The dataset already batches, so ``batch_size=None``; workers are persistent so each keeps its
    readers and memory maps across epochs; workers start through :func:`worker_context` (fork
    made safe for tsfile, or forkserver); memory is pinned when CUDA is available. With workers,
    ``timeout`` defaults to :func:`default_timeout`, and a worker that dies or stalls is a
    :class:`~tsfile_torch.WorkerError` naming the file and rows it was reading.

    Args:
        dataset: a tsfile-torch dataset.
        num_workers: DataLoader worker processes (0 reads in the main process).
        shuffle: map-style datasets only: visit batches through a ``RandomSampler``.
        pin_memory: ``None`` pins when ``torch.cuda.is_available()``.
        **kwargs: passed on to ``DataLoader`` (``prefetch_factor``,
            ``multiprocessing_context``, ``sampler``...).

    Raises:
        TypeError / ValueError: on a wrong dataset or argument.
    """
    if not isinstance(dataset, (TsFileIterableDataset, TsFileDataset)):
        raise TypeError(
            f"dataset must be a TsFileIterableDataset or TsFileDataset; got "
            f"{type(dataset).__name__}"
        )
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(
            f"num_workers should be a non-negative integer value, but got "
            f"num_workers={num_workers!r}"
        )
    if "batch_size" in kwargs and kwargs["batch_size"] is not None:
        raise ValueError(
            "the dataset yields whole batches; set batch_size on the dataset, not on the loader"
        )
    kwargs.pop("batch_size", None)
    if shuffle and isinstance(dataset, TsFileIterableDataset):
        raise ValueError(
            "shuffle belongs to TsFileIterableDataset(shuffle=True), not to the loader"
        )
    if shuffle and "sampler" not in kwargs:
        kwargs["sampler"] = tud.RandomSampler(dataset)
    if num_workers > len(dataset):
        warnings.warn(
            f"num_workers={num_workers} exceeds the {len(dataset)} batches per epoch; "
            f"some workers will have nothing to read",
            stacklevel=2,
        )
    if pin_memory is None:
        pin_memory = torch.cuda.is_available()
    kwargs.setdefault("persistent_workers", num_workers > 0)
    if num_workers > 0 and kwargs.get("multiprocessing_context") is None:
        kwargs["multiprocessing_context"] = worker_context()
    if num_workers > 0:
        kwargs.setdefault("timeout", default_timeout(dataset))
    return TsFileDataLoader(
        dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **kwargs
    )
