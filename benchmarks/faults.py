"""Fault corpus: damaged, replaced and changing files, odd arguments; how each case ends.

Every case of issue 18's corpus, each run in its own subprocess (a native crash is an outcome,
not the end of the run) with a timeout (a hang is an outcome too), through the row dataset and
the window dataset, with 0 and 2 DataLoader workers where workers matter. Files are written with
tsfile's own writers (``tsfile_torch.synthetic``); every value read is compared with what was
written. An outcome is one of:

- ``exact``: every value and timestamp handed out is the one written (or, for an argument case,
  the call worked as documented);
- ``clear``: a tsfile-torch error naming the file (for argument cases: a ``ValueError`` /
  ``TypeError`` naming the argument) before any wrong value was handed out;
- ``raw``: any other exception (a tsfile exception, ``PermissionError``, ``IndexError``...), or
  an error that does not name the file;
- ``wrong``: a value or timestamp handed out that was never written (an error after it does not
  undo that);
- ``crash``: the process died (a signal, or an exit without a result);
- ``hang``: no result within ``--timeout`` seconds.

The worker cases (``--only worker-``) signal or race DataLoader workers: a worker SIGKILLed or
SIGSTOPped mid-epoch (the epoch must raise ``WorkerError``, naming a stopped worker within 15 s
under ``timeout=5``, and the next epoch over the same loader must be exact), every window batch
of two epochs kept from 2 workers (exact, equal to 0 workers', ``torch.save`` works), and two
loaders over one dataset started at once from two threads (one gets the documented "already
being iterated" error, the other is exact). Each of their waits is bounded inside the case (a
bound run out is ``hang``); a case that times out is killed with its whole process group.

Each case states what it must end in (``exact``, ``clear`` or either); the run counts the cases
that do. The cases that fail without a manifest because no statistic can see the damage (flips
in the low mantissa bits of DOUBLE values) are marked ``needs manifest``: their manifest twins
show what a manifest does.

    python benchmarks/faults.py --out /tmp/faults                # every case
    python benchmarks/faults.py --out /tmp/faults --only chunk   # cases whose name contains it

Writes ``DIR/faults.json`` (one record per case, with the environment) and prints the table.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROWS = 30000
FIELDS = ["s0", "s1", "s2", "s3"]
RW_FLIPS = 8  # single-byte flips spread over the value chunk of s1 of the random-walk file


# -- the cases --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One run: ``scenario`` (a function below) over ``kind`` datasets with ``workers``."""

    name: str
    scenario: str
    kind: str = "rows"  # "rows" | "windows" | "iterable" (TsFileIterableDataset)
    workers: int = 0
    expect: str = "either"  # "exact" | "clear" | "either"
    args: dict = field(default_factory=dict)
    note: str = ""


def corpus() -> list[Case]:
    """Return every case of the corpus, in run order."""
    cases: list[Case] = []
    both = ("rows", "windows")

    def add(name, scenario, kinds=both, workers=(0,), **kw):
        for kind in kinds:
            for w in workers:
                cases.append(Case(f"{name}/{kind}/w{w}", scenario, kind, w, **kw))

    add("overwrite-same-size-mid-epoch", "change", workers=(0, 2), args={"change": "overwrite"})
    add("flip-mid-file", "flip", workers=(2,), args={"file": "base", "where": "middle"})
    for k in range(RW_FLIPS):
        for manifest in (False, True):
            add(
                f"random-walk-value-flip-{k}{'+manifest' if manifest else ''}",
                "flip",
                expect="clear" if manifest else "either",
                args={"file": "walk", "where": f"walk:{k}", "manifest": manifest},
                note="" if manifest else "needs manifest",
            )
    add("replace-over-live-file-mid-epoch", "poison", args={})
    for backend in ("mmap", "auto", "pread"):
        add(
            f"truncate-between-batches-{backend}",
            "change",
            args={"change": "truncate", "backend": backend},
        )
    for devices in ("all", "one"):
        add(
            f"later-chunk-header-{devices}-devices",
            "flip",
            args={"file": "chunks", "where": "later-chunk", "devices": devices},
        )
    add(
        "later-chunk-header-name-length",
        "flip",
        workers=(0, 2),
        args={"file": "chunks", "where": "later-chunk:name-length", "devices": "one"},
    )
    for guard in ("", "manifest", "full-validation"):
        add(
            f"later-value-chunk-header{'+' + guard if guard else ''}",
            "flip",
            workers=(0,) if guard else (0, 2),
            expect="clear" if guard else "either",
            args={
                "file": "chunks",
                "where": "later-value-chunk",
                "devices": "one",
                "manifest": guard == "manifest",
                "validate": "full" if guard == "full-validation" else True,
            },
        )
    add("chunk-size-byte", "flip", args={"file": "base", "where": "chunk-size"})
    add("chunk-name-byte", "flip", args={"file": "base", "where": "chunk-name"})
    add("metadata-name-byte", "flip", args={"file": "base", "where": "metadata-name"})
    for change in ("hardlink", "chmod", "chown"):
        add(
            f"{change}-mid-epoch", "change", workers=(0, 2), expect="exact", args={"change": change}
        )
    add("read-only-remote-cache-dir", "readonly_cache", expect="clear")
    add("remote-object-differs-from-manifest", "remote_manifest", expect="clear")
    add("full-index-cache-dir", "full_index", expect="exact")
    add("batch_size=2**63", "argument", kinds=("rows",), args={"arg": "batch_size"})
    add("stride=2**63", "argument", kinds=("windows",), args={"arg": "stride"})
    add("context_length=2**63", "argument", kinds=("windows",), args={"arg": "context_length"})
    add("block_rows=2**40", "argument", workers=(2,), args={"arg": "block_rows"})
    add("getitems-empty", "argument", kinds=("windows",), expect="exact", args={"arg": "getitems"})
    add("numpy-int64-arguments", "argument", workers=(2,), expect="exact", args={"arg": "numpy"})
    add("num_workers=-1", "argument", expect="clear", args={"arg": "num_workers"})
    for damage in ("value-exponent", "value-low-mantissa", "timestamp"):
        add(
            f"disk-cache-{damage}", "cache", workers=(0, 2), expect="exact", args={"damage": damage}
        )
    for damage in ("flags-on-unwritten-rows", "other-entrys-data"):
        add(
            f"disk-cache-{damage}",
            "cache",
            ("rows",),
            (0, 2),
            expect="exact",
            args={"damage": damage},
        )
    for manifest in (False, True):
        label = "+manifest" if manifest else ""
        add(
            f"one-bad-file-of-8-skip{label}",
            "skip",
            workers=(0, 2),
            expect="exact",
            args={"manifest": manifest},
        )
    for kind in ("iterable", "rows"):
        add("worker-killed-mid-epoch", "worker_kill", (kind,), (2,), expect="exact")
        for cont in (True, False):
            add(
                f"worker-stopped-mid-epoch{'+cont' if cont else ''}",
                "worker_stop",
                (kind,),
                (2,),
                expect="exact",
                args={"cont": cont},
            )
    for as_dict in (False, True):
        add(
            f"worker-batches-kept{'+dict' if as_dict else ''}",
            "worker_keep",
            ("windows",),
            (2,),
            expect="exact",
            args={"dict": as_dict},
        )
    for kind in ("iterable", "rows"):
        add("worker-two-loaders-at-once", "worker_race", (kind,), (2,), expect="exact")
    # running out is not damage (issue 42): a clear error naming what ran out, no verdict kept
    add("memory-short-in-a-worker", "exhaustion", ("rows",), (1,), expect="exact",
        args={"what": "memory"})  # fmt: skip
    add("dev-shm-full", "exhaustion", ("rows",), (1,), expect="clear", args={"what": "shm"})
    return cases


