"""make_loader: a DataLoader set up right for tsfile-torch datasets.

Epochs need nothing from the loader: each pass claims the next epoch through the dataset's shared
epoch word (iterable dataset) or :class:`~tsfile_torch.data.rows.EpochSampler` (map-style), so a
plain ``DataLoader`` behaves the same. ``stateful=True`` returns torchdata's
``StatefulDataLoader`` (the optional ``resume`` extra) whose ``state_dict()`` collects every
worker's dataset state: rebuilt and loaded, it delivers exactly the batches an uninterrupted run
would have (see the note "resume" in :mod:`tsfile_torch.data.rows`).
"""

from __future__ import annotations

import functools
import multiprocessing
import warnings

import torch
import torch.utils.data as tud

from tsfile_torch.data.rows import EpochSampler, TsFileDataset, TsFileIterableDataset
from tsfile_torch.integrity.checks import EpochSums
from tsfile_torch.integrity.reports import explain_worker_failure, watch_worker_deaths
from tsfile_torch.native.forkfix import fork_safe

__all__ = [
    "TsFileDataLoader",
    "default_timeout",
    "make_loader",
    "saved_num_workers",
    "worker_context",
]

#: seconds every worker batch may take at least (starting a worker and opening files included)
MIN_TIMEOUT_S = 120.0
#: seconds per decoded value added on top: 20x the ~0.1 us per value measured, for slow disks
TIMEOUT_S_PER_VALUE = 2e-6

_PRELOAD = ["torch", "tsfile_torch"]


def worker_context() -> multiprocessing.context.BaseContext:
    """Return the start method for DataLoader workers.

    ``fork`` where tsfile-torch can make forked children safe for tsfile (Linux with tsfile
    2.5's library; see :mod:`tsfile_torch.native.forkfix`): workers start
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

    def __init__(self, inner, dataset, sums: EpochSums | None = None, on_checked=None):
        self._inner = inner
        self._dataset = dataset
        self._sums = sums
        self._on_checked = on_checked
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
                if sums.check() and self._on_checked is not None:
                    self._on_checked()
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


class _Guarded:
    """Mixin: worker deaths and timeouts name the file and rows being read.

    With ``check_statistics`` on, an epoch that hands out every row once (a full pass in row or
    shuffled order, one process group rank, no random windows) is also checked at its end: each
    column's sum against the metadata (:class:`~tsfile_torch.integrity.checks.EpochSums`),
    which covers what workers decoded.
    """

    def __iter__(self):
        return _GuardedIterator(
            super().__iter__(), self.dataset, self._epoch_sums(), self._sums_checked
        )

    def _sums_checked(self) -> None:
        # cache="memory": later passes hand out the very values this pass checked
        self._memory_sums_checked = getattr(self.dataset.options, "cache", "none") == "memory"

    def _epoch_sums(self) -> EpochSums | None:
        ds = self.dataset
        options = getattr(ds, "options", None)
        if options is None or not options.check_statistics or ds.random_batches is not None:
            return None
        if getattr(self, "_memory_sums_checked", False):
            return None
        if (
            getattr(ds, "world_size", 1) > 1
            or getattr(ds, "alignment", None) is not None
            or getattr(ds, "normalizer", None) is not None
        ):
            return None  # a rank sees part of the rows; aligned or normalized rows differ
        if isinstance(ds, TsFileDataset):  # only samplers known to visit every batch once
            sampler = self.sampler
            once = type(sampler) in (tud.SequentialSampler, EpochSampler) or (
                type(sampler) is tud.RandomSampler
                and not sampler.replacement
                and sampler.num_samples == len(ds)
            )
            if not once:
                return None
        return EpochSums(ds.catalog, _EPS[options.dtype])


class TsFileDataLoader(_Guarded, tud.DataLoader):
    """A DataLoader whose worker deaths and timeouts name the file and rows being read.

    With ``check_statistics`` on, an epoch that hands out every row once (a full pass in row or
    shuffled order, one rank, no random windows) is also checked at its end: each column's sum
    against the metadata (:class:`~tsfile_torch.integrity.checks.EpochSums`), which covers what
    workers decoded.
    """


def make_loader(
    dataset: TsFileIterableDataset | TsFileDataset,
    num_workers: int = 0,
    *,
    shuffle: bool = False,
    pin_memory: bool | None = None,
    stateful: bool = False,
    **kwargs,
) -> tud.DataLoader:
    """Return a DataLoader that yields the dataset's batches as they are.

    The dataset already batches, so ``batch_size=None``; workers are persistent so each keeps its
    readers and memory maps across epochs; workers start through :func:`worker_context` (fork
    made safe for tsfile, or forkserver); memory is pinned when CUDA is available. A map-style
    dataset is visited through an :class:`~tsfile_torch.data.rows.EpochSampler` (this rank's
    batches, a new epoch per pass) unless ``sampler`` is given. With workers, ``timeout``
    defaults to :func:`default_timeout`, and a worker that dies or stalls is a
    :class:`~tsfile_torch.WorkerError` naming the file and rows it was reading.

    Args:
        dataset: a tsfile-torch dataset.
        num_workers: DataLoader worker processes (0 reads in the main process).
        shuffle: map-style datasets only: visit batches in a (seed, epoch) permutation.
        pin_memory: ``None`` pins when ``torch.cuda.is_available()``.
        stateful: return a ``torchdata.stateful_dataloader.StatefulDataLoader`` (install
            ``tsfile-torch[resume]``) whose ``state_dict()`` / ``load_state_dict()`` resume
            mid-epoch; loading a state saved with another ``num_workers`` is a ``ValueError``.
        **kwargs: passed on to ``DataLoader`` (``prefetch_factor``,
            ``multiprocessing_context``, ``sampler``...).

    Raises:
        TypeError / ValueError: on a wrong dataset or argument.
        ImportError: ``stateful=True`` without torchdata installed.
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
    if not isinstance(stateful, bool):
        raise TypeError(f"stateful should be True or False, but got stateful={stateful!r}")
    if isinstance(dataset, TsFileDataset) and kwargs.get("sampler") is None:
        if shuffle and kwargs.get("batch_sampler") is not None:
            raise ValueError("shuffle=True and a batch_sampler exclude each other: pick one")
        if kwargs.get("batch_sampler") is None:
            kwargs["sampler"] = EpochSampler(dataset, shuffle=shuffle)
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
    if stateful:
        loader_class = _stateful_loader_class()
        with warnings.catch_warnings():  # torchdata 0.11 calls a torch API deprecated in 2.13
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            return loader_class(
                dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **kwargs
            )
    return TsFileDataLoader(
        dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **kwargs
    )


