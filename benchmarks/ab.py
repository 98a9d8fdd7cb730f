"""What each mechanism pays: its A/B, in paired alternating processes on the same files.

For each mechanism of :data:`tsfile_torch.mechanisms.MECHANISMS`, a child process runs the
configurations where it acts (rows or windows; cache none / memory / disk; 0 or 2 workers;
sequential or shuffled) with the mechanism on, another with it off
(``TSFILE_TORCH_OFF=<name>``), alternating which goes first pair by pair. Each configuration
builds its dataset and loader, runs a first epoch, then ``--epochs`` later ones; a pair's ratio
is off / on (> 1: the mechanism saves time) of the first epoch and of the first batch for
``first_read`` (it acts on a process's first pass) and of the median later epoch for the rest.
Reported: the median ratio over ``--pairs`` pairs, its range, and whether on and off delivered
the same checksums (they must: a mechanism may change speed, never data).

    python benchmarks/ab.py [--only ring exchange] [--pairs 5] [--out benchmarks/results/ab.txt]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: (view, cache, workers, order[, seconds of training step per batch]) of each configuration;
#: a step sleeps (a GPU-bound step: the CPU is free meanwhile)
CONFIGS = {
    "rows none 0w seq, 20 ms steps": ("rows", "none", 0, "sequential", 0.02),
    "rows none 2w seq, 20 ms steps": ("rows", "none", 2, "sequential", 0.02),
    "rows none 0w seq": ("rows", "none", 0, "sequential"),
    "rows none 2w seq": ("rows", "none", 2, "sequential"),
    "rows none 2w stretches": ("rows", "none", 2, "stretches"),
    "rows none 2w shuffle": ("rows", "none", 2, "shuffle"),
    "rows memory 0w seq": ("rows", "memory", 0, "sequential"),
    "rows memory 2w seq": ("rows", "memory", 2, "sequential"),
    "rows disk 0w seq": ("rows", "disk", 0, "sequential"),
    "rows disk 2w seq": ("rows", "disk", 2, "sequential"),
    "rows disk 2w shuffle": ("rows", "disk", 2, "shuffle"),
    "windows none 0w shuffle": ("windows", "none", 0, "shuffle"),
    "windows none 2w shuffle": ("windows", "none", 2, "shuffle"),
    "windows none 2w seq": ("windows", "none", 2, "sequential"),
    "windows memory 2w shuffle": ("windows", "memory", 2, "shuffle"),
    "windows disk 2w shuffle": ("windows", "disk", 2, "shuffle"),
}

#: the configurations each mechanism acts in (the ones the docs recommend among them)
WHERE = {
    "ring": ["rows none 2w seq", "rows none 2w shuffle", "rows disk 2w shuffle",
             "windows none 2w shuffle"],
    "exchange": ["rows none 2w shuffle", "windows none 2w shuffle", "windows none 2w seq"],
    "first_read": ["rows none 0w seq", "rows none 2w stretches", "windows none 0w shuffle"],
    "readahead": ["rows none 0w seq", "rows none 2w seq", "rows none 2w stretches",
                  "rows none 0w seq, 20 ms steps", "rows none 2w seq, 20 ms steps"],
    "kept": ["rows memory 2w seq", "rows disk 2w seq", "windows memory 2w shuffle",
             "windows disk 2w shuffle"],
    "epoch_sums": ["rows memory 0w seq", "rows disk 0w seq", "rows disk 2w seq"],
    "malloc": ["rows none 0w seq", "rows none 2w shuffle", "windows none 0w shuffle"],
    "sigchld": ["rows none 2w seq", "windows none 2w shuffle"],
}  # fmt: skip


#: what each mechanism is judged on: (result key, label); later epochs unless it acts on the first
KEYS = {name: [("later", "")] for name in WHERE}
KEYS["first_read"] = [("first", " (1st epoch)"), ("first_batch", " (1st batch)")]
KEYS["epoch_sums"] = [("first", " (1st epoch)")]  # checked in the first epoch of a cache
KEYS["exchange"] = [("later", ""), ("first", " (1st epoch)")]


def _data(root: str) -> tuple[list[str], list[str]]:
    """Write (once) the reference files for rows and a panel for windows under ``root``."""
    from tsfile_torch import synthetic

    rows_dir, panel_dir = os.path.join(root, "reference"), os.path.join(root, "panel")
    synthetic.write_reference(rows_dir)
    if not os.path.exists(os.path.join(panel_dir, ".complete")):
        synthetic.write_panel(panel_dir, 16, 8, 50_000, 4)
        open(os.path.join(panel_dir, ".complete"), "w").close()

    def files(d):
        return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tsfile"))

    return files(rows_dir), files(panel_dir)


def _measure(config: str, rows_paths, panel_paths, cache_dir: str, epochs: int) -> dict:
    """Build one configuration's loader; time its first epoch and ``epochs`` later ones."""
    from tsfile_torch import TsFileIterableDataset, TsFileWindowDataset, make_loader
    from tsfile_torch.bench.harness import consume

    view, cache, workers, order, *step = CONFIGS[config]
    common = dict(read_backend="auto", cache=cache, cache_dir=cache_dir)
    if view == "rows":
        ds = TsFileIterableDataset(rows_paths, order=order, **common)
        loader = make_loader(ds, num_workers=workers)
    else:
        ds = TsFileWindowDataset(panel_paths, 96, 24, 24, order=order, **common)
        loader = make_loader(ds, batch_size=256, num_workers=workers)
    seconds, sums = [], []
    for _ in range(1 + epochs):
        start = time.perf_counter()
        batches = iter(loader)
        head = next(batches)
        if not seconds:
            first_batch = time.perf_counter() - start
        batches = itertools.chain([head], batches)
        if step:
            batches = _stepped(batches, step[0])
        got = consume(batches, per_item=view == "windows")
        seconds.append(time.perf_counter() - start)
        sums.append(got.checksum)
    del loader, ds, batches, head
    later = statistics.median(seconds[1:])
    return {"first_batch": first_batch, "first": seconds[0], "later": later, "sums": sums}


