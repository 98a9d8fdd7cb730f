"""Read-backend study: why mmap wins or loses, by page-cache state.

Single-threaded 64 KiB sequential scans of the files, through ``os.pread`` and through a Python
``mmap`` copy (``bytes(m[a:b])``), in three states:
- cold: the files evicted from the page cache first (``posix_fadvise(DONTNEED)``), fresh mapping;
- warm, fresh mapping: files in the page cache, a new mapping (first-touch page faults);
- warm, pre-touched: the same mapping scanned once before (its page tables already filled).
Also the madvise hints Python offers (``MADV_SEQUENTIAL``, ``MADV_WILLNEED``, ``MAP_POPULATE``)
on a warm fresh mapping. Reports GiB/s (min and median over repeats), minor / major faults per
scan, and the ratio mmap / pread in each state. Upstream (Windows): fresh 0.43x, pre-touched 2.99x.

    python benchmarks/read_backend.py                       # the reference dataset
    python benchmarks/read_backend.py --data DIR --json out.jsonl --quick
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import statistics
import sys
import time

from tqdm import tqdm

from tsfile_torch.bench.reference import evict_from_page_cache as evict

CHUNK = 64 * 1024


def _faults() -> tuple[int, int]:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_minflt, u.ru_majflt


def scan_pread(paths: list[str]) -> int:
    total = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            size, off = os.fstat(fd).st_size, 0
            while off < size:
                total += len(os.pread(fd, CHUNK, off))
                off += CHUNK
        finally:
            os.close(fd)
    return total


def open_maps(paths: list[str], flags: int = 0, advice: int | None = None) -> list:
    maps = []
    for p in paths:
        with open(p, "rb") as fh:
            m = mmap.mmap(fh.fileno(), 0, flags=mmap.MAP_SHARED | flags, prot=mmap.PROT_READ)
        if advice is not None:
            m.madvise(advice)
        maps.append(m)
    return maps


def scan_maps(maps: list) -> int:
    total = 0
    for m in maps:
        size = len(m)
        for off in range(0, size, CHUNK):
            total += len(m[off : off + CHUNK])
    return total


def measure(fn) -> tuple[float, int, int, int]:
    f0 = _faults()
    t0 = time.perf_counter()
    nbytes = fn()
    seconds = time.perf_counter() - t0
    f1 = _faults()
    return seconds, nbytes, f1[0] - f0[0], f1[1] - f0[1]


def run(paths: list[str], repeats: int, progress: bool = True) -> list[dict]:
    """Return one record per (state, method, repeat)."""
    can_evict = hasattr(os, "posix_fadvise")
    cases = []

    def warm():
        scan_pread(paths)

    def cold_pread():
        evict(paths)
        return measure(lambda: scan_pread(paths))

    def cold_mmap():
        evict(paths)
        maps = open_maps(paths)
        try:
            return measure(lambda: scan_maps(maps))
        finally:
            for m in maps:
                m.close()

    def fresh(flags=0, advice=None):
        def go():
            warm()
            maps = open_maps(paths, flags, advice) if not flags else None
            if flags:  # MAP_POPULATE pre-faults at map time: count that time in the scan
                f0, t0 = _faults(), time.perf_counter()
                maps = open_maps(paths, flags, advice)
                s, n, mi, ma = measure(lambda: scan_maps(maps))
                f1 = _faults()
                result = (time.perf_counter() - t0, n, f1[0] - f0[0], f1[1] - f0[1])
            else:
                result = measure(lambda: scan_maps(maps))
            for m in maps:
                m.close()
            return result

        return go

    def warm_pread():
        warm()
        return measure(lambda: scan_pread(paths))

    def pretouched():
        warm()
        maps = open_maps(paths)
        scan_maps(maps)
        try:
            return measure(lambda: scan_maps(maps))
        finally:
            for m in maps:
                m.close()

    if can_evict:
        cases += [("cold", "pread", cold_pread), ("cold", "mmap", cold_mmap)]
    cases += [
        ("warm, fresh mapping", "pread", warm_pread),
        ("warm, fresh mapping", "mmap", fresh()),
        ("warm, pre-touched mapping", "pread", warm_pread),
        ("warm, pre-touched mapping", "mmap", pretouched),
    ]
    hints = [
        ("MADV_SEQUENTIAL", 0, getattr(mmap, "MADV_SEQUENTIAL", None)),
        ("MADV_WILLNEED", 0, getattr(mmap, "MADV_WILLNEED", None)),
        ("MAP_POPULATE", getattr(mmap, "MAP_POPULATE", 0), None),
    ]
    for name, flags, advice in hints:
        if flags or advice is not None:
            cases.append((f"warm, fresh mapping + {name}", "mmap", fresh(flags, advice)))
    records = []
    with tqdm(total=len(cases) * repeats, desc="read-backend scans", disable=not progress) as bar:
        for rep in range(repeats):
            order = cases if rep % 2 == 0 else cases[::-1]
            for state, method, fn in order:
                seconds, nbytes, minflt, majflt = fn()
                records.append(
                    {
                        "state": state,
                        "method": method,
                        "repeat": rep,
                        "seconds": seconds,
                        "bytes": nbytes,
                        "minflt": minflt,
                        "majflt": majflt,
                        "gib_per_s": nbytes / seconds / (1 << 30),
                        "cold_eviction": can_evict,
                    }
                )
                bar.update()
    return records


def summarize(records: list[dict]) -> list[dict]:
    rows = []
    for key in dict.fromkeys((r["state"], r["method"]) for r in records):
        recs = [r for r in records if (r["state"], r["method"]) == key]
        rows.append(
            {
                "state": key[0],
                "method": key[1],
                "gib_min": min(r["gib_per_s"] for r in recs),
                "gib_median": statistics.median(r["gib_per_s"] for r in recs),
                "minflt": statistics.median(r["minflt"] for r in recs),
                "majflt": statistics.median(r["majflt"] for r in recs),
            }
        )
    pread = {r["state"]: r["gib_median"] for r in rows if r["method"] == "pread"}
    for r in rows:
        base = pread.get(r["state"], pread.get("warm, fresh mapping"))
        r["ratio_vs_pread"] = r["gib_median"] / base if base else None
    return rows


def format_table(rows: list[dict]) -> str:
    head = (
        f"{'state':<40} {'method':<6} {'GiB/s min':>9} {'median':>8} {'minflt':>8} "
        f"{'majflt':>7} {'mmap/pread':>10}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['ratio_vs_pread']:.2f}x" if r["method"] == "mmap" else ""
        lines.append(
            f"{r['state']:<40} {r['method']:<6} {r['gib_min']:9.2f} "
            f"{r['gib_median']:8.2f} {r['minflt']:8.0f} {r['majflt']:7.0f} {ratio:>10}"
        )
    lines.append(
        "(hint rows compare with warm pread; upstream on Windows: fresh mapping 0.43x, "
        "pre-touched 2.99x)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="directory or files (default: the reference dataset)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 repeats")
    parser.add_argument("--json", help="write one JSON record per scan")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    from tsfile_torch.bench.harness import finish
    from tsfile_torch.bench.reference import reference_data
    from tsfile_torch.sources import expand_sources

    paths = [s.name for s in expand_sources(args.data or reference_data())]
    if not hasattr(os, "posix_fadvise"):
        print("posix_fadvise is not available: the cold state is skipped", file=sys.stderr)
    records = run(paths, 2 if args.quick else args.repeats, progress=not args.no_progress)
    total = sum(os.path.getsize(p) for p in paths)
    print(f"{len(paths)} files, {total / (1 << 20):.1f} MiB, {CHUNK // 1024} KiB reads")
    return finish(format_table(summarize(records)), records, args.json)


if __name__ == "__main__":
    sys.exit(main())
