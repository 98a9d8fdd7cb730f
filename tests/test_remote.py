"""URL sources against a real S3 API (moto's server on loopback) through s3fs: values, requests.

Every test uploads the files it reads into a bucket of its own and points ``cache_dir`` at its
``tmp_path``, so request counts on the server belong to that test alone.
"""

from __future__ import annotations

import multiprocessing
import re
import sys
import urllib.request

import numpy as np
import pytest
import torch

from tsfile_torch import (
    RemoteError,
    TsFileDataset,
    TsFileFormatError,
    TsFileIterableDataset,
    TsFileTorchError,
    TsFileWindowDataset,
    make_loader,
    synthetic,
)
from tsfile_torch.sources import remote

_BUCKETS = iter(range(10_000))


@pytest.fixture
def bucket(s3_server, small_dir) -> str:
    """A new bucket holding the small dataset's files under ``data/``."""
    name = f"bucket-{next(_BUCKETS)}"
    s3_server.upload(name, small_dir, prefix="data/")
    return name


@pytest.fixture
def s3_options(s3_server, tmp_path) -> dict:
    """Dataset options that read from the test server into this test's ``tmp_path / "cache"``."""
    return {"storage_options": s3_server.storage_options, "cache_dir": tmp_path / "cache"}


def _assert_every_row_exact(batches, expected: np.ndarray) -> None:
    """``(values, timestamps)`` batches, sorted by time (timestamps = row numbers), are
    ``expected``: every row once, each with its values."""
    values = torch.cat([v for v, _ in batches]).numpy()
    times = torch.cat([t for _, t in batches]).numpy()
    order = np.argsort(times, kind="stable")
    np.testing.assert_array_equal(times[order], np.arange(len(expected)))
    np.testing.assert_array_equal(values[order], expected.astype(np.float32))


@pytest.mark.parametrize("num_workers", [pytest.param(0, marks=pytest.mark.slow), 2])
def test_iterable_dataset_reads_s3_exactly_and_a_second_epoch_fetches_nothing(
    s3_server, bucket, small_expected, tmp_path, s3_options, num_workers
):
    ds = TsFileIterableDataset(
        f"s3://{bucket}/data/",
        batch_size=700,
        return_timestamps=True,
        **s3_options,
    )
    assert [f.name for f in ds.catalog.files] == [
        f"s3://{bucket}/data/part00{i}.tsfile" for i in range(3)
    ]
    built = s3_server.object_gets(bucket)
    assert 0 < built <= 2 * 3  # metadata: head and tail range reads, not whole files
    assert list((tmp_path / "cache").glob("*.tsfile")) == []  # nothing downloaded at build
    loader = make_loader(ds, num_workers=num_workers)
    for epoch in range(2):
        ds.set_epoch(epoch)
        before = len(s3_server.requests)
        _assert_every_row_exact(list(loader), small_expected)
        if epoch == 0:  # each file downloaded once, however many workers read it
            assert s3_server.object_gets(bucket) - built == 3
        else:
            assert len(s3_server.requests) == before  # nothing at all reached the server


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_map_style_dataset_reads_s3_exactly(
    s3_server, bucket, small_expected, s3_options, num_workers
):
    ds = TsFileDataset(
        f"s3://{bucket}/data/*.tsfile",
        batch_size=800,
        read_backend="mmap",
        return_timestamps=True,
        **s3_options,
    )
    loader = make_loader(ds, num_workers=num_workers)
    for _ in range(2):  # workers' batches arrive round-robin: compared in row order
        _assert_every_row_exact(list(loader), small_expected)
    if num_workers == 0:
        assert set(ds.backends.values()) == {"mmap"}  # the local copies, memory-mapped


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_a_dataset_built_again_on_a_warm_cache_reads_no_object(
    s3_server, bucket, small_expected, tmp_path
):
    kwargs = {"storage_options": s3_server.storage_options, "cache_dir": tmp_path / "cache"}
    first = TsFileDataset(f"s3://{bucket}/data/", batch_size=5000, **kwargs)
    first[0]
    gets = s3_server.object_gets(bucket)
    again = TsFileDataset(f"s3://{bucket}/data/", batch_size=5000, **kwargs)
    np.testing.assert_array_equal(again[0].numpy(), small_expected.astype(np.float32))
    assert s3_server.object_gets(bucket) == gets  # listing only: metadata and data are local


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_a_changed_object_is_fetched_again(s3_server, tmp_path):
    name = f"bucket-{next(_BUCKETS)}"
    old, new = tmp_path / "old", tmp_path / "new"
    synthetic.write_table_files(old, synthetic.DatasetSpec(1, 1, 2, 1000))
    synthetic.write_table_files(new, synthetic.DatasetSpec(1, 1, 2, 1500))
    s3_server.upload(name, old)
    url = f"s3://{name}/part000.tsfile"
    kwargs = {"storage_options": s3_server.storage_options, "cache_dir": tmp_path / "cache"}
    first = TsFileDataset(url, batch_size=2000, **kwargs)
    assert first[0].shape == (1000, 2)
    stale_kwargs = {**kwargs, "cache_dir": tmp_path / "other-cache"}
    stale = TsFileDataset(url, batch_size=2000, **stale_kwargs)

    s3_server.upload(name, new)  # same key, new content
    gets = s3_server.object_gets(name, "part000.tsfile")
    second = TsFileDataset(url, batch_size=2000, **kwargs)
    expected = np.stack([synthetic.value_of(0, c, np.arange(1500)) for c in range(2)], axis=1)
    np.testing.assert_array_equal(second[0].numpy(), expected.astype(np.float32))
    assert s3_server.object_gets(name, "part000.tsfile") > gets
    assert len(list((tmp_path / "cache").glob("*part000.tsfile"))) == 1  # old copy dropped
    # the key holds the version: a same-size change (new ETag) is a new copy too
    same_size = [remote.RemoteFile(url, 100, etag).cache_path for etag in ("a1", "b2")]
    assert same_size[0] != same_size[1]
    # a dataset built before the change, not yet cached: an error, never new data
    with pytest.raises(RemoteError, match=rf"{re.escape(url)}: object changed since"):
        stale[0]