def _stepped(batches, seconds: float):
    """Yield ``batches``, each after a training step of ``seconds`` on the one before."""
    for i, batch in enumerate(batches):
        if i:
            time.sleep(seconds)
        yield batch


def _child(args) -> None:
    rows_paths, panel_paths = _data(args.data)
    out = {}
    for config in WHERE[args.child]:
        cache_dir = tempfile.mkdtemp(prefix="ab-cache-", dir=args.data)  # a cold disk cache
        out[config] = _measure(config, rows_paths, panel_paths, cache_dir, args.epochs)
    print(json.dumps(out))


def _run_child(mechanism: str, off: bool, args) -> dict:
    env = {**os.environ, "TSFILE_TORCH_OFF": mechanism if off else ""}
    cmd = [sys.executable, __file__, "--child", mechanism, "--data", args.data]
    cmd += ["--epochs", str(args.epochs)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _table(results: dict) -> list[str]:
    lines = [
        f"{'mechanism':<11} {'configuration':<38} {'off/on':>7} {'range':>13}  same data",
        "-" * 84,
    ]
    for mechanism, per_config in results.items():
        for config, pairs in per_config.items():
            ratios = [r for r, _ in pairs]
            same = all(s for _, s in pairs)
            lines.append(
                f"{mechanism:<11} {config:<38} {statistics.median(ratios):>7.2f} "
                f"{min(ratios):>6.2f}-{max(ratios):<6.2f}  {'yes' if same else 'NO'}"
            )
    return lines


def _plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, medians, lows, highs = [], [], [], []
    for mechanism, per_config in results.items():
        for config, pairs in per_config.items():
            ratios = [r for r, _ in pairs]
            labels.append(f"{mechanism}: {config}")
            medians.append(statistics.median(ratios))
            lows.append(medians[-1] - min(ratios))
            highs.append(max(ratios) - medians[-1])
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(labels) + 1.2))
    y = range(len(labels))
    ax.barh(y, medians, xerr=[lows, highs], color="tab:blue", alpha=0.7)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(1.1, color="tab:red", lw=0.8, ls="--", label="keeps: >= 1.10")
    ax.set_yticks(list(y), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("epoch seconds with the mechanism off / on (median of pairs)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    from tsfile_torch.mechanisms import MECHANISMS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=list(MECHANISMS), default=list(MECHANISMS))
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3, help="later epochs timed per run")
    p.add_argument("--data", help="where the files are written (default: temporary)")
    p.add_argument("--out", help="also write the table here (and a .png plot beside it)")
    p.add_argument("--child", choices=list(MECHANISMS), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return 0
    args.data = args.data or tempfile.mkdtemp(prefix="tsfile-torch-ab-")
    _data(args.data)
    from tqdm import tqdm

    results: dict = {}
    bar = tqdm(total=len(args.only) * args.pairs * 2, desc="A/B runs")
    for mechanism in args.only:
        per_config: dict = {}
        for pair in range(args.pairs):
            runs = {}
            for off in (pair % 2 == 0, pair % 2 == 1):  # alternate which goes first
                runs[off] = _run_child(mechanism, off, args)
                bar.update()
            for config in WHERE[mechanism]:
                on, off = runs[False][config], runs[True][config]
                same = on["sums"] == off["sums"]
                for key, label in KEYS[mechanism]:
                    per_config.setdefault(config + label, []).append((off[key] / on[key], same))
        results[mechanism] = per_config
        tqdm.write("\n".join(_table({mechanism: per_config})[2:]))
    bar.close()
    lines = _table(results)
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(f"python benchmarks/ab.py --pairs {args.pairs} --epochs {args.epochs}\n")
            f.write("\n".join(lines) + "\n")
        _plot(results, os.path.splitext(args.out)[0] + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
