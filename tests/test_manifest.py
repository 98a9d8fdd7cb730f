"""Manifests: `tsfile-torch manifest DIR`, checked by datasets (once per identity) and verify."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from tsfile_torch import TsFileDataset, TsFileFormatError, synthetic
from tsfile_torch.cli import main

SPEC = synthetic.DatasetSpec(num_files=3, devices_per_file=1, fields_per_device=4, num_rows=30000)
MANIFEST = "tsfile-torch-manifest.json"


pytestmark = pytest.mark.usefixtures("private_cache")  # a verified-files cache per test


@pytest.fixture
def data(tmp_path) -> Path:
    directory = tmp_path / "data"
    synthetic.write_table_files(directory, SPEC)
    return directory


def _records(tmp_path) -> list[Path]:
    return sorted((tmp_path / "cache" / "tsfile-torch" / "verified").glob("*/*.json"))


def test_manifest_lists_every_tsfile_under_the_directory_with_size_and_hash(data, capsys):
    sub = data / "more"
    synthetic.write_table_files(sub, synthetic.DatasetSpec(1, 1, 2, 1000), prefix="extra")
    assert main(["manifest", str(data)]) == 0
    assert "4 files" in capsys.readouterr().out
    manifest = json.loads((data / MANIFEST).read_text())
    assert manifest["algorithm"] == "blake2b-256"
    listed = {f["path"]: f for f in manifest["files"]}
    assert sorted(listed) == [
        "more/extra000.tsfile",
        "part000.tsfile",
        "part001.tsfile",
        "part002.tsfile",
    ]
    for rel, entry in listed.items():
        content = (data / rel).read_bytes()
        assert entry["size"] == len(content)
        assert entry["hash"] == hashlib.blake2b(content, digest_size=32).hexdigest()


def test_a_file_whose_content_differs_from_its_manifest_fails_the_build(data, flip_value_byte):
    main(["manifest", str(data)])
    flip_value_byte(data / "part001.tsfile", "s1", 80000)
    with pytest.raises(TsFileFormatError, match=r"part001\.tsfile: content differs from the manif"):
        TsFileDataset(data, batch_size=5000)
    # changed on purpose (a re-convert): the message says how to bless the new content
    with pytest.raises(TsFileFormatError, match=r"write the manifest again \(tsfile-torch manif"):
        TsFileDataset(data, batch_size=5000)
    main(["manifest", str(data)])
    assert len(TsFileDataset(data, batch_size=5000)) > 0


def test_without_a_manifest_the_same_damage_reads_as_wrong_values(data, flip_value_byte):
    """Why manifests exist: this flip passes validation and every statistics check."""
    flip_value_byte(data / "part001.tsfile", "s1", 80000)
    ds = TsFileDataset(data, batch_size=SPEC.num_rows, dtype="float64")
    values = ds[0].numpy()
    rows = np.arange(SPEC.num_rows)
    want = synthetic.value_of(1, 1, rows)
    assert (values[:, 5] != want).any()  # column 5: file 1, field s1


def test_a_truncated_file_differs_from_its_manifest_in_size(data):
    main(["manifest", str(data)])
    path = data / "part002.tsfile"
    os.truncate(path, path.stat().st_size - 100)
    with pytest.raises(TsFileFormatError, match=r"part002\.tsfile: size \d+ differs from the man"):
        TsFileDataset(data, batch_size=5000)


def test_verified_files_are_remembered_and_not_hashed_again(data, tmp_path, expected_rows):
    synthetic.write_table_files(data, SPEC)  # fresh files: the manifest is written by hand
    files = sorted(data.glob("*.tsfile"))
    entries = [
        {
            "path": p.name,
            "size": p.stat().st_size,
            "hash": hashlib.blake2b(p.read_bytes(), digest_size=32).hexdigest(),
        }
        for p in files
    ]
    manifest = {"format": "tsfile-torch-manifest", "version": 1, "algorithm": "blake2b-256"}
    (data / MANIFEST).write_text(json.dumps({**manifest, "files": entries}))
    assert _records(tmp_path) == []
    TsFileDataset(data, batch_size=5000)  # hashes each file once and remembers it
    records = _records(tmp_path)
    assert len(records) == len(files)
    written = {p: p.stat().st_mtime_ns for p in records}
    ds = TsFileDataset(data, batch_size=5000)  # a later build: nothing hashed, nothing written
    assert {p: p.stat().st_mtime_ns for p in records} == written
    assert all(info.identity.content for info in ds.catalog.files)
    np.testing.assert_array_equal(ds[1].numpy(), expected_rows(SPEC, 5000, 10000).astype("f4"))


def test_the_manifest_command_remembers_what_it_hashed(data, tmp_path):
    main(["manifest", str(data)])
    assert len(_records(tmp_path)) == SPEC.num_files


def test_a_file_added_after_the_manifest_is_read_with_a_warning(data):
    main(["manifest", str(data)])
    synthetic.write_table_files(data, SPEC, prefix="later", row_offset=SPEC.num_rows)
    with pytest.warns(UserWarning, match=r"later000\.tsfile.*not listed in the manifest"):
        ds = TsFileDataset(data, batch_size=5000)
    assert len(ds.catalog.files) == 2 * SPEC.num_files


def test_a_manifest_of_another_algorithm_is_an_error_saying_so(data):
    main(["manifest", str(data)])
    manifest = json.loads((data / MANIFEST).read_text())
    manifest["algorithm"] = "xxh3-64"
    (data / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(TsFileFormatError, match=r"use 'xxh3-64'.*checks 'blake2b-256'"):
        TsFileDataset(data, batch_size=5000)


def test_a_manifest_in_a_parent_directory_applies(data, flip_value_byte):
    sub = data / "day2"
    synthetic.write_table_files(sub, SPEC)
    main(["manifest", str(data)])
    flip_value_byte(sub / "part000.tsfile", "s1", 80000)
    with pytest.raises(TsFileFormatError, match=r"day2/part000\.tsfile: content differs"):
        TsFileDataset(sub, batch_size=5000)


def test_verify_checks_files_against_their_manifest(data, capsys, flip_value_byte):
    main(["manifest", str(data)])
    capsys.readouterr()
    assert main(["verify", str(data)]) == 0
    assert "3 against their manifest), 0 damaged" in capsys.readouterr().out
    flip_value_byte(data / "part000.tsfile", "s1", 80000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["verify", str(data)]) == 1
    out = capsys.readouterr().out
    assert "DAMAGED" in out and "part000.tsfile: content differs from the manifest" in out
    assert "1 damaged" in out
