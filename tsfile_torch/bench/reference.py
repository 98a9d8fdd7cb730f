"""Epoch-throughput benchmark: tsfile-torch configurations beside TsFileDataFrame and a memcopy.

Upstream's training-style protocol, in one process run. Per round and configuration: build the
dataset and loader, run ``epochs`` sequential epochs (the first reported apart: it pays worker
start and reader opens), then ``random_batches`` random windows. Rounds alternate the order of
configurations. Every configuration's checksum must equal the memory-copy reference's, so a fast
wrong path cannot win: each batch's checksum weighs every float32 bit pattern by its row and
column inside the batch (:func:`tsfile_torch.bench.harness.checksum`), so permuted rows, swapped
columns or a shifted window change it; batches are summed, as workers legitimately interleave
them.

Epochs are timed by :func:`tsfile_torch.bench.harness.repeat` (``time.perf_counter``); ratios
to each baseline are taken pair by pair inside a round (``baseline seconds / configuration
seconds``, > 1 means faster than the baseline), then the median over rounds is reported.
"""

from __future__ import annotations

import os
import resource
import statistics
import tempfile
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch
import torch.utils.data as tud
from tqdm import tqdm

from tsfile_torch import synthetic
from tsfile_torch.bench.harness import (
    Timings,
    consume,
    environment,
    later_epochs,
    min_median,
    repeat,
)
from tsfile_torch.data.rows import TsFileIterableDataset
from tsfile_torch.loader import make_loader, worker_context
from tsfile_torch.read import diskcache
from tsfile_torch.read.reader import BatchReader
from tsfile_torch.sampling import orders
from tsfile_torch.sources import expand_sources

__all__ = [
    "BenchConfig",
    "BenchPlan",
    "default_configs",
    "run_benchmark",
    "format_table",
    "plot_results",
]


@dataclass(frozen=True)
class BenchConfig:
    """One configuration: ``kind`` is ``tsfile-torch``, ``dataframe`` or ``memcopy``."""

    kind: str
    read_backend: str = "auto"
    num_workers: int = 0
    cache: str = "none"
    use_index: bool = False
    query_workers: int | None = None
    #: ``cache="disk"`` only: empty the decoded cache before each build (the first epoch fills
    #: it); else the entry is filled before the rounds, as a later run finds it
    fresh_cache: bool = False

    @property
    def name(self) -> str:
        if self.kind == "dataframe":
            extra = f", query_workers={self.query_workers}" if self.use_index else ""
            return f"TsFileDataFrame(use_index={self.use_index}{extra})"
        if self.kind == "memcopy":
            return f"memcopy reference, workers={self.num_workers}"
        cache = self.cache + ("(empty)" if self.fresh_cache else "")
        return f"tsfile-torch {self.read_backend}, workers={self.num_workers}, cache={cache}"


@dataclass(frozen=True)
class BenchPlan:
    """What one run measures."""

    data: str
    columns: tuple[str, ...] | None = None
    batch_size: int = 8192
    rounds: int = 6
    epochs: int = 4
    random_batches: int = 32
    seed: int = 1234
    cold: bool = False


DATAFRAME_BASELINES = (
    BenchConfig("dataframe"),
    BenchConfig("dataframe", use_index=True, query_workers=1),
    BenchConfig("dataframe", use_index=True, query_workers=2),
)


def default_configs(
    backends=("auto", "mmap", "pread"), workers=(0, 1, 2), caches=("none", "memory")
) -> list[BenchConfig]:
    """Return the tsfile-torch grid, the memcopy reference per worker count, and the baselines."""
    ours = [
        BenchConfig("tsfile-torch", b, w, c, fresh_cache=fresh)
        for c in caches
        for fresh in ((True, False) if c == "disk" else (False,))
        for w in workers
        for b in backends
    ]
    copies = [BenchConfig("memcopy", num_workers=w) for w in workers]
    return [*DATAFRAME_BASELINES, *copies, *ours]


# -- measuring helpers ----------------------------------------------------------------------
def _proc_faults(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[9])  # minflt, majflt


def _proc_status_kib(pid: int, key: str) -> int:
    """Return a kiB field of ``/proc/PID/status`` (``VmHWM``: peak resident, ``VmRSS``: now)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(f"{key}:"):
                return int(line.split()[1])
    return 0


def _loader_rss_mib(loader) -> float:
    """Resident memory now of this process plus the loader's live workers, MiB."""
    pids = [os.getpid()]
    it = getattr(loader, "_iterator", None)
    pids += [w.pid for w in getattr(it, "_workers", [])]
    return round(
        sum(_proc_status_kib(p, "VmRSS") for p in pids if os.path.exists(f"/proc/{p}")) / 1024, 1
    )


