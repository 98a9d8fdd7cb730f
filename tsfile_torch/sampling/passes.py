"""Passes: the order, epochs and resumable passes of one view (rows, windows, a mixture).

A view hands its :class:`Passes` itself (held by a weak reference, so a view and its passes
make no reference cycle and a dropped view closes its files at once); the passes ask it what
order is in force (``view.spec``) and how its items fall into blocks (``view._layout()``:
block starts, items per batch; ``view._layout_extra()``, if it has one, what else a resumed
state must agree on). Everything else about a pass lives here, so every view (and every
sampler over one) saves, loads and resumes alike:

- the epoch of the next pass (:class:`~tsfile_torch.sampling.state.EpochCounter`, shared with
  DataLoader workers), ``set_epoch``;
- this rank's batches of an epoch (:meth:`Passes.epoch_batches`, a pure function of (seed,
  epoch, rank, world size), Note: elastic resume in :mod:`tsfile_torch.sampling.orders`);
- the pass of an iterable view in this process (:meth:`Passes.begin`: a worker's share), its
  ``state_dict`` / ``load_state_dict``, and resuming under another topology.

Note: resume. Order is a pure function, so a pass is (epoch, position) plus what the order
depends on (:func:`~tsfile_torch.sampling.state.pass_state`), and resuming slices the epoch's
batches: the skipped ones are never read. An iterable view's state is its latest pass in the
calling process (each DataLoader worker has its own; ``StatefulDataLoader`` collects them); a
map-style view's is its sampler's (the loader's).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from tsfile_torch.errors import warn_caller
from tsfile_torch.options import check_int
from tsfile_torch.sampling import orders, state
from tsfile_torch.sampling.orders import OrderSpec

__all__ = ["Passes"]


class Passes:
    """The order and passes of one view (see the module notes).

    Args:
        view: the view whose passes these are (see the module notes).
        rank, world_size: this process's DDP rank and the number of ranks (fixed at build).
    """

    def __init__(self, view, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self._data: dict | str | None = None
        self.bind(view)
        self.epochs = state.EpochCounter()
        self._passes = 0
        self._latest: state.Pass | None = None  # this process's latest pass
        self._resume: state.PassPoint | None = None

    def bind(self, view) -> None:
        """Make these the passes of ``view`` (again, after unpickling)."""
        self._view = weakref.ref(view)
        self.kind = view.kind

    def __getstate__(self):
        out = self.__dict__.copy()
        out["_latest"] = None  # a pass belongs to the process that runs it
        out["_view"] = None  # bound again by the view (View.__setstate__)
        return out

    @property
    def spec(self) -> OrderSpec:
        return self._view().spec

    def _layout(self) -> tuple[np.ndarray, int]:
        return self._view()._layout()

    # -- epochs ------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (later passes count on from it)."""
        self.epochs.set(check_int("epoch", epoch, 0, state.MAX_EPOCH))

    @property
    def epoch(self) -> int | None:
        """Epoch of the latest pass (or the one ``set_epoch`` named); ``None`` before any."""
        return self.epochs.latest

    def begin_main_pass(self) -> tuple[int, tuple]:
        """Decide, in the main process, the epoch of the pass a loader is about to start; return
        it and the history it resumes after (Note: loader resume in :mod:`tsfile_torch.loader`).

        A pending resume keeps its epoch; else the next epoch is set, and the loader's workers
        (persistent or not, any start method: they read the shared epoch word) take it as is.
        """
        if self._resume is not None:
            return self._resume.epoch, self._resume.history
        epoch = self.epochs.peek()
        self.epochs.set(epoch)
        return epoch, ()

    # -- batches -----------------------------------------------------------------------------
    def identity(self, batch_size: int | None = None) -> dict[str, Any]:
        """What the delivered order depends on besides the epoch (checked on resume)."""
        starts, per_batch = self._layout()
        view = self._view()
        layout = [int(starts[-1]), len(starts) - 1, batch_size or per_batch]
        extra = getattr(view, "_layout_extra", None)
        if extra is not None:
            layout += extra()
        if self._data is None:  # what the items are made of: fixed once the view is built
            self._data = view.data_identity()
        return {state.ORDER: self.spec.identity, state.LAYOUT: layout, state.DATA: self._data}

    def epoch_batches(
        self, epoch: int, batch_size: int | None = None, history: tuple = ()
    ) -> list[np.ndarray]:
        """Return this rank's batches of ``epoch`` (arrays of items), before the worker split.

        ``history``: what earlier topologies delivered of this epoch (Note: elastic resume).
        """
        starts, per_batch = self._layout()
        return orders.plan_epoch(
            self.spec, starts, epoch, self.rank, self.world_size, batch_size or per_batch, history
        )

    def worker_batches(self, epoch: int, worker: int, num_workers: int) -> list[np.ndarray]:
        """Return the batches (item arrays) one worker of this rank yields in ``epoch``."""
        batches = self.epoch_batches(epoch)
        split = orders.worker_batches(batches, worker, num_workers, self.spec.order)
        return [batches[i] for i in split]

    def check_sharding(self, batch_size: int | None = None) -> None:
        """Refuse shardings that cannot give every rank the same items; warn on no batches."""
        starts, _ = self._layout()
        spec = self.spec
        orders.check_sharding(spec.num_samples or int(starts[-1]), self.world_size, spec.drop_last)
        if not self.epoch_batches(0, batch_size):
            warn_caller(
                f"the {self.kind} yields no batches on rank {self.rank}: drop_last=True and "
                f"fewer items than one batch; lower batch_size or set drop_last=False"
            )

    # -- iterable passes ---------------------------------------------------------------------
    def begin(self, worker: int = 0, num_workers: int = 1, base_seed: int | None = None):
        """Start a pass in this process (a worker's share of it, in a worker).

        ``base_seed``: the DataLoader's base seed in a worker (None: the main process).
        Returns the :class:`~tsfile_torch.sampling.state.Pass`.
        """
        self._passes += 1
        tag = 0 if base_seed is None else state.pass_tag(base_seed, self._passes)
        run = state.Pass((worker, num_workers, self.rank, self.world_size), self._resume)
        self._resume = None
        epoch, position, history = run.start(self.epochs, tag, leader=worker == 0)
        batches = self.epoch_batches(epoch, history=history)
        split = orders.worker_batches(batches, worker, num_workers, self.spec.order)
        self._latest = run.begin(epoch, [batches[i] for i in split], position, history)
        return self._latest

    @property
    def resuming(self) -> bool:
        """Whether the next pass resumes a loaded state (or one handed over)."""
        return self._resume is not None

    def resume_elsewhere(self, epoch: int, history: tuple) -> None:
        """Make the next pass deliver the rest of ``epoch`` after ``history`` (any topology)."""
        self._resume = state.PassPoint(epoch, 0, -1, -1, self.rank, self.world_size, tuple(history))

    def state_dict(self) -> dict[str, Any]:
        """Return where this process's latest pass stands (see Note: resume).

        ``epoch`` is ``None`` before the first pass here; a loaded state not yet resumed is
        returned as loaded.
        """
        if self._resume is not None:
            point = self._resume
        elif self._latest is None:
            point = state.PassPoint(None, 0, 0, 1, self.rank, self.world_size)
        else:
            point = self._latest.point()
        return state.pass_state(point, self.identity())

    def load_state_dict(self, saved: dict[str, Any], owner: str) -> None:
        """Make the next pass resume where ``saved`` stood; later passes count on from it.

        Raises:
            ValueError: ``saved`` comes from a view with another order, seed, batch size or
                data.
        """
        point = state.check_state(saved, self.identity(), owner)
        self._resume = point if point.epoch is not None else None
