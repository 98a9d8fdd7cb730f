"""One series in files that overlap in time (Note: merged shards in tsfile_torch.read.merge):
rows (with and without align=) and windows (with and without freq=) against pandas concat + sort
of the same rows, and the merged series against tsfile.TsFileDataFrame, on interleaved, nested,
late-data and three-way overlaps with empty cells; duplicates in each mode, cell by cell."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
import tsfile

from tsfile_torch import (
    SchemaError,
    TsFileDataset,
    TsFileIterableDataset,
    TsFileWindowDataset,
    list_devices,
    make_loader,
    synthetic,
)
from tsfile_torch.catalog.build import build_catalog
from tsfile_torch.cli import main

M = 60_000  # one minute in ms
BASE = 1_704_067_200_000  # 2024-01-01T00:00:00Z
N = 600
#: d1's minutes: all of [0, N) but a hole of 10 (a missing step on the 1min grid)
MINUTES = np.r_[0:480, 490:N]
#: which of d1's minutes each file holds, per case
CASES = {
    "interleaved": {"a": MINUTES[MINUTES % 2 == 0], "b": MINUTES[MINUTES % 2 == 1]},
    "nested": {  # b's range lies inside a's
        "a": MINUTES[(MINUTES < 200) | (MINUTES >= 300)],
        "b": MINUTES[(MINUTES >= 200) & (MINUTES < 300)],
    },
    "late": {  # 100 late minutes uploaded into a third file
        "a": MINUTES[(MINUTES < 150) | ((MINUTES >= 250) & (MINUTES < 400))],
        "b": MINUTES[MINUTES >= 400],
        "c": MINUTES[(MINUTES >= 150) & (MINUTES < 250)],
    },
    "three-way": {f: MINUTES[MINUTES % 3 == k] for k, f in enumerate("abc")},
}
CONTEXT, HORIZON = 8, 2


def d1_values(minutes, shift: float = 0.0) -> np.ndarray:
    """x = minute, y = -minute - 0.5 (+ ``shift``); empty cells: x every 11th, y every 7th."""
    m = np.asarray(minutes, dtype=np.float64)
    values = np.stack([m + shift, -m - 0.5 + shift], axis=1)
    values[np.asarray(minutes) % 11 == 3, 0] = np.nan
    values[np.asarray(minutes) % 7 == 2, 1] = np.nan
    return values


def d2_values(minutes) -> np.ndarray:
    m = np.asarray(minutes, dtype=np.float64)
    return np.stack([1000 + m, 2000 + m], axis=1)


def write_case(directory, case: str) -> dict[str, pd.DataFrame]:
    """Write d1 split over the case's files, d2 (every minute of d1) and d3 (every 90 s) in
    ``z.tsfile``; return each file's frame of d1 (columns time, x, y)."""
    frames = {}
    for name, minutes in CASES[case].items():
        values = d1_values(minutes)
        synthetic.write_table_devices(
            directory / f"{name}.tsfile", "p", ["x", "y"], {"d1": (BASE + minutes * M, values)}
        )
        frames[name] = pd.DataFrame({"time": BASE + minutes * M, "x": values[:, 0],
                                     "y": values[:, 1]})  # fmt: skip
    d3 = np.arange(0, N * M, 90_000)
    synthetic.write_table_devices(
        directory / "z.tsfile",
        "p",
        ["x", "y"],
        {
            "d2": (BASE + MINUTES * M, d2_values(MINUTES)),
            "d3": (BASE + d3, np.stack([d3 / 1000.0, d3 / 500.0], axis=1)),
        },
    )
    return frames


def merged(frames: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """pandas concat + sort of the same rows: what the merged series must be."""
    return pd.concat(frames.values()).sort_values("time", kind="stable").reset_index(drop=True)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param.replace("-", "_"))
    frames = write_case(directory, request.param)
    return directory, merged(frames)