def _loader_pss_mib(loader) -> tuple[float, float]:
    """Proportional set size and anonymous resident memory now of this process plus the
    loader's live workers, MiB: shared pages (a mapped decoded cache) count once in the PSS."""
    pids = [os.getpid()]
    it = getattr(loader, "_iterator", None)
    pids += [w.pid for w in getattr(it, "_workers", [])]
    pss = anon = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                    elif line.startswith("Anonymous:"):
                        anon += int(line.split()[1])
        except OSError:
            continue
    return round(pss / 1024, 1), round(anon / 1024, 1)


def _reset_hwm() -> None:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def evict_from_page_cache(paths) -> bool:
    """Drop ``paths`` from the page cache with ``posix_fadvise(DONTNEED)``; False if impossible."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def warm_page_cache(paths) -> None:
    """Read every file once so the measured epochs start from a warm page cache."""
    for path in paths:
        with open(path, "rb") as fh:
            while fh.read(1 << 22):
                pass


class _ArrayBatches(tud.IterableDataset):
    """The memcopy reference: batches sliced from an already-decoded array into new tensors.

    ``seq_starts`` / ``rand_starts``: first row of each batch of a sequential / random epoch, in
    the datasets' order; workers split them as the datasets do (:func:`orders.worker_batches`).
    """

    def __init__(
        self, array: np.ndarray, seq_starts: np.ndarray, rand_starts: np.ndarray, batch_size: int
    ):
        from multiprocessing import sharedctypes

        self.array, self.batch_size = array, batch_size
        self.seq_starts, self.rand_starts = seq_starts, rand_starts
        self._random = sharedctypes.RawValue("q", 0)

    def set_epoch(self, epoch: int) -> None:
        """Order does not depend on the epoch here."""

    def set_random_batches(self, count: int | None) -> None:
        self._random.value = 1 if count else 0

    def __iter__(self):
        info = tud.get_worker_info()
        starts = self.rand_starts if self._random.value else self.seq_starts
        if info is not None and info.num_workers > 1:  # the datasets' own worker sharding
            batches = [starts[i : i + 1] for i in range(len(starts))]
            order = "random" if self._random.value else "sequential"
            starts = starts[orders.worker_batches(batches, info.id, info.num_workers, order)]
        for s in starts:
            yield torch.from_numpy(self.array[s : s + self.batch_size].copy())


# -- one configuration ----------------------------------------------------------------------
class _Runner:
    """Builds the loaders of one configuration and times sequential and random epochs."""

    def __init__(
        self,
        plan: BenchPlan,
        paths: list[str],
        names: list[str],
        reference: np.ndarray,
        times: np.ndarray,
        dataframe_dir: str,
        rand_starts: np.ndarray,
        decoded_dir: str = "",
    ):
        self.plan, self.paths, self.names = plan, paths, names
        self.decoded_dir = decoded_dir
        self.reference, self.times, self.dataframe_dir = reference, times, dataframe_dir
        self.seq_starts = np.arange(0, reference.shape[0], plan.batch_size, dtype=np.int64)
        self.rand_starts = rand_starts

    def disk_cache_dir(self, cfg: BenchConfig) -> str | None:
        """The ``cache_dir`` of a ``cache="disk"`` configuration (emptied ones apart)."""
        if cfg.cache != "disk":
            return None
        return os.path.join(self.decoded_dir, "empty" if cfg.fresh_cache else "kept")

    def _tsfile_torch(self, cfg: BenchConfig):
        p = self.plan
        cache_dir = self.disk_cache_dir(cfg)
        if cfg.fresh_cache:
            diskcache.clear(diskcache.decoded_dir(cache_dir))
        ds = TsFileIterableDataset(
            self.paths,
            columns=list(p.columns) if p.columns else None,
            batch_size=p.batch_size,
            read_backend=cfg.read_backend,
            seed=p.seed,
            cache=cfg.cache,
            cache_dir=cache_dir,
        )
        return ds, make_loader(ds, num_workers=cfg.num_workers)

    def _memcopy(self, cfg: BenchConfig):
        ds = _ArrayBatches(self.reference, self.seq_starts, self.rand_starts, self.plan.batch_size)
        if cfg.num_workers == 0:
            return ds, ds
        return ds, tud.DataLoader(
            ds,
            batch_size=None,
            num_workers=cfg.num_workers,
            persistent_workers=True,
            multiprocessing_context=worker_context(),
        )

    def _dataframe_batches(self, frame, starts):
        n, bs = self.reference.shape[0], self.plan.batch_size
        for s in starts:
            stop = min(s + bs, n)
            part = frame.loc[int(self.times[s]) : int(self.times[stop - 1]), self.names]
            yield np.asarray(part.values, dtype=np.float32)

    def run(self, cfg: BenchConfig) -> dict:
        if self.plan.cold:
            evict_from_page_cache(self.paths)
        _reset_hwm()
        usage0 = resource.getrusage(resource.RUSAGE_SELF)
        worker_faults, worker_hwm = [0, 0], 0
        rss: list[float] = []  # after each epoch: this process + live workers
        pss: list[tuple[float, float]] = []  # (PSS, anonymous) after each epoch, same processes
        if cfg.kind == "dataframe":
            from tsfile import TsFileDataFrame

            kwargs = {"query_workers": cfg.query_workers} if cfg.use_index else {}
            frame = TsFileDataFrame(
                sorted(
                    os.path.join(self.dataframe_dir, f)
                    for f in os.listdir(self.dataframe_dir)
                    if f.endswith(".tsfile")
                ),
                show_progress=False,
                use_index=cfg.use_index,
                **kwargs,
            )
            try:
                seq = repeat(
                    lambda _: consume(self._dataframe_batches(frame, self.seq_starts)),
                    self.plan.epochs,
                )
                rnd = repeat(lambda _: consume(self._dataframe_batches(frame, self.rand_starts)), 1)
            finally:
                frame.close()
        else:
            build = self._tsfile_torch if cfg.kind == "tsfile-torch" else self._memcopy
            ds, loader = build(cfg)  # one loader: its readers and caches serve every epoch

            def epochs(random: bool) -> Timings:
                def before(epoch: int) -> None:
                    ds.set_epoch(epoch)
                    ds.set_random_batches(self.plan.random_batches if random else None)

                return repeat(
                    lambda _: consume(loader),
                    1 if random else self.plan.epochs,
                    before=before,
                    after=lambda *_: (
                        rss.append(_loader_rss_mib(loader)),
                        pss.append(_loader_pss_mib(loader)),
                    ),
                )

            seq, rnd = epochs(random=False), epochs(random=True)
            it = getattr(loader, "_iterator", None)
            for w in getattr(it, "_workers", []):  # live workers: read their /proc entries
                if os.path.exists(f"/proc/{w.pid}"):
                    minflt, majflt = _proc_faults(w.pid)
                    worker_faults[0] += minflt
                    worker_faults[1] += majflt
                    worker_hwm = max(worker_hwm, _proc_status_kib(w.pid, "VmHWM"))
            del loader, ds
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "config": cfg.name,
            **asdict(cfg),
            "seq_seconds": seq.seconds,
            "seq_checksums": [r.checksum for r in seq.results],
            "seq_rows": [r.rows for r in seq.results],
            "random_seconds": rnd.seconds[0],
            "random_checksum": rnd.results[0].checksum,
            "random_rows": rnd.results[0].rows,
            "minflt": usage1.ru_minflt - usage0.ru_minflt + worker_faults[0],
            "majflt": usage1.ru_majflt - usage0.ru_majflt + worker_faults[1],
            "peak_rss_mib": round(
                max(_proc_status_kib(os.getpid(), "VmHWM"), worker_hwm) / 1024, 1
            ),
            "rss_mib_after_epoch": rss,
            "peak_pss_mib": max((p for p, _ in pss), default=0.0),
            "peak_anon_mib": max((a for _, a in pss), default=0.0),
        }


def run_benchmark(
    plan: BenchPlan,
    configs: list[BenchConfig],
    progress: bool = True,
) -> list[dict]:
    """Run every configuration for ``plan.rounds`` balanced rounds; return one record each.

    Raises:
        RuntimeError: a configuration delivered other values than the memory-copy reference.
    """
    paths = [s.name for s in expand_sources(plan.data)]
    ds = TsFileIterableDataset(
        paths,
        columns=list(plan.columns) if plan.columns else None,
        batch_size=plan.batch_size,
        seed=plan.seed,
        random_batches=plan.random_batches,
    )
    names = ds.columns
    # the random epoch's windows (epoch 0): items of order "random" are their first rows
    rand_starts = np.concatenate(ds.epoch_batches(0))
    reader = BatchReader(ds.catalog, "pread", np.float32, cache_bytes=0)
    reference, times = reader.read(0, ds.num_rows)
    reader.close()
    with (
        tempfile.TemporaryDirectory(prefix="tsfile-torch-bench-") as frame_dir,
        tempfile.TemporaryDirectory(prefix="tsfile-torch-decoded-") as decoded_dir,
    ):
        # TsFileDataFrame(use_index=True) writes index files beside the data: give it links in a
        # scratch directory so nothing is left in the user's data folder
        for p in paths:
            os.symlink(os.path.abspath(p), os.path.join(frame_dir, os.path.basename(p)))
        runner = _Runner(plan, paths, names, reference, times, frame_dir, rand_starts, decoded_dir)
        for cfg in {c for c in configs if c.cache == "disk" and not c.fresh_cache}:
            # a later run's view: the decoded cache filled by an earlier one
            filled, _ = runner._tsfile_torch(replace(cfg, num_workers=0))
            consume(filled)
            del filled
        bs = plan.batch_size
        expected_seq = consume(reference[s : s + bs] for s in runner.seq_starts).checksum
        expected_rnd = consume(reference[s : s + bs] for s in runner.rand_starts).checksum
        records = []
        total = plan.rounds * len(configs)
        with tqdm(total=total, desc="benchmark", unit="config", disable=not progress) as bar:
            for rnd in range(plan.rounds):
                order = configs if rnd % 2 == 0 else configs[::-1]
                if not plan.cold:
                    warm_page_cache(paths)
                for cfg in order:
                    bar.set_postfix_str(cfg.name[:50])
                    rec = runner.run(cfg)
                    rec.update(
                        round=rnd,
                        batch_size=plan.batch_size,
                        columns=len(names),
                        rows=int(reference.shape[0]),
                        cold=plan.cold,
                        checksum_ok=all(c == expected_seq for c in rec["seq_checksums"])
                        and rec["random_checksum"] == expected_rnd,
                    )
                    if not rec["checksum_ok"]:
                        raise RuntimeError(
                            f"{cfg.name} delivered other values than the memory-"
                            f"copy reference (checksum mismatch, round {rnd})"
                        )
                    records.append(rec)
                    bar.update()
    _add_ratios(records, reference.nbytes)
    return records


def _add_ratios(records: list[dict], nbytes: int) -> None:
    by_round: dict[int, dict[str, dict]] = {}
    for rec in records:
        later = later_epochs(rec["seq_seconds"])
        rec["first_epoch_seconds"] = rec["seq_seconds"][0]
        rec["later_epoch_seconds"] = statistics.median(later)
        rec["later_mib_per_s"] = nbytes / (1 << 20) / rec["later_epoch_seconds"]
        rec["later_rows_per_s"] = rec["rows"] / rec["later_epoch_seconds"]
        rec["random_mib_per_s"] = (
            rec["random_rows"] * rec["columns"] * 4 / (1 << 20) / rec["random_seconds"]
        )
        by_round.setdefault(rec["round"], {})[rec["config"]] = rec
    for recs in by_round.values():
        for rec in recs.values():
            ratios = {}
            for base in recs.values():
                if base["kind"] == "tsfile-torch":
                    continue
                if base["kind"] == "memcopy" and base["num_workers"] != rec["num_workers"]:
                    continue
                key = "memcopy" if base["kind"] == "memcopy" else base["config"]
                ratios[key] = {
                    "later": base["later_epoch_seconds"] / rec["later_epoch_seconds"],
                    "first": base["first_epoch_seconds"] / rec["first_epoch_seconds"],
                    "random": base["random_seconds"] / rec["random_seconds"],
                }
            rec["speedup_vs"] = ratios


def summarize(records: list[dict]) -> list[dict]:
    """Return one row per configuration: medians and min over rounds, ratios' medians."""
    rows = []
    for name in dict.fromkeys(r["config"] for r in records):
        recs = [r for r in records if r["config"] == name]
        later = [s for r in recs for s in later_epochs(r["seq_seconds"])]
        later_min, later_median = min_median(later)
        first = [r["first_epoch_seconds"] for r in recs]
        rand = [r["random_seconds"] for r in recs]
        row = {
            "config": name,
            "kind": recs[0]["kind"],
            "num_workers": recs[0]["num_workers"],
            "first_median": statistics.median(first),
            "later_min": later_min,
            "later_median": later_median,
            "random_median": statistics.median(rand),
            "rows_per_s": recs[0]["rows"] / later_median,
            "mib_per_s": statistics.median(r["later_mib_per_s"] for r in recs),
            "mib_per_s_min": min(r["later_mib_per_s"] for r in recs),
            "mib_per_s_max": max(r["later_mib_per_s"] for r in recs),
            "minflt": statistics.median(r["minflt"] for r in recs),
            "majflt": statistics.median(r["majflt"] for r in recs),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in recs),
            "peak_pss_mib": max(r.get("peak_pss_mib", 0.0) for r in recs),
            "peak_anon_mib": max(r.get("peak_anon_mib", 0.0) for r in recs),
            "speedup": {},
            "rss_growth_pct": max(_growth(r) for r in recs),
        }
        for key in recs[0]["speedup_vs"]:
            row["speedup"][key] = {
                part: statistics.median(r["speedup_vs"][key][part] for r in recs)
                for part in ("later", "first", "random")
            }
        rows.append(row)
    return rows


