"""make_loader: one DataLoader factory for every tsfile-torch dataset, set up right.

- Each view says what its loader needs (``dataset.loader_spec()``, a
  :class:`~tsfile_torch.data.view.LoaderSpec`); the loader checks no types. Row views yield
  whole batches (``batch_size=None``); a map-style one is visited through an
  :class:`~tsfile_torch.data.view.EpochSampler`. Window views hold single windows:
  ``batch_size`` windows per batch through the same sampler (as ``batch_sampler``) and their
  ``collate_fn``.
- Workers are persistent (each keeps its readers and memory maps across epochs), start through
  :func:`worker_context` (fork made safe for tsfile, else forkserver), and get
  :func:`tsfile_torch.process.start_worker` (crash report, parent guard) before the user's
  ``worker_init_fn``.
- ``timeout`` defaults to :func:`default_timeout`; a worker that dies or stalls is a
  :class:`~tsfile_torch.WorkerError` naming the file and rows it was reading; ``pin_memory``
  defaults to whether torch sees an accelerator that can pin, and ``pin_memory=True`` without
  one warns once and hands out unpinned batches, as torch's DataLoader does.
- With ``check_statistics`` on, an epoch that hands out every row once (a full pass of a row
  dataset on one rank, no random windows, no alignment or normalization) is checked at its end:
  each column's sum against the metadata (:class:`~tsfile_torch.integrity.checks.EpochSums`),
  when other processes decoded its rows (workers) or a cache holds them (the first full pass
  only). Streaming with ``num_workers=0`` stops summing epochs once the process's reader has
  summed and checked every series itself (:class:`~tsfile_torch.integrity.checks.CellSums`,
  complete after the first full pass when decodes fall on whole cells).
- With ``cache="disk"``, and ``cache="memory"`` under fork workers (one shared store), workers
  hand batches already kept over by reference and the iterator serves them from the main
  process's mapping (Note: hand-over in
  :mod:`tsfile_torch.data.view`); a pass of a view whose every table is kept there is served
  by the main process alone, in the order its workers would deliver (Note: kept passes).
- ``stateful=True`` returns torchdata's ``StatefulDataLoader`` (the ``resume`` extra): its
  ``state_dict()`` holds the datasets' or the sampler's pass states (see Note: resume in
  :mod:`tsfile_torch.sampling.passes`).

Epochs need nothing from the loader: each pass claims the dataset's next epoch (Note: epoch word).
"""

from __future__ import annotations

import atexit
import collections.abc
import ctypes
import functools
import gc
import logging
import multiprocessing
import os
import threading
import warnings
import weakref

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch import compat, mechanisms
from tsfile_torch.data.handover import WorkerRing
from tsfile_torch.data.ring import (
    RingBatch,
    RingCollate,
    RingControl,
    RingReceiver,
    ring_available,
)
from tsfile_torch.data.view import EpochSampler, KeptBatch, LoaderSpec
from tsfile_torch.errors import TsFileTorchError
from tsfile_torch.integrity.checks import EpochSums, column_sums
from tsfile_torch.integrity.reports import explain_worker_failure
from tsfile_torch.native.forkfix import fork_safe
from tsfile_torch.options import check_bool, check_int
from tsfile_torch.process import LoaderScope, start_worker
from tsfile_torch.read.core import (
    kept_whole,
    share_blocks,
    share_store,
    shares_store,
    sums_verified,
)
from tsfile_torch.sampling.state import NUM_WORKERS, WORKER, PassPoint, check_state, pass_state

__all__ = ["default_timeout", "make_loader", "saved_num_workers", "worker_context"]

#: seconds every worker batch may take at least (starting a worker and opening files included)
MIN_TIMEOUT_S = 120.0
#: seconds per decoded value added on top: 20x the ~0.1 us per value measured, for slow disks
TIMEOUT_S_PER_VALUE = 2e-6

_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def worker_context() -> multiprocessing.context.BaseContext:
    """Return the start method for DataLoader workers.

    ``fork`` where tsfile-torch can make forked children safe for tsfile (Linux with tsfile
    2.5's library; see :mod:`tsfile_torch.native.forkfix`): workers start fast and scripts need
    no ``__main__`` guard. Otherwise ``forkserver``, else ``spawn``. The global multiprocessing
    settings are left as they are.
    """
    methods = multiprocessing.get_all_start_methods()
    if not hasattr(os, "fork"):  # both need fork() (Note: platforms in docs/performance.md)
        methods = [m for m in methods if m not in ("fork", "forkserver")]
    if fork_safe() and "fork" in methods:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def default_timeout(dataset) -> float:
    """Return the DataLoader ``timeout`` make_loader sets: generous for one block of reads.

    A batch may have to decode one block of every read group first: ``block_rows`` rows of
    every column. ``MIN_TIMEOUT_S + TIMEOUT_S_PER_VALUE * block_rows * num_columns`` seconds.
    """
    return MIN_TIMEOUT_S + TIMEOUT_S_PER_VALUE * _spec(dataset).block_values


