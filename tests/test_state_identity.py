"""A resume state loads only where it was saved: same data, columns, window settings and order.

Note: state identity (tsfile_torch/sampling/state.py). The data sets below have the same file
names, columns and row counts; only their timestamps or values differ, so a state that
recorded the layout alone loaded into each of them.
"""

from __future__ import annotations

import numpy as np
import pytest

from tsfile_torch import (
    EpochSampler,
    TsFileDataset,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)

SPEC = synthetic.DatasetSpec(num_files=2, devices_per_file=1, fields_per_device=4, num_rows=4000)
ROWS = 200  # rows per batch: 20 batches an epoch


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """``same``: the data; ``times``: other timestamps; ``values``: other values (same names,
    columns and rows everywhere)."""
    base = tmp_path_factory.mktemp("identity")
    synthetic.write_table_files(base / "same", SPEC)
    synthetic.write_table_files(base / "times", SPEC, start_time=10**6)
    synthetic.write_table_files(base / "values", SPEC, row_offset=7, start_time=-7)
    return {name: base / name for name in ("same", "times", "values")}


def _rows(start: int, stop: int) -> np.ndarray:
    rows = np.arange(start, stop)
    return np.stack([synthetic.value_of(f, c, rows) for f in range(2) for c in range(4)], axis=1)


def _saved_after_5_batches(cls, directory) -> dict:
    loader = make_loader(cls(directory, batch_size=ROWS, dtype="float64"), stateful=True)
    it = iter(loader)
    for _ in range(5):
        next(it)
    return loader.state_dict()


CHANGES = {
    "two columns": ("same", {"columns": ["t.d0.s0", "t.d0.s1"]}, r"other columns\)"),
    "other timestamps": ("times", {}, "other file contents: the time ranges or value statistics"),
    "other values": ("values", {}, "other file contents"),
    "other seed": ("same", {"seed": 3}, r"saved with order=\{.*'seed': 0.*this one.*'seed': 3"),
    "other order": ("same", {"shuffle": True}, r"saved with order=\{'order': 'sequential'"),
}


@pytest.mark.parametrize("cls", [TsFileIterableDataset, TsFileDataset])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_loader_state_loads_only_into_a_loader_over_the_same_data(sets, cls, change):
    saved = _saved_after_5_batches(cls, sets["same"])
    where, kwargs, match = CHANGES[change]
    other = make_loader(cls(sets[where], batch_size=ROWS, dtype="float64", **kwargs), stateful=True)
    with pytest.raises(ValueError, match=f"cannot load this state_dict into .*{match}"):
        other.load_state_dict(saved)
    same = make_loader(cls(sets["same"], batch_size=ROWS, dtype="float64"), stateful=True)
    same.load_state_dict(saved)  # the data it was saved over: the other 15 batches, exactly
    rest = [batch.numpy() for batch in same]
    assert len(rest) == 15 and np.array_equal(np.concatenate(rest), _rows(5 * ROWS, 4000))


@pytest.mark.parametrize("cls", [TsFileIterableDataset, TsFileDataset])
def test_a_datasets_own_state_loads_only_into_a_dataset_over_the_same_data(sets, cls):
    ds = cls(sets["same"], batch_size=ROWS)
    if cls is TsFileIterableDataset:
        it = iter(ds)
        for _ in range(5):
            next(it)
    saved = ds.state_dict()
    for change in ("two columns", "other timestamps", "other values"):
        where, kwargs, match = CHANGES[change]
        with pytest.raises(ValueError, match=f"into {cls.__name__}: .*{match}"):
            cls(sets[where], batch_size=ROWS, **kwargs).load_state_dict(saved)
    again = cls(sets["same"], batch_size=ROWS)
    again.load_state_dict(saved)
    assert again.state_dict() == saved


WINDOW_CHANGES = {
    "context and horizon": (
        {"context_length": 16, "horizon": 16},  # as many windows as 24 + 8
        "other windows settings: saved with context_length=24, this one context_length=16; "
        "horizon=8, this one horizon=16",
    ),
    "min_context": ({"min_context": 12}, "min_context=None, this one min_context=12"),
    "targets": (
        {"targets": ["s1"]},
        r"targets=\['s0', 's1', 's2', 's3'\], this one targets=\['s1'\]",
    ),
    "other values": ({"sources": "values"}, "other file contents"),
}


@pytest.mark.parametrize("change", list(WINDOW_CHANGES))
def test_a_window_state_loads_only_under_the_same_window_settings(sets, change):
    def windows(sources="same", **kwargs):
        settings = {"context_length": 24, "horizon": 8, "stride": 5, **kwargs}
        return TsFileWindowDataset(sets[sources], **settings)

    loader = make_loader(windows(), batch_size=10, stateful=True)
    it = iter(loader)
    for _ in range(5):
        next(it)
    saved = loader.state_dict()
    kwargs, match = WINDOW_CHANGES[change]
    with pytest.raises(ValueError, match=match):
        make_loader(windows(**kwargs), batch_size=10, stateful=True).load_state_dict(saved)
    sampler = EpochSampler(windows(), batch_size=10)
    next(iter(sampler))
    with pytest.raises(ValueError, match=match):
        EpochSampler(windows(**kwargs), batch_size=10).load_state_dict(sampler.state_dict())
    make_loader(windows(), batch_size=10, stateful=True).load_state_dict(saved)  # same: loads


@pytest.mark.parametrize("garbage", ["garbage", ["epoch", 0], None], ids=["str", "list", "None"])
def test_a_state_dict_that_is_not_a_dict_is_a_type_error_naming_state_dict(sets, garbage):
    rows = TsFileDataset(sets["same"], batch_size=ROWS)
    owners = {
        "TsFileIterableDataset": TsFileIterableDataset(sets["same"], batch_size=ROWS),
        "TsFileDataset": rows,
        "TsFileWindowDataset": TsFileWindowDataset(sets["same"], 24, 8),
        "EpochSampler": EpochSampler(rows),
    }
    got = type(garbage).__name__
    for owner, target in owners.items():
        with pytest.raises(TypeError, match=f"state_dict must be a dict.*{owner}.*; got {got}"):
            target.load_state_dict(garbage)
    loader = make_loader(rows, stateful=True)
    with pytest.raises(TypeError, match=rf"state_dict must be the dict .*stateful=True.*got {got}"):
        loader.load_state_dict(garbage)
