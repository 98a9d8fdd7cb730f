"""Merged shards (issue #48): the same rows as 3 interleaved files beside 3 consecutive files.

One device, ``--fields`` DOUBLE fields, ``--rows`` rows a minute apart, written twice into a
temporary directory: ``consecutive/`` (each file a third of the time range: today's positional
path) and ``interleaved/`` (row ``i`` in file ``i % 3``: every file spans the whole range, so the
series is merged by timestamp, Note: merged shards in ``tsfile_torch.read.merge``). Per layout,
measured in one run, alternating: the dataset's build (metadata, and for the merge the shards'
timestamps read and merged; no validation child, no index cache on disk), build + first epoch
(where the positional path learns its timeline index; the merged series takes its indexes from
the timestamps its build read: Note: seeded indexes), a later sequential streaming epoch of
``--batch-size``-row batches in the main process, and the merged timeline's memory per row.
Reports min and median of ``--repeats`` and the ratios interleaved / consecutive; a checksum of
the values read must agree between the layouts.

    python benchmarks/merged_shards.py                      # 600,000 rows x 8 fields
    python benchmarks/merged_shards.py --rows 3000000 --json out.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

from tsfile_torch import TsFileIterableDataset, synthetic

M = 60_000


def write(directory: str, rows: int, fields: int) -> None:
    """Write the two layouts of the same rows under ``directory``."""
    times = np.arange(rows, dtype=np.int64) * M
    values = np.stack([synthetic.value_of(0, j, np.arange(rows)) for j in range(fields)], axis=1)
    names = [f"s{j}" for j in range(fields)]
    for layout, parts in (
        ("consecutive", [np.arange(k * rows // 3, (k + 1) * rows // 3) for k in range(3)]),
        ("interleaved", [np.arange(k, rows, 3) for k in range(3)]),
    ):
        os.makedirs(os.path.join(directory, layout))
        for k, rows_k in enumerate(parts):
            synthetic.write_table_devices(
                os.path.join(directory, layout, f"part{k}.tsfile"),
                "t",
                names,
                {"d0": (times[rows_k], values[rows_k])},
            )


def build(path: str, batch_size: int) -> tuple[TsFileIterableDataset, float]:
    t0 = time.perf_counter()
    ds = TsFileIterableDataset(
        path, batch_size=batch_size, validate=False, index_cache=False, check_statistics=False
    )
    return ds, time.perf_counter() - t0


def epoch(ds: TsFileIterableDataset) -> tuple[float, float]:
    """Return (seconds, checksum) of one sequential epoch: position-weighted, so a row out of
    place changes it."""
    t0 = time.perf_counter()
    total, row = 0.0, 0
    for batch in ds:
        n = batch.shape[0]
        total += float(batch.numpy().sum(axis=1, dtype=np.float64) @ np.arange(row, row + n))
        row += n
    return time.perf_counter() - t0, total


def merged_bytes(ds: TsFileIterableDataset) -> int:
    """Bytes the merged timeline keeps beyond the positional path (merge runs + timestamps)."""
    table = ds.core.tables[0]
    if table.alignment is None:
        return 0
    kept = {id(table.alignment.times): table.alignment.times.nbytes}
    for t in table.alignment.timelines:
        kept[id(t.times)] = t.times.nbytes
        if t.merge is not None:
            kept[id(t.merge)] = t.merge.nbytes
    return sum(kept.values())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=600_000)
    parser.add_argument("--fields", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="append one JSON record per layout to this file")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory(prefix="merged-shards-") as directory:
        write(directory, args.rows, args.fields)
        layouts = ("consecutive", "interleaved")
        datasets = {}
        for r in range(args.repeats + 1):  # the first round warms the page cache: not counted
            for layout in layouts:
                ds, built = build(os.path.join(directory, layout), args.batch_size)
                first, _ = epoch(ds)  # the first epoch: the timeline index is learned
                seconds, checksum = epoch(ds)
                if r:
                    got = results.setdefault(
                        layout, {"build": [], "start": [], "epoch": [], "sum": []}
                    )
                    got["build"].append(built)
                    got["start"].append(built + first)
                    got["epoch"].append(seconds)
                    got["sum"].append(checksum)
                datasets[layout] = ds
        sums = {layout: results[layout]["sum"][0] for layout in layouts}
        if not np.isclose(sums["consecutive"], sums["interleaved"], rtol=1e-12):
            print(f"MISMATCH: checksums {sums}", file=sys.stderr)
            return 1
        extra = merged_bytes(datasets["interleaved"])
    base = results["consecutive"]
    print(
        f"{args.rows:,} rows x {args.fields} DOUBLE fields, 3 files, batches of "
        f"{args.batch_size:,}, {args.repeats} repeats ({platform.machine()}, "
        f"{os.cpu_count()} CPUs)"
    )
    records = []
    for layout in layouts:
        got = results[layout]
        row = {
            "layout": layout,
            "rows": args.rows,
            "fields": args.fields,
            "build_min_s": min(got["build"]),
            "build_median_s": statistics.median(got["build"]),
            "epoch_min_s": min(got["epoch"]),
            "epoch_median_s": statistics.median(got["epoch"]),
            "rows_per_s": args.rows / min(got["epoch"]),
            "epoch_ratio": statistics.median(got["epoch"]) / statistics.median(base["epoch"]),
            "build_ratio": statistics.median(got["build"]) / statistics.median(base["build"]),
            "build_first_epoch_median_s": statistics.median(got["start"]),
            "build_first_epoch_ratio": statistics.median(got["start"])
            / statistics.median(base["start"]),
            "merged_bytes_per_row": (extra / args.rows) if layout == "interleaved" else 0.0,
            "python": platform.python_version(),
        }
        records.append(row)
        print(
            f"  {layout:<12} build {row['build_min_s']:.3f} / {row['build_median_s']:.3f} s "
            f"(min / median, {row['build_ratio']:.2f}x), build + first epoch "
            f"{row['build_first_epoch_median_s']:.3f} s ({row['build_first_epoch_ratio']:.2f}x), "
            f"later epoch {row['epoch_min_s']:.3f} / "
            f"{row['epoch_median_s']:.3f} s ({row['epoch_ratio']:.2f}x, "
            f"{row['rows_per_s'] / 1e6:.1f} M rows/s), merged timeline "
            f"{row['merged_bytes_per_row']:.1f} bytes per row"
        )
    if args.json:
        with open(args.json, "a") as f:
            for row in records:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
