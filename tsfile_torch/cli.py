"""Command line: ``tsfile-torch bench|inspect|convert|generate|manifest|verify|cache``."""

from __future__ import annotations

import argparse
import json
import os
import sys

from tsfile_torch.errors import TsFileTorchError
from tsfile_torch.options import TIME_UNITS, format_timestamp

__all__ = ["main"]


#: Benchmarks that left the installed package (issue #44): the ``bench`` option that ran each, and
#: the script of a checkout that runs it now, with the same options.
MOVED_BENCHMARKS = {
    "scale": "benchmarks/scale.py",
    "windows": "benchmarks/windows.py",
    "startup": "benchmarks/startup.py",
    "peers": "benchmarks/peers.py",
}
#: What ``bench --data URL`` ran: timing a URL against its local copies.
MOVED_REMOTE = "benchmarks/remote.py"


def _moved(option: str, command: str) -> ValueError:
    """The error for a benchmark option that moved to a script of a checkout."""
    return ValueError(
        f"{option} moved out of the installed package: in a checkout of tsfile-torch, run "
        f"python {command} (add --help for its options)"
    )


def _bench(args: argparse.Namespace) -> int:
    from tsfile_torch.bench import reference as bench
    from tsfile_torch.bench.harness import write_json
    from tsfile_torch.sources.remote import is_url

    for name, script in MOVED_BENCHMARKS.items():
        if getattr(args, name):
            raise _moved(f"--{name}", script)
    if args.data and is_url(args.data) and not args.data.startswith("file://"):
        raise _moved("--data URL", f"{MOVED_REMOTE} {args.data}")
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
        configs = bench.default_configs(args.backends, args.workers or [0, 1, 2], args.caches)
    if args.cold and not hasattr(__import__("os"), "posix_fadvise"):
        print(
            "--cold: posix_fadvise is not available here; the page cache stays warm",
            file=sys.stderr,
        )
    records = bench.run_benchmark(plan, configs, progress=not args.no_progress)
    print(bench.format_table(records))
    if args.json:
        write_json(records, args.json)
        print(f"wrote {len(records)} records to {args.json}")
    if args.plot:
        bench.plot_results(records, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _remote_options(args: argparse.Namespace):
    from tsfile_torch.sources.remote import RemoteOptions

    try:
        storage = json.loads(args.storage_options) if args.storage_options else None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"--storage-options must be a JSON object; got {args.storage_options!r}: {err}"
        ) from err
    return RemoteOptions(storage, getattr(args, "remote_cache_dir", None))


def _time_range(item: dict, args: argparse.Namespace) -> str:
    return (
        f"time [{item['start_time']}, {item['end_time']}] = [{item['start_date']}, "
        f"{item['end_date']}] (read as {args.time_unit})"
    )


def _inspect(args: argparse.Namespace) -> int:
    from tsfile_torch.catalog.build import survey, unreadable_version
    from tsfile_torch.catalog.listing import VERIFY_HINT, list_devices
    from tsfile_torch.errors import FileProblem
    from tsfile_torch.integrity.validate import damaged_error, validate_sources
    from tsfile_torch.sources import expand_sources

    sources = expand_sources(args.sources, _remote_options(args))
    # headers checked in a child first: damage that crashes tsfile's reader stays out of here
    damaged = [(p.name, p.reason) for p in validate_sources(sources, "headers")]
    good = [s for s in sources if s.name not in dict(damaged)]
    listing = list_devices(good) if good else None
    if listing is not None:
        damaged += listing.skipped
        good = [s for s in good if s.name not in dict(listing.skipped)]
    if not good:  # nothing to show: the damage is the answer
        raise damaged_error([FileProblem(name, reason) for name, reason in damaged])
    report = survey(good, args.columns)
    _add_listing(report, listing)
    report["damaged"] = [
        {
            "file": name,
            "reason": reason
            if "verify" in reason or unreadable_version(reason)
            else f"{reason}; {VERIFY_HINT}",
            "version": unreadable_version(reason),  # a format version, not damage
        }
        for name, reason in damaged
    ]
    timelines = report["timelines"]
    if len(timelines) == 1:  # the columns read together as one dataset
        report.update(
            num_rows=timelines[0]["num_rows"],
            start_time=timelines[0]["start_time"],
            end_time=timelines[0]["end_time"],
        )
    for item in (report, *timelines, *report["devices"]):  # dates beside the raw numbers
        if "start_time" in item:
            item["start_date"] = format_timestamp(item["start_time"], args.time_unit)
            item["end_date"] = format_timestamp(item["end_time"], args.time_unit)
    report["time_unit"] = args.time_unit
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_inspect(report, args)
    return 1 if damaged else 0


