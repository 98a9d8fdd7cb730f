"""Cache directories are private and owned; nothing in them is opened through a link (Note:
private caches in tsfile_torch/sources/cachedir.py).

The probes of a security sweep, on real files and real processes: the modes the caches make, a
``cache_dir`` others may write or another user owns, symlinks planted at the names a fill or a
download opens next, ``cache clear`` beside a fill that holds its lock, and the disk cache on a
platform without ``os.posix_fallocate``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from tsfile_torch import TsFileIterableDataset, synthetic
from tsfile_torch.cli import main as cli
from tsfile_torch.errors import CacheDirError
from tsfile_torch.read import diskcache
from tsfile_torch.sources import remote
from tsfile_torch.sources.cachedir import KEY_NAME

ROWS = 20000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """One file, one device of two fields over 20,000 rows at times ``10 * row``: long enough
    that reads of 1,000 rows go through the timeline index (saved in the index cache)."""
    path = tmp_path_factory.mktemp("private") / "live.tsfile"
    rows = np.arange(ROWS)
    values = np.stack([synthetic.value_of(0, j, rows) for j in range(2)], axis=1)
    synthetic.write_table_devices(path, "t", ["s0", "s1"], {"d0": (rows * 10, values)})
    return path


def _want() -> np.ndarray:
    rows = np.arange(ROWS)
    return np.stack([synthetic.value_of(0, j, rows) for j in range(2)], axis=1)


def _dataset(path, **kw) -> TsFileIterableDataset:
    return TsFileIterableDataset(path, batch_size=1000, block_rows=1000, dtype="float64", **kw)


def _read_all(ds) -> np.ndarray:
    return np.concatenate([batch.numpy() for batch in ds])


def _modes(root) -> dict[str, int]:
    """Relative path -> permission bits of everything under ``root`` (not following links)."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def test_every_cache_directory_is_0700_and_every_file_0600(data, private_cache, tmp_path):
    old = private_cache / "tsfile-torch" / "decoded"  # as an earlier version left it
    old.mkdir(parents=True)
    old.chmod(0o755)
    np.testing.assert_array_equal(_read_all(_dataset(data, cache="disk")), _want())
    np.testing.assert_array_equal(_read_all(_dataset(data)), _want())  # indexes loaded
    modes = _modes(private_cache / "tsfile-torch")
    assert {"decoded", "index", f"decoded/{KEY_NAME}", f"index/{KEY_NAME}"} <= set(modes)
    assert any(p.endswith(".tsc") for p in modes) and any(p.endswith(".npy") for p in modes)
    dirs = {p: m for p, m in modes.items() if (private_cache / "tsfile-torch" / p).is_dir()}
    assert set(dirs.values()) == {0o700}, dirs
    assert {m for p, m in modes.items() if p not in dirs} == {0o600}, modes


@pytest.fixture(params=["disk", "index", "remote"])
def use(request, data, small_dir):
    """A function ``(directory) -> None`` that builds (and reads) a dataset whose cache lives in
    ``directory``: the decoded disk cache, the timeline-index cache or the local copies of
    URL sources."""
    if request.param == "remote":
        pytest.importorskip("fsspec")

    def build(directory):
        if request.param == "disk":
            next(iter(_dataset(data, cache="disk", cache_dir=str(directory))))
        elif request.param == "index":
            _read_all(_dataset(data, index_cache=str(directory)))
        else:
            import fsspec

            path = sorted(small_dir.glob("*.tsfile"))[0]
            fsspec.filesystem("memory").pipe("/private-cache/a.tsfile", path.read_bytes())
            url = "memory://private-cache/a.tsfile"
            next(iter(TsFileIterableDataset(url, batch_size=500, cache_dir=str(directory))))

    build.kind = request.param
    return build


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777, 0o1777])
def test_a_cache_dir_others_may_write_is_refused_naming_it_and_the_fix(use, tmp_path, mode):
    directory = tmp_path / "shared-cache"
    target = directory / "decoded" if use.kind == "disk" else directory
    target.mkdir(parents=True)
    target.chmod(mode)
    with pytest.raises(CacheDirError) as caught:
        use(directory)
    text = str(caught.value)
    assert f"cache directory {str(target)!r} is writable by" in text
    assert f"chmod 700 {str(target)!r}" in text and "chmod 2770" in text
    assert "Sharing a cache directory" in text
    assert [p.name for p in target.iterdir()] == []  # nothing was written there


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_a_cache_dir_another_user_owns_is_refused(use, tmp_path):
    directory = tmp_path / "theirs"
    target = directory / "decoded" if use.kind == "disk" else directory
    target.mkdir(parents=True, mode=0o700)
    os.chown(target, 54321, 54321)
    with pytest.raises(CacheDirError, match=r"is owned by uid 54321.*, not by you \(uid 0\)"):
        use(directory)
    assert list(target.iterdir()) == []


def test_a_setgid_directory_is_shared_with_its_group_on_purpose(use, tmp_path):
    directory = tmp_path / "team"
    directory.mkdir()
    directory.chmod(0o2770)  # chgrp TEAM team && chmod 2770 team: the documented recipe
    use(directory)
    modes = _modes(directory)
    assert modes, "nothing was written"
    for name, mode in modes.items():
        path = directory / name
        if path.is_dir():
            assert mode == 0o2770, (name, oct(mode))
        elif path.name == KEY_NAME:
            assert mode == 0o640, (name, oct(mode))
        else:
            assert mode == 0o660, (name, oct(mode))


