"""Forecasting-window benchmark: ``python benchmarks/windows.py [--quick] [--json OUT]``.

On a generated panel (devices with their own timestamps, every series split across files) it
times one shuffled epoch of all windows (``context_length`` + ``horizon`` rows, ``stride``,
``batch_size`` windows per batch) through:
- tsfile-torch streaming: a dataset with ``shuffle=True`` (windows shuffled within a buffer of
  ``blocks_per_shuffle`` blocks) through :func:`~tsfile_torch.make_loader`, with a block cache
  that holds only the blocks in play, 0 and 2 workers;
- tsfile-torch disk cache: ``cache="disk"`` in the streaming shuffled order, the second epoch
  (the first fills the entry), then a new dataset over the filled entry (a later run), 0 and 2
  workers (``first_epoch_seconds`` holds each one's first epoch);
- tsfile-torch cached: ``cache="memory"`` and ``order="batches"`` (a full permutation of the
  windows, what a plain ``RandomSampler`` gives), the second epoch (the first decodes), 0 and 2
  workers;
- one sequential streaming epoch (windows in order) over the same rows, the cost floor;
- TsFileDataFrame, the official route: one ``.loc`` per window, over the first
  ``dataframe_windows`` windows of the shuffled order, scaled to the epoch (it is too slow to run
  whole);
- an in-memory numpy reference: the same shuffled batches gathered from preloaded arrays.
Every route's checksum must equal the reference's over the same windows: the sum over windows of
each window's position-aware checksum (:func:`tsfile_torch.bench.harness.checksum` with
``per_item``), so a window's time steps and fields must be in place while the order of windows,
which depends on the sampler, does not matter. Epochs are timed by
:func:`tsfile_torch.bench.harness.repeat` (``time.perf_counter``); ratios are taken within the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.utils.data as tud

from tsfile_torch import synthetic
from tsfile_torch.bench.harness import Consumed, Timings, consume, repeat, write_json
from tsfile_torch.data.handover import as_tensor, batch_array
from tsfile_torch.data.windows import TsFileWindowDataset, WindowBatch, collate_windows
from tsfile_torch.loader import make_loader, worker_context
from tsfile_torch.read import diskcache

__all__ = ["QUICK_WINDOWS", "WindowBenchPlan", "format_window_table", "run_window_benchmark"]


@dataclass(frozen=True)
class WindowBenchPlan:
    """What one window benchmark run measures."""

    data: str | None = None  # a panel directory; None: generate one under cache_dir
    cache_dir: str | None = None
    num_devices: int = 64
    num_fields: int = 8
    num_rows: int = 200_000
    num_files: int = 4
    context_length: int = 96
    horizon: int = 24
    stride: int = 24
    batch_size: int = 256
    workers: tuple[int, ...] = (0, 2)
    blocks_per_shuffle: int = 16
    dataframe_windows: int = 512
    seed: int = 0


#: Time features of the dict-item route.
DICT_TIME_FEATURES = ("hour_of_day", "day_of_week", "day_of_year")

#: A run of a few seconds for tests and smoke checks.
QUICK_WINDOWS = WindowBenchPlan(
    num_devices=8, num_fields=4, num_rows=12_000, num_files=2, workers=(0,), dataframe_windows=32
)


def panel_paths(plan: WindowBenchPlan) -> list[str]:
    """Return the panel's files, generating them (once, with a marker) if needed."""
    if plan.data is not None:
        return sorted(
            os.path.join(plan.data, f) for f in os.listdir(plan.data) if f.endswith(".tsfile")
        )
    name = f"panel-{plan.num_devices}x{plan.num_fields}x{plan.num_rows}-{plan.num_files}"
    directory = os.path.join(plan.cache_dir or tempfile.gettempdir(), f"tsfile-torch-{name}")
    marker = os.path.join(directory, ".complete")
    if not os.path.exists(marker):
        synthetic.write_panel(
            directory, plan.num_devices, plan.num_fields, plan.num_rows, plan.num_files
        )
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(f"{plan}\n")
    return panel_paths(WindowBenchPlan(data=directory))