def rows_expected(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Rows of d1 and d2 on d1's merged timestamps (d2 shares them)."""
    assert np.array_equal(frame["time"].to_numpy(), BASE + MINUTES * M)
    values = np.column_stack([frame[["x", "y"]].to_numpy(), d2_values(MINUTES)])
    return frame["time"].to_numpy(), values


def test_overlapping_shards_are_catalogued_as_overlapping(case):
    directory, _ = case
    catalog = build_catalog(directory, columns=["p.d1.*", "p.d2.*"])
    assert [c.overlapping for c in catalog.columns] == [True, True, False, False]
    assert catalog.columns[0].end_time == BASE + MINUTES[-1] * M


def test_map_rows_match_pandas_concat_and_sort(case):
    directory, frame = case
    ds = TsFileDataset(directory, columns=["p.d1.*", "p.d2.*"], batch_size=64,
                       dtype=torch.float64, return_timestamps=True)  # fmt: skip
    times, values = rows_expected(frame)
    assert ds.num_rows == len(MINUTES)
    got = [ds[i] for i in range(len(ds))]
    np.testing.assert_array_equal(torch.cat([t for _, t in got]).numpy(), times)
    np.testing.assert_array_equal(torch.cat([v for v, _ in got]).numpy(), values)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_rows_through_workers_and_the_disk_cache(case, num_workers, tmp_path):
    directory, frame = case
    ds = TsFileIterableDataset(directory, columns=["p.d1.*", "p.d2.*"], batch_size=50,
                               dtype=torch.float64, return_timestamps=True, cache="disk",
                               cache_dir=str(tmp_path))  # fmt: skip
    times, values = rows_expected(frame)
    for _ in range(2):  # the second epoch from the disk cache
        batches = sorted(make_loader(ds, num_workers=num_workers), key=lambda b: int(b[1][0]))
        np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), times)
        np.testing.assert_array_equal(torch.cat([v for v, _ in batches]).numpy(), values)


@pytest.mark.parametrize("fill", ["nan", "ffill"])
def test_aligned_rows_match_pandas_outer_join(case, fill):
    directory, frame = case
    # ffill fills nulls too, within a batch (Note: row fill): one batch of every row
    ds = TsFileDataset(directory, columns=["p.d1.*", "p.d3.*"], align="union", fill=fill,
                       batch_size=100 if fill == "nan" else 10_000, dtype=torch.float64,
                       return_timestamps=True)  # fmt: skip
    d3 = np.arange(0, N * M, 90_000)
    other = pd.DataFrame({"time": BASE + d3, "x3": d3 / 1000.0, "y3": d3 / 500.0})
    union = np.union1d(frame["time"], other["time"])
    method = "ffill" if fill == "ffill" else None  # a gap: the last sample, its null included
    expected = np.column_stack(
        [f.set_index("time").reindex(union, method=method).to_numpy() for f in (frame, other)]
    )
    if fill == "ffill":
        expected = pd.DataFrame(expected).ffill().to_numpy()
    got = [ds[i] for i in range(len(ds))]
    np.testing.assert_array_equal(torch.cat([t for _, t in got]).numpy(), union)
    np.testing.assert_array_equal(torch.cat([v for v, _ in got]).numpy(), expected)


def test_the_merged_series_equals_tsfile_dataframe(case):
    directory, _ = case
    paths = sorted(str(p) for p in directory.glob("*.tsfile"))
    frame = tsfile.TsFileDataFrame(paths, show_progress=False)
    try:
        theirs = frame.loc[:, ["p.d1.x", "p.d1.y"]]
        times, values = np.asarray(theirs.timestamps), np.asarray(theirs.values)
    finally:
        frame.close()
    ds = TsFileDataset(directory, columns=["p.d1.*"], batch_size=1000, dtype=torch.float64,
                       return_timestamps=True)  # fmt: skip
    got = [ds[i] for i in range(len(ds))]
    np.testing.assert_array_equal(torch.cat([t for _, t in got]).numpy(), times)
    np.testing.assert_array_equal(torch.cat([v for v, _ in got]).numpy(), values)


