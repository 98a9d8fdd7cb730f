"""Thin helpers over tsfile's prepared-series API, shared by the catalog and the reader.

``prepare_series`` parses a series' metadata once, so queries on the handles skip the metadata
work that each ``query_table`` call repeats. Queries here always address data by **time range**:
tsfile 2.5.0 decodes every page from ``offset`` to the end of a series whatever ``limit`` says,
while a time range prunes pages by their statistics (see shared/TSFILE_NOTES.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tsfile_torch.native.errors import native_call

__all__ = ["prepare_handles", "query", "query_times"]


def prepare_handles(reader, file_index: int, nbytes: int, name: str, shards: Sequence) -> list:
    """Prepare ``shards`` (one device of one file) on ``reader``; aligned ones share a time owner.

    Raises:
        TsFileFormatError: tsfile refused a series (damaged metadata).
    """
    handles, owner = [], None
    for shard in shards:
        locator = (
            0,
            file_index,
            nbytes,
            0,
            shard.meta_index,
            int(shard.aligned),
            0,
            shard.value_offset,
            shard.value_length,
            shard.time_offset,
            shard.time_length,
        )
        handle = native_call(
            name,
            f"preparing series {shard.measurement!r} of device {'.'.join(map(str, shard.device))}",
            reader.prepare_series,
            locator,
            hint="the file's metadata is damaged",
            time_owner=owner,
            trust_index=True,
        )
        if shard.aligned and owner is None:
            owner = handle
        handles.append(handle)
    return handles


def query(reader, handles: Sequence, aligned: bool, start_time: int, end_time: int):
    """Yield one result set per native query covering ``[start_time, end_time]`` (inclusive).

    Aligned series share one query (values come as columns 1..k); unaligned series are one
    query each, opened one at a time.
    """
    if aligned:
        yield reader.query_prepared_multi(list(handles), start_time=start_time, end_time=end_time)
    else:
        for h in handles:
            yield reader.query_prepared(h, start_time=start_time, end_time=end_time)


def query_times(reader, handle, aligned: bool, start_time: int, end_time: int) -> np.ndarray:
    """Return the timestamps of one series in ``[start_time, end_time]`` (int64).

    An aligned series is queried as two columns (the same handle twice): tsfile 2.5.0 decodes a
    one-column aligned query on another path, which spins forever on some damaged pages where
    the multi-column path (the one data reads take) returns or raises (measured: a flipped byte
    in a DOUBLE page). The second column costs ~0.3x of a full 8-column decode instead of ~0.1x.
    """
    parts = []
    handles = [handle, handle] if aligned else [handle]
    for result in query(reader, handles, aligned, start_time, end_time):
        with result:
            while (batch := result.read_arrow_record_batch()) is not None:
                parts.append(batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