def test_workers_fetching_one_file_at_once_download_it_once(s3_server, bucket, tmp_path):
    (entry,) = remote.expand_url(
        f"s3://{bucket}/data/part000.tsfile",
        remote.RemoteOptions(s3_server.storage_options, str(tmp_path / "cache")),
    )
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_fetch_after, args=(barrier, entry)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert s3_server.object_gets(bucket, "data/part000.tsfile") == 1
    assert [p.name for p in (tmp_path / "cache").iterdir() if ".part." in p.name] == []


def _fetch_after(barrier, entry) -> None:
    barrier.wait()
    path = remote.fetch(entry)
    assert path == entry.cache_path


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_cache_limit_keeps_the_copies_under_the_bound(s3_server, bucket, small_expected, tmp_path):
    cache = tmp_path / "cache"
    sizes = [
        s3_server.client.head_object(Bucket=bucket, Key=f"data/part00{i}.tsfile") for i in range(3)
    ]
    limit = max(s["ContentLength"] for s in sizes) + 1  # room for one file
    ds = TsFileIterableDataset(
        f"s3://{bucket}/data/",
        batch_size=5000,
        storage_options=s3_server.storage_options,
        cache_dir=cache,
        cache_limit=limit,
    )
    got = torch.cat(list(ds)).numpy()
    np.testing.assert_array_equal(got, small_expected.astype(np.float32))
    kept = [
        p.stat().st_size
        for p in cache.iterdir()
        if not p.name.endswith((".lock", ".rec")) and not p.name.startswith(".")
    ]  # the copies (not their locks and records, or the cache's key)
    assert len(kept) == 1 and sum(kept) <= limit


def test_missing_bucket_names_the_url(s3_server, tmp_path):
    for url in ("s3://no-such-bucket/x.tsfile", "s3://no-such-bucket/*.tsfile"):
        with pytest.raises(RemoteError, match=rf"{re.escape(url)}: cannot list .*no such bucket"):
            TsFileIterableDataset(url, storage_options=s3_server.storage_options)


def test_missing_key_names_the_url(s3_server, bucket):
    url = f"s3://{bucket}/data/nope.tsfile"
    with pytest.raises(RemoteError, match=rf"{re.escape(url)}: cannot list .*no such"):
        TsFileIterableDataset(url, storage_options=s3_server.storage_options)
    with pytest.raises(RemoteError, match=r"x\*.tsfile: glob pattern matches no objects"):
        TsFileIterableDataset(
            f"s3://{bucket}/data/x*.tsfile", storage_options=s3_server.storage_options
        )