def _pinnable() -> bool:
    """Return whether batches can be pinned: torch sees an accelerator to copy them to.

    ``torch.accelerator.is_available()`` where torch has it (2.6 and later), else
    ``torch.cuda.is_available()``; MPS cannot pin (torch's DataLoader leaves it out too).
    """
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not hasattr(accelerator, "is_available"):
        return torch.cuda.is_available()
    if not accelerator.is_available():
        return False
    current = accelerator.current_accelerator()
    return current is None or current.type != "mps"


def _view_of(dataset):
    """Return the tsfile-torch view under ``dataset``: itself, or what a chain of
    ``torch.utils.data.Subset`` (``random_split``'s parts) is taken from."""
    while isinstance(dataset, tud.Subset):
        dataset = dataset.dataset
    return dataset


def _spec(dataset) -> LoaderSpec:
    """Return what ``dataset``'s loader needs (a Subset's: its view's), or raise TypeError for a
    dataset make_loader cannot serve, naming what to do instead."""
    view = _view_of(dataset)
    if isinstance(view, tud.ConcatDataset) and any(
        callable(getattr(d, "loader_spec", None)) for d in view.datasets
    ):
        raise TypeError(
            "make_loader does not take a ConcatDataset of tsfile-torch datasets (their files, "
            "epochs and checks would not be one dataset's): give every source to one dataset "
            "(TsFileDataset([dir1, dir2]), TsFileWindowDataset([...])), or mix window datasets "
            "with tsfile_torch.MixedWindows([ds1, ds2], weights=..., num_samples=N)"
        )
    spec = getattr(view, "loader_spec", None)
    if not callable(spec):
        raise TypeError(
            f"dataset must be a tsfile-torch dataset (TsFileIterableDataset, TsFileDataset, "
            f"TsFileWindowDataset, MixedWindows) or a torch.utils.data.Subset of one; got "
            f"{type(dataset).__name__}: use torch.utils.data.DataLoader for other datasets"
        )
    if view is not dataset:
        if isinstance(view, tud.IterableDataset):  # torch's Subset cannot index one either
            raise TypeError(
                f"a Subset of a {type(view).__name__} (an IterableDataset) cannot be indexed: "
                f"use TsFileDataset for subsets, or start_time= / end_time= for a time range"
            )
        _warn_random_split(dataset, view)
    return spec()


#: window views already warned about a random split (Note: random splits of windows)
_SPLIT_WARNED: weakref.WeakSet = weakref.WeakSet()


def _warn_random_split(subset, view) -> None:
    """Warn once per window view when ``subset`` takes its windows out of order.

    Note: random splits of windows. Windows of one device overlap in time, and a window's
    horizon is a later window's context: ``random_split`` puts windows of the same stretch in
    both parts, so training sees the validation targets. A Subset whose indices are not in
    increasing order (at any level) is taken to be such a split.
    """
    if not getattr(view.loader_spec(), "windows", False) or view in _SPLIT_WARNED:
        return
    while isinstance(subset, tud.Subset):
        indices = np.asarray(subset.indices)
        if len(indices) > 1 and (np.diff(indices) < 0).any():
            _SPLIT_WARNED.add(view)
            warnings.warn(
                f"a random split of a {type(view).__name__} (torch.utils.data.random_split, a "
                f"Subset in shuffled order) leaks future values into training: windows of one "
                f"device overlap, so a validation window's targets lie in training windows; "
                f"split at a time instead: train, val = ds.split_by_time(t)",
                stacklevel=4,
            )
            return
        subset = subset.dataset


# Note: loader resume. Where a make_loader pass stands is counted in the main process: the
# epoch of a pass is decided there when the iteration starts (the view's or sampler's
# ``begin_main_pass``: workers take it as set), and the batches handed to the training loop are
# counted by the pass, so the loader's ``state_dict()`` carries, under the key ``"tsfile_torch"``,
# a :class:`~tsfile_torch.sampling.state.PassPoint` of the whole loader (worker -1; epoch,
# batches delivered, finished, topology, history) written like every other pass state. A state
# loaded under another topology resumes from that record alone (Note: elastic resume in
# :mod:`tsfile_torch.sampling.orders`); no part of torchdata's own state layout is read. Under
# the same topology torchdata resumes each worker exactly, as it saved them.

# Note: kept passes. Once every table of a view is kept in a store the main process maps too
# (the disk cache, or the shared memory store of fork workers), workers have nothing
# left to do for a pass of make_loader's own collate function: a worker would only echo each
# request (a KeptBatch) for the main process to serve from its own mapping, and on a small
# machine DataLoader's two queue messages per batch cost about what serving it does. Such a pass
# is served in the main process: a map-style view's through the same sampler, in the same order
# (the sampler deals batches in the order workers would deliver them), the same batches
# (:class:`_InMain`); an iterable view's fresh pass (not a resumed one) as its workers would
# deliver it: each worker's share, taken in turn, as DataLoader's in-order delivery takes them
# (``LoaderSpec.main_pass``). Shuffled row batches are gathers, copies wherever they are made:
# the workers make them side by side, faster than the main process alone. The persistent
# workers stay up, idle, for a pass that needs them (benchmarks/RESULTS.md, "What each
# mechanism pays": "kept").
# Not for a sampler or collate function of the user's, or torchdata's stateful loader (its state
# is the workers').

