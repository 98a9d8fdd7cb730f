"""Integrity checks on what is read: files unchanged, decoded values consistent with metadata.

Two checks, both called by the reader around each native read (Note: integrity hooks):

- ``FileInfo.check_unchanged`` (:meth:`tsfile_torch.sources.Source.check_unchanged`) before and
  after every native read: for a local file one ``os.stat``, compared with the identity recorded
  when the catalog was built (after: so a block read while the file was being written is never
  handed out); size, mtime, inode and device as they are, ctime as Note: content-relevant
  identity (:mod:`tsfile_torch.sources.content`) says, so chmod, chown and hard links are not
  changes and a same-size rewrite with its mtime restored is. A change is a
  :class:`TsFileFormatError` naming the file. A URL's local copy is immutable (keyed by the
  object's version); file objects cannot be checked.
- :class:`StatisticsCheck` after every decoded block: row count (the reader's own check),
  timestamps strictly increasing, the first / last timestamp and value of each series where the
  block holds the series' first / last row, every value inside the series' [min, max], and, once a
  process has decoded every row of a series in one file, its sum. Blocks may overlap (window
  blocks carry the tails of their windows) or come in any order (random windows): each row is
  counted once, when it is first decoded. A mismatch is a
  :class:`TsFileFormatError` naming the file, the series and the rows.

- :class:`KeptRowsCheck` on blocks of the decoded disk cache, before a block is sealed and when
  a process first serves it (Note: checked blocks, :mod:`tsfile_torch.read.diskcache`): the
  same timestamps checks per table (strictly increasing, inside the time range of the table's
  series) and, for positional tables, every value inside its column's [min, max] as handed out
  (normalized, in the output dtype). A failure there blames the cache entry, not the TsFile.

- :class:`EpochSums` in the main process, over the batches a loader hands out: when one epoch
  delivered every row exactly once, each column's sum must match the sum of its series'
  statistics. Order-independent, so it covers what DataLoader workers decoded (each worker sees
  only its share of a series); the error comes at the end of that epoch.

What this cannot catch: TsFile pages carry no checksum, so damage that decodes to plausible values
(inside [min, max], timestamps still increasing, rows the sum check never sees whole) is not
detected. The sum check needs one process to decode all rows of a series in a file: with
DataLoader workers each worker decodes only its share, so only the other checks apply there.

The reader calls them through Note: guarded read (:func:`tsfile_torch.native.guard.guarded_call`,
for every native read of group rows [start, stop)): ``info.check_unchanged()`` before and after
the read, ``check.block(group_index, start, times, values)`` after it, with ``values`` as
``(len(group.columns), n)`` in the output dtype (NaN for nulls).
"""

from __future__ import annotations

import logging
import threading
from multiprocessing import sharedctypes

import numpy as np

from tsfile_torch.catalog.build import Catalog, ReadGroup
from tsfile_torch.errors import SKIP_HINT, TsFileFormatError, shared_memory

logger = logging.getLogger(__name__)

__all__ = [
    "CELL_ROWS",
    "CellSums",
    "EpochSums",
    "KeptRowsCheck",
    "StatisticsCheck",
    "check_group_sums",
    "column_sums",
]


#: Rows per cell of :class:`CellSums` (the timeline index's stride).
CELL_ROWS = 1024
#: Cells x columns beyond which the per-series sums are not checked (8 bytes each: 64 MiB).
MAX_SHARED_CELLS = 8 << 20