def _growth(rec: dict) -> float:
    """RSS after the last sequential epoch relative to after the second, in percent."""
    rss = rec.get("rss_mib_after_epoch") or []
    seq = rss[: len(rec["seq_seconds"])]
    if len(seq) < 2 or not seq[1]:
        return 0.0
    return 100.0 * (seq[-1] / seq[1] - 1.0)


def format_table(records: list[dict]) -> str:
    """Return a plain-text table of the run."""
    summary = summarize(records)
    base = [
        k
        for k in (
            "TsFileDataFrame(use_index=False)",
            "TsFileDataFrame(use_index=True, query_workers=2)",
            "memcopy",
        )
    ]
    head = (
        f"{'configuration':<46} {'1st s':>6} {'later s min/med':>16} {'rand s':>7} "
        f"{'rows/s':>10} {'MiB/s':>7} {'minflt':>8} {'RSS MiB':>8} {'PSS MiB':>8} {'RSS+%':>6}  "
        f"x DF seq/rand | x DF(idx,2) seq/rand | % memcopy"
    )
    lines = [head, "-" * len(head)]
    for row in summary:
        sp = row["speedup"]
        cells = []
        for key in base[:2]:
            s = sp.get(key)
            cells.append(f"{s['later']:5.2f} / {s['random']:5.2f}" if s else " " * 13)
        mc = sp.get("memcopy")
        pct = f"{100 * mc['later']:6.1f}%" if mc else ""
        lines.append(
            f"{row['config']:<46} {row['first_median']:6.3f} {row['later_min']:7.3f} /"
            f"{row['later_median']:7.3f} {row['random_median']:7.3f} {row['rows_per_s']:10,.0f} "
            f"{row['mib_per_s']:7.1f} {row['minflt']:8.0f} {row['peak_rss_mib']:8.1f} "
            f"{row['peak_pss_mib']:8.1f} "
            f"{row['rss_growth_pct'] or 0:6.1f}  "
            f"{cells[0]:>13} | {cells[1]:>20} | {pct}"
        )
    return "\n".join(lines)