_KEY = "tsfile_torch"
#: the loader record's key for the loader's own ``num_workers`` (0 included)
_LOADER_WORKERS = "loader_num_workers"
#: held while a loader checks that its dataset is free and claims it
_STARTING = threading.RLock()
logger = logging.getLogger(__name__)

# Note: sums before the user's collate_fn. The epoch sums check what the dataset produced, so a
# user's ``collate_fn`` (an x / y split, a cast, a normalization, NaN masking, tensors with
# grad) never reaches them: :class:`_SumsFirst` wraps it, in the process that collates (a
# worker, or the main process), sums the dataset's batch before calling it, and sends the sums
# with what it returned (:class:`_Summed`); the pass adds them and hands out the user's batch.
# Workers sum only while a pass checks (a shared flag, set before the pass's first batch is
# asked for). Without a user's collate_fn the pass sums the batches it hands out, as before.


class _Summed:
    """A collated batch and the column sums of the dataset's batch it was made from."""

    __slots__ = ("batch", "rows", "sums")

    def __init__(self, batch, rows: int, sums):
        self.batch, self.rows, self.sums = batch, rows, sums

    def pin_memory(self, device=None) -> _Summed:
        self.batch = pinned(self.batch)
        return self


def pinned(data):
    """Return ``data`` with its tensors in page-locked memory, as torch's DataLoader pins a
    batch: tensors and objects with a ``pin_memory()`` method of their own, inside mappings,
    tuples (named ones too) and sequences; anything else as it is."""
    if isinstance(data, torch.Tensor):
        return data.pin_memory()
    if hasattr(data, "pin_memory") and not isinstance(data, type):
        return data.pin_memory()
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        items = {k: pinned(v) for k, v in data.items()}
        try:
            return type(data)(items)
        except TypeError:  # a mapping type that cannot be built from a dict
            return items
    if isinstance(data, tuple):
        if hasattr(data, "_fields"):  # a named tuple
            return type(data)(*(pinned(v) for v in data))
        return type(data)(pinned(v) for v in data)
    if isinstance(data, collections.abc.Sequence):
        items = [pinned(v) for v in data]
        try:
            return type(data)(items)
        except TypeError:  # a sequence type that cannot be built from a list
            return items
    return data


class _SumsFirst:
    """A user's ``collate_fn``, run after summing the dataset's batch (Note: sums before the
    user's collate_fn). ``active``: a shared flag, whether the pass in progress checks sums."""

    def __init__(self, collate_fn, active):
        self.collate_fn, self.active = collate_fn, active

    def __call__(self, data):
        if not self.active.value:
            return self.collate_fn(data)
        values = data[0] if isinstance(data, (tuple, list)) and data else data
        sums = None
        if isinstance(values, torch.Tensor) and values.ndim == 2:
            values = values.detach()
            if values.dtype in (torch.float16, torch.bfloat16):
                values = values.float()
            sums = column_sums(values.numpy())  # before the collate_fn may change them in place
        return _Summed(self.collate_fn(data), len(values) if sums is not None else 0, sums)


def _log_kept_pass(loader) -> None:
    """Log, once per loader, that its passes are served by the main process (Note: kept
    passes)."""
    if getattr(loader, "_kept_logged", False):
        return
    loader._kept_logged = True
    logger.info(
        "every batch of this %s is kept in a store the main process maps: its passes are "
        "served by the main process, and its %d workers stay idle (Note: kept passes)",
        type(loader._view).__name__,
        loader.num_workers,
    )


