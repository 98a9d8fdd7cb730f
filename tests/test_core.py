"""The reading core as a caller sees it: called directly, by every view, in any process."""

from __future__ import annotations

import ast
import gc
import pathlib
import pickle
import weakref

import numpy as np
import pytest

from tsfile_torch import (
    MixedWindows,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)
from tsfile_torch.data.view import KeptBatch
from tsfile_torch.loader import _InMain
from tsfile_torch.read.core import STORES, ReadingCore

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_script_reads_rows_through_the_core_without_a_dataset(small_dir, small_expected):
    core = ReadingCore.for_rows(small_dir, columns=["t.d1.*"], read_backend="mmap")
    assert core.catalog.column_names == ["t.d1.s0", "t.d1.s1", "t.d1.s2"]
    want = small_expected[:, 3:6].astype(np.float32)  # file 0's device d1
    values, times = core.rows(0, 4000, 4100)
    np.testing.assert_array_equal(values, want[4000:4100])
    np.testing.assert_array_equal(times, np.arange(4000, 4100))
    rows = np.array([3, 17, 4999])
    values, times = core.take(0, rows)
    np.testing.assert_array_equal(values, want[rows])
    np.testing.assert_array_equal(times, rows)
    assert core.backends and set(core.backends.values()) == {"mmap"}


@pytest.mark.parametrize("decode_threads", [1, 2])
def test_a_gather_of_scattered_columns_across_blocks_and_a_time_range_is_exact(
    small_dir, small_expected, decode_threads
):
    # columns out of catalog order (a device's fields apart: no slice per group), several
    # blocks per group, rows in any order with repeats, and a time range that clips blocks
    names = ["t.d1.s2", "t.d0.s0", "t.d1.s0", "t.d0.s2", "t.d1.s1"]
    every = [f"t.d{d}.s{f}" for d in range(2) for f in range(3)]
    core = ReadingCore.for_rows(
        small_dir,
        columns=names,
        block_rows=700,
        start_time=350,
        end_time=4649,
        decode_threads=decode_threads,
    )
    assert core.catalog.column_names == names
    want = small_expected[350:4650][:, [every.index(n) for n in names]].astype(np.float32)
    rng = np.random.default_rng(7)
    for rows in (
        rng.integers(0, 4300, 3000),
        np.array([4299, 0, 0, 699, 700, 2]),
        rng.permutation(4300),
    ):
        values, times = core.take(0, rows)
        np.testing.assert_array_equal(values, want[rows])
        np.testing.assert_array_equal(times, rows + 350)
    core.set_range(1000, 3000)  # a worker's share: rows outside it are read exactly
    rows = np.array([100, 1500, 2900, 4000, 4299, 1500])
    values, times = core.take(0, rows)
    np.testing.assert_array_equal(values, want[rows])
    np.testing.assert_array_equal(times, rows + 350)


def test_a_pickled_core_reads_the_same_rows_in_a_new_interpreter(small_dir, run_python, tmp_path):
    core = ReadingCore.for_rows(small_dir, columns=["t.d0.s2"])
    values, _ = core.rows(0, 10, 20)  # opens a reader here: it must not travel
    path = tmp_path / "core.pkl"
    path.write_bytes(pickle.dumps(core))
    code = (
        "import pickle, sys; core = pickle.load(open(sys.argv[1], 'rb'));"
        "print(core.rows(0, 10, 20)[0].ravel().tolist())"
    )
    done = run_python(code, str(path), check=True)
    assert eval(done.stdout.strip()) == values.ravel().tolist()


@pytest.mark.parametrize("cache", sorted(STORES))
def test_every_store_gives_the_streamed_rows_and_keeps_what_it_says(small_dir, tmp_path, cache):
    plain = ReadingCore.for_rows(small_dir, columns=["t.d0.*"])
    core = ReadingCore.for_rows(small_dir, columns=["t.d0.*"], cache=cache, cache_dir=tmp_path)
    for _ in range(2):
        for start in range(0, 5000, 1250):
            got = core.rows(0, start, start + 1250)
            want = plain.rows(0, start, start + 1250)
            np.testing.assert_array_equal(got[0], want[0])
            np.testing.assert_array_equal(got[1], want[1])
    store = core.store()
    if cache == "none":
        assert store is None
    else:
        assert store.has(0, 0, 5000) and store.values.shape == (5000, 3)


