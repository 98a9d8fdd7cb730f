"""Ray Data over TsFiles: datasources whose read tasks call the reading core (``pip install
"tsfile-torch[ray]"``).

:func:`read_tsfile` gives a ``ray.data.Dataset`` of the rows a
:class:`~tsfile_torch.TsFileIterableDataset` gives (one column per selected series, named as its
``columns``, in the file's own type as ``ray.data.read_parquet`` gives a Parquet file's, or in
one float type with ``dtype=``; plus an int64 ``time`` column with ``return_timestamps=True``);
:func:`read_tsfile_windows` one of the windows a :class:`~tsfile_torch.TsFileWindowDataset`
gives (tensor columns ``x``, ``y``, ``x_times``, ``y_times``, or the Hugging Face names with
``return_dict=True``). Both are built on Ray Data's public datasource API (``Datasource``,
``ReadTask``, ``BlockMetadata``, ``ray.data.read_datasource``).

Note: a Ray read task is a view. The driver builds the view's reading core (sources expanded,
screened and validated, catalog from metadata: no value read, except where the view itself
needs values to number its items: ``align=``, ``max_missing=``, ``normalize="standard"``) and
plans the tasks from the catalog alone. The core (no native handles) is put once into Ray's
object store; each task gets its own copy, opens its readers in its Ray worker process and asks
the core for its rows, with every guarantee of the datasets: change checks, statistics checks,
errors naming the file. A task reports its row count, size and files from metadata, and closes
its readers when it ends.

Note: task planning. Rows: the cuts are the rows where a file shard of some column begins or
ends (a series continued across files: day1.tsfile, day2.tsfile), so a task reads rows of whole
shards or a part of one shard: one time-range query per file and device. Windows: the cuts
are the window blocks (windows whose first row lies in one ``block_rows`` run of one device,
:meth:`~tsfile_torch.data.window_index.WindowIndex.blocks`), so a task reads its rows plus the
``context_length + horizon - 1`` rows after them, never a window twice or none at a cut. Tasks
are runs of whole units when fewer tasks are wanted than there are units, else units are cut
further (evenly, by rows or windows). How many: ``override_num_blocks`` when given, else one
task per :data:`TASK_BYTES` of output (at most Ray's ``parallelism``, at least one).

Note: the file's types. Without ``dtype``, a column has its series' type (:data:`ARROW_TYPES`:
BOOLEAN bool, INT32 int32, INT64 and TIMESTAMP int64, FLOAT float32, DOUBLE float64) and nulls
are Arrow nulls. The core decodes float64 (nulls NaN), which holds every BOOLEAN, INT32, FLOAT
and DOUBLE value and every integer below 2**53 exactly; a task casts each column back with its
null mask. An INT64 / TIMESTAMP column whose metadata min / max reach 2**53 (or that has none)
is read a second time as int64 through tsfile's prepared series, for the timestamps of the
task's rows (a filled aligned row: its sample's), each value checked against the core's checked
float64 value of it (rounded to the nearest float64 there). A NaN stored in a
FLOAT / DOUBLE series reads as null: the core's NaN means null. With ``dtype=`` every column
is that float type and nulls are NaN, as in the datasets' batches.

Note: sums across read tasks. A reader checks a series' sum against the metadata once one
process has decoded every row of it in a file (Note: cell sums in
:mod:`tsfile_torch.integrity.checks`): a task reading a whole file shard does. For a shard cut
between tasks, each task sends the column sums of its part to one small actor (no CPU, one per
Ray job, named ``tsfile_torch.ray.sum_check``) that the plan was registered with; the task that
completes a shard gets the verdict and raises the error naming the file, after its rows went
out (as a DataLoader epoch's sum check does). Each shard is checked once, on the first pass
that read all of it (as a process's cells are). Rows aligned on time (``align=``) are not the
series' samples, and windows read tails twice: their cut shards get the per-block checks only
(timestamps, first / last value, min / max).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import uuid
import warnings
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import ray.data
from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata
from ray.data.extensions import ArrowTensorArray

from tsfile_torch.errors import SKIP_HINT, TsFileFormatError
from tsfile_torch.integrity.checks import check_group_sums
from tsfile_torch.native.guard import guarded_call
from tsfile_torch.native.queries import query
from tsfile_torch.options import check_int
from tsfile_torch.read.core import ReadingCore
from tsfile_torch.sources.base import FileObject

__all__ = [
    "ARROW_TYPES",
    "TASK_BYTES",
    "StackColumns",
    "TsFileDatasource",
    "TsFileWindowDatasource",
    "read_tsfile",
    "read_tsfile_windows",
    "stack_columns",
]

logger = logging.getLogger(__name__)

#: Output bytes per read task when ``override_num_blocks`` is not given.
TASK_BYTES = 16 << 20
#: Largest block a task yields at once (a task of more rows yields several).
BLOCK_BYTES = 32 << 20
#: Name of the timestamps column (``return_timestamps=True``): series names always hold a dot.
TIME_COLUMN = "time"
#: tsfile type -> the Arrow type of its column in :func:`read_tsfile`'s rows without ``dtype``
#: (Note: the file's types).
ARROW_TYPES = {
    "BOOLEAN": pa.bool_(),
    "INT32": pa.int32(),
    "INT64": pa.int64(),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "TIMESTAMP": pa.int64(),
}
#: Integers of smaller magnitude are exact in float64 (Note: the file's types).
_FLOAT64_EXACT = 2**53
#: The core's warnings about float output that the file's types do not have: NaN nulls, and
#: integers float64 rounds (read exactly here).
_FLOAT_WARNINGS = r"integer columns .* hold values beyond|[\d,]+ values of the selected columns"
#: Window-dataset arguments that order or shard items: Ray orders and shards a Dataset itself.
_ORDER_ARGUMENTS = (
    "order",
    "shuffle",
    "seed",
    "drop_last",
    "shuffle_blocks",
    "num_samples",
    "device_weights",
    "rank",
    "world_size",
)


def read_tsfile(
    sources,
    columns: Sequence[str] | str | None = None,
    *,
    override_num_blocks: int | None = None,
    ray_remote_args: dict | None = None,
    **read_options,
) -> ray.data.Dataset:
    """Return a ``ray.data.Dataset`` of the rows a ``TsFileIterableDataset`` gives.

    One column per selected series, named and ordered as the datasets' ``columns``, plus
    ``time`` (int64) with ``return_timestamps=True``; rows across files in the datasets' order
    (Ray keeps block order only with ``DataContext.execution_options.preserve_order``). A
    column has its series' type (:data:`ARROW_TYPES`: bool, int32, int64, float32, float64;
    nulls are Arrow nulls), as ``ray.data.read_parquet`` keeps a Parquet file's; with ``dtype``
    every column is that float type and nulls are NaN, as in the datasets' batches (Note: the
    file's types).

    Args:
        sources: paths, directories, globs or fsspec URLs (``s3://...``), or a list of them:
            what the datasets take, except file objects (they cannot travel to Ray workers).
        columns: ``None`` for every numeric field, or exact names / glob patterns.
        override_num_blocks: read tasks to plan (see Note: task planning); ``None``: one per
            :data:`TASK_BYTES` of output.
        ray_remote_args: passed to ``ray.data.read_datasource`` (``{"num_cpus": 2}``...).
        **read_options: :class:`~tsfile_torch.options.ReadOptions` fields (``start_time``,
            ``end_time``, ``read_backend``, ``storage_options``, ``align``, ``fill``,
            ``validate``, ``return_timestamps``...). ``dtype`` (``"float32"``,
            ``torch.float64``...) defaults to None here: the file's types. ``decode_threads``
            defaults to 1: a task holds one Ray CPU.

    Raises:
        TsFileFormatError, SchemaError, MappingError, ValueError, TypeError: as the datasets,
        when the dataset is built on the driver; a read task raises them naming the file.
    """
    _check_remote_args(ray_remote_args)
    source = TsFileDatasource(sources, columns, override_num_blocks, **read_options)
    return ray.data.read_datasource(
        source, override_num_blocks=override_num_blocks, ray_remote_args=ray_remote_args
    )


def read_tsfile_windows(
    sources,
    context_length: int,
    *window,
    override_num_blocks: int | None = None,
    ray_remote_args: dict | None = None,
    **window_options,
) -> ray.data.Dataset:
    """Return a ``ray.data.Dataset`` of the windows a ``TsFileWindowDataset`` gives.

    Same windows, same count, same values, in window order: tensor columns ``x``
    ``(context_length, len(columns))`` and ``y`` ``(horizon, len(targets))`` (no ``y`` with
    ``horizon=0``), ``x_times`` / ``y_times`` (int64) with ``return_timestamps=True``; with
    ``return_dict=True`` the dataset's dict keys (``past_values``, ``past_observed_mask``, ...,
    ``device_id``, ``static_categorical_features``).

    Args:
        sources, context_length, *window (``horizon``, ``stride``, ``columns``, ``targets``,
            ``devices``): as :class:`~tsfile_torch.TsFileWindowDataset`.
        override_num_blocks, ray_remote_args: as :func:`read_tsfile`.
        **window_options: the window dataset's other arguments (``return_dict``,
            ``time_features``, ``min_context``, ``max_missing``, ``normalize``,
            ``normalize_by``) and read options, except those that order items (``order``,
            ``shuffle``, ``seed``, ...): ``Dataset.random_shuffle()`` or
            ``iter_torch_batches(local_shuffle_buffer_size=...)`` order them in Ray.

    Raises:
        As the window dataset when built on the driver; a read task raises naming the file.
    """
    _check_remote_args(ray_remote_args)
    source = TsFileWindowDatasource(
        sources, context_length, *window, override_num_blocks=override_num_blocks, **window_options
    )
    return ray.data.read_datasource(
        source, override_num_blocks=override_num_blocks, ray_remote_args=ray_remote_args
    )


def _check_remote_args(ray_remote_args) -> None:
    if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
        raise TypeError(
            f"ray_remote_args should be a dict of Ray task options such as {{'num_cpus': 2}}, "
            f"but got ray_remote_args={ray_remote_args!r}"
        )


def stack_columns(columns: Sequence[str], dtype="float32") -> StackColumns:
    """Return a ``collate_fn`` for ``iter_torch_batches`` that stacks ``columns`` into one
    ``(batch, len(columns))`` tensor: the batch a ``TsFileIterableDataset`` yields.

    ``ds.iter_torch_batches(batch_size=8192, collate_fn=stack_columns(source.columns))``:
    float32 (``dtype``: a torch dtype or its name; None keeps numpy's common type of the
    columns), nulls NaN, whatever the columns' types.
    """
    return StackColumns(columns, dtype)


try:  # Ray 2.47 and later take a collate class; a plain function before
    from ray.data.collate_fn import NumpyBatchCollateFn as _CollateBase
except ImportError:  # pragma: no cover - older Ray
    _CollateBase = object


class StackColumns(_CollateBase):
    """``collate_fn``: the named columns of a numpy batch as one ``(rows, columns)`` tensor
    (``dtype``: a torch dtype or its name to convert to; None keeps numpy's common type)."""

    def __init__(self, columns: Sequence[str], dtype="float32"):
        import torch

        self.columns = list(columns)
        self.dtype = None if dtype is None else str(dtype).replace("torch.", "")
        if self.dtype is not None and not isinstance(getattr(torch, self.dtype, None), torch.dtype):
            raise ValueError(
                f"dtype must be a torch dtype, its name ('float32', 'float64'...) or None; "
                f"got {dtype!r}"
            )

    def __call__(self, batch: dict[str, np.ndarray]):
        import torch

        stacked = np.stack([_numbers(batch[c]) for c in self.columns], axis=1)
        tensor = torch.from_numpy(stacked)
        return tensor if self.dtype is None else tensor.to(getattr(torch, self.dtype))


def _numbers(column: np.ndarray) -> np.ndarray:
    """Return a numpy batch column as numbers: Arrow hands a bool column with nulls to numpy as
    objects (None for null), which become float64 with NaN."""
    if column.dtype != object:
        return column
    return np.where(np.equal(column, None), np.nan, column).astype(np.float64)


class TsFileDatasource(Datasource):
    """The rows of TsFiles as a Ray datasource (see :func:`read_tsfile` and the module notes).

    Exposes what the driver knows: :attr:`columns`, :attr:`catalog`, :attr:`num_rows`,
    :meth:`schema` (the file's types, or ``dtype``'s: :attr:`file_types`), :meth:`stats`
    (metadata statistics: no value read).
    """

    def __init__(
        self,
        sources,
        columns: Sequence[str] | str | None = None,
        override_num_blocks: int | None = None,
        **read_options,
    ):
        _refuse_bfloat16(read_options)
        if read_options.get("normalize") is not None:
            raise ValueError(
                "read_tsfile does not normalize: scale the columns in the training step with "
                "the datasource's statistics (TsFileDatasource(...).stats(): metadata min / "
                "max / mean, no pass), or use read_tsfile_windows(..., normalize=...)"
            )
        read_options.setdefault("decode_threads", 1)
        self.num_tasks = check_int("override_num_blocks", override_num_blocks, allow_none=True)
        #: whether columns have their series' types, nulls Arrow nulls (no ``dtype``: Note:
        #: the file's types), or all are ``dtype``'s float type, nulls NaN
        self.file_types = read_options.get("dtype") is None
        if self.file_types:
            read_options["dtype"] = "float64"
        with warnings.catch_warnings():
            if self.file_types:
                warnings.filterwarnings("ignore", _FLOAT_WARNINGS)
            self.core = ReadingCore.for_rows(sources, columns, **read_options)
        _refuse_file_objects(self.core)
        self._schema = self._arrow_schema()
        #: the integer columns read again as int64 (Note: the file's types); None: ``dtype``
        self._exact = _wide_integers(self.catalog) if self.file_types else None
        self._row_bytes = sum(max(kind.bit_width // 8, 1) for kind in self._schema.types)

    @property
    def columns(self) -> list[str]:
        """Column names of the rows, as the datasets name them (``time`` not included)."""
        return self.core.catalog.column_names

    @property
    def catalog(self):
        return self.core.catalog

    @property
    def num_rows(self) -> int:
        return self.core.tables[0].num_rows

    def stats(self, exact: bool = False) -> dict[str, dict]:
        """Statistics per column, as ``TsFileIterableDataset.stats`` gives them."""
        return self.core.stats({name: [i] for i, name in enumerate(self.columns)}, exact)

    def get_name(self) -> str:
        return "TsFile"

    def estimate_inmemory_data_size(self) -> int:
        return self.num_rows * self._row_bytes

    def schema(self) -> pa.Schema:
        """The Arrow schema of the rows (Note: the file's types)."""
        return self._schema

    def _arrow_schema(self) -> pa.Schema:
        if self.file_types:
            kinds = [ARROW_TYPES[c.dtype] for c in self.catalog.columns]
        else:
            dtype = "float16" if self.core.options.dtype == "float16" else self.core.dtype
            kinds = [pa.from_numpy_dtype(np.dtype(dtype))] * len(self.columns)
        time = [(TIME_COLUMN, pa.int64())] if self.core.options.return_timestamps else []
        return pa.schema(time + list(zip(self.columns, kinds, strict=True)))

    def plan(self, parallelism: int = -1) -> list[tuple[int, int]]:
        """Return the row ranges ``[start, stop)`` of the read tasks (Note: task planning)."""
        n, table = self.num_rows, self.core.tables[0]
        if table.alignment is None:  # positional rows: file shards are row ranges
            shards = {g.start_row for g in self.catalog.groups}
            shards |= {g.stop_row for g in self.catalog.groups}
            units = np.array(sorted({0, n} | {r for r in shards if 0 < r < n}), dtype=np.int64)
        else:  # aligned rows are numbered by their union / intersection of timestamps
            units = np.array([0, n], dtype=np.int64)
        return _plan(units, n * self._row_bytes, self.num_tasks, parallelism)

    def get_read_tasks(self, parallelism: int, **kwargs) -> list[ReadTask]:
        chunk = max(1, min(self.core.block_rows, BLOCK_BYTES // max(self._row_bytes, 1)))
        schema = self.schema()
        plan = self.plan(parallelism)
        covering = self._cut_shards(plan)
        checker = self._checker(covering)
        core, tasks = _shared(self, self.core), []
        for i, (start, stop) in enumerate(plan):
            sums = (i, checker, [gi for gi, on in covering.items() if i in on])
            read = functools.partial(
                _read_rows, core, start, stop, chunk, schema, sums, self._exact
            )
            task = _read_task(
                read,
                schema,
                kwargs,
                num_rows=stop - start,
                size_bytes=(stop - start) * self._row_bytes,
                input_files=self._files(start, stop),
            )
            tasks.append(task)
        return tasks

    def _checker(self, covering: dict[int, list[int]]) -> tuple | None:
        """Return (the job's sum-check actor, this plan's key) for the cut shards ``covering``,
        registered once per plan (Ray asks for the read tasks again at every execution)."""
        if not covering:
            return None
        key = tuple((gi, tuple(tasks)) for gi, tasks in sorted(covering.items()))
        made = self.__dict__.get("_sum_check")
        if made is None or made[0] != key:
            actor = _sum_check_actor()
            plan = uuid.uuid4().hex
            # before any task can report: registered when this call returns
            ray.get(actor.register.remote(plan, self.catalog, self.core.dtype, covering))
            made = self._sum_check = (key, (actor, plan))
        return made[1]

    def _cut_shards(self, plan: list[tuple[int, int]]) -> dict[int, list[int]]:
        """Return group -> tasks for the file shards with metadata sums that tasks cut.

        None cut for aligned rows (Note: sums across read tasks), and when Ray is not running
        (tasks called in this process, as a test does): there is no actor to ask.
        """
        core = self.core
        if not core.options.check_statistics or core.tables[0].alignment is not None:
            return {}
        if not ray.is_initialized():
            return {}
        covering = {}
        for gi, g in enumerate(self.catalog.groups):
            tasks = [i for i, (a, b) in enumerate(plan) if a < g.stop_row and b > g.start_row]
            if len(tasks) > 1 and any(s.sum is not None for s in g.shards):
                covering[gi] = tasks
        return covering

    def _files(self, start: int, stop: int) -> list[str]:
        if self.core.tables[0].alignment is not None:
            return [f.name for f in self.catalog.files]
        groups = self.catalog.groups
        hit = {g.file_index for g in groups if g.start_row < stop and g.stop_row > start}
        return [self.catalog.files[i].name for i in sorted(hit)]


class TsFileWindowDatasource(Datasource):
    """The windows of TsFiles as a Ray datasource (see :func:`read_tsfile_windows`).

    Holds the :class:`~tsfile_torch.TsFileWindowDataset` it reads through (:attr:`dataset`):
    a task gathers a contiguous range of its windows (Note: a Ray read task is a view).
    """

    def __init__(
        self,
        sources,
        context_length: int,
        *window,
        override_num_blocks: int | None = None,
        **window_options,
    ):
        from tsfile_torch.data.windows import TsFileWindowDataset

        ordering = [name for name in _ORDER_ARGUMENTS if name in window_options]
        if ordering:
            raise ValueError(
                f"read_tsfile_windows takes no {', '.join(ordering)}: Ray orders and shards the "
                f"windows (ds.random_shuffle(), iter_torch_batches(local_shuffle_buffer_size=N), "
                f"Ray Train's get_dataset_shard); leave them out"
            )
        _refuse_bfloat16(window_options)
        window_options.setdefault("decode_threads", 1)
        self.num_tasks = check_int("override_num_blocks", override_num_blocks, allow_none=True)
        self.dataset = TsFileWindowDataset(sources, context_length, *window, **window_options)
        _refuse_file_objects(self.dataset.core)
        self.dataset.close()  # nothing native travels to the tasks
        self._window_bytes = _window_bytes(self.dataset)

    @property
    def num_windows(self) -> int:
        return len(self.dataset)

    def get_name(self) -> str:
        return "TsFileWindows"

    def estimate_inmemory_data_size(self) -> int:
        return self.num_windows * self._window_bytes

    def plan(self, parallelism: int = -1) -> list[tuple[int, int]]:
        """Return the window ranges ``[first, stop)`` of the read tasks (Note: task planning)."""
        units = self.dataset.index.blocks(self.dataset.block_rows)
        return _plan(units, self.num_windows * self._window_bytes, self.num_tasks, parallelism)

    def get_read_tasks(self, parallelism: int, **kwargs) -> list[ReadTask]:
        chunk = max(1, BLOCK_BYTES // max(self._window_bytes, 1))
        dataset, tasks = _shared(self, self.dataset), []
        for first, stop in self.plan(parallelism):
            read = functools.partial(_read_windows, dataset, first, stop, chunk)
            task = _read_task(
                read,
                None,
                kwargs,
                num_rows=stop - first,
                size_bytes=(stop - first) * self._window_bytes,
                input_files=self._files(first, stop),
            )
            tasks.append(task)
        return tasks

    def _files(self, first: int, stop: int) -> list[str]:
        ds = self.dataset
        devices = np.unique(ds.index.locate(np.array([first, stop - 1]))[0]).tolist()
        columns = {c for k in range(devices[0], devices[-1] + 1) for c in ds.tables[k].columns}
        hit = {s.file_index for c in columns for s in ds.catalog.columns[c].shards}
        return [ds.catalog.files[i].name for i in sorted(hit)]


# -- the read tasks (run in Ray workers) -------------------------------------------------------
def _read_rows(
    core,
    start: int,
    stop: int,
    chunk: int,
    schema: pa.Schema,
    sums: tuple[int, tuple | None, list[int]],
    exact: tuple[int, ...] | None,
) -> Iterator[pa.Table]:
    """Yield rows ``[start, stop)`` of the core's table as Arrow tables of ``chunk`` rows.

    ``core``: the datasource's core, or its reference in the object store (:func:`_shared`).
    ``sums``: (this task's number, (the sum-check actor, the plan's key) or None, the cut shards
    this task reads a part of) (Note: sums across read tasks). ``exact``: None for one float
    dtype; else columns have the schema's types, and those at these positions are read again
    as int64 (Note: the file's types).
    """
    core = _own_copy(core)
    with_time = schema.names[0] == TIME_COLUMN
    kinds = schema.types[1:] if with_time else schema.types
    float16 = core.options.dtype == "float16"
    task, checker, cut = sums
    width = len(core.tables[0].columns)
    totals = {gi: np.zeros(len(core.catalog.groups[gi].columns)) for gi in cut}
    try:
        core.start_epoch(0)  # the files are still the ones the driver's catalog describes
        core.set_range(start, stop)  # decode only this task's rows
        for lo in range(start, stop, chunk):
            hi = min(lo + chunk, stop)
            # column-major, as tsfile decodes: each Arrow column wraps its values, no transpose
            out = np.empty((hi - lo, width), dtype=core.dtype, order="F")
            values, times = core.rows(0, lo, hi, out=(out, None))
            for gi in cut:
                totals[gi] += _group_sums(core.catalog.groups[gi], lo, values)
            arrays = [pa.array(times)] if with_time else []
            if exact is not None:
                for j, (column, kind) in enumerate(zip(core.tables[0].columns, kinds, strict=True)):
                    wide = None
                    if j in exact:
                        wide = _exact_integers(core, column, values[:, j], times)
                    arrays.append(_typed(values[:, j], kind, wide))
            else:
                if float16:
                    values = values.astype(np.float16, order="F")
                arrays += [pa.array(values[:, j]) for j in range(width)]
            yield pa.Table.from_arrays(arrays, schema=schema)
        if cut:
            actor, plan = checker
            try:
                failure = ray.get(actor.add.remote(plan, task, totals))
            except ray.exceptions.RayActorError as err:  # its owner process ended
                logger.warning("shard sums not checked across read tasks: %s", err)
                failure = None
            if failure is not None:
                raise TsFileFormatError(failure)
    finally:
        core.close()


def _typed(values: np.ndarray, kind: pa.DataType, exact: np.ndarray | None = None) -> pa.Array:
    """Return one column of float64 ``values`` (nulls NaN) as Arrow ``kind``, nulls as nulls;
    ``exact``: the column's int64 values, read exactly (Note: the file's types)."""
    nulls = np.isnan(values)
    if exact is not None:
        data = exact
    elif pa.types.is_boolean(kind):
        data = values != 0
    elif pa.types.is_integer(kind):
        data = np.where(nulls, 0, values).astype(kind.to_pandas_dtype())
    else:
        data = values.astype(kind.to_pandas_dtype(), copy=False)
    return pa.array(data, type=kind, mask=nulls if nulls.any() else None)


def _wide_integers(catalog) -> tuple[int, ...]:
    """Positions of the INT64 / TIMESTAMP columns that metadata do not show to lie below 2**53
    in magnitude: min / max missing, or not strictly below it (they are floats, and a value
    beyond 2**53 rounds to no less than 2**53)."""
    return tuple(
        j
        for j, c in enumerate(catalog.columns)
        if c.dtype in ("INT64", "TIMESTAMP")
        and not (c.min is not None and c.max is not None and max(-c.min, c.max) < _FLOAT64_EXACT)
    )


def _exact_integers(core, column: int, rounded: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Return catalog column ``column`` at the rows of timestamps ``times`` as exact int64.

    ``rounded``: the core's float64 values of those rows (NaN: null, 0 then). Each row's sample
    (its own, or the one ``fill="ffill"`` repeats) is read again as int64 and checked against
    its rounded value; a row without a sample keeps its fill (Note: the file's types).

    Raises:
        TsFileFormatError: the two reads disagree (the file changed or is damaged), naming it.
    """
    nulls = np.isnan(rounded)
    out = np.where(nulls, 0, rounded).astype(np.int64)
    at, has = _sample_times(core.tables[0], column, times)
    has &= ~nulls
    if not has.any():
        return out
    wanted = at[has]
    stamps, samples, valid = _int64_samples(core, column, int(wanted.min()), int(wanted.max()))
    pos = np.minimum(np.searchsorted(stamps, wanted), max(len(stamps) - 1, 0))
    if len(stamps):
        found = samples[pos]
        agree = (stamps[pos] == wanted) & valid[pos] & (found.astype(np.float64) == rounded[has])
    else:
        found, agree = np.zeros(len(wanted), np.int64), np.zeros(len(wanted), bool)
    if not agree.all():
        k = int(np.argmin(agree))
        raise TsFileFormatError(_disagree(core.catalog, column, int(wanted[k]), rounded[has][k]))
    out[has] = found
    return out


def _sample_times(table, column: int, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return, for rows of timestamps ``times``, the timestamp of catalog column ``column``'s
    sample each row holds, and whether it holds one (an aligned row may hold a fill)."""
    if table.alignment is None:  # positional rows: every row is a sample of every column
        return times, np.ones(len(times), dtype=bool)
    alignment = table.alignment
    own = next(t.times for t in alignment.timelines if column in t.catalog_columns)
    if not len(own):
        return times, np.zeros(len(times), dtype=bool)
    if alignment.fill == "ffill":  # as align_to repeats them
        last = np.searchsorted(own, times, side="right") - 1
        return own[np.maximum(last, 0)], last >= 0
    at = np.minimum(np.searchsorted(own, times), len(own) - 1)
    return times, own[at] == times


def _int64_samples(core, column: int, t0: int, t1: int):
    """Return (timestamps, int64 values, validity) of catalog column ``column``'s samples in
    ``[t0, t1]``, through the core's open readers, each query guarded as the core's are."""
    catalog, reader = core.catalog, core.reader
    name = catalog.columns[column].name
    stamps, values = [], []
    for gi, group in enumerate(catalog.groups):
        if column not in group.columns or group.end_time < t0 or group.start_time > t1:
            continue
        opened, handles = reader.files.handles(gi, group)
        handle = handles[group.columns.index(column)]
        lo, hi = max(t0, group.start_time), min(t1, group.end_time)
        what = f"reading series {name} as int64, timestamps [{lo}, {hi}] via {reader.read_backend}"
        info = catalog.files[group.file_index]
        got = guarded_call(
            info, what, _query_int64, opened, handle, group.aligned, lo, hi, on_read=reader.on_read
        )
        stamps += got[0]
        values += got[1]
    if not stamps:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool)
    samples = pa.concat_arrays([v.cast(pa.int64()) for v in values])
    valid = samples.is_valid().to_numpy(zero_copy_only=False)
    return (
        np.concatenate(stamps),
        samples.fill_null(0).to_numpy(zero_copy_only=False),
        valid,
    )


def _query_int64(opened, handle, aligned: bool, lo: int, hi: int):
    """Return the timestamps (numpy) and values (Arrow) of one series in ``[lo, hi]``.

    An aligned series is queried as two columns (the same handle twice), as
    :func:`~tsfile_torch.native.queries.query_times` does: the path the core's reads take.
    """
    stamps, values = [], []
    for result in query(opened, [handle, handle] if aligned else [handle], aligned, lo, hi):
        with result:
            while (batch := result.read_arrow_record_batch()) is not None:
                stamps.append(batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64))
                values.append(batch.column(1))
    return stamps, values


def _disagree(catalog, column: int, time: int, rounded: float) -> str:
    """Return the message of an int64 re-read that disagrees with the core's checked read."""
    files = {
        catalog.files[s.file_index].name
        for s in catalog.columns[column].shards
        if s.start_time <= time <= s.end_time
    }
    return (
        f"{', '.join(sorted(files)) or 'the sources'}: series {catalog.columns[column].name} at "
        f"time {time}: reading it as int64 does not give the sample read before ({rounded!r}); "
        f"the file is damaged or was changed while in use; {SKIP_HINT}"
    )


def _group_sums(group, lo: int, values: np.ndarray) -> np.ndarray:
    """Column sums (float64, nulls skipped) of ``group``'s columns in rows ``lo + [0, n)``."""
    a, b = max(group.start_row - lo, 0), min(group.stop_row - lo, len(values))
    if a >= b:
        return np.zeros(len(group.columns))
    part = values[a:b, list(group.columns)]
    totals = part.sum(axis=0, dtype=np.float64)
    for k in np.flatnonzero(np.isnan(totals)):
        totals[k] = np.nansum(part[:, k], dtype=np.float64)
    return totals


#: Name of the one sum-check actor of a Ray job (Note: sums across read tasks).
_SUM_CHECK = "tsfile_torch.ray.sum_check"
#: Plans it remembers (the oldest is forgotten first): a plan is a few numbers per cut shard.
_SUM_CHECK_PLANS = 256
#: Ray job id -> the sum-check actor this process made or found: a named actor lives while its
#: creator holds a handle, so the process that plans (the driver, Ray Train's split
#: coordinator) keeps one for as long as it runs.
_SUM_CHECKS: dict[str, object] = {}


def _sum_check_actor():
    """Return this Ray job's sum-check actor, made on first use."""
    job = ray.get_runtime_context().get_job_id()
    if job not in _SUM_CHECKS:
        _SUM_CHECKS[job] = _SumCheck.options(name=_SUM_CHECK, get_if_exists=True).remote()
    return _SUM_CHECKS[job]


@ray.remote(num_cpus=0)
class _SumCheck:
    """The sums of file shards cut between read tasks, for every plan of a Ray job (Note: sums
    across read tasks): one actor per job, not one process per dataset."""

    def __init__(self):
        self.plans: dict[str, dict] = {}

    def register(self, plan: str, catalog, dtype, covering: dict[int, list[int]]) -> None:
        """Expect, for each cut shard (group), the sums of the tasks that read a part of it."""
        if len(self.plans) >= _SUM_CHECK_PLANS:
            self.plans.pop(next(iter(self.plans)))
        covering = {gi: set(tasks) for gi, tasks in covering.items()}
        self.plans[plan] = {
            "catalog": catalog,
            "dtype": dtype,
            "covering": covering,
            "parts": {},
            "checked": set(),
        }

    def add(self, plan: str, task: int, totals: dict[int, np.ndarray]) -> str | None:
        """Add one task's sums; return the message of a shard found wrong, else None."""
        state = self.plans.get(plan)
        if state is None:  # forgotten: a plan this old is not checked
            return None
        for gi, total in totals.items():
            if gi not in state["covering"] or gi in state["checked"]:
                continue
            parts = state["parts"].setdefault(gi, {})
            parts[task] = total  # a task run again (a retry, a later pass) counts once
            if set(parts) == state["covering"][gi]:
                state["checked"].add(gi)
                whole = np.sum(list(parts.values()), axis=0)
                try:
                    check_group_sums(state["catalog"], gi, whole, state["dtype"])
                except TsFileFormatError as err:
                    return str(err)
        return None


def _read_windows(dataset, first: int, stop: int, chunk: int) -> Iterator[pa.Table]:
    """Yield windows ``[first, stop)`` of ``dataset`` (or its reference, :func:`_shared`) as
    Arrow tables of ``chunk`` windows."""
    dataset = _own_copy(dataset)
    try:
        for lo in range(first, stop, chunk):
            batch = dataset.gather(np.arange(lo, min(lo + chunk, stop)))
            names = list(batch.keys) if batch.keys is not None else _tuple_names(dataset)
            arrays = [_arrow(part.numpy()) for part in batch.parts]
            yield pa.Table.from_arrays(arrays, names=names)
    finally:
        dataset.close()


def _tuple_names(dataset) -> list[str]:
    """Column names of tuple items (the parts of a WindowBatch, in order)."""
    names = ["x", "y"] if dataset.horizon else ["x"]
    if dataset.options.return_timestamps:
        names += ["x_times", "y_times"] if dataset.horizon else ["x_times"]
    return names


def _arrow(array: np.ndarray) -> pa.Array:
    return pa.array(array) if array.ndim == 1 else ArrowTensorArray.from_numpy(array)


def _shared(source: Datasource, view):
    """Return ``view`` (a core or a window dataset) put once into Ray's object store.

    Every task of a plan then carries a reference, not a copy of the catalog (thousands of
    files, a window index with ``max_missing``): a node fetches the object once. Ray not
    running (tasks called in this process): ``view`` itself.
    """
    if not ray.is_initialized():
        return view
    made = source.__dict__.get("_shared_view")
    if made is None:
        made = source._shared_view = ray.put(view)
    return made


def _own_copy(view):
    """Return this task's own copy of a view passed by :func:`_shared` (a task opens readers)."""
    return ray.get(view) if isinstance(view, ray.ObjectRef) else view


# -- planning helpers --------------------------------------------------------------------------
def _plan(units: np.ndarray, nbytes: int, num_tasks: int | None, parallelism: int):
    """Return the ranges ``[start, stop)`` of the read tasks over ``units`` (boundaries a task
    may cut at) of ``nbytes`` in all: ``num_tasks`` of them, else one per ``TASK_BYTES``, at
    most ``parallelism`` (Note: task planning)."""
    wanted = num_tasks
    if wanted is None:
        wanted = max(1, math.ceil(nbytes / TASK_BYTES))
        if parallelism and parallelism > 0:
            wanted = min(wanted, parallelism)
    cuts = _cuts(units, wanted)
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True))


def _cuts(units: np.ndarray, wanted: int) -> np.ndarray:
    """Return task boundaries over ``[0, units[-1])`` given unit boundaries ``units``.

    Fewer tasks wanted than units: runs of whole units of about equal size. More: every unit
    boundary plus even cuts, so that about ``wanted`` tasks come out.
    """
    total = int(units[-1])
    if total == 0:
        return np.array([0], dtype=np.int64)
    even = np.unique(np.round(np.linspace(0, total, min(wanted, total) + 1)).astype(np.int64))
    if wanted < len(units) - 1:
        return np.unique(units[np.searchsorted(units, even)])
    return np.union1d(units, even)


def _window_bytes(dataset) -> int:
    """Bytes of one window as a Ray row (values, times, masks, features, ids)."""
    length, itemsize = dataset.context_length + dataset.horizon, dataset.options.itemsize
    width = len(dataset.columns) * dataset.context_length + len(dataset.targets) * dataset.horizon
    nbytes = width * itemsize
    if dataset.options.return_timestamps or dataset.return_dict:
        nbytes += 8 * length
    if dataset.return_dict:
        nbytes += width * itemsize + 8 * (1 + len(dataset.tag_vocab))
        nbytes += 4 * length * len(dataset.time_features)
    return nbytes


def _read_task(read, schema: pa.Schema | None, kwargs: dict, **metadata) -> ReadTask:
    """Return a ReadTask of ``read`` with its metadata, for the Ray version installed.

    ``schema`` moved from BlockMetadata to ReadTask in Ray 2.4x; ``exec_stats`` is None before
    a task runs; ``per_task_row_limit`` (newer Ray) is passed on where Ray gave one.
    """
    fields = {"exec_stats": None, "schema": schema, **metadata}
    accepted = inspect.signature(BlockMetadata).parameters
    block = BlockMetadata(**{k: v for k, v in fields.items() if k in accepted})
    accepted = inspect.signature(ReadTask).parameters
    extra = {"schema": schema} if "schema" in accepted else {}
    if "per_task_row_limit" in accepted and kwargs.get("per_task_row_limit") is not None:
        extra["per_task_row_limit"] = kwargs["per_task_row_limit"]
    return ReadTask(read, block, **extra)


def _refuse_bfloat16(options: dict) -> None:
    if str(options.get("dtype", "")).replace("torch.", "") == "bfloat16":
        raise ValueError(
            "Arrow has no bfloat16 type: read dtype=torch.float32 and convert in "
            "iter_torch_batches(dtypes=torch.bfloat16)"
        )


def _refuse_file_objects(core: ReadingCore) -> None:
    found = [info.name for info in core.meta.files if isinstance(info.source, FileObject)]
    if found:
        raise TypeError(
            f"read tasks run in Ray worker processes, and a file object cannot travel there "
            f"({found[0]}): pass paths, directories, globs or fsspec URLs (object storage)"
        )