class _Pass:
    """One iteration of a loader: worker failures named, epoch sums checked, effects undone."""

    def __init__(self, loader, inner, scope: LoaderScope, start: PassPoint, sums: EpochSums | None):
        self._loader = loader
        self._inner = inner
        self._scope = scope
        scope.watch(bool(compat.iterator_workers(inner)))
        self._sums = sums
        self._ring = getattr(loader, "_ring", None)
        #: where this pass stands, counted here in the main process (Note: loader resume)
        self.point = start

    def __iter__(self):
        return self

    def __len__(self):
        return len(self._inner)

    def __next__(self):
        if self._ring is not None:
            self._ring.release()  # slots of batches the consumer has dropped are free again
        try:
            batch = next(self._inner)
        except StopIteration:
            self._end()
            self.point = self.point._replace(finished=True)
            if self._sums is not None:
                sums, self._sums = self._sums, None
                if sums.check():
                    self._loader._sums_checked = self._loader._view.options.cache != "none"
            raise
        except (RuntimeError, ConnectionError, EOFError) as err:
            self._end()
            context = self._loader.multiprocessing_context
            better = explain_worker_failure(
                err,
                self._loader._spec.slots,
                compat.iterator_workers(self._inner),
                context.get_start_method() if context is not None else None,
            )
            if better is None:
                raise
            # a worker died or stalled: end this pass's workers now (a kept error would keep
            # them until a garbage collection); the next pass starts new ones
            _retire(self._loader, self._inner)
            if self._ring is not None:
                self._ring.close()
            raise better from err
        except BaseException:
            self._end()
            raise
        self.point = self.point._replace(position=self.point.position + 1)
        summed = None
        if isinstance(batch, _Summed):  # Note: sums before the user's collate_fn
            summed, batch = batch, batch.batch
        if isinstance(batch, RingBatch):  # Note: ring
            batch = self._ring.unpack(batch)
            if self._loader.pin_memory:
                batch = pinned(batch)
        elif isinstance(batch, KeptBatch):  # Note: hand-over
            batch = self._loader._spec.serve(batch)
            if self._loader.pin_memory:
                batch = pinned(batch)
        if self._sums is not None and self._loader._sums_first is not None:
            if summed is None or summed.sums is None:
                self._sums = None  # the dataset made something else: nothing to check
            else:
                self._sums.add_sums(summed.rows, summed.sums)
        elif self._sums is not None:
            values = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
            if not isinstance(values, torch.Tensor) or values.ndim != 2:
                self._sums = None  # a subclass yields something else: nothing to check
                return batch
            if values.dtype in (torch.float16, torch.bfloat16):
                values = values.float()
            self._sums.add(values.numpy())
        return batch

    def _end(self) -> None:
        self._scope.close()
        self._loader._running = None

    def __del__(self):
        self._scope.close()

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _Guarded:
    """Mixin of make_loader's loaders (see the module notes)."""

    _sums_checked = False

    def __iter__(self):
        # one check-and-claim at a time: two threads starting loaders over one dataset object
        # at once must not both see it free
        with _STARTING:
            return self._start()

    def _start(self):
        ds = self._view
        running = ds.__dict__.get("_running_loader")
        other = running() if running is not None else None
        live = other is not None and other._running is not None and other._running() is not None
        if live and other is not self:
            with_workers = other.num_workers or self.num_workers
            # not kept in this frame: a traceback kept with the error (a results dict) would
            # keep the other loader, and its workers, alive until a garbage collection
            del other, running
            if with_workers:
                raise TsFileTorchError(
                    f"this {type(ds).__name__} is already being iterated by another loader "
                    f"with DataLoader workers; two loaders over one dataset object would share "
                    f"its epoch: finish or delete the first iteration, or build a second dataset"
                )
        start = self._start_point()
        sums = self._epoch_sums()
        if self._sums_first is not None:  # before workers collate this pass's first batches
            self._sums_first.active.value = sums is not None
        # before the DataLoader touches process settings
        scope = LoaderScope(self._spec.slots, self.num_workers > 0)
        ring = getattr(self, "_ring", None)
        if ring is not None:
            if compat.current_iterator(self) is None or not self.persistent_workers:
                ring.restart()  # new workers: new slots
            ring.new_pass()
        try:
            if not self._kept_pass(start):
                inner = super().__iter__()
                # Note: an iterator collected in a cycle
                compat.wrap_shutdown(inner, _end_unreachable)
            else:
                _log_kept_pass(self)
                if self._spec.iterable:
                    inner = _InMainIterable(self, start.epoch)
                else:
                    inner = _InMain(self)
        except BaseException:
            scope.close()
            raise
        if self.num_workers:
            _end_workers_at_exit()
            _watch_collections()
            _LOADERS.add(self)
        out = _Pass(self, inner, scope, start, sums)
        self._running = weakref.ref(out)
        ds.__dict__["_running_loader"] = weakref.ref(self)
        return out

    _loaded: PassPoint | None = None  # a state of the same topology, loaded (stateful loader)
    _main_ok = False  # make_loader's sampler and collate function, not stateful (Note: kept passes)
    _sums_first: _SumsFirst | None = None  # a user's collate_fn (Note: sums before collate_fn)

    def _kept_pass(self, start: PassPoint) -> bool:
        """Whether this pass is served by the main process (Note: kept passes)."""
        cores = self._spec.cores  # disk or shared memory: the main process maps what workers wrote
        if self._spec.iterable and (start.position or start.history or self._resuming()):
            return False  # a resumed pass: its workers know where they stand
        if not self._spec.windows and self._view.spec.order == "shuffle":
            return False  # row gathers: copies wherever made, the workers make them in parallel
        return (
            self._main_ok
            and mechanisms.on("kept")
            and self.num_workers > 0
            and all(shares_store(c) and kept_whole(c) for c in cores)
        )

    def _resuming(self) -> bool:
        """Whether the iterable view's next pass resumes a loaded state."""
        return getattr(self._view.passes, "resuming", False)

    def _start_point(self) -> PassPoint:
        """Return where the pass about to start stands; its epoch is decided here, in the main
        process (Note: loader resume)."""
        loaded, self._loaded = self._loaded, None
        if loaded is not None and not loaded.finished:
            return loaded
        target = _resume_target(self)
        if target is None:  # a sampler of the user's: nothing to resume through
            return self._point(self._view.epochs.peek())
        return self._point(*target.begin_main_pass())

    def _point(self, epoch: int, history: tuple = ()) -> PassPoint:
        """Return the start of a pass of this loader over ``epoch`` (Note: loader resume)."""
        ds = self._view
        return PassPoint(epoch, 0, -1, max(self.num_workers, 1), ds.rank, ds.world_size, history)

    def _epoch_sums(self) -> EpochSums | None:
        ds, spec = self._view, self._spec
        if self._sums_checked or spec.epoch_sums is None or not mechanisms.on("epoch_sums"):
            return None
        if not spec.epoch_sums():
            return None
        if self.dataset is not ds:  # a Subset: not every row once
            return None
        if ds.options.cache == "none" and sums_verified(ds.core):
            # every row of a pass is decoded again by the loader's processes (here or in its
            # workers), whose statistics checks summed each series once they had decoded all
            # of it, in cell sums shared with this process: summing again would only cost
            return None
        if not spec.iterable and not isinstance(self.sampler, EpochSampler):
            sampler = self.sampler  # only samplers known to visit every batch once
            once = type(sampler) is tud.SequentialSampler or (
                type(sampler) is tud.RandomSampler
                and not sampler.replacement
                and sampler.num_samples == len(ds)
            )
            if not once:
                return None
        return EpochSums(ds.catalog, _EPS[ds.options.dtype])


