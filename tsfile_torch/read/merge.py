"""Merged shards: one timeline stored in files that overlap in time, read in timestamp order.

Note: merged shards. Real data is not written in one pass: a meter uploads its backlog into a
new file, a writer restarts beside late rows of the last hour, IoTDB writes out-of-order data to
"unsequence" files. A series whose shards overlap in time is read, as IoTDB and
``tsfile.TsFileDataFrame`` read it, as one series in timestamp order. The catalog numbers the
*stored* rows shard after shard (:func:`tsfile_torch.catalog.build.lay_out`); a
:class:`Merge` maps the merged rows onto them. It is built once, in the building process, from
the shards' timestamps (one pass over each time column) and pickled into workers with the
dataset; it keeps runs of merged rows that come from consecutive stored rows of one shard
(16 bytes per run: one run per stretch of one file, so interleaved files cost up to 16 bytes
per row, late data in its own file a few runs) and the duplicates (16 bytes each). Reading
merged rows ``[a, b)`` reads, per shard, the one stretch of stored rows they come from (each
shard's stretch in the blocks the reader decodes anyway) and interleaves them: no values are
ever materialized beyond the rows asked for. Shards that do not overlap keep the positional
path (no merge, no cost). The shards' timeline indexes come from the timestamps the build read
(Note: seeded indexes in :mod:`tsfile_torch.read.timeline`; 8 bytes per 1,024 stored rows):
no process reads those time columns again.

Duplicates (a timestamp stored in more than one shard): ``duplicates="error"`` (default) is a
:class:`~tsfile_torch.errors.SchemaError` naming the series, both files and the first such
timestamp; ``"first"`` / ``"last"``: the earlier / later source (the order sources are given
in, a directory's files sorted by name) wins, **cell by cell**: a null of the winner is filled
from the next shard holding a value there (a null never replaces a value; a NaN stored as a
value reads as a null). :func:`priority` is the one place that ranks shards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tsfile_torch.catalog.build import ReadGroup, Shard
from tsfile_torch.errors import SchemaError, warn_caller
from tsfile_torch.options import DUPLICATE_MODES, format_timestamp
from tsfile_torch.read.timeline import DEFAULT_INDEX_STRIDE, marks_of

__all__ = ["Merge", "priority", "warn_resolved"]


def priority(shards: Sequence[Shard], duplicates: str) -> np.ndarray:
    """Return each shard's rank where shards hold the same timestamp: the lowest wins, the
    others fill its null cells in rank order. Sources rank in the order given (``"first"``:
    the earliest wins; ``"last"``: the latest). IoTDB's own order (unsequence over sequence
    files, then the version in the file name) would be one more rule here."""
    order = np.array([s.file_index for s in shards], dtype=np.int64)
    return -order if duplicates == "last" else order


class Merge:
    """Merged rows ``0 .. num_rows - 1`` of one timeline whose shards overlap in time.

    Picklable, no handles. Build it with :meth:`build`.

    Attributes:
        num_rows: merged rows (each timestamp once).
        resolved: timestamps stored in more than one shard (resolved by ``duplicates``).
    """

    def __init__(
        self,
        run_pos,
        run_row,
        dup_pos,
        dup_row,
        shard_rows,
        num_rows,
        resolved,
        marks: Mapping[int, np.ndarray] | None = None,
        stride: int = DEFAULT_INDEX_STRIDE,
    ):
        #: each run of merged rows from consecutive stored rows: its first merged row and the
        #: stored row read there
        self.run_pos = np.asarray(run_pos, dtype=np.int64)
        self.run_row = np.asarray(run_row, dtype=np.int64)
        #: merged rows holding a duplicate (ascending) and the stored row of the duplicate, in
        #: rank order within one merged row (Note: merged shards)
        self.dup_pos = np.asarray(dup_pos, dtype=np.int64)
        self.dup_row = np.asarray(dup_row, dtype=np.int64)
        #: the first stored row of each shard (ascending)
        self.shard_rows = np.asarray(shard_rows, dtype=np.int64)
        self.num_rows = int(num_rows)
        self.resolved = int(resolved)
        #: a shard's first stored row -> its timeline index marks, every ``stride``-th
        #: timestamp (Note: seeded indexes in :mod:`tsfile_torch.read.timeline`)
        self.marks = dict(marks or {})
        self.stride = stride

    @property
    def nbytes(self) -> int:
        """Bytes this mapping keeps (what a merged timeline costs beyond its timestamps)."""
        arrays = (self.run_pos, self.run_row, self.dup_pos, self.dup_row, self.shard_rows)
        return sum(a.nbytes for a in arrays) + sum(m.nbytes for m in self.marks.values())

    def seed(self, decoder, groups: Mapping[int, ReadGroup], save: bool = False) -> None:
        """Give ``decoder`` (a :class:`~tsfile_torch.read.decode.GroupDecoder`) the timeline
        index of each of ``groups`` (read group index -> group: the shards' groups of the
        decoder's catalog) from the marks the build took (Note: seeded indexes); ``save``: also
        to the index cache (the building process). Cheap once seeded: call before reads."""
        for gi, group in groups.items():
            marks = self.marks.get(group.start_row)
            if marks is not None:
                decoder.seed(gi, marks, self.stride, save)

    def stored_rows(self, start: int, stop: int) -> np.ndarray:
        """Return the stored row each merged row of ``[start, stop)`` takes (its winner)."""
        j0 = int(np.searchsorted(self.run_pos, start, side="right")) - 1
        j1 = int(np.searchsorted(self.run_pos, stop, side="left"))
        first = np.maximum(self.run_pos[j0:j1], start)
        ends = np.append(self.run_pos[j0 + 1 : j1], stop)
        delta = self.run_row[j0:j1] - self.run_pos[j0:j1]
        return np.arange(start, stop, dtype=np.int64) + np.repeat(delta, ends - first)

    def read(
        self, read_stored: Callable, start: int, stop: int, width: int, dtype
    ) -> tuple[np.ndarray, np.ndarray]:
        """Return merged rows ``[start, stop)``: values ``(n, width)`` in ``dtype``, timestamps.

        ``read_stored(a, b, out)`` returns stored rows ``[a, b)`` as (values, times), the
        values in ``out`` when it is not None; it is called once per shard the rows come from,
        with that shard's stretch.
        """
        if not 0 <= start < stop <= self.num_rows:
            raise ValueError(
                f"row range [{start}, {stop}) is outside the {self.num_rows} merged rows or empty"
            )
        winners = self.stored_rows(start, stop)
        d0, d1 = np.searchsorted(self.dup_pos, [start, stop])
        losers = self.dup_row[d0:d1]
        wanted = np.concatenate([winners, losers]) if len(losers) else winners
        shard = np.searchsorted(self.shard_rows, wanted, side="right") - 1
        spans, where, total = [], np.zeros(len(self.shard_rows), dtype=np.int64), 0
        for k in np.flatnonzero(np.bincount(shard, minlength=len(self.shard_rows))):
            rows = wanted[shard == k]
            lo, hi = int(rows.min()), int(rows.max()) + 1
            spans.append((lo, hi, total))
            where[k] = total - lo
            total += hi - lo
        if len(spans) == 1:
            values, times = read_stored(spans[0][0], spans[0][1], None)
        else:  # each shard's stretch straight into one buffer
            values = np.empty((total, width), dtype=dtype)
            times = np.empty(total, dtype=np.int64)
            for lo, hi, at in spans:
                times[at : at + hi - lo] = read_stored(lo, hi, values[at : at + hi - lo])[1]
        at = winners + where[shard[: len(winners)]]
        if len(spans) == 1 and not len(losers) and at[0] == 0 and len(at) == len(times):
            return values, times  # one shard's consecutive rows here: as read
        out, out_times = values[at], times[at]
        if len(losers):
            dups = values[losers + where[shard[len(winners) :]]]
            _fill_from(out, self.dup_pos[d0:d1] - start, dups)
        return out, out_times

    @classmethod
    def build(
        cls,
        shards: Sequence[Shard],
        times: Sequence[np.ndarray],
        duplicates: str,
        name: str,
        file_names: Sequence[str],
        time_unit: str = "ms",
        stride: int = DEFAULT_INDEX_STRIDE,
    ) -> tuple[Merge, np.ndarray]:
        """Return the merge of ``shards`` (placed, in stored order) and the merged timestamps.

        ``times[k]`` are shard ``k``'s timestamps (increasing; its whole time column). Shards
        that overlap no other are runs taken as they are; only where ranges overlap are
        timestamps sorted. Every ``stride``-th timestamp of a shard is kept as its timeline
        index (Note: seeded indexes).

        Raises:
            SchemaError: with ``duplicates="error"``, a timestamp in two shards; the message
                names ``name``, both files (``file_names`` by file index), the timestamp and
                the choices.
        """
        if duplicates not in DUPLICATE_MODES:
            raise ValueError(f"duplicates must be one of {DUPLICATE_MODES}; got {duplicates!r}")
        ranks = priority(shards, duplicates)
        run_pos, run_row, dup_pos, dup_row, merged = [], [], [], [], []
        pos = 0
        for cluster in _clusters(shards):
            if len(cluster) == 1:
                (k,) = cluster
                run_pos.append([pos])
                run_row.append([shards[k].start_row])
                merged.append(times[k])
                pos += len(times[k])
                continue
            # in rank order, so that a stable sort puts a timestamp's winner first; the sort
            # merges the shards' increasing runs (timsort: ~ one pass per shard)
            cluster = sorted(cluster, key=lambda k: (ranks[k], k))
            stamps = np.concatenate([times[k] for k in cluster])
            rows = np.concatenate(
                [np.arange(len(times[k]), dtype=np.int64) + shards[k].start_row for k in cluster]
            )
            order = np.argsort(stamps, kind="stable")
            stamps, rows = stamps[order], rows[order]
            new = np.r_[True, stamps[1:] != stamps[:-1]]
            if not new.all():
                if duplicates == "error":
                    _refuse(shards, rows, stamps, new, name, file_names, time_unit)
                dup_pos.append(pos + np.cumsum(new)[~new] - 1)
                dup_row.append(rows[~new])
            winners = rows[new]
            breaks = np.r_[0, np.flatnonzero(np.diff(winners) != 1) + 1]
            run_pos.append(pos + breaks)
            run_row.append(winners[breaks])
            merged.append(stamps[new])
            pos += len(winners)
        run_pos, run_row = np.concatenate(run_pos), np.concatenate(run_row)
        keep = np.r_[True, np.diff(run_row - run_pos) != 0]  # runs that continue one another
        dup_pos = np.concatenate(dup_pos) if dup_pos else np.empty(0, np.int64)
        dup_row = np.concatenate(dup_row) if dup_row else np.empty(0, np.int64)
        resolved = len(np.unique(dup_pos))
        starts = [s.start_row for s in shards]
        marks = {
            s.start_row: m
            for s, t in zip(shards, times, strict=True)
            if (m := marks_of(t, s.num_rows, s.start_time, s.end_time, stride)) is not None
        }
        merge = cls(
            run_pos[keep], run_row[keep], dup_pos, dup_row, starts, pos, resolved, marks, stride
        )
        return merge, np.concatenate(merged)


def _clusters(shards: Sequence[Shard]) -> list[list[int]]:
    """Group shards (in stored order: by start time) into runs whose time ranges overlap."""
    out: list[list[int]] = []
    end = None
    for k, shard in enumerate(shards):
        if end is not None and shard.start_time <= end:
            out[-1].append(k)
            end = max(end, shard.end_time)
        else:
            out.append([k])
            end = shard.end_time
    return out


def _fill_from(out: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """Fill the null cells of ``out[rows]`` from ``values`` (one row each), cell by cell, in
    order: a merged row holding several duplicates takes them in rank order (``rows``
    ascending, equal rows in rank order)."""
    level = np.arange(len(rows)) - np.searchsorted(rows, rows, side="left")
    for lv in range(int(level.max()) + 1):
        pick = level == lv
        at = rows[pick]
        cells = out[at]
        hole = np.isnan(cells)
        cells[hole] = values[pick][hole]
        out[at] = cells


def _refuse(shards, rows, stamps, new, name, file_names, time_unit) -> None:
    i = int(np.flatnonzero(~new)[0])
    starts = np.array([s.start_row for s in shards], dtype=np.int64)
    a, b = (int(np.searchsorted(starts, rows[j], side="right")) - 1 for j in (i - 1, i))
    files = sorted({shards[a].file_index, shards[b].file_index})
    shown = " and ".join(file_names[f] for f in files) if len(files) > 1 else file_names[files[0]]
    count = int(np.count_nonzero(~new))
    t = int(stamps[i])
    raise SchemaError(
        f"{name}: timestamp {t} ({format_timestamp(t, time_unit)}) is stored in both "
        f"{shown} ({count} duplicate timestamp{'s' if count > 1 else ''} where their time "
        f"ranges overlap); pass duplicates='first' to keep the earlier source's values or "
        f"duplicates='last' the later source's (cell by cell: a null never replaces a value), "
        f"or remove the duplicate rows from one file"
    )


def warn_resolved(merges: Sequence[tuple[str, Merge]], duplicates: str) -> None:
    """Warn once when duplicate timestamps were resolved by ``duplicates``: how many and how
    (``merges``: ``(name, merge)`` of every merged timeline of a dataset)."""
    hit = [(name, m.resolved) for name, m in merges if m.resolved]
    if not hit:
        return
    total = sum(n for _, n in hit)
    shown = ", ".join(f"{name} ({n:,})" for name, n in hit[:3])
    more = f" and {len(hit) - 3} more" if len(hit) > 3 else ""
    winner = "earlier" if duplicates == "first" else "later"
    warn_caller(
        f"{total:,} timestamp{' is' if total == 1 else 's are'} stored in more than one file: "
        f"{shown}{more}; "
        f"duplicates={duplicates!r} kept the {winner} source's values, cell by cell (a null "
        f"never replaces a value)"
    )
