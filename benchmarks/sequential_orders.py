"""order="sequential" (row order with workers) against order="stretches" (a stretch per worker).

Run from a checkout: ``python benchmarks/sequential_orders.py [--data DIR] [--workers 2]``.
Writes 4 files x 1 device x 8 fields x 524,288 rows to a temporary directory unless ``--data``
is given; each loader is warmed up by one epoch, then the orders take turns for ``--repeats``
epochs; prints min and median seconds per epoch and rows/s, and a checksum of the values so a
fast wrong path cannot win (both orders hand out the same rows). ``--json`` writes one record
per cell with the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader, synthetic

SPEC = synthetic.DatasetSpec(num_files=4, devices_per_file=1, fields_per_device=8, num_rows=524288)
ORDERS = ("sequential", "stretches")
KINDS = {"iterable": TsFileIterableDataset, "map": TsFileDataset}


def _epoch(loader) -> tuple[float, int, float]:
    start, rows, checksum = time.perf_counter(), 0, 0.0
    for batch in loader:
        rows += batch.shape[0]
        checksum += float(batch.sum(dtype=torch.float64))
    return time.perf_counter() - start, rows, checksum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="a directory of TsFiles (default: written to a temp dir)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--json", help="write one JSON record per cell to this file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or tmp
        if not args.data:
            synthetic.write_table_files(data, SPEC)
        records = []
        for kind, make in KINDS.items():
            loaders = {
                order: make_loader(
                    make(data, batch_size=args.batch_size, order=order), num_workers=args.workers
                )
                for order in ORDERS
            }
            times: dict[str, list[float]] = {order: [] for order in ORDERS}
            sums = {order: _epoch(loader)[1:] for order, loader in loaders.items()}  # warm-up
            for _ in range(args.repeats):
                for order, loader in loaders.items():
                    times[order].append(_epoch(loader)[0])
            for order in ORDERS:
                rows, checksum = sums[order]
                best, median = min(times[order]), statistics.median(times[order])
                records.append(
                    {"kind": kind, "order": order, "workers": args.workers, "min_s": best,
                     "median_s": median, "rows_per_s": rows / median, "checksum": checksum}
                )  # fmt: skip
                print(
                    f"{kind:8} {order:10} min {best:.3f} s  median {median:.3f} s  "
                    f"{rows / median:,.0f} rows/s  checksum {checksum:.6e}"
                )
            del loaders
    if args.json:
        env = {"cpus": os.cpu_count(), "python": platform.python_version()}
        env["torch"] = torch.__version__
        with open(args.json, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps({**record, "environment": env}) + "\n")


if __name__ == "__main__":
    main()