# -- data -------------------------------------------------------------------------------------
def write_data(data: Path) -> None:
    """Write the pristine files and what they hold (``truth.npz``: times and values per column
    per file) into ``data``; skipped when already there."""
    import numpy as np

    from tsfile_torch import synthetic

    if (data / "done").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    truth: dict[str, np.ndarray] = {}

    def synthetic_truth(stem: str, spec, first_file: int = 0) -> None:
        rows = np.arange(spec.num_rows)
        for f in range(spec.num_files):
            for i in range(spec.devices_per_file):
                d = f * spec.devices_per_file + i
                for j in range(spec.fields_per_device):
                    col = i * spec.fields_per_device + j
                    truth[f"{stem}:t.d{d}.s{j}:times"] = rows
                    truth[f"{stem}:t.d{d}.s{j}:values"] = synthetic.value_of(f, col, rows)

    base = synthetic.DatasetSpec(1, 1, 4, ROWS)
    synthetic.write_table_files(data / "base", base)
    synthetic_truth("base", base)
    chunks = synthetic.DatasetSpec(1, 2, 3, ROWS)  # 2 devices, 5 chunks per series
    synthetic.write_table_files(data / "chunks", chunks, flush_every=7000)
    synthetic_truth("chunks", chunks)
    many = synthetic.DatasetSpec(8, 1, 4, 5000)
    synthetic.write_table_files(data / "many", many)
    synthetic_truth("many", many)

    rng = np.random.default_rng(18)
    times = np.arange(ROWS, dtype=np.int64)
    walk = np.cumsum(rng.normal(0, 1, (ROWS, len(FIELDS))), axis=0) + 100.0
    (data / "walk").mkdir()
    synthetic.write_table_devices(
        data / "walk/walk.tsfile", "t", FIELDS, {"d0": (times, walk)}, tag="device"
    )
    for j, name in enumerate(FIELDS):
        truth[f"walk:t.d0.{name}:times"] = times
        truth[f"walk:t.d0.{name}:values"] = walk[:, j]

    # a live file and the next version published over it: same device, row count, first and
    # last timestamp; every other timestamp elsewhere
    (data / "live").mkdir()
    for version in (0, 1):
        t = times * 10 if version == 0 else times * 5 + 5
        t[0], t[-1] = 0, (ROWS - 1) * 10
        v = np.stack([synthetic.value_of(version, j, times) for j in range(4)], axis=1)
        synthetic.write_table_devices(
            data / f"live/v{version}.tsfile", "t", FIELDS, {"d0": (t, v)}, tag="device"
        )
        for j, name in enumerate(FIELDS):
            truth[f"live{version}:t.d0.{name}:times"] = t
            truth[f"live{version}:t.d0.{name}:values"] = v[:, j]
    np.savez(data / "truth.npz", **truth)
    (data / "done").write_text("")


def damage_offset(data: bytes, where: str) -> int:
    """Return the offset of the byte to flip for a named place in a pristine file."""
    if where == "middle":
        return len(data) // 2
    if where.startswith("walk:"):  # inside the value pages of s1, away from the chunk header
        start = data.index(b"\x04s1", data.index(b"\x04s0") + 64)
        end = data.index(b"\x04s2", start)
        k = int(where[5:])
        return start + 64 + (end - start - 128) * (2 * k + 1) // (2 * RW_FLIPS)
    if where.startswith("later-chunk"):  # d0's second time-chunk header: marker, name length
        headers = [
            i
            for i in range(len(data) - 7)
            if data[i : i + 2] == b"\x85\x00" and data[i + 4 : i + 7] == b"\x06\x07\x04"
        ]
        return headers[1] + (1 if where.endswith(":name-length") else 0)
    if where == "later-value-chunk":  # the name length of s1's second value-chunk header
        headers = [m.start() for m in re.finditer(rb"[\x41\x45]\x04s1", data)]
        return headers[1] + 1
    if where == "chunk-size":  # the high byte of s1's value-chunk size varint
        return data.index(b"\x04s1") + 5
    if where == "chunk-name":
        return data.index(b"\x04s1") + 1
    if where == "metadata-name":  # the device name in the metadata index at the tail
        return data.rindex(b"d0")
    raise ValueError(where)


# -- reading and judging (in the case's process) -----------------------------------------------
class Wrong(Exception):
    """Values were handed out that were never written."""


class Slow(Exception):
    """A bounded wait ran out inside the case (judged ``hang``)."""