def _dataset(plan: WindowBenchPlan, paths, **kwargs) -> TsFileWindowDataset:
    return TsFileWindowDataset(
        paths, plan.context_length, plan.horizon, plan.stride, read_backend="auto", **kwargs
    )


def _epoch(batches, warmup: int = 0, before=None) -> tuple[Timings, Consumed]:
    """Time one epoch of ``(x, y)`` batches after ``warmup`` ones; return it and what it read."""
    timings = repeat(lambda _: consume(batches, per_item=True), 1, warmup=warmup, before=before)
    return timings, timings.results[0]


def _loader(ds, plan: WindowBenchPlan, workers: int, **kwargs) -> tud.DataLoader:
    extra = {}
    if workers:
        extra = {"persistent_workers": True, "multiprocessing_context": worker_context()}
    return tud.DataLoader(ds, num_workers=workers, **kwargs, **extra)


def run_window_benchmark(plan: WindowBenchPlan, progress: bool = False) -> list[dict]:
    """Run every route once; return one record per route (seconds, windows/s, checksum ok)."""
    paths = panel_paths(plan)
    stream = _dataset(plan, paths)
    block_bytes = stream.block_rows * (len(stream.fields) * 4 + 8)
    # streaming: the LRU holds the blocks in play (a group, its neighbours), not the panel
    cache_bytes = (plan.blocks_per_shuffle + 4) * block_bytes
    stream = _dataset(plan, paths, cache_bytes=cache_bytes)
    num_windows = len(stream)
    order = np.random.default_rng(plan.seed).permutation(num_windows)
    bs = plan.batch_size

    # in-memory numpy reference: every device preloaded into one array, one gather per batch
    parts, stream_times = [], []
    for k, table in enumerate(stream.tables):
        values, times = stream.core.rows(k, 0, table.num_rows)
        parts.append(values.copy())
        stream_times.append(times.copy())
    stream.close()
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
    panel = np.concatenate(parts)
    del parts
    located = stream.index.locate(np.arange(num_windows))
    global_rows = offsets[located[0]] + located[1]
    steps = np.arange(plan.context_length + plan.horizon)
    c = plan.context_length

    def reference_batches(indices):
        return panel[global_rows[indices, None] + steps]

    def reference_epoch():
        for s in range(0, num_windows, bs):
            batch = reference_batches(order[s : s + bs])
            yield torch.from_numpy(batch[:, :c]), torch.from_numpy(batch[:, c:])

    records: list[dict] = []

    def add(route, seconds, windows, checksum_ok, extra=None):
        rec = {"route": route, "seconds": seconds, "windows": windows, "checksum_ok": checksum_ok}
        records.append({**rec, **(extra or {})})
        if progress:
            print(f"{route}: {seconds:.3f} s", flush=True)

    timings, read = _epoch(reference_epoch())
    expected = read.checksum
    add("in-memory numpy reference", timings.seconds[0], read.rows, True)

    # the same reference served through DataLoader workers (what workers cost by themselves)
    reference = _ReferenceWindows(panel, global_rows, steps, c)
    batches = [order[s : s + bs].tolist() for s in range(0, num_windows, bs)]
    for workers in [w for w in plan.workers if w]:
        loader = _loader(
            reference, plan, workers, batch_sampler=batches, collate_fn=collate_windows
        )
        timings, read = _epoch(loader, warmup=1)  # the first pays worker start-up
        route = f"in-memory numpy reference, workers={workers}"
        add(route, timings.seconds[0], read.rows, read.checksum == expected)
        del loader

    # one sequential streaming epoch over the same windows (the cost floor of streaming)
    timings, read = _epoch(make_loader(stream, batch_size=bs))
    route = "tsfile-torch sequential streaming, workers=0"
    add(route, timings.seconds[0], read.rows, read.checksum == expected)
    stream.close()

    def timed(ds, route: str, workers: int, wrap=None) -> dict:
        """Time the second epoch of ``ds`` (the first pays worker start-up, decodes, fills)."""
        loader = make_loader(ds, batch_size=bs, num_workers=workers)
        batches = wrap(loader) if wrap is not None else loader
        timings, read = _epoch(batches, warmup=1, before=ds.set_epoch)
        add(
            route,
            timings.seconds[0],
            read.rows,
            read.checksum == expected,
            extra={"first_epoch_seconds": timings.warmup_seconds[0]},
        )
        del loader
        ds.close()
        return records[-1]

    shuffle = {"shuffle": True, "seed": plan.seed, "shuffle_blocks": plan.blocks_per_shuffle}
    shuffled = _dataset(plan, paths, cache_bytes=cache_bytes, **shuffle)
    tuple_seconds = {}
    for workers in plan.workers:
        route = f"tsfile-torch streaming shuffled, workers={workers}"
        tuple_seconds[workers] = timed(shuffled, route, workers)["seconds"]

    # the same shuffled windows as dict items: observed masks, times, device ids, tag codes and
    # time features built per batch; checksummed on past / future values
    # the same blocks in play: a block also keeps its rows' time features (float32 each)
    feature_bytes = stream.block_rows * 4 * len(DICT_TIME_FEATURES)
    dicts = _dataset(
        plan,
        paths,
        cache_bytes=cache_bytes + (plan.blocks_per_shuffle + 4) * feature_bytes,
        **shuffle,
        return_dict=True,
        time_features=list(DICT_TIME_FEATURES),
    )
    for workers in plan.workers:
        route = f"tsfile-torch shuffled dict items, workers={workers}"
        rec = timed(dicts, route, workers, wrap=_DictValues)
        rec["x_tuple_route"] = rec["seconds"] / tuple_seconds[workers]

    cached = _dataset(plan, paths, cache="memory", order="batches", seed=plan.seed)
    for workers in plan.workers:
        timed(cached, f"tsfile-torch cached (memory), workers={workers}", workers)

    # the decoded disk cache in the streaming shuffled order: a first run fills the entry in
    # its first epoch, a later run (a new dataset) starts on the filled entry
    with tempfile.TemporaryDirectory(prefix="tsfile-torch-decoded-") as decoded:
        for workers in plan.workers:
            for run in ("first run", "later run"):
                disk = _dataset(plan, paths, cache="disk", cache_dir=decoded, **shuffle)
                timed(disk, f"tsfile-torch disk shuffled, {run}, workers={workers}", workers)
            diskcache.clear(diskcache.decoded_dir(decoded))

    # TsFileDataFrame: one .loc per window, the first windows of the shuffled order, scaled
    from tsfile import TsFileDataFrame

    sample = order[: plan.dataframe_windows]
    frame = TsFileDataFrame(paths, show_progress=False)

    def frame_windows():
        for i in sample:
            k, row = int(located[0][i]), int(located[1][i])
            device = stream.devices[k]
            t_first = int(stream_times[k][row])
            t_last = int(stream_times[k][row + len(steps) - 1])
            names = [f"{device}.{f}" for f in stream.fields]
            window = np.asarray(frame.loc[t_first:t_last, names].values, dtype=np.float32)
            yield window[None, :c], window[None, c:]

    try:
        timings, read = _epoch(frame_windows())
    finally:
        frame.close()
    sample_batches = (reference_batches(sample[s : s + bs]) for s in range(0, len(sample), bs))
    want = consume(((b[:, :c], b[:, c:]) for b in sample_batches), per_item=True).checksum
    seconds = timings.seconds[0]
    add(
        "TsFileDataFrame windows one by one (scaled)",
        seconds * num_windows / len(sample),
        num_windows,
        read.checksum == want,
        extra={"measured_windows": len(sample), "measured_seconds": seconds},
    )
    return _with_ratios(records, plan)


