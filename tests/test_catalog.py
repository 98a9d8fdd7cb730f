"""Catalog from metadata: columns, order, types, shards, timelines, statistics, bad sources."""

from __future__ import annotations

import numpy as np
import pytest
from tsfile import TSDataType

from tsfile_torch import SchemaError, TsFileDataset, build_catalog, synthetic
from tsfile_torch.sources import expand_sources

TWO = synthetic.DatasetSpec(num_files=2, devices_per_file=1, fields_per_device=3, num_rows=2000)


def _one_series(table: str = "t") -> synthetic.DatasetSpec:
    """1 file x 1 device x 1 DOUBLE field x 1,000 rows, in table ``table``."""
    return synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=1, num_rows=1000, table=table
    )


def test_columns_follow_file_then_device_then_schema_field_order(small_dir, column_names):
    cat = build_catalog(small_dir)
    assert cat.column_names[:7] == column_names(3, 3)[:7]  # t.d0.s0 ... t.d1.s2, t.d2.s0
    assert len(cat.column_names) == 18
    assert cat.num_rows == 5000 and (cat.start_time, cat.end_time) == (0, 4999)


def test_a_list_of_names_and_patterns_keeps_the_order_given(small_dir):
    cat = build_catalog(small_dir, ["t.d3.s1", "t.d0.*", "t.d3.s1"])
    assert cat.column_names == ["t.d3.s1", "t.d0.s0", "t.d0.s1", "t.d0.s2"]


def test_glob_source_and_list_of_files_give_the_same_catalog(small_dir):
    files = sorted(str(p) for p in small_dir.glob("*.tsfile"))
    assert (
        build_catalog(str(small_dir / "part*.tsfile")).column_names
        == build_catalog(files).column_names
    )


def test_a_double_star_glob_matches_files_in_folders_at_any_depth(tmp_path):
    spec = synthetic.DatasetSpec(1, 1, 1, 10)
    for folder, prefix in [(".", "top"), ("a", "mid"), ("a/b/c", "deep")]:
        synthetic.write_table_files(tmp_path / folder, spec, prefix=prefix)
    (tmp_path / "a" / "b" / "notes.txt").write_text("not a TsFile")

    def names(pattern: str) -> list[str]:
        return [s.name for s in expand_sources(str(tmp_path / pattern))]

    assert names("**/*.tsfile") == [  # "**" also matches no folder at all
        str(tmp_path / "a/b/c/deep000.tsfile"),
        str(tmp_path / "a/mid000.tsfile"),
        str(tmp_path / "top000.tsfile"),
    ]
    assert names("a/**/deep*.tsfile") == [str(tmp_path / "a/b/c/deep000.tsfile")]
    assert names("*/*.tsfile") == [str(tmp_path / "a/mid000.tsfile")]  # one "*": one level


def test_statistics_come_from_metadata(small_dir):
    rows = np.arange(5000)
    col = build_catalog(small_dir, ["t.d1.s2"]).describe()[0]
    values = synthetic.value_of(0, 5, rows)
    assert col["num_rows"] == 5000 and col["num_values"] == 5000
    assert col["min"] == values.min() and col["max"] == values.max()
    assert col["mean"] == pytest.approx(values.mean())


def test_string_fields_are_left_out_and_asking_for_one_names_it(tmp_path):
    synthetic.write_table_files(
        tmp_path, TWO, extra_fields={"label": TSDataType.STRING, "count": TSDataType.INT32}
    )
    cat = build_catalog(tmp_path)
    assert "t.d0.label" not in cat.column_names and "t.d0.count" in cat.column_names
    with pytest.raises(SchemaError, match=r"'t.d0.label' has type STRING"):
        build_catalog(tmp_path, ["t.d0.s0", "t.d0.label"])
    with pytest.raises(SchemaError, match=r"matches only non-numeric columns"):
        build_catalog(tmp_path, ["*.label"])


def test_unknown_column_lists_close_names(small_dir):
    with pytest.raises(SchemaError, match=r"'t.d0.s9' matches no series.*close names: t.d0.s"):
        build_catalog(small_dir, ["t.d0.s9"])