class CellSums:
    """Note: cell sums. Column sums of every read group in cells of ``cell_rows`` rows,
    in shared memory (the dataset creates it before workers start; pickled into them while
    they are started), so that each row is counted once across all processes of a loader.

    Any process that decodes rows adds the sums of the cells its rows cover completely (a
    group's last cell may be short); once every cell of a group is in, that process checks the
    group's sum against the metadata. So a full pass is checked however its rows were dealt
    out: overlapping window blocks, shuffled or random reads, any number of workers.
    """

    def __init__(self, catalog: Catalog, cell_rows: int = CELL_ROWS):
        #: rows per cell: a divisor of every boundary the readers decode at (block starts,
        #: workers' stretches), so that cells are whole in some process
        self.cell_rows = cell_rows
        self.groups = [
            gi for gi, g in enumerate(catalog.groups) if any(s.sum is not None for s in g.shards)
        ]
        cells = {gi: -(-catalog.groups[gi].num_rows // cell_rows) for gi in self.groups}
        widths = {gi: len(catalog.groups[gi].columns) for gi in self.groups}
        self.cell_start, self.sum_start = {}, {}
        n_cells = n_sums = 0
        for gi in self.groups:
            self.cell_start[gi], self.sum_start[gi] = n_cells, n_sums
            n_cells += cells[gi]
            n_sums += cells[gi] * widths[gi]
        #: False: too fine a grid for memory, no sum checks
        self.on = n_sums <= MAX_SHARED_CELLS
        if not self.on:
            logger.debug("sum checks off: %d cells x columns over %d", n_sums, MAX_SHARED_CELLS)
            self.groups, self.cell_start, self.sum_start = [], {}, {}
            n_cells = n_sums = 0
        self.shared = True

        def make(code: str, size: int):
            what = "the statistics sum checks (check_statistics=)"
            return shared_memory(sharedctypes.RawArray, code, size, what=what)

        self._done = make("b", max(n_cells, 1))
        self._sums = make("d", max(n_sums, 1))
        self._checked = make("b", max(len(catalog.groups), 1))

    def __getstate__(self):
        from multiprocessing import context

        if self.shared and context.get_spawning_popen() is None:
            raise TypeError("CellSums are shared with workers only while they are started")
        return self.__dict__

    def all_checked(self) -> bool:
        """Whether every group with metadata sums was summed whole and matched already, in
        some process of the loader (False while the sums are off)."""
        checked = self.arrays()[2]
        return self.on and all(checked[gi] for gi in self.groups)

    def arrays(self):
        """Return numpy views of (done flags, sums, checked flags)."""
        return (
            np.frombuffer(self._done, dtype=np.int8),
            np.frombuffer(self._sums, dtype=np.float64),
            np.frombuffer(self._checked, dtype=np.int8),
        )


class StatisticsCheck:
    """Cross-check decoded blocks of one catalog against the statistics in its metadata.

    One per reading process; the sums go to a :class:`CellSums` table shared by the processes
    of a loader (or a table of its own).
    """

    def __init__(self, catalog: Catalog, dtype: np.dtype, cells: CellSums | None = None):
        self.catalog = catalog
        self.dtype = np.dtype(dtype)
        self.cells = cells if cells is not None else CellSums(catalog)
        self._lock = threading.Lock()
        #: groups whose sum this process verified (a test reads it)
        self.verified_sums: set[int] = set()

    def _fail(self, group: ReadGroup, shard_pos: int | None, start: int, stop: int, what: str):
        raise _disagreement(self.catalog, group, shard_pos, start, stop, what)

    def block(self, group_index: int, start: int, times: np.ndarray, values: np.ndarray) -> None:
        """Check group-local rows ``[start, start + len(times))`` just decoded.

        Raises:
            TsFileFormatError: timestamps or values contradict the metadata statistics.
        """
        group = self.catalog.groups[group_index]
        n = len(times)
        if n == 0:
            return
        stop = start + n
        shard0 = group.shards[0]
        if n > 1 and not bool(np.all(times[1:] > times[:-1])):
            bad = int(np.flatnonzero(times[1:] <= times[:-1])[0])
            self._fail(group, None, start, stop, f"timestamps not increasing at row {start + bad}")
        if times[0] < shard0.start_time or times[-1] > shard0.end_time:
            self._fail(
                group,
                None,
                start,
                stop,
                f"timestamps [{times[0]}, {times[-1]}] outside the file's time range "
                f"[{shard0.start_time}, {shard0.end_time}]",
            )
        if start == 0 and times[0] != shard0.start_time:
            self._fail(
                group,
                None,
                start,
                stop,
                f"first timestamp {times[0]}, metadata says {shard0.start_time}",
            )
        if stop == group.num_rows and times[-1] != shard0.end_time:
            self._fail(
                group,
                None,
                start,
                stop,
                f"last timestamp {times[-1]}, metadata says {shard0.end_time}",
            )
        cast = self.dtype.type
        with np.errstate(invalid="ignore"):
            low = values.min(axis=1)
            high = values.max(axis=1)
        for k in np.flatnonzero(np.isnan(low) | np.isnan(high)):  # nulls: ignore NaN
            row = values[k]
            finite = row[~np.isnan(row)]
            low[k], high[k] = (finite.min(), finite.max()) if finite.size else (np.nan, np.nan)
        for k, shard in enumerate(group.shards):
            if shard.min is not None and low[k] < cast(shard.min):
                self._fail(
                    group,
                    k,
                    start,
                    stop,
                    f"value {float(low[k])!r} below the series minimum {shard.min!r}",
                )
            if shard.max is not None and high[k] > cast(shard.max):
                self._fail(
                    group,
                    k,
                    start,
                    stop,
                    f"value {float(high[k])!r} above the series maximum {shard.max!r}",
                )
            if start == 0 and shard.first is not None and not np.isnan(values[k, 0]):
                if values[k, 0] != cast(shard.first):
                    self._fail(
                        group,
                        k,
                        start,
                        stop,
                        f"first value {float(values[k, 0])!r}, metadata says {shard.first!r}",
                    )
            if stop == group.num_rows and shard.last is not None and not np.isnan(values[k, -1]):
                if values[k, -1] != cast(shard.last):
                    self._fail(
                        group,
                        k,
                        start,
                        stop,
                        f"last value {float(values[k, -1])!r}, metadata says {shard.last!r}",
                    )
        if group_index in self.cells.cell_start:
            self._add_cells(group_index, group, start, values)

    def _add_cells(self, gi: int, group: ReadGroup, start: int, values: np.ndarray) -> None:
        """Add the cells rows ``[start, start + n)`` cover completely (Note: cell sums)."""
        done, sums, checked = self.cells.arrays()
        rows = self.cells.cell_rows
        if checked[gi]:
            return
        n = values.shape[1]
        first = -(-start // rows)  # first cell starting inside the rows
        stop = start + n
        last = stop // rows if stop < group.num_rows else -(-stop // rows)
        if last <= first:
            return
        k = values.shape[0]
        base = self.cells.cell_start[gi]
        a = first * rows - start  # the covered cells' rows, relative to values
        b = min(last * rows, stop) - start
        full = (b - a) // rows  # whole cells (all but maybe the group's short last one)
        part = values[:, a : a + full * rows].reshape(k, full, rows)
        cell_sums = np.empty((last - first, k))
        cell_sums[:full] = part.sum(axis=2, dtype=np.float64).T
        if full < last - first:
            cell_sums[full] = values[:, a + full * rows : b].sum(axis=1, dtype=np.float64)
        bad = np.isnan(cell_sums)
        if bad.any():  # nulls: sum the cells holding them again, skipping NaN
            for c, j in zip(*np.nonzero(bad), strict=True):
                lo = a + c * rows
                row = values[j, lo : min(lo + rows, b)]
                cell_sums[c, j] = np.nansum(row, dtype=np.float64)
        s0 = self.cells.sum_start[gi]
        sums[s0 + first * k : s0 + last * k] = cell_sums.ravel()
        done[base + first : base + last] = 1
        cells = -(-group.num_rows // rows)
        if done[base : base + cells].all():
            with self._lock:
                if not checked[gi]:
                    self._check_group(gi, group, sums[s0 : s0 + cells * k].reshape(cells, k))
                    checked[gi] = 1

    def _check_group(self, gi: int, group: ReadGroup, cell_sums: np.ndarray) -> None:
        check_group_sums(self.catalog, gi, cell_sums.sum(axis=0), self.dtype)
        self.verified_sums.add(gi)


def check_group_sums(catalog: Catalog, group_index: int, totals: np.ndarray, dtype) -> None:
    """Check the column sums ``totals`` of every row of a read group against its metadata.

    However the rows were summed: by the cells of one process (:class:`StatisticsCheck`), or
    by the Ray read tasks that each read a part of the group (:mod:`tsfile_torch.ray`).
    ``dtype``: the dtype the values were decoded in (its rounding is allowed for).

    Raises:
        TsFileFormatError: a series' sum disagrees, naming the file, the series and the rows.
    """
    group = catalog.groups[group_index]
    dtype = np.dtype(dtype)
    # tolerance: rounding to the output dtype, plus tsfile's and our float64 summation in
    # different orders (~sqrt(n) roundings, 4x margin): damage smaller than this is missed
    eps = float(np.finfo(dtype).eps) if dtype.kind == "f" else 0.0
    for k, shard in enumerate(group.shards):
        if shard.sum is None or shard.min is None or shard.max is None:
            continue
        bound = max(abs(shard.min), abs(shard.max)) * group.num_rows
        if abs(totals[k] - shard.sum) > _sum_tolerance(bound, group.num_rows, eps):
            raise _disagreement(
                catalog,
                group,
                k,
                0,
                group.num_rows,
                f"sum of all values {float(totals[k])!r}, metadata says {shard.sum!r}",
            )


def _disagreement(
    catalog: Catalog, group: ReadGroup, shard_pos: int | None, start: int, stop: int, what: str
) -> TsFileFormatError:
    info = catalog.files[group.file_index]
    device = ".".join(map(str, group.device))
    series = (
        f"series {device}.{group.shards[shard_pos].measurement}"
        if shard_pos is not None
        else f"device {device}"
    )
    return TsFileFormatError(
        f"{info.name}: {series}, rows [{start}, {stop}): {what}; the decoded data disagree "
        f"with the file's own statistics: the file is damaged (or changed while in use); "
        f"{SKIP_HINT}"
    )


def _sum_tolerance(total_abs: float, num_rows: int, eps: float) -> float:
    """Rounding (machine epsilon ``eps``) plus two float64 summations in different orders."""
    return total_abs * (eps + 4 * np.sqrt(num_rows) * 2.0**-52) + 1e-12


class EpochSums:
    """Column sums of the batches of one epoch, checked against the metadata at its end.

    Args:
        catalog: the dataset's catalog.
        eps: machine epsilon of the values' dtype (their rounding is allowed for).
    """

    def __init__(self, catalog: Catalog, eps: float):
        self.catalog = catalog
        self.eps = eps
        self.rows = 0
        self.sums = np.zeros(len(catalog.columns), dtype=np.float64)

    def add(self, values: np.ndarray) -> None:
        """Add one ``(rows, columns)`` batch."""
        self.add_sums(values.shape[0], column_sums(values))

    def add_sums(self, rows: int, sums: np.ndarray) -> None:
        """Add the :func:`column_sums` of one batch of ``rows`` rows, made elsewhere (a
        DataLoader worker, before a user's ``collate_fn``)."""
        if sums.shape != self.sums.shape:
            raise ValueError(
                f"a batch's sums have {sums.shape[0] if sums.ndim else 0} columns, the catalog "
                f"{len(self.sums)}: they were not made from this dataset's batches"
            )
        self.rows += int(rows)
        self.sums += sums

    def check(self) -> bool:
        """Raise TsFileFormatError if a column's sum disagrees; return False if not checkable.

        Only an epoch that delivered exactly ``num_rows`` rows can be checked (the caller makes
        sure they were every row once: a full pass, not random windows or a subset).
        """
        if self.rows != self.catalog.num_rows:
            return False
        for k, col in enumerate(self.catalog.columns):
            if col.sum is None or col.min is None or col.max is None:
                continue
            bound = max(abs(col.min), abs(col.max)) * self.catalog.num_rows
            if abs(self.sums[k] - col.sum) > _sum_tolerance(bound, self.catalog.num_rows, self.eps):
                files = sorted({self.catalog.files[s.file_index].name for s in col.shards})
                raise TsFileFormatError(
                    f"{', '.join(files)}: series {col.name}, rows [0, {col.num_rows}): the "
                    f"epoch's values sum to {float(self.sums[k])!r}, the metadata says "
                    f"{col.sum!r}; some values handed out this epoch were wrong: the file is "
                    f"damaged (TsFile pages carry no checksum); check it with "
                    f"`tsfile-torch verify`"
                )
        return True


def column_sums(values: np.ndarray) -> np.ndarray:
    """Return the float64 sum of each column of a ``(rows, columns)`` batch, nulls (NaN) left
    out, as :class:`EpochSums` adds them."""
    sums = values.sum(axis=0, dtype=np.float64)  # faster than nansum when no NaN
    for k in np.flatnonzero(np.isnan(sums)):
        sums[k] = np.nansum(values[:, k], dtype=np.float64)
    return sums


class KeptRowsCheck:
    """The statistics checks of decoded blocks, for rows kept by the disk cache (Note: checked
    blocks): what the rows of a table as handed out must satisfy.

    Args:
        catalog: the catalog the tables' columns index.
        tables: ``(columns, positional)`` of each table; an aligned table (not positional) holds
            fill values, so only its timestamps are checked; an optional third item widens the
            time range by that much on each side (timestamps snapped to a grid).
        dtype: dtype of the kept values.
        normalize: ``normalize(values, table)`` as the values were normalized (an affine map
            per column: bounds map to bounds), or None.
    """

    def __init__(self, catalog: Catalog, tables, dtype, normalize=None):
        self.dtype = np.dtype(dtype)
        self._times, self._bounds, self._names = [], [], []
        eps = float(np.finfo(self.dtype).eps)
        for k, (columns, positional, *slack) in enumerate(tables):
            shards = [s for c in columns for s in catalog.columns[c].shards]
            self._names.append([catalog.columns[c].name for c in columns])
            pad = slack[0] if slack else 0
            self._times.append(
                (min(s.start_time for s in shards) - pad, max(s.end_time for s in shards) + pad)
                if shards
                else None
            )
            if not positional:
                self._bounds.append(None)
                continue
            cols = [catalog.columns[c] for c in columns]
            low = np.array([-np.inf if c.min is None else c.min for c in cols], np.float64)
            high = np.array([np.inf if c.max is None else c.max for c in cols], np.float64)
            if normalize is not None:
                with np.errstate(invalid="ignore", over="ignore"):
                    both = np.asarray(normalize(np.stack([low, high]), k), dtype=np.float64)
                low, high = np.fmin(both[0], both[1]), np.fmax(both[0], both[1])
            # rounding to the kept dtype, with a few ulps to spare
            margin = 4 * eps * np.fmax(np.abs(low), np.abs(high))
            margin = np.where(np.isfinite(margin), margin, 0.0)
            self._bounds.append((low - margin, high + margin))

    def problem(self, table: int, start: int, times: np.ndarray, values: np.ndarray):
        """Return what is wrong with kept rows ``[start, start + n)`` of ``table``, else None."""
        n = len(times)
        if n == 0:
            return None
        if n > 1 and not bool(np.all(times[1:] > times[:-1])):
            bad = int(np.flatnonzero(times[1:] <= times[:-1])[0])
            return f"timestamps not increasing at row {start + bad + 1}"
        span = self._times[table]
        if span is not None and (times[0] < span[0] or times[-1] > span[1]):
            return (
                f"timestamps [{int(times[0])}, {int(times[-1])}] outside the series' time "
                f"range [{span[0]}, {span[1]}]"
            )
        bounds = self._bounds[table]
        if bounds is None:
            return None
        low = np.fmin.reduce(values, axis=0)  # NaN (nulls) ignored
        high = np.fmax.reduce(values, axis=0)
        wrong = np.flatnonzero((low < bounds[0]) | (high > bounds[1]))
        if len(wrong):
            c = int(wrong[0])
            return (
                f"column {self._names[table][c]}: values in [{float(low[c])!r}, "
                f"{float(high[c])!r}], outside the series' "
                f"[{float(bounds[0][c])!r}, {float(bounds[1][c])!r}]"
            )
        return None