def _add_listing(report: dict, listing) -> None:
    """Put the device listing into ``inspect``'s report: each device's rows, clock and nulls,
    each column's nulls, and timelines of the columns whose timestamps are equal as read (the
    survey groups them by row count and time range alone)."""
    columns = {c["name"]: c for c in report["columns"]}
    groups = listing.timelines(list(columns))
    for i, group in enumerate(groups):
        for name in group:
            columns[name]["timeline"] = i
    report["timelines"] = [
        {
            "num_rows": columns[group[0]]["num_rows"],
            "start_time": columns[group[0]]["start_time"],
            "end_time": columns[group[0]]["end_time"],
            "columns": group,
        }
        for group in groups
    ]
    for entry in report["devices"]:
        info = listing[entry["name"]]
        entry.update(
            tags=info.tags,
            fields=info.fields,
            num_rows=info.num_rows,
            start_time=info.start_time,
            end_time=info.end_time,
            median_step=info.median_step,
            max_gap=info.max_gap,
            nulls=info.nulls,
            shared_timeline=info.shared_timeline,
            overlapping_files=info.overlapping_files,
            overlap=info.overlap,
            duplicates=info.duplicates,
        )
        for field, nulls in info.nulls.items():
            if f"{info.name}.{field}" in columns:
                columns[f"{info.name}.{field}"]["num_nulls"] = nulls


def _overlap_note(device: dict) -> str:
    """What ``inspect`` says of a device whose files overlap in time (Note: merged shards)."""
    if not device.get("overlapping_files"):
        return ""
    first, last = device["overlap"]
    note = (
        f"; {device['overlapping_files']} files overlap in time in [{first}, {last}] "
        f"(read merged by timestamp)"
    )
    if device["duplicates"]:
        note += (
            f", {device['duplicates']} timestamps in more than one file (pass duplicates='first' "
            f"or 'last')"
        )
    return note


def _print_inspect(report: dict, args: argparse.Namespace) -> None:
    timelines, columns = report["timelines"], report["columns"]
    head = f"{len(report['files'])} files, {len(report['devices'])} devices, {len(columns)} columns"
    if len(timelines) == 1:
        print(f"{head}, {timelines[0]['num_rows']} rows, {_time_range(timelines[0], args)}")
    else:
        print(
            f"{head} on {len(timelines)} timelines: a dataset reads columns of one timeline "
            f"(select them with --columns / columns=[...], or align them with align=)"
        )
    for item in report["damaged"]:
        label = "UNREADABLE" if item.get("version") else "DAMAGED"
        print(f"  {label} {item['file']} (left out): {item['reason']}")
    if report["left_out"]:
        print(f"  left out (not numeric): {', '.join(report['left_out'])}")
    print("devices:")
    for d in report["devices"]:
        step = f"step {d['median_step']} (median), largest gap {d['max_gap']}"
        if d["median_step"] is None:
            step = "one row"
        print(
            f"  {d['name']:<30} {d['num_rows']} rows, {_time_range(d, args)}, {step}; "
            f"{len(d['columns'])} columns in {', '.join(d['files'])}{_overlap_note(d)}"
        )
    print("timelines (columns with equal timestamps, compared as read):")
    seen: dict[tuple, int] = {}
    for i, t in enumerate(timelines):
        shape = (t["num_rows"], t["start_time"], t["end_time"])
        twin = ""
        if shape in seen:
            twin = f", same count and range as [{seen[shape]}] but other timestamps"
        seen.setdefault(shape, i)
        print(f"  [{i}] {t['num_rows']} rows, {_time_range(t, args)}{twin}:")
        by_device: dict[str, list[str]] = {}
        for name in t["columns"]:
            device, field = name.rsplit(".", 1)
            by_device.setdefault(device, []).append(field)
        for device, fields in by_device.items():
            print(f"      {device}: {' '.join(fields)}")
    print("columns:")
    for r in columns:
        print(
            f"  {r['name']:<40} {r['dtype']:<9} timeline={r['timeline']} rows={r['num_rows']:<9} "
            f"nulls={r.get('num_nulls')} min={r['min']} max={r['max']} mean={r['mean']}"
        )


