"""Validation in a child, `tsfile-torch verify`, errno-keeping errors, and the loader's timeout."""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import shutil

import pytest

from tsfile_torch import (
    TsFileDataset,
    TsFileFormatError,
    TsFileIterableDataset,
    TsFileWindowDataset,
    make_loader,
    open_reader,
    synthetic,
)
from tsfile_torch.cli import main
from tsfile_torch.integrity.validate import validate_sources
from tsfile_torch.loader import default_timeout
from tsfile_torch.sources import expand_sources


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A good file and four damaged copies: metadata size, data page (max), truncated, and a
    chunk header (metadata intact)."""
    directory = tmp_path_factory.mktemp("corpus")
    synthetic.write_table_files(directory / "src", synthetic.DatasetSpec(1, 1, 4, 30000))
    data = next((directory / "src").glob("*.tsfile")).read_bytes()
    (directory / "good.tsfile").write_bytes(data)
    meta = bytearray(data)
    meta[len(data) - 8] ^= 0xFF  # crashes tsfile's reader at open
    (directory / "meta.tsfile").write_bytes(bytes(meta))
    page = bytearray(data)
    page[data.index(b"\x41\x04s1") + 80060] ^= 0xFF  # decodes a value above the series maximum
    (directory / "page.tsfile").write_bytes(bytes(page))
    (directory / "cut.tsfile").write_bytes(data[: len(data) // 2])
    chunk = bytearray(data)
    chunk[data.index(b"\x41\x04s1") + 1] ^= 0xFF  # a chunk header: SIGSEGV at its first read
    (directory / "chunk.tsfile").write_bytes(bytes(chunk))
    return directory


def test_a_file_that_crashes_the_native_reader_is_a_format_error_naming_it(corpus):
    with pytest.raises(TsFileFormatError, match=r"meta\.tsfile: tsfile's native reader crashed"):
        TsFileIterableDataset(corpus / "meta.tsfile")


def test_validation_reports_every_damaged_file_and_goes_on_after_a_crash(corpus):
    names = ["meta", "good", "cut", "page"]
    sources = expand_sources([str(corpus / f"{n}.tsfile") for n in names])
    problems = validate_sources(sources, "full")
    assert [os.path.basename(p.name) for p in problems] == [
        "meta.tsfile",
        "cut.tsfile",
        "page.tsfile",
    ]
    assert "crashed" in problems[0].reason and "SIGSEGV" in problems[0].reason
    assert "above the series maximum" in problems[2].reason and "t.d0.s1" in problems[2].reason


def test_verify_command_prints_each_damaged_file_with_the_reason(corpus, capsys):
    files = [str(corpus / f"{n}.tsfile") for n in ("good", "meta", "page")]
    assert main(["verify", *files, "--json"]) == 1
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["ok"] for r in records] == [True, False, False]
    assert "rows [0, 30000)" in records[2]["reason"]
    assert main(["verify", files[0]]) == 0
    assert "1 files checked (full), 0 damaged" in capsys.readouterr().out


def test_the_statistics_check_names_file_series_and_rows_when_reading(corpus):
    ds = TsFileIterableDataset(corpus / "page.tsfile", batch_size=30000)  # headers pass
    with pytest.raises(
        TsFileFormatError, match=r"page\.tsfile: series t\.d0\.s1, rows \[0, 30000\)"
    ):
        list(ds)
    quiet = TsFileIterableDataset(corpus / "page.tsfile", batch_size=30000, check_statistics=False)
    assert len(list(quiet)) == 1  # the check is what catches it


def test_validate_false_builds_from_metadata_alone(corpus):
    # the damage is in a chunk header: only the validation child reads one at build time
    with pytest.raises(
        TsFileFormatError, match=r"chunk\.tsfile: tsfile's native reader crashed .*SIGSEGV"
    ):
        TsFileIterableDataset(corpus / "chunk.tsfile")
    ds = TsFileIterableDataset(corpus / "chunk.tsfile", validate=False)
    assert ds.num_rows == 30000 and ds.columns == [f"t.d0.s{k}" for k in range(4)]


def test_a_file_overwritten_with_its_mtime_kept_is_noticed_between_passes(tmp_path, corpus):
    path = tmp_path / "live.tsfile"
    shutil.copy(corpus / "good.tsfile", path)
    ds = TsFileDataset(path, batch_size=10000, read_backend="pread")  # no set_epoch
    [ds[i] for i in range(len(ds))]
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    data[-2000] ^= 1
    with open(path, "r+b") as fh:  # same size, in place, then the mtime put back (cp -p)
        fh.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds.reader.clear_cache()
    with pytest.raises(TsFileFormatError, match=r"live\.tsfile: file changed while in use \(ctime"):
        ds[0]


def test_too_many_open_files_keeps_errno_and_says_what_to_do(corpus):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
    try:
        try:
            while len(held) < 1024:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        with pytest.raises(TsFileFormatError) as info:
            open_reader(str(corpus / "good.tsfile"), "pread")
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert info.value.errno == errno.EMFILE
    assert "good.tsfile: cannot open: too many open files (raise ulimit -n" in str(info.value)


PERMISSION_PROBE = """
import sys
from tsfile_torch import TsFileFormatError, open_reader
try:
    open_reader(sys.argv[1], "pread")
