"""The one epoch / position / state mechanism of every dataset.

- :class:`EpochCounter`: which epoch the next pass over a dataset is (Note: epoch word).
- :class:`Pass`: one pass (of an iterable view in one process, or of a sampler): the point it
  resumes from, then its epoch, its batches and how many it has handed out.
- :func:`pass_state` / :func:`check_state`: the one ``state_dict`` layout and its one check,
  used by the iterable datasets' passes and by :class:`~tsfile_torch.data.view.EpochSampler`.

Note: epoch word. Every pass over a dataset is the next epoch unless ``set_epoch`` named one.
The epoch lives in one 64-bit word of shared memory created with the dataset (the main process
owns it; fork, forkserver and spawn workers all map it): the epoch of the latest pass, whether
``set_epoch`` wrote it since (then the next pass takes it as is), and who claimed it: the pid of
that pass's worker 0 and a tag of the pass (from the loader's base seed, drawn in the main
process for every new iterator, and the number of passes the worker's copy of the dataset has
made, which tells a persistent worker's passes apart). Worker 0 claims each pass and writes
the word; every other worker computes the same epoch from the word it reads, without waiting:
a word with its own tag written by a live worker 0 is its pass's claim, any other word is the
state before that claim. A dead claimer means an earlier loader, even if its tag is the same (a
DataLoader rebuilt each epoch with the same seeded generator). A pass in the main process (no
workers, or a sampler) claims for itself. One word is read and written whole, so no lock is
needed. Limit: with workers, one loader at a time iterates one dataset object
(:func:`tsfile_torch.make_loader` refuses a second one while the first runs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from multiprocessing import context, sharedctypes
from typing import Any, NamedTuple

import numpy as np

from tsfile_torch.errors import shared_memory
from tsfile_torch.pids import alive

__all__ = [
    "MAX_EPOCH",
    "Pass",
    "PassPoint",
    "EpochCounter",
    "SharedInt",
    "check_state",
    "pass_state",
    "pass_tag",
    "resume_point",
]

#: Largest epoch the epoch word holds.
MAX_EPOCH = (1 << 24) - 2
_PID_BITS, _TAG_BITS = 22, 16  # Linux pids fit 22 bits; elsewhere they are masked to 22

# state_dict keys
EPOCH, POSITION, WORKER, NUM_WORKERS = "epoch", "position", "worker", "num_workers"
RANK, WORLD_SIZE, ORDER, LAYOUT = "rank", "world_size", "order", "layout"
HISTORY, DATA, FINISHED = "history", "data", "finished"


class _Word(NamedTuple):
    epoch: int  # -1: no pass yet
    explicit: bool  # set_epoch wrote it: the next pass takes it as is
    pid: int  # worker 0 that claimed it, masked to 22 bits; 0: a main-process pass
    tag: int  # tag of the claiming pass (pass_tag); 0: a main-process pass or set_epoch


def _pack(epoch: int, explicit: bool, pid: int = 0, tag: int = 0) -> int:
    pid &= (1 << _PID_BITS) - 1
    word = (epoch + 1) << 1 | int(explicit)
    return (word << _PID_BITS | pid) << _TAG_BITS | tag


def _unpack(word: int) -> _Word:
    tag = word & ((1 << _TAG_BITS) - 1)
    pid = (word >> _TAG_BITS) & ((1 << _PID_BITS) - 1)
    rest = word >> (_TAG_BITS + _PID_BITS)
    return _Word((rest >> 1) - 1, bool(rest & 1), pid, tag)


def pass_tag(base_seed: int, passes: int) -> int:
    """Return the tag of a DataLoader pass, in ``[1, 65535]`` (see Note: epoch word).

    Consecutive passes of the same workers (``passes`` and ``passes + 1``) never share a tag.
    """
    mixed = int(np.random.SeedSequence(base_seed % (1 << 64)).generate_state(1)[0])
    return 1 + (mixed + passes) % ((1 << _TAG_BITS) - 1)


class SharedInt:
    """One int64 shared with DataLoader workers (read and written whole: no lock needed).

    Pickled into workers being started (any start method) it stays shared; pickled otherwise
    (a checkpoint, a copy) it takes the value.
    """

    def __init__(self, value: int):
        self._raw = shared_memory(sharedctypes.RawValue, "q", value, what="the epoch word")

    @property
    def value(self) -> int:
        return int(self._raw.value)

    @value.setter
    def value(self, value: int) -> None:
        self._raw.value = value

    def __getstate__(self):
        if context.get_spawning_popen() is not None:
            return {"raw": self._raw}
        return {"value": self.value}

    def __setstate__(self, state):
        # "raw" in state, not state.get("raw"): a ctypes value of 0 is falsy
        self._raw = state["raw"] if "raw" in state else sharedctypes.RawValue("q", state["value"])


class EpochCounter:
    """The epoch of the latest pass over one dataset, shared with its DataLoader workers."""

    def __init__(self):
        self._word = SharedInt(_pack(-1, False))

    @property
    def latest(self) -> int | None:
        """Epoch of the latest pass, or the one ``set`` named; ``None`` before any."""
        epoch = _unpack(self._word.value).epoch
        return None if epoch < 0 else epoch

    def set(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``."""
        self._word.value = _pack(epoch, True)

    def peek(self) -> int:
        """Return the epoch a new main-process pass would claim now (claiming nothing)."""
        word = _unpack(self._word.value)
        return word.epoch if word.explicit else word.epoch + 1

    def claim(self, tag: int = 0, leader: bool = True) -> int:
        """Return the epoch of a new pass; the leader (worker 0, or the main process) records it.

        ``tag`` 0 is a pass of the main process (always its own leader).
        """
        word = _unpack(self._word.value)
        if not leader and tag == word.tag and alive(word.pid):
            return word.epoch  # this pass's worker 0 has claimed it already
        epoch = word.epoch if word.explicit else word.epoch + 1
        if leader:
            self.record(epoch, tag)
        return epoch

    def record(self, epoch: int, tag: int = 0) -> None:
        """Record that a pass (``tag`` of this process; 0: main) runs ``epoch``."""
        self._word.value = _pack(epoch, False, os.getpid() if tag else 0, tag)


