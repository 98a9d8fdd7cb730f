"""Command line: ``tsfile-torch bench | inspect | generate``."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def _bench_windows(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from . import bench_windows as bw

    plan = bw.QUICK_WINDOWS if args.quick else bw.WindowBenchPlan()
    plan = replace(plan, data=args.data, cache_dir=args.cache_dir)
    if args.workers:
        plan = replace(plan, workers=tuple(args.workers))
    records = bw.run_window_benchmark(plan, progress=not args.no_progress)
    print(bw.format_window_table(records))
    if args.json:
        with open(args.json, "a", encoding="utf-8") as fh:
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
        print(f"wrote {len(records)} records to {args.json}")
    return 0 if all(r["checksum_ok"] for r in records) else 1


def _bench(args: argparse.Namespace) -> int:
    from . import bench

    if args.windows:
        return _bench_windows(args)
    args.workers = args.workers or [0, 1, 2]
    data = args.data or bench.reference_data(args.cache_dir)
    if args.quick:
        plan = bench.BenchPlan(
            data=data,
            columns=tuple(args.columns) if args.columns else None,
            batch_size=args.batch_size,
            rounds=args.rounds or 1,
            epochs=2,
            random_batches=8,
            cold=args.cold,
        )
        configs = [
            bench.DATAFRAME_BASELINES[0],
            bench.DATAFRAME_BASELINES[2],
            bench.BenchConfig("memcopy", num_workers=0),
            *[bench.BenchConfig("tsfile-torch", b, 0) for b in args.backends],
            bench.BenchConfig("tsfile-torch", args.backends[0], 0, "memory"),
        ]
    else:
        plan = bench.BenchPlan(
            data=data,
            columns=tuple(args.columns) if args.columns else None,
            batch_size=args.batch_size,
            rounds=args.rounds or 6,
            cold=args.cold,
        )
        configs = bench.default_configs(args.backends, args.workers, args.caches)
    if args.cold and not hasattr(__import__("os"), "posix_fadvise"):
        print(
            "--cold: posix_fadvise is not available here; the page cache stays warm",
            file=sys.stderr,
        )
    records = bench.run_benchmark(plan, configs, progress=not args.no_progress)
    print(bench.format_table(records))
    if args.json:
        bench.write_json(records, args.json)
        print(f"wrote {len(records)} records to {args.json}")
    if args.plot:
        bench.plot_results(records, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from .catalog import build_catalog

    cat = build_catalog(args.sources, args.columns)
    rows = cat.describe()
    if args.json:
        print(
            json.dumps(
                {
                    "num_rows": cat.num_rows,
                    "start_time": cat.start_time,
                    "end_time": cat.end_time,
                    "columns": rows,
                },
                indent=1,
            )
        )
        return 0
    print(
        f"{len(cat.files)} files, {len(rows)} columns, {cat.num_rows} rows, "
        f"time [{cat.start_time}, {cat.end_time}]"
    )
    for r in rows:
        print(
            f"  {r['name']:<40} {r['dtype']:<9} rows={r['num_rows']:<9} min={r['min']} "
            f"max={r['max']} mean={r['mean']}"
        )
    return 0


def _generate(args: argparse.Namespace) -> int:
    from . import synthetic

    spec = synthetic.DatasetSpec(args.files, args.devices, args.fields, args.rows)
    paths = synthetic.write_table_files(args.directory, spec)
    print(f"wrote {len(paths)} files to {args.directory}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tsfile-torch", description="TsFile datasets for PyTorch")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="epoch-throughput benchmark beside TsFileDataFrame")
    b.add_argument("--data", help="TsFiles to read (default: the reference dataset, generated)")
    b.add_argument("--cache-dir", help="where the reference dataset is generated")
    b.add_argument("--columns", nargs="+", help="column names or glob patterns")
    b.add_argument("--batch-size", type=int, default=8192)
    b.add_argument("--rounds", type=int, help="balanced rounds (default 6, quick 1)")
    b.add_argument(
        "--backends",
        nargs="+",
        choices=["auto", "mmap", "pread"],
        default=["auto", "mmap", "pread"],
    )
    b.add_argument(
        "--workers", nargs="+", type=int, help="DataLoader workers (default 0 1 2; windows: 0 2)"
    )
    b.add_argument("--caches", nargs="+", choices=["none", "memory"], default=["none", "memory"])
    b.add_argument(
        "--cold",
        action="store_true",
        help="evict the files from the page cache "
        "before each configuration (posix_fadvise DONTNEED)",
    )
    b.add_argument("--quick", action="store_true", help="a short run (under 30 s)")
    b.add_argument(
        "--windows",
        action="store_true",
        help="forecasting-window benchmark on a generated panel (64 devices x 8 fields x "
        "200,000 rows; --data: a panel directory) beside TsFileDataFrame and in-memory numpy",
    )
    b.add_argument("--json", help="write one JSON record per configuration and round")
    b.add_argument("--plot", help="write a PNG bar chart (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true")
    b.set_defaults(func=_bench)

    i = sub.add_parser("inspect", help="columns, rows and statistics from metadata")
    i.add_argument("sources", nargs="+")
    i.add_argument("--columns", nargs="+")
    i.add_argument("--json", action="store_true")
    i.set_defaults(func=_inspect)

    g = sub.add_parser("generate", help="write a synthetic table-model dataset")
    g.add_argument("directory")
    g.add_argument("--files", type=int, default=8)
    g.add_argument("--devices", type=int, default=1)
    g.add_argument("--fields", type=int, default=8)
    g.add_argument("--rows", type=int, default=131072)
    g.set_defaults(func=_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