class _DictValues:
    """A loader of dict batches seen as ``(past_values, future_values)`` batches, every pass.

    The other tensors (masks, times, features, ids) are built with each batch; they are not
    summed here (a reduction over a strided view would time torch, not the reading).
    """

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        for batch in self.loader:
            yield batch["past_values"], batch["future_values"]


class _ReferenceWindows(tud.Dataset):
    """Windows gathered from one preloaded array: the in-memory reference, as a dataset."""

    def __init__(self, panel, global_rows, steps, context_length):
        self.panel, self.global_rows = panel, global_rows
        self.steps, self.c = steps, context_length

    def __len__(self) -> int:
        return len(self.global_rows)

    def __getitems__(self, indices):
        shape = (len(indices), len(self.steps), self.panel.shape[1])
        out = batch_array(shape, self.panel.dtype)
        np.take(self.panel, self.global_rows[np.asarray(indices), None] + self.steps, 0, out=out)
        return WindowBatch((as_tensor(out[:, : self.c]), as_tensor(out[:, self.c :])))


def _with_ratios(records: list[dict], plan: WindowBenchPlan) -> list[dict]:
    by = {r["route"]: r for r in records}
    frame = by["TsFileDataFrame windows one by one (scaled)"]["seconds"]
    seq = by["tsfile-torch sequential streaming, workers=0"]["seconds"]
    for r in records:
        workers = r["route"].rsplit("workers=", 1)[1] if "workers=" in r["route"] else "0"
        ref = by.get(
            f"in-memory numpy reference, workers={workers}", by["in-memory numpy reference"]
        )
        r["windows_per_s"] = r["windows"] / r["seconds"]
        r["x_dataframe"] = frame / r["seconds"]
        r["of_reference"] = ref["seconds"] / r["seconds"]
        r["x_sequential_cost"] = r["seconds"] / seq
        r["plan"] = asdict(plan)
    return records


