"""Fixtures: real TsFiles written with tsfile's writers, values a known function of position.

Value of a table-model cell: ``synthetic.value_of(file, column_in_file, row)``; helpers below
build the expected matrix for any row range, so a test's expected answer is one line, and
``rows_of`` recovers the row numbers of a batch (the one row-identity helper).
"""

from __future__ import annotations

import signal
import sys

import numpy as np
import pytest

from tsfile_torch import synthetic

SMALL = synthetic.DatasetSpec(num_files=3, devices_per_file=2, fields_per_device=3, num_rows=5000)


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory):
    """Timeline indexes go to a temporary cache home, never the user's ~/.cache."""
    import os

    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache-home"))
    yield
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(params=["auto", "mmap", "pread"])
def read_backend(request) -> str:
    """Every read test runs once per backend (see ``other_backends_slow``)."""
    return request.param


#: Tests over ~2 s each on the 2-core VM (measured with --durations): out of the default run, which
#: must stay under 4 minutes, marked ``slow`` and ``heavy``; CI runs them (``.ci/run``: -m heavy).
HEAVY = {
    "tests/test_argument_edges.py::test_ray_remote_args_must_be_a_dict",
    "tests/test_bench.py::test_bench_quick_writes_records_with_matching_checksums",
    "tests/test_bench.py::test_read_backend_benchmark_quick_reports_every_state",
    "tests/test_bench.py::test_startup_benchmark_runs_in_new_interpreters_and_reports_its_ratios",
    "tests/test_bench_peers.py::test_a_peer_that_drops_rows_is_marked",
    "tests/test_bench_peers.py::test_peers_benchmark_writes_table_jsonl_and_verified_rows",
    "tests/test_bench_windows.py::test_quick_window_benchmark_checksums_match_the_reference",
    "tests/test_bench_windows.py::test_the_window_script_run_from_the_checkout_writes_json",
    "tests/test_cache_checks.py::test_a_killed_fills_part_file_is_removed_by_the_next_run",
    "tests/test_cache_checks.py::test_a_part_file_counts_in_cache_limit_while_it_is_written",
    "tests/test_core.py::test_a_pickled_core_reads_the_same_rows_in_a_new_interpreter",
    "tests/test_core.py::test_decode_threads_split_the_usable_cpus_among_the_workers[16-16-1]",
    "tests/test_damage.py::test_a_later_chunk_header_that_crashes_the_reader_fails_validation",
    "tests/test_damage.py::test_damaged_file_reads_exactly_or_fails_naming_it[flip:end+8]",
    "tests/test_damage.py::test_damaged_file_through_shuffling_workers_reads_exactly_or_fails_naming_it[flip:s1+10000]",
    "tests/test_dataloader_contract.py::test_collate_fns_that_change_the_batch_work_in_workers_too[iterable]",
    "tests/test_distributed.py::test_two_ranks_with_two_workers_split_every_epoch[fork]",
    "tests/test_docs.py::test_the_blocks_of_the_page_run_as_written[data-model.md]",
    "tests/test_docs.py::test_the_blocks_of_the_page_run_as_written[disk-cache.md]",
    "tests/test_docs.py::test_the_blocks_of_the_page_run_as_written[huggingface.md]",
    "tests/test_docs.py::test_the_site_builds_strictly",
    "tests/test_elastic.py::test_eight_then_two_then_eight_workers_across_three_restarts[window]",
    "tests/test_exhaustion.py::test_running_out_is_never_remembered_as_damage[emfile]",
    "tests/test_exhaustion.py::test_running_out_is_never_remembered_as_damage[memory]",
    "tests/test_exhaustion.py::test_running_out_is_never_remembered_as_damage[timeout]",
    "tests/test_exhaustion.py::test_running_out_is_never_remembered_as_damage[tsfile-oom]",
    "tests/test_forecasting_features.py::test_dict_items_match_the_written_frame[nan]",
    "tests/test_index_cache.py::test_an_index_cache_that_cannot_be_written_leaves_no_temporary_files",
    "tests/test_lightning_resume.py::test_lightning_resumes_the_rest_of_the_epoch_without_repeats_or_gaps[2-0]",
    "tests/test_messages.py::test_a_build_under_a_small_file_size_limit_says_which_limit_and_what_to_do",
    "tests/test_native_pool.py::test_a_bad_setting_is_an_error_that_names_it",
    "tests/test_native_pool.py::test_by_default_the_main_process_gets_its_share_of_the_cpus[1]",
    "tests/test_native_pool.py::test_the_pool_has_the_threads_asked_in_every_reading_process[fork-0-4]",
    "tests/test_native_pool.py::test_the_pool_has_the_threads_asked_in_every_reading_process[fork-2-4]",
    "tests/test_native_pool.py::test_the_process_effect_switched_off_leaves_tsfiles_own_pool_in_fork_workers_too",
    "tests/test_native_pool.py::test_zero_leaves_tsfiles_own_pool[fork-2]",
    "tests/test_platforms.py::test_another_tsfile_version_is_proved_or_told[symbols-gone]",
    "tests/test_platforms.py::test_training_works_without_each_linux_only_api[fallocate,prctl]",
    "tests/test_platforms.py::test_training_works_without_each_linux_only_api[posixshmem]",
    "tests/test_process_state.py::test_a_fresh_process_keeps_its_defaults_and_its_faulthandler_file",
    "tests/test_process_state.py::test_a_pass_dropped_in_a_cycle_and_collected_on_another_thread_puts_the_handler_back",
    "tests/test_read_ahead.py::test_a_pread_reader_for_read_ahead_that_cannot_open_only_turns_read_ahead_off",
    "tests/test_remote.py::test_an_object_deleted_after_the_build_is_an_error_naming_it_at_first_read",
    "tests/test_remote.py::test_iterable_dataset_reads_s3_exactly_and_a_second_epoch_fetches_nothing[2]",
    "tests/test_remote.py::test_map_style_dataset_reads_s3_exactly[0]",
    "tests/test_remote_cache_dir.py::test_a_read_only_cache_dir_is_a_remote_error_at_build_and_at_first_read",
    "tests/test_remote_manifest.py::test_an_intact_object_listed_in_the_manifest_reads_exactly",
    "tests/test_remote_manifest.py::test_an_object_that_differs_from_the_manifest_beside_it_is_an_error_and_not_cached",
    "tests/test_ring.py::test_a_main_process_interrupted_or_killed_mid_epoch_leaves_no_slot[2]",
    "tests/test_ring.py::test_a_main_process_interrupted_or_killed_mid_epoch_leaves_no_slot[9]",
    "tests/test_timerange.py::test_300_files_under_a_low_fd_limit_with_max_open_files[auto]",
    "tests/test_windows_core.py::test_a_file_object_gives_the_same_windows_as_the_path[auto]",
    "tests/test_windows_core.py::test_a_file_object_through_a_shuffled_loader_with_workers",
    "tests/test_worker_failures.py::test_a_kept_error_of_a_pass_with_workers_stalls_no_later_collection[True]",
}