def plot_results(records: list[dict], path: str) -> None:
    """Write bars of median later-epoch MiB/s with min-max whiskers per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize(records)
    names = [r["config"] for r in summary]
    med = np.array([r["mib_per_s"] for r in summary])
    err = np.array(
        [
            [m - r["mib_per_s_min"] for m, r in zip(med, summary, strict=True)],
            [r["mib_per_s_max"] - m for m, r in zip(med, summary, strict=True)],
        ]
    )
    colors = {"dataframe": "#999999", "memcopy": "#4c72b0", "tsfile-torch": "#dd8452"}
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(names) + 1.5))
    ax.barh(range(len(names)), med, xerr=err, color=[colors[r["kind"]] for r in summary], capsize=3)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("MiB/s of float32 output, sequential epochs after the first (median, min-max)")
    env = records[0].get("environment") or environment()  # records read back carry theirs
    ax.set_title(
        f"tsfile-torch epoch throughput: {records[0]['rows']:,} rows x "
        f"{records[0]['columns']} columns, batch {records[0]['batch_size']}, "
        f"{'cold' if records[0]['cold'] else 'warm'} cache, {env['cpus']} CPUs",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def reference_data(cache_dir: str | None = None) -> str:
    """Return a directory holding the reference dataset, writing it on first use."""
    root = cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "tsfile-torch")
    path = os.path.join(root, "reference")
    synthetic.write_reference(path)
    return path
