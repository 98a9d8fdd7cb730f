"""Read backends: parsing, capture at open, what each reader really got, mapping errors."""

from __future__ import annotations

import errno
import io
import os

import numpy as np
import pytest
import tsfile
from tsfile import FileReadBackend

from tsfile_torch import MappingError, TsFileIterableDataset, open_reader, parse_backend
from tsfile_torch.native.backend import is_mapped


@pytest.mark.parametrize(
    "value, name",
    [
        ("auto", "auto"),
        ("MMAP", "mmap"),
        ("Pread", "pread"),
        (FileReadBackend.MMAP, "mmap"),
        (FileReadBackend.PREAD, "pread"),
    ],
)
def test_backend_names_and_enum_members_parse(value, name):
    assert parse_backend(value) == name


@pytest.mark.parametrize("bad", ["mmpa", "", None, 1, True])
def test_unknown_backend_is_a_value_error_listing_allowed_values(bad):
    with pytest.raises(ValueError, match="'auto', 'mmap', 'pread'"):
        parse_backend(bad)


def test_dataset_rejects_unknown_backend_when_built(small_dir):
    with pytest.raises(ValueError, match="read_backend must be one of .*got 'mmpa'"):
        TsFileIterableDataset(small_dir, read_backend="mmpa")


def test_open_reader_restores_the_global_setting(small_dir):
    path = str(next(small_dir.glob("*.tsfile")))
    previous = tsfile.get_file_read_backend()
    tsfile.set_file_read_backend(FileReadBackend.PREAD)
    try:
        reader, actual = open_reader(path, "mmap")
        assert actual == "mmap"
        assert tsfile.get_file_read_backend() == FileReadBackend.PREAD
        assert is_mapped(path)
        reader.close()
        assert not is_mapped(path)
    finally:
        tsfile.set_file_read_backend(previous)


@pytest.mark.parametrize("backend, mapped", [("mmap", True), ("auto", True), ("pread", False)])
def test_dataset_keeps_its_backend_when_the_global_changes(
    tmp_path, backend, mapped, expected_rows
):
    from tsfile_torch import synthetic

    spec = synthetic.DatasetSpec(
        num_files=2, devices_per_file=1, fields_per_device=2, num_rows=3000
    )
    paths = synthetic.write_table_files(tmp_path, spec)
    ds = TsFileIterableDataset(tmp_path, batch_size=1000, read_backend=backend)
    previous = tsfile.get_file_read_backend()
    other = FileReadBackend.PREAD if mapped else FileReadBackend.MMAP
    tsfile.set_file_read_backend(other)  # someone else flips the process-global setting
    try:
        batches = [b.numpy() for b in ds]
        assert tsfile.get_file_read_backend() == other
    finally:
        tsfile.set_file_read_backend(previous)
    np.testing.assert_array_equal(
        np.concatenate(batches), expected_rows(spec, 0, 3000).astype(np.float32)
    )
    assert set(ds.backends.values()) == {"mmap" if mapped else "pread"}
    assert all(is_mapped(p) == mapped for p in paths)
    ds.close()
    assert not any(is_mapped(p) for p in paths)


def test_mmap_on_a_file_object_raises_mapping_error_naming_it(small_dir):
    data = io.BytesIO(next(small_dir.glob("*.tsfile")).read_bytes())
    with pytest.raises(MappingError, match=r"BytesIO.*cannot be memory-mapped.*'auto'"):
        open_reader(data, "mmap")


def test_auto_on_a_file_object_falls_back_to_pread(small_dir, expected_rows):
    from tsfile_torch import synthetic

    first = sorted(small_dir.glob("*.tsfile"))[0]
    ds = TsFileIterableDataset(io.BytesIO(first.read_bytes()), batch_size=2048, read_backend="auto")
    values = np.concatenate([b.numpy() for b in ds])
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=2, fields_per_device=3, num_rows=5000
    )
    np.testing.assert_array_equal(values, expected_rows(spec, 0, 5000).astype(np.float32))
    assert list(ds.backends.values()) == ["pread"]


def test_mmap_dataset_over_a_file_object_fails_when_built(small_dir):
    first = sorted(small_dir.glob("*.tsfile"))[0]
    with pytest.raises(MappingError, match="cannot be memory-mapped"):
        TsFileIterableDataset(io.BytesIO(first.read_bytes()), read_backend="mmap")


def test_mmap_on_a_pipe_raises_mapping_error_naming_it(tmp_path, small_dir):
    fifo = tmp_path / "pipe.tsfile"
    os.mkfifo(fifo)
    with pytest.raises(MappingError, match="pipe.tsfile"):
        open_reader(str(fifo), "mmap")
    # the pipe was never opened for reading: a non-blocking open for writing finds no reader
    with pytest.raises(OSError) as err:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert err.value.errno == errno.ENXIO
