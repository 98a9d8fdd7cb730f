"""cache="disk": the decoded cache in memory-mapped files, shared by workers, epochs and runs.

Every test compares what a disk-cached dataset hands out with what a streaming dataset
(``cache="none"``) over the same files hands out, in the same order, so the expected answer is
one line; each test gets its own ``cache_dir`` (``tmp_path``).
"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

from tsfile_torch import (
    TsFileDataset,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)
from tsfile_torch.cli import main as cli
from tsfile_torch.data.ring import RingBatch
from tsfile_torch.data.view import KeptBatch
from tsfile_torch.loader import _InMain, _InMainIterable
from tsfile_torch.read import diskcache
from tsfile_torch.sources.cachedir import KEY_NAME


@pytest.fixture(scope="module")
def rows_dir(small_dir):
    """conftest's small dataset: 3 files x 2 devices x 3 fields x 5,000 rows."""
    return small_dir


def _epochs(ds, num_workers=0, epochs=2, batch_size=None):
    """Return every epoch's batches, concatenated per epoch (values and timestamps)."""
    loader = make_loader(ds, batch_size=batch_size, num_workers=num_workers)
    out = []
    for _ in range(epochs):
        parts = [b if isinstance(b, (tuple, list)) else (b,) for b in loader]
        out.append([torch.cat([p[i] for p in parts]).numpy() for i in range(len(parts[0]))])
    return out


def _same(got, want):
    for epoch_got, epoch_want in zip(got, want, strict=True):
        for a, b in zip(epoch_got, epoch_want, strict=True):
            np.testing.assert_array_equal(a, b)


def _entries(cache_dir):
    return diskcache.entries(diskcache.decoded_dir(str(cache_dir)), details=True)


def _rows(source, cache, cache_dir=None, **kw):
    kw.setdefault("batch_size", 500)
    return TsFileIterableDataset(
        source, cache=cache, cache_dir=cache_dir, block_rows=1024, return_timestamps=True, **kw
    )


@pytest.mark.parametrize("order", ["sequential", "shuffle"])
def test_rows_equal_streaming_every_backend(rows_dir, tmp_path, read_backend, order):
    want = _epochs(_rows(rows_dir, "none", read_backend=read_backend, order=order))
    got = _epochs(_rows(rows_dir, "disk", tmp_path, read_backend=read_backend, order=order))
    _same(got, want)
    (entry,) = _entries(tmp_path)
    assert entry.filled_rows == entry.rows == 5000


@pytest.mark.slow
@pytest.mark.parametrize("order", ["sequential", "shuffle"])
def test_rows_equal_streaming_with_two_workers(rows_dir, tmp_path, read_backend, order):
    want = _epochs(_rows(rows_dir, "none", read_backend=read_backend, order=order), 2)
    got = _epochs(_rows(rows_dir, "disk", tmp_path, read_backend=read_backend, order=order), 2)
    _same(got, want)
    (entry,) = _entries(tmp_path)  # both workers filled one entry
    assert entry.filled_rows == entry.rows


def test_rows_with_two_workers_fill_one_entry(rows_dir, tmp_path):
    want = _epochs(_rows(rows_dir, "none", order="shuffle"), 2)
    _same(_epochs(_rows(rows_dir, "disk", tmp_path, order="shuffle"), 2), want)
    (entry,) = _entries(tmp_path)
    assert entry.filled_rows == entry.rows


def _raw_epoch(loader):
    """Return what the loader's workers sent in one pass (before make_loader's iterator)."""
    passing = iter(loader)
    return list(passing._inner)


@pytest.mark.parametrize(
    "kind", ["sequential", pytest.param("shuffle", marks=pytest.mark.slow), "windows"]
)
def test_workers_hand_kept_batches_over_by_reference(rows_dir, ragged_panel, tmp_path, kind):
    """Note: hand-over. Epoch 1 fills the entry; in epoch 2 the workers send KeptBatch
    requests (no values) for kept row ranges, ring slots for shuffled gathers (a gather is a
    copy wherever it is made: the workers make it), and make_loader's iterator serves exactly
    the streaming batches."""
    if kind == "windows":
        make = functools.partial(_windows, ragged_panel)
        options = {"batch_size": 64}
    else:
        make = functools.partial(_rows, rows_dir, order=kind)
        options = {}
    want = _epochs(make("none"), 2, **options)
    ds = make("disk", tmp_path)
    # make_loader's own loader serves kept passes in the main process (Note: kept passes);
    # torchdata's keeps its workers: the hand-over is what this test is about
    pytest.importorskip("torchdata")
    options["stateful"] = True
    loader = make_loader(ds, num_workers=2, **options)
    first = _raw_epoch(loader)
    if kind != "windows":  # windows fill a whole device before gathering: kept at once
        assert not any(isinstance(b, KeptBatch) for b in first)  # nothing was kept yet
    sent = _raw_epoch(loader)
    handed = RingBatch if kind == "shuffle" else KeptBatch
    assert sent and all(isinstance(b, handed) for b in sent)
    assert sum(len(pickle.dumps(b)) for b in sent) < 64 * 1024  # requests, not values
    ds.set_epoch(1)
    options.pop("stateful", None)
    _same(_epochs(ds, 2, epochs=1, **options), want[1:])
    # a plain DataLoader (not make_loader's) is always sent values
    if kind != "windows":
        plain = torch.utils.data.DataLoader(make("disk", tmp_path), batch_size=None, num_workers=2)
        assert all(isinstance(b, (tuple, list)) for b in plain)