def pass_state(point: PassPoint, identity: dict) -> dict[str, Any]:
    """Return the state of a pass: where it stands, under which topology, and its order."""
    return {
        EPOCH: point.epoch,
        POSITION: point.position,
        WORKER: point.worker,
        NUM_WORKERS: point.num_workers,
        RANK: point.rank,
        WORLD_SIZE: point.world_size,
        HISTORY: [list(h) for h in point.history],
        FINISHED: point.finished,
        **identity,
    }


class PassPoint(NamedTuple):
    """Where a pass stands: the one record every ``state_dict`` of a pass is written from.

    ``worker`` of ``num_workers`` (1: the main process; ``worker`` -1: a whole loader, counted in
    the main process) of rank ``rank`` of ``world_size`` had delivered ``position`` batches of
    ``epoch``, and ``finished`` it; ``history`` holds the topologies the epoch ran under before
    this one (Note: elastic resume in :mod:`tsfile_torch.sampling.orders`). A view's iterable
    passes, a sampler's passes and a make_loader loader's own record are all this.
    """

    epoch: int | None
    position: int
    worker: int = 0
    num_workers: int = 1
    rank: int = 0
    world_size: int = 1
    history: tuple = ()
    finished: bool = False

    @property
    def topology(self) -> tuple[int, int, int, int]:
        """(worker, num_workers, rank, world_size): where the pass ran."""
        return self.worker, self.num_workers, self.rank, self.world_size

    def handed_over(self, delivered: int | None = None) -> tuple:
        """Return the history of the rest of this pass under another topology.

        ``delivered``: batches this rank delivered (default: this pass's position, right for a
        main-process pass, a sampler or a loader; a worker's share is not the rank's).
        """
        done = self.position if delivered is None else delivered
        return (*self.history, (self.world_size, max(self.num_workers, 1), done))

    def elsewhere(self) -> tuple[int, tuple]:
        """Return (epoch, history) that resume this pass under another topology: the rest of
        its epoch, or the next epoch afresh when it had finished."""
        if self.finished:
            return self.epoch + 1, ()
        return self.epoch, self.handed_over()


