"""Remote objects are checked after download, before their local copy is kept: against a manifest
beside them and against the store's checksum (an S3 single-part ETag is the MD5 of the bytes)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from tsfile_torch import RemoteError, TsFileDataset, TsFileWindowDataset, synthetic
from tsfile_torch.integrity.manifest import MANIFEST_NAME, write_manifest
from tsfile_torch.sources import remote

pytest.importorskip("s3fs")

SPEC = synthetic.DatasetSpec(2, 1, 2, 3000)
_BUCKETS = iter(range(10_000))


@pytest.fixture
def files(tmp_path_factory):
    """Two table files and their manifest, written while the files were good."""
    directory = tmp_path_factory.mktemp("manifested")
    synthetic.write_table_files(directory, SPEC)
    write_manifest(directory)
    return directory


def _want(file: int) -> np.ndarray:
    rows = np.arange(SPEC.num_rows)
    return np.stack([synthetic.value_of(file, c, rows) for c in range(2)], axis=1)


def _copies(cache) -> list[str]:
    """Names of the copies in ``cache`` (not locks, the key or records of downloads)."""
    return sorted(
        p.name for p in cache.iterdir() if not p.name.endswith((".lock", ".rec"))
        and not p.name.startswith(".")
    )  # fmt: skip


def test_an_object_that_differs_from_the_manifest_beside_it_is_an_error_and_not_cached(
    s3_server, files, tmp_path
):
    bucket = f"manifest-{next(_BUCKETS)}"
    s3_server.upload(bucket, files, prefix="data/")
    damaged = bytearray((files / "part001.tsfile").read_bytes())
    damaged[len(damaged) // 2] ^= 0x01  # a value byte: same size, plausible values
    key = "data/part001.tsfile"
    s3_server.client.put_object(Bucket=bucket, Key=key, Body=bytes(damaged))
    cache = tmp_path / "cache"
    kwargs = {"storage_options": s3_server.storage_options, "cache_dir": cache}
    ds = TsFileDataset(f"s3://{bucket}/data/", batch_size=1000, dtype="float64", **kwargs)
    assert ds.columns == ["t.d0.s0", "t.d0.s1", "t.d1.s0", "t.d1.s1"]  # the manifest: no file
    url = f"s3://{bucket}/{key}"
    with pytest.raises(
        RemoteError,
        match=rf"^{re.escape(url)}: content differs from the manifest "
        rf"s3://{bucket}/data/{MANIFEST_NAME} \(blake2b-256",
    ):
        ds[0]
    assert not [n for n in _copies(cache) if n.endswith("part001.tsfile")]  # nothing kept
    good = TsFileWindowDataset(
        f"s3://{bucket}/data/part000.tsfile", 100, stride=100, dtype="float64", **kwargs
    )
    np.testing.assert_array_equal(good[3].numpy(), _want(0)[300:400])  # checked, and exact


def test_an_intact_object_listed_in_the_manifest_reads_exactly(s3_server, files, tmp_path):
    bucket = f"manifest-{next(_BUCKETS)}"
    s3_server.upload(bucket, files, prefix="data/")
    kwargs = {"storage_options": s3_server.storage_options, "cache_dir": tmp_path / "cache"}
    [entry] = remote.expand_url(
        f"s3://{bucket}/data/part001.tsfile", remote.RemoteOptions(s3_server.storage_options)
    )
    assert entry.listed is not None and entry.listed[0].endswith(f"data/{MANIFEST_NAME}")
    ds = TsFileDataset(
        f"s3://{bucket}/data/part001.tsfile", batch_size=3000, dtype="float64", **kwargs
    )
    np.testing.assert_array_equal(ds[0].numpy(), _want(1))


def test_a_download_that_disagrees_with_the_etag_md5_is_an_error_and_not_cached(
    s3_server, files, tmp_path
):
    bucket = f"etag-{next(_BUCKETS)}"
    s3_server.client.create_bucket(Bucket=bucket)
    body = (files / "part000.tsfile").read_bytes()
    s3_server.client.put_object(Bucket=bucket, Key="x.tsfile", Body=body)  # no manifest
    options = remote.RemoteOptions(s3_server.storage_options, str(tmp_path / "cache"))
    [entry] = remote.expand_url(f"s3://{bucket}/x.tsfile", options)
    import hashlib

    assert entry.listed is None and entry.md5 == hashlib.md5(body).hexdigest()
    # what a corrupted transfer looks like: the bytes that arrive are not the ETag's
    wrong = dataclasses.replace(entry, md5="0" * 32)
    with pytest.raises(
        RemoteError,
        match=r"x\.tsfile: the downloaded bytes have MD5 [0-9a-f]{32}"
        r", the store's ETag says 0{32}: the download was corrupted",
    ):
        remote.fetch(wrong)
    assert _copies(tmp_path / "cache") == []
    assert open(remote.fetch(entry), "rb").read() == body  # the real ETag: checked and kept


@pytest.mark.slow  # S3 round trips
def test_a_kms_encrypted_objects_etag_is_not_taken_for_an_md5(s3_server, files, tmp_path):
    import boto3

    kms = boto3.client(
        "kms",
        endpoint_url=s3_server.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    key_id = kms.create_key()["KeyMetadata"]["KeyId"]
    bucket = f"kms-{next(_BUCKETS)}"
    s3_server.client.create_bucket(Bucket=bucket)
    body = (files / "part000.tsfile").read_bytes()
    s3_server.client.put_object(
        Bucket=bucket, Key="e.tsfile", Body=body, ServerSideEncryption="aws:kms", SSEKMSKeyId=key_id
    )
    options = remote.RemoteOptions(s3_server.storage_options, str(tmp_path / "cache"))
    [entry] = remote.expand_url(f"s3://{bucket}/e.tsfile", options)
    # real S3 gives SSE-KMS objects an ETag that is not their MD5 (moto's is): the same here
    not_md5 = dataclasses.replace(entry, md5="0" * 32)
    assert open(remote.fetch(not_md5), "rb").read() == body  # the store says KMS: not checked


def test_an_object_the_manifest_beside_it_does_not_list_is_read_with_a_warning(
    s3_server, files, tmp_path
):
    bucket = f"manifest-{next(_BUCKETS)}"
    s3_server.upload(bucket, files, prefix="data/")
    body = (files / "part000.tsfile").read_bytes()
    s3_server.client.put_object(Bucket=bucket, Key="data/zz-added.tsfile", Body=body)
    options = remote.RemoteOptions(s3_server.storage_options, str(tmp_path / "cache"))
    with pytest.warns(UserWarning, match=r"zz-added\.tsfile: not listed in the manifest beside"):
        entries = remote.expand_url(f"s3://{bucket}/data/", options)
    assert [e.listed is None for e in entries] == [False, False, True]


@pytest.mark.slow  # S3 round trips
def test_a_multipart_etag_is_not_taken_for_an_md5(s3_server, files, tmp_path):
    bucket = f"etag-{next(_BUCKETS)}"
    client = s3_server.client
    client.create_bucket(Bucket=bucket)
    body = (files / "part000.tsfile").read_bytes()
    upload = client.create_multipart_upload(Bucket=bucket, Key="m.tsfile")["UploadId"]
    part = client.upload_part(
        Bucket=bucket, Key="m.tsfile", PartNumber=1, UploadId=upload, Body=body
    )
    client.complete_multipart_upload(
        Bucket=bucket,
        Key="m.tsfile",
        UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
    )
    options = remote.RemoteOptions(s3_server.storage_options, str(tmp_path / "cache"))
    [entry] = remote.expand_url(f"s3://{bucket}/m.tsfile", options)
    assert "-" in entry.version and entry.md5 is None
    ds = TsFileDataset(
        f"s3://{bucket}/m.tsfile",
        batch_size=3000,
        dtype="float64",
        storage_options=s3_server.storage_options,
        cache_dir=tmp_path / "cache",
    )
    np.testing.assert_array_equal(ds[0].numpy(), _want(0))