class _InMain:
    """A pass of a loader with workers served by the main process (Note: kept passes): the
    loader's sampler and collate function, fetched here as with ``num_workers=0``."""

    def __init__(self, loader):
        batches = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
        self._serve(loader, len(batches), map(functools.partial(_fetch, loader), batches))

    def _serve(self, loader, length: int, batches) -> None:
        self._length, self._batches = length, batches
        self._pin = loader.pin_memory

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return self._length

    def __next__(self):
        batch = next(self._batches)
        return pinned(batch) if self._pin else batch


def _fetch(loader, index):
    """Return the batch ``loader`` makes of ``index`` (a list of items under a batch sampler,
    else one item), as DataLoader fetches with ``num_workers=0``: ``__getitems__`` where the
    dataset has it, then the loader's ``collate_fn``."""
    dataset = loader.dataset
    if loader.batch_sampler is None:
        return loader.collate_fn(dataset[index])
    getitems = getattr(dataset, "__getitems__", None)
    data = getitems(index) if getitems else [dataset[i] for i in index]
    return loader.collate_fn(data)


class _InMainIterable(_InMain):
    """A fresh pass of an iterable view with workers, served by the main process (Note: kept
    passes): the batches its workers would deliver, in their order, read here."""

    def __init__(self, loader, epoch: int):
        self._serve(loader, *loader._spec.main_pass(epoch, loader.num_workers))


def _retire(loader, failed, gentle: bool = False) -> None:
    """Shut down the workers of an iterator whose pass ended in a worker failure (dead, stopped
    or stalled workers), so the next pass starts new ones instead of waiting on them.

    ``gentle``: SIGTERM first (a worker then removes what it made, Note: nothing left behind in
    :mod:`tsfile_torch.process`), SIGKILL for one still there after a second.
    """
    compat.drop_iterator(loader, failed)
    workers = compat.iterator_workers(failed)
    compat.forget_worker_pids(failed)  # before any kill
    if gentle:
        for w in workers:
            if w.is_alive():
                w.terminate()
        for w in workers:
            w.join(timeout=1.0)
    for w in workers:
        if w.is_alive():
            w.kill()  # stopped or stalled: it would not exit when asked
    compat.shutdown_workers(failed)


#: set at interpreter exit (Note: an iterator collected in a cycle)
_exiting = False
#: the thread running a garbage collection now, if any (:func:`_watch_collections`)
_collecting: int | None = None


def _end_unreachable(it) -> None:
    """SIGTERM (a worker then removes what it made) the live workers of ``it`` when the garbage
    collector is what shuts it down: torch's shutdown, called next, asks a worker to stop
    through its index queue, which the collection may have closed already, and would wait 5 s
    for each. Not at interpreter exit (torch's shutdown then does nothing;
    :func:`_end_workers_at_exit` ends the workers).

    Note: an iterator collected in a cycle. torch's shutdown of an iterator the garbage
    collector finds in a reference cycle waits 5 s per worker (docs/upstream.md has the
    reproduction for torch). A shutdown run by a garbage collection (reached through
    :func:`tsfile_torch.compat.wrap_shutdown`; ``gc.callbacks``, :func:`_watch_collections`)
    first ends the live workers by SIGTERM; other shutdowns ask them as torch does. A pass that
    ended in an error keeps its workers until then (a caller may catch the error and go on).
    """
    if _exiting is not False or _collecting != threading.get_ident():
        return
    unreachable = [w for w in compat.iterator_workers(it) if w.is_alive()]
    if not unreachable:
        return
    compat.forget_worker_pids(it)  # before the signal
    for w in unreachable:
        w.terminate()


def _collection(phase: str, info: dict) -> None:
    global _collecting
    _collecting = threading.get_ident() if phase == "start" else None


@functools.cache
def _watch_collections() -> None:
    """Note which thread runs a garbage collection (``gc.callbacks``; Note: an iterator
    collected in a cycle); installed with the first loader with workers, for the process's
    life, as :func:`_end_workers_at_exit`."""
    gc.callbacks.append(_collection)


#: loaders whose workers may be running (their iterators are ended at interpreter exit)
_LOADERS: weakref.WeakSet = weakref.WeakSet()