def expected_windows(frame: pd.DataFrame, freq: bool):
    """(times, values) of each window of d1's merged rows (reindexed on its grid: ``freq``)."""
    frame = frame.set_index("time")[["x", "y"]]
    if freq:
        frame = frame.reindex(np.arange(frame.index[0], frame.index[-1] + 1, M))
    for s in range(len(frame) - CONTEXT - HORIZON + 1):
        yield (
            frame.index[s : s + CONTEXT + HORIZON].to_numpy(),
            frame.to_numpy()[s : s + CONTEXT + HORIZON],
        )


@pytest.mark.parametrize("freq", [None, "1min"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_windows_match_pandas_concat_and_sort(case, freq, num_workers):
    directory, frame = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 10-minute hole without freq=
        ds = TsFileWindowDataset(directory, CONTEXT, HORIZON, devices=["p.d1"], freq=freq,
                                 return_dict=True)  # fmt: skip
    got = {}
    for batch in make_loader(ds, batch_size=64, num_workers=num_workers):
        for i in range(len(batch["past_time"])):
            got[int(batch["past_time"][i, 0])] = batch, i
    count = 0
    for times, values in expected_windows(frame, freq is not None):
        batch, i = got[int(times[0])]
        count += 1
        stamps = np.concatenate([batch["past_time"][i], batch["future_time"][i]])
        both = np.concatenate([batch["past_values"][i], batch["future_values"][i]])
        np.testing.assert_array_equal(stamps, times)
        np.testing.assert_array_equal(both, values.astype(np.float32))
    assert count == len(ds) == len(got)


def test_tree_series_across_interleaved_files_are_merged(tmp_path):
    minutes = np.arange(300)
    for name, part in (("a", minutes[::2]), ("b", minutes[1::2])):
        synthetic.write_tree_series(
            tmp_path / f"{name}.tsfile",
            {"root.sg.d1": {"s": (BASE + part * M, part * 2.0), "u": (BASE + part * M, -part)}},
        )
    ds = TsFileDataset(tmp_path, batch_size=64, dtype=torch.float64, return_timestamps=True)
    got = [ds[i] for i in range(len(ds))]
    np.testing.assert_array_equal(torch.cat([t for _, t in got]).numpy(), BASE + minutes * M)
    np.testing.assert_array_equal(
        torch.cat([v for v, _ in got]).numpy(), np.stack([minutes * 2.0, -minutes], axis=1)
    )


# -- duplicates ---------------------------------------------------------------------------


def write_duplicates(directory) -> dict[str, pd.DataFrame]:
    """a: minutes 0..99, b: 50..149, c: 90..119, each with values of its own and empty cells
    of its own, so every cell of a duplicate says which file it came from."""
    spans = {"a": np.arange(0, 100), "b": np.arange(50, 150), "c": np.arange(90, 120)}
    frames = {}
    for k, (name, minutes) in enumerate(spans.items()):
        values = d1_values(minutes, shift=1000.0 * k)
        values[(minutes + k) % 4 == 0, 0] = np.nan
        values[(minutes + 2 * k) % 5 == 0, 1] = np.nan
        synthetic.write_table_devices(
            directory / f"{name}.tsfile", "p", ["x", "y"], {"d1": (BASE + minutes * M, values)}
        )
        frames[name] = pd.DataFrame({"time": BASE + minutes * M, "x": values[:, 0],
                                     "y": values[:, 1]})  # fmt: skip
    return frames


def resolved(frames: dict[str, pd.DataFrame], order: list[str]) -> pd.DataFrame:
    """Cell by cell: the first of ``order`` holding a value at a timestamp wins."""
    out = None
    for name in order:
        frame = frames[name].set_index("time")
        out = frame if out is None else out.combine_first(frame)
    return out.sort_index()


@pytest.fixture(scope="module")
def duplicates(tmp_path_factory):
    directory = tmp_path_factory.mktemp("duplicates")
    return directory, write_duplicates(directory)


def test_duplicates_are_an_error_naming_the_series_both_files_and_the_timestamp(duplicates):
    directory, _ = duplicates
    with pytest.raises(SchemaError) as err:
        TsFileDataset(directory, batch_size=64)
    message = str(err.value)
    assert "device p.d1" in message and "a.tsfile and " in message and "b.tsfile" in message
    assert f"timestamp {BASE + 50 * M} (2024-01-01T00:50:00.000Z)" in message
    assert "duplicates='first'" in message and "duplicates='last'" in message


@pytest.mark.parametrize("mode", ["first", "last"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_duplicates_resolved_cell_by_cell(duplicates, mode, num_workers):
    directory, frames = duplicates
    with pytest.warns(UserWarning, match=rf"70 timestamps are stored in more than one file: "
                      rf"device p.d1 \(70\); duplicates='{mode}'"):  # fmt: skip
        ds = TsFileIterableDataset(directory, batch_size=16, duplicates=mode,
                                   dtype=torch.float64, return_timestamps=True)  # fmt: skip
    expected = resolved(frames, ["a", "b", "c"] if mode == "first" else ["c", "b", "a"])
    batches = sorted(make_loader(ds, num_workers=num_workers), key=lambda b: int(b[1][0]))
    np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), expected.index)
    np.testing.assert_array_equal(torch.cat([v for v, _ in batches]).numpy(), expected.to_numpy())
    ds = TsFileWindowDataset(directory, 5, 1, duplicates=mode, fill="nan", return_dict=True)
    window = ds[95 - 5]  # past rows: minutes 90..94 (three files), target 95
    np.testing.assert_array_equal(
        np.concatenate([window["past_values"], window["future_values"]]),
        expected.loc[BASE + 90 * M : BASE + 95 * M].to_numpy().astype(np.float32),
    )


def test_duplicates_option_is_checked():
    with pytest.raises(ValueError, match=r"duplicates must be one of 'error', 'first', 'last'"):
        TsFileDataset(".", duplicates="newest")


def test_list_devices_and_inspect_name_overlapping_files_and_duplicates(duplicates, capsys):
    directory, _ = duplicates
    info = list_devices(directory)["p.d1"]
    assert (info.overlapping_files, info.duplicates, info.num_rows) == (3, 70, 150)
    assert info.overlap == (BASE + 50 * M, BASE + 119 * M)
    assert main(["inspect", str(directory)]) == 0
    out = capsys.readouterr().out
    assert f"3 files overlap in time in [{BASE + 50 * M}, {BASE + 119 * M}]" in out
    assert "70 timestamps in more than one file" in out


def test_list_devices_of_files_that_overlap_without_duplicates(case):
    directory, frame = case
    info = list_devices(directory)["p.d1"]
    assert info.num_rows == len(frame) and info.duplicates == 0
    # late: b follows a, only c's late minutes overlap a
    assert info.overlapping_files == (3 if directory.name.startswith("three") else 2)
    assert list_devices(directory)["p.d2"].overlapping_files == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_mid_epoch_delivers_the_rest_of_the_merged_rows_once(case, num_workers):
    directory, frame = case
    times, values = rows_expected(frame)

    def loader():
        ds = TsFileIterableDataset(directory, columns=["p.d1.*", "p.d2.*"], batch_size=40,
                                   order="batches", seed=3, dtype=torch.float64,
                                   return_timestamps=True)  # fmt: skip
        return make_loader(ds, num_workers=num_workers, stateful=True)

    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(4)]
    state = first.state_dict()
    del it, first
    again = loader()
    again.load_state_dict(state)
    batches = sorted(head + list(again), key=lambda b: int(b[1][0]))
    np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), times)
    np.testing.assert_array_equal(torch.cat([v for v, _ in batches]).numpy(), values)