@pytest.hookimpl(tryfirst=True)  # before ``-m 'not slow'`` deselects
def pytest_collection_modifyitems(items):
    """``@pytest.mark.other_backends_slow``: of a test costly on every backend, the ``auto`` case
    runs in the fast suite and the ``mmap`` / ``pread`` cases are marked slow; a test in
    :data:`HEAVY` is marked slow and heavy."""
    for item in items:
        if item.nodeid in HEAVY:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.heavy)
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("read_backend", "auto") if callspec else "auto"
        if backend != "auto" and item.get_closest_marker("other_backends_slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def small_dir(tmp_path_factory):
    """3 files x 2 devices x 3 DOUBLE fields x 5,000 rows = 18 columns, timestamps 0..4999."""
    directory = tmp_path_factory.mktemp("small")
    synthetic.write_table_files(directory, SMALL)
    return directory


def expected(spec: synthetic.DatasetSpec, start: int, stop: int) -> np.ndarray:
    """Return rows [start, stop) of every column of a table dataset, float64, column order."""
    rows = np.arange(start, stop)
    per_file = spec.devices_per_file * spec.fields_per_device
    cols = [synthetic.value_of(f, c, rows) for f in range(spec.num_files) for c in range(per_file)]
    return np.stack(cols, axis=1)


@pytest.fixture(scope="session")
def ragged_panel(tmp_path_factory):
    """A panel of 3 devices x 2 fields with 900, 400 and 650 rows (read only: shared)."""
    directory = tmp_path_factory.mktemp("ragged-panel")
    synthetic.write_panel(directory, num_devices=3, num_fields=2, num_rows=[900, 400, 650])
    return directory


@pytest.fixture(scope="session")
def small_expected():
    """The whole small dataset as a float64 (rows, columns) matrix."""
    return expected(SMALL, 0, SMALL.num_rows)


@pytest.fixture(scope="session")
def expected_rows():
    """The function ``(spec, start, stop) -> float64 matrix`` of expected values."""
    return expected


def table_columns(num_devices: int, fields_per_device: int, table: str = "t") -> list[str]:
    """Return the column names of synthetic table data in catalog order (device, then field)."""
    return [f"{table}.d{d}.s{f}" for d in range(num_devices) for f in range(fields_per_device)]


@pytest.fixture(scope="session")
def column_names():
    """The function ``(num_devices, fields_per_device, table="t") -> names`` of synthetic table
    columns in catalog order: ``t.d0.s0``, ``t.d0.s1``, ..., ``t.d1.s0``, ..."""
    return table_columns


class S3Server:
    """A real S3 API on loopback: moto's server app behind a WSGI layer that logs each request.

    ``requests`` holds ``(method, path, query)`` of every request in arrival order, so a test
    can count what its reads cost on the server.
    """

    def __init__(self):
        import threading

        import boto3
        from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
        from werkzeug.serving import make_server

        app = DomainDispatcherApplication(create_backend_app)
        self.requests: list[tuple[str, str, str]] = []

        def logged(environ, start_response):
            self.requests.append(
                (environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("QUERY_STRING", ""))
            )
            return app(environ, start_response)

        self._server = make_server("127.0.0.1", 0, logged, threaded=True)
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.storage_options = {
            "key": "testing",
            "secret": "testing",
            "endpoint_url": self.endpoint,
        }
        self.client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )

    def object_gets(self, bucket: str, key: str | None = None) -> int:
        """Count GET requests for objects of ``bucket`` (``key``: of that object only)."""
        prefix = f"/{bucket}/{key}" if key else f"/{bucket}/"
        return sum(
            1
            for method, path, query in self.requests
            if method == "GET" and path.startswith(prefix) and len(path) > len(f"/{bucket}/")
        )

    def upload(self, bucket: str, directory, prefix: str = "") -> list[str]:
        """Create ``bucket`` and put every file of ``directory``; return the keys."""
        import pathlib

        self.client.create_bucket(Bucket=bucket)
        keys = []
        for path in sorted(pathlib.Path(directory).iterdir()):
            if path.is_file():
                key = f"{prefix}{path.name}"
                self.client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
                keys.append(key)
        return keys

    def close(self) -> None:
        self._server.shutdown()
        self._thread.join()