def test_tree_model_columns_are_numeric_measurements(tmp_path):
    names = synthetic.write_tree_file(tmp_path / "tree.tsfile", devices=2, num_rows=100)
    cat = build_catalog(tmp_path)
    assert (
        cat.column_names
        == names
        == [
            "root.sg.d0.m0",
            "root.sg.d0.m1",
            "root.sg.d0.m2",
            "root.sg.d1.m0",
            "root.sg.d1.m1",
            "root.sg.d1.m2",
        ]
    )
    assert [c.dtype for c in cat.columns[:3]] == ["DOUBLE", "INT64", "BOOLEAN"]


def test_series_continuing_across_files_are_concatenated_in_time_order(tmp_path):
    spec = synthetic.DatasetSpec(
        num_files=1, devices_per_file=1, fields_per_device=2, num_rows=1000
    )
    synthetic.write_table_files(tmp_path, spec, prefix="day2_", row_offset=1000)
    synthetic.write_table_files(tmp_path, spec, prefix="day1_")
    cat = build_catalog(tmp_path)
    assert cat.column_names == ["t.d0.s0", "t.d0.s1"]
    assert cat.num_rows == 2000 and (cat.start_time, cat.end_time) == (0, 1999)
    assert [cat.files[s.file_index].name.split("/")[-1] for s in cat.columns[0].shards] == [
        "day1_000.tsfile",
        "day2_000.tsfile",
    ]


def test_overlapping_shards_are_laid_out_one_after_the_other_for_the_merge(tmp_path):
    spec = _one_series()
    synthetic.write_table_files(tmp_path, spec, prefix="a_")
    synthetic.write_table_files(tmp_path, spec, prefix="b_", row_offset=500)
    cat = build_catalog(tmp_path)  # merged by timestamp when read (test_merged_shards.py)
    assert cat.columns[0].overlapping
    assert [s.start_row for s in cat.columns[0].shards] == [0, spec.num_rows]
    assert (cat.start_time, cat.end_time) == (0, spec.num_rows + 499)


def test_misaligned_devices_in_one_file_set_are_a_schema_error(tmp_path):
    synthetic.write_table_files(tmp_path, _one_series("a"), prefix="a")
    synthetic.write_table_files(tmp_path, _one_series("b"), prefix="b", start_time=10)
    with pytest.raises(SchemaError, match=r"do not share one timeline.*'a.d0.s0'.*'b.d0.s0'"):
        build_catalog(tmp_path)


def test_same_metadata_but_different_timestamps_fail_at_read_time(tmp_path):
    import pyarrow as pa
    from tsfile import ColumnCategory, ColumnSchema, TableSchema, TsFileTableWriter

    # table a: timestamps 0, 2, ..., 1998
    synthetic.write_table_files(tmp_path, _one_series("a"), prefix="a", interval=2)
    times = np.append(np.arange(999), 1998)  # same count, first and last; differs inside
    schema = TableSchema(
        "b",
        [
            ColumnSchema("device", TSDataType.STRING, ColumnCategory.TAG),
            ColumnSchema("s0", TSDataType.DOUBLE, ColumnCategory.FIELD),
        ],
    )
    writer = TsFileTableWriter(str(tmp_path / "b.tsfile"), schema)
    writer.writer.write_arrow_batch(
        "b",
        pa.table(
            {
                "time": pa.array(times, pa.int64()),
                "device": pa.array(["d0"] * 1000),
                "s0": pa.array(np.arange(1000.0)),
            }
        ),
        0,
    )
    writer.close()
    ds = TsFileDataset(tmp_path, batch_size=100)  # metadata agrees: built fine
    with pytest.raises(
        SchemaError,
        match=r"\['b.d0.s0'\] do not share timestamps .* at row 1 "
        r"\(time 2 vs 1\)",
    ):
        ds[0]
    # a gather of rows in any order (shuffled batches) names the first row that differs
    from tsfile_torch.read.core import ReadingCore

    core = ReadingCore.for_rows(tmp_path)
    with pytest.raises(SchemaError, match=r"do not share timestamps .* at row 7 \(time 14 vs 7\)"):
        core.take(0, np.array([999, 0, 500, 7]))  # row 0 agrees (time 0), row 7 does not
    with pytest.raises(SchemaError, match=r"at row 1 \(time 2 vs 1\)"):
        core.rows(0, np.int64(0), np.int64(100))  # numpy row numbers name the row too
