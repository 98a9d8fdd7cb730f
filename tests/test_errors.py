"""Bad input: each case a clear error naming the thing, raised when the dataset is built."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from tsfile_torch import (
    SchemaError,
    TsFileDataset,
    TsFileFormatError,
    TsFileIterableDataset,
    TsFileTorchError,
    make_loader,
)


def _first(small_dir):
    return sorted(small_dir.glob("*.tsfile"))[0]


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "nope.tsfile"
    with pytest.raises(TsFileFormatError, match=r"nope.tsfile: no such file or directory"):
        TsFileIterableDataset(missing)


def test_directory_without_tsfiles_names_it(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(TsFileFormatError, match=r"holds no \*.tsfile files"):
        TsFileIterableDataset(tmp_path)


def test_glob_matching_nothing_names_the_pattern(tmp_path):
    with pytest.raises(TsFileFormatError, match=r"x\*.tsfile: glob pattern matches no files"):
        TsFileIterableDataset(str(tmp_path / "x*.tsfile"))


@pytest.mark.parametrize("content", [b"", b"not a tsfile at all" * 50], ids=["empty", "garbage"])
def test_empty_or_garbage_file_is_a_format_error_naming_it(tmp_path, content):
    bad = tmp_path / "bad.tsfile"
    bad.write_bytes(content)
    with pytest.raises(
        TsFileFormatError,
        match=r"bad\.tsfile: opening as a TsFile failed \(.+\); the file is empty, truncated, "
        r"not a TsFile, or damaged",
    ):
        TsFileIterableDataset(bad)


def test_truncated_file_is_a_format_error_naming_it(tmp_path, small_dir):
    data = _first(small_dir).read_bytes()
    bad = tmp_path / "cut.tsfile"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(TsFileFormatError, match=r"cut.tsfile"):
        TsFileDataset(bad)


def test_errors_share_one_base_class(tmp_path):
    with pytest.raises(TsFileTorchError):
        TsFileIterableDataset(tmp_path / "nope.tsfile")


def test_unknown_column_is_a_schema_error(small_dir):
    with pytest.raises(SchemaError, match="'temperature' matches no series"):
        TsFileIterableDataset(small_dir, columns=["temperature"])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"batch_size": 0},
            ValueError,
            r"batch_size should be an integer in \[1, 1099511627776\], but got batch_size=0",
        ),
        ({"batch_size": True}, TypeError, r"batch_size=True"),
        ({"batch_size": 8.5}, TypeError, r"batch_size=8.5"),
        ({"shuffle": 1}, TypeError, r"shuffle should be True or False"),
        ({"drop_last": "yes"}, TypeError, r"drop_last should be True or False"),
        ({"seed": 2.5}, TypeError, r"seed should be an integer \(any sign.*but got seed=2.5"),
        ({"batch_size": np.int64(0)}, ValueError, r"but got batch_size=0"),
        ({"read_backend": "mmpa"}, ValueError, r"got 'mmpa'"),
        ({"dtype": torch.int64}, ValueError, r"dtype must be one of"),
        (
            {"random_batches": 0},
            ValueError,
            r"random_batches should be an integer in \[1, 268435456\], but got random_batches=0",
        ),
        ({"random_batches": 4, "shuffle": True}, ValueError, r"cannot be combined"),
        ({"cache": "ssd"}, ValueError, r"cache must be one of 'none', 'memory', 'disk'; got 'ssd'"),
        ({"validate": "deep"}, ValueError, r"validate should be True, False or 'full'"),
        ({"validate": 1}, TypeError, r"validate should be True, False or 'full'"),
        ({"columns": []}, ValueError, r"columns must be None or a non-empty list"),
        ({"columns": [3]}, TypeError, r"columns must be names or glob patterns \(str\); got 3"),
        ({"order": "sorted"}, ValueError, r"order must be one of 'sequential', 'stretches'"),
        ({"shuffle": True, "order": "sequential"}, ValueError, r"contradicts order='sequential'"),
        ({"nonsense": 1}, TypeError, r"nonsense"),
    ],
)
def test_invalid_arguments_are_rejected_with_the_argument_named(small_dir, kwargs, error, message):
    with pytest.raises(error, match=message):
        TsFileIterableDataset(small_dir, **kwargs)


def test_map_style_dataset_takes_shuffle_and_its_loader_hands_out_every_row_once(
    small_dir, small_expected
):
    ds = TsFileDataset(small_dir, batch_size=1000, shuffle=True)
    want = small_expected.astype(np.float32)
    np.testing.assert_array_equal(ds[0].numpy(), want[:1000])  # ds[i]: batch i in row order
    row_of = {want[i].tobytes(): i for i in range(len(want))}
    batches = [b.numpy() for b in make_loader(ds)]
    rows = [np.array([row_of[r.tobytes()] for r in b]) for b in batches]
    assert [len(r) for r in rows] == [1000] * 5
    assert all(np.all(np.diff(r) > 0) for r in rows)  # rows of a batch in time order
    assert sorted(np.concatenate(rows).tolist()) == list(range(5000))  # each row once
    assert not np.array_equal(np.concatenate(rows), np.arange(5000))  # and shuffled


def test_map_style_index_out_of_range_is_an_index_error(small_dir):
    ds = TsFileDataset(small_dir, batch_size=1000)
    with pytest.raises(IndexError, match="batch index 5 out of range for 5 batches"):
        ds[5]
    with pytest.raises(TypeError, match="integer batch number"):
        ds[1.0]


def test_loader_rejects_a_batch_size_and_bad_worker_counts(small_dir):
    ds = TsFileIterableDataset(small_dir)
    with pytest.raises(ValueError, match="set batch_size on the dataset"):
        make_loader(ds, batch_size=4)
    with pytest.raises(ValueError, match="num_workers=-1"):
        make_loader(ds, num_workers=-1)
    with pytest.raises(ValueError, match=r"shuffle=True belongs to the dataset: .*shuffle=True"):
        make_loader(ds, shuffle=True)
    with pytest.warns(UserWarning, match="exceeds the 1 batches"):
        make_loader(ds, num_workers=2)


@pytest.mark.parametrize(
    "backend, change", [("mmap", "append"), ("mmap", "truncate"), ("pread", "append")]
)
def test_file_changed_between_epochs_fails_clearly(tmp_path, small_dir, backend, change):
    """The next epoch's first blocks were decoded ahead (mapped files: through pread readers),
    before the file changed; the epoch's check still comes first (Note: read-ahead)."""
    for p in small_dir.glob("*.tsfile"):
        shutil.copy(p, tmp_path / p.name)
    ds = TsFileIterableDataset(tmp_path, batch_size=2500, read_backend=backend, block_rows=2500)
    ds.set_epoch(0)
    assert len(list(ds)) == 2
    assert ds.core.reader.ahead.next  # decoded ahead for the next epoch
    target = sorted(tmp_path.glob("*.tsfile"))[1]
    if change == "append":
        with open(target, "ab") as fh:  # appended to while mapped: upstream says never do this
            fh.write(b"\0" * 10)
    else:  # truncated while mapped: a read of the mapping past the end would be a SIGBUS
        os.truncate(target, target.stat().st_size // 2)
    ds.set_epoch(1)
    with pytest.raises(TsFileFormatError, match=r"part001.tsfile: file changed while in use"):
        list(ds)


def _integer_file(path, num_rows: int = 1000) -> None:
    """Table ``t``, device ``d0``: INT64 ``big`` = 2**40 + row, INT32 ``small`` = row, DOUBLE
    ``f64`` = row / 2."""
    import pyarrow as pa
    from tsfile import ColumnCategory, ColumnSchema, TableSchema, TSDataType, TsFileTableWriter

    schema = TableSchema(
        "t",
        [
            ColumnSchema("device", TSDataType.STRING, ColumnCategory.TAG),
            ColumnSchema("big", TSDataType.INT64, ColumnCategory.FIELD),
            ColumnSchema("small", TSDataType.INT32, ColumnCategory.FIELD),
            ColumnSchema("f64", TSDataType.DOUBLE, ColumnCategory.FIELD),
        ],
    )
    rows = np.arange(num_rows)
    writer = TsFileTableWriter(str(path), schema)
    writer.writer.write_arrow_batch(
        "t",
        pa.table(
            {
                "time": pa.array(rows, pa.int64()),
                "device": pa.array(["d0"] * num_rows),
                "big": pa.array(rows + 2**40, pa.int64()),
                "small": pa.array(rows, pa.int32()),
                "f64": pa.array(rows / 2.0),
            }
        ),
        0,
    )
    writer.close()


def test_integers_beyond_the_dtype_warn_once_naming_the_columns(tmp_path):
    import warnings

    _integer_file(tmp_path / "ints.tsfile")
    with pytest.warns(UserWarning) as caught:
        ds = TsFileDataset(tmp_path, batch_size=1000)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "t.d0.big" in message and "t.d0.small" not in message
    assert "dtype=torch.float64" in message
    assert len(np.unique(ds[0][:, 0].numpy())) < 1000  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 holds 2**40 + row exactly: no warning
        exact = TsFileDataset(tmp_path, batch_size=1000, dtype=torch.float64)
    np.testing.assert_array_equal(exact[0][:, 0].numpy(), np.arange(1000) + 2.0**40)


def test_a_bare_field_name_suggests_full_names_and_a_pattern(tmp_path):
    _integer_file(tmp_path / "ints.tsfile")
    with pytest.raises(SchemaError, match=r"column 'f64' matches no series.*t\.d0\.f64.*'\*\.f64'"):
        TsFileIterableDataset(tmp_path, columns=["f64"])
    assert TsFileIterableDataset(tmp_path, columns=["*.f64"]).columns == ["t.d0.f64"]


def test_a_directory_named_like_a_tsfile_is_skipped(small_dir, tmp_path):
    for path in sorted(small_dir.glob("*.tsfile")):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "scratch.tsfile").mkdir()
    ds = TsFileIterableDataset(tmp_path)
    assert [f.name for f in ds.catalog.files] == [
        str(tmp_path / p.name) for p in sorted(small_dir.glob("*.tsfile"))
    ]
