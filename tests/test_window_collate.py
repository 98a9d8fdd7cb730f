"""A plain DataLoader with torch's default collate batches windows as make_loader does."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from tsfile_torch import TsFileWindowDataset, make_loader


@pytest.mark.parametrize(
    "options",
    [{"horizon": 0}, {"horizon": 4}, {"horizon": 0, "return_timestamps": True},
     {"horizon": 4, "return_dict": True}],
)  # fmt: skip
def test_default_collate_batches_windows_as_make_loader_does(ragged_panel, options):
    ds = TsFileWindowDataset(ragged_panel, 16, **options)
    plain = list(DataLoader(ds, batch_size=32))
    ours = list(make_loader(ds, batch_size=32))
    assert len(plain) == len(ours) == -(-len(ds) // 32)
    for a, b in zip(plain, ours, strict=True):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)
        elif isinstance(a, dict):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        else:
            assert len(a) == len(b) and all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