class Missed(Exception):
    """The documented error did not come (judged ``raw``)."""


class Judge:
    """Compares what a dataset hands out with what was written."""

    def __init__(self, truth_path: Path, stem: str):
        import numpy as np

        self.np = np
        with np.load(truth_path) as z:
            self.cols = {
                k.split(":")[1]: (z[k], z[k.replace(":times", ":values")])
                for k in z.files
                if k.startswith(stem + ":") and k.endswith(":times")
            }
        self.wrong = 0
        self.rows = 0

    def check(self, names: list[str], rows, times, values) -> None:
        """Judge rows ``rows`` (positions in each column's series) handed out with ``times``
        (n,) and ``values`` (n, len(names)): the right timestamps, the right values."""
        np = self.np
        for c, name in enumerate(names):
            t, v = self.cols[name]
            bad = (rows >= len(t)) | (t[np.minimum(rows, len(t) - 1)] != times)
            idx = np.minimum(np.searchsorted(t, times), len(t) - 1)
            bad |= (t[idx] != times) | (v[idx] != values[:, c])
            self.wrong += int(bad.sum())
        self.rows += len(times)


def _dataset(kind: str, paths, **kw):
    from tsfile_torch import TsFileDataset, TsFileWindowDataset

    common = {"dtype": "float64", "return_timestamps": True, "index_cache": False}
    common.update(kw.pop("options", {}))
    if kind == "rows":
        kw.setdefault("batch_size", 5000)
        kw.setdefault("block_rows", 5000)
        return TsFileDataset(paths, **kw, **common)
    kw.setdefault("context_length", 500)
    kw.setdefault("stride", 500)
    kw.setdefault("block_rows", 5000)
    return TsFileWindowDataset(paths, order="sequential", **kw, **common)


def read_all(ds, kind: str, judge: Judge, workers: int, after_batch=None, epochs: int = 1):
    """Read every batch of ``ds`` (``epochs`` times) and judge it; ``after_batch(i)`` runs
    after batch ``i`` of the first epoch was judged. Raises Wrong at the first wrong value."""
    from tsfile_torch import make_loader

    per_batch = 64
    if kind == "rows":
        loader = make_loader(ds, num_workers=workers, timeout=60) if workers else ds
    else:
        more = {"timeout": 60} if workers else {}
        loader = make_loader(ds, batch_size=per_batch, num_workers=workers, **more)
    np = judge.np
    for epoch in range(epochs):
        starts = []  # rows: the first row of each batch (workers may hand batches out of order)
        for i, batch in enumerate(loader):
            if kind == "rows":  # a batch is rows [k * batch_size, ...) for some k
                values, times = (x.numpy() for x in batch)
                row0 = int(np.searchsorted(judge.cols[ds.columns[0]][0], times[0]))
                if row0 % ds.batch_size:
                    judge.wrong += len(times)
                starts.append(row0)
                judge.check(ds.columns, row0 + np.arange(len(times)), times, values)
            else:
                x, times = (b.numpy() for b in batch)
                for w in range(len(x)):
                    info = ds.window_info(i * per_batch + w)
                    names = [f"{info.device}.{f}" for f in ds.fields]
                    rows = info.start_row + np.arange(x.shape[1])
                    judge.check(names, rows, times[w], x[w])
            if judge.wrong:
                raise Wrong(f"{judge.wrong} wrong values in batch {i} of epoch {epoch}")
            if after_batch is not None and epoch == 0:
                after_batch(i)
        if kind == "rows" and sorted(starts) != list(range(0, ds.num_rows, ds.batch_size)):
            raise Wrong(f"epoch {epoch}: the batches do not cover every row once")
    return judge.rows


def _copy(src: Path, work: Path, name: str | None = None) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    target = work / (name or src.name)
    shutil.copyfile(src, target)
    return target


def _flip(path: Path, where: str) -> None:
    data = bytearray(path.read_bytes())
    data[damage_offset(bytes(data), where)] ^= 0xFF
    with open(path, "r+b") as fh:  # in place
        fh.write(data)


