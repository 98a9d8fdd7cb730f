"""Damaged files and files changed under a running dataset: exact values or a clear error.

Each case runs in a subprocess with a timeout, for every backend and num_workers 0 and 2: it must
end in exact values or a TsFileTorchError subclass naming the file, never a signal, a hang or
wrong values. The full sweep is marked slow; a representative subset runs by default.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tsfile_torch import synthetic
from tsfile_torch.integrity.manifest import write_manifest

ROWS = 30000
COMBOS = [(b, w) for b in ("auto", "mmap", "pread") for w in (0, 2)]

# The probe: read the whole file through a dataset (and a make_loader with workers), optionally
# changing it after the first batch; print one JSON line per (backend, workers).
PROBE = r"""
import json, os, sys, shutil
import numpy as np
from tsfile_torch import TsFileDataset, TsFileIterableDataset, TsFileTorchError, make_loader
from tsfile_torch import synthetic

args = json.loads(sys.argv[1])
path, change, kind = args["path"], args.get("change"), args.get("kind", "iterable")

def apply_change():
    st = os.stat(path)
    if change == "truncate":
        os.truncate(path, st.st_size // 2)
    elif change in ("overwrite", "overwrite_keep_mtime"):
        data = bytearray(open(path, "rb").read())
        data[args["flip"]] ^= 0x55
        with open(path, "r+b") as fh:
            fh.write(data)
        if change == "overwrite_keep_mtime":
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "delete":
        os.remove(path)
    elif change == "rename_over":
        shutil.copy(args["other"], path + ".new")
        os.replace(path + ".new", path)

for backend, workers in args["combos"]:
    if change:
        shutil.copy(args["pristine"], path)
    outcome = None
    seen = wrong = 0
    try:
        if kind == "map":
            ds = TsFileDataset(path, batch_size=5000, read_backend=backend, dtype="float64",
                               return_timestamps=True, block_rows=5000)
        else:
            ds = TsFileIterableDataset(path, batch_size=5000, read_backend=backend,
                                       dtype="float64", return_timestamps=True, block_rows=5000,
                                       shuffle=kind == "shuffle")
        loader = make_loader(ds, num_workers=workers, timeout=60) if workers else ds
        for epoch in range(2):
            for i, (values, times) in enumerate(loader):
                rows = times.numpy()
                want = np.stack([synthetic.value_of(0, c, rows) for c in range(4)], 1)
                wrong += int((values.numpy() != want).sum())
                seen += len(rows)
                if change and epoch == args.get("change_epoch", 0) and i == 0 and seen:
                    apply_change()
        outcome = {"result": "wrong" if wrong else "exact", "rows": seen, "values": wrong}
    except TsFileTorchError as err:
        result = "wrong_then_error" if wrong else "error"
        outcome = {"result": result, "type": type(err).__name__, "message": str(err)}
    except Exception as err:
        outcome = {"result": "other", "type": type(err).__name__, "message": str(err)[:500]}
    print(json.dumps({"backend": backend, "workers": workers, **outcome}), flush=True)
"""


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """One table file: 1 device x 4 DOUBLE x 30,000 rows (the fault-injection run's shape)."""
    directory = tmp_path_factory.mktemp("pristine")
    synthetic.write_table_files(directory, synthetic.DatasetSpec(1, 1, 4, ROWS))
    return next(directory.glob("*.tsfile"))


def _value_chunk(data: bytes, k: int) -> int:
    """Offset of the value-chunk header of series s<k> (marker 0x41, name 's<k>')."""
    return data.index(b"\x41\x04s" + str(k).encode())


def _damaged(data: bytes, case: str) -> bytes:
    """Return a damaged copy of ``data`` for a named case (fixed, reproducible offsets)."""
    b = bytearray(data)
    kind, _, arg = case.partition(":")
    if kind == "truncate":
        return bytes(b[: int(len(b) * float(arg))]) if "." in arg else bytes(b[: len(b) - int(arg)])
    if kind == "garbage":
        return bytes(b) + bytes(range(256)) * 4
    if kind == "flip":
        where, _, delta = arg.partition("+")
        if where == "end":
            offset = len(b) - int(delta)
        elif where == "time":
            offset = 9 + int(delta)  # inside the time chunk, which starts the data
        else:
            offset = _value_chunk(data, int(where[1:])) + int(delta)
        b[offset] ^= 0xFF
        return bytes(b)
    raise ValueError(case)


DEFAULT_CASES = [  # a subprocess each: one in the fast suite
    "flip:end+8",  # the metadata-size field: SIGSEGV at build before issue 7
    # a value-chunk marker: SIGSEGV at the first batch before issue 7
    pytest.param("flip:s1+0", marks=pytest.mark.slow),
    pytest.param("flip:s1+10000", marks=pytest.mark.slow),  # a data page
    pytest.param("truncate:0.5", marks=pytest.mark.slow),
    pytest.param("garbage:", marks=pytest.mark.slow),
]
SLOW_CASES = [
    "truncate:0.1",
    "truncate:0.9",
    "truncate:1",
    "truncate:7",
    "flip:end+3",  # the closing magic
    "flip:end+100",  # the metadata index
    "flip:s1+2",  # a value-chunk name
    "flip:time+300",
    "flip:s1+80000",
    "flip:s1+500",
    "flip:s1+10000",
    "flip:s2+500",
    "flip:s2+100000",
    "flip:s3+500",
    "flip:s3+150000",
    "flip:s0+1000",
]
#: Damage whose wrong values are handed out, then flagged by a statistics check (sum, last value)
#: at the end of the epoch: the run ends in an error naming the file, late.
LATE = {"flip:s1+80000", "flip:s1+500", "flip:s3+500", "flip:s3+150000", "flip:s0+1000"}


def _run(run_python, args: dict, timeout: float = 240) -> list[dict]:
    proc = run_python(PROBE, json.dumps(args), timeout=timeout)
    assert proc.returncode == 0, f"probe died ({proc.returncode}): {proc.stderr[-3000:]}"
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(args["combos"]), proc.stderr[-3000:]
    return lines


def _check(outcomes: list[dict], name: str, exact_rows: int | None = None) -> None:
    for o in outcomes:
        where = f"{o['backend']} workers={o['workers']}"
        if o["result"] == "wrong_then_error":  # a statistics check flags the epoch at its end
            assert "metadata says" in o["message"], f"{where}: {o}"
        else:
            assert o["result"] in ("exact", "error"), f"{where}: {o}"
        if o["result"] != "exact":
            assert name in o["message"], f"{where}: error does not name the file: {o}"
        elif exact_rows is not None:
            assert o["rows"] == exact_rows, f"{where}: {o}"


#: flips in low mantissa bits of DOUBLE pages: values off by < 1e-9, inside [min, max], sums
#: within rounding. No statistic can see them (TsFile pages carry no checksum); a manifest
#: written from the intact file does (docs/damaged-files.md).
SEEN_ONLY_BY_A_MANIFEST = ("flip:s2+500", "flip:s2+100000")


def _damage_case(run_python, tmp_path, pristine, case, kind="iterable"):
    bad = tmp_path / "damaged.tsfile"
    if case in SEEN_ONLY_BY_A_MANIFEST:  # the manifest of the intact file, then the damage
        bad.write_bytes(pristine.read_bytes())
        write_manifest(tmp_path)
    bad.write_bytes(_damaged(pristine.read_bytes(), case))
    outcomes = _run(run_python, {"path": str(bad), "combos": COMBOS, "kind": kind})  # no hang
    if case in SEEN_ONLY_BY_A_MANIFEST:
        assert all(o["result"] == "error" for o in outcomes), outcomes
        assert all("content differs from the manifest" in o["message"] for o in outcomes)
    _check(outcomes, "damaged.tsfile", exact_rows=2 * ROWS)
    if case in LATE and kind == "shuffle":
        # a shuffled batch gathers from whole blocks decoded (and checked) before it: the
        # check fails before any of the damaged rows is handed out
        assert all(o["result"] == "error" for o in outcomes), outcomes
    elif case in LATE:
        assert all(o["result"] == "wrong_then_error" for o in outcomes), outcomes


@pytest.mark.parametrize("case", DEFAULT_CASES)
def test_damaged_file_reads_exactly_or_fails_naming_it(run_python, tmp_path, pristine, case):
    _damage_case(run_python, tmp_path, pristine, case)


@pytest.mark.slow
@pytest.mark.parametrize("case", SLOW_CASES)
def test_damaged_file_sweep(run_python, tmp_path, pristine, case):
    _damage_case(run_python, tmp_path, pristine, case)


@pytest.mark.parametrize(
    "case",
    [
        "flip:s1+10000",  # a data page
        pytest.param("truncate:0.5", marks=pytest.mark.slow),
        pytest.param("flip:s1+80000", marks=pytest.mark.slow),  # flagged late
        pytest.param("flip:s2+500", marks=pytest.mark.slow),  # seen only by a manifest
    ],
)
def test_damaged_file_through_shuffling_workers_reads_exactly_or_fails_naming_it(
    run_python, tmp_path, pristine, case
):
    # 6 blocks in one shuffle buffer: 2 fork workers decode them through the block exchange
    # (a worker whose decode fails gives its claim back; the other decodes it and fails too)
    _damage_case(run_python, tmp_path, pristine, case, kind="shuffle")


CHANGES = ["truncate", "overwrite", "overwrite_keep_mtime", "delete", "rename_over"]


def _change_case(run_python, tmp_path, pristine, change, kind, change_epoch):
    path = tmp_path / "live.tsfile"
    other = tmp_path / "other.tsfile"
    synthetic.write_table_files(tmp_path / "o", synthetic.DatasetSpec(1, 1, 4, ROWS, table="u"))
    other.write_bytes(next((tmp_path / "o").glob("*.tsfile")).read_bytes())
    flip = _value_chunk(pristine.read_bytes(), 2) + 100000
    outcomes = _run(
        run_python,
        {
            "path": str(path),
            "pristine": str(pristine),
            "other": str(other),
            "change": change,
            "change_epoch": change_epoch,
            "kind": kind,
            "flip": flip,
            "combos": COMBOS,
        },
    )
    _check(outcomes, "live.tsfile")
    if kind == "iterable" and change_epoch == 0:  # the second epoch must notice
        assert all(o["result"] == "error" for o in outcomes), outcomes


@pytest.mark.slow  # a subprocess per change (between epochs: tests/test_errors.py)
@pytest.mark.parametrize("change", ["truncate", "overwrite_keep_mtime"])
def test_file_changed_mid_epoch_reads_exactly_or_fails_naming_it(
    run_python, tmp_path, pristine, change
):
    _change_case(run_python, tmp_path, pristine, change, "iterable", 0)


@pytest.mark.slow  # a subprocess per change
def test_map_style_dataset_without_set_epoch_notices_a_truncation(run_python, tmp_path, pristine):
    _change_case(run_python, tmp_path, pristine, "truncate", "map", 0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("change", CHANGES)
def test_file_change_sweep(run_python, tmp_path, pristine, change, kind):
    _change_case(run_python, tmp_path, pristine, change, kind, 0)


# A file IoTDB-style: 2 devices x 3 DOUBLE x 30,000 rows, flushed every 7,000 rows (5 chunks per
# series), with d0's second time-chunk header damaged. Its marker flipped: tsfile skips that
# chunk and carries on, so every later row of d0 comes from 7,000 rows further on, timestamps and
# values agreeing with each other (read lazily, the timeline index handed out 3,000 such rows
# with one device selected before the row count was checked at the end). Its name length
# flipped: tsfile's reader crashes (SIGSEGV) when it reaches that chunk.
MULTI_CHUNK = synthetic.DatasetSpec(1, 2, 3, ROWS)


def _later_chunk_damaged(directory: Path, offset: int) -> Path:
    [path] = synthetic.write_table_files(directory, MULTI_CHUNK, flush_every=7000)
    data = bytearray(Path(path).read_bytes())
    # time-chunk headers: marker 0x85, empty name, data size varint, INT64 / LZ4 / TS_2DIFF
    headers = [
        i
        for i in range(len(data) - 7)
        if data[i : i + 2] == b"\x85\x00" and data[i + 4 : i + 7] == b"\x06\x07\x04"
    ]
    data[headers[1] + offset] ^= 0xFF
    damaged = directory / "damaged.tsfile"
    damaged.write_bytes(bytes(data))
    return damaged


@pytest.fixture(scope="module")
def skipped_chunk(tmp_path_factory) -> Path:
    return _later_chunk_damaged(tmp_path_factory.mktemp("chunks"), 0)


def _first_batch(path, kind: str, one_device: bool, validate: bool):
    from tsfile_torch import TsFileDataset, TsFileWindowDataset

    common = {"dtype": "float64", "block_rows": 5000, "index_cache": False, "validate": validate}
    if kind == "rows":
        ds = TsFileDataset(path, "t.d0.*" if one_device else None, batch_size=5000, **common)
        return ds[0]
    ds = TsFileWindowDataset(
        path, 500, stride=500, devices=["t.d0"] if one_device else None, **common
    )
    return ds.__getitems__([0])


@pytest.mark.parametrize("devices", ["one", "all"])
@pytest.mark.parametrize("kind", ["rows", "windows"])
def test_a_skipped_later_chunk_is_an_error_before_any_row_is_handed_out(
    skipped_chunk, kind, devices
):
    from tsfile_torch import TsFileFormatError

    # validate=False: the reading process's own guard (the whole time column before a read)
    with pytest.raises(TsFileFormatError) as caught:
        _first_batch(skipped_chunk, kind, devices == "one", validate=False)
    message = str(caught.value)
    assert message.startswith(f"{skipped_chunk}: device t.d0: the time column read"), message
    assert "returned 23000 timestamps, which disagrees with the metadata's 30000 rows" in message
    assert "damaged" in message and "align=" not in message


def test_a_skipped_later_chunk_fails_validation_at_build(skipped_chunk):
    from tsfile_torch import TsFileFormatError

    with pytest.raises(
        TsFileFormatError,
        match=r"device t\.d0: the time column read .* returned "
        r"23000 timestamps",
    ) as caught:
        _first_batch(skipped_chunk, "rows", one_device=True, validate=True)
    assert str(caught.value).startswith(f"{skipped_chunk}: ")


# Builds a dataset (validate=True) over a file whose later chunk header crashes tsfile's reader.
CRASHING_CHUNK = r"""
import sys
from tsfile_torch import TsFileDataset, TsFileFormatError
try:
    TsFileDataset(sys.argv[1], "t.d0.*", batch_size=5000, index_cache=False)[0]
except TsFileFormatError as err:
    print(err)
"""


def test_a_later_chunk_header_that_crashes_the_reader_fails_validation(tmp_path, run_python):
    path = _later_chunk_damaged(tmp_path, 1)  # its name length
    proc = run_python(CRASHING_CHUNK, str(path))
    assert proc.returncode == 0, proc.stderr[-2000:]  # the crash stayed in the child
    assert proc.stdout.startswith(f"{path}: tsfile's native reader crashed on this file"), proc


def _later_value_chunk_damaged(directory: Path) -> Path:
    """The multi-chunk file with the name length of s1's second value-chunk header flipped:
    validation's first chunks pass, tsfile's reader crashes (SIGSEGV) when a read reaches it."""
    [path] = synthetic.write_table_files(directory, MULTI_CHUNK, flush_every=7000)
    data = bytearray(Path(path).read_bytes())
    headers = [m.start() for m in re.finditer(rb"[\x41\x45]\x04s1", bytes(data))]
    data[headers[1] + 1] ^= 0xFF
    damaged = directory / "damaged.tsfile"
    damaged.write_bytes(bytes(data))
    return damaged


# Builds a dataset over such a file with validate=VALIDATE and reads it with num_workers=0.
LATER_VALUE_CHUNK = r"""
import sys
from tsfile_torch import TsFileDataset, TsFileFormatError
validate = {"full": "full", "True": True}[sys.argv[2]]
try:
    ds = TsFileDataset(sys.argv[1], batch_size=5000, index_cache=False, validate=validate)
    for i in range(len(ds)):
        ds[i]
    print("read")
except TsFileFormatError as err:
    print(err)
"""


@pytest.mark.slow  # decodes whole files
def test_full_validation_finds_a_later_value_chunk_that_crashes_the_reader(tmp_path, run_python):
    path = _later_value_chunk_damaged(tmp_path)
    crashed = run_python(LATER_VALUE_CHUNK, str(path), "True")
    assert crashed.returncode < 0  # headers only: the reading process dies in tsfile's reader
    proc = run_python(LATER_VALUE_CHUNK, str(path), "full")
    assert proc.returncode == 0, proc.stderr[-2000:]  # the crash stayed in the child
    assert proc.stdout.startswith(f"{path}: tsfile's native reader crashed on this file"), proc