@functools.cache
def _end_workers_at_exit() -> None:
    """At interpreter exit (after Ctrl-C, say), end every make_loader loader's workers at once
    instead of through torch's shutdown, which waits up to 5 s per worker for an answer and more
    when the exit has already closed the queues it asks through."""

    def end_all() -> None:
        global _exiting
        _exiting = True
        for loader in list(_LOADERS):
            it = compat.current_iterator(loader)
            if compat.iterator_workers(it):
                _retire(loader, it, gentle=True)

    atexit.register(end_all)


class TsFileDataLoader(_Guarded, tud.DataLoader):
    """The DataLoader :func:`make_loader` returns (see :mod:`tsfile_torch.loader`)."""

    _running = None


def make_loader(
    dataset,
    batch_size: int | None = None,
    num_workers: int = 0,
    *,
    pin_memory: bool | None = None,
    stateful: bool = False,
    **kwargs,
) -> tud.DataLoader:
    """Return a DataLoader over any tsfile-torch dataset (see the module notes).

    Args:
        dataset: a :class:`TsFileIterableDataset`, :class:`TsFileDataset`,
            :class:`TsFileWindowDataset` or :class:`MixedWindows` (any view with a
            ``loader_spec()``).
        batch_size: windows per batch for window views (required there); row datasets batch
            themselves (set ``batch_size`` on the dataset).
        num_workers: DataLoader worker processes (0 reads in the main process).
        pin_memory: pin every batch (ring and kept batches included) for a faster copy to
            the accelerator; ``None``: when torch sees one that can pin. ``True`` where
            there is none warns once and hands out unpinned batches (``loader.pin_memory`` is
            then False), as torch's DataLoader does.
        stateful: return a ``torchdata.stateful_dataloader.StatefulDataLoader`` (install
            ``tsfile-torch[resume]``) whose ``state_dict()`` / ``load_state_dict()`` resume
            mid-epoch, under the same or another number of workers and ranks.
        **kwargs: passed on to ``DataLoader`` (``prefetch_factor``, ``timeout``,
            ``multiprocessing_context``, ``worker_init_fn``, ``persistent_workers``, a
            ``sampler`` for a :class:`TsFileDataset`...).

    Raises:
        TypeError / ValueError: on a wrong dataset or argument.
        ImportError: ``stateful=True`` without torchdata installed.
    """
    spec = _spec(dataset)
    view = _view_of(dataset)
    num_workers = check_int("num_workers", num_workers, 0, 1024)
    check_bool("stateful", stateful)
    user_collate = kwargs.get("collate_fn")
    user_init = kwargs.get("worker_init_fn")
    batch_size = _batching(dataset, view, spec, batch_size, num_workers, kwargs)
    hand_over = kwargs.get("collate_fn") is (spec.collate_fn if spec.windows else None)
    hand_over = hand_over and mechanisms.on("kept")  # Note: hand-over
    if spec.num_batches is not None and num_workers > spec.num_batches:
        warnings.warn(
            f"num_workers={num_workers} exceeds the {spec.num_batches} batches per epoch; "
            f"some workers will have nothing to read",
            stacklevel=2,
        )
    if pin_memory is None:
        pin_memory = _pinnable()
    elif check_bool("pin_memory", pin_memory) and not _pinnable():
        # torch's DataLoader warns at every iterator and goes on unpinned; batches handed over
        # through the ring or a store are pinned by the pass itself, which would raise here
        warnings.warn(
            "pin_memory=True but no accelerator is found (or it cannot pin, as MPS): batches "
            "are not pinned",
            stacklevel=2,
        )
        pin_memory = False
    _check_timeout(kwargs.get("timeout", 0), num_workers)
    if num_workers > 0:
        kwargs.setdefault("persistent_workers", True)
        if kwargs.get("multiprocessing_context") is None:
            kwargs["multiprocessing_context"] = worker_context()
        kwargs.setdefault("timeout", MIN_TIMEOUT_S + TIMEOUT_S_PER_VALUE * spec.block_values)
        context = kwargs["multiprocessing_context"]
        method = context if isinstance(context, str) else context.get_start_method()
        if method == "fork":
            for core in spec.cores:  # Note: shared memory store in tsfile_torch.read.memory
                share_store(core)
                if spec.gather_block:  # Note: block exchange in tsfile_torch.read.exchange
                    share_blocks(core, num_workers, *spec.gather_block)
        ring = None  # Note: ring in tsfile_torch.data.handover; ring platforms in data.ring
        if ring_available():
            ring = RingControl(num_workers)
            kwargs["collate_fn"] = RingCollate(kwargs.get("collate_fn") or tud.default_convert)
        kwargs["worker_init_fn"] = functools.partial(
            _init_worker,
            os.getpid(),
            threading.current_thread() is threading.main_thread(),
            kwargs.get("worker_init_fn"),
            hand_over,
            ring,
        )
    sums_first = None
    if user_collate is not None and spec.epoch_sums is not None:
        # Note: sums before the user's collate_fn; the flag is shared with fork workers and
        # pickled into others as they start
        sums_first = _SumsFirst(kwargs["collate_fn"], multiprocessing.RawValue(ctypes.c_bool))
        kwargs["collate_fn"] = sums_first
    loader_class = _stateful_loader_class() if stateful else TsFileDataLoader
    with warnings.catch_warnings():  # torchdata 0.11 calls a torch API deprecated in 2.13
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        loader = loader_class(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            **kwargs,
        )
    loader._spec, loader._view, loader._sums_first = spec, view, sums_first
    loader._ring = RingReceiver(ring) if num_workers > 0 and ring is not None else None
    samplers = (kwargs.get("sampler"), kwargs.get("batch_sampler"))
    ours = any(isinstance(s, EpochSampler) for s in samplers)
    if dataset is view and spec.iterable:
        ours = spec.main_pass is not None
    # a worker_init_fn of the user's is run by workers: they are started (Note: kept passes)
    loader._main_ok = hand_over and not stateful and ours and user_init is None
    return loader