def test_a_stateful_loader_resumes_a_handed_over_epoch(rows_dir, tmp_path):
    """Batches handed over by reference count toward torchdata's state like any batch."""
    pytest.importorskip("torchdata")
    want = _epochs(_rows(rows_dir, "none", order="shuffle", seed=3), 2)[1]
    ds = _rows(rows_dir, "disk", tmp_path, order="shuffle", seed=3)
    loader = make_loader(ds, num_workers=2, stateful=True)
    list(loader)  # epoch 0 fills the entry
    head = []
    for batch in loader:  # epoch 1, stopped after 3 batches
        head.append(batch)
        if len(head) == 3:
            saved = loader.state_dict()
            break
    del loader
    ds = _rows(rows_dir, "disk", tmp_path, order="shuffle", seed=3)
    resumed = make_loader(ds, num_workers=2, stateful=True)
    resumed.load_state_dict(saved)
    got = head + list(resumed)
    _same([[torch.cat([b[i] for b in got]).numpy() for i in range(2)]], [want])


def _windows(source, cache, cache_dir=None, **kw):
    return TsFileWindowDataset(
        source,
        context_length=24,
        horizon=6,
        stride=3,
        order="shuffle",
        cache=cache,
        cache_dir=cache_dir,
        block_rows=128,
        return_timestamps=True,
        **kw,
    )


def test_windows_equal_streaming_every_backend(ragged_panel, tmp_path, read_backend):
    want = _epochs(_windows(ragged_panel, "none", read_backend=read_backend), batch_size=64)
    got = _epochs(
        _windows(ragged_panel, "disk", tmp_path, read_backend=read_backend), batch_size=64
    )
    _same(got, want)
    (entry,) = _entries(tmp_path)  # every device in one entry
    assert entry.rows == 900 + 400 + 650


@pytest.mark.slow
def test_windows_equal_streaming_with_two_workers(ragged_panel, tmp_path, read_backend):
    want = _epochs(_windows(ragged_panel, "none", read_backend=read_backend), 2, batch_size=64)
    got = _epochs(
        _windows(ragged_panel, "disk", tmp_path, read_backend=read_backend), 2, batch_size=64
    )
    _same(got, want)


def test_aligned_and_normalized_windows_equal_streaming(ragged_panel, tmp_path):
    kw = dict(normalize="minmax", start_time=50)
    want = _epochs(_windows(ragged_panel, "none", **kw), batch_size=32)
    _same(_epochs(_windows(ragged_panel, "disk", tmp_path, **kw), batch_size=32), want)
    # another normalization shapes other values: another entry, never the first one's rows
    _same(
        _epochs(_windows(ragged_panel, "disk", tmp_path, start_time=50), batch_size=32),
        _epochs(_windows(ragged_panel, "none", start_time=50), batch_size=32),
    )
    assert len(_entries(tmp_path)) == 2


def test_a_new_dataset_reads_the_filled_entry_without_opening_a_file(rows_dir, tmp_path):
    _epochs(_rows(rows_dir, "disk", tmp_path), epochs=1)
    later = _rows(rows_dir, "disk", tmp_path)
    _same(_epochs(later, epochs=1), _epochs(_rows(rows_dir, "none"), epochs=1))
    assert later.backends == {}  # no TsFile opened: every row came from the mapping


_FILL = textwrap.dedent(
    """
    import sys
    import numpy as np
    from tsfile_torch import TsFileIterableDataset
    source, cache_dir = sys.argv[1], sys.argv[2]
    def read(cache):
        ds = TsFileIterableDataset(source, batch_size=300, cache=cache, cache_dir=cache_dir,
                                   order="shuffle", block_rows=512)
        return np.concatenate([b.numpy() for b in ds])
    sys.exit(0 if np.array_equal(read("disk"), read("none")) else 3)
    """
)


