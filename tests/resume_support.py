"""Helpers shared by the resume tests of the row and window datasets (not a test module)."""

from __future__ import annotations

import io
import os

import torch


def read_log(log: str) -> list[int]:
    """Return the row numbers a reading process logged, one per line (none if no log yet)."""
    if not os.path.exists(log):
        return []
    with open(log) as fh:
        return [int(line) for line in fh]


def through_disk(state: dict) -> dict:
    """Return ``state`` after a torch.save / torch.load round trip of plain data only."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)
