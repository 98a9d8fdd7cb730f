"""Change detection is content-relevant: chmod, chown and hard links are not changes; a same-size
rewrite with its mtime put back still is (Note: content-relevant identity)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from tsfile_torch import TsFileFormatError, TsFileIterableDataset, make_loader, synthetic
from tsfile_torch.cli import main

ROWS = 30000
FIELDS = 4


pytestmark = pytest.mark.usefixtures("private_cache")  # a verified-files cache per test


@pytest.fixture
def live(tmp_path) -> Path:
    synthetic.write_table_files(tmp_path / "data", synthetic.DatasetSpec(1, 1, FIELDS, ROWS))
    return tmp_path / "data" / "part000.tsfile"


def _dataset(path: Path) -> TsFileIterableDataset:
    return TsFileIterableDataset(
        path, batch_size=7500, block_rows=7500, dtype="float64", return_timestamps=True
    )


def _check_exact(values, times) -> None:
    rows = times.numpy()
    want = np.stack([synthetic.value_of(0, c, rows) for c in range(FIELDS)], axis=1)
    np.testing.assert_array_equal(values.numpy(), want)


def _read_passes(batches, change, passes: int = 2) -> int:
    """Read ``passes`` passes of ``batches`` (an iterable), calling ``change`` after the first
    batch; check every batch; return the rows read."""
    seen = 0
    for p in range(passes):
        for i, (values, times) in enumerate(batches):
            _check_exact(values, times)
            seen += len(times)
            if p == 0 and i == 0:
                _wait_for_decodes_ahead(batches)
                change()
    return seen


def _wait_for_decodes_ahead(batches) -> None:
    """Let the decodes ahead of a dataset read in this process end (Note: read-ahead): each
    checks the file's identity, and one running during a change made in steps (a byte
    flipped, then the mtime put back) would see it half made, where these tests mean the
    change as a whole, seen by the next read."""
    core = getattr(batches, "core", None)
    if core is None:
        return  # a loader: its workers read
    ahead = core.reader.ahead
    for future, _ in [*ahead.pending.values(), *ahead.next.values()]:
        future.exception()


def _attribute_change(path: Path, kind: str):
    if kind == "chmod":
        return lambda: os.chmod(path, 0o600)
    if kind == "chown":
        return lambda: os.chown(path, 12345, 12345)
    return lambda: os.link(path, path.with_name("snapshot.tsfile"))  # cp -al, rsync --link-dest


@pytest.mark.parametrize("kind", ["chmod", "chown", "link"])
def test_chmod_chown_and_a_hard_link_during_a_pass_are_not_changes(live, kind):
    if kind == "chown" and os.geteuid() != 0:
        pytest.skip("chown to another owner needs root")
    ds = _dataset(live)
    before = live.stat().st_ctime_ns
    assert _read_passes(ds, _attribute_change(live, kind)) == 2 * ROWS
    assert live.stat().st_ctime_ns != before  # the change did move ctime


def test_a_chmod_while_workers_read_is_not_a_change(live):
    loader = make_loader(_dataset(live), num_workers=2, persistent_workers=True)
    assert _read_passes(loader, _attribute_change(live, "chmod")) == 2 * ROWS


def _rewrite_in_place(path: Path, flip, then=None) -> None:
    """Flip one value byte in place (same size), maybe ``then()``, and put the mtime back."""
    st = path.stat()
    flip(path, "s1", 20000)
    if then is not None:
        then()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def test_a_same_size_rewrite_with_its_mtime_restored_is_a_change(live, flip_value_byte):
    ds = _dataset(live)
    with pytest.raises(TsFileFormatError, match=r"part000\.tsfile: file changed while in use \(ct"):
        _read_passes(ds, lambda: _rewrite_in_place(live, flip_value_byte))


def test_a_chmod_to_the_same_mode_without_a_manifest_is_reported_with_the_manifest_hint(live):
    ds = _dataset(live)
    mode = stat.S_IMODE(live.stat().st_mode)
    with pytest.raises(TsFileFormatError, match=r"ctime changed alone.*tsfile-torch manifest DIR"):
        _read_passes(ds, lambda: os.chmod(live, mode))


def test_with_a_manifest_a_chmod_to_the_same_mode_is_settled_by_the_content_hash(live):
    main(["manifest", str(live.parent)])
    ds = _dataset(live)
    mode = stat.S_IMODE(live.stat().st_mode)
    assert _read_passes(ds, lambda: os.chmod(live, mode)) == 2 * ROWS


def test_with_a_manifest_a_rewrite_hidden_behind_a_chmod_is_caught_by_the_content_hash(
    live, flip_value_byte
):
    main(["manifest", str(live.parent)])
    ds = _dataset(live)
    with pytest.raises(TsFileFormatError, match=r"ctime changed alone, but the content hash diff"):
        chmod = lambda: os.chmod(live, 0o600)  # noqa: E731
        _read_passes(ds, lambda: _rewrite_in_place(live, flip_value_byte, then=chmod))
