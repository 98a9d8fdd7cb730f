"""Several window datasets drawn with probabilities: :class:`MixedWindows` (Chronos-style).

A mixture is a view of its datasets (Note: a dataset kind is a view): its items are their
windows numbered one dataset after another, and its order is ``"random"`` with
``block_weights`` (:mod:`tsfile_torch.sampling.orders`): each draw picks a dataset with its
weight, then a window of it as that dataset's ``device_weights`` says (``"length"``: any window;
``"uniform"``: a device, then a window). The draw is a pure function of (seed, epoch), so a
mixture shards over ranks and workers and resumes like every dataset; each dataset reads its
windows through its own reading core.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch.data.view import KeptBatch, LoaderSpec, View, data_fingerprint, resolve_rank
from tsfile_torch.data.window_items import WindowBatch, window_loader_spec
from tsfile_torch.data.windows import TsFileWindowDataset, window_block
from tsfile_torch.integrity.reports import ReadSlots
from tsfile_torch.sampling.orders import OrderSpec
from tsfile_torch.sampling.passes import Passes

__all__ = ["MixedWindows"]

#: What every dataset of a mixture must agree on, so their windows stack into one batch.
_SHAPE = ("context_length", "horizon", "return_dict", "time_features")


class MixedWindows(View, tud.Dataset):
    """Windows of several :class:`TsFileWindowDataset` drawn with given probabilities.

    Item ``i`` is window ``i - offset[d]`` of dataset ``d`` (datasets one after another);
    ``len(mix)`` is their total. Each epoch draws ``num_samples`` windows: a dataset with
    probability ``weights[d] / sum(weights)``, then one of its windows (by its
    ``device_weights``). With ``return_dict=True`` datasets, ``device_id`` indexes
    :attr:`devices` (every dataset's devices, in dataset order) and
    ``static_categorical_features`` stay codes into the own dataset's ``tag_vocab``. Batch it with
    :func:`tsfile_torch.make_loader` (``make_loader(mix, batch_size=64, num_workers=2)``).

    Args:
        datasets: window datasets with the same ``context_length``, ``horizon``, number of
            columns and targets, ``dtype``, ``return_dict`` and ``time_features``.
        weights: probability weight of each dataset (>= 0, not all 0); ``None``: equal.
        num_samples: windows per epoch, >= 1.
        seed, drop_last, rank, world_size: as for the datasets.

    Raises:
        TypeError: a dataset is not a TsFileWindowDataset. ValueError: datasets whose windows
        do not stack, or bad weights.
    """

    kind = "window mixture"

    def __init__(
        self,
        datasets: Sequence[TsFileWindowDataset],
        weights: Sequence[float] | None = None,
        *,
        num_samples: int,
        seed: int = 0,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ):
        datasets = list(datasets)
        if not datasets:
            raise ValueError("MixedWindows needs at least one TsFileWindowDataset")
        for d in datasets:
            if not isinstance(d, TsFileWindowDataset):
                raise TypeError(f"MixedWindows mixes TsFileWindowDatasets; got {type(d).__name__}")
        first = datasets[0]
        for i, d in enumerate(datasets[1:], 1):
            for name in _SHAPE:
                if getattr(d, name) != getattr(first, name):
                    raise ValueError(
                        f"datasets[{i}].{name}={getattr(d, name)!r} differs from datasets[0]'s "
                        f"{getattr(first, name)!r}: a mixture's windows must stack into one batch"
                    )
            grids = [x.core.grid_spec for x in (first, d)]
            steps = [g and g.step for g in grids]
            if steps[0] != steps[1]:
                label = [g.label if g else None for g in grids]
                raise ValueError(
                    f"datasets[{i}] is on the time grid freq={label[1]!r} and datasets[0] on "
                    f"freq={label[0]!r}: a mixture's windows must have one step; build them "
                    f"with the same freq="
                )
            shapes = [
                (len(x.columns), len(x.targets), x.options.dtype, len(x.tag_vocab))
                for x in (first, d)
            ]
            if shapes[0] != shapes[1]:
                raise ValueError(
                    f"datasets[{i}] has (columns, targets, dtype, tag levels) {shapes[1]}, "
                    f"datasets[0] {shapes[0]}: a mixture's windows must stack into one batch"
                )
        if weights is None:
            weights = [1.0] * len(datasets)
        weights = np.asarray(list(weights), dtype=np.float64)
        if len(weights) != len(datasets) or not np.isfinite(weights).all() or (weights < 0).any():
            raise ValueError(
                f"weights must be one finite weight >= 0 per dataset ({len(datasets)}); got "
                f"{weights.tolist()}"
            )
        if weights.sum() <= 0:
            raise ValueError(f"weights must not all be 0; got {weights.tolist()}")
        self.datasets = datasets
        self.weights = tuple((weights / weights.sum()).tolist())
        self._offsets = np.cumsum([0] + [len(d) for d in datasets]).astype(np.int64)
        self._device_offsets = np.cumsum([0] + [len(d.devices) for d in datasets]).astype(np.int64)
        starts, block_weights = [], []
        for d, share, offset in zip(datasets, self.weights, self._offsets, strict=False):
            if d.device_weights == "uniform":
                bounds = np.unique(d.index.first)
            else:
                bounds = np.array([0, len(d)], dtype=np.int64)
            starts.append(offset + bounds[:-1])
            block_weights += [share / (len(bounds) - 1)] * (len(bounds) - 1)
        self._starts = np.concatenate(starts + [self._offsets[-1:]]).astype(np.int64)
        self.order_spec = OrderSpec(
            "random", seed, drop_last, 16, num_samples, block_weights=tuple(block_weights)
        )
        self.passes = Passes(self, *resolve_rank(rank, world_size))
        self.slots: ReadSlots | None = ReadSlots()
        for d in datasets:  # their reads report into the mixture's slots (Note: worker reports)
            d.core.slots = self.slots
        self.passes.check_sharding(1)

    # -- items ------------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def devices(self) -> list[str]:
        """Every dataset's devices, dataset by dataset (what ``device_id`` indexes)."""
        return [name for d in self.datasets for name in d.devices]

    @property
    def block_rows(self) -> int:
        return max(d.block_rows for d in self.datasets)

    def _layout(self) -> tuple[np.ndarray, int]:
        return self._starts, 1

    def _batch_key(self, items: np.ndarray, batch_size: int | None) -> list[int]:
        return items.tolist()

    def __getitem__(self, index):
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"index must be an integer window number; got {index!r}")
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> WindowBatch:
        """Return the windows ``indices`` (each read by its own dataset) as one batch."""
        idx = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if ((idx < 0) | (idx >= n)).any():
            raise IndexError(f"window indices must be in [0, {n}); got {idx.tolist()[:8]}")
        if not len(idx):  # an empty batch, as slicing gives
            return self.datasets[0].__getitems__([])
        which = np.searchsorted(self._offsets, idx, side="right") - 1
        order = np.argsort(which, kind="stable")
        used = np.unique(which).tolist()
        local = {d: (idx[which == d] - self._offsets[d]).tolist() for d in used}
        # each dataset fills its store before it says kept (Note: hand-over): a check before
        # the gather would hand over windows an empty store lacks, and the main process decodes
        gathered = {d: self.datasets[d].gather(local[d], hand_over=True) for d in used}
        if all(isinstance(b, KeptBatch) for b in gathered.values()):
            return KeptBatch((idx.tolist(),))
        pieces = []
        for d in used:
            batch = gathered[d]
            if isinstance(batch, KeptBatch):  # kept here, but another dataset's are not
                batch = self.datasets[d].gather(local[d])
            parts = list(batch.parts)
            if batch.keys is not None:  # device ids across the mixture
                j = batch.keys.index("device_id")
                parts[j] = parts[j] + int(self._device_offsets[d])
            pieces.append((batch.keys, parts))
        keys = pieces[0][0]
        back = torch.from_numpy(np.argsort(order, kind="stable"))
        joined = tuple(
            torch.cat([p[1][j] for p in pieces])[back] if len(pieces) > 1 else pieces[0][1][j]
            for j in range(len(pieces[0][1]))
        )
        return WindowBatch(joined, keys)

    @property
    def options(self):
        return self.datasets[0].options

    @property
    def _slots(self):
        return self.slots

    def close(self) -> None:
        for d in self.datasets:
            d.close()

    def data_identity(self) -> str:
        """A fingerprint of the datasets' data and the weights mixing them."""
        return data_fingerprint([[d.data_identity() for d in self.datasets], self.weights])

    def loader_spec(self) -> LoaderSpec:
        """Windows batched by the loader, read by each dataset's core (Note: hand-over)."""
        # random draws from every dataset: each batch gathers from blocks all over them
        blocks = [window_block(d) for d in self.datasets]
        largest = (max(r for r, _ in blocks), max(w for _, w in blocks))
        return window_loader_spec(self, [d.core for d in self.datasets], self.slots, largest)

    def __getstate__(self):
        out = super().__getstate__()
        from multiprocessing import context

        if context.get_spawning_popen() is None:  # a plain pickle takes no shared memory
            out["slots"] = None
        return out

    def stats(self, exact: bool = False) -> dict[str, dict]:
        raise NotImplementedError("a mixture has no statistics of its own; ask its datasets")

    def __repr__(self) -> str:
        return (
            f"MixedWindows({len(self.datasets)} datasets, weights={list(self.weights)}, "
            f"num_samples={self.order_spec.num_samples}, {len(self)} windows)"
        )
