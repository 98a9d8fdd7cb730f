"""Windows on a time grid (``freq=``) beside the same windows without it, in one run.

Generates a panel of devices sampled every 15 minutes, each series split across files, in two
versions: regular (no missing timestamp: the grid's windows are the row windows, so the
difference is what the grid layer costs) and with holes (a 6-hour outage every ~1,000
readings: the grid's windows hold the missing steps). Over each, it times dataset builds and
shuffled epochs of ``TsFileWindowDataset(..., shuffle=True)`` through ``make_loader`` (0
workers, streaming), with and without ``freq="15min"``, alternating the two in every round so
both see the same machine, and checksums every epoch (a route must read the same windows every
time). Prints min / median seconds and the ratios freq / rows; ``--json`` writes the records.

    python benchmarks/windows_freq.py [--devices 16] [--rows 100000] [--rounds 5] [--json F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
from tqdm import tqdm

from tsfile_torch import TsFileWindowDataset, make_loader, synthetic
from tsfile_torch.bench.harness import checksum, environment, write_json

Q = 15 * 60 * 1000
FIELDS = ["f0", "f1", "f2", "f3"]


def write_panel(directory: str, devices: int, rows: int, files: int, holes: bool) -> None:
    """Write ``devices`` meters at 15-minute steps over ``files`` files (values: step-based)."""
    steps = np.arange(rows + (rows // 1000) * 24 if holes else rows)
    if holes:  # 24 missing steps (6 hours) after every 1,000 readings
        steps = steps[(steps % 1024) < 1000]
    for f in range(files):
        part = steps[len(steps) * f // files : len(steps) * (f + 1) // files]
        panel = {}
        for d in range(devices):
            values = np.stack([d * 1e6 + part + j / 10 for j in range(len(FIELDS))], axis=1)
            panel[f"m{d}"] = (1_704_067_200_000 + d * 60_000 + part * Q, values)
        path = os.path.join(directory, f"panel{f}.tsfile")
        synthetic.write_table_devices(path, "meters", FIELDS, panel)


#: ``wall``: elapsed seconds; ``process``: CPU seconds of this process and its threads (0
#: workers: every decode), steadier than wall time on a machine other work loads
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
clock = CLOCKS["wall"]


def epoch(ds, seed: int) -> tuple[float, int]:
    """Return (seconds, checksum) of one shuffled epoch of ``ds``."""
    ds.set_epoch(seed)
    start, total = clock(), 0
    for x, y in make_loader(ds, batch_size=256):
        total += checksum(x, per_item=True) + checksum(y, per_item=True)
    return clock() - start, total


def run(directory: str, label: str, rounds: int) -> list[dict]:
    """Alternate builds and epochs with and without ``freq``; return one record per route."""
    routes = {"rows": {}, "freq": {"freq": "15min"}}
    build, seconds, sums, datasets = {r: [] for r in routes}, {r: [] for r in routes}, {}, {}
    common = dict(context_length=96, horizon=24, stride=24, shuffle=True, fill="zero")
    for i in tqdm(range(rounds + 1), desc=label, leave=False):
        for route, extra in routes.items() if i % 2 else reversed(routes.items()):
            start = time.perf_counter()
            ds = TsFileWindowDataset(directory, **common, **extra)
            build[route].append(time.perf_counter() - start)
            datasets[route] = ds
            t, total = epoch(ds, i)  # builds are timed in wall seconds
            if i:  # round 0 warms the page cache and the imports
                seconds[route].append(t)
            sums.setdefault((route, i), total)
    for route in routes:  # a route reads the same windows every epoch, in any order
        if len({sums[route, i] for i in range(rounds + 1)}) != 1:
            raise SystemExit(f"{label}: {route} windows differ between epochs")
    if label == "regular" and sums["rows", 0] != sums["freq", 0]:
        raise SystemExit("regular panel: the grid's windows differ from the row windows")
    records = []
    for route in routes:
        records.append(
            {
                "panel": label,
                "route": route,
                "windows": len(datasets[route]),
                "build_min": min(build[route]),
                "build_median": statistics.median(build[route]),
                "epoch_min": min(seconds[route]),
                "epoch_median": statistics.median(seconds[route]),
            }
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=16, help="meters in the panel")
    parser.add_argument("--rows", type=int, default=100_000, help="readings per meter")
    parser.add_argument("--files", type=int, default=2, help="files each series is split over")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after a warm-up)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall", help="what is timed")
    parser.add_argument("--json", help="write one JSON record per panel and route")
    args = parser.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    warnings.filterwarnings("ignore", message=".*missing timestamps")  # the rows route's, known
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for holes in (False, True):
            label = "with holes" if holes else "regular"
            directory = os.path.join(tmp, label.replace(" ", "-"))
            os.makedirs(directory)
            write_panel(directory, args.devices, args.rows, args.files, holes)
            records += run(directory, label, args.rounds)
    print(f"{'panel':<11} {'route':<5} {'windows':>8} {'build s':>8} {'epoch min':>9} "
          f"{'epoch med':>9} {'freq/rows':>9}")  # fmt: skip
    base = {r["panel"]: r for r in records if r["route"] == "rows"}
    for r in records:
        ratio = r["epoch_median"] / base[r["panel"]]["epoch_median"]
        print(
            f"{r['panel']:<11} {r['route']:<5} {r['windows']:>8} {r['build_median']:>8.3f} "
            f"{r['epoch_min']:>9.3f} {r['epoch_median']:>9.3f} {ratio:>8.2f}x"
        )
    if args.json:
        env = environment()
        write_json([{**r, **args.__dict__, "environment": env} for r in records], args.json)


if __name__ == "__main__":
    main()