def _convert(args: argparse.Namespace) -> int:
    from tsfile_torch.convert import input_format, read_frame, sniff_separator, write_dataframe

    tags = [t for t in args.tags.split(",") if t] if args.tags else []
    types = {}
    for item in args.types.split(",") if args.types else []:
        name, equals, kind = item.partition("=")
        if not equals:
            raise ValueError(f"--types takes COLUMN=TYPE pairs separated by commas; got {item!r}")
        types[name] = kind
    sep = {"tab": "\t", "\\t": "\t"}.get(args.sep, args.sep)
    if sep is None and input_format(args.input) == "csv":
        sep = sniff_separator(args.input)
        print(f"{args.input}: separator {sep!r}, sniffed from the header (--sep to choose)")
    df = read_frame(args.input, tags, sep=sep, lower_names=args.lower_names)
    done = write_dataframe(
        df,
        args.output,
        table=args.table,
        tags=tags,
        time=args.time,
        types=types,
        time_unit=args.time_unit,
        overwrite=args.overwrite,
        lower_names=args.lower_names,
    )
    print(done.describe())
    return 0


def _generate(args: argparse.Namespace) -> int:
    from tsfile_torch import synthetic

    spec = synthetic.DatasetSpec(args.files, args.devices, args.fields, args.rows)
    paths = synthetic.write_table_files(args.directory, spec)
    print(f"wrote {len(paths)} files to {args.directory}")
    return 0


