"""Later epochs of every batch order through 0 and N make_loader workers, side by side.

Reference workload (8 TsFiles x 8 DOUBLE x 131,072 rows, 8,192 x 64 batches): the copy
``tsfile-torch bench`` uses (written on first use), ``--data``, or a larger one written with
``--rows`` (8 files x 8 DOUBLE x that many rows). For each cache (``none``, ``memory``,
``disk``) and order (``sequential``, ``shuffle``, ``random`` with 32 windows), a loader runs 2
warm-up epochs then ``--epochs`` timed ones (each a new epoch: a new shuffle, new random
windows); one process per configuration, configurations in alternating order over
``--rounds``. Reported: the median later epoch per configuration, rows/s and N workers / 0
workers. Every batch is summed, so the values are touched as a training step would.

    python benchmarks/orders_workers.py [--rounds 3] [--epochs 5] [--out results.jsonl]
                                        [--torch-threads 1] [--workers 0 2]
                                        [--caches none memory disk] [--orders sequential ...]
                                        [--rows 1048576] [--plot scaling.png]

``--torch-threads 1`` gives the consumer one intra-op thread, as ``docs/performance.md``
advises beside DataLoader workers on a small machine. ``--workers 0 1 2 4 8 --caches none
--orders sequential shuffle --rows 1048576 --plot scaling.png`` measures how streaming scales
with workers on a machine with more cores (``benchmarks/RESULTS.md``, "Decode threads per process").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from tqdm import tqdm

from tsfile_torch import synthetic
from tsfile_torch.bench.reference import reference_data

CACHES = ("none", "memory", "disk")
ORDERS = ("sequential", "shuffle", "random")

CHILD = r"""
import json, sys, time, statistics
from tsfile_torch import TsFileIterableDataset, make_loader
data, cache, order, workers, epochs, cache_dir, threads = sys.argv[1:8]
if int(threads):
    import torch
    torch.set_num_threads(int(threads))  # the consumer's (main process's) intra-op threads
extra = {"random_batches": 32} if order == "random" else {}
ds = TsFileIterableDataset(data, batch_size=8192, order=order, cache=cache, seed=0,
                           cache_dir=cache_dir, **extra)
loader = make_loader(ds, num_workers=int(workers))
times = []
for epoch in range(2 + int(epochs)):
    t = time.perf_counter()
    total = 0.0
    for batch in loader:
        total += float(batch.sum())
    times.append(time.perf_counter() - t)
print(json.dumps({"cache": cache, "order": order, "workers": int(workers),
                  "later": statistics.median(times[2:]), "first": times[0],
                  "rows": ds.num_rows}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="the reference dataset (default: tsfile-torch bench's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", default=None, help="also write the records here (JSON lines)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch.set_num_threads in the main process (the consumer's sums), 0: torch's "
        "default (one per core; their OpenMP threads spin after each op, taking the cores "
        "the workers decode on)",
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--caches", nargs="+", default=list(CACHES), choices=CACHES)
    parser.add_argument("--orders", nargs="+", default=list(ORDERS), choices=ORDERS)
    parser.add_argument(
        "--rows", type=int, default=0, help="write 8 files x 8 DOUBLE x this many rows (0: --data)"
    )
    parser.add_argument("--plot", default=None, help="plot rows/s against workers to this PNG")
    args = parser.parse_args()
    if 0 not in args.workers:
        parser.error("--workers must include 0: every figure is a ratio to 0 workers")
    with tempfile.TemporaryDirectory(prefix="tt-orders-") as tmp:
        if args.rows:
            args.data = os.path.join(tmp, "data")
            synthetic.write_reference(args.data, synthetic.DatasetSpec(num_rows=args.rows))
        args.data = args.data or reference_data()  # written on first use
        records = _measure(args, os.path.join(tmp, "cache"))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    print(
        f"cpus {os.cpu_count()}, data {args.data if not args.rows else f'8 x {args.rows:,} rows'}"
    )
    print(f"{'cache':<7} {'order':<11} {'workers':>7} {'epoch s':>9} {'Mrows/s':>8} {'N / 0':>6}")
    medians = {}
    for cache in args.caches:
        for order in args.orders:
            for w in args.workers:
                mine = [
                    r
                    for r in records
                    if (r["cache"], r["order"], r["workers"]) == (cache, order, w)
                ]
                epoch = medians[cache, order, w] = statistics.median(r["later"] for r in mine)
                rate = mine[0]["rows"] / epoch / 1e6
                ratio = epoch / medians[cache, order, 0]
                print(f"{cache:<7} {order:<11} {w:>7} {epoch:>9.4f} {rate:>8.1f} {ratio:>6.2f}")
    if args.plot:
        _plot(args, medians, args.plot)
    return 0


def _measure(args, cache_dir: str) -> list[dict]:
    configs = [(c, o, w) for c in args.caches for o in args.orders for w in args.workers]
    runs = [cfg for r in range(args.rounds) for cfg in (configs if r % 2 == 0 else configs[::-1])]
    records = []
    for cache, order, workers in tqdm(runs, desc="orders x workers"):
        argv = [args.data, cache, order, str(workers), str(args.epochs), cache_dir]
        argv.append(str(args.torch_threads))
        done = subprocess.run(
            [sys.executable, "-c", CHILD, *argv], check=True, capture_output=True, text=True
        )
        records.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return records


def _plot(args, medians: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for cache in args.caches:
        for order in args.orders:
            speedup = [medians[cache, order, 0] / medians[cache, order, w] for w in args.workers]
            ax.plot(args.workers, speedup, marker="o", label=f"{order}, cache={cache}")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("DataLoader workers")
    ax.set_ylabel("epoch speed-up over 0 workers")
    ax.set_title(f"make_loader later epochs, {os.cpu_count()} CPUs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
