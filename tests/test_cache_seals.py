"""What a cache hands back is what its user's processes wrote (Note: private caches in
tsfile_torch/sources/cachedir.py): a decoded block re-sealed by a forger, an index entry
changed on disk and a local copy of a URL changed after its download are each dropped and read
from the TsFile (or fetched) again, with a warning naming the cache entry, and never remembered
as damage of the TsFile.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
import warnings
import zlib

import numpy as np
import pytest

from tsfile_torch import CacheMismatchWarning, TsFileDataset, TsFileIterableDataset, synthetic
from tsfile_torch.read import diskcache
from tsfile_torch.sources.content import recall

ROWS = 20000
FIELDS = 2
_PAGE = 4096


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """One device of two fields over 20,000 rows at times ``10 * row``."""
    path = tmp_path_factory.mktemp("seals") / "live.tsfile"
    rows = np.arange(ROWS)
    values = np.stack([synthetic.value_of(0, j, rows) for j in range(FIELDS)], axis=1)
    synthetic.write_table_devices(path, "t", ["s0", "s1"], {"d0": (rows * 10, values)})
    return path


def _want() -> np.ndarray:
    rows = np.arange(ROWS)
    return np.stack([synthetic.value_of(0, j, rows) for j in range(FIELDS)], axis=1)


def _dataset(path, **kw) -> TsFileIterableDataset:
    return TsFileIterableDataset(path, batch_size=1000, block_rows=1000, dtype="float64", **kw)


def _read_all(ds) -> np.ndarray:
    return np.concatenate([batch.numpy() for batch in ds])


def _not_damaged(ds) -> None:
    """No verdict of damage is remembered about any of the dataset's files."""
    for info in ds.catalog.files:
        assert "damaged" not in recall(info.index_key), info.name