@pytest.fixture
def s3_server():
    """A moto S3 server on 127.0.0.1 (a free port) for one test (Note: no thread outlives a
    test); moto's buckets live in the process, so each test uses buckets of its own name."""
    server = S3Server()
    yield server
    server.close()


def _stop_fsspec_io_thread() -> None:
    """Stop fsspec's IO loop thread and the loop's executor thread (fsspec never stops them)."""
    asyn = sys.modules.get("fsspec.asyn")
    if asyn is None or asyn.loop[0] is None:
        return
    from fsspec.spec import AbstractFileSystem

    classes = [AbstractFileSystem]
    for cls in classes:  # cached filesystems hold the loop: a later one must get a new loop
        cls.clear_instance_cache()
        classes.extend(cls.__subclasses__())
    loop, thread = asyn.loop[0], asyn.iothread[0]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=30)
    if not thread.is_alive():
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    asyn.reset_lock()


_SIGINT_AT_START = signal.getsignal(signal.SIGINT)


@pytest.fixture(autouse=True)
def _sigint_restored():
    """A test (or a library it starts, Ray's driver among them) that leaves SIGINT ignored would
    make every later child interpreter ignore Ctrl-C too (an ignored signal is inherited across
    fork and exec): put the session's handler back after each test."""
    yield
    if signal.getsignal(signal.SIGINT) is not _SIGINT_AT_START:
        signal.signal(signal.SIGINT, _SIGINT_AT_START)


@pytest.fixture(autouse=True)
def _no_thread_outlives_a_test():
    """Note: no thread outlives a test. While another Python thread runs, a dataset build
    validates its files in a fresh interpreter instead of a fork (``can_fork`` in
    tsfile_torch/integrity/validate.py): about 0.5 s a build instead of 0.02 s. fsspec's IO
    thread (started by the first s3fs call) and a session-long S3 server made every build after
    the first remote test slow, so the suite's time depended on its order."""
    yield
    _stop_fsspec_io_thread()


@pytest.fixture(scope="session")
def decode_counting():
    """The function ``(sources, report_dir, **kw) -> dataset``: a TsFileIterableDataset that
    writes, at the end of each pass of each worker (or the main process), the rows its reader
    decoded in that pass to ``report_dir / f"epoch{epoch}-worker{id}"`` (``id``: ``main``)."""
    import torch

    from tsfile_torch import TsFileIterableDataset

    class Counting(TsFileIterableDataset):
        def _generate(self, cursor, num_workers, worker=0):
            decoded = self.reader.decoded_rows
            yield from super()._generate(cursor, num_workers, worker)
            info = torch.utils.data.get_worker_info()
            name = info.id if info is not None else "main"
            path = self.report_dir / f"epoch{cursor.epoch}-worker{name}"
            path.write_text(str(self.reader.decoded_rows - decoded))

    def make(sources, report_dir, **kw):
        ds = Counting(sources, **kw)
        ds.report_dir = report_dir
        return ds

    return make


