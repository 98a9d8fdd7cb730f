"""Switches that turn one performance mechanism off, for its A/B (``benchmarks/ab.py``).

``TSFILE_TORCH_OFF=ring,exchange`` in the environment turns those mechanisms off in every
process of a run (DataLoader workers started by fork or spawn read the same environment); each
then takes the plain route it replaces. The figures behind each are in benchmarks/RESULTS.md,
section "What each mechanism pays". Not a user setting: an unknown name is an error.
"""

from __future__ import annotations

import os

__all__ = ["MECHANISMS", "on"]

#: name -> the plain route taken when it is off
MECHANISMS = {
    "ring": "torch's own hand-over: a shared-memory segment per batch",
    "exchange": "each fork worker decodes every block it reads itself",
    "first_read": "a pass's first read decodes whole blocks",
    "readahead": "a sequential streaming pass decodes the next pass's first blocks when asked",
    "kept": "workers read and hand over kept batches themselves",
    "epoch_sums": "no check of an epoch's sums against the files' statistics",
    "malloc": "glibc's default malloc thresholds",
    "sigchld": "torch's SIGCHLD handler alone: a killed worker is torch's RuntimeError",
}


def _parse(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - MECHANISMS.keys())
    if unknown:
        raise ValueError(
            f"TSFILE_TORCH_OFF names unknown mechanisms {unknown}; they are {', '.join(MECHANISMS)}"
        )
    return names


_OFF = _parse(os.environ.get("TSFILE_TORCH_OFF", ""))


def on(name: str) -> bool:
    """Return whether mechanism ``name`` is on (not named in ``TSFILE_TORCH_OFF``)."""
    if name not in MECHANISMS:
        raise ValueError(f"unknown mechanism {name!r}; they are {', '.join(MECHANISMS)}")
    return name not in _OFF
