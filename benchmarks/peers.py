"""Peers benchmark: the loaders a user would pick instead (``python benchmarks/peers.py``).

The same matrix (every selected column of the TsFiles, float32), the same batches
(``batch_size`` consecutive rows) through:

- **tsfile-torch** :func:`~tsfile_torch.make_loader` over a :class:`TsFileIterableDataset`:
  streaming (``cache="none"``), ``cache="memory"`` and ``cache="disk"`` (its entry filled
  before the rounds, as a later run finds it; the filling epoch is reported as its conversion);
  shuffled = ``shuffle=True`` (rows mixed within a buffer of blocks);
- **numpy**: the matrix held in memory, each batch a copy of its rows; shuffled: a full row
  permutation, each batch a gather;
- **parquet**: one Parquet file written by pyarrow, one row group per batch; shuffled: row
  groups in a permuted order, rows permuted inside each;
- **litdata** (``litdata.optimize``, ``StreamingDataset`` / ``StreamingDataLoader``) and
  **streaming** (MosaicML ``MDSWriter`` / ``StreamingDataset``): one sample per
  ``batch_size``-row block, two blocks per chunk / shard so workers split them; shuffled: each
  library's own shuffle (of whole blocks);
- **hf-datasets**: ``datasets.Dataset`` saved to disk (Arrow, memory-mapped back by
  ``load_from_disk``), 64 float32 columns, batches sliced ``ds[a:b]`` in numpy format (the
  fast way: a ``DataLoader(ds, batch_size=...)`` fetches rows one by one); shuffled:
  ``ds.shuffle(seed)``, then the same slices, run only with ``hf_shuffled`` (``--hf-shuffled``):
  each slice gathers its rows through the indices mapping, seconds per batch, minutes an
  epoch at the reference size; by default one such batch is timed and the epoch estimated.

numpy, parquet and hf-datasets batches go through the same small iterable dataset, which gives
a worker every ``num_workers``-th batch; every peer runs with 0 and 2 DataLoader workers
(persistent). A peer that cannot be imported is skipped with one line saying how to install it
(``pip install -r benchmarks/requirements.txt``).

Conversion: the TsFiles are read once through tsfile's own ``tsfile.to_dataframe`` into the
matrix (timed once, its values checked against tsfile-torch's reader); each peer's writer then
writes it (timed once); a peer's conversion cost is the read plus its write.

Per round (``rounds``, configurations in alternating order): build the loader (timed), then
``epochs`` epochs: the first, and the later ones (their median). Every epoch counts its rows and
checksums every batch (:func:`tsfile_torch.bench.harness.checksum`): sequential epochs by
position inside each batch, against the reference's batches; shuffled ones row by row
(``per_item``: which rows, whatever their order), against all rows of the reference. The checks
run between batches off the clock (``time.perf_counter`` stops while a batch is checked), as a
training step would: workers keep reading meanwhile. A peer that delivers other rows is kept in
the records with ``rows_ok`` / ``checksum_ok`` false and marked in the table.

Every figure is reported as a ratio to tsfile-torch's sequential streaming later epoch with 0
workers measured in the same round (``x stream0``, < 1 is faster), median over the rounds;
conversions against that epoch's median. Absolute seconds are printed beside.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing import sharedctypes

import numpy as np
import torch
import torch.utils.data as tud
from tqdm import tqdm

from tsfile_torch.bench.harness import (
    MODULUS,
    checksum,
    environment,
    later_epochs,
    write_json,
)
from tsfile_torch.bench.reference import reference_data
from tsfile_torch.data.rows import TsFileIterableDataset
from tsfile_torch.loader import make_loader, worker_context
from tsfile_torch.sources import expand_sources

__all__ = [
    "PEERS",
    "PeerPlan",
    "available_peers",
    "format_peer_table",
    "plot_peers",
    "run_peer_benchmark",
    "write_peer_results",
]

#: How to install every peer at once (from a checkout).
_ALL_PEERS = "pip install -r benchmarks/requirements.txt"
#: Peers by name: the module each needs and how to install it.
PEERS = {
    "tsfile-torch": (None, ""),
    "numpy": (None, ""),
    "parquet": ("pyarrow.parquet", f"pip install pyarrow  (or {_ALL_PEERS})"),
    "litdata": ("litdata", f"pip install litdata==0.2.76  (or {_ALL_PEERS})"),
    "streaming": ("streaming", f"pip install mosaicml-streaming==0.13.0  (or {_ALL_PEERS})"),
    "hf-datasets": ("datasets", f"pip install datasets==5.2.0  (or {_ALL_PEERS})"),
}
#: Orders every peer runs.
ORDERS = ("sequential", "shuffled")
#: The configuration every figure is a ratio to.
BASELINE = "tsfile-torch streaming, sequential, workers=0"
#: Blocks per LitData chunk / MDS shard: several chunks, so that workers split them.
BLOCKS_PER_CHUNK = 2


@dataclass(frozen=True)
class PeerPlan:
    """What one peers run measures."""

    data: str
    batch_size: int = 8192
    rounds: int = 3
    epochs: int = 3
    workers: tuple[int, ...] = (0, 2)
    peers: tuple[str, ...] = tuple(PEERS)
    seed: int = 1234
    hf_shuffled: bool = False

    def __post_init__(self):
        unknown = [p for p in self.peers if p not in PEERS]
        if unknown:
            raise ValueError(f"peers must be among {', '.join(PEERS)}; got {', '.join(unknown)}")
        if "tsfile-torch" not in self.peers or 0 not in self.workers:
            raise ValueError(
                "peers must include 'tsfile-torch' and workers 0: every figure is a ratio to "
                f"{BASELINE!r}"
            )
        if self.epochs < 2 or self.rounds < 1:
            raise ValueError(
                f"epochs must be >= 2 (a first and a later one) and rounds >= 1; got "
                f"epochs={self.epochs}, rounds={self.rounds}"
            )


def available_peers(names: Iterable[str]) -> tuple[list[str], dict[str, str]]:
    """Return the peers among ``names`` that import here, and a line for each that does not."""
    found, skipped = [], {}
    for name in names:
        module, hint = PEERS[name]
        if module is None:
            found.append(name)
            continue
        try:
            importlib.import_module(module)
        except Exception as err:  # noqa: BLE001 - any import failure means "not usable here"
            skipped[name] = f"{type(err).__name__}: {err}; install it with: {hint}"
        else:
            found.append(name)
    return found, skipped


# -- the matrix, read through tsfile's own API ----------------------------------------------
def read_with_tsfile(paths: list[str], columns: list, names: list[str]) -> np.ndarray:
    """Return the matrix of ``columns`` read by ``tsfile.to_dataframe``, one file at a time."""
    import tsfile

    matrix = np.empty((columns[0].num_values, len(columns)), dtype=np.float32)
    by_file: dict[int, list[tuple[int, object]]] = {}
    for j, col in enumerate(columns):
        for shard in col.shards:
            by_file.setdefault(shard.file_index, []).append((j, shard))
    for index, shards in sorted(by_file.items()):
        frame = tsfile.to_dataframe(paths[index])
        tags = [c for c in frame.columns if c != "time" and frame[c].dtype == object]
        for j, shard in shards:
            part = frame
            for tag, value in zip(tags, shard.device[1:], strict=False):
                part = part[part[tag] == value]
            part = part.sort_values("time")
            values = part[shard.measurement].to_numpy(dtype=np.float64, na_value=np.nan)
            matrix[shard.start_row : shard.start_row + len(values), j] = values
    return matrix


# -- batches of the in-process peers --------------------------------------------------------
class _Batches(tud.IterableDataset):
    """Batches ``read(i)`` for ``i`` in an epoch's order; worker ``w`` takes every n-th one.

    ``order(epoch)`` returns the batch numbers of an epoch; the epoch is set in the main process
    (shared memory, so persistent workers see it) before each pass.
    """

    def __init__(self, reader, num_batches: int):
        self.reader, self.num_batches = reader, num_batches
        self._epoch = sharedctypes.RawValue("q", 0)

    def set_epoch(self, epoch: int) -> None:
        self._epoch.value = epoch

    def __iter__(self):
        info = tud.get_worker_info()
        epoch = self._epoch.value
        order = self.reader.order(epoch)
        if info is not None:
            order = order[info.id :: info.num_workers]
        for i in order:
            yield torch.from_numpy(self.reader.read(int(i), epoch))


class _NumpyReader:
    def __init__(self, matrix: np.ndarray, batch_size: int, shuffled: bool, seed: int):
        self.matrix, self.bs, self.shuffled, self.seed = matrix, batch_size, shuffled, seed
        self.num_batches = -(-matrix.shape[0] // batch_size)
        self._perm: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        return np.arange(self.num_batches)

    def read(self, i: int, epoch: int) -> np.ndarray:
        if not self.shuffled:
            return self.matrix[i * self.bs : (i + 1) * self.bs].copy()
        if self._perm is None or self._perm[0] != epoch:
            rng = np.random.default_rng((self.seed, epoch))
            self._perm = (epoch, rng.permutation(self.matrix.shape[0]))
        return self.matrix[self._perm[1][i * self.bs : (i + 1) * self.bs]]


class _ParquetReader:
    def __init__(self, path: str, num_batches: int, shuffled: bool, seed: int):
        self.path, self.num_batches, self.shuffled, self.seed = path, num_batches, shuffled, seed
        self._file = None
        self._pid = -1

    def __getstate__(self):
        return {**self.__dict__, "_file": None, "_pid": -1}

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffled:
            return np.arange(self.num_batches)
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_batches)

    def read(self, i: int, epoch: int) -> np.ndarray:
        import pyarrow.parquet as pq

        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = pq.ParquetFile(self.path, memory_map=True), os.getpid()
        table = self._file.read_row_group(i)
        batch = np.column_stack([c.to_numpy() for c in table.columns])
        if self.shuffled:
            batch = batch[np.random.default_rng((self.seed, epoch, i)).permutation(len(batch))]
        return batch


class _HFReader:
    def __init__(self, directory: str, bs: int, num_rows: int, shuffled: bool, seed: int):
        self.directory, self.bs, self.shuffled, self.seed = directory, bs, shuffled, seed
        self.num_batches = -(-num_rows // bs)
        self._base = self._ds = None
        self._epoch = -1

    def __getstate__(self):
        return {**self.__dict__, "_base": None, "_ds": None, "_epoch": -1}

    def order(self, epoch: int) -> np.ndarray:
        return np.arange(self.num_batches)

    def read(self, i: int, epoch: int) -> np.ndarray:
        import datasets

        if self._base is None:
            self._base = datasets.load_from_disk(self.directory).with_format("numpy")
        if self._ds is None or (self.shuffled and self._epoch != epoch):
            self._ds = self._base.shuffle(seed=self.seed + epoch) if self.shuffled else self._base
            self._epoch = epoch
        part = self._ds[i * self.bs : (i + 1) * self.bs]
        return np.column_stack(list(part.values()))


def _first(items):
    """Collate one sample per batch: a tensor copy of the sample (the default collate's stack
    would copy it too, as a (1, rows, columns) tensor)."""
    item = items[0]
    if isinstance(item, dict):
        item = item["x"]
    return torch.from_numpy(np.array(item))


def _shut_down(loader) -> None:
    """Stop a loader's persistent workers now, off the clock.

    Left to the garbage collector, a loader caught in a reference cycle (LitData's) stops its
    workers whenever a collection runs: inside the next configuration's timed epoch.
    """
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()


def _loader_kwargs(num_workers: int) -> dict:
    if not num_workers:
        return {}
    return {"persistent_workers": True, "multiprocessing_context": worker_context()}


# -- converted copies -----------------------------------------------------------------------
@dataclass
class _Copies:
    """The matrix and its converted copies, with the seconds each writer took."""

    matrix: np.ndarray
    root: str
    batch_size: int
    read_seconds: float
    write_seconds: dict[str, float] = field(default_factory=dict)

    def blocks(self) -> list[np.ndarray]:
        bs = self.batch_size
        return [self.matrix[s : s + bs] for s in range(0, self.matrix.shape[0], bs)]

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)


def _write_parquet(copies: _Copies, names: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({n: copies.matrix[:, j] for j, n in enumerate(names)})
    pq.write_table(table, copies.path("matrix.parquet"), row_group_size=copies.batch_size)


def _litdata_item(block):
    return block


def _write_litdata(copies: _Copies, names: list[str]) -> None:
    import litdata

    litdata.optimize(
        fn=_litdata_item,
        inputs=copies.blocks(),
        output_dir=copies.path("litdata"),
        chunk_size=BLOCKS_PER_CHUNK,
        num_workers=1,
        # fork: the child only serializes the blocks it is handed (spawn would re-run the
        # caller's __main__, and needs it guarded)
        start_method="fork" if "fork" in multiprocessing.get_all_start_methods() else None,
        reorder_files=False,
        verbose=False,
    )


def _write_streaming(copies: _Copies, names: list[str]) -> None:
    from streaming import MDSWriter

    block_bytes = copies.batch_size * copies.matrix.shape[1] * 4
    with MDSWriter(
        out=copies.path("streaming"),
        columns={"x": "ndarray"},
        size_limit=BLOCKS_PER_CHUNK * block_bytes + 4096,
    ) as out:
        for block in copies.blocks():
            out.write({"x": np.ascontiguousarray(block)})


def _write_hf(copies: _Copies, names: list[str]) -> None:
    import datasets
    import pyarrow as pa

    table = pa.table({n: copies.matrix[:, j] for j, n in enumerate(names)})
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        datasets.Dataset(table).save_to_disk(copies.path("hf"))
    finally:
        if shown:
            datasets.enable_progress_bars()


WRITERS: dict[str, Callable[[_Copies, list[str]], None]] = {
    "parquet": _write_parquet,
    "litdata": _write_litdata,
    "streaming": _write_streaming,
    "hf-datasets": _write_hf,
}


# -- one configuration ----------------------------------------------------------------------
@dataclass(frozen=True)
class PeerConfig:
    """One loader: ``peer``, ``variant`` (tsfile-torch: its cache), order and workers."""

    peer: str
    order: str
    num_workers: int
    variant: str = ""

    @property
    def name(self) -> str:
        head = f"{self.peer} {self.variant}" if self.variant else self.peer
        return f"{head}, {self.order}, workers={self.num_workers}"


def peer_configs(
    peers: Iterable[str], workers: Iterable[int], hf_shuffled: bool = False
) -> list[PeerConfig]:
    """Return every configuration of ``peers``: both orders, each worker count (HF datasets
    shuffled only with ``hf_shuffled``)."""
    configs = []
    for peer in peers:
        variants = ("streaming", "memory", "disk") if peer == "tsfile-torch" else ("",)
        for variant in variants:
            for order in ORDERS:
                if peer == "hf-datasets" and order == "shuffled" and not hf_shuffled:
                    continue
                configs += [PeerConfig(peer, order, w, variant) for w in workers]
    return configs


class _Builder:
    """Builds the loader of a configuration (the timed build) and closes it after."""

    def __init__(self, plan: PeerPlan, paths: list[str], copies: _Copies, disk_dir: str):
        self.plan, self.paths, self.copies, self.disk_dir = plan, paths, copies, disk_dir
        self.num_rows = copies.matrix.shape[0]
        self.num_batches = -(-self.num_rows // plan.batch_size)

    def build(self, cfg: PeerConfig):
        """Return ``(set_epoch, loader, close)``."""
        return getattr(self, "_" + cfg.peer.replace("-", "_"))(cfg)

    def _tsfile_torch(self, cfg: PeerConfig):
        cache = {"streaming": "none"}.get(cfg.variant, cfg.variant)
        ds = TsFileIterableDataset(
            self.paths,
            batch_size=self.plan.batch_size,
            shuffle=cfg.order == "shuffled",
            seed=self.plan.seed,
            cache=cache,
            cache_dir=self.disk_dir if cache == "disk" else None,
        )
        loader = make_loader(ds, num_workers=cfg.num_workers)
        return None, loader, ds.close

    def _in_process(self, reader, cfg: PeerConfig):
        ds = _Batches(reader, reader.num_batches)
        if not cfg.num_workers:
            return ds.set_epoch, ds, None
        loader = tud.DataLoader(
            ds, batch_size=None, num_workers=cfg.num_workers, **_loader_kwargs(cfg.num_workers)
        )
        return ds.set_epoch, loader, None

    def _numpy(self, cfg: PeerConfig):
        shuffled = cfg.order == "shuffled"
        reader = _NumpyReader(self.copies.matrix, self.plan.batch_size, shuffled, self.plan.seed)
        return self._in_process(reader, cfg)

    def _parquet(self, cfg: PeerConfig):
        path = self.copies.path("matrix.parquet")
        shuffled = cfg.order == "shuffled"
        return self._in_process(
            _ParquetReader(path, self.num_batches, shuffled, self.plan.seed), cfg
        )

    def _hf_datasets(self, cfg: PeerConfig):
        shuffled = cfg.order == "shuffled"
        reader = _HFReader(
            self.copies.path("hf"), self.plan.batch_size, self.num_rows, shuffled, self.plan.seed
        )
        return self._in_process(reader, cfg)

    def _litdata(self, cfg: PeerConfig):
        import litdata

        ds = litdata.StreamingDataset(
            self.copies.path("litdata"), shuffle=cfg.order == "shuffled", seed=self.plan.seed
        )
        loader = litdata.StreamingDataLoader(
            ds,
            batch_size=1,
            num_workers=cfg.num_workers,
            collate_fn=_first,
            **_loader_kwargs(cfg.num_workers),
        )
        return None, loader, None

    def _streaming(self, cfg: PeerConfig):
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        ds = StreamingDataset(
            local=self.copies.path("streaming"),
            shuffle=cfg.order == "shuffled",
            shuffle_seed=self.plan.seed,
            batch_size=1,
        )
        loader = tud.DataLoader(
            ds,
            batch_size=1,
            num_workers=cfg.num_workers,
            collate_fn=_first,
            **_loader_kwargs(cfg.num_workers),
        )
        return None, loader, None


@dataclass(frozen=True)
class _Epoch:
    seconds: float
    first_batch_seconds: float
    rows: int
    checksum: int


def timed_epoch(batches, per_row: bool) -> _Epoch:
    """One pass over ``batches``: seconds fetching them (checks off the clock), rows, checksum."""
    seconds, first, rows, total = 0.0, None, 0, 0
    start = time.perf_counter()
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            seconds += time.perf_counter() - start
            break
        seconds += time.perf_counter() - start
        if first is None:
            first = seconds
        rows += len(batch)
        total += checksum(batch, per_item=per_row)
        start = time.perf_counter()
    return _Epoch(seconds, first or seconds, rows, total % MODULUS)


def _run(builder: _Builder, cfg: PeerConfig, epochs: int, expected: dict) -> dict:
    start = time.perf_counter()
    set_epoch, loader, close = builder.build(cfg)
    build = time.perf_counter() - start
    passes = []
    for epoch in range(epochs):
        if set_epoch is not None:
            set_epoch(epoch)
        passes.append(timed_epoch(loader, per_row=cfg.order == "shuffled"))
    want = expected[cfg.order]
    num_rows = builder.num_rows
    _shut_down(loader)
    del loader
    if close is not None:
        close()
    gc.collect()
    return {
        "config": cfg.name,
        **asdict(cfg),
        "build_seconds": build,
        "epoch_seconds": [p.seconds for p in passes],
        "first_batch_seconds": passes[0].first_batch_seconds,
        "epoch_rows": [p.rows for p in passes],
        "rows_ok": all(p.rows == num_rows for p in passes),
        "checksum_ok": all(p.checksum == want for p in passes),
    }


def run_peer_benchmark(
    plan: PeerPlan, work_dir: str | None = None, progress: bool = True
) -> tuple[list[dict], dict]:
    """Convert once, run every configuration ``plan.rounds`` times; return records and a summary.

    The summary holds the conversions (seconds and ratios), the peers skipped (with the line
    saying how to install each) and the plan.

    Raises:
        RuntimeError: tsfile's own reading and tsfile-torch's disagree on the matrix, or the
            baseline delivered other rows than the reference.
    """
    paths = [s.name for s in expand_sources(plan.data)]
    peers, skipped = available_peers(plan.peers)
    probe = TsFileIterableDataset(paths, batch_size=plan.batch_size)
    columns, names = probe.catalog.columns, probe.columns
    ours = np.concatenate([b.numpy() for b in probe])
    probe.close()
    owned = work_dir is None
    root = work_dir or tempfile.mkdtemp(prefix="tsfile-torch-peers-")
    try:
        start = time.perf_counter()
        matrix = read_with_tsfile(paths, columns, names)
        read_seconds = time.perf_counter() - start
        if not np.array_equal(matrix, ours, equal_nan=True):
            raise RuntimeError(
                "tsfile.to_dataframe and tsfile-torch read different values from "
                f"{plan.data}: the peers would not read what tsfile-torch reads"
            )
        copies = _Copies(matrix, root, plan.batch_size, read_seconds)
        conversions = {"numpy": 0.0} if "numpy" in peers else {}
        for peer in peers:
            if peer in WRITERS:
                start = time.perf_counter()
                WRITERS[peer](copies, names)
                copies.write_seconds[peer] = time.perf_counter() - start
        bs = plan.batch_size
        expected = {
            "sequential": sum(checksum(b) for b in copies.blocks()) % MODULUS,
            "shuffled": checksum(matrix, per_item=True),
        }
        disk_dir = os.path.join(root, "decoded")
        builder = _Builder(plan, paths, copies, disk_dir)
        configs = peer_configs(peers, plan.workers, plan.hf_shuffled)
        hf_probe = None
        if "hf-datasets" in peers and not plan.hf_shuffled:  # one batch, the epoch estimated
            reader = _HFReader(copies.path("hf"), bs, matrix.shape[0], True, plan.seed)
            reader.read(0, 0)  # the shuffle itself and the first open, untimed
            start = time.perf_counter()
            batch = reader.read(1 % builder.num_batches, 0)
            seconds = time.perf_counter() - start
            hf_probe = {"batch_seconds": seconds, "rows": len(batch)}
            hf_probe["epoch_estimate_seconds"] = seconds * matrix.shape[0] / len(batch)
        if any(c.variant == "disk" for c in configs):  # the entry a later run finds
            fill = PeerConfig("tsfile-torch", "sequential", 0, "disk")
            start = time.perf_counter()
            _, loader, close = builder.build(fill)
            timed_epoch(loader, per_row=False)
            close()
            conversions["tsfile-torch disk"] = time.perf_counter() - start
        for peer, seconds in copies.write_seconds.items():
            conversions[peer] = seconds
        records = []
        total = plan.rounds * len(configs)
        with tqdm(total=total, desc="peers", unit="run", disable=not progress) as bar:
            for rnd in range(plan.rounds):
                for cfg in configs if rnd % 2 == 0 else configs[::-1]:
                    bar.set_postfix_str(cfg.name[:48])
                    rec = _run(builder, cfg, plan.epochs, expected)
                    rec.update(round=rnd, rows=matrix.shape[0], columns=matrix.shape[1])
                    rec["batch_size"] = bs
                    records.append(rec)
                    bar.update()
                    if cfg.name == BASELINE and not (rec["rows_ok"] and rec["checksum_ok"]):
                        raise RuntimeError(
                            f"{BASELINE} delivered other rows than the reference (round {rnd}): "
                            "every ratio would be wrong"
                        )
    finally:
        if owned:
            shutil.rmtree(root, ignore_errors=True)
    _add_ratios(records)
    base = statistics.median(r["later_seconds"] for r in records if r["config"] == BASELINE)
    summary = {
        "plan": asdict(plan),
        "skipped": skipped,
        "baseline": BASELINE,
        "baseline_later_seconds": base,
        "read_seconds": read_seconds,
        "hf_shuffled_probe": hf_probe
        and {**hf_probe, "x_stream0": hf_probe["epoch_estimate_seconds"] / base},
        "conversions": {
            peer: {
                "seconds": seconds + (read_seconds if peer != "tsfile-torch disk" else 0.0),
                "write_seconds": seconds,
                "x_stream0": (seconds + (read_seconds if peer != "tsfile-torch disk" else 0.0))
                / base,
            }
            for peer, seconds in conversions.items()
        },
    }
    return records, summary


def _add_ratios(records: list[dict]) -> None:
    by_round: dict[int, dict] = {}
    for rec in records:
        rec["first_seconds"] = rec["epoch_seconds"][0]
        rec["later_seconds"] = statistics.median(later_epochs(rec["epoch_seconds"]))
        if rec["config"] == BASELINE:
            by_round[rec["round"]] = rec
    for rec in records:
        base = by_round[rec["round"]]["later_seconds"]
        rec["x_stream0"] = {
            "build": rec["build_seconds"] / base,
            "first": rec["first_seconds"] / base,
            "build_and_first": (rec["build_seconds"] + rec["first_seconds"]) / base,
            "later": rec["later_seconds"] / base,
            "first_batch": rec["first_batch_seconds"] / base,
        }


def summarize(records: list[dict]) -> list[dict]:
    """Return one row per configuration: median seconds and median ratios over rounds."""
    rows = []
    for name in dict.fromkeys(r["config"] for r in records):
        recs = [r for r in records if r["config"] == name]
        row = {k: recs[0][k] for k in ("config", "peer", "variant", "order", "num_workers")}
        for key in ("build_seconds", "first_seconds", "later_seconds", "first_batch_seconds"):
            row[key] = statistics.median(r[key] for r in recs)
        later = [s for r in recs for s in later_epochs(r["epoch_seconds"])]
        row["later_min_seconds"] = min(later)
        row["x_stream0"] = {
            k: statistics.median(r["x_stream0"][k] for r in recs) for k in recs[0]["x_stream0"]
        }
        row["rows_ok"] = all(r["rows_ok"] for r in recs)
        row["checksum_ok"] = all(r["checksum_ok"] for r in recs)
        row["rounds"] = len(recs)
        rows.append(row)
    return rows


def format_peer_table(records: list[dict], summary: dict) -> str:
    """Return the text table: ratios to the baseline first, seconds beside."""
    rows = summarize(records)
    first = records[0]
    plan = summary["plan"]
    lines = [
        f"Peers: {first['rows']:,} rows x {first['columns']} columns, batches of "
        f"{first['batch_size']}, {plan['rounds']} rounds x {plan['epochs']} epochs; x stream0 = "
        f"seconds / {BASELINE} later epoch ({summary['baseline_later_seconds']:.3f} s), "
        "same round, median over rounds (< 1: faster)",
    ]
    for peer, line in summary["skipped"].items():
        lines.append(f"skipped {peer}: {line}")
    head = (
        f"{'configuration':<50} {'build x':>8} {'1st x':>7} {'later x':>8} {'b+1st x':>8} "
        f"{'1st batch x':>11}  {'later s':>8} {'1st s':>7} {'build s':>7}  rows/values"
    )
    lines += [head, "-" * len(head)]
    for row in rows:
        x = row["x_stream0"]
        ok = (
            "ok"
            if row["rows_ok"] and row["checksum_ok"]
            else ("ROWS MISSING" if not row["rows_ok"] else "VALUES DIFFER")
        )
        lines.append(
            f"{row['config']:<50} {x['build']:>8.3f} {x['first']:>7.3f} {x['later']:>8.3f} "
            f"{x['build_and_first']:>8.3f} {x['first_batch']:>11.3f}  "
            f"{row['later_seconds']:>8.3f} {row['first_seconds']:>7.3f} "
            f"{row['build_seconds']:>7.3f}  {ok}"
        )
    lines.append("")
    lines.append(
        f"conversion from the TsFiles (once; tsfile.to_dataframe read {summary['read_seconds']:.3f}"
        " s, counted in each peer's):"
    )
    for peer, conv in summary["conversions"].items():
        lines.append(
            f"  {peer:<20} {conv['x_stream0']:>8.1f} x stream0  {conv['seconds']:>8.3f} s "
            f"(writer {conv['write_seconds']:.3f} s)"
        )
    probe = summary.get("hf_shuffled_probe")
    if probe:
        lines.append(
            f"hf-datasets shuffled (ds.shuffle, then slices; not in the rounds, --hf-shuffled "
            f"runs it): one batch of {probe['rows']} rows took {probe['batch_seconds']:.3f} s, "
            f"an epoch ~{probe['epoch_estimate_seconds']:.1f} s = ~{probe['x_stream0']:.0f} x "
            "stream0"
        )
    verified = sum(1 for r in records if r["rows_ok"] and r["checksum_ok"])
    lines.append(
        f"{verified} of {len(records)} runs delivered every row with the reference's values "
        "in every epoch"
    )
    return "\n".join(lines)


def plot_peers(records: list[dict], path: str) -> bool:
    """Write bars of the later-epoch ratio per configuration; False if matplotlib is absent."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summarize(records)
    names = [r["config"] for r in rows]
    colors = {
        p: c for p, c in zip(PEERS, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False)
    }
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(names) + 1.5))
    ax.barh(
        range(len(names)),
        [r["x_stream0"]["later"] for r in rows],
        color=[colors[r["peer"]] for r in rows],
    )
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel(f"later epoch seconds / {BASELINE} (median over rounds; < 1 is faster)")
    env = records[0].get("environment") or environment()
    ax.set_title(
        f"peers: {records[0]['rows']:,} rows x {records[0]['columns']} columns, batch "
        f"{records[0]['batch_size']}, {env['cpus']} CPUs",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_peer_results(records: list[dict], summary: dict, out: str, stem: str = "peers") -> dict:
    """Write ``OUT/STEM.txt`` (the table), ``.jsonl`` (records, then the summary), ``.png``.

    Returns the paths written by kind; ``png`` is absent without matplotlib.
    """
    os.makedirs(out, exist_ok=True)
    written = {"txt": os.path.join(out, f"{stem}.txt"), "jsonl": os.path.join(out, f"{stem}.jsonl")}
    with open(written["txt"], "w", encoding="utf-8") as fh:
        fh.write(format_peer_table(records, summary) + "\n")
    write_json([*records, {"summary": summary}], written["jsonl"])
    png = os.path.join(out, f"{stem}.png")
    if plot_peers(records, png):
        written["png"] = png
    return written


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark from the command line: print the table, write OUT/peers.*."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="TsFiles to read (default: the reference dataset)")
    parser.add_argument("--cache-dir", help="where the reference dataset is generated")
    parser.add_argument("--batch-size", type=int, default=8192, help="rows per batch")
    parser.add_argument("--rounds", type=int, help="rounds (default 3, quick 1)")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 epochs")
    parser.add_argument("--workers", nargs="+", type=int, help="DataLoader workers (default 0 2)")
    parser.add_argument(
        "--peer-list",
        nargs="+",
        choices=list(PEERS),
        help="the loaders to run (default: all; tsfile-torch is always needed)",
    )
    parser.add_argument(
        "--hf-shuffled",
        action="store_true",
        help="run Hugging Face datasets shuffled too (ds.shuffle; minutes an epoch at the "
        "reference size; default: one batch timed, the epoch estimated)",
    )
    parser.add_argument(
        "--out", help="directory for peers.txt, .jsonl and .png (default: a new temporary one)"
    )
    parser.add_argument("--no-progress", action="store_true", help="print no progress lines")
    args = parser.parse_args(argv)
    plan = PeerPlan(
        data=args.data or reference_data(args.cache_dir),
        batch_size=args.batch_size,
        rounds=args.rounds or (1 if args.quick else 3),
        epochs=2 if args.quick else 3,
        workers=tuple(args.workers or [0, 2]),
        peers=tuple(args.peer_list or PEERS),
        hf_shuffled=args.hf_shuffled,
    )
    out = args.out or tempfile.mkdtemp(prefix="tsfile-torch-peers-results-")
    records, summary = run_peer_benchmark(plan, progress=not args.no_progress)
    written = write_peer_results(records, summary, out)
    print(format_peer_table(records, summary))
    if "png" not in written:
        print("no plot: matplotlib is not installed (pip install matplotlib)")
    print(f"wrote {', '.join(written.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