def check_state(saved: Any, identity: dict, owner: str) -> PassPoint:
    """Return where ``saved`` stands after checking it was saved with ``identity``.

    Note: state identity. A state records what it was saved over: the order (``order``), how
    items fall into batches (``layout``) and what the items are made of (``data``: a
    fingerprint per part, see :meth:`~tsfile_torch.data.view.View.data_identity`). The data is
    compared first (other data usually changes the layout too) and the message names the part.

    Raises:
        TypeError: ``saved`` is not a dict.
        ValueError: a key is missing, or the state was saved with another order, seed, batch
            size or data (the message names the first difference).
    """
    if not isinstance(saved, dict):
        raise TypeError(
            f"state_dict must be a dict, as state_dict() of {owner} returns it; got "
            f"{type(saved).__name__} {_short(saved)}"
        )
    keys = [EPOCH, POSITION, *identity]
    if not set(keys) <= set(saved):
        raise ValueError(
            f"a state_dict of {owner} needs the keys {sorted(keys)}; got {sorted(saved)}"
        )
    for key in sorted(identity, key=lambda k: k != DATA):
        mine, theirs = identity[key], saved[key]
        if key == DATA and _plain(theirs) != _plain(mine):
            raise ValueError(
                f"cannot load this state_dict into {owner}: it was saved over other data "
                f"({_data_difference(theirs, mine)}); build the dataset over the same sources, "
                f"columns and settings as when the state was saved"
            )
        if _plain(theirs) != _plain(mine):
            raise ValueError(
                f"cannot load this state_dict into {owner}: it was saved with {key}={theirs!r}, "
                f"this one has {key}={mine!r}; build the dataset and loader as when the state "
                f"was saved (the order, seed, batch size and data must be the same; ranks and "
                f"workers may differ)"
            )
    epoch, position = saved[EPOCH], saved[POSITION]
    if epoch is None:
        return PassPoint(None, 0)
    if not (isinstance(epoch, int) and 0 <= epoch <= MAX_EPOCH and isinstance(position, int)):
        raise ValueError(f"state_dict of {owner}: bad epoch / position {epoch!r} / {position!r}")
    return PassPoint(
        epoch,
        position,
        int(saved.get(WORKER, 0)),
        int(saved.get(NUM_WORKERS, 1)),
        int(saved.get(RANK, 0)),
        int(saved.get(WORLD_SIZE, 1)),
        tuple(tuple(int(v) for v in h) for h in saved.get(HISTORY, ())),
        bool(saved.get(FINISHED, False)),
    )


_PARTS = {
    "files": "other files: their names differ",
    "columns": "other columns",
    "rows": "other rows: the row count of a device or table, or the time range, differs",
    "content": "other file contents: the time ranges or value statistics of the columns differ",
}