@pytest.mark.slow
def test_two_processes_fill_one_entry_at_once(rows_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen([sys.executable, "-c", _FILL, str(rows_dir), str(tmp_path)], env=env)
        for _ in range(2)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    (entry,) = _entries(tmp_path)
    assert entry.filled_rows == entry.rows
    _same(
        _epochs(_rows(rows_dir, "disk", tmp_path), epochs=1),
        _epochs(_rows(rows_dir, "none"), epochs=1),
    )


def test_a_replaced_file_with_restored_mtime_is_not_served_stale(tmp_path):
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=2, num_rows=2000
    )
    data = tmp_path / "data"
    (path,) = synthetic.write_table_files(data, spec, start_time=1)
    old = os.stat(path)
    _epochs(_rows(path, "disk", tmp_path / "c"), epochs=1)
    synthetic.write_table_files(data, spec, row_offset=7)  # other values and times
    if os.path.getsize(path) != old.st_size:
        pytest.skip("this tsfile version writes the two files with different sizes")
    os.utime(path, ns=(old.st_atime_ns, old.st_mtime_ns))  # cp -p / rsync -t style
    got = _epochs(_rows(path, "disk", tmp_path / "c"), epochs=1)
    want = _epochs(_rows(path, "none"), epochs=1)
    _same(got, want)
    assert want[0][1][0] == 7  # the new file's first timestamp
    assert len(_entries(tmp_path / "c")) == 2


