"""tsfile's native decode pool, sized per reading process (Note: native pool size,
tsfile_torch/native/forkfix.py): the share of the CPUs by default, ``TSFILE_TORCH_NATIVE_THREADS``
when set, in the main process and in fork and spawn DataLoader workers.

Each probe builds a dataset in the process it runs in, reads it (the values checked exactly),
and says what pool that process got: ``native_threads()``, and how many new threads that Python
did not start its build started (tsfile builds its pool at a process's first open).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch.utils.data as tud

from tsfile_torch.native import forkfix

pytestmark = pytest.mark.skipif(
    not forkfix.fork_safe(), reason="pool sizing needs the tested tsfile's symbols"
)

PROBE = r'''
import json, os, sys, threading
import numpy as np
import torch.utils.data as tud
from tsfile_torch import TsFileIterableDataset
from tsfile_torch.native import forkfix


def native_tasks():
    """Threads of this process that Python did not start (tsfile's pool among them)."""
    python = {thread.native_id for thread in threading.enumerate()}
    return {int(task) for task in os.listdir("/proc/self/task")} - python


class Probe(tud.Dataset):
    """Reads the first 100 rows wherever it runs; says which pool that process got."""

    def __init__(self, folder):
        self.folder = folder

    def __len__(self):
        return 2

    def __getitem__(self, i):  # in a worker: this worker's rows
        before = native_tasks()
        ds = TsFileIterableDataset(self.folder, batch_size=100, dtype="float64", decode_threads=1)
        started = len(native_tasks() - before)  # the process's first build made its pool
        rows = np.concatenate([batch.numpy() for batch in ds]).tolist()
        return {"threads": forkfix.native_threads(), "started": started, "rows": rows}


if __name__ == "__main__":
    folder, method, workers, cpus = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if sys.argv[5:] == ["off"]:
        import tsfile_torch

        tsfile_torch.process.disable("native_pool")
    if cpus != "all":
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: int(cpus)])
    context = method if workers else None
    loader = tud.DataLoader(
        Probe(folder), batch_size=None, num_workers=workers, multiprocessing_context=context
    )
    print(json.dumps(list(loader)))
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    """The function ``(folder, method, workers, env, cpus="all", *more) -> [item, item]``: the
    probe run as a script (spawn workers import it), in a new interpreter; ``"off"`` in
    ``more``: the ``native_pool`` process effect switched off first."""
    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(PROBE)
    repo = Path(__file__).resolve().parents[1]

    def run(folder, method, workers, env, cpus="all", *more):
        environ = {k: v for k, v in os.environ.items() if k != forkfix.NATIVE_THREADS_ENV}
        environ.update(env, PYTHONPATH=f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        proc = subprocess.run(
            [sys.executable, str(path), str(folder), method, str(workers), str(cpus), *more],
            capture_output=True, text=True, timeout=300, env=environ, cwd=repo,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    return run


def _check_rows(items, workers, small_expected):
    """Every item read the whole data in the main process; the workers' items, their parts."""
    if not workers:
        for item in items:
            np.testing.assert_array_equal(np.array(item["rows"]), small_expected)
        return
    got = np.concatenate([np.array(item["rows"]) for item in items])
    order = np.lexsort(got.T[::-1])
    np.testing.assert_array_equal(got[order], small_expected[np.lexsort(small_expected.T[::-1])])


def _started(items, workers, threads):
    """What each item's first build should have started: the pool, once per process."""
    return [threads] * len(items) if workers else [threads] + [0] * (len(items) - 1)


@pytest.mark.parametrize(
    ("method", "workers", "threads"),
    [("fork", 0, 4), ("fork", 2, 4), pytest.param("fork", 0, 1, marks=pytest.mark.slow),
     pytest.param("fork", 2, 1, marks=pytest.mark.slow),
     pytest.param("spawn", 2, 3, marks=pytest.mark.slow)],
)  # fmt: skip
def test_the_pool_has_the_threads_asked_in_every_reading_process(
    probe, small_dir, small_expected, method, workers, threads
):
    items = probe(small_dir, method, workers, {forkfix.NATIVE_THREADS_ENV: str(threads)})
    _check_rows(items, workers, small_expected)
    assert [item["threads"] for item in items] == [threads, threads]
    assert [item["started"] for item in items] == _started(items, workers, threads)


@pytest.mark.parametrize(
    ("method", "workers"), [pytest.param("fork", 0, marks=pytest.mark.slow), ("fork", 2)]
)
def test_zero_leaves_tsfiles_own_pool(probe, small_dir, small_expected, method, workers):
    items = probe(small_dir, method, workers, {forkfix.NATIVE_THREADS_ENV: "0"})
    _check_rows(items, workers, small_expected)
    assert [item["threads"] for item in items] == [None, None]  # not sized by tsfile-torch
    assert [item["started"] for item in items] == _started(
        items, workers, forkfix.TSFILE_POOL_THREADS
    )


def test_the_process_effect_switched_off_leaves_tsfiles_own_pool_in_fork_workers_too(
    probe, small_dir, small_expected
):
    items = probe(small_dir, "fork", 2, {}, "all", "off")
    _check_rows(items, 2, small_expected)
    assert [item["threads"] for item in items] == [None, None]
    assert [item["started"] for item in items] == [forkfix.TSFILE_POOL_THREADS] * 2


@pytest.mark.parametrize("cpus", [1, pytest.param("all", marks=pytest.mark.slow)])
def test_by_default_the_main_process_gets_its_share_of_the_cpus(
    probe, small_dir, small_expected, cpus
):
    items = probe(small_dir, "fork", 0, {}, cpus=cpus)
    _check_rows(items, 0, small_expected)
    usable = len(os.sched_getaffinity(0)) if cpus == "all" else cpus
    share = min(forkfix.TSFILE_POOL_THREADS, usable)
    assert [item["threads"] for item in items] == [share, share]
    assert [item["started"] for item in items] == [share, 0]


class _PoolPerWorker(tud.Dataset):
    """Each item: the native pool of the DataLoader worker that read it (fork: a real worker)."""

    def __init__(self, folder):
        self.folder = folder

    def __len__(self):
        return 4

    def __getitem__(self, i):
        from tsfile_torch import TsFileIterableDataset

        ds = TsFileIterableDataset(self.folder, batch_size=10, decode_threads=1)
        next(iter(ds))
        return forkfix.native_threads()


@pytest.mark.parametrize(
    ("cpus", "local_ranks", "workers", "threads"),
    [(16, "1", 2, 6), (16, "1", 4, 4), (16, "1", 8, 2), (16, "4", 2, 2), (2, "1", 2, 1),
     (3, "1", 2, 1), (64, "1", 1, 6)],
)  # fmt: skip
def test_each_worker_gets_its_share_of_the_cpus_at_most_tsfiles_six(
    monkeypatch, small_dir, cpus, local_ranks, workers, threads
):
    from tsfile_torch import pids

    monkeypatch.setattr(pids, "usable_cpus", lambda: cpus)  # fork workers inherit both
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_ranks)
    monkeypatch.delenv(forkfix.NATIVE_THREADS_ENV, raising=False)
    loader = tud.DataLoader(
        _PoolPerWorker(str(small_dir)),
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="fork",
        timeout=120,
    )
    assert list(loader) == [threads] * 4


BAD_SETTINGS = r"""
import os, sys
from tsfile_torch import TsFileIterableDataset
for value in sys.argv[2:]:
    os.environ["TSFILE_TORCH_NATIVE_THREADS"] = value
    try:
        TsFileIterableDataset(sys.argv[1])
        print("built")
    except ValueError as err:
        print(f"{type(err).__name__}: {err}")
"""


def test_a_bad_setting_is_an_error_that_names_it(run_python, small_dir):
    values = ["abc", "65", "-1", "2.5"]
    proc = run_python(BAD_SETTINGS, str(small_dir), *values)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == len(values)
    for value, line in zip(values, lines, strict=True):
        assert line.startswith(f"ValueError: TSFILE_TORCH_NATIVE_THREADS={value!r}: "), line
        assert "a whole number from 1 to 64" in line
