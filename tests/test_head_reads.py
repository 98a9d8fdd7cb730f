"""Head reads: a process reads a group's first rows without its timeline index, by growing time
ranges from the group's first timestamp (Note: head reads in tsfile_torch.read.decode)."""

from __future__ import annotations

import numpy as np
import pytest

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader, synthetic

ROWS = 20000
FIELDS = ["s0", "s1"]


def _times(shape: str) -> np.ndarray:
    rows = np.arange(ROWS, dtype=np.int64)
    if shape == "regular":
        return rows * 10
    if shape == "sparse-then-dense":  # the mean step undershoots the head: several queries
        return np.where(rows < 3000, rows * 100, 300_000 + (rows - 3000))
    if shape == "dense-then-sparse":  # the mean step overshoots it: one query, rows dropped
        return np.where(rows < 15000, rows, 15_000 + (rows - 15000) * 1000)
    raise ValueError(shape)


def _write(path, times: np.ndarray):
    values = np.stack([synthetic.value_of(0, j, np.arange(ROWS)) for j in range(2)], axis=1)
    return synthetic.write_table_devices(path, "t", FIELDS, {"d0": (times, values)})


def _indexes(directory) -> list:
    return sorted(directory.rglob("*.npy")) if directory.exists() else []


def _reads(ds) -> list[str]:
    """The native reads ``ds`` makes from now on, as the reader announces them."""
    seen: list[str] = []
    ds.reader.on_read = lambda what: seen.append(what) if what is not None else None
    return seen


@pytest.mark.parametrize("shape", ["regular", "sparse-then-dense", "dense-then-sparse"])
def test_a_first_batch_is_read_without_the_timeline_index(tmp_path, shape):
    times = _times(shape)
    path = _write(tmp_path / "f.tsfile", times)
    index = tmp_path / "index"
    ds = TsFileDataset(
        path,
        batch_size=4096,
        block_rows=4096,  # blocks of a batch: the first block is the head
        dtype="float64",
        return_timestamps=True,
        index_cache=str(index),
    )
    reads = _reads(ds)
    values, stamps = ds[0]
    assert "rows [0, 4096)" in reads[0]  # the first read, before any of the timeline index
    assert np.array_equal(stamps.numpy(), times[:4096])
    for j in range(2):
        assert np.array_equal(values[:, j].numpy(), synthetic.value_of(0, j, np.arange(4096)))
    got = [ds[i] for i in range(len(ds))]  # later rows go through the index, learned whole
    assert np.array_equal(np.concatenate([t.numpy() for _, t in got]), times)
    assert np.array_equal(
        np.concatenate([v.numpy() for v, _ in got])[:, 1], synthetic.value_of(0, 1, range(ROWS))
    )
    assert len(_indexes(index)) == 1
    assert any("for the timeline index" in what for what in reads)


def test_series_of_several_chunks_read_their_first_batch_through_the_index(tmp_path):
    # Note: whole time column first: rows of a chunk after a damaged one must never go out
    synthetic.write_table_files(
        tmp_path / "data", synthetic.DatasetSpec(1, 1, 2, ROWS), flush_every=5000
    )
    index = tmp_path / "index"
    ds = TsFileDataset(
        tmp_path / "data", batch_size=4096, block_rows=4096, dtype="float64", index_cache=index
    )
    reads = _reads(ds)
    batch = ds[0]
    assert "for the timeline index" in reads[0]
    assert np.array_equal(batch[:, 0].numpy(), synthetic.value_of(0, 0, np.arange(4096)))
    assert len(_indexes(index)) == 1


def test_unaligned_tree_series_are_read_from_their_head_in_one_piece(tmp_path):
    rows = np.arange(ROWS)
    times = _times("sparse-then-dense")
    values = {f"m{j}": (times, synthetic.value_of(0, j, rows)) for j in range(3)}
    path = synthetic.write_tree_series(tmp_path / "tree.tsfile", {"root.sg.d0": values})
    ds = TsFileIterableDataset(
        path,
        batch_size=4096,
        block_rows=4096,
        dtype="float64",
        index_cache=False,
        cache="memory",
        return_timestamps=True,
    )
    for workers in (0, 2):
        context = {"multiprocessing_context": "fork"} if workers else {}
        loader = make_loader(ds, num_workers=workers, **context)
        batches = sorted(((t.numpy(), v.numpy()) for v, t in loader), key=lambda b: b[0][0])
        stamps, got = (np.concatenate(p) for p in zip(*batches, strict=True))
        assert np.array_equal(stamps, times), workers  # each worker reads its share's head
        for j in range(3):
            assert np.array_equal(got[:, j], synthetic.value_of(0, j, rows)), (workers, j)


class _Without:
    """tsfile metadata as a binding without ``chunk_meta_count`` gives it."""

    def __init__(self, inner, timeseries=None):
        self._inner, self._timeseries = inner, timeseries

    def __getattr__(self, name):
        if name == "chunk_meta_count":
            raise AttributeError(name)
        if name == "timeseries" and self._timeseries is not None:
            return self._timeseries
        return getattr(self._inner, name)


def test_a_binding_that_does_not_count_chunks_reads_through_the_index(tmp_path, monkeypatch):
    """An unknown chunk count is not one chunk: the head read is only for series known whole."""
    from tsfile_torch.catalog import build

    real = build._read_metadata

    def without_counts(source):
        metadata, schemas = real(source)
        hidden = {
            device: _Without(group, [_Without(ts) for ts in group.timeseries])
            for device, group in metadata.items()
        }
        return hidden, schemas

    monkeypatch.setattr(build, "_read_metadata", without_counts)
    times = _times("regular")
    path = _write(tmp_path / "f.tsfile", times)
    ds = TsFileDataset(path, batch_size=4096, block_rows=4096, dtype="float64", index_cache=False)
    assert {shard.chunks for col in ds.core.catalog.columns for shard in col.shards} == {0}
    reads = _reads(ds)
    values = ds[0].numpy()
    assert "for the timeline index" in reads[0]
    for j in range(2):
        assert np.array_equal(values[:, j], synthetic.value_of(0, j, np.arange(4096)))
