"""A plain DataLoader that would stack the row datasets' batches again is a clear error."""

from __future__ import annotations

import pytest
import torch.utils.data as tud

from tsfile_torch import TsFileDataset, TsFileIterableDataset, make_loader


@pytest.mark.parametrize("cls", [TsFileIterableDataset, TsFileDataset])
def test_dataloader_with_a_batch_size_over_a_batch_dataset_names_the_fix(small_dir, cls):
    ds = cls(small_dir, batch_size=1000)
    with pytest.raises(
        ValueError,
        match=r"yields whole batches of batch_size=1000 rows.*"
        r"make_loader\(ds\) or DataLoader\(ds, batch_size=None\)",
    ):
        next(iter(tud.DataLoader(ds)))  # batch_size=1, the DataLoader's default
    batch = next(iter(tud.DataLoader(ds, batch_size=None)))
    assert tuple(batch.shape) == (1000, len(ds.columns))  # no leading dimension
    assert tuple(next(iter(make_loader(ds))).shape) == (1000, len(ds.columns))
    if cls is TsFileDataset:  # indexing it directly is no DataLoader: no error
        assert tuple(ds[0].shape) == (1000, len(ds.columns))


@pytest.mark.parametrize("cls", [TsFileIterableDataset, TsFileDataset])
def test_two_loaders_started_at_once_from_two_threads_never_share_a_dataset(
    small_dir, small_expected, cls
):
    """One gets every row exactly once with its exact values, the other the documented error;
    none a mixed epoch (3 rounds, each on a new dataset object)."""
    import threading

    import numpy as np

    from tsfile_torch.errors import TsFileTorchError

    for _ in range(3):
        ds = cls(small_dir, batch_size=500, return_timestamps=True, dtype="float64")
        go = threading.Barrier(2)
        results: dict[int, object] = {}

        def run(k, ds=ds, go=go, results=results):
            loader = make_loader(ds, num_workers=2)
            go.wait()
            try:
                results[k] = [(v.numpy().copy(), t.numpy().copy()) for v, t in loader]
            except TsFileTorchError as err:
                results[k] = err

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        errors = [r for r in results.values() if isinstance(r, TsFileTorchError)]
        batches = [r for r in results.values() if not isinstance(r, TsFileTorchError)]
        assert len(errors) == 1 and "already being iterated by another loader" in str(errors[0])
        assert len(batches) == 1
        times = np.concatenate([t for _, t in batches[0]])
        values = np.concatenate([v for v, _ in batches[0]])
        assert np.array_equal(np.sort(times), np.arange(5000))  # every row once
        assert np.array_equal(values[np.argsort(times)], small_expected)