def test_bad_credentials_name_the_url(s3_server, bucket):
    url = f"s3://{bucket}/data/"
    _moto_auth(s3_server.endpoint, "0")  # from now on moto checks every request's key
    try:
        with pytest.raises(
            TsFileTorchError, match=rf"{re.escape(url)}: cannot list .*access denied"
        ):
            TsFileIterableDataset(
                url, storage_options={**s3_server.storage_options, "key": "wrong-key"}
            )
    finally:
        _moto_auth(s3_server.endpoint, "inf")


def _moto_auth(endpoint: str, count: str) -> None:
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=count.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},  # a form body would be parsed away
    )
    urllib.request.urlopen(request, timeout=10).close()


def test_a_url_without_fsspec_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if fsspec were not installed
    with pytest.raises(
        RemoteError, match=r"s3://b/x.tsfile: .*pip install 'tsfile-torch\[remote\]'"
    ):
        TsFileIterableDataset("s3://b/x.tsfile")


def test_memory_urls_read_like_paths_while_another_thread_runs(small_dir, small_expected, tmp_path):
    """A process with threads validates in a fresh interpreter: memory:// must still work."""
    import threading

    import fsspec

    fs = fsspec.filesystem("memory")
    for path in sorted(small_dir.glob("*.tsfile")):
        fs.pipe(f"/tsfile-torch-test/{path.name}", path.read_bytes())
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        mem = TsFileDataset("memory://tsfile-torch-test/", batch_size=5000, cache_dir=tmp_path)
        np.testing.assert_array_equal(mem[0].numpy(), small_expected.astype(np.float32))
    finally:
        stop.set()
        other.join()
        fs.rm("/tsfile-torch-test", recursive=True)


