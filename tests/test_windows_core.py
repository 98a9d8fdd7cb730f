"""TsFileWindowDataset gets what the row datasets have: validation, open-file limit and index cache,
statistics checks, file objects, alignment. Each on real TsFiles with exact values.

Panel data (``synthetic.write_panel``): field ``f{j}`` of device ``meters.s{d}`` at device row
``r`` is ``value_of(d, j, r)``, timestamps ``panel_device_times(d, r)``.
"""

from __future__ import annotations

import io
import os
import re

import numpy as np
import pytest
import torch
from tsfile import TSDataType

from tsfile_torch import (
    MappingError,
    TsFileDataset,
    TsFileFormatError,
    TsFileWindowDataset,
    collate_windows,
    make_loader,
    synthetic,
)


def _panel_windows(ds) -> tuple[np.ndarray, np.ndarray]:
    """Expected values (x then y rows, every field) and timestamps of every window of ``ds``."""
    length = ds.context_length + ds.horizon
    values, times = [], []
    for i in range(len(ds)):
        info = ds.window_info(i)
        d = int(info.device.rsplit(".s", 1)[1])
        rows = np.arange(info.start_row, info.start_row + length)
        fields = [int(f[1:]) for f in ds.columns]
        values.append(np.stack([synthetic.value_of(d, j, rows) for j in fields], axis=1))
        times.append(synthetic.panel_device_times(d, rows))
    return np.stack(values), np.stack(times)


def _all_windows(ds) -> list[torch.Tensor]:
    """Every window of ``ds`` in index order, collated: x, y (if any), then the timestamps."""
    parts = collate_windows(ds.__getitems__(list(range(len(ds)))))
    return list(parts) if isinstance(parts, tuple) else [parts]


# -- (a) validation ------------------------------------------------------------------------------


def test_a_file_that_crashes_the_native_reader_is_a_format_error_naming_it(tmp_path):
    # the metadata-size field: tsfile's reader crashes (SIGSEGV) opening this file; validation
    # opens it in a child first, so the dataset raises instead of killing the process
    source = synthetic.write_table_files(tmp_path / "src", synthetic.DatasetSpec(1, 1, 4, 30000))
    data = bytearray(open(source[0], "rb").read())
    data[len(data) - 8] ^= 0xFF
    (tmp_path / "meta.tsfile").write_bytes(bytes(data))
    with pytest.raises(TsFileFormatError, match=r"meta\.tsfile: tsfile's native reader crashed"):
        TsFileWindowDataset(tmp_path / "meta.tsfile", context_length=8)


def test_a_damaged_file_of_a_panel_is_named_among_good_ones(tmp_path):
    paths = synthetic.write_panel(tmp_path, num_devices=3, num_fields=2, num_rows=400, num_files=3)
    data = bytearray(open(paths[1], "rb").read())
    data[len(data) - 8] ^= 0xFF  # a flipped metadata byte in the middle file
    with open(paths[1], "wb") as fh:
        fh.write(bytes(data))
    with pytest.raises(TsFileFormatError) as caught:
        TsFileWindowDataset(tmp_path, context_length=8, horizon=2)
    message = str(caught.value)
    assert message.startswith(f"{paths[1]}: ") and "panel000" not in message, message


# -- (b) open-file limit and index cache ---------------------------------------------------------


@pytest.fixture(scope="module")
def wide_panel(tmp_path_factory):
    """4 devices x 3 fields x 5,000 rows, each device continued across 2 files."""
    directory = tmp_path_factory.mktemp("wide-panel")
    synthetic.write_panel(directory, num_devices=4, num_fields=3, num_rows=5000, num_files=2)
    return directory