def test_the_finalized_blocks_of_a_window_view_live_in_its_core(ragged_panel):
    ds = TsFileWindowDataset(ragged_panel, 24, 8, stride=4)
    assert ds.core.cached_bytes == 0
    ds.gather(list(range(10)))
    assert ds.core.cached_bytes > 0 and ds.cached_bytes == ds.core.cached_bytes
    ds.close()
    assert ds.core.cached_bytes == 0


def test_a_gather_is_handed_over_only_once_the_tables_it_needs_are_kept(ragged_panel, tmp_path):
    # asked before the rows are there, kept(None) says no: a worker that asked first would
    # hand over a batch the main process then decodes itself
    ds = TsFileWindowDataset(ragged_panel, 24, 8, cache="disk", cache_dir=tmp_path)
    core = ds.core
    core.hand_over = True  # as in a make_loader worker with make_loader's collate function
    assert not core.kept(None) and not core.kept(None, tables=[1])
    core.fill(1)
    assert core.kept(None, tables=[1]) and not core.kept(None, tables=[0, 1])
    assert not core.kept(None)  # every table: devices 0 and 2 are not kept yet
    core.fill(0)
    core.fill(2)
    assert core.kept(None)
    core.hand_over = False
    assert not core.kept(None)


def test_a_dropped_dataset_closes_its_files_at_once(small_dir, ragged_panel):
    """Views, passes and cores make no reference cycle: no garbage collection needed to unmap."""
    gc.disable()
    try:
        for build, batch_size in (
            (lambda: TsFileIterableDataset(small_dir, batch_size=1000, cache="memory"), None),
            (lambda: TsFileWindowDataset(ragged_panel, 24, 8, stride=4), 16),
        ):
            ds = build()
            list(make_loader(ds, batch_size=batch_size))
            reader = weakref.ref(ds.core.reader)
            del ds
            assert reader() is None
    finally:
        gc.enable()


def test_a_state_saved_over_other_data_is_refused(small_dir, tmp_path):
    ds = TsFileIterableDataset(small_dir, batch_size=500)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    fewer = TsFileIterableDataset(small_dir, batch_size=500, columns=["t.d0.s0", "t.d0.s1"])
    with pytest.raises(ValueError, match="saved over other data"):
        fewer.load_state_dict(state)
    other = tmp_path / "other"
    synthetic.write_table_files(other, synthetic.DatasetSpec(num_files=1, num_rows=5000))
    with pytest.raises(ValueError, match="saved over other data"):
        TsFileIterableDataset(other, batch_size=500).load_state_dict(state)
    again = TsFileIterableDataset(small_dir, batch_size=500)
    again.load_state_dict(state)  # the same data loads
    assert again.state_dict()["position"] == 1


@pytest.mark.parametrize("stateful", [False, True])
def test_a_disk_cached_mixture_is_served_from_the_main_process_mapping(
    ragged_panel, tmp_path, stateful
):
    """Note: kept passes / hand-over. Once both entries are filled, make_loader's loader serves
    the passes in the main process; torchdata's stateful loader keeps its workers, which hand
    the batches over by reference."""
    if stateful:
        pytest.importorskip("torchdata")

    def mix(cache):
        parts = [
            TsFileWindowDataset(
                ragged_panel, 24, 8, stride=4, devices=[d], cache=cache, cache_dir=tmp_path
            )
            for d in ("meters.s0", "meters.s1")
        ]
        return MixedWindows(parts, [1.0, 2.0], num_samples=200, seed=5)

    streamed = make_loader(mix("none"), batch_size=32, num_workers=2)
    want = [list(streamed) for _ in range(2)]
    ds = mix("disk")
    loader = make_loader(ds, batch_size=32, num_workers=2, stateful=stateful)
    list(loader)  # epoch 0 fills both entries
    passing = iter(loader)  # epoch 1
    assert isinstance(passing._inner, _InMain) != stateful
    if stateful:
        sent = list(passing._inner)  # what the workers sent
        assert sent and all(isinstance(b, KeptBatch) for b in sent)
    else:
        list(passing)
    ds.set_epoch(0)
    for epoch in range(2):
        for got, expected in zip(loader, want[epoch], strict=True):
            np.testing.assert_array_equal(got[0].numpy(), expected[0].numpy())
            np.testing.assert_array_equal(got[1].numpy(), expected[1].numpy())