def format_window_table(records: list[dict]) -> str:
    """Return a text table: seconds, windows/s and the ratios the targets are stated in.

    ``x frame``: TsFileDataFrame seconds / route seconds; ``of ref``: the in-memory reference's
    seconds (with the same number of workers) / route seconds; ``x seq``: route seconds / one
    sequential streaming epoch's seconds (workers=0).
    """
    head = (
        f"{'route':<48} {'s/epoch':>9} {'windows/s':>11} {'x frame':>8} {'of ref':>7} "
        f"{'x seq':>6}  checksum"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(
            f"{r['route']:<48} {r['seconds']:>9.3f} {r['windows_per_s']:>11,.0f} "
            f"{r['x_dataframe']:>8.1f} {r['of_reference']:>7.2f} {r['x_sequential_cost']:>6.2f}  "
            f"{'ok' if r['checksum_ok'] else 'MISMATCH'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from the command line; exit status 1 if a checksum did not match."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", help="a panel directory (default: one generated under --cache-dir, once)"
    )
    parser.add_argument("--cache-dir", help="where the panel is generated (default: temporary)")
    parser.add_argument(
        "--quick", action="store_true", help="8 devices x 4 fields x 12,000 rows: seconds"
    )
    parser.add_argument("--workers", nargs="+", type=int, help="DataLoader workers (default 0 2)")
    parser.add_argument("--json", help="append one JSON record per route to this file")
    parser.add_argument("--no-progress", action="store_true", help="print no progress lines")
    args = parser.parse_args(argv)
    plan = QUICK_WINDOWS if args.quick else WindowBenchPlan()
    plan = replace(plan, data=args.data, cache_dir=args.cache_dir)
    if args.workers:
        plan = replace(plan, workers=tuple(args.workers))
    records = run_window_benchmark(plan, progress=not args.no_progress)
    print(format_window_table(records))
    if args.json:
        write_json(records, args.json, append=True)
        print(f"wrote {len(records)} records to {args.json}")
    return 0 if all(r["checksum_ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
