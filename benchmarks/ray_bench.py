"""Ray Data beside make_loader on the reference workload, in one run (``pip install -e ".[ray]"``).

Configurations, each giving (8,192, 64) float32 batches of the reference dataset (8 TsFiles x
1 device x 8 DOUBLE fields x 131,072 rows):

- ``make_loader`` streaming (``cache="none"``), 0 and 2 persistent workers: the baseline;
- ``read_tsfile(...).iter_torch_batches(batch_size=8192, collate_fn=stack_columns(...))`` on
  ``ray.init(num_cpus=2)``, with the default task plan and with ``--ray-blocks`` tasks;
- the same through ``iter_torch_batches`` without a collate_fn (a dict of 64 column tensors);
- the same dataset materialized once (``start s`` decodes it into the object store), then
  batched: the consumer's side alone, what a trainer gets when read tasks run on other CPUs;
- ``ray.data.read_parquet`` of the same matrix (float32, written once, one file per 16,384
  rows, snappy), through the same ``iter_torch_batches``: Ray's own reader of a columnar
  format, the conversion a user would do today.

Per round (configurations in alternating order, page cache warmed first): build the dataset
(``start s``: the catalog, and for Ray the driver's planning), then ``--epochs`` passes; ``1st
s`` is the first pass (workers' start, Ray's first tasks), ``later s`` the median of the
others. ``rows/s`` from ``later s``; ``x loader0``: make_loader with 0 workers' later seconds /
this configuration's, pair by pair in a round, median over rounds (> 1: faster). Every pass
is checksummed per row (:func:`tsfile_torch.bench.harness.checksum` with ``per_item``: Ray
does not keep block order) against the matrix decoded once. Ray's own start-up
(``ray.init``) is measured once, apart.

    python benchmarks/ray_bench.py > benchmarks/results/ray.txt
    python benchmarks/ray_bench.py --rounds 1 --epochs 2 --json out.jsonl   # quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from tsfile_torch import TsFileIterableDataset, make_loader
from tsfile_torch.bench.harness import checksum, environment, min_median, write_json
from tsfile_torch.bench.reference import reference_data, warm_page_cache
from tsfile_torch.read.core import ReadingCore

BATCH = 8192


def _consume(batches, columns: list[str]) -> tuple[int, int, float]:
    """Iterate once: (per-row checksum mod 2**64, rows, seconds to the first batch)."""
    total, rows, first, start = 0, 0, None, time.perf_counter()
    for batch in batches:
        if isinstance(batch, dict):  # iter_torch_batches without collate_fn: column tensors
            batch = np.stack([batch[c].numpy() for c in columns], axis=1)
        if first is None:
            first = time.perf_counter() - start
        total += checksum(batch, per_item=True)
        rows += len(batch)
    return total % (1 << 64), rows, first


def _configs(data: str, parquet: str, columns: list[str], ray_blocks: list[int]):
    """Return name -> (build(), passes(built)) for every configuration."""
    import ray.data

    from tsfile_torch.ray import read_tsfile, stack_columns

    collate = stack_columns(columns)

    def loader(workers: int):
        def build():
            ds = TsFileIterableDataset(data, batch_size=BATCH)
            return make_loader(ds, num_workers=workers)

        return build, lambda built: built

    def ray_rows(blocks: int | None, stacked: bool = True):
        def build():
            return read_tsfile(data, override_num_blocks=blocks)

        def passes(ds):
            if stacked:
                return ds.iter_torch_batches(batch_size=BATCH, collate_fn=collate)
            return ds.iter_torch_batches(batch_size=BATCH)

        return build, passes

    def ray_parquet():
        return (
            lambda: ray.data.read_parquet(parquet),
            lambda ds: ds.iter_torch_batches(batch_size=BATCH, collate_fn=collate),
        )

    configs = {
        "make_loader streaming, workers=0": loader(0),
        "make_loader streaming, workers=2": loader(2),
        "read_tsfile, default tasks, stacked": ray_rows(None),
    }
    for n in ray_blocks:
        configs[f"read_tsfile, {n} tasks, stacked"] = ray_rows(n)
    configs["read_tsfile, default tasks, column dict"] = ray_rows(None, stacked=False)
    # decoded once into the object store: what a consumer gets when read tasks run elsewhere
    configs["read_tsfile materialized, stacked"] = (
        lambda: read_tsfile(data).materialize(),
        lambda ds: ds.iter_torch_batches(batch_size=BATCH, collate_fn=collate),
    )
    configs["read_parquet (same matrix), stacked"] = ray_parquet()
    return configs


def _write_parquet(matrix: np.ndarray, columns: list[str], directory: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 16384
    for i, lo in enumerate(range(0, len(matrix), rows)):
        part = matrix[lo : lo + rows]
        table = pa.table({c: part[:, j] for j, c in enumerate(columns)})
        pq.write_table(table, os.path.join(directory, f"part{i:03d}.parquet"))
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="TsFiles to read (default: the reference dataset)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4, help="passes per round and config")
    parser.add_argument("--num-cpus", type=int, default=2, help="ray.init(num_cpus=...)")
    parser.add_argument("--ray-blocks", default="8", help="task counts to try, comma-separated")
    parser.add_argument("--json", help="write one JSON record per configuration and round")
    args = parser.parse_args(argv)

    import ray

    data = args.data or reference_data()
    core = ReadingCore.for_rows(data)
    paths = [f.name for f in core.catalog.files]
    columns = core.catalog.column_names
    matrix, _ = core.rows(0, 0, core.tables[0].num_rows)
    core.close()
    expected = checksum(matrix, per_item=True)

    start = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - start
    ray.data.DataContext.get_current().enable_progress_bars = False

    blocks = [int(b) for b in args.ray_blocks.split(",") if b]
    records = []
    with tempfile.TemporaryDirectory(prefix="tsfile-torch-ray-bench-") as parquet:
        _write_parquet(matrix, columns, parquet)
        configs = _configs(data, parquet, columns, blocks)
        names = list(configs)
        for rnd in range(args.rounds):
            warm_page_cache(paths)
            for name in names if rnd % 2 == 0 else names[::-1]:
                build, passes = configs[name]
                t0 = time.perf_counter()
                built = build()
                start_s = time.perf_counter() - t0
                seconds, firsts = [], []
                for _ in range(args.epochs):
                    t0 = time.perf_counter()
                    total, rows, first = _consume(passes(built), columns)
                    seconds.append(time.perf_counter() - t0)
                    firsts.append(first)
                    if total != expected or rows != len(matrix):
                        raise RuntimeError(
                            f"{name} delivered other values than the decoded matrix "
                            f"(round {rnd}: {rows} rows, checksum {total} != {expected})"
                        )
                del built
                records.append(
                    {
                        "config": name,
                        "round": rnd,
                        "start_seconds": start_s,
                        "seconds": seconds,
                        "first_batch_seconds": firsts,
                        "rows": len(matrix),
                        "columns": len(columns),
                        "ray_init_seconds": ray_start,
                        "num_cpus": args.num_cpus,
                        "checksum_ok": True,
                    }
                )
    ray.shutdown()
    _print(records, ray_start, args)
    if args.json:
        write_json(records, args.json)
    return 0


def _print(records: list[dict], ray_start: float, args) -> None:
    env = environment()
    import ray

    print(
        f"Ray Data beside make_loader: {records[0]['rows']:,} rows x {records[0]['columns']} "
        f"columns, batches of {BATCH}, {args.rounds} rounds x {args.epochs} passes; "
        f"ray.init(num_cpus={args.num_cpus}) {ray_start:.1f} s (once, apart); "
        f"{env['cpus']} CPUs, ray {ray.__version__}, torch {env['torch']}"
    )
    base = {
        r["round"]: statistics.median(r["seconds"][1:] or r["seconds"])
        for r in records
        if r["config"] == "make_loader streaming, workers=0"
    }
    header = (
        f"{'configuration':42} {'start s':>8} {'1st s':>7} {'1st batch s':>11} "
        f"{'later s min/med':>16} {'rows/s':>11} {'x loader0':>9}"
    )
    print(header)
    print("-" * len(header))
    for name in dict.fromkeys(r["config"] for r in records):
        recs = [r for r in records if r["config"] == name]
        later = [s for r in recs for s in (r["seconds"][1:] or r["seconds"])]
        lo, med = min_median(later)
        ratio = statistics.median(
            base[r["round"]] / statistics.median(r["seconds"][1:] or r["seconds"]) for r in recs
        )
        print(
            f"{name:42} {statistics.median(r['start_seconds'] for r in recs):8.3f} "
            f"{statistics.median(r['seconds'][0] for r in recs):7.3f} "
            f"{statistics.median(r['first_batch_seconds'][0] for r in recs):11.3f} "
            f"{lo:7.3f} / {med:6.3f} {recs[0]['rows'] / med:11,.0f} {ratio:9.2f}"
        )
    print("every pass's per-row checksum matched the decoded matrix")


if __name__ == "__main__":
    sys.exit(main())
