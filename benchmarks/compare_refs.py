"""Compare two commits' benchmark figures side by side, runs alternating on the same files.

Each commit is checked out into a temporary worktree; ``tsfile-torch bench`` (the reference
workload) and ``benchmarks/windows.py --quick`` (the window panel; ``tsfile-torch bench --windows
--quick`` in a commit from before the benchmarks left the package) run alternately with
``PYTHONPATH`` pointing at one commit then the other, ``--pairs`` times, on one generated copy
of the data. Reported: per configuration, the median over runs of later-epoch seconds (rows) or
seconds (windows) of each commit and new / old; ratios under 1 mean the new commit is faster.

    python benchmarks/compare_refs.py OLD NEW [--pairs 3] [--out benchmarks/results/compare.txt]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

from tqdm import tqdm

ROWS = ["--backends", "auto", "--workers", "0", "2", "--caches", "none", "memory", "disk"]


def _worktree(ref: str, root: str) -> str:
    path = os.path.join(root, ref[:12])
    subprocess.run(["git", "worktree", "add", "--detach", "-q", path, ref], check=True)
    return path


def _run(tree: str, args: list[str], data: str, cache: str, json_path: str) -> None:
    env = {**os.environ, "PYTHONPATH": tree, "XDG_CACHE_HOME": cache}
    script = os.path.join(tree, "benchmarks", "windows.py")
    if args[0] == "--windows" and os.path.exists(script):
        cmd = [sys.executable, script, *args[1:]]
    else:
        cmd = [sys.executable, "-m", "tsfile_torch", "bench", *args, "--rounds", "1"]
    cmd += ["--cache-dir", data, "--json", json_path, "--no-progress"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=tree)


def _figures(json_path: str) -> dict[str, float]:
    """Return each configuration's seconds over its reference's in the same run (rows: the
    memory-copy reference with as many workers; windows: the in-memory numpy reference), so
    load on the machine cancels out of the comparison as far as it can."""
    seconds = {}
    with open(json_path) as f:
        for line in f:
            r = json.loads(line)
            if "route" in r:
                seconds[f"windows: {r['route']}"] = r["seconds"]
            elif r.get("kind") != "dataframe":
                seconds[r["config"]] = (r["later_epoch_seconds"], r["num_workers"])
    out = {}
    for name, value in seconds.items():
        if name.startswith("windows: "):
            ref = seconds.get("windows: in-memory numpy reference")
            if "workers=2" in name:
                ref = seconds.get("windows: in-memory numpy reference, workers=2", ref)
            out[name] = value / ref
        elif not name.startswith("memcopy"):
            out[name] = value[0] / seconds[f"memcopy reference, workers={value[1]}"][0]
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    root = tempfile.mkdtemp(prefix="tsfile-torch-compare-")
    trees = {name: _worktree(ref, root) for name, ref in (("old", a.old), ("new", a.new))}
    data, cache = os.path.join(root, "data"), os.path.join(root, "cache")
    seconds: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    try:
        steps = [(i, name) for i in range(a.pairs) for name in ("old", "new")]
        for i, name in tqdm(steps, desc="runs"):
            for suite, args in (("rows", ROWS), ("windows", ["--windows", "--quick"])):
                path = os.path.join(root, f"{name}-{suite}-{i}.jsonl")
                _run(trees[name], args, data, cache, path)
                for config, value in _figures(path).items():
                    seconds[config][name].append(value)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", tree], check=False)
    lines = [
        f"old {a.old}, new {a.new}: {a.pairs} alternating pairs, median of seconds over the "
        f"same run's reference (rows: later epochs / memcopy; windows: pass / numpy)",
        f"{'configuration':60} {'old':>8} {'new':>8} {'new/old':>8}",
    ]
    for config, runs in seconds.items():
        old, new = statistics.median(runs["old"]), statistics.median(runs["new"])
        lines.append(f"{config:60} {old:8.4f} {new:8.4f} {new / old:8.3f}")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
