"""The device listing: list_devices over panels, tree-model devices and damaged files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tsfile_torch import DeviceInfo, SchemaError, list_devices, synthetic

#: Three devices on their own clocks: timestamps with some left out, NaN cells (nulls).
PANEL = {
    "s0": np.delete(np.arange(0, 400, 10), [3, 4, 17, 30]),  # step 10, holes of 30 and 20
    "s1": np.concatenate([np.arange(3, 150, 7), np.arange(500, 600, 7)]),  # one gap of 353
    "s2": np.array([1, 2, 4, 8, 9, 10, 11, 40]),  # irregular, 8 rows
}


def _values(times: np.ndarray, device: int) -> np.ndarray:
    """Two fields: ``a`` null every 3rd row (from row ``device``), ``b`` null every 5th."""
    rows = np.arange(len(times))
    a = np.where((rows + device) % 3 == 0, np.nan, rows * 1.0)
    b = np.where(rows % 5 == 4, np.nan, -rows * 1.0)
    return np.stack([a, b], axis=1)


@pytest.fixture(scope="module")
def panel(tmp_path_factory):
    """PANEL written over two files: each device's first half in ``p0``, the rest in ``p1``."""
    directory = tmp_path_factory.mktemp("panel")
    for part in range(2):
        devices = {}
        for d, (name, times) in enumerate(PANEL.items()):
            half = slice(0, len(times) // 2) if part == 0 else slice(len(times) // 2, None)
            devices[name] = (times[half], _values(times, d)[half])
        synthetic.write_table_devices(directory / f"p{part}.tsfile", "meters", ["a", "b"], devices)
    return directory


def _lower_median(steps: np.ndarray) -> int:
    return int(np.sort(steps)[(len(steps) - 1) // 2])


def test_a_panel_lists_each_device_on_its_own_clock_exactly_as_written(panel):
    listing = list_devices(panel)
    assert listing.names == ["meters.s0", "meters.s1", "meters.s2"] and listing.skipped == ()
    for d, (name, times) in enumerate(PANEL.items()):
        nulls = np.isnan(_values(times, d)).sum(axis=0)
        assert listing[f"meters.{name}"] == DeviceInfo(
            name=f"meters.{name}",
            tags={"id": name},
            fields={"a": "DOUBLE", "b": "DOUBLE"},
            num_rows=len(times),
            start_time=int(times[0]),
            end_time=int(times[-1]),
            median_step=_lower_median(np.diff(times)),
            max_gap=int(np.diff(times).max()),
            nulls={"a": int(nulls[0]), "b": int(nulls[1])},
            files=(str(panel / "p0.tsfile"), str(panel / "p1.tsfile")),
            shared_timeline=True,
        )
    assert (listing["meters.s0"].median_step, listing["meters.s0"].max_gap) == (10, 30)
    assert listing["meters.s1"].max_gap == 500 - 143  # the gap between the two runs
    assert listing["meters.s2"].median_step == 1  # steps 1 2 4 1 1 1 29: the median, not mean


def test_the_median_step_of_an_even_number_of_steps_is_the_lower_middle_one(tmp_path):
    times = np.array([0, 1, 2, 4, 6])  # steps 1 1 2 2: the lower middle one is 1
    synthetic.write_table_devices(tmp_path / "x.tsfile", "t", ["v"], {"k": (times, times * 1.0)})
    assert list_devices(tmp_path)["t.k"].median_step == 1


def test_to_frame_has_one_row_per_device_and_a_single_row_has_no_step(panel, tmp_path):
    frame = list_devices(panel).to_frame()
    assert list(frame["name"]) == ["meters.s0", "meters.s1", "meters.s2"]
    assert list(frame["num_rows"]) == [len(t) for t in PANEL.values()]
    assert frame["median_step"].dtype == "Int64" and frame.loc[0, "nulls"]["a"] > 0
    one = tmp_path / "one"
    one.mkdir()
    synthetic.write_table_devices(one / "x.tsfile", "t", ["v"], {"k": (np.array([5]), [[1.0]])})
    single = list_devices(one)
    assert (single[0].median_step, single[0].max_gap) == (None, None)
    assert single.to_frame()["max_gap"].isna().all()
    assert isinstance(single.to_frame(), pd.DataFrame)


def test_devices_selects_by_name_or_pattern_in_their_order_and_one_matching_nothing_raises(
    panel,
):
    assert list_devices(panel, devices=["meters.s2", "*.s0"]).names == ["meters.s2", "meters.s0"]
    with pytest.raises(SchemaError, match="'nope' matches no device"):
        list_devices(panel, devices=["nope"])


def test_a_tree_model_device_is_named_by_its_path_and_its_rows_are_its_series_union(tmp_path):
    t = np.arange(100)
    # x continues from a.tsfile into b.tsfile; y, in b.tsfile only, starts inside a's range
    synthetic.write_tree_series(tmp_path / "a.tsfile", {"root.sg.d1": {"x": (t[:60], t[:60])}})
    synthetic.write_tree_series(
        tmp_path / "b.tsfile",
        {"root.sg.d1": {"y": (t[20:] * 2, t[20:]), "x": (t[60:], t[60:])}},
    )
    (device,) = list_devices(tmp_path)
    union = np.union1d(t, t[20:] * 2)
    assert (device.name, device.tags, device.fields) == (
        "root.sg.d1",
        {},
        {"x": "DOUBLE", "y": "DOUBLE"},
    )
    assert (device.num_rows, device.start_time, device.end_time) == (len(union), 0, 198)
    assert device.nulls == {"x": len(union) - 100, "y": len(union) - 80}
    assert (device.median_step, device.max_gap) == (_lower_median(np.diff(union)), 2)
    assert device.shared_timeline is False  # x and y have different timestamps


def test_tree_devices_whose_series_share_timestamps_list_every_field_with_its_type(tmp_path):
    synthetic.write_tree_file(tmp_path / "tree.tsfile", devices=2, num_rows=50)
    listing = list_devices(tmp_path)
    assert listing.names == ["root.sg.d0", "root.sg.d1"]
    d0 = listing["root.sg.d0"]
    assert d0.fields == {"m0": "DOUBLE", "m1": "INT64", "m2": "BOOLEAN", "note": "TEXT"}
    assert (d0.num_rows, d0.median_step, d0.max_gap, d0.shared_timeline) == (50, 1, 1, True)
    assert listing.timelines() == [[f"root.sg.d{k}.{f}" for k in (0, 1) for f in d0.fields]]


def test_timelines_group_series_only_when_their_timestamps_are_equal(tmp_path):
    fields = ["v"]
    one = np.array([0, 1, 2, 5])
    other = np.array([0, 3, 4, 5])  # the same count and range, other timestamps
    devices = {"a": (one, one * 1.0), "b": (other, other * 1.0), "c": (one, one * 2.0)}
    synthetic.write_table_devices(tmp_path / "x.tsfile", "t", fields, devices)
    assert list_devices(tmp_path).timelines() == [["t.a.v", "t.c.v"], ["t.b.v"]]


def test_a_file_that_is_not_a_tsfile_is_skipped_with_its_reason_and_the_rest_listed(
    panel, tmp_path
):
    for name in ("p0.tsfile", "p1.tsfile"):
        (tmp_path / name).write_bytes((panel / name).read_bytes())
    (tmp_path / "bad.tsfile").write_bytes(b"not a TsFile at all" * 50)
    listing = list_devices(tmp_path)
    assert listing.names == ["meters.s0", "meters.s1", "meters.s2"]
    ((name, reason),) = listing.skipped
    assert name == str(tmp_path / "bad.tsfile")
    assert "not a TsFile" in reason and "tsfile-torch verify" in reason
    assert listing["meters.s0"].num_rows == len(PANEL["s0"])
    assert list_devices(tmp_path / "bad.tsfile").devices == ()  # nothing readable: empty
