"""Start-up benchmark: build, first batch and overlap with a training step.

    python benchmarks/startup.py [--quick] [--rounds 3] [--workers 0 2] [--json OUT]

Each round runs in a new interpreter (nothing warm but the page cache: the files are read once
before) over the reference dataset, for 0 and 2 workers and the ``auto`` and ``pread`` backends
(read-ahead decodes mapped files through pread readers of their own), streaming
(``cache="none"``):

- **build**: ``TsFileIterableDataset(...)`` and ``make_loader(...)``;
- **first batch**: from ``iter(loader)`` to the first batch; **first epoch**: to its end;
- **later epochs**: the median of 3 later epochs, and a steady-state batch (a later epoch's
  time over its batches);
- **with a step**: later epochs whose consumer spends about 20 ms per batch in torch matrix
  products on one thread (a training step: torch releases the GIL in its kernels, as a model
  does), against ``max(later epoch, batches x step)``: 1.0 means decoding fully overlapped the
  steps; and the first batch of such an epoch (the median of the 2nd-4th: each follows an
  epoch of steps, as in training) over a steady-state batch.

Reported as ratios (issue #26's targets): first batch / steady batch, (build + first epoch) /
later epoch, epoch with steps / max(epoch, steps), medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

__all__ = ["format_startup", "main", "run_startup", "training_step"]

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from tsfile_torch import TsFileIterableDataset, make_loader
imported = time.perf_counter()
data, workers, step, backend = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
sys.path.insert(0, sys.argv[5])  # this file's directory: training_step

import torch

from startup import training_step as spin

torch.set_num_threads(1)

def main():
    t = time.perf_counter()
    ds = TsFileIterableDataset(data, batch_size=8192, read_backend=backend)
    loader = make_loader(ds, num_workers=workers)
    build = time.perf_counter() - t
    t = time.perf_counter()
    first = None
    batches = 0
    for _ in loader:
        batches += 1
        if first is None:
            first = time.perf_counter() - t
    first_epoch = time.perf_counter() - t

    def epoch(work, firsts):
        t = time.perf_counter()
        for i, _ in enumerate(loader):
            if i == 0:
                firsts.append(time.perf_counter() - t)
            if work:
                spin(work)
        return time.perf_counter() - t

    later = sorted(epoch(0, []) for _ in range(3))[1]
    firsts = []
    stepped = sorted(epoch(step, firsts) for _ in range(4))[1:][1]  # the first follows no steps
    print(json.dumps({"workers": workers, "backend": backend, "build": build, "first_batch": first,
                      "first_epoch": first_epoch, "later": later, "batches": batches,
                      "stepped": stepped, "stepped_first": sorted(firsts[1:])[1], "step": step,
                      "import": imported - t0}))

if __name__ == "__main__":
    main()
"""


_HERE = os.path.dirname(os.path.abspath(__file__))
_STEP: dict = {}  # the step's matrix and, per duration, its number of products


def training_step(seconds: float) -> None:
    """Spend about ``seconds`` in torch matrix products (a training step: torch kernels release
    the GIL, as a model's do); the number of products is calibrated on first use."""
    import torch

    a = _STEP.setdefault("matrix", torch.randn(192, 192))

    def products(n: int) -> None:
        for _ in range(n):
            torch.mm(a, a)

    if seconds not in _STEP:
        n, took = 8, 0.0
        while took < 0.05:
            n *= 2
            t0 = time.perf_counter()
            products(n)
            took = time.perf_counter() - t0
        _STEP[seconds] = max(1, round(n * seconds / took))
    products(_STEP[seconds])


def run_startup(
    data: str,
    workers=(0, 2),
    rounds: int = 3,
    step_ms: float = 20.0,
    progress: bool = True,
    backends=("auto", "pread"),
) -> list[dict]:
    """Run the startup benchmark (see the module notes); return one record per run."""
    import glob
    import os

    from tqdm import tqdm

    from tsfile_torch.bench.reference import warm_page_cache

    files = sorted(glob.glob(os.path.join(data, "*.tsfile")))
    runs = [(r, w, b) for r in range(rounds) for w in workers for b in backends]
    records = []
    for r, w, b in tqdm(runs, desc="startup", disable=not progress):
        warm_page_cache(files)
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, data, str(w), str(step_ms / 1000), b, _HERE],
            check=True,
            capture_output=True,
            text=True,
        )
        record = json.loads(out.stdout.strip().splitlines()[-1])
        record["round"] = r
        records.append(record)
    return records


def summarize_startup(records: list[dict]) -> list[dict]:
    """Per number of workers: the medians of the ratios the targets are stated in."""
    out = []
    for b, w in sorted({(r["backend"], r["workers"]) for r in records}):
        runs = [r for r in records if r["workers"] == w and r["backend"] == b]

        def med(f, runs=runs):
            return statistics.median(f(r) for r in runs)

        out.append(
            {
                "backend": b,
                "workers": w,
                "build_s": med(lambda r: r["build"]),
                "first_batch_s": med(lambda r: r["first_batch"]),
                "later_epoch_s": med(lambda r: r["later"]),
                "first_batch_over_steady": med(
                    lambda r: r["first_batch"] / (r["later"] / r["batches"])
                ),
                "build_first_epoch_over_later": med(
                    lambda r: (r["build"] + r["first_epoch"]) / r["later"]
                ),
                "stepped_over_bound": med(
                    lambda r: r["stepped"] / max(r["later"], r["batches"] * r["step"])
                ),
                "stepped_first_over_steady": med(
                    lambda r: r["stepped_first"] / (r["later"] / r["batches"])
                ),
            }
        )
    return out


def format_startup(records: list[dict]) -> str:
    """A text table of :func:`summarize_startup` (ratios: medians over rounds)."""
    rows = summarize_startup(records)
    head = (
        f"{'backend':>7} {'workers':>7} {'build s':>8} {'1st batch s':>11} {'later s':>8} "
        f"{'1st batch / steady':>18} {'(build+1st)/later':>17} {'with steps / bound':>18} "
        f"{'epoch 1st batch after steps / steady':>36}"
    )
    lines = [head, "-" * len(head)]
    for s in rows:
        lines.append(
            f"{s['backend']:>7} {s['workers']:>7} {s['build_s']:>8.3f} {s['first_batch_s']:>11.3f} "
            f"{s['later_epoch_s']:>8.3f} {s['first_batch_over_steady']:>18.2f} "
            f"{s['build_first_epoch_over_later']:>17.2f} {s['stepped_over_bound']:>18.2f} "
            f"{s['stepped_first_over_steady']:>36.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from the command line and print its table."""
    from tsfile_torch.bench.harness import write_json
    from tsfile_torch.bench.reference import reference_data

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="TsFiles to read (default: the reference dataset)")
    parser.add_argument("--cache-dir", help="where the reference dataset is generated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3; quick: 1)")
    parser.add_argument("--quick", action="store_true", help="one round")
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2], help="default: 0 2")
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=["auto", "mmap", "pread"],
        default=["auto", "pread"],
        help="read backends (default: auto pread)",
    )
    parser.add_argument("--json", help="append one JSON record per run to this file")
    parser.add_argument("--no-progress", action="store_true", help="print no progress lines")
    args = parser.parse_args(argv)
    records = run_startup(
        args.data or reference_data(args.cache_dir),
        tuple(args.workers),
        1 if args.quick else args.rounds,
        progress=not args.no_progress,
        backends=tuple(args.backends),
    )
    print(format_startup(records))
    if args.json:
        write_json(records, args.json, append=True)
        print(f"wrote {len(records)} records to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
