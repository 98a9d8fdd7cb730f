"""Read-ahead (Note: read-ahead in tsfile_torch.read.reader): the first read of a pass decodes
only its rows, whole blocks are decoded in the background, each block once, values exact.

Data: ``synthetic.write_table_files`` (value of (file, column, row) known: conftest.expected).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from tsfile_torch import TsFileIterableDataset, make_loader, synthetic

SPEC = synthetic.DatasetSpec(num_files=2, devices_per_file=1, fields_per_device=3, num_rows=70000)


@pytest.fixture(scope="module")
def long_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("long")
    synthetic.write_table_files(directory, SPEC)
    return directory


def _record_decodes(reader) -> list[tuple[str, int]]:
    """Record (thread name, rows) of every decode of ``reader``."""
    seen = []
    decode = reader.decoder.decode

    def recording(plan):
        seen.append((threading.current_thread().name, plan.num_rows))
        return decode(plan)

    reader.decoder.decode = recording
    return seen


def test_a_first_batch_decodes_its_rows_and_the_blocks_follow_in_the_background(
    long_dir, expected_rows
):
    ds = TsFileIterableDataset(long_dir, batch_size=4096, block_rows=32768, read_backend="pread")
    reader = ds.core.reader
    decodes = _record_decodes(reader)
    expected = expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32)
    # the process's first pass decodes small first; later ones (slow consumer or not) do not
    for pass_, small in enumerate([True, False, False]):
        decodes.clear()
        batches = []
        for batch in ds:
            batches.append(batch)
            if pass_ == 1:
                time.sleep(0.004)  # a training step
        np.testing.assert_array_equal(torch.cat(batches).numpy(), expected)
        # the next pass's first blocks, decoded during this one: count them here
        assert sorted(reader.ahead.next) == [(g, 0) for g in range(SPEC.num_files)]
        for future, _ in reader.ahead.next.values():
            future.result()
        head = [rows for thread, rows in decodes[: SPEC.num_files]]
        here = {thread for thread, _ in decodes[: SPEC.num_files]}
        ahead = [rows for thread, rows in decodes if thread.startswith("tsfile-read-ahead")]
        blocks = [32768, 32768, 70000 - 65536] * SPEC.num_files
        if small:  # the first batch: its rows only, at once; every block once, in the background
            assert head == [4096] * SPEC.num_files, decodes
            assert not any(thread.startswith("tsfile-read-ahead") for thread in here)
            assert sorted(ahead) == sorted(blocks + [32768] * SPEC.num_files)  # + the next's
            assert sum(rows for _, rows in decodes) == SPEC.num_files * (
                SPEC.num_rows + 4096 + 32768
            )
        else:  # whole blocks, each once, all in the background: the first ones in the pass before
            assert sum(rows for _, rows in decodes) == SPEC.num_files * SPEC.num_rows
            assert 4096 not in [rows for _, rows in decodes]
            assert all(thread.startswith("tsfile-read-ahead") for thread, _ in decodes), decodes


def test_read_ahead_with_workers_and_a_range_per_worker(long_dir, expected_rows):
    ds = TsFileIterableDataset(
        long_dir, batch_size=5000, block_rows=16384, return_timestamps=True, read_backend="pread"
    )
    loader = make_loader(ds, num_workers=2)
    for _ in range(2):
        values, times = (torch.cat(x).numpy() for x in zip(*loader, strict=True))
        order = np.argsort(times)
        np.testing.assert_array_equal(times[order], np.arange(SPEC.num_rows))
        expected = expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32)
        np.testing.assert_array_equal(values[order], expected)


@pytest.mark.parametrize(
    "options",
    [
        {"read_backend": "pread", "max_open_files": 1},  # an eviction could close a decode's
        {"read_backend": "auto"},  # mapped files: a truncation under a background decode
        {"read_backend": "mmap"},  # would be a SIGBUS, not the error a read in this thread gives
    ],
)
def test_no_read_ahead_for_mapped_files_or_more_files_than_may_be_open(
    long_dir, expected_rows, options
):
    ds = TsFileIterableDataset(long_dir, batch_size=4096, block_rows=32768, **options)
    decodes = _record_decodes(ds.core.reader)
    got = torch.cat(list(ds)).numpy()
    np.testing.assert_array_equal(got, expected_rows(SPEC, 0, SPEC.num_rows).astype(np.float32))
    assert not any(thread.startswith("tsfile-read-ahead") for thread, _ in decodes)
    assert 4096 not in [rows for _, rows in decodes]  # no small first read without read-ahead