def _data_difference(theirs, mine) -> str:
    """Return which parts of two data identities differ, in words (Note: state identity)."""
    if not (isinstance(theirs, dict) and isinstance(mine, dict)):
        return f"fingerprint {theirs!r}, this one {mine!r}"
    parts = sorted(set(theirs) | set(mine))
    differ = [p for p in parts if _plain(theirs.get(p)) != _plain(mine.get(p))]
    if "columns" in differ and "content" in differ:
        differ.remove("content")  # other columns have other statistics: say the cause
    out = []
    for part in differ:
        a, b = theirs.get(part), mine.get(part)
        if isinstance(a, dict) and isinstance(b, dict):  # settings kept readable
            changed = [
                f"{k}={a.get(k)!r}, this one {k}={b.get(k)!r}"
                for k in sorted(set(a) | set(b))
                if _plain(a.get(k)) != _plain(b.get(k))
            ]
            out.append(f"other {part} settings: saved with {'; '.join(changed)}")
        else:
            out.append(_PARTS.get(part, f"other {part}"))
    return "; ".join(out)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(value):
    """Compare lists and tuples alike (a state may come back from JSON or torch.load)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class Pass(Iterator[np.ndarray]):
    """The one pass state of every view and sampler: a pass in progress, or one loaded to resume.

    Before it begins, a pass may hold ``pending``, a loaded :class:`PassPoint` it resumes from
    (:func:`resume_point`). :meth:`begin` gives it its epoch, its batches (the share of the
    process that runs it) and its position; it then hands out batches and counts them. It owns
    its position: two passes over one dataset never share or move each other's counter.
    ``topology``: (worker, workers, rank, world size) where it runs; ``history``: the topologies
    its epoch ran under before (Note: elastic resume). :meth:`point` is the :class:`PassPoint`
    every ``state_dict`` is written from.
    """

    def __init__(self, topology: tuple[int, int, int, int] = (0, 1, 0, 1), pending=None):
        self.topology = topology
        self.pending: PassPoint | None = pending
        self.epoch: int | None = None
        self.batches: Sequence[np.ndarray] | None = None  # None: not begun
        self.position = 0
        self.history: tuple = ()
        self.finished = False  # raised StopIteration

    @property
    def begun(self) -> bool:
        return self.batches is not None

    def start(self, epochs: EpochCounter, tag: int = 0, leader: bool = True, whole=None):
        """Return (epoch, position, history) this pass begins at: its pending point resumed
        (:func:`resume_point`; ``whole``: the point is of a whole pass of its rank, default:
        saved by one process), or the epoch ``epochs`` gives the next pass."""
        saved, self.pending = self.pending, None
        if saved is None:
            return epochs.claim(tag, leader), 0, ()
        whole = saved.num_workers == 1 if whole is None else whole
        epoch, position, history = resume_point(saved, self.topology, whole)
        if leader:
            epochs.record(epoch, tag)
        return epoch, position, history

    def begin(self, epoch: int, batches: Sequence[np.ndarray], position=0, history=()) -> Pass:
        if not 0 <= position <= len(batches):
            raise ValueError(
                f"cannot resume epoch {epoch} at batch {position}: it has {len(batches)} batches"
            )
        self.epoch, self.batches, self.position, self.history = epoch, batches, position, history
        return self

    def __len__(self) -> int:
        return len(self.batches)

    def __next__(self) -> np.ndarray:
        if self.position >= len(self.batches):
            self.finished = True
            raise StopIteration
        self.position += 1  # before handing out: a state read next counts this batch
        return self.batches[self.position - 1]

    def point(self) -> PassPoint:
        """Return where this pass stands (its pending point before it begins)."""
        if not self.begun and self.pending is not None:
            return self.pending
        return PassPoint(self.epoch, self.position, *self.topology, self.history, self.finished)


def resume_point(saved: PassPoint, here: tuple, whole: bool) -> tuple[int, int, tuple]:
    """Return (epoch, position, history) that resume ``saved`` in a pass of topology ``here``.

    The same topology resumes exactly; a point handed over by a loader (worker -1) or one of a
    whole pass of its rank (``whole``: a sampler's, a main process's) under another topology
    resumes the rest of the epoch (Note: elastic resume); a single worker's share cannot (it
    does not know what the other workers delivered).
    """
    if saved.worker < 0:  # handed over by the loader: the rest of the epoch, from its start
        return saved.epoch, 0, saved.history
    if saved.topology == tuple(here):
        return saved.epoch, saved.position, saved.history
    if whole:
        return saved.epoch, 0, saved.handed_over()
    worker, num_workers, rank, world_size = here
    raise ValueError(
        f"this state_dict was saved by worker {saved.worker} of {saved.num_workers} of rank "
        f"{saved.rank} of {saved.world_size} and is resumed by worker {worker} of "
        f"{num_workers} of rank {rank} of {world_size}: one worker's state does "
        f"not say what the other workers delivered; load the loader's state_dict (it holds "
        f"every worker's), which resumes under any number of workers and ranks"
    )