def _manifest(args: argparse.Namespace) -> int:
    import time

    from tsfile_torch.integrity.manifest import write_manifest

    start = time.perf_counter()
    path, count, nbytes = write_manifest(args.directory)
    seconds = time.perf_counter() - start
    print(
        f"wrote {path}: {count} files, {nbytes / 2**20:.1f} MiB hashed in {seconds:.2f} s "
        f"({nbytes / 2**20 / max(seconds, 1e-9):.0f} MiB/s)"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from tsfile_torch.catalog.build import unreadable_version
    from tsfile_torch.integrity.manifest import check_manifests
    from tsfile_torch.integrity.validate import validate_sources
    from tsfile_torch.sources import expand_sources

    sources = expand_sources(args.sources)
    mode = "headers" if args.headers_only else "full"
    manifests = check_manifests(sources, force=True)  # hash afresh: this is the check
    problems = {p.name: p.reason for p in manifests.problems}
    rest = [s for s in sources if s.name not in problems]
    problems.update({p.name: p.reason for p in validate_sources(rest, mode, args.timeout)})
    for source in sources:
        name = source.name
        if args.json:
            print(
                json.dumps({"file": name, "ok": name not in problems, "reason": problems.get(name)})
            )
        elif name in problems:
            label = "UNREADABLE" if unreadable_version(problems[name]) else "DAMAGED"
            print(f"{label} {name}: {problems[name]}")
        else:
            print(f"ok      {name}")
    if not args.json:
        notes = [mode]
        if manifests.checked:
            notes.append(f"{len(manifests.checked)} against their manifest")
        if manifests.unlisted:
            notes.append(f"{len(manifests.unlisted)} not listed in their manifest")
        versions = sum(unreadable_version(r) for r in problems.values())
        found = f"{len(problems) - versions} damaged"
        if versions:
            found += f", {versions} in a format version tsfile does not read"
        print(f"{len(sources)} files checked ({', '.join(notes)}), {found}")
    return 1 if problems else 0


def _cache(args: argparse.Namespace) -> int:
    import datetime as dt
    import json

    from tsfile_torch.read import diskcache

    directory = diskcache.decoded_dir(args.cache_dir)
    if args.action == "clear":
        from tsfile_torch.options import user_cache_dir
        from tsfile_torch.read.timeline import clear_index_cache

        count, nbytes, busy = diskcache.clear(directory)
        left = f"; {busy} being created by a running fill, left" if busy else ""
        print(f"{directory}: deleted {count} entries, {nbytes / 2**20:.1f} MiB{left}")
        index_dir = args.index_cache or user_cache_dir("index")
        count, nbytes = clear_index_cache(index_dir)
        print(f"{index_dir}: deleted {count} timeline indexes, {nbytes / 2**20:.1f} MiB")
        return 0
    found = diskcache.entries(directory, details=True)
    if args.json:
        for e in found:
            print(json.dumps(e.__dict__))
        return 0
    total = sum(e.nbytes for e in found)
    print(f"{directory}: {len(found)} entries, {total / 2**20:.1f} MiB")
    for e in sorted(found, key=lambda e: -e.last_used):
        used = dt.datetime.fromtimestamp(e.last_used).isoformat(timespec="seconds")
        if e.rows is None:
            print(f"  {os.path.basename(e.path)}  {e.nbytes / 2**20:.1f} MiB  damaged")
            continue
        filled = 100 * e.filled_rows / max(e.rows, 1)
        names = ", ".join(e.sources[:3]) + (f" +{len(e.sources) - 3}" if len(e.sources) > 3 else "")
        print(
            f"  {os.path.basename(e.path)}  {e.nbytes / 2**20:.1f} MiB  {e.rows} rows x "
            f"{e.columns} columns, {filled:.0f}% filled, last used {used}  {names}"
        )
    return 0


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tsfile-torch")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        from tsfile_torch import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tsfile-torch", description="TsFile datasets for PyTorch")
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {_version()}",
        help="print the version of tsfile-torch and exit",
    )
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="what to do (COMMAND -h: its options)",
    )

    b = sub.add_parser(
        "bench",
        help="epoch-throughput benchmark beside TsFileDataFrame",
        epilog="The other benchmarks (forecasting windows, scale, start-up, peers, object "
        "storage) are scripts of a checkout of tsfile-torch: python benchmarks/windows.py | "
        "scale.py | startup.py | peers.py | remote.py (--help: their options); figures and "
        "commands: benchmarks/RESULTS.md.",
    )
    b.add_argument(
        "--data",
        help="local TsFiles to read: a path, directory or glob (default: the reference dataset, "
        "generated)",
    )
    b.add_argument("--cache-dir", help="where the reference dataset is generated")
    b.add_argument("--columns", nargs="+", help="column names or glob patterns")
    b.add_argument("--batch-size", type=int, default=8192, help="rows per batch (default: 8192)")
    b.add_argument("--rounds", type=int, help="balanced rounds (default 6, quick 1)")
    b.add_argument(
        "--backends",
        nargs="+",
        choices=["auto", "mmap", "pread"],
        default=["auto", "mmap", "pread"],
        help="read backends to time (default: all three)",
    )
    b.add_argument(
        "--workers",
        nargs="+",
        type=int,
        help="DataLoader workers (default 0 1 2)",
    )
    b.add_argument(
        "--caches",
        nargs="+",
        choices=["none", "memory", "disk"],
        default=["none", "memory"],
        help="dataset caches to time (default: none memory)",
    )
    b.add_argument(
        "--cold",
        action="store_true",
        help="evict the files from the page cache "
        "before each configuration (posix_fadvise DONTNEED)",
    )
    b.add_argument("--quick", action="store_true", help="a short run (under 30 s)")
    b.add_argument("--json", help="write one JSON record per configuration and round")
    b.add_argument("--plot", help="write a PNG bar chart (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true", help="print no progress lines")
    # the options of the benchmarks that moved (MOVED_BENCHMARKS), still parsed so that an old
    # command line gets the error naming the script, not "unrecognized arguments"
    for name in MOVED_BENCHMARKS:
        b.add_argument(f"--{name}", action="store_true", help=argparse.SUPPRESS)
    for option in ("--peer-list", "--out", "--storage-options"):
        b.add_argument(option, nargs="*", help=argparse.SUPPRESS)
    b.add_argument("--hf-shuffled", action="store_true", help=argparse.SUPPRESS)
    b.set_defaults(func=_bench)

    i = sub.add_parser(
        "inspect",
        help="devices, columns, rows, steps, nulls and statistics (metadata and time columns); "
        "a damaged file is listed as such (exit status 1) and the others shown",
    )
    i.add_argument("sources", nargs="+", help="files, directories, glob patterns or URLs")
    i.add_argument(
        "--columns",
        action="append",
        metavar="NAME",
        help="a column name or glob pattern; repeat it for more: --columns 'meters.*.load' "
        "--columns grid.north.m1.temp (default: every numeric column)",
    )
    i.add_argument("--json", action="store_true", help="print the report as one JSON object")
    i.add_argument(
        "--time-unit",
        choices=list(TIME_UNITS),
        default="ms",
        help="unit of the files' timestamps, for the dates shown beside them (default: ms)",
    )
    i.add_argument(
        "--storage-options", help="fsspec options for URL sources, JSON: '{\"anon\": true}'"
    )
    i.set_defaults(func=_inspect)

    c = sub.add_parser(
        "convert",
        help="write a CSV or Parquet file into one TsFile (a table; tags name the devices)",
    )
    c.add_argument("input", help="a .csv (also .csv.gz...) or .parquet file")
    c.add_argument("output", help="the TsFile to write")
    c.add_argument("--table", required=True, help="table name (lower case, no '.')")
    c.add_argument("--tags", help="columns naming the device, comma-separated: site,meter")
    c.add_argument(
        "--time",
        default="time",
        help="the timestamp column: integers, or datetimes / ISO-8601 strings (default: time)",
    )
    c.add_argument(
        "--types",
        help="TsFile types of fields instead of the inferred ones: temp=FLOAT,count=INT64",
    )
    c.add_argument(
        "--time-unit",
        choices=list(TIME_UNITS),
        default="ms",
        help="unit of the written timestamps; datetimes are converted to it (default: ms)",
    )
    c.add_argument(
        "--sep",
        help="CSV separator, one character: ';', '|', tab (or '\\t') (default: the one of , ; "
        "tab | that splits the header into the most columns, printed)",
    )
    c.add_argument(
        "--lower-names",
        action="store_true",
        help="lower-case the column names (and those given to --tags, --time, --types): TsFile "
        "stores names in lower case, so mixed-case names are refused without it",
    )
    c.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
    c.set_defaults(func=_convert)

    g = sub.add_parser("generate", help="write a synthetic table-model dataset")
    g.add_argument("directory", help="where the files are written (created if missing)")
    g.add_argument("--files", type=int, default=8, help="number of files (default: 8)")
    g.add_argument("--devices", type=int, default=1, help="devices per file (default: 1)")
    g.add_argument("--fields", type=int, default=8, help="fields per device (default: 8)")
    g.add_argument(
        "--rows", type=int, default=131072, help="rows per device and file (default: 131072)"
    )
    g.set_defaults(func=_generate)

    m = sub.add_parser(
        "manifest",
        help="write DIR/tsfile-torch-manifest.json: size and content hash of every TsFile under "
        "DIR, checked by datasets and `verify` before they read a file",
    )
    m.add_argument("directory", help="the directory whose TsFiles are listed")
    m.set_defaults(func=_manifest)

    v = sub.add_parser(
        "verify",
        help="check files against their manifest (if any), decode every file in a child "
        "process, and report each damaged file with the reason",
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

    k = sub.add_parser(
        "cache", help='show or empty the decoded cache of cache="disk" (clear: and the indexes)'
    )
    k.add_argument(
        "action",
        choices=["info", "clear"],
        help="info: list the entries; clear: delete them and the saved timeline indexes "
        "(entries a running fill is creating stay)",
    )
    k.add_argument(
        "--cache-dir",
        help="the datasets' cache_dir (entries in CACHE_DIR/decoded; default "
        "$XDG_CACHE_HOME/tsfile-torch/decoded)",
    )
    k.add_argument(
        "--index-cache",
        help="clear: the datasets' index_cache directory (default "
        "$XDG_CACHE_HOME/tsfile-torch/index)",
    )
    k.add_argument("--json", action="store_true", help="info: one JSON record per entry")
    k.set_defaults(func=_cache)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; a user error prints one line on stderr and returns 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the interpreter's final flush
        return 0
    except (TsFileTorchError, ValueError, TypeError, OSError) as err:
        print(f"tsfile-torch {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
