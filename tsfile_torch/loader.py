"""make_loader: a DataLoader set up right for tsfile-torch datasets.

Epochs need nothing from the loader: each pass claims the next epoch through the dataset's shared
epoch word (iterable dataset) or :class:`~tsfile_torch.datasets.EpochSampler` (map-style), so a
plain ``DataLoader`` behaves the same. ``stateful=True`` returns torchdata's
``StatefulDataLoader`` (the optional ``resume`` extra) whose ``state_dict()`` collects every
worker's dataset state: rebuilt and loaded, it delivers exactly the batches an uninterrupted run
would have (see the note "resume" in :mod:`tsfile_torch.datasets`).
"""

from __future__ import annotations

import functools
import multiprocessing
import warnings

import torch
import torch.utils.data as tud

from .backend import fork_safe
from .datasets import EpochSampler, TsFileDataset, TsFileIterableDataset

__all__ = ["make_loader", "saved_num_workers", "worker_context"]

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
    dataset is visited through an :class:`~tsfile_torch.datasets.EpochSampler` (this rank's
    batches, a new epoch per pass) unless ``sampler`` is given.

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
    if stateful:
        loader_class = _stateful_loader_class()
        with warnings.catch_warnings():  # torchdata 0.11 calls a torch API deprecated in 2.13
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
            return loader_class(
                dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **kwargs
            )
    return tud.DataLoader(
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

    class TsFileStatefulLoader(StatefulDataLoader):
        """StatefulDataLoader that refuses, with a clear error, a state of another worker count."""

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