def _up(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


def _forge(path: str, forger: str) -> None:
    """Write out-of-range values into block 0 of the entry at ``path`` and seal them again as
    someone who can write the file but not read the directory's key would: with the public
    crc32 seal of before (started from the key text), or an HMAC under a key of their own."""
    raw = open(path, "rb").read()
    meta_len, key_len = struct.unpack("<II", raw[8:16])
    meta = json.loads(raw[16 : 16 + meta_len])
    key = raw[16 + meta_len : 16 + meta_len + key_len]
    rows, columns, check_rows = meta["rows"], meta["columns"], meta["check_rows"]
    filled_at = _up(16 + meta_len + key_len)
    seals_at = filled_at + _up(rows)
    times_at = seals_at + _up(-(-rows // check_rows) * 8)
    values_at = times_at + _up(rows * 8)
    mm = np.memmap(path, np.uint8, "r+")
    seals = mm[seals_at : seals_at + 8].view(np.uint64)
    times = mm[times_at : times_at + rows * 8].view(np.int64)[:check_rows]
    filled = mm[filled_at : filled_at + rows].view(np.bool_)[:check_rows]
    values = mm[values_at : values_at + rows * columns * 8].view(np.float64)
    values = values.reshape(rows, columns)[:check_rows]
    values[:] = 1e30  # far outside every series' [min, max]
    if forger == "crc32 from the public key":
        crc = zlib.crc32(struct.pack("<Q", 0), zlib.crc32(key))
        for part in (values, times, filled):
            crc = zlib.crc32(np.ascontiguousarray(part), crc)
        seals[0] = (0x7C5EA1ED << 32) | crc
    else:
        mac = hmac.new(os.urandom(32), hashlib.sha256(key).digest(), hashlib.sha256)
        for part in (struct.pack("<Q", 0), values, times, filled, b"\x01"):
            mac.update(np.ascontiguousarray(part) if isinstance(part, np.ndarray) else part)
        seals[0] = int.from_bytes(mac.digest()[:8], "little")
    mm.flush()
    del mm, seals, times, filled, values


@pytest.mark.parametrize("forger", ["crc32 from the public key", "HMAC under a guessed key"])
def test_a_forged_resealed_block_is_not_served(data, tmp_path, private_cache, forger):
    cache = str(tmp_path / "cache")
    np.testing.assert_array_equal(_read_all(_dataset(data, cache="disk", cache_dir=cache)), _want())
    (entry,) = diskcache.entries(diskcache.decoded_dir(cache))
    _forge(entry.path, forger)
    ds = _dataset(data, cache="disk", cache_dir=cache)
    with pytest.warns(CacheMismatchWarning) as caught:
        got = _read_all(ds)
    np.testing.assert_array_equal(got, _want())  # block 0 decoded from the TsFile again
    (warning,) = [w for w in caught if issubclass(w.category, CacheMismatchWarning)]
    text = str(warning.message)
    assert entry.path in text and "seal mismatch" in text and "The TsFile is not at fault" in text
    _not_damaged(ds)
    with warnings.catch_warnings():  # rewritten and sealed by this user: served silently
        warnings.simplefilter("error", CacheMismatchWarning)
        again = _dataset(data, cache="disk", cache_dir=cache)
        np.testing.assert_array_equal(_read_all(again), _want())
    assert again.backends == {}


def _marks_at(raw: bytes) -> int:
    """Offset of the int64 marks in a saved index (an .npy file, whatever follows it)."""
    assert raw[:6] == b"\x93NUMPY"
    return 10 + int.from_bytes(raw[8:10], "little")


@pytest.mark.parametrize("reseal", [False, True])
def test_a_changed_index_cache_entry_is_rebuilt_and_no_file_is_called_damaged(
    data, tmp_path, private_cache, reseal
):
    index = tmp_path / "index"
    np.testing.assert_array_equal(_read_all(_dataset(data, index_cache=str(index))), _want())
    (saved,) = index.rglob("*.npy")
    raw = bytearray(saved.read_bytes())
    at = _marks_at(bytes(raw)) + 3 * 8  # mark 3 (row 3,072): not among the stretches re-read
    mark = int.from_bytes(raw[at : at + 8], "little")
    raw[at : at + 8] = (mark + 5).to_bytes(8, "little")  # still increasing, half a step late
    if reseal:  # a forger re-seals it with a key of their own
        data_len = _marks_at(bytes(raw)) + 8 * (-(-ROWS // 1024))
        tag = hmac.new(os.urandom(32), saved.name.encode() + b"\0" + raw[:data_len], "sha256")
        raw[data_len + 16 :] = tag.digest()
    saved.write_bytes(bytes(raw))
    ds = _dataset(data, index_cache=str(index))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.testing.assert_array_equal(_read_all(ds), _want())
    mismatches = [str(w.message) for w in caught if issubclass(w.category, CacheMismatchWarning)]
    assert len(mismatches) == 1 and str(saved) in mismatches[0], mismatches
    assert "the TsFile is not at fault" in mismatches[0]
    _not_damaged(ds)
    rebuilt = saved.read_bytes()  # learned from the file and saved again
    assert int.from_bytes(rebuilt[at : at + 8], "little") == mark
    np.testing.assert_array_equal(_read_all(_dataset(data, index_cache=str(index))), _want())


@pytest.fixture(scope="module")
def file_30k(tmp_path_factory):
    """One 30,000-row file of four fields (``flip_value_byte``'s measured layout)."""
    spec = synthetic.DatasetSpec(num_files=1, devices_per_file=1, fields_per_device=4)
    spec = synthetic.DatasetSpec(**{**spec.__dict__, "num_rows": 30000})
    (path,) = synthetic.write_table_files(tmp_path_factory.mktemp("copies"), spec)
    return path


def _change(copy: str, how: str, flip_value_byte) -> None:
    st = os.stat(copy)
    if how == "touched":
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return
    flip_value_byte(copy, "s1", 80000)  # values off in their last bits: no check sees it
    if how == "bytes changed, mtime restored":
        os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))


def _read_again(url: str, want, **options) -> tuple[list[str], object]:
    """Build a dataset over ``url`` and check its rows; return the CacheMismatchWarnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = TsFileDataset(url, batch_size=30000, **options)  # its metadata: from the copy
        np.testing.assert_array_equal(again[0].numpy(), want)
    _not_damaged(again)
    return [str(w.message) for w in caught if issubclass(w.category, CacheMismatchWarning)]


@pytest.mark.parametrize("how", ["bytes changed in place", "bytes changed, mtime restored"])
def test_a_local_copy_changed_after_download_is_fetched_again(
    file_30k, tmp_path, private_cache, flip_value_byte, monkeypatch, how
):
    """A store without a checksum (memory://): a copy that moved cannot be re-checked, so it is
    fetched again."""
    import fsspec

    from tsfile_torch.sources import remote

    url = f"memory://copies-{tmp_path.name}/part.tsfile"
    fsspec.filesystem("memory").pipe(url[len("memory://") - 1 :], open(file_30k, "rb").read())
    downloads = []
    real = remote._download
    monkeypatch.setattr(remote, "_download", lambda r, t: (downloads.append(t), real(r, t)))
    want = TsFileDataset(file_30k, batch_size=30000)[0].numpy()
    first = TsFileDataset(url, batch_size=30000, cache_dir=str(tmp_path / "cache"))
    np.testing.assert_array_equal(first[0].numpy(), want)
    source = first.catalog.files[0].source
    copy = source.cache_path
    assert downloads == [copy]
    _change(copy, how, flip_value_byte)
    mismatches = _read_again(url, want, cache_dir=str(tmp_path / "cache"))
    assert len(mismatches) == 1, mismatches
    assert f"local copy {copy} of {source.url} changed since it was downloaded" in mismatches[0]
    assert downloads == [copy, copy]  # fetched again


@pytest.mark.slow  # S3 round trips
@pytest.mark.parametrize("how", ["bytes changed in place", "touched"])
def test_a_moved_copy_is_checked_against_the_etag_md5(
    s3_server, file_30k, tmp_path, private_cache, flip_value_byte, how
):
    """S3 (a single-part upload: its ETag is the MD5 of the bytes): a copy that moved is hashed
    again; the same bytes are kept, others fetched again."""
    bucket = f"copies-{tmp_path.name[-20:]}".lower().replace("_", "-")
    s3_server.client.create_bucket(Bucket=bucket)
    s3_server.client.put_object(Bucket=bucket, Key="part.tsfile", Body=open(file_30k, "rb").read())
    url = f"s3://{bucket}/part.tsfile"
    options = {"storage_options": s3_server.storage_options, "cache_dir": str(tmp_path / "cache")}
    want = TsFileDataset(file_30k, batch_size=30000)[0].numpy()
    first = TsFileDataset(url, batch_size=30000, **options)
    np.testing.assert_array_equal(first[0].numpy(), want)
    copy = first.catalog.files[0].source.cache_path
    gets = s3_server.object_gets(bucket, "part.tsfile")
    _change(copy, how, flip_value_byte)
    mismatches = _read_again(url, want, **options)
    if how == "touched":  # the bytes are the ETag's: kept, nothing fetched
        assert mismatches == [] and s3_server.object_gets(bucket, "part.tsfile") == gets
        return
    assert len(mismatches) == 1, mismatches
    assert f"local copy {copy} of {url} changed since it was downloaded" in mismatches[0]
    assert "its bytes differ from the md5 known for it" in mismatches[0]
    assert s3_server.object_gets(bucket, "part.tsfile") > gets  # fetched again