def saved_num_workers(state: dict) -> int:
    """Return the ``num_workers`` of the StatefulDataLoader that saved ``state``.

    Reads torchdata 0.11's state layout (the version the ``resume`` extra pins): a
    multi-process state has ``_snapshot._main_snapshot._num_workers``, a single-process one no
    ``_snapshot``.
    """
    snapshot = state.get("_snapshot")
    if snapshot is None:
        return 0
    return int(snapshot["_main_snapshot"]["_num_workers"])


@functools.cache
def _stateful_loader_class():
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as err:
        raise ImportError(
            "make_loader(stateful=True) needs torchdata: pip install 'tsfile-torch[resume]' "
            "(or torchdata==0.11.0)"
        ) from err

    class TsFileStatefulLoader(_Guarded, StatefulDataLoader):
        """StatefulDataLoader that refuses, with a clear error, a state of another worker count.

        Worker failures are named as in :class:`TsFileDataLoader`; epoch sums are not checked
        (a resumed epoch hands out only part of the rows).
        """

        def _epoch_sums(self):
            return None

        def load_state_dict(self, state_dict: dict) -> None:
            if state_dict:
                saved = saved_num_workers(state_dict)
                if saved != self.num_workers:
                    raise ValueError(
                        f"this loader state was saved with num_workers={saved} and is loaded "
                        f"into a loader with num_workers={self.num_workers}: each worker "
                        f"resumes its own part of the epoch, so resume with num_workers={saved}"
                    )
            super().load_state_dict(state_dict)

    return TsFileStatefulLoader