# -- the timeline index from the build's timestamps (Note: seeded indexes) ----------------------


def test_no_epoch_reads_the_merged_files_time_columns_again(case, tmp_path):
    directory, frame = case
    index = tmp_path / "index"
    ds = TsFileIterableDataset(directory, columns=["p.d1.*", "p.d2.*"], batch_size=50,
                               dtype=torch.float64, return_timestamps=True, block_rows=64,
                               index_cache=str(index))  # fmt: skip
    # saved by the build: one index per file of d1, and d2's (in z.tsfile, beside d3)
    assert len(list(index.rglob("*.npy"))) == len(list(directory.glob("*.tsfile")))
    times, values = rows_expected(frame)
    for copy in (ds, pickle.loads(pickle.dumps(ds))):  # as a DataLoader worker gets it
        seen = []
        copy.reader.on_read = lambda what, seen=seen: seen.append(what) if what else None
        batches = list(copy)
        assert not [w for w in seen if "device p.d1" in w and "timeline index" in w]
        assert [w for w in seen if "device p.d1, rows [64, 128)" in w]  # read through it
        np.testing.assert_array_equal(torch.cat([t for _, t in batches]).numpy(), times)
        np.testing.assert_array_equal(torch.cat([v for v, _ in batches]).numpy(), values)