def test_make_loader_names_no_dataset_class():
    """make_loader asks each view's loader_spec(); it checks no types of ours."""
    tree = ast.parse((ROOT / "tsfile_torch" / "loader.py").read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    ours = {"TsFileDataset", "TsFileIterableDataset", "TsFileWindowDataset", "MixedWindows"}
    assert not names & ours


def test_num_samples_is_the_one_name_of_random_items_for_rows_and_windows(small_dir):
    by_old_name = list(TsFileIterableDataset(small_dir, batch_size=100, random_batches=7, seed=3))
    rows = TsFileIterableDataset(small_dir, batch_size=100, num_samples=7, order="random", seed=3)
    assert rows.num_samples == 7 and len(rows) == 7
    for a, b in zip(by_old_name, rows, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="one setting"):
        TsFileIterableDataset(small_dir, batch_size=100, num_samples=7, random_batches=7)
    with pytest.raises(ValueError, match="num_samples draws random windows"):
        TsFileIterableDataset(small_dir, batch_size=100, num_samples=7, shuffle=True)


def test_no_class_of_the_package_is_over_350_lines():
    import ast
    from pathlib import Path

    package = Path(__file__).resolve().parents[1] / "tsfile_torch"
    long = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 350:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long, long


class _ThreadsPerWorker:
    """A map-style dataset whose items are the decode threads a reader would get where the item
    is made: in a real DataLoader worker, through torch's worker info."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        from tsfile_torch.options import ReadOptions
        from tsfile_torch.read import core

        return core.decode_threads(ReadOptions())


@pytest.mark.parametrize(
    ("cpus", "workers", "threads"),
    [(16, 0, 4), (16, 2, 4), (16, 8, 2), (16, 16, 1), (2, 0, 2), (2, 2, 1), (3, 2, 1)],
)
def test_decode_threads_split_the_usable_cpus_among_the_workers(
    monkeypatch, cpus, workers, threads
):
    import torch.utils.data as tud

    from tsfile_torch import pids

    monkeypatch.setattr(pids, "usable_cpus", lambda: cpus)  # fork workers inherit it
    loader = tud.DataLoader(
        _ThreadsPerWorker(),
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="fork" if workers else None,
    )
    assert list(loader) == [threads] * 4


@pytest.mark.parametrize(
    ("local_ranks", "workers", "threads"), [("4", 0, 4), ("4", 2, 2), ("8", 2, 1), ("x", 2, 4)]
)
def test_decode_threads_split_the_cpus_among_the_ranks_on_the_machine_too(
    monkeypatch, local_ranks, workers, threads
):
    from tsfile_torch import pids
    from tsfile_torch.options import ReadOptions
    from tsfile_torch.read import core

    monkeypatch.setattr(pids, "usable_cpus", lambda: 16)
    monkeypatch.setattr(pids, "worker_id", lambda: (0, workers) if workers else None)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)  # as torchrun sets it
    assert core.decode_threads(ReadOptions()) == threads


def test_decode_threads_asked_for_are_kept_in_workers_too(monkeypatch):
    from tsfile_torch import pids
    from tsfile_torch.options import ReadOptions
    from tsfile_torch.read import core

    monkeypatch.setattr(pids, "worker_id", lambda: (0, 8))
    assert core.decode_threads(ReadOptions(decode_threads=3)) == 3
    assert pids.usable_cpus() >= 1
