"""Streaming epochs against tsfile's own decode floor on the reference workload, side by side.

The cells of ``benchmarks/scale.py`` for its ``seed`` set alone (8 files x 8 DOUBLE x
131,072 rows): ours (a ``TsFileIterableDataset`` streaming epoch, 8,192-row batches, auto and
pread) and the floor (every file's series read whole by tsfile's query API on 2 threads, Arrow
batches only), each in ``--repeats`` fresh processes, alternating. Reported: the fastest later
epoch of each, and ours / floor.

    python benchmarks/decode_floor.py [--data DIR] [--repeats 3]
"""

import argparse
import sys

import scale  # benchmarks/scale.py, beside this file

from tsfile_torch.bench.harness import later_epochs
from tsfile_torch.bench.reference import reference_data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="the reference dataset (default: tsfile-torch bench's)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    args.data = args.data or reference_data()  # written on first use
    ours = {"auto": [], "pread": []}
    floor = []
    for _ in range(args.repeats):
        for backend in ours:
            cell = scale._run_cell(
                "stream", 600, path=args.data, batch_size=8192, epochs=4, random_windows=0,
                read_backend=backend,
            )  # fmt: skip
            ours[backend].append(min(later_epochs(cell["epoch_s"])))
        floor.append(min(scale._run_cell("floor", 600, path=args.data)["floor_s"]))
    best = min(floor)
    print(f"decode floor (tsfile query API, 2 threads, Arrow): {best:.4f} s  runs {floor}")
    for backend, runs in ours.items():
        print(
            f"streaming epoch, {backend:<5}: {min(runs):.4f} s = {min(runs) / best:.2f}x the floor"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