def _batching(dataset, view, spec: LoaderSpec, batch_size, num_workers: int, kwargs) -> int | None:
    """Put in ``kwargs`` the DataLoader arguments that order and batch ``dataset``; return the
    ``batch_size`` to give DataLoader.

    A user's ``sampler`` / ``batch_sampler`` / ``drop_last`` are honoured on map-style views
    as DataLoader honours them, the view's own order (an :class:`EpochSampler`) is the default;
    what cannot be honoured is a ValueError naming the argument and what works (the table in
    ``docs/dataloader.md``).
    """
    name = type(view).__name__
    shuffle = kwargs.pop("shuffle", None)
    if shuffle is not None and check_bool("shuffle", shuffle):
        hint = "" if spec.iterable else " (or pass sampler=torch.utils.data.RandomSampler(ds))"
        raise ValueError(
            f"shuffle=True belongs to the dataset: {name}(..., shuffle=True) or order='shuffle' "
            f"/ 'batches', so every loader and rank agrees on the order{hint}"
        )
    drop_last = check_bool("drop_last", kwargs.pop("drop_last", False))
    sampler, batch_sampler = kwargs.get("sampler"), kwargs.get("batch_sampler")
    if spec.iterable:
        for arg, value in (("sampler", sampler), ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ValueError(
                    f"{arg}= cannot order a {name}: an IterableDataset orders itself "
                    f"(DataLoader refuses a {arg} for one too); build a TsFileDataset with the "
                    f"same arguments (it takes sampler=), or set the dataset's order= / seed="
                )
    own_order = dataset is view and sampler is None and batch_sampler is None
    generator = kwargs.get("generator")
    if generator is not None and own_order and view.spec.order != "sequential":
        alternative = (
            ""
            if spec.iterable
            else (", or pass sampler=torch.utils.data.RandomSampler(ds, generator=g)")
        )
        raise ValueError(
            f"generator= does not seed make_loader's order: the {name}'s order "
            f"{view.spec.order!r} is seeded by its seed= ({name}(..., seed=N)), so every rank, "
            f"worker and resume agrees on it; leave generator out{alternative}"
        )
    if not spec.windows:  # the view's items are whole batches
        if batch_size is not None:
            raise ValueError(
                f"a {name} yields whole batches; set batch_size on the dataset "
                f"({name}(..., batch_size=N)), not on the loader"
            )
        if drop_last:
            raise ValueError(
                f"drop_last=True at the loader: a {name} makes its own batches; build it with "
                f"drop_last=True to leave out its short last batch"
            )
        if batch_sampler is not None:
            raise ValueError(
                f"batch_sampler= groups items into batches, and a {name}'s items are already "
                f"batches of batch_size rows: pass sampler= (an order of batch numbers, e.g. "
                f"torch.utils.data.RandomSampler(ds)), or use TsFileWindowDataset for batches "
                f"of single windows"
            )
        if own_order and not spec.iterable:
            kwargs["sampler"] = EpochSampler(view, None, num_workers)
        return None
    kwargs.setdefault("collate_fn", spec.collate_fn)
    if batch_sampler is not None:
        given = [
            arg
            for arg, value in (("batch_size", batch_size), ("sampler", sampler))
            if value is not None
        ] + (["drop_last"] if drop_last else [])
        if given:
            raise ValueError(
                f"batch_sampler= decides the batches: leave out {' and '.join(given)} "
                f"(DataLoader refuses them together too)"
            )
        return 1  # DataLoader's default; the batch sampler decides
    if batch_size is None:
        raise ValueError(
            f"batch_size is required for a {name}: windows per batch, e.g. "
            f"make_loader(ds, batch_size=256) (or pass batch_sampler=)"
        )
    if own_order:
        # the loader's drop_last where the view's own is off (it drops its short batch itself)
        drop = drop_last and not view.spec.drop_last
        kwargs["batch_sampler"] = EpochSampler(view, batch_size, num_workers, drop)
        return 1  # DataLoader's default; the batch sampler decides
    kwargs["drop_last"] = drop_last
    return batch_size


def _check_timeout(timeout, num_workers: int) -> None:
    """Check the DataLoader ``timeout`` make_loader passes on (torch asserts on some values)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"timeout should be a number of seconds a batch from a worker may take; "
            f"got timeout={timeout!r}"
        )
    if not 0 <= timeout < float("inf"):
        raise ValueError(
            f"timeout should be a finite number of seconds >= 0 (0: wait for ever); "
            f"got timeout={timeout!r}"
        )
    if timeout and num_workers == 0:
        raise ValueError(
            f"timeout={timeout!r} bounds the wait for a batch from a worker process, and "
            f"num_workers=0 reads in this process: leave timeout out, or set num_workers > 0"
        )


def _init_worker(
    parent_pid: int,
    from_main_thread: bool,
    user_init,
    hand_over: bool,
    ring: RingControl | None,
    worker_id: int,
) -> None:
    start_worker(parent_pid, from_main_thread)
    if ring is not None:
        WorkerRing.install(ring, worker_id)
    for core in _view_of(tud.get_worker_info().dataset).loader_spec().cores:  # this worker's copies
        core.hand_over = hand_over  # Note: hand-over
    if user_init is not None:
        user_init(worker_id)


def saved_num_workers(state: dict) -> int:
    """Return the ``num_workers`` of the make_loader loader that saved ``state`` (0 or more).

    Raises:
        ValueError: ``state`` is not a state of a make_loader stateful loader.
    """
    ours = state.get(_KEY) if isinstance(state, dict) else None
    if not isinstance(ours, dict) or ours.get(WORKER) != -1 or NUM_WORKERS not in ours:
        raise ValueError(
            "this state_dict was not saved by a make_loader(..., stateful=True) loader of this "
            "version of tsfile-torch (it has no 'tsfile_torch' record)"
        )
    return int(ours.get(_LOADER_WORKERS, ours[NUM_WORKERS]))


def _topology(point: PassPoint) -> tuple[int, int, int]:
    return point.num_workers, point.rank, point.world_size


def _resume_target(loader):
    """Return what passes of ``loader`` resume through: the iterable dataset, or the loader's
    EpochSampler (None: a sampler of the user's)."""
    if loader._spec.iterable:
        return loader._view
    sampler = loader.batch_sampler if loader._spec.windows else loader.sampler
    return sampler if isinstance(sampler, EpochSampler) else None


def _identity(loader) -> tuple[dict, str]:
    """Return what the loader's order depends on, and who owns it (for messages)."""
    if loader._spec.iterable:
        return loader._view._identity(), type(loader._view).__name__
    sampler = loader.batch_sampler if loader._spec.windows else loader.sampler
    if isinstance(sampler, EpochSampler):
        return sampler.identity(), "EpochSampler"
    return {}, type(loader._view).__name__


def _read_record(loader, saved: dict) -> PassPoint:
    """Return the loader record of ``saved`` after checking it was saved over this order."""
    ours = saved.get(_KEY) if isinstance(saved, dict) else None
    identity, owner = _identity(loader)
    if not isinstance(ours, dict) or ours.get(WORKER) != -1:
        raise ValueError(
            f"cannot load this state_dict into a make_loader loader over a {owner}: it has no "
            f"'tsfile_torch' record (it was not saved by make_loader(..., stateful=True)); "
            f"save the state with loader.state_dict() of a make_loader loader"
        )
    return check_state(ours, identity, owner)


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
        """StatefulDataLoader that resumes under another number of workers or ranks.

        A state of the same topology (``num_workers``, rank, world size) loads through
        torchdata as it is (each worker resumes its own share). Under another topology the
        rest of the saved epoch is handed to the dataset or sampler (Note: elastic resume in
        :mod:`tsfile_torch.sampling.orders`) and the loader starts afresh. Worker failures are
        named as in :class:`TsFileDataLoader`; epoch sums are not checked (a resumed epoch
        hands out only part of the rows).
        """

        _running = None

        def _epoch_sums(self):
            return None

        def state_dict(self) -> dict:
            out = super().state_dict()
            running = self._running() if self._running is not None else None
            point = running.point if running is not None else self._loaded
            if point is None:  # no pass yet: the next one starts its epoch afresh
                point = self._point(self._view.epochs.peek())
            out[_KEY] = pass_state(point, _identity(self)[0])
            out[_KEY][_LOADER_WORKERS] = self.num_workers  # its PassPoint counts 0 as 1
            return out

        def load_state_dict(self, state_dict: dict) -> None:
            if not isinstance(state_dict, dict):
                raise TypeError(
                    f"state_dict must be the dict that state_dict() of a make_loader(..., "
                    f"stateful=True) loader returned; got {type(state_dict).__name__}"
                )
            if not state_dict:
                super().load_state_dict(state_dict)
                return
            record = _read_record(self, state_dict)
            here = self._point(record.epoch)
            if _topology(record) == _topology(here):
                theirs = {k: v for k, v in state_dict.items() if k != _KEY}
                super().load_state_dict(theirs)  # torchdata resumes each worker exactly
                self._loaded = record
                return
            epoch, history = record.elsewhere()
            target = _resume_target(self)
            if target is None:
                raise ValueError(
                    "this loader's sampler is not make_loader's EpochSampler: a state of "
                    "another topology can only resume through it"
                )
            target.resume_elsewhere(epoch, history)
            super().load_state_dict({})

    return TsFileStatefulLoader