# -- hf.windows_for and the Ray datasource --------------------------------------------------


@pytest.mark.slow  # importing transformers: seconds
def test_hf_windows_for_patchtst_match_pandas_concat_and_sort(case):
    transformers = pytest.importorskip("transformers")
    from tsfile_torch import hf

    directory, frame = case
    torch.manual_seed(0)
    config = transformers.PatchTSTConfig(
        context_length=CONTEXT, prediction_length=HORIZON, num_input_channels=2, patch_length=4,
        patch_stride=4, d_model=16, num_attention_heads=2, num_hidden_layers=1, ffn_dim=16,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 10-minute hole without freq=
        ds = hf.windows_for(config, directory, columns=["x", "y"], devices=["p.d1"],
                            future_missing="keep", keep=("past_time",))  # fmt: skip
    got = {}
    for batch in make_loader(ds, batch_size=64):
        for i in range(len(batch["past_time"])):
            got[int(batch["past_time"][i, 0])] = {k: v[i].numpy() for k, v in batch.items()}
    windows = list(expected_windows(frame, freq=False))
    assert len(got) == len(windows) == len(ds)
    for times, values in windows:
        item = got[int(times[0])]
        np.testing.assert_array_equal(item["past_time"], times[:CONTEXT])
        past, future = values[:CONTEXT], values[CONTEXT:]
        np.testing.assert_array_equal(item["past_values"], np.nan_to_num(past).astype(np.float32))
        np.testing.assert_array_equal(item["past_observed_mask"], ~np.isnan(past))
        np.testing.assert_array_equal(
            item["future_values"], np.nan_to_num(future).astype(np.float32)
        )
    transformers.PatchTSTForPrediction(config)(
        **{k: v for k, v in batch.items() if k != "past_time"}
    )


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray's DataContext, copied in a job
def test_ray_read_tsfile_matches_pandas_concat_and_sort(case, ray_cluster):
    from tsfile_torch.ray import read_tsfile

    directory, frame = case
    names = ["p.d1.x", "p.d1.y", "p.d2.x", "p.d2.y"]
    ds = read_tsfile(directory, columns=["p.d1.*", "p.d2.*"], return_timestamps=True,
                     dtype="float64", override_num_blocks=3)  # fmt: skip
    batches = list(ds.iter_batches(batch_size=None, batch_format="numpy"))
    found = {name: np.concatenate([b[name] for b in batches]) for name in ["time", *names]}
    times, values = rows_expected(frame)
    np.testing.assert_array_equal(found["time"], times)
    np.testing.assert_array_equal(np.stack([found[n] for n in names], axis=1), values)
