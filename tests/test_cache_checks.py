"""The decoded disk cache checks what it serves (Note: checked blocks in read/diskcache.py).

A fault prober's cases: an entry is filled, then bytes of it are changed on disk the way a
failing disk, a stray writer or a copy would change them, and a new dataset must still hand
out exact values (value ``synthetic.value_of(0, column, row)``, time ``1000 + row``), with one
:class:`CacheMismatchWarning` naming the entry file, never an error blaming the TsFile.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from tsfile_torch import (
    CacheMismatchWarning,
    TsFileDataset,
    TsFileIterableDataset,
    make_loader,
    synthetic,
)
from tsfile_torch.read import diskcache
from tsfile_torch.sources.cachedir import file_lock

NUM_ROWS = 4000
NUM_COLUMNS = 4
BATCH = 500
START = 1000


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    directory = tmp_path_factory.mktemp("checked")
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=NUM_COLUMNS, num_rows=NUM_ROWS
    )
    (path,) = synthetic.write_table_files(directory, spec, start_time=START)
    return path


def _want(start: int, stop: int, columns=range(NUM_COLUMNS)):
    rows = np.arange(start, stop)
    values = np.stack([synthetic.value_of(0, c, rows) for c in columns], axis=1)
    return values.astype(np.float32), rows + START


def _map_style(source, cache_dir, **kw):
    return TsFileDataset(
        source, batch_size=BATCH, cache="disk", cache_dir=str(cache_dir),
        return_timestamps=True, **kw,
    )  # fmt: skip


def _iterable(source, cache_dir, **kw):
    return TsFileIterableDataset(
        source, batch_size=BATCH, cache="disk", cache_dir=str(cache_dir),
        return_timestamps=True, **kw,
    )  # fmt: skip


def _fill(ds, stop=NUM_ROWS // BATCH):
    for i in range(stop):
        ds[i]


def _entry(cache_dir) -> str:
    (entry,) = diskcache.entries(diskcache.decoded_dir(str(cache_dir)))
    return entry.path


def _regions(path):
    """Return writable views of an entry's ``filled``, timestamps and values (any layout)."""
    with open(path, "rb") as fh:
        raw = fh.read(16)
        meta_len, key_len = struct.unpack("<II", raw[8:16])
        meta = json.loads(fh.read(meta_len))
    page = 4096

    def up(n):
        return -(-n // page) * page

    rows, columns = meta["rows"], meta["columns"]
    at = up(16 + meta_len + key_len)
    filled_at = at
    at += up(rows)
    if "check_rows" in meta:  # the seal words of checked blocks
        blocks = -(-rows // meta["check_rows"])  # one table here
        at += up(blocks * 8)
    times_at = at
    values_at = times_at + up(rows * 8)
    mm = np.memmap(path, np.uint8, "r+")
    filled = mm[filled_at : filled_at + rows].view(np.bool_)
    times = mm[times_at : times_at + rows * 8].view(np.int64)
    values = mm[values_at : values_at + rows * columns * 4].view(np.float32)
    return filled, times, values.reshape(rows, columns)


def _flip(path, what: str) -> None:
    filled, times, values = _regions(path)
    if what == "value exponent":  # 2.727 -> 4.27e-39 (the prober saw 5.37e-39)
        values.view(np.uint8).reshape(NUM_ROWS, NUM_COLUMNS, 4)[2750, 2, 3] ^= 0x40
    elif what == "value low mantissa":
        values.view(np.uint8).reshape(NUM_ROWS, NUM_COLUMNS, 4)[2750, 2, 0] ^= 0x01
    elif what == "timestamp":
        times.view(np.uint8).reshape(NUM_ROWS, 8)[3500, 0] ^= 0x18
    del filled, times, values  # a shared mapping: the entry holds the change now


def _exact(ds, index):
    values, times = ds[index]
    want_values, want_times = _want(index * BATCH, (index + 1) * BATCH)
    np.testing.assert_array_equal(values.numpy(), want_values)
    np.testing.assert_array_equal(times.numpy(), want_times)


def _no_warning_now(source, cache_dir):
    """A later dataset reads the repaired entry silently, without opening the TsFile."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheMismatchWarning)
        again = _map_style(source, cache_dir)
        for i in range(NUM_ROWS // BATCH):
            _exact(again, i)
    assert again.backends == {}  # every row came from the entry


@pytest.mark.parametrize("damage", ["value exponent", "value low mantissa", "timestamp"])
def test_a_changed_cached_byte_is_decoded_again_with_one_warning(source, tmp_path, damage):
    _fill(_map_style(source, tmp_path))
    path = _entry(tmp_path)
    _flip(path, damage)
    ds = _map_style(source, tmp_path)
    with pytest.warns(CacheMismatchWarning) as caught:
        for i in range(NUM_ROWS // BATCH):
            _exact(ds, i)
    (warning,) = [w for w in caught if issubclass(w.category, CacheMismatchWarning)]
    text = str(warning.message)
    assert path in text and "seal mismatch" in text and "decoding them again" in text
    assert os.path.basename(source) not in text  # the TsFile is not blamed
    _no_warning_now(source, tmp_path)


def test_a_filled_flag_on_rows_never_written_is_not_trusted(source, tmp_path):
    _fill(_map_style(source, tmp_path), stop=4)  # rows [0, 2000) of 4000
    path = _entry(tmp_path)
    filled, _, _ = _regions(path)
    filled[:] = True  # rows [2000, 4000) never written: zeros at time 0
    del filled
    ds = _map_style(source, tmp_path)
    with pytest.warns(CacheMismatchWarning, match="timestamps not increasing"):
        for i in range(NUM_ROWS // BATCH):
            _exact(ds, i)
    _fill(_map_style(source, tmp_path))
    _no_warning_now(source, tmp_path)


def _two_entries(source, tmp_path):
    """Fill the entries of two datasets of the same shape: columns s0, s1 and s2, s3."""
    first = _map_style(source, tmp_path / "a", columns=["t.d0.s0", "t.d0.s1"])
    other = _map_style(source, tmp_path / "b", columns=["t.d0.s2", "t.d0.s3"])
    _fill(first)
    _fill(other)
    return _entry(tmp_path / "a"), _entry(tmp_path / "b")


def _exact_columns(ds, columns):
    for i in range(NUM_ROWS // BATCH):
        values, times = ds[i]
        want_values, want_times = _want(i * BATCH, (i + 1) * BATCH, columns)
        np.testing.assert_array_equal(values.numpy(), want_values)
        np.testing.assert_array_equal(times.numpy(), want_times)


def test_another_entrys_data_under_this_entrys_header_is_not_served(source, tmp_path):
    mine, other = _two_entries(source, tmp_path)
    with open(mine, "rb") as fh:
        header = fh.read(4096)
    shutil.copyfile(other, mine)  # the other entry's bytes, then this entry's header
    with open(mine, "r+b") as fh:
        fh.write(header)
    ds = _map_style(source, tmp_path / "a", columns=["t.d0.s0", "t.d0.s1"])
    with pytest.warns(CacheMismatchWarning, match="seal mismatch"):
        _exact_columns(ds, [0, 1])


def test_a_header_naming_another_key_is_refused(source, tmp_path):
    mine, other = _two_entries(source, tmp_path)
    shutil.copyfile(other, mine)  # header and data of the other entry
    ds = _map_style(source, tmp_path / "a", columns=["t.d0.s0", "t.d0.s1"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheMismatchWarning)  # refused before any block
        _exact_columns(ds, [0, 1])


def _loader_epoch(ds, num_workers):
    loader = make_loader(ds, num_workers=num_workers)
    parts = list(loader)
    return (
        torch.cat([p[0] for p in parts]).numpy(),
        torch.cat([p[1] for p in parts]).numpy(),
    )


def _exact_epoch(ds, num_workers):
    values, times = _loader_epoch(ds, num_workers)
    want_values, want_times = _want(0, NUM_ROWS)
    order = np.argsort(times)  # workers may interleave batches
    np.testing.assert_array_equal(times[order], want_times)
    np.testing.assert_array_equal(values[order], want_values)


@pytest.mark.parametrize(
    "kind, num_workers",
    [
        ("iterable", 0),
        ("map", 0),
        ("iterable", 2),
        pytest.param("map", 2, marks=pytest.mark.slow),
    ],
)
def test_a_loader_pass_over_a_changed_entry_is_exact(source, tmp_path, kind, num_workers):
    make = _iterable if kind == "iterable" else _map_style
    _exact_epoch(make(source, tmp_path), num_workers)  # fills the entry
    _flip(_entry(tmp_path), "value exponent")
    _flip(_entry(tmp_path), "timestamp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheMismatchWarning)  # workers warn in their process
        _exact_epoch(make(source, tmp_path), num_workers)  # no error blaming the TsFile
    _no_warning_now(source, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["value low mantissa", "timestamp"])
def test_two_workers_over_a_changed_entry_are_exact(source, tmp_path, damage):
    _exact_epoch(_iterable(source, tmp_path), 2)
    _flip(_entry(tmp_path), damage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheMismatchWarning)
        _exact_epoch(_iterable(source, tmp_path), 2)
    _no_warning_now(source, tmp_path)


_KILLED_FILL = textwrap.dedent(
    """
    import os, signal, sys
    from tsfile_torch import TsFileDataset
    replace = os.replace
    def killed(src, dst):  # killed between allocating the entry and publishing it
        if not str(dst).endswith(".tsc"):
            return replace(src, dst)  # the cache directory's key, written before the entry
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace = killed
    TsFileDataset(sys.argv[1], batch_size=500, cache="disk", cache_dir=sys.argv[2])
    """
)


def _killed_fill(source, cache_dir) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    args = [sys.executable, "-c", _KILLED_FILL, str(source), str(cache_dir)]
    assert subprocess.run(args, env=env, timeout=120).returncode == -9
    directory = diskcache.decoded_dir(str(cache_dir))
    (part,) = [n for n in os.listdir(directory) if ".tsc.part." in n]
    return os.path.join(directory, part)


def test_a_killed_fills_part_file_is_removed_by_the_next_run(source, tmp_path):
    part = _killed_fill(source, tmp_path)
    ds = _map_style(source, tmp_path)
    assert not os.path.exists(part)
    _fill(ds)
    for i in range(NUM_ROWS // BATCH):
        _exact(ds, i)
    names = os.listdir(diskcache.decoded_dir(str(tmp_path)))
    assert [n for n in names if ".part." in n] == []


def test_a_part_file_counts_in_cache_limit_while_it_is_written(source, tmp_path):
    part = _killed_fill(source, tmp_path)
    directory = diskcache.decoded_dir(str(tmp_path))
    size = os.path.getsize(part)
    digest = os.path.basename(part).split(".")[0]
    with file_lock(os.path.join(directory, digest + ".lock")):  # its fill in progress again
        old = _map_style(source, tmp_path, columns=["t.d0.s0", "t.d0.s1"])  # an older entry
        _fill(old)
        (old_entry,) = diskcache.entries(directory)
        # room for the part and one new entry, not for the older entry as well
        limit = size + 2 * old_entry.nbytes - 1
        _fill(_map_style(source, tmp_path, columns=["t.d0.s2", "t.d0.s3"], cache_limit=limit))
        assert os.path.exists(part)  # being written: counted, kept
        assert not os.path.exists(old_entry.path)  # evicted to make room beside it
    _map_style(source, tmp_path)  # the fill's lock is free: the part is stale now
    assert not os.path.exists(part)
