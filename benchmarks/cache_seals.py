"""What sealing the decoded disk cache costs: epochs over a filled entry, two checkouts compared.

Each round runs one fresh process per checkout (taking turns, so load on the machine falls on
both alike) over the reference workload (8 files x 8 DOUBLE fields x 131,072 rows: 64 columns,
32 MiB decoded) with ``TsFileIterableDataset(batch_size=8192, cache="disk")`` and
``make_loader`` (0 workers), each checkout on an entry of its own filled before the rounds. A
process times its first epoch (each block's seal verified once) and ``--epochs`` later epochs
(nothing verified), and sums the first value of every batch so a fast wrong path cannot win.

    git worktree add /tmp/before <commit before>; git worktree add /tmp/after <commit>
    python benchmarks/cache_seals.py /tmp/before /tmp/after --rounds 7

Prints one line per process and the medians; ``--json`` writes one record per process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

# One process: time the epochs of a dataset over the filled entry.
EPOCHS = r"""
import json, sys, time
from tsfile_torch import TsFileIterableDataset, make_loader
data, cache, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
ds = TsFileIterableDataset(data, batch_size=8192, cache="disk", cache_dir=cache)
loader = make_loader(ds, num_workers=0)
seconds, sums = [], []
for epoch in range(epochs + 1):
    ds.set_epoch(epoch)
    start, total = time.perf_counter(), 0.0
    for batch in loader:
        total += float(batch[0, 0])
    seconds.append(time.perf_counter() - start)
    sums.append(total)
print(json.dumps({"first": seconds[0], "later": seconds[1:], "sums": sums}))
"""


def _run(checkout: str, data: str, cache: str, epochs: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
    out = subprocess.run(
        [sys.executable, "-c", EPOCHS, data, cache, str(epochs)],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="checkout of the code before (a git worktree)")
    parser.add_argument("after", help="checkout of the code after")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=6, help="later epochs per process")
    parser.add_argument("--data", help="reference workload directory (default: generated)")
    parser.add_argument("--json", help="write one JSON record per process here")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="cache-seals-")
    data = args.data
    if data is None:
        sys.path.insert(0, os.path.abspath(args.after))
        from tsfile_torch import synthetic

        data = os.path.join(work, "data")
        synthetic.write_table_files(data, synthetic.REFERENCE)
    names = {"before": args.before, "after": args.after}
    for name, checkout in names.items():  # fill each checkout's entry (warm-up)
        _run(checkout, data, os.path.join(work, name), 0)
    found = {name: [] for name in names}
    records = []
    for round_ in range(args.rounds):
        for name, checkout in names.items():
            got = _run(checkout, data, os.path.join(work, name), args.epochs)
            found[name].append(got)
            records.append({"round": round_, "code": name, "checkout": checkout, **got})
            later = statistics.median(got["later"])
            print(f"round {round_} {name:6s} first {got['first'] * 1e3:6.1f} ms  "
                  f"later epochs median {later * 1e3:5.2f} ms")  # fmt: skip
    if any(r["sums"] != records[0]["sums"][:1] * len(r["sums"]) for r in records):
        sys.exit("checksums differ between processes: not the same rows")
    first = {n: [g["first"] for g in found[n]] for n in names}
    later = {n: [statistics.median(g["later"]) for g in found[n]] for n in names}
    for label, values in (("first epoch", first), ("later epochs", later)):
        ratios = [a / b for a, b in zip(values["after"], values["before"], strict=True)]
        before, after = values["before"], values["after"]
        print(
            f"{label}: before median {statistics.median(before) * 1e3:.2f} ms (min "
            f"{min(before) * 1e3:.2f}), after {statistics.median(after) * 1e3:.2f} ms (min "
            f"{min(after) * 1e3:.2f}); after / before per round median "
            f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})"
        )
    if args.json:
        env = {"python": platform.python_version(), "machine": platform.machine(),
               "cpus": os.cpu_count()}  # fmt: skip
        with open(args.json, "w") as fh:
            for record in records:
                fh.write(json.dumps({**record, "environment": env}) + "\n")


if __name__ == "__main__":
    main()