@pytest.mark.other_backends_slow
def test_one_open_file_and_an_index_cache_read_exact_windows(wide_panel, tmp_path, read_backend):
    index = tmp_path / "index"

    def build():
        return TsFileWindowDataset(
            wide_panel,
            context_length=24,
            horizon=8,
            stride=5,
            block_rows=1000,  # blocks cut the files' series: reads need the timeline index
            max_open_files=1,
            index_cache=str(index),
            read_backend=read_backend,
            dtype=torch.float64,
            return_timestamps=True,
        )

    ds = build()
    assert len(ds) == 4 * ((5000 - 32) // 5 + 1)
    values, times = _panel_windows(ds)
    x, y, tx, ty = _all_windows(ds)
    np.testing.assert_array_equal(torch.cat([x, y], dim=1).numpy(), values)
    np.testing.assert_array_equal(torch.cat([tx, ty], dim=1).numpy(), times)
    assert ds.reader.num_open == 1 and ds.reader.open_count > 2  # files were closed and reopened
    saved = [f for _, _, files in os.walk(index) for f in files if f.endswith(".npy")]
    assert len(saved) == 4 * 2  # one timeline index per device and file (beside the seal key)
    # a second dataset reads through the saved indexes: the same windows
    again = build()
    for a, b in zip(_all_windows(again), [x, y, tx, ty], strict=True):
        assert torch.equal(a, b)


# -- (c) statistics checks on damaged value pages ------------------------------------------------

TYPED_ROWS = 20000
#: field -> (column in the file, marker of its value chunk, first byte of the search after it)
TYPED_FIELDS = {
    "s0": (0, b"\x41\x04s0", 1969),  # DOUBLE, GORILLA
    "n": (2, b"\x41\x02n", 111),  # INT64, TS_2DIFF
}


def _typed_values(rows: np.ndarray) -> np.ndarray:
    """Columns s0, s1 (DOUBLE) and n (INT64 = row) of device t.d0 of the typed file."""
    return np.stack(
        [synthetic.value_of(0, 0, rows), synthetic.value_of(0, 1, rows), rows.astype(np.float64)],
        axis=1,
    )


def _read_unchecked(path) -> np.ndarray | None:
    """Every row of ``path`` read without the statistics check; None if the read fails."""
    try:
        ds = TsFileDataset(
            path,
            batch_size=TYPED_ROWS,
            validate=False,
            check_statistics=False,
            dtype=torch.float64,
        )
        return ds[0].numpy()
    except TsFileFormatError:
        return None


def _flip_that_changes_values(data: bytes, path, field: str) -> int:
    """Write to ``path`` a copy of ``data`` with one byte of ``field``'s value page flipped.

    Bytes are tried one at a time from the field's search start (where the first hit was found
    with tsfile 2.5's writer; bytes there decode without crashing) until the values read back
    without the statistics check differ: by more than 0.1% (not a low mantissa bit) yet inside
    the series' [min, max], so that only the sum of the values can tell. Returns the offset.
    """
    column, marker, start = TYPED_FIELDS[field]
    want = _typed_values(np.arange(TYPED_ROWS))[:, column]
    base = data.index(marker)
    for offset in range(base + start, base + start + 256):
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        path.write_bytes(bytes(damaged))
        got = _read_unchecked(path)
        if got is None:
            continue
        got = got[:, column]
        changed = got != want
        if not changed.any():
            continue
        relative = np.abs(got[changed] - want[changed]) / np.maximum(np.abs(want[changed]), 1.0)
        if relative.max() > 1e-3 and want.min() <= got.min() and got.max() <= want.max():
            return offset
    pytest.fail(f"no byte after {marker!r} + {start} decodes {field} to other plausible values")


@pytest.fixture(scope="module")
def damaged_pages(tmp_path_factory):
    """field -> a copy of the typed file with one flipped byte in a value page of ``field``."""
    directory = tmp_path_factory.mktemp("typed")
    source = synthetic.write_table_files(
        directory / "src",
        synthetic.DatasetSpec(1, 1, 2, TYPED_ROWS),
        extra_fields={"n": TSDataType.INT64},
    )[0]
    data = open(source, "rb").read()
    pages = {}
    for field in TYPED_FIELDS:
        path = directory / f"page-{field}.tsfile"
        _flip_that_changes_values(data, path, field)
        pages[field] = path
    return pages


def _two_shuffled_epochs(path, num_workers: int, **options) -> list[torch.Tensor]:
    ds = TsFileWindowDataset(
        path,
        context_length=16,
        horizon=4,
        block_rows=2048,
        shuffle=True,
        shuffle_blocks=2,
        dtype=torch.float64,
        **options,
    )
    loader = make_loader(ds, batch_size=256, num_workers=num_workers)
    return [x for _ in range(2) for x, _ in loader]


@pytest.mark.parametrize("field", sorted(TYPED_FIELDS))
def test_without_the_check_the_damage_reaches_the_windows(damaged_pages, field):
    column = TYPED_FIELDS[field][0]
    batches = _two_shuffled_epochs(damaged_pages[field], 0, check_statistics=False)
    # the first row of every window, both epochs: each window (stride 1) starts at its index
    got = np.sort(torch.cat([x[:, 0, column] for x in batches]).numpy())
    want = np.sort(np.tile(_typed_values(np.arange(TYPED_ROWS - 19))[:, column], 2))
    assert len(got) == len(want) and not np.array_equal(got, want)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("field", sorted(TYPED_FIELDS))
def test_a_damaged_value_page_is_caught_within_two_shuffled_epochs(
    damaged_pages, field, num_workers
):
    path = damaged_pages[field]
    with pytest.raises(TsFileFormatError, match=re.escape(f"{path}: series t.d0.{field}, ")):
        _two_shuffled_epochs(path, num_workers)


# -- (d) file objects ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_file_panel(tmp_path_factory):
    """3 devices x 2 fields x (300, 170, 121) rows in one file."""
    directory = tmp_path_factory.mktemp("one-file-panel")
    return synthetic.write_panel(
        directory, num_devices=3, num_fields=2, num_rows=[300, 170, 121], num_files=1
    )[0]


@pytest.mark.other_backends_slow
@pytest.mark.parametrize("read_backend", ["auto", "pread"])
def test_a_file_object_gives_the_same_windows_as_the_path(one_file_panel, read_backend):
    options = dict(context_length=10, horizon=3, stride=2, return_timestamps=True, block_rows=64)
    by_path = TsFileWindowDataset(one_file_panel, **options)
    with open(one_file_panel, "rb") as fh:
        buffer = io.BytesIO(fh.read())
    by_object = TsFileWindowDataset(buffer, read_backend=read_backend, **options)
    assert by_object.devices == by_path.devices and len(by_object) == len(by_path)
    for a, b in zip(_all_windows(by_object), _all_windows(by_path), strict=True):
        assert torch.equal(a, b)
    values, times = _panel_windows(by_path)
    x, y, tx, ty = _all_windows(by_object)
    np.testing.assert_array_equal(torch.cat([x, y], dim=1).numpy(), values.astype(np.float32))
    np.testing.assert_array_equal(torch.cat([tx, ty], dim=1).numpy(), times)


def test_a_file_object_through_a_shuffled_loader_with_workers(one_file_panel):
    with open(one_file_panel, "rb") as fh:
        buffer = io.BytesIO(fh.read())
    ds = TsFileWindowDataset(buffer, context_length=10, horizon=3, stride=2, shuffle=True)
    by_path = TsFileWindowDataset(one_file_panel, context_length=10, horizon=3, stride=2)
    lookup = {x[0].numpy().tobytes(): i for i, (x, _) in enumerate(by_path)}
    seen = [lookup[x[0].numpy().tobytes()] for xs, _ in make_loader(ds, 16, 2) for x in xs]
    assert sorted(seen) == list(range(len(by_path)))


def test_mmap_on_a_file_object_is_a_mapping_error_naming_it(one_file_panel):
    with open(one_file_panel, "rb") as fh:
        buffer = io.BytesIO(fh.read())
    with pytest.raises(MappingError, match=r"<BytesIO object>: read_backend='mmap' needs a path"):
        TsFileWindowDataset(buffer, context_length=10, read_backend="mmap")


# -- (e) alignment of tree-model devices ---------------------------------------------------------


@pytest.fixture(scope="module")
def unaligned_tree(tmp_path_factory):
    """Tree devices d1, d2 across two files; each series on its own clock.

    Returns ``{device: [(times, values) of a, of b]}``.
    """
    directory = tmp_path_factory.mktemp("unaligned-tree")
    clocks = {
        "root.sg.d1": (np.arange(0, 600, 2), np.arange(1, 601, 3)),  # interleaving
        "root.sg.d2": (np.arange(0, 500), np.arange(100, 300, 2)),  # nested
    }
    series = {
        device: [(t, np.sin(t * 0.1 + 2 * k + j) * 10 + j) for j, t in enumerate(times)]
        for k, (device, times) in enumerate(clocks.items())
    }
    for name, (lo, hi) in {"day1": (0, 250), "day2": (250, 10**6)}.items():
        synthetic.write_tree_series(
            directory / f"{name}.tsfile",
            {
                device: {
                    m: (t[(t >= lo) & (t < hi)], v[(t >= lo) & (t < hi)])
                    for m, (t, v) in zip("ab", pairs, strict=True)
                }
                for device, pairs in series.items()
            },
        )
    return directory, series


@pytest.mark.other_backends_slow
@pytest.mark.parametrize("fill", ["nan", "ffill", "zero"])
def test_union_windows_equal_the_union_rows_of_their_device(
    unaligned_tree, expected_aligned, fill, read_backend
):
    directory, series = unaligned_tree
    ds = TsFileWindowDataset(
        directory,
        context_length=12,
        horizon=3,
        stride=2,
        align="union",
        fill=fill,
        dtype=torch.float64,
        return_timestamps=True,
        block_rows=64,
        read_backend=read_backend,
    )
    assert ds.devices == ["root.sg.d1", "root.sg.d2"] and ds.columns == ["a", "b"]
    x, y, tx, ty = _all_windows(ds)
    windows, stamps = torch.cat([x, y], dim=1).numpy(), torch.cat([tx, ty], dim=1).numpy()
    first = 0
    for device, count in ds.window_counts().items():
        rows = TsFileDataset(
            directory,
            batch_size=100_000,
            columns=[f"{device}.*"],
            align="union",
            fill=fill,
            dtype=torch.float64,
            return_timestamps=True,
            read_backend=read_backend,
        )
        assert rows.columns == [f"{device}.a", f"{device}.b"] and len(rows) == 1
        values, times = (t.numpy() for t in rows[0])
        # the row dataset itself agrees with alignment computed one row at a time
        want_times, want_values = expected_aligned(series[device], "union", fill)
        np.testing.assert_array_equal(times, want_times)
        np.testing.assert_array_equal(values, want_values)
        assert count == (len(times) - 15) // 2 + 1
        for j in range(count):
            np.testing.assert_array_equal(windows[first + j], values[2 * j : 2 * j + 15])
            np.testing.assert_array_equal(stamps[first + j], times[2 * j : 2 * j + 15])
        first += count
    assert first == len(ds)


# -- the three groups of arguments ------------------------------------------------------------


def test_a_window_dataset_is_a_function_of_its_three_groups_and_split_replaces_the_range(
    tmp_path,
):
    import dataclasses
    import pickle

    from tsfile_torch.data.window_spec import WindowSpec
    from tsfile_torch.options import ReadOptions
    from tsfile_torch.sampling.orders import OrderSpec

    synthetic.write_panel(tmp_path, num_devices=2, num_fields=2, num_rows=300, num_files=2)
    ds = TsFileWindowDataset(
        tmp_path, 16, 4, stride=3, columns=["f1", "f0"], targets="f0", normalize="standard",
        order="shuffle", seed=5, cache="memory",
    )  # fmt: skip
    assert ds.window == WindowSpec(16, 4, 3, ("f1", "f0"), ("f0",), normalize_by="column")
    again = TsFileWindowDataset.from_specs(
        tmp_path, ds.window, ReadOptions(normalize="standard", cache="memory"),
        OrderSpec("shuffle", 5),
    )  # fmt: skip
    assert len(again) == len(ds) and again.state_dict()["data"] == ds.state_dict()["data"]
    for a, b in zip(_all_windows(ds), _all_windows(again), strict=True):
        assert torch.equal(a, b)

    cut = int(synthetic.panel_device_times(0, np.array([200]))[0])
    train, validation = ds.split_by_time(cut)
    # split_by_time is the same dataset with the read options' range replaced: every other
    # read option, the window and the order are kept
    assert train.options == dataclasses.replace(ds.options, end_time=cut - 1)
    assert validation.options.normalize is train.normalizer
    assert (train.window, train.order_spec) == (ds.window, ds.order_spec)
    assert validation.window == ds.window.replace(devices=tuple(train.devices))
    assert train.options.cache == validation.options.cache == "memory"
    with pytest.raises(ValueError, match="split the dataset before pickling"):
        pickle.loads(pickle.dumps(ds)).split_by_time(cut)


@pytest.mark.parametrize(
    "arguments, error, match",
    [
        ({"context_length": 0}, ValueError, "context_length"),
        ({"context_length": 8, "columns": []}, ValueError, "columns must be None or a non-empty"),
        ({"context_length": 8, "targets": [1]}, TypeError, "targets must hold names"),
        ({"context_length": 8, "time_features": ["hour_of_day"]}, ValueError, "return_dict"),
        ({"context_length": 8, "max_missing": 1.5}, ValueError, "max_missing"),
        ({"context_length": 8, "min_context": 9}, ValueError, "min_context"),
        ({"context_length": 8, "normalize_by": "rows"}, ValueError, "normalize_by"),
        ({"context_length": 8, "device_weights": "x"}, ValueError, "device_weights"),
    ],
)
def test_a_window_spec_refuses_bad_values_naming_them(arguments, error, match):
    from tsfile_torch.data.window_spec import WindowSpec

    with pytest.raises(error, match=match):
        WindowSpec(**arguments)
