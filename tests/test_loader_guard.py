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