def _digest(data, tmp_path) -> str:
    """The digest naming the decoded entry of ``_dataset(data, cache="disk")``."""
    probe = tmp_path / "probe"
    next(iter(_dataset(data, cache="disk", cache_dir=str(probe))))
    (entry,) = diskcache.entries(diskcache.decoded_dir(str(probe)))
    return os.path.basename(entry.path).split(".")[0]


def _victim(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"a file of the user's, mode 0600")
    victim.chmod(0o600)
    return victim


def test_links_planted_at_a_fills_next_part_and_lock_names_are_not_followed(data, tmp_path):
    digest, victim = _digest(data, tmp_path), _victim(tmp_path)
    decoded = tmp_path / "cache" / "decoded"
    decoded.mkdir(parents=True, mode=0o700)
    (decoded / f"{digest}.tsc.part.{os.getpid()}").symlink_to(victim)
    (decoded / f"{digest}.lock").symlink_to(tmp_path / "made-through-a-lock")
    (decoded / ".cache.lock").symlink_to(tmp_path / "made-through-the-cache-lock")
    ds = _dataset(data, cache="disk", cache_dir=str(tmp_path / "cache"))
    np.testing.assert_array_equal(_read_all(ds), _want())
    assert victim.read_bytes() == b"a file of the user's, mode 0600"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not (tmp_path / "made-through-a-lock").exists()
    assert not (tmp_path / "made-through-the-cache-lock").exists()
    for name in (f"{digest}.tsc", f"{digest}.lock", ".cache.lock"):
        assert stat.S_ISREG(os.lstat(decoded / name).st_mode), name


def test_links_planted_at_a_downloads_next_part_and_lock_names_are_not_followed(
    small_dir, tmp_path
):
    fsspec = pytest.importorskip("fsspec")
    path = sorted(small_dir.glob("*.tsfile"))[0]
    fsspec.filesystem("memory").pipe("/planted/a.tsfile", path.read_bytes())
    options = remote.RemoteOptions(cache_dir=str(tmp_path / "cache"))
    (entry,) = remote.expand_url("memory://planted/a.tsfile", options)
    victim = _victim(tmp_path)
    os.makedirs(options.directory, mode=0o700)
    os.symlink(victim, f"{entry.cache_path}.part.{os.getpid()}")
    os.symlink(tmp_path / "made-through-a-lock", entry.lock_path)
    assert open(remote.fetch(entry), "rb").read() == path.read_bytes()
    assert victim.read_bytes() == b"a file of the user's, mode 0600"
    assert not (tmp_path / "made-through-a-lock").exists()
    assert stat.S_ISREG(os.lstat(entry.cache_path).st_mode)


# Holds the lock of one decoded entry and writes its part file, as a fill between creating and
# publishing does, until its stdin closes.
HOLD = r"""
import os, sys
from tsfile_torch.sources.cachedir import file_lock
directory, digest = sys.argv[1:]
with file_lock(os.path.join(directory, digest + ".lock")):
    with open(os.path.join(directory, f"{digest}.tsc.part.{os.getpid()}"), "wb") as part:
        part.write(b"being written")
    print("held", flush=True)
    sys.stdin.read()
"""


def test_cache_clear_leaves_a_held_lock_and_its_part_file_and_clears_indexes(
    data, private_cache, tmp_path, capsys
):
    cache = tmp_path / "cache"
    _read_all(_dataset(data, cache="disk", cache_dir=str(cache)))  # an entry, and indexes
    index = private_cache / "tsfile-torch" / "index"
    assert list(index.rglob("*.npy"))
    decoded = diskcache.decoded_dir(str(cache))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, decoded, "f" * 32],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        assert cli(["cache", "clear", "--cache-dir", str(cache)]) == 0
        out = capsys.readouterr().out
        assert "deleted 1 entries" in out and "1 being created by a running fill, left" in out
        assert f"{index}: deleted " in out and not list(index.rglob("*.npy"))
        left = sorted(os.listdir(decoded))
        assert left == sorted([KEY_NAME, "f" * 32 + ".lock", f"{'f' * 32}.tsc.part.{holder.pid}"])
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert cli(["cache", "clear", "--cache-dir", str(cache)]) == 0  # its fill gone: cleared
    assert os.listdir(decoded) == [KEY_NAME]


def test_the_disk_cache_works_without_posix_fallocate(data, tmp_path, monkeypatch):
    """macOS has no os.posix_fallocate: an entry is sized with ftruncate instead."""
    monkeypatch.delattr(os, "posix_fallocate")
    cache = str(tmp_path / "cache")
    for _ in range(2):  # fills the entry, then serves it
        ds = _dataset(data, cache="disk", cache_dir=cache)
        np.testing.assert_array_equal(_read_all(ds), _want())
    assert ds.backends == {}  # the second pass came from the entry
    (entry,) = diskcache.entries(diskcache.decoded_dir(cache), details=True)
    assert entry.filled_rows == ROWS