@pytest.mark.parametrize("damage", ["truncate", "header"])
def test_a_damaged_entry_is_created_again(rows_dir, tmp_path, damage):
    _epochs(_rows(rows_dir, "disk", tmp_path), epochs=1)
    (entry,) = _entries(tmp_path)
    with open(entry.path, "r+b") as fh:
        if damage == "truncate":
            fh.truncate(entry.nbytes // 2)
        else:
            fh.write(b"garbage!")
    _same(_epochs(_rows(rows_dir, "disk", tmp_path)), _epochs(_rows(rows_dir, "none")))
    (again,) = _entries(tmp_path)
    assert again.nbytes == entry.nbytes and again.filled_rows == again.rows


def _decodes_with_one_warning(source, cache_dir, match, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _epochs(_rows(source, "disk", cache_dir, **kw), epochs=3)
    _same(got, _epochs(_rows(source, "none", **kw), epochs=3))
    mine = [w for w in caught if 'cache="disk"' in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    assert match in str(mine[0].message)


def test_a_full_disk_decodes_with_one_warning(rows_dir, tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    _decodes_with_one_warning(rows_dir, tmp_path, "No space left")
    assert _entries(tmp_path) == []


def _mount_tmpfs(mount, size: str) -> None:
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN)")


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a tmpfs of the given size (skipped where mounting is not allowed)."""
    mounts = []

    def mount(size: str):
        path = tmp_path / f"tmpfs{len(mounts)}"
        _mount_tmpfs(path, size)
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", str(path)], check=False)  # -l: a mapping may be open


def test_a_tiny_tmpfs_decodes_with_one_warning(rows_dir, tmpfs):
    _decodes_with_one_warning(rows_dir, tmpfs("64k"), "No space left")


def test_two_workers_on_a_full_disk_warn_once(rows_dir, tmpfs):
    cache_dir = tmpfs("64k")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _epochs(_rows(rows_dir, "disk", cache_dir), num_workers=2)
    _same(got, _epochs(_rows(rows_dir, "none"), num_workers=2))
    assert len([w for w in caught if 'cache="disk"' in str(w.message)]) == 1


def _read_only_dir(tmp_path, tmpfs):
    """Return a cache_dir holding a filled entry, now read-only (chmod, or a tmpfs remounted)."""
    directory = diskcache.decoded_dir(str(tmp_path))
    os.makedirs(directory)
    os.chmod(directory, 0o555)
    if os.access(directory, os.W_OK):  # root: chmod binds nobody
        os.chmod(directory, 0o755)
        tmp_path = tmpfs("4m")
        return tmp_path, lambda: subprocess.run(
            ["mount", "-o", "remount,ro", str(tmp_path)], check=True
        )
    os.chmod(directory, 0o755)
    return tmp_path, lambda: os.chmod(directory, 0o555)


def test_a_read_only_cache_dir_decodes_with_one_warning(rows_dir, tmp_path, tmpfs):
    cache_dir, freeze = _read_only_dir(tmp_path, tmpfs)
    _epochs(_rows(rows_dir, "disk", cache_dir, columns=["*.s0"]), epochs=1)  # an entry exists
    freeze()
    try:
        _decodes_with_one_warning(rows_dir, cache_dir, "cannot write")  # another entry
        # the existing entry's rows are still served, from a read-only mapping
        kept = _rows(rows_dir, "disk", cache_dir, columns=["*.s0"])
        _same(_epochs(kept), _epochs(_rows(rows_dir, "none", columns=["*.s0"])))
        assert kept.backends == {}
    finally:
        os.chmod(diskcache.decoded_dir(str(tmp_path)), 0o755)


def test_a_read_only_partial_entry_serves_exact_windows(ragged_panel, tmp_path, tmpfs):
    cache_dir, freeze = _read_only_dir(tmp_path, tmpfs)
    _windows(ragged_panel, "disk", cache_dir)[0]  # keeps one device of three
    (entry,) = _entries(cache_dir)
    assert 0 < entry.filled_rows < entry.rows
    freeze()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _epochs(_windows(ragged_panel, "disk", cache_dir), batch_size=64)
        _same(got, _epochs(_windows(ragged_panel, "none"), batch_size=64))
    finally:
        os.chmod(diskcache.decoded_dir(str(tmp_path)), 0o755)


def test_an_entry_beyond_cache_limit_decodes_with_one_warning(rows_dir, tmp_path):
    _decodes_with_one_warning(rows_dir, tmp_path, "cache_limit", cache_limit=4096)


def test_least_recently_used_entries_make_room(rows_dir, tmp_path):
    _epochs(_rows(rows_dir, "disk", tmp_path, columns=["*.s0"]), epochs=1)
    (first,) = _entries(tmp_path)
    limit = first.nbytes + first.nbytes // 2  # room for one such entry
    _epochs(_rows(rows_dir, "disk", tmp_path, columns=["*.s1"], cache_limit=limit), epochs=1)
    (second,) = _entries(tmp_path)
    assert second.path != first.path


def test_file_objects_decode_with_one_warning(rows_dir, tmp_path):
    path = sorted(rows_dir.glob("*.tsfile"))[0]
    with open(path, "rb") as fh:
        _decodes_with_one_warning(fh, tmp_path, "file objects", validate=False)


def test_cache_info_and_clear(rows_dir, tmp_path, capsys):
    _epochs(_rows(rows_dir, "disk", tmp_path), epochs=1)
    assert cli(["cache", "info", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1 entries" in out and "5000 rows x 18 columns, 100% filled" in out
    assert "part000.tsfile" in out
    assert cli(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "deleted 1 entries" in capsys.readouterr().out
    assert _entries(tmp_path) == []
    assert os.listdir(diskcache.decoded_dir(str(tmp_path))) == [KEY_NAME]  # kept: no entry


def test_cache_dir_defaults_under_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert diskcache.decoded_dir() == str(tmp_path / "tsfile-torch" / "decoded")
    assert diskcache.decoded_dir("/x") == os.path.join("/x", "decoded")


def test_an_entry_of_a_long_key_is_found_again(tmp_path):
    key = diskcache.fingerprint({"columns": [f"table.device{i}.field" for i in range(2000)]})
    store = diskcache.open_store([3, 4], 2, np.float32, key, str(tmp_path), 2**30)
    store.put(1, 0, np.ones((4, 2), np.float32), np.array([4, 5, 6, 7]))  # one whole block
    store.put(0, 1, np.ones((2, 2), np.float32), np.array([5, 6]))  # part of one: not sealed
    again = diskcache.open_store([3, 4], 2, np.float32, key, str(tmp_path), 2**30)
    assert again.has(1, 1, 3) and not again.has(0, 1, 3)
    np.testing.assert_array_equal(again.get(1, 1, 3)[1], [5, 6])


@pytest.mark.parametrize("cache", ["disk", "memory"])
@pytest.mark.parametrize(
    "order, num_workers",
    [("sequential", 3), ("batches", 2), ("random", 2), ("shuffle", 2)],
)
def test_a_kept_iterable_pass_is_served_by_the_main_process_in_the_workers_order(
    rows_dir, tmp_path, order, num_workers, cache
):
    """Note: kept passes (``cache="memory"``: the store fork workers share, Note: shared memory
    store). Epoch 0 fills the entry through the workers; a later fresh pass is
    read in the main process: each worker's share taken in turn, as DataLoader delivers them
    (8 batches over 3 workers: shares of unequal length), the same batches in the same order as the
    workers of a streaming loader deliver; the persistent workers stay up."""

    def make(cache, cache_dir=None):
        return _rows(
            rows_dir, cache, cache_dir, batch_size=700, order=order, seed=5,
            random_batches=7 if order == "random" else None,
        )  # fmt: skip

    want = _epochs(make("none"), num_workers, epochs=3)
    ds = make(cache, tmp_path if cache == "disk" else None)
    loader = make_loader(ds, num_workers=num_workers)
    kinds = []
    for epoch in range(3):
        passing = iter(loader)
        kinds.append(isinstance(passing._inner, _InMainIterable))
        got = [b if isinstance(b, (tuple, list)) else (b,) for b in passing]
        _same([[torch.cat([p[i] for p in got]).numpy() for i in range(2)]], [want[epoch]])
        assert ds.epoch == epoch
    # a pass begins when its iterator is made, as on the workers' route: one dropped unread
    # uses up its epoch; the number of batches is the pass's own
    dropped = iter(loader)
    if isinstance(dropped._inner, _InMainIterable):
        assert len(dropped) == len(want[0][0]) // 700 + (len(want[0][0]) % 700 > 0)
    del dropped
    assert sum(len(batch[0]) for batch in loader) == len(want[0][0])
    assert ds.epoch == 4
    if order == "shuffle":  # row gathers: the workers make them side by side
        assert kinds == [False, False, False]
    elif order == "random":  # windows keep the blocks they touch: whole after one or two epochs
        assert kinds[0] is False and kinds[2]
    else:
        assert kinds == [False, True, True]
    assert all(w.is_alive() for w in loader._iterator._workers)


@pytest.mark.parametrize("cache", ["disk", "memory"])
@pytest.mark.parametrize("kind", ["rows", "windows"])
def test_a_kept_map_style_pass_is_served_by_the_main_process(
    rows_dir, ragged_panel, tmp_path, kind, cache
):
    """Note: kept passes. Epoch 0 fills the entry through the workers; later passes of
    make_loader's loader are fetched in the main process, in the same order, with the same
    values, and the persistent workers stay up for a pass that needs them."""
    if kind == "windows":
        make = functools.partial(_windows, ragged_panel)
        options = {"batch_size": 64}
    else:
        make = lambda cache, cache_dir=None: TsFileDataset(  # noqa: E731
            rows_dir, batch_size=500, cache=cache, cache_dir=cache_dir, block_rows=1024,
            return_timestamps=True, order="batches", seed=3,
        )  # fmt: skip
        options = {}
    want = _epochs(make("none"), 2, epochs=3, **options)
    ds = make(cache, tmp_path if cache == "disk" else None)
    loader = make_loader(ds, num_workers=2, **options)
    passes = []
    for epoch in range(3):
        passing = iter(loader)
        passes.append(isinstance(passing._inner, _InMain))
        got = [b if isinstance(b, (tuple, list)) else (b,) for b in passing]
        # concatenated in delivered order: equal arrays mean the same batches in the same order
        _same([[torch.cat([p[i] for p in got]).numpy() for i in range(len(got[0]))]], [want[epoch]])
    assert passes == [False, True, True]
    assert all(w.is_alive() for w in loader._iterator._workers)


def test_a_resumed_iterable_pass_keeps_the_workers_and_delivers_the_rest(rows_dir, tmp_path):
    """Note: kept passes: a pass resuming a loaded state is not served by the main process
    (its workers know where they stand); the rest of the epoch arrives exactly once."""
    ds = _rows(rows_dir, "disk", tmp_path, order="batches", seed=2)
    list(make_loader(ds, num_workers=2))  # fills the entry
    ds.set_epoch(1)
    passing = iter(ds)
    head = [next(passing) for _ in range(3)]
    saved = ds.state_dict()
    whole = torch.cat([b[1] for b in _rows(rows_dir, "none", order="batches", seed=2)])
    again = _rows(rows_dir, "disk", tmp_path, order="batches", seed=2)
    again.load_state_dict(saved)
    resumed = iter(make_loader(again, num_workers=2))
    assert not isinstance(resumed._inner, _InMainIterable)
    got = head + list(resumed)
    times = torch.cat([b[1] for b in got])
    assert sorted(times.tolist()) == sorted(whole.tolist())  # every row once
    order = torch.argsort(times)
    values = torch.cat([b[0] for b in got])[order]
    want = torch.cat([b[0] for b in _rows(rows_dir, "none")])
    assert torch.equal(values, want)