def test_file_urls_are_local_files_read_in_place(small_dir, small_expected):
    from tsfile_torch.sources import LocalFile

    local = TsFileDataset(f"file://{small_dir}/*.tsfile", batch_size=5000)
    assert [f.source for f in local.catalog.files] == [
        LocalFile(str(p)) for p in sorted(small_dir.glob("*.tsfile"))
    ]
    np.testing.assert_array_equal(local[0].numpy(), small_expected.astype(np.float32))


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_bench_on_a_url_times_fetch_and_later_epochs_beside_the_local_copies(
    s3_server, bucket, tmp_path, capsys, bench_script
):
    import json

    main = bench_script("remote").main  # benchmarks/remote.py (moved out of the package)
    out = tmp_path / "remote.jsonl"
    argv = [f"s3://{bucket}/data/", "--quick", "--batch-size", "1000"]
    options = json.dumps(s3_server.storage_options)
    assert main([*argv, "--storage-options", options, "--json", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["config"] for r in records] == [
        "remote, empty cache, workers=0",
        "remote, warm cache, workers=0",
        "local copies, workers=0",
    ]
    assert all(r["checksum_ok"] and r["rows"] == 5000 and r["files"] == 3 for r in records)
    assert all(len(r["epoch_seconds"]) == 2 for r in records)
    assert "remote, empty cache, workers=0" in capsys.readouterr().out


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_a_process_downloads_only_the_files_its_rows_need(s3_server, tmp_path, s3_options):
    # one series continued across two files: rows 0..999 in day0, 1000..1999 in day1
    name = f"bucket-{next(_BUCKETS)}"
    spec = synthetic.DatasetSpec(1, 1, 2, 1000)
    synthetic.write_table_files(tmp_path / "files", spec, prefix="day0_")
    synthetic.write_table_files(tmp_path / "files", spec, prefix="day1_", row_offset=1000)
    s3_server.upload(name, tmp_path / "files")
    ds = TsFileDataset(
        f"s3://{name}/",
        batch_size=500,
        **s3_options,
    )
    assert ds.num_rows == 2000
    built = {k: s3_server.object_gets(name, k) for k in ("day0_000.tsfile", "day1_000.tsfile")}
    expected = np.stack([synthetic.value_of(0, c, np.arange(1500, 2000)) for c in range(2)], 1)
    np.testing.assert_array_equal(ds[3].numpy(), expected.astype(np.float32))  # rows 1500..1999
    assert s3_server.object_gets(name, "day0_000.tsfile") == built["day0_000.tsfile"]
    assert s3_server.object_gets(name, "day1_000.tsfile") == built["day1_000.tsfile"] + 1


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_reopened_readers_and_time_ranges_use_the_local_copies(
    s3_server, bucket, small_expected, s3_options
):
    ds = TsFileDataset(
        f"s3://{bucket}/data/",
        batch_size=1000,
        start_time=100,  # cuts every shard: counting its rows reads timestamps at build time
        end_time=2099,
        max_open_files=1,  # every file switch closes a reader and opens another
        **s3_options,
    )
    want = small_expected[100:2100].astype(np.float32)
    np.testing.assert_array_equal(torch.cat([ds[0], ds[1]]).numpy(), want)
    before = len(s3_server.requests)
    np.testing.assert_array_equal(torch.cat([ds[1], ds[0]]).numpy()[1000:], want[:1000])
    assert len(s3_server.requests) == before  # reopening found the copies: no request
    assert s3_server.object_gets(bucket) <= 3 * 2 + 3  # metadata, then one download per file


def test_an_object_deleted_after_the_build_is_an_error_naming_it_at_first_read(
    s3_server, bucket, tmp_path, s3_options
):
    ds = TsFileDataset(
        f"s3://{bucket}/data/",
        batch_size=5000,
        **s3_options,
    )
    s3_server.client.delete_object(Bucket=bucket, Key="data/part001.tsfile")
    url = f"s3://{bucket}/data/part001.tsfile"
    with pytest.raises(RemoteError, match=rf"{re.escape(url)}: cannot fetch .*no such"):
        ds[0]
    assert [p.name for p in (tmp_path / "cache").iterdir() if ".part." in p.name] == []


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_windows_over_an_s3_panel_equal_the_local_panels(s3_server, tmp_path):
    name = f"bucket-{next(_BUCKETS)}"
    panel = tmp_path / "panel"
    synthetic.write_panel(panel, num_devices=3, num_fields=2, num_rows=[700, 500, 600])
    s3_server.upload(name, panel, prefix="panel/")
    args = dict(context_length=48, horizon=12, stride=5, return_timestamps=True, dtype="float64")
    local = TsFileWindowDataset(panel, **args)
    ds = TsFileWindowDataset(
        f"s3://{name}/panel/",
        storage_options=dict(s3_server.storage_options),
        cache_dir=str(tmp_path / "cache"),
        **args,
    )
    assert ds.devices == local.devices == ["meters.s0", "meters.s1", "meters.s2"]
    assert ds.columns == ["f0", "f1"] and len(ds) == len(local)
    counts = {"meters.s0": 129, "meters.s1": 89, "meters.s2": 109}  # (rows - 60) // 5 + 1
    assert ds.window_counts() == local.window_counts() == counts
    assert [f.name for f in ds.catalog.files] == [
        f"s3://{name}/panel/panel00{i}.tsfile" for i in range(2)
    ]
    for i in (0, 128, 129, 217, 218, 326):  # first and last window of each device: exact values
        info = ds.window_info(i)
        assert info == local.window_info(i)
        d = int(info.device.rsplit(".s", 1)[1])
        rows = info.start_row + np.arange(60)
        x, y, x_times, y_times = ds[i]
        want = np.stack([synthetic.value_of(d, j, rows) for j in range(2)], axis=1)
        np.testing.assert_array_equal(torch.cat([x, y]).numpy(), want)
        stamps = synthetic.panel_device_times(d, rows)
        np.testing.assert_array_equal(torch.cat([x_times, y_times]).numpy(), stamps)
    got = list(make_loader(ds, batch_size=64, num_workers=2))
    want = list(make_loader(local, batch_size=64, num_workers=2))
    assert len(got) == len(want) == -(-len(ds) // 64)
    for a, b in zip(got, want, strict=True):
        for part_a, part_b in zip(a, b, strict=True):
            torch.testing.assert_close(part_a, part_b, rtol=0, atol=0)
    copies = sorted(p.name.rsplit("-", 1)[1] for p in (tmp_path / "cache").glob("*.tsfile"))
    assert copies == ["panel000.tsfile", "panel001.tsfile"]  # read through local copies


@pytest.mark.slow  # S3 round trips and fresh interpreters
def test_a_damaged_object_is_a_format_error_naming_its_url_not_a_crash(s3_server, tmp_path):
    name = f"bucket-{next(_BUCKETS)}"
    synthetic.write_table_files(tmp_path / "src", synthetic.DatasetSpec(1, 1, 4, 30000))
    data = bytearray(next((tmp_path / "src").glob("*.tsfile")).read_bytes())
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "good.tsfile").write_bytes(bytes(data))
    data[len(data) - 8] ^= 0xFF  # the metadata-size field: SIGSEGV in tsfile's reader
    (tmp_path / "up" / "meta.tsfile").write_bytes(bytes(data))
    s3_server.upload(name, tmp_path / "up", prefix="data/")
    url = f"s3://{name}/data/meta.tsfile"
    kwargs = {"storage_options": s3_server.storage_options, "cache_dir": tmp_path / "cache"}
    with pytest.raises(
        TsFileFormatError, match=rf"^{re.escape(url)}: tsfile's native reader crashed"
    ):
        TsFileIterableDataset(f"s3://{name}/data/", **kwargs)
    with pytest.raises(TsFileFormatError, match=rf"^{re.escape(url)}: "):
        TsFileWindowDataset(url, 24, 8, **kwargs)
    good = TsFileDataset(f"s3://{name}/data/good.tsfile", batch_size=30000, **kwargs)
    want = np.stack([synthetic.value_of(0, c, np.arange(30000)) for c in range(4)], axis=1)
    np.testing.assert_array_equal(good[0].numpy(), want.astype(np.float32))


def test_an_object_without_a_version_keeps_nothing_under_its_identity():
    """No ETag, generation or mtime: a same-size rewrite would look the same, so no verdict,
    index or decoded cache is kept for it (index_key None: unkeyable)."""
    versioned = remote.RemoteFile("s3://b/k.tsfile", 100, '"etag"')
    assert versioned.index_key() == repr(("s3://b/k.tsfile", '"etag"', 100))
    assert remote.RemoteFile("s3://b/k.tsfile", 100, "").index_key() is None


def test_each_build_of_an_unversioned_object_reads_its_own_copy(small_dir, tmp_path, monkeypatch):
    """A store that gives no version: a rewrite of the same size would look unchanged, so no
    build reads through the local copy of an earlier one (Note: remote sources)."""
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Unversioned(MemoryFileSystem):
        protocol = "unversioned"
        store: dict = {}  # noqa: RUF012 - fsspec's own layout: one store per class
        pseudo_dirs = [""]  # noqa: RUF012

        @classmethod
        def _strip_protocol(cls, path):
            return super()._strip_protocol(path.replace("unversioned://", "memory://", 1))

        def info(self, path, **kwargs):
            return {k: v for k, v in super().info(path, **kwargs).items() if k != "created"}

        def ls(self, path, detail=True, **kwargs):
            out = super().ls(path, detail=detail, **kwargs)
            return [{k: v for k, v in e.items() if k != "created"} for e in out] if detail else out

    fsspec.register_implementation("unversioned", Unversioned, clobber=True)
    path = sorted(small_dir.glob("*.tsfile"))[0]
    Unversioned().pipe("/data/part.tsfile", path.read_bytes())
    downloads = []
    real = remote._download
    monkeypatch.setattr(remote, "_download", lambda r, t: (downloads.append(t), real(r, t)))
    want = TsFileDataset(path, batch_size=5000)[0].numpy()

    def build():
        return TsFileDataset(
            "unversioned://data/", batch_size=5000, cache_dir=tmp_path, validate=False
        )

    first, second = build(), build()
    assert first.catalog.files[0].source.version == ""
    np.testing.assert_array_equal(first[0].numpy(), want)
    np.testing.assert_array_equal(second[0].numpy(), want)
    assert len(downloads) == 2 and downloads[0] != downloads[1]  # a copy per build
    first.close()  # its readers reopen: its copy is still there (builds leave each other's)
    np.testing.assert_array_equal(first[0].numpy(), want)
    assert len(downloads) == 2
    assert len(list(tmp_path.glob("*.lock"))) - len(list(tmp_path.glob(".*.lock"))) == 1
    versioned = remote.RemoteFile("s3://b/k.tsfile", 100, '"etag"')
    assert versioned.cache_path == remote.RemoteFile("s3://b/k.tsfile", 100, '"etag"').cache_path