@pytest.fixture(scope="session")
def rows_of(small_expected):
    """The function ``(batch[, full, consecutive]) -> row numbers`` of a float batch.

    Rows of the synthetic data are unique, so each batch row names its row in ``full`` (the
    small dataset unless given), by whole-row lookup. With ``consecutive`` (the default) it
    asserts the rows are a run in time order (a sequential or batch-permuted batch, a random
    window); ``consecutive=False`` only asserts time order (a row-shuffled batch).
    """
    lookups: dict[int, tuple[np.ndarray, dict[bytes, int]]] = {}

    def lookup(full: np.ndarray) -> dict[bytes, int]:
        if id(full) not in lookups:
            table = np.ascontiguousarray(full.astype(np.float32))
            lookups[id(full)] = (full, {table[i].tobytes(): i for i in range(len(table))})
        return lookups[id(full)][1]

    def rows(batch, full: np.ndarray = small_expected, consecutive: bool = True) -> np.ndarray:
        table = lookup(full)
        values = np.ascontiguousarray(np.asarray(batch, dtype=np.float32))
        found = np.array([table[r.tobytes()] for r in values])
        if consecutive:
            assert np.array_equal(found, np.arange(found[0], found[0] + len(found)))
        else:
            assert np.all(np.diff(found) > 0), "rows of a batch are not in time order"
        return found

    return rows


def aligned(series: list[tuple[np.ndarray, np.ndarray]], align: str, fill: str):
    """Return (times, values) of ``series`` aligned on time, computed one row at a time."""
    sets = [set(t.tolist()) for t, _ in series]
    rows = sorted(set.union(*sets) if align == "union" else set.intersection(*sets))
    out = np.full((len(rows), len(series)), np.nan)
    for k, (times, values) in enumerate(series):
        for i, t in enumerate(rows):
            earlier = np.flatnonzero(times <= t)
            if t in sets[k]:
                out[i, k] = values[earlier[-1]]
            elif fill == "ffill" and len(earlier):
                out[i, k] = values[earlier[-1]]
            elif fill == "zero":
                out[i, k] = 0.0
    return np.array(rows, dtype=np.int64), out


@pytest.fixture(scope="session")
def expected_aligned():
    """The function ``(series, align, fill) -> (times, values)`` of expected aligned rows."""
    return aligned


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """This test's own user cache (``$XDG_CACHE_HOME``): verified files, indexes, verdicts."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def run_python():
    """The function ``(code, *args, **run_kwargs) -> CompletedProcess``: ``python -c code args``
    in a new interpreter that imports this checkout's tsfile_torch; output captured as text."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}

    def run(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        kwargs = {"timeout": 120, "env": env, "cwd": repo, **kwargs}
        return subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, **kwargs
        )

    return run


@pytest.fixture(scope="session")
def bench_script():
    """The function ``name -> module``: imports ``benchmarks/NAME.py`` of this checkout.

    The scripts are not installed (nor a package); they import each other by name, as
    ``python benchmarks/NAME.py`` does, so their directory is on ``sys.path`` for the session.
    """
    import importlib
    from pathlib import Path

    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
        yield importlib.import_module


def _flip_value_byte(path, series: str, offset: int) -> None:
    data = bytearray(open(path, "rb").read())
    data[data.index(b"\x41\x04" + series.encode()) + offset] ^= 0xFF  # value-chunk header
    with open(path, "r+b") as fh:  # in place: same inode, same size
        fh.write(data)


@pytest.fixture(scope="session")
def flip_value_byte():
    """The function ``(path, series, offset)``: flip the byte ``offset`` bytes after the value
    chunk header of ``series`` (``"s1"``) of a table file, in place (same size and inode).

    Effects measured on ``DatasetSpec(3, 1, 4, 30000)`` (fixed writer output), in
    ``part001.tsfile``: ``s1`` + 80,000 decodes to values off in their last bits that no check
    sees; ``s3`` + 500 to a value outside the series' [min, max] in rows [0, 5000).
    """
    return _flip_value_byte


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster for the module that asks for it, its workers importing this
    checkout, rows kept in order, no progress bars; shut down after the module, so no Ray
    thread outlives it (Note: no thread outlives a test)."""
    import os
    from pathlib import Path

    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    root = str(Path(__file__).resolve().parents[1])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, old) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    saved = context.execution_options.preserve_order, context.enable_progress_bars
    context.execution_options.preserve_order = True  # compare rows in order
    context.enable_progress_bars = False
    yield ray
    context.execution_options.preserve_order, context.enable_progress_bars = saved
    ray.shutdown()
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old
