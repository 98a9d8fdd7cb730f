"""Remote-source benchmark: epochs over URL sources (fetch included) beside the same files local.

    python benchmarks/remote.py s3://bucket/prefix/ [--storage-options JSON] [--workers 0 2]

Per round and worker count, three configurations read the same bytes, one after the other:

- ``remote, empty cache``: a dataset on the URL with a new, empty ``cache_dir``: its first epoch
  pays the download of every file (the catalog's metadata range reads are timed apart, as
  ``build``), later epochs read the local copies through readers kept open;
- ``remote, warm cache``: a second dataset on the URL and the same ``cache_dir``: nothing to
  fetch (build lists the objects; metadata is read from the copies);
- ``local copies``: a dataset on the paths of those local copies, no URL involved.

Every epoch's checksum (:func:`tsfile_torch.bench.harness.checksum`) must be equal across all
three. Epochs are timed by :func:`tsfile_torch.bench.harness.repeat`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from tsfile_torch.bench.harness import (
    Timings,
    consume,
    finish,
    later_epochs,
    min_median,
    repeat,
)
from tsfile_torch.data.rows import TsFileIterableDataset
from tsfile_torch.loader import make_loader
from tsfile_torch.sources.remote import RemoteFile

__all__ = ["format_remote_table", "main", "run_remote_benchmark"]


def _epochs(ds, num_workers: int, epochs: int) -> Timings:
    loader = make_loader(ds, num_workers=num_workers)
    return repeat(lambda _: consume(loader), epochs, before=ds.set_epoch)


def _local_copies(files: list) -> list[str]:
    """Return the local paths of ``files`` (sources; a remote file's cached copy)."""
    local = [f.cache_path if isinstance(f, RemoteFile) else f.name for f in files]
    if not all(os.path.exists(p) for p in local):
        raise RuntimeError("the local copies were evicted during the run; raise cache_limit")
    return local


def run_remote_benchmark(
    url: str,
    storage_options: dict | None = None,
    columns: list[str] | None = None,
    batch_size: int = 8192,
    workers: tuple[int, ...] = (0,),
    epochs: int = 3,
    rounds: int = 3,
    read_backend: str = "auto",
) -> list[dict]:
    """Time epochs over ``url`` (fetch included) and over the same files local; one record each.

    Raises:
        RuntimeError: a configuration delivered other values than the first one.
    """
    records: list[dict] = []
    expected = None
    common = {"columns": columns, "batch_size": batch_size, "read_backend": read_backend}
    for rnd in range(rounds):
        for num_workers in workers:
            with tempfile.TemporaryDirectory(prefix="tsfile-torch-remote-bench-") as cache:
                remote = {"storage_options": storage_options, "cache_dir": cache}
                runs, files = [], []
                for name in ("remote, empty cache", "remote, warm cache", "local copies"):
                    if name == "local copies":
                        sources, extra = _local_copies(files), {}
                    else:
                        sources, extra = url, remote
                    start = time.perf_counter()
                    ds = TsFileIterableDataset(sources, **common, **extra)
                    build = time.perf_counter() - start
                    if not files:
                        files = [f.source for f in ds.catalog.files]
                        nbytes = sum(f.nbytes for f in ds.catalog.files)
                    runs.append((name, build, _epochs(ds, num_workers, epochs)))
                    ds.close()
            for name, build, timings in runs:
                sums = [r.checksum for r in timings.results]
                expected = sums[0] if expected is None else expected
                if any(c != expected for c in sums):
                    raise RuntimeError(f"{name} delivered other values (checksum mismatch)")
                records.append(
                    {
                        "config": f"{name}, workers={num_workers}",
                        "source": url,
                        "round": rnd,
                        "num_workers": num_workers,
                        "read_backend": read_backend,
                        "build_seconds": build,
                        "epoch_seconds": timings.seconds,
                        "rows": timings.results[-1].rows,
                        "files": len(files),
                        "nbytes": nbytes,
                        "batch_size": batch_size,
                        "checksum_ok": True,
                    }
                )
    return records


def format_remote_table(records: list[dict]) -> str:
    """Return medians over rounds: build, first epoch, later epochs (min / median)."""
    names = list(dict.fromkeys(r["config"] for r in records))
    head = (
        f"{'configuration':<36} {'build s':>8} {'1st epoch s':>12} {'later s min/med':>16} "
        f"{'later MB/s':>10}"
    )
    lines = [head, "-" * len(head)]
    for name in names:
        rs = [r for r in records if r["config"] == name]
        later_min, later_median = min_median(
            s for r in rs for s in later_epochs(r["epoch_seconds"])
        )
        nbytes = rs[0]["nbytes"]
        lines.append(
            f"{name:<36} {statistics.median(r['build_seconds'] for r in rs):8.3f} "
            f"{statistics.median(r['epoch_seconds'][0] for r in rs):12.3f} "
            f"{later_min:7.3f} /{later_median:7.3f} "
            f"{nbytes / later_median / 1e6:10.0f}"
        )
    first = records[0]
    lines.append(
        f"({first['files']} files, {first['nbytes'] / 1e6:.1f} MB of TsFile, {first['rows']:,} "
        f"rows per epoch, {len({r['round'] for r in records})} rounds; MB/s = file bytes / s)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from the command line and print its table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="TsFiles under a URL: s3://bucket/prefix/ (fsspec)")
    parser.add_argument(
        "--storage-options",
        type=json.loads,
        help='fsspec options, JSON: \'{"endpoint_url": "http://..."}\'',
    )
    parser.add_argument("--columns", nargs="+", help="column names or glob patterns")
    parser.add_argument("--batch-size", type=int, default=8192, help="rows per batch")
    parser.add_argument("--workers", nargs="+", type=int, default=[0], help="default: 0")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 epochs")
    parser.add_argument(
        "--backend", choices=["auto", "mmap", "pread"], default="auto", help="default: auto"
    )
    parser.add_argument("--json", help="write one JSON record per configuration and round")
    args = parser.parse_args(argv)
    records = run_remote_benchmark(
        args.url,
        args.storage_options,
        columns=args.columns,
        batch_size=args.batch_size,
        workers=tuple(args.workers),
        epochs=2 if args.quick else 3,
        rounds=args.rounds or (1 if args.quick else 3),
        read_backend=args.backend,
    )
    return finish(format_remote_table(records), records, args.json)


if __name__ == "__main__":
    sys.exit(main())