except TsFileFormatError as err:
    print(err.errno, err)
"""


def test_permission_denied_keeps_errno(tmp_path, corpus):
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "locked.tsfile"
    shutil.copy(corpus / "good.tsfile", path)
    path.chmod(0)
    command = [sys.executable, "-c", PERMISSION_PROBE, str(path)]
    if os.geteuid() == 0:  # root reads anything: run without the capabilities that allow it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv to drop CAP_DAC_OVERRIDE")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *command]
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": repo + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120).stdout
    assert out.startswith(f"{errno.EACCES} "), out
    assert "locked.tsfile: cannot open: permission denied" in out


def test_zero_batches_and_absurd_random_batches_are_rejected(corpus):
    with pytest.raises(
        ValueError,
        match=r"0 items per epoch cannot be shared by 1 ranks with drop_last=True: every rank "
        r"would get none; use drop_last=False",
    ):
        TsFileIterableDataset(corpus / "good.tsfile", batch_size=40000, drop_last=True)
    with pytest.raises(
        ValueError,
        match=r"random_batches should be an integer in \[1, 268435456\], but got "
        r"random_batches=1000000000000",
    ):
        TsFileIterableDataset(corpus / "good.tsfile", random_batches=10**12)
    ds = TsFileDataset(corpus / "good.tsfile", batch_size=1000)
    with pytest.raises(ValueError, match=r"count should be .*but got count=1000000000000"):
        ds.set_random_batches(10**12)


def test_make_loader_sets_a_timeout_fitting_the_block_size(corpus):
    # documented: 120 s + 2e-6 s per value of one block (block_rows rows x every column)
    ds = TsFileIterableDataset(corpus / "good.tsfile", batch_size=1000)  # 131,072 x 4 columns
    loader = make_loader(ds, num_workers=2)
    assert loader.timeout == default_timeout(ds) == pytest.approx(120 + 2e-6 * 131072 * 4)
    small = TsFileIterableDataset(corpus / "good.tsfile", batch_size=1000, block_rows=5000)
    assert make_loader(small, num_workers=2).timeout == pytest.approx(120 + 2e-6 * 5000 * 4)
    windows = TsFileWindowDataset(corpus / "good.tsfile", 24, 8)  # 32,768-row blocks, 4 fields
    assert make_loader(windows, batch_size=64, num_workers=2).timeout == pytest.approx(
        120 + 2e-6 * 32768 * 4
    )
    assert make_loader(ds, num_workers=2, timeout=0).timeout == 0
    assert make_loader(ds).timeout == 0  # no workers, nothing to wait on


@pytest.mark.parametrize("workers, cells", [(0, True), (0, False), (2, True), (2, False)])
def test_an_epoch_is_checked_against_the_column_sums(tmp_path, corpus, workers, cells, monkeypatch):
    # 2 workers: each decodes a share, the loader sums the epoch; 0: the reader sums each
    # series it decoded whole, and where it cannot (cell sums off: a grid too large for
    # memory) the loader sums the epoch
    if not cells:
        monkeypatch.setattr("tsfile_torch.integrity.checks.MAX_SHARED_CELLS", 1)
    data = bytearray((corpus / "good.tsfile").read_bytes())
    data[data.index(b"\x41\x04s1") + 500] ^= 0xFF  # plausible values, but a wrong sum
    path = tmp_path / "late.tsfile"
    path.write_bytes(bytes(data))
    # float64 batches: the sum of float32 batches allows their rounding, too coarse for this
    ds = TsFileIterableDataset(path, batch_size=5000, block_rows=5000, dtype="float64")
    loader = make_loader(ds, num_workers=workers)
    with pytest.raises(TsFileFormatError, match=r"late\.tsfile: series t\.d0\.s1.*metadata says"):
        list(loader)


def test_epochs_that_are_not_one_full_pass_are_not_sum_checked(corpus):
    import torch.utils.data as tud

    ds = TsFileDataset(corpus / "good.tsfile", batch_size=5000)
    sampler = tud.RandomSampler(ds, replacement=True)  # repeats batches: sums would differ
    loader = make_loader(ds, sampler=sampler)
    assert loader._epoch_sums() is None
    assert len(list(loader)) == 6
    # streaming: summed until the readers (here or in the workers, whose cell sums this
    # process sees) have checked every series themselves
    for workers in (0, 2):
        fresh = make_loader(
            TsFileDataset(corpus / "good.tsfile", batch_size=5000), num_workers=workers
        )
        assert fresh._epoch_sums() is not None
        assert len(list(fresh)) == 6
        assert fresh._epoch_sums() is None, workers
    assert (
        make_loader(
            TsFileDataset(corpus / "good.tsfile", batch_size=5000, cache="memory")
        )._epoch_sums()
        is not None
    )
    windows = TsFileIterableDataset(corpus / "good.tsfile", batch_size=5000, random_batches=6)
    assert make_loader(windows)._epoch_sums() is None


def test_inspect_reports_a_damaged_file_instead_of_crashing(corpus, capsys):
    assert main(["inspect", str(corpus / "meta.tsfile")]) == 2  # a user error: one line, exit 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert re.search(r"meta\.tsfile: tsfile's native reader crashed", err)


def test_a_file_that_passed_validation_is_not_validated_again_until_it_changes(
    tmp_path, corpus, private_cache, monkeypatch
):
    from tsfile_torch.integrity import screen

    checked = []

    def spy(sources, mode="headers", timeout=None):
        checked.append((mode, sorted(os.path.basename(s.name) for s in sources)))
        return validate_sources(sources, mode, timeout)

    monkeypatch.setattr(screen, "validate_sources", spy)
    synthetic.write_table_files(tmp_path / "src", synthetic.DatasetSpec(2, 1, 4, 30000))
    for name, made in zip("ab", sorted((tmp_path / "src").glob("*.tsfile")), strict=True):
        shutil.copy(made, tmp_path / f"{name}.tsfile")  # two devices
    shutil.copy(corpus / "chunk.tsfile", tmp_path / "bad.tsfile")
    files = [tmp_path / f"{n}.tsfile" for n in ("a", "b", "bad")]
    with pytest.raises(TsFileFormatError, match=r"bad\.tsfile: tsfile's native reader crashed"):
        TsFileIterableDataset(files)
    ds = TsFileIterableDataset(files[:2], batch_size=10000)  # passed: no child
    assert len(ds.columns) == 8 and len(list(ds)) == 3
    with pytest.raises(TsFileFormatError, match=r"bad\.tsfile"):  # damage is never remembered
        TsFileIterableDataset(files)
    os.utime(files[1])  # touched: another identity, checked again
    TsFileIterableDataset(files[:2], validate="full")  # "headers" does not cover "full"
    TsFileIterableDataset(files[:2])  # "full" covers "headers"
    TsFileIterableDataset(files[:2], validate="full")
    assert checked == [
        ("headers", ["a.tsfile", "b.tsfile", "bad.tsfile"]),
        ("headers", ["bad.tsfile"]),
        ("full", ["a.tsfile", "b.tsfile"]),
    ]
    shutil.copy(corpus / "chunk.tsfile", files[0])  # rewritten in place: checked again
    with pytest.raises(TsFileFormatError, match=r"a\.tsfile: tsfile's native reader crashed"):
        TsFileIterableDataset(files[:2])


def test_a_pass_is_remembered_only_by_this_checker_for_the_file_as_it_ended(
    tmp_path, private_cache, monkeypatch
):
    """Another tsfile or tsfile-torch version checks anew; a file written while the child
    checked it is not remembered as passed (its key after the check is not the one before)."""
    from tsfile_torch.integrity import screen

    checked = []

    def spy(sources, mode="headers", timeout=None):
        checked.append(sorted(os.path.basename(s.name) for s in sources))
        found = validate_sources(sources, mode, timeout)
        if len(checked) == 1:
            os.utime(sources[0].path, ns=(1, 1))  # written during the first check
        return found

    monkeypatch.setattr(screen, "validate_sources", spy)
    synthetic.write_table_files(tmp_path, synthetic.DatasetSpec(2, 1, 2, 3000))
    files = sorted(tmp_path.glob("*.tsfile"))
    TsFileIterableDataset(files)
    TsFileIterableDataset(files)  # the file written during the check is checked again
    TsFileIterableDataset(files)  # both remembered now
    monkeypatch.setattr(screen, "checker", lambda: "tsfile 9.9.9, tsfile-torch 0.1.0")
    TsFileIterableDataset(files)  # another version: both anew
    names = [f.name for f in files]
    assert checked == [names, names[:1], names]
