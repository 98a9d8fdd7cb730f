"""Fixtures: real TsFiles written with tsfile's writers, values a known function of position.

Value of a table-model cell: ``synthetic.value_of(file, column_in_file, row)``; helpers below
build the expected matrix for any row range, so a test's expected answer is one line.
"""

from __future__ import annotations

import numpy as np
import pytest

from tsfile_torch import synthetic

SMALL = synthetic.DatasetSpec(num_files=3, devices_per_file=2, fields_per_device=3, num_rows=5000)


@pytest.fixture(params=["auto", "mmap", "pread"])
def read_backend(request) -> str:
    """Every read test runs once per backend."""
    return request.param


@pytest.fixture(scope="session")
def small_dir(tmp_path_factory):
    """3 files x 2 devices x 3 DOUBLE fields x 5,000 rows = 18 columns, timestamps 0..4999."""
    directory = tmp_path_factory.mktemp("small")
    synthetic.write_table_files(directory, SMALL)
    return directory


def expected(spec: synthetic.DatasetSpec, start: int, stop: int) -> np.ndarray:
    """Return rows [start, stop) of every column of a table dataset, float64, column order."""
    rows = np.arange(start, stop)
    per_file = spec.devices_per_file * spec.fields_per_device
    cols = [synthetic.value_of(f, c, rows) for f in range(spec.num_files) for c in range(per_file)]
    return np.stack(cols, axis=1)


@pytest.fixture(scope="session")
def small_expected():
    """The whole small dataset as a float64 (rows, columns) matrix."""
    return expected(SMALL, 0, SMALL.num_rows)


@pytest.fixture(scope="session")
def expected_rows():
    """The function ``(spec, start, stop) -> float64 matrix`` of expected values."""
    return expected


def aligned(series: list[tuple[np.ndarray, np.ndarray]], align: str, fill: str):
    """Return (times, values) of ``series`` aligned on time, computed one row at a time."""
    sets = [set(t.tolist()) for t, _ in series]
    rows = sorted(set.union(*sets) if align == "union" else set.intersection(*sets))
    out = np.full((len(rows), len(series)), np.nan)
    for k, (times, values) in enumerate(series):
        for i, t in enumerate(rows):
            earlier = np.flatnonzero(times <= t)
            if t in sets[k]:
                out[i, k] = values[earlier[-1]]
            elif fill == "ffill" and len(earlier):
                out[i, k] = values[earlier[-1]]
            elif fill == "zero":
                out[i, k] = 0.0
    return np.array(rows, dtype=np.int64), out


@pytest.fixture(scope="session")
def expected_aligned():
    """The function ``(series, align, fill) -> (times, values)`` of expected aligned rows."""
    return aligned
