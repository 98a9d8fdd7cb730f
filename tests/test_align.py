"""align="union"|"intersect" on the row datasets: exact rows on interleaving, nested and disjoint
timestamps, table and tree model, series across files, through real DataLoader workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tsfile_torch import SchemaError, TsFileDataset, TsFileIterableDataset, make_loader, synthetic

CASES = {
    "interleaving": (np.arange(0, 400, 2), np.arange(1, 401, 3)),
    "nested": (np.arange(0, 400), np.arange(100, 200, 2)),
    "disjoint": (np.arange(0, 200), np.arange(1000, 1300)),
}


def _two_tables(directory, a_times, b_times, split=False):
    """Tables ``a`` and ``b`` (one device, one field each); ``split``: ``a`` across two files."""
    a_vals, b_vals = a_times * 10.0, b_times * 100.0 + 1
    if split:
        half = len(a_times) // 2
        for name, part in (("a1", slice(None, half)), ("a2", slice(half, None))):
            synthetic.write_table_devices(
                directory / f"{name}.tsfile",
                "a",
                ["v"],
                {"d": (a_times[part], a_vals[part, None])},
            )
    else:
        synthetic.write_table_devices(directory / "a.tsfile", "a", ["v"], {"d": (a_times, a_vals)})
    synthetic.write_table_devices(directory / "b.tsfile", "b", ["v"], {"d": (b_times, b_vals)})
    return [(a_times, a_vals), (b_times, b_vals)]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("align", ["union", "intersect"])
@pytest.mark.parametrize("fill", ["nan", "ffill", "zero"])
def test_map_dataset_rows_are_aligned_on_time(tmp_path, expected_aligned, case, align, fill):
    series = _two_tables(tmp_path, *CASES[case], split=case == "nested")
    times, values = expected_aligned(series, align, fill)
    if not len(times):
        with pytest.raises(SchemaError, match=r"align='intersect': columns .* share no timestamp"):
            TsFileDataset(tmp_path, batch_size=64, align=align, fill=fill)
        return
    ds = TsFileDataset(
        tmp_path,
        batch_size=64,
        align=align,
        fill=fill,
        dtype=torch.float64,
        return_timestamps=True,
    )
    assert ds.columns == ["a.d.v", "b.d.v"] and ds.num_rows == len(times)
    got = [ds[i] for i in range(len(ds))]
    np.testing.assert_array_equal(torch.cat([t for _, t in got]).numpy(), times)
    np.testing.assert_array_equal(torch.cat([v for v, _ in got]).numpy(), values)


def test_iterable_dataset_aligned_rows_through_two_workers(tmp_path, expected_aligned):
    series = _two_tables(tmp_path, *CASES["interleaving"], split=True)
    times, values = expected_aligned(series, "union", "ffill")
    ds = TsFileIterableDataset(
        tmp_path, batch_size=50, align="union", fill="ffill", return_timestamps=True
    )
    batches = sorted(make_loader(ds, num_workers=2), key=lambda b: int(b[1][0]))
    np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), times)
    np.testing.assert_array_equal(
        torch.cat([v for v, _ in batches]).numpy(), values.astype(np.float32)
    )


def test_tree_series_of_one_device_are_aligned(tmp_path, expected_aligned):
    a_times, b_times = CASES["nested"]
    series = [(a_times, a_times * 0.5), (b_times, -b_times * 1.0)]
    synthetic.write_tree_series(
        tmp_path / "tree.tsfile",
        {"root.sg.d1": {"a": series[0], "b": series[1]}},
    )
    with pytest.raises(SchemaError, match="do not share one timeline"):
        TsFileDataset(tmp_path, batch_size=32)
    times, values = expected_aligned(series, "intersect", "nan")
    ds = TsFileDataset(tmp_path, batch_size=32, align="intersect", dtype=torch.float64)
    assert ds.num_rows == len(times) == 50
    np.testing.assert_array_equal(torch.cat([ds[i] for i in range(len(ds))]).numpy(), values)


def test_equal_timelines_keep_the_positional_fast_path(small_dir, small_expected):
    ds = TsFileDataset(small_dir, batch_size=1000, align="union")
    assert ds.alignment is None and ds.num_rows == 5000
    np.testing.assert_array_equal(ds[2].numpy(), small_expected[2000:3000].astype(np.float32))


def test_bad_align_and_fill_are_named(small_dir):
    with pytest.raises(
        ValueError, match="align must be one of 'union', 'intersect' or None; got 'outer'"
    ):
        TsFileDataset(small_dir, align="outer")
    with pytest.raises(ValueError, match="fill must be one of 'nan', 'ffill', 'zero'; got 'x'"):
        TsFileIterableDataset(small_dir, align="union", fill="x")


def test_same_metadata_but_different_timestamps_are_aligned_not_refused(tmp_path, expected_aligned):
    a_times = np.arange(0, 2000, 2)  # 0, 2, ..., 1998
    b_times = np.append(np.arange(999), 1998)  # same count, first and last; differs inside
    series = [(a_times, a_times * 10.0), (b_times, b_times * 100.0 + 1)]
    synthetic.write_table_devices(tmp_path / "a.tsfile", "a", ["v"], {"d": series[0]})
    synthetic.write_table_devices(tmp_path / "b.tsfile", "b", ["v"], {"d": series[1]})
    times, values = expected_aligned(series, "union", "nan")
    ds = TsFileDataset(
        tmp_path, batch_size=300, align="union", dtype=torch.float64, return_timestamps=True
    )
    assert ds.alignment is not None and ds.num_rows == len(times)
    got = [ds[i] for i in range(len(ds))]
    np.testing.assert_array_equal(torch.cat([t for _, t in got]).numpy(), times)
    np.testing.assert_array_equal(torch.cat([v for v, _ in got]).numpy(), values)


def test_devices_with_several_fields_across_files_align_on_time(tmp_path, expected_aligned):
    synthetic.write_panel(tmp_path, num_devices=2, num_fields=3, num_rows=[500, 300], num_files=2)
    series = [
        (synthetic.panel_device_times(d, np.arange(n)), synthetic.value_of(d, j, np.arange(n)))
        for d, n in ((0, 500), (1, 300))
        for j in range(3)
    ]
    times, values = expected_aligned(series, "union", "ffill")
    ds = TsFileIterableDataset(
        tmp_path,
        batch_size=128,
        align="union",
        fill="ffill",
        dtype=torch.float64,
        return_timestamps=True,
    )
    assert ds.columns == [f"meters.s{d}.f{j}" for d in range(2) for j in range(3)]
    batches = list(ds)
    np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), times)
    np.testing.assert_array_equal(torch.cat([v for v, _ in batches]).numpy(), values)


def test_no_epoch_reads_a_time_column_the_alignment_read(tmp_path, expected_aligned):
    """The build reads each timeline's time column to align it: the timeline indexes come from
    that read (Note: seeded indexes), saved for this process's readers and its workers'."""
    import pickle

    data = tmp_path / "data"
    data.mkdir()
    series = _two_tables(data, *CASES["interleaving"], split=True)
    times, values = expected_aligned(series, "union", "ffill")
    ds = TsFileIterableDataset(data, batch_size=50, align="union", fill="ffill",
                               return_timestamps=True, dtype=torch.float64,
                               index_cache=str(tmp_path / "index"))  # fmt: skip
    assert len(list((tmp_path / "index").rglob("*.npy"))) == 3  # a1, a2 and b
    for copy in (ds, pickle.loads(pickle.dumps(ds))):  # as a DataLoader worker gets it
        seen = []
        copy.reader.on_read = lambda what, seen=seen: seen.append(what) if what else None
        batches = list(copy)
        assert [w for w in seen if "rows [" in w]  # the values were read
        assert not [w for w in seen if "timeline index" in w], seen
        np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), times)
        np.testing.assert_array_equal(torch.cat([v for v, _ in batches]).numpy(), values)