def scenario_change(case: Case, data: Path, work: Path) -> dict:
    """Change the file after the first batch: overwrite (same size), truncate, or only its
    metadata (a hard link, chmod, chown)."""
    change = case.args["change"]
    path = _copy(data / "base/part000.tsfile", work)
    options = {"read_backend": case.args.get("backend", "auto")}
    small = change == "truncate"  # small blocks: the next batch extends the index
    ds = _dataset(
        case.kind,
        str(path),
        options=options,
        **({"block_rows": 1000} if small else {}),
        **({"batch_size": 1000} if small and case.kind == "rows" else {}),
    )

    def after(i):
        if i != 0:
            return
        if change == "overwrite":
            b = bytearray(path.read_bytes())
            for k in range(len(b) // 4, len(b) * 3 // 4, 997):
                b[k] ^= 0x5A
            with open(path, "r+b") as fh:
                fh.write(b)
        elif change == "truncate":
            os.truncate(path, os.path.getsize(path) // 2)
        elif change == "hardlink":
            os.link(path, work / "snapshot.tsfile")
        elif change == "chmod":
            os.chmod(path, 0o600)
        elif change == "chown":
            os.chown(path, 1234, 1234)

    judge = Judge(data / "truth.npz", "base")
    return {"rows": read_all(ds, case.kind, judge, case.workers, after, epochs=2)}


def scenario_flip(case: Case, data: Path, work: Path) -> dict:
    """One byte flipped before the dataset is built (optionally after writing a manifest)."""
    from tsfile_torch.integrity.manifest import write_manifest

    stem = case.args["file"]
    src = {
        "base": "base/part000.tsfile",
        "walk": "walk/walk.tsfile",
        "chunks": "chunks/part000.tsfile",
    }[stem]
    path = _copy(data / src, work, "damaged.tsfile")
    if case.args.get("manifest"):
        write_manifest(work)
    _flip(path, case.args["where"])
    kw = {}
    if case.args.get("devices") == "one":
        kw = {"columns": "t.d0.*"} if case.kind == "rows" else {"devices": ["t.d0"]}
    ds = _dataset(case.kind, str(path), options={"validate": case.args.get("validate", True)}, **kw)
    judge = Judge(data / "truth.npz", stem)
    return {"rows": read_all(ds, case.kind, judge, case.workers, epochs=2)}


def _live_dataset(case: Case, work: Path):
    """A dataset over ``work/live.tsfile`` with its index cache in ``work/index``."""
    return _dataset(
        case.kind,
        str(work / "live.tsfile"),
        options={"index_cache": str(work / "index")},
        block_rows=2000,
        **({"batch_size": 2000} if case.kind == "rows" else {}),
    )


def scenario_poison(case: Case, data: Path, work: Path) -> dict:
    """Publish a new file over a live one with os.replace mid-epoch (index cache on); then a
    new process must read the new file exactly."""
    live = _copy(data / "live/v0.tsfile", work, "live.tsfile")
    new = _copy(data / "live/v1.tsfile", work, "next.tsfile")
    read_all(_live_dataset(case, work), case.kind, Judge(data / "truth.npz", "live0"), 0)

    def after(i):
        if i == 1:
            os.replace(new, live)

    first = None
    try:  # a whole pass above saved the index; this one sees the file replaced
        read_all(_live_dataset(case, work), case.kind, Judge(data / "truth.npz", "live0"), 0, after)
    except Exception as err:  # judged below: the second process must read the new file
        first = f"{type(err).__name__}: {err}"
    if os.path.exists(new):
        os.replace(new, live)
    proc = subprocess.run(
        _case_command(case, data, work, "--phase", "2"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    got = _last_json(proc.stdout)
    if got is None:
        raise RuntimeError(f"the second process died ({proc.returncode}): {proc.stderr[-800:]}")
    if got["result"] != "exact":
        raise Wrong(f"a new process did not read the new file exactly: {got}")
    return {
        "rows": got.get("rows"),
        "detail": f"mid-epoch: {first or 'no error'}; new process: exact",
    }


def scenario_poison_phase2(case: Case, data: Path, work: Path) -> dict:
    ds = _live_dataset(case, work)
    return {"rows": read_all(ds, case.kind, Judge(data / "truth.npz", "live1"), 0)}


def _drop_root_override() -> None:
    """Drop the capabilities that let root write into any directory (a read-only dir is then
    read-only for this process too)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: from the bounding set
            libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP


def scenario_readonly_cache(case: Case, data: Path, work: Path) -> dict:
    """Objects behind memory:// URLs, an existing cache_dir that cannot be written."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/faults-ro/part000.tsfile", (data / "base/part000.tsfile").read_bytes())
    cache = work / "cache"
    cache.mkdir(parents=True)
    os.chmod(cache, 0o555)
    ds = _dataset(case.kind, "memory://faults-ro/", options={"cache_dir": str(cache)})
    return {"rows": read_all(ds, case.kind, Judge(data / "truth.npz", "base"), case.workers)}


def scenario_remote_manifest(case: Case, data: Path, work: Path) -> dict:
    """memory:// objects with a manifest beside them, written before one object was damaged
    (a flipped value byte: plausible values): reading it must fail, naming its URL."""
    import fsspec

    from tsfile_torch.integrity.manifest import MANIFEST_NAME, write_manifest

    path = _copy(data / "base/part000.tsfile", work / "up")
    write_manifest(work / "up")
    _flip(path, "walk:4")
    fs = fsspec.filesystem("memory")
    for name in (path.name, MANIFEST_NAME):
        fs.pipe(f"/faults-manifest/{name}", (work / "up" / name).read_bytes())
    ds = _dataset(case.kind, "memory://faults-manifest/", options={"cache_dir": str(work / "c")})
    return {"rows": read_all(ds, case.kind, Judge(data / "truth.npz", "base"), case.workers)}


def scenario_full_index(case: Case, data: Path, work: Path) -> dict:
    """The index cache cannot be written (no file may grow past 64 bytes while reading)."""
    import resource
    import signal

    path = _copy(data / "base/part000.tsfile", work)
    index = work / "index"
    ds = _dataset(case.kind, str(path), options={"index_cache": str(index)})
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
    try:
        rows = read_all(ds, case.kind, Judge(data / "truth.npz", "base"), case.workers)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
    left = [p.name for p in index.rglob("*.tmp")]
    if left:
        raise Wrong(f"temporary files left in the index cache: {left}")
    return {"rows": rows}


def scenario_argument(case: Case, data: Path, work: Path) -> dict:
    """Odd arguments: huge integers, numpy integers, an empty __getitems__, num_workers=-1."""
    import numpy as np

    from tsfile_torch import make_loader

    path = str(_copy(data / "base/part000.tsfile", work))
    judge = Judge(data / "truth.npz", "base")
    arg = case.args["arg"]
    if arg in ("batch_size", "stride", "context_length"):
        ds = _dataset(case.kind, path, **{arg: 2**63})
        return {"rows": read_all(ds, case.kind, judge, case.workers)}
    if arg == "block_rows":
        ds = _dataset(case.kind, path, block_rows=2**40)
        return {"rows": read_all(ds, case.kind, judge, case.workers)}
    if arg == "getitems":
        ds = _dataset(case.kind, path)
        got = ds.__getitems__([])
        if len(got) != 0:
            raise Wrong(f"__getitems__([]) returned {len(got)} windows")
        return {"rows": 0, "detail": f"empty {type(got).__name__}"}
    if arg == "numpy":
        i = np.int64
        if case.kind == "rows":
            ds = _dataset(
                case.kind,
                path,
                batch_size=i(5000),
                block_rows=i(5000),
                seed=i(3),
                options={"max_open_files": i(4), "cache_bytes": i(2**26)},
            )
            loader = make_loader(ds, num_workers=i(case.workers), timeout=60)
        else:
            ds = _dataset(
                case.kind,
                path,
                context_length=i(500),
                stride=i(500),
                horizon=i(0),
                block_rows=i(5000),
                seed=i(3),
            )
            loader = make_loader(ds, batch_size=i(64), num_workers=i(case.workers), timeout=60)
        return {"rows": sum(len(b[0]) for b in loader)}
    if arg == "num_workers":
        ds = _dataset(case.kind, path)
        make_loader(ds, num_workers=-1, **({"batch_size": 64} if case.kind == "windows" else {}))
        return {"rows": 0}
    raise ValueError(arg)


def scenario_skip(case: Case, data: Path, work: Path) -> dict:
    """Eight files, one damaged, on_damaged='skip': the other seven read exactly, the damaged
    one listed in ds.skipped. Without a manifest the damage crashes the reader (a chunk header);
    with one it is a silent value flip only the content hash sees."""
    from tsfile_torch.integrity.manifest import write_manifest

    for src in sorted((data / "many").glob("*.tsfile")):
        _copy(src, work)
    bad = work / "part003.tsfile"
    manifest = case.args["manifest"]
    if manifest:
        write_manifest(work)
    _flip(bad, "walk:4" if manifest else "chunk-size")
    import warnings

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ds = _dataset(
            case.kind,
            str(work),
            options={"on_damaged": "skip"},
            block_rows=1000,
            **({"batch_size": 1000} if case.kind == "rows" else {}),
        )
    if [os.path.basename(name) for name, _ in ds.skipped] != [bad.name]:
        raise Wrong(f"skipped {ds.skipped}, expected {bad.name} alone")
    rows = read_all(ds, case.kind, Judge(data / "truth.npz", "many"), case.workers)
    names = ds.columns if case.kind == "rows" else ds.devices
    if any(".d3" in str(n) for n in names):
        raise Wrong(f"the damaged file's columns are read: {names}")
    return {"rows": rows, "detail": f"skipped {bad.name}"}


def _entry_arrays(path: Path):
    """Return writable views of a decoded-cache entry's flags, timestamps and values (the
    layout read from its header, before and after checked blocks)."""
    import numpy as np

    with open(path, "rb") as fh:
        meta_len, key_len = struct.unpack("<II", fh.read(16)[8:16])
        meta = json.loads(fh.read(meta_len))
        key = json.loads(fh.read(key_len))

    def up(n):
        return -(-n // 4096) * 4096

    rows, columns, dtype = meta["rows"], meta["columns"], np.dtype(meta["dtype"])
    at = up(16 + meta_len + key_len)
    flags_at, at = at, at + up(rows)
    if "check_rows" in meta:  # one seal word per block of each table
        step = meta["check_rows"]
        at += up(8 * sum(-(-n // step) for _, n in key["tables"]))
    times_at, values_at = at, at + up(rows * 8)
    mm = np.memmap(path, np.uint8, "r+")
    flags = mm[flags_at : flags_at + rows].view(np.bool_)
    times = mm[times_at : times_at + rows * 8].view(np.int64)
    values = mm[values_at : values_at + rows * columns * dtype.itemsize].view(dtype)
    return flags, times, values.reshape(rows, columns)


def scenario_cache(case: Case, data: Path, work: Path) -> dict:
    """Fill a decoded disk-cache entry, change it on disk, read through a new dataset."""
    import warnings

    import numpy as np

    from tsfile_torch.read import diskcache

    damage = case.args["damage"]
    path = _copy(data / "base/part000.tsfile", work)

    def build(cache_dir, **kw):
        options = {"cache": "disk", "cache_dir": str(work / cache_dir)}
        return _dataset(case.kind, str(path), options=options, **kw)

    def entry(cache_dir):
        (e,) = diskcache.entries(diskcache.decoded_dir(str(work / cache_dir)))
        return e.path

    judge = Judge(data / "truth.npz", "base")
    if damage == "flags-on-unwritten-rows":
        build("dc")[0]  # the first batch only
        flags, _, _ = _entry_arrays(entry("dc"))
        flags[:] = True
    elif damage == "other-entrys-data":
        mine, other = (
            build("dc", columns=["t.d0.s0", "t.d0.s1"]),
            build("other", columns=["t.d0.s2", "t.d0.s3"]),
        )
        read_all(mine, case.kind, judge, 0)
        read_all(other, case.kind, judge, 0)
        header = open(entry("dc"), "rb").read(4096)
        shutil.copyfile(entry("other"), entry("dc"))
        with open(entry("dc"), "r+b") as fh:
            fh.write(header)
    else:
        read_all(build("dc"), case.kind, judge, case.workers)
        flags, times, values = _entry_arrays(entry("dc"))
        row = len(times) // 2 + 7
        if damage == "timestamp":
            times[row : row + 1].view(np.uint8)[1] ^= 0x18
        else:  # float64: byte 7 holds the sign and exponent, byte 0 the lowest mantissa bits
            values[row, 1:2].view(np.uint8)[7 if damage == "value-exponent" else 0] ^= 0x40
    kw = {"columns": ["t.d0.s0", "t.d0.s1"]} if damage == "other-entrys-data" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CacheMismatchWarning naming the entry
        return {"rows": read_all(build("dc", **kw), case.kind, judge, case.workers, epochs=2)}


# -- worker faults -----------------------------------------------------------------------------
def _worker_dataset(kind: str, path: str):
    """Small batches (60 per epoch) so a worker is still reading when it is signalled."""
    from tsfile_torch import TsFileIterableDataset

    if kind == "iterable":
        return TsFileIterableDataset(
            path,
            batch_size=500,
            block_rows=5000,
            dtype="float64",
            return_timestamps=True,
            index_cache=False,
        )
    return _dataset(kind, path, batch_size=500)


def _worker_pids(loader) -> list[int]:
    """The pids of the loader's live DataLoader workers."""
    import multiprocessing

    workers = getattr(getattr(loader, "_iterator", None), "_workers", None)
    if workers is None:
        workers = multiprocessing.active_children()
    return [w.pid for w in workers]


def _judge_rows(ds, judge: Judge, batches, label: str) -> int:
    """Judge row batches ``(values, times)`` handed out in any order: every row once, each
    value and timestamp the one written."""
    np = judge.np
    if not batches:
        raise Wrong(f"{label}: no batch")
    times = np.concatenate([t for _, t in batches])
    values = np.concatenate([v for v, _ in batches])
    rows = np.searchsorted(judge.cols[ds.columns[0]][0], times)
    judge.check(ds.columns, rows, times, values)
    if judge.wrong:
        raise Wrong(f"{label}: {judge.wrong} wrong values")
    if not np.array_equal(np.sort(rows), np.arange(ds.num_rows)):
        raise Wrong(f"{label}: {len(rows)} rows handed out, not every row of {ds.num_rows} once")
    return len(rows)


def _epoch(loader, bound: float, label: str) -> list:
    """One whole epoch of row batches (copied), within ``bound`` seconds."""
    start = time.monotonic()
    got = [(v.numpy().copy(), t.numpy().copy()) for v, t in loader]
    took = time.monotonic() - start
    if took > bound:
        raise Slow(f"{label} took {took:.1f} s (bound {bound:.0f} s)")
    return got


def scenario_worker_kill(case: Case, data: Path, work: Path) -> dict:
    """SIGKILL one of 2 workers after batch 2: the epoch must raise WorkerError, the next epoch
    over the same loader (new workers) must hand out every row exactly, each within 30 s."""
    from tsfile_torch import WorkerError, make_loader

    path = _copy(data / "base/part000.tsfile", work)
    ds = _worker_dataset(case.kind, str(path))
    loader = make_loader(ds, num_workers=2, timeout=30)
    judge = Judge(data / "truth.npz", "base")
    start = time.monotonic()
    killed = None
    try:
        for i, _ in enumerate(loader):
            if i == 2:
                killed = _worker_pids(loader)[0]
                os.kill(killed, signal.SIGKILL)
            if time.monotonic() - start > 30:
                raise Slow("the epoch with a killed worker ran past 30 s")
    except WorkerError as err:
        first = f"WorkerError: {str(err).splitlines()[0][:160]}"
        if time.monotonic() - start > 30:
            raise Slow(f"WorkerError after {time.monotonic() - start:.1f} s (bound 30 s)") from err
        if str(killed) not in str(err):
            raise Missed(f"the WorkerError does not name the killed pid {killed}: {err}") from err
    else:
        raise Missed(f"worker pid {killed} SIGKILLed after batch 2: the epoch ended without error")
    again = time.monotonic()
    rows = _judge_rows(ds, judge, _epoch(loader, 30, "the next epoch"), "the next epoch")
    return {
        "rows": rows,
        "detail": f"{first[:120]}; next epoch exact in {time.monotonic() - again:.1f} s",
    }


def scenario_worker_stop(case: Case, data: Path, work: Path) -> dict:
    """SIGSTOP one of 2 workers after batch 1, make_loader(timeout=5): a WorkerError naming
    its pid ("is stopped") within 15 s; then (SIGCONT or not) the next epoch is exact."""
    from tsfile_torch import WorkerError, make_loader

    path = _copy(data / "base/part000.tsfile", work)
    ds = _worker_dataset(case.kind, str(path))
    loader = make_loader(ds, num_workers=2, timeout=5)
    judge = Judge(data / "truth.npz", "base")
    stopped = None
    try:
        it = iter(loader)
        next(it)
        stopped = _worker_pids(loader)[1]
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        try:
            for _ in it:
                if time.monotonic() - start > 15:
                    raise Slow("the epoch with a stopped worker ran past 15 s")
        except WorkerError as err:
            took = time.monotonic() - start
            text = str(err)
            if took > 15:
                raise Slow(f"WorkerError after {took:.1f} s (bound 15 s)") from err
            if f"{stopped})" not in text or "is stopped" not in text:
                raise Missed(
                    f"the WorkerError does not name stopped pid {stopped}: {text}"
                ) from err
            first = f"WorkerError after {took:.1f} s naming pid {stopped} as stopped"
        else:
            raise Missed(f"worker pid {stopped} SIGSTOPped: the epoch ended without error")
        del it
        if case.args["cont"]:  # (the loader may have ended it with the error already)
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
        again = time.monotonic()
        rows = _judge_rows(ds, judge, _epoch(loader, 30, "the next epoch"), "the next epoch")
        took = time.monotonic() - again
    finally:
        if stopped is not None:  # never leave a stopped process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(stopped, signal.SIGCONT)
    return {"rows": rows, "detail": f"{first}; next epoch exact in {took:.1f} s"}


def scenario_worker_keep(case: Case, data: Path, work: Path) -> dict:
    """Window batches from 2 workers, every batch of two epochs kept (list(loader)): each
    window exact and byte-equal to 0 workers' batches; torch.save of one batch works."""
    import io

    import torch

    from tsfile_torch import make_loader

    path = _copy(data / "base/part000.tsfile", work)
    kw = {"return_dict": True} if case.args.get("dict") else {}
    ds = _dataset("windows", str(path), context_length=200, stride=100, options=kw)
    judge = Judge(data / "truth.npz", "base")
    np = judge.np
    per_batch = 32

    def parts(batch):
        return [batch[k] for k in sorted(batch)] if isinstance(batch, dict) else list(batch)

    def windows(batch):  # (first timestamp, parts) of each window: workers reorder batches
        x, times = (
            (batch["past_values"], batch["past_time"]) if isinstance(batch, dict) else batch[:2]
        )
        arrays = [p.numpy() for p in parts(batch)]
        return x.numpy(), times.numpy(), arrays

    reference = {}
    for batch in make_loader(ds, per_batch):
        _, times, arrays = windows(batch)
        for w in range(len(times)):
            reference[int(times[w, 0])] = [a[w].copy() for a in arrays]
    if len(reference) != len(ds):
        raise Wrong(f"0 workers: {len(reference)} distinct windows of {len(ds)}")
    loader = make_loader(ds, batch_size=per_batch, num_workers=2, timeout=60)
    start = time.monotonic()
    epochs = [list(loader), list(loader)]  # the first epoch still held while the second runs
    if time.monotonic() - start > 120:
        raise Slow(f"two epochs took {time.monotonic() - start:.1f} s")
    names = [f"{ds.window_info(0).device}.{f}" for f in ds.fields]  # one device
    series = judge.cols[names[0]][0]
    for e, held in enumerate(epochs):
        seen = set()
        for i, batch in enumerate(held):
            x, times, arrays = windows(batch)
            for w in range(len(x)):
                rows = np.searchsorted(series, times[w])
                if rows[0] % ds.stride or not np.array_equal(rows, rows[0] + np.arange(len(rows))):
                    judge.wrong += x[w].size
                judge.check(names, rows, times[w], x[w])
                first = int(times[w, 0])
                same = reference.get(first)
                if same is None or not all(
                    a[w].dtype == b.dtype and np.array_equal(a[w], b, equal_nan=True)
                    for a, b in zip(arrays, same, strict=True)
                ):
                    raise Wrong(f"epoch {e} batch {i}: window at {first} differs from 0 workers'")
                seen.add(first)
            if judge.wrong:
                raise Wrong(f"epoch {e} batch {i}: {judge.wrong} wrong values")
        if seen != set(reference):
            raise Wrong(f"epoch {e}: {len(seen)} distinct windows of {len(reference)}")
    buffer = io.BytesIO()
    torch.save(epochs[0][3], buffer)
    buffer.seek(0)
    back = torch.load(buffer)
    if not all(torch.equal(a, b) for a, b in zip(parts(back), parts(epochs[0][3]), strict=True)):
        raise Wrong("torch.save / torch.load of a batch changed its values")
    return {
        "rows": judge.rows,
        "detail": f"2 epochs x {len(epochs[0])} batches held, every window exact; "
        "torch.save of a batch works",
    }


def scenario_worker_race(case: Case, data: Path, work: Path) -> dict:
    """Two make_loader(num_workers=2) loaders over one dataset object started at the same
    moment from two threads (3 rounds, a new dataset each): one raises the documented "already
    being iterated" error, the other hands out every row exactly."""
    import threading

    from tsfile_torch import make_loader
    from tsfile_torch.errors import TsFileTorchError

    path = _copy(data / "base/part000.tsfile", work)
    rows = 0
    for round_ in range(3):
        ds = _worker_dataset(case.kind, str(path))
        go = threading.Barrier(2, timeout=60)
        results: dict[int, object] = {}

        def run(k, ds=ds, go=go, results=results):
            loader = make_loader(ds, num_workers=2, timeout=60)
            try:
                go.wait()
                results[k] = [(v.numpy().copy(), t.numpy().copy()) for v, t in loader]
            except Exception as err:  # judged below
                results[k] = err

        threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        if any(t.is_alive() for t in threads):
            raise Slow(f"round {round_}: a loader thread still running after 120 s")
        errors = [r for r in results.values() if isinstance(r, Exception)]
        batches = [r for r in results.values() if not isinstance(r, Exception)]
        documented = [
            e
            for e in errors
            if isinstance(e, TsFileTorchError) and "already being iterated" in str(e)
        ]
        if len(documented) != 1 or len(batches) != 1:
            found = "; ".join(f"{type(e).__name__}: {str(e)[:200]}" for e in errors)
            if any(not isinstance(e, TsFileTorchError) for e in errors):
                raise errors[0]
            raise Missed(f"round {round_}: {len(batches)} loaders ran, errors: {found or 'none'}")
        judge = Judge(data / "truth.npz", "base")
        rows += _judge_rows(ds, judge, batches[0], f"round {round_}")
    return {"rows": rows, "detail": "3 rounds: one 'already being iterated' error, one exact"}


def _tight_memory(worker_id: int) -> None:
    """A worker's address space: what it has now and 4 MiB (``ulimit -v`` in the worker)."""
    import resource

    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[0])
    limit = pages * os.sysconf("SC_PAGE_SIZE") + (4 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


_SHM_CHILD = """
import os, sys
from tsfile_torch import ResourceError, TsFileDataset, make_loader
ds = TsFileDataset(sys.argv[1], batch_size=30000, block_rows=30000)  # about 1 MiB a batch
try:
    for batch in make_loader(ds, num_workers=1, timeout=60):
        pass
    print("READ")
except ResourceError as err:
    print("ERROR", str(err).strip().splitlines()[-1])
print("LEFT", len(os.listdir("/dev/shm")))
"""


def scenario_exhaustion(case: Case, data: Path, work: Path) -> dict:
    """Memory or /dev/shm run out (issue 42). ``memory``: a worker under a 4 MiB address-space
    margin must end in an error naming memory (a ResourceError, or a WorkerError under the
    tree's ``ulimit -v``), after which a build with ``on_damaged="skip"`` keeps the file and
    reads it exactly (nothing was remembered as damage). ``shm``: a private 512 KiB tmpfs on
    /dev/shm (``unshare -m``, root only): a ResourceError naming /dev/shm, nothing left there."""
    import resource

    from tsfile_torch import TsFileTorchError, make_loader

    path = str(_copy(data / "base/part000.tsfile", work))
    if case.args["what"] == "shm":
        mount = "mount -t tmpfs -o size=512k tmpfs /dev/shm"
        command = f"{mount} && {sys.executable} -c '{_SHM_CHILD}' {path}"
        done = subprocess.run(
            ["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=120
        )
        lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
        if done.returncode or "ERROR" not in lines:
            raise Missed(f"status {done.returncode}: {done.stdout[-300:]} {done.stderr[-300:]}")
        if lines.get("LEFT") != "0":
            raise Wrong(f"{lines.get('LEFT')} names left in /dev/shm")
        raise TsFileTorchError(lines["ERROR"])
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm + (4 << 30), vm + (4 << 30)))
    loader = make_loader(
        _dataset(case.kind, path), num_workers=1, timeout=60, worker_init_fn=_tight_memory
    )
    try:
        for _ in loader:
            pass
    except TsFileTorchError as err:
        if "out of memory" not in str(err):
            raise Missed(f"an error that does not name memory: {str(err)[-300:]}") from err
    else:
        raise Missed("the worker read everything within 4 MiB")
    del loader
    judge = Judge(data / "truth.npz", "base")
    ds = _dataset(case.kind, path, on_damaged="skip")
    if ds.skipped:
        raise Wrong(f"memory run out was remembered as damage: {ds.skipped}")
    return {"rows": read_all(ds, case.kind, judge, 0), "detail": "memory named, not remembered"}


SCENARIOS = {
    name[len("scenario_") :]: fn  # noqa: E203
    for name, fn in dict(globals()).items()
    if name.startswith("scenario_")
}


# -- one case in its own process --------------------------------------------------------------
def _names_of(case: Case) -> list[str]:
    """What a clear error must name: the file (or URL / directory), or the argument."""
    if case.scenario == "argument":
        arg = case.args["arg"]
        return {"getitems": ["__getitems__"], "numpy": ["should be"]}.get(arg, [arg])
    if case.scenario == "readonly_cache":
        return ["cache_dir"]
    if case.scenario == "remote_manifest":
        return ["faults-manifest/part000.tsfile: content differs from the manifest"]
    if case.scenario == "skip":
        return ["part0"]
    if case.scenario == "exhaustion":
        return ["/dev/shm has"]
    return [".tsfile"]


def run_case(case: Case, data: Path, work: Path, phase: int) -> dict:
    """Run ``case`` here and return its outcome (never raises)."""
    from tsfile_torch.errors import TsFileTorchError

    scenario = SCENARIOS[case.scenario + ("_phase2" if phase == 2 else "")]
    try:
        got = scenario(case, data, work)
        return {"result": "exact", **got}
    except Wrong as err:
        return {"result": "wrong", "detail": str(err)}
    except Slow as err:
        return {"result": "hang", "detail": str(err)}
    except Missed as err:
        return {"result": "raw", "detail": f"Missed: {err}"}
    except (TsFileTorchError, ValueError, TypeError) as err:
        text = str(err).strip()
        if "Original Traceback" in text:  # raised in a DataLoader worker: its last line
            text = text.splitlines()[-1].split(": ", 1)[-1]
        message = f"{type(err).__name__}: {text}"
        ours = isinstance(err, TsFileTorchError) or (
            case.scenario == "argument"
            and type(err).__module__ == "builtins"
            and "tsfile" not in message.split(":")[0]
        )
        named = any(n in str(err) for n in _names_of(case))
        result = "clear" if ours and named else "raw"
        return {"result": result, "detail": message[:600]}
    except Exception as err:
        text = " | ".join(str(err).strip().splitlines()[-2:])
        return {
            "result": "raw",
            "detail": f"{type(err).__module__}.{type(err).__name__}: {text[:500]}",
        }


def _last_json(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)
    return None


def _case_command(case: Case, data: Path, work: Path, *more: str) -> list[str]:
    """The command line that runs ``case`` in a process of its own."""
    return [sys.executable, __file__, "--run-case", case.name, "--data", str(data)] + [
        "--work",
        str(work),
        *more,
    ]


def launch(case: Case, data: Path, work: Path, timeout: float) -> dict:
    """Run ``case`` in a subprocess; a signal is ``crash``, the timeout ``hang``."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {
        **os.environ,
        "XDG_CACHE_HOME": str(work / "cache-home"),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    start = time.perf_counter()
    proc = subprocess.Popen(
        _case_command(case, data, work),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_drop_root_override if case.scenario == "readonly_cache" else None,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # the whole session: a case's DataLoader workers (stopped ones too) go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {
            "result": "hang",
            "detail": f"no result within {timeout:.0f} s",
            "seconds": round(time.perf_counter() - start, 1),
        }
    seconds = round(time.perf_counter() - start, 1)
    got = _last_json(stdout)
    if got is None or proc.returncode != 0:
        tail = stderr.strip().splitlines()[-3:]
        return {
            "result": "crash",
            "detail": f"exit status {proc.returncode}: {' | '.join(tail)[:600]}",
            "seconds": seconds,
        }
    return {**got, "seconds": seconds}


def passes(case: Case, result: str) -> bool:
    allowed = {"exact": {"exact"}, "clear": {"clear"}, "either": {"exact", "clear"}}
    return result in allowed[case.expect]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="directory for data, work files and results")
    parser.add_argument("--only", default=None, help="run the cases whose name contains this")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per case (a hang)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--phase", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cases = {c.name: c for c in corpus()}

    if args.run_case:  # inside a case's process
        outcome = run_case(cases[args.run_case], args.data, args.work, args.phase)
        print(json.dumps(outcome), flush=True)
        return 0
    if args.list:
        print("\n".join(cases))
        return 0
    if args.out is None:
        parser.error("--out DIR is required")
    from tqdm import tqdm

    selected = [c for c in cases.values() if not args.only or args.only in c.name]
    data = args.out / "data"
    write_data(data)
    records = []
    for case in tqdm(selected, desc="fault cases", unit="case"):
        got = launch(case, data, args.out / "work" / case.name.replace("/", "_"), args.timeout)
        records.append({**asdict(case), **got, "pass": passes(case, got["result"])})

    width = max(len(r["name"]) for r in records)
    print(f"\n{'case':<{width}}  expect  result  pass  detail")
    for r in records:
        note = f" [{r['note']}]" if r["note"] and not r["pass"] else ""
        print(
            f"{r['name']:<{width}}  {r['expect']:<6}  {r['result']:<6}  "
            f"{'yes' if r['pass'] else 'NO':<4}  {str(r.get('detail', ''))[:110]}{note}"
        )
    ok = sum(r["pass"] for r in records)
    limited = sum(1 for r in records if not r["pass"] and r["note"] == "needs manifest")
    print(
        f"\n{ok} of {len(records)} cases end as they must"
        + (f"; {limited} of the others need a manifest (no statistic sees them)" if limited else "")
    )
    counts: dict[str, int] = {}
    for r in records:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    env = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with contextlib.suppress(ImportError):
        from importlib.metadata import version

        env["tsfile"] = version("tsfile")
    out = args.out / "faults.json"
    out.write_text(json.dumps({"environment": env, "passed": ok, "cases": records}, indent=1))
    print(f"written {out}")
    return 0 if ok == len(records) else 1


if __name__ == "__main__":
    sys.exit(main())
