"""Command line: ``tsfile-torch bench | inspect | generate | verify``."""

from __future__ import annotations

import argparse
import json
import sys

__all__ = ["main"]


def _bench(args: argparse.Namespace) -> int:
    from . import bench

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
    from .catalog import build_catalog, expand_sources
    from .validate import check_sources

    sources = expand_sources(args.sources)
    check_sources(sources)  # a damaged file is an error, not a crash of this command
    cat = build_catalog(sources, args.columns)
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


def _verify(args: argparse.Namespace) -> int:
    from .catalog import expand_sources
    from .validate import validate_sources

    sources = expand_sources(args.sources)
    mode = "headers" if args.headers_only else "full"
    problems = {p.name: p.reason for p in validate_sources(sources, mode, args.timeout)}
    for source in sources:
        name = str(source)
        if args.json:
            print(
                json.dumps({"file": name, "ok": name not in problems, "reason": problems.get(name)})
            )
        elif name in problems:
            print(f"DAMAGED {name}: {problems[name]}")
        else:
            print(f"ok      {name}")
    if not args.json:
        print(f"{len(sources)} files checked ({mode}), {len(problems)} damaged")
    return 1 if problems else 0


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
    b.add_argument("--workers", nargs="+", type=int, default=[0, 1, 2])
    b.add_argument("--caches", nargs="+", choices=["none", "memory"], default=["none", "memory"])
    b.add_argument(
        "--cold",
        action="store_true",
        help="evict the files from the page cache "
        "before each configuration (posix_fadvise DONTNEED)",
    )
    b.add_argument("--quick", action="store_true", help="a short run (under 30 s)")
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

    v = sub.add_parser(
        "verify",
        help="decode every file in a child process and report each damaged file with the reason",
    )
    v.add_argument("sources", nargs="+", help="files, directories or glob patterns")
    v.add_argument(
        "--headers-only",
        action="store_true",
        help="check metadata and first chunks only (what datasets do when built)",
    )
    v.add_argument("--timeout", type=float, help="seconds one file may take (default: by size)")
    v.add_argument("--json", action="store_true", help="one JSON record per file")
    v.set_defaults(func=_verify)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
