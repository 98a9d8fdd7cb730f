"""Later epochs of every batch order through 0 and 2 make_loader workers, side by side.

Reference workload (8 TsFiles x 8 DOUBLE x 131,072 rows, 8,192 x 64 batches): the copy
``tsfile-torch bench`` uses (written on first use), or ``--data``. For each cache (``none``,
``memory``, ``disk``) and order (``sequential``, ``shuffle``, ``random`` with 32 windows), a
loader runs 2 warm-up epochs then ``--epochs`` timed ones (each a new epoch: a new shuffle, new
random windows); one process per configuration, configurations in alternating order over
``--rounds``. Reported: the median
later epoch per configuration and 2 workers / 0 workers. Every batch is summed, so the values
are touched as a training step would.

    python benchmarks/orders_workers.py [--rounds 3] [--epochs 5] [--out results.jsonl]
                                        [--torch-threads 1]

``--torch-threads 1`` gives the consumer one intra-op thread, as ``docs/performance.md``
advises beside DataLoader workers on a small machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile

from tqdm import tqdm

from tsfile_torch.bench.reference import reference_data

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
                  "later": statistics.median(times[2:]), "first": times[0]}))
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
    args = parser.parse_args()
    args.data = args.data or reference_data()  # written on first use
    configs = [
        (c, o, w)
        for c in ("none", "memory", "disk")
        for o in ("sequential", "shuffle", "random")
        for w in (0, 2)
    ]
    records = []
    with tempfile.TemporaryDirectory(prefix="tt-orders-cache-") as cache_dir:
        runs = [
            cfg for r in range(args.rounds) for cfg in (configs if r % 2 == 0 else configs[::-1])
        ]
        for cache, order, workers in tqdm(runs, desc="orders x workers"):
            argv = [args.data, cache, order, str(workers), str(args.epochs), cache_dir]
            argv.append(str(args.torch_threads))
            done = subprocess.run(
                [sys.executable, "-c", CHILD, *argv], check=True, capture_output=True, text=True
            )
            records.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in records)
    print(f"{'cache':<7} {'order':<11} {'0 workers s':>11} {'2 workers s':>11} {'2 / 0':>6}")
    for cache in ("none", "memory", "disk"):
        for order in ("sequential", "shuffle", "random"):
            med = {
                w: statistics.median(
                    r["later"]
                    for r in records
                    if (r["cache"], r["order"], r["workers"]) == (cache, order, w)
                )
                for w in (0, 2)
            }
            print(f"{cache:<7} {order:<11} {med[0]:>11.4f} {med[2]:>11.4f} {med[2] / med[0]:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
