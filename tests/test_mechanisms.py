"""The A/B switches of tsfile_torch/mechanisms.py: each mechanism off takes its plain route and
the data stays exact (benchmarks/ab.py measures what each pays)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tsfile_torch import mechanisms

CHILD = r"""
import json, os, sys
import numpy as np
import torch
from tsfile_torch import TsFileIterableDataset, TsFileWindowDataset, make_loader, process
from tsfile_torch.data.ring import ring_available

out = {"ring": ring_available(), "malloc": process.enabled("malloc"),
       "worker_reports": process.enabled("worker_reports")}
for cache in ("none", "disk"):
    for order in ("sequential", "shuffle"):
        ds = TsFileIterableDataset(sys.argv[1], batch_size=1000, cache=cache, order=order,
                                   cache_dir=os.path.join(sys.argv[2], cache))
        values = [torch.cat(list(make_loader(ds, num_workers=2))).numpy() for _ in range(2)]
        for i, v in enumerate(values):
            np.save(os.path.join(sys.argv[2], f"{cache}-{order}-{i}.npy"), v)
windows = TsFileWindowDataset(sys.argv[1], 16, 4, stride=250, shuffle=True)
got = [x for x, _ in make_loader(windows, batch_size=8, num_workers=2)]
out["windows"] = int(sum(len(x) for x in got))
out["expected_windows"] = len(windows)
print(json.dumps(out))
"""


def test_names_are_checked_and_parsed():
    assert mechanisms._parse(" ring, exchange ,") == {"ring", "exchange"}
    assert mechanisms._parse("") == frozenset()
    with pytest.raises(ValueError, match=r"unknown mechanisms \['rng'\]; they are ring, "):
        mechanisms._parse("ring,rng")
    with pytest.raises(ValueError, match="unknown mechanism 'rng'"):
        mechanisms.on("rng")
    assert all(mechanisms.on(name) for name in mechanisms.MECHANISMS)  # none off here


@pytest.mark.slow  # a child with 2-worker loaders: about 10 s
def test_every_mechanism_off_gives_the_same_rows(small_dir, small_expected, run_python, tmp_path):
    env = {**os.environ, "TSFILE_TORCH_OFF": ",".join(mechanisms.MECHANISMS)}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(os.path.dirname(os.path.dirname(mechanisms.__file__))), env.get("PYTHONPATH", "")]
    )
    done = run_python(CHILD, str(small_dir), str(tmp_path), env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert (got["ring"], got["malloc"], got["worker_reports"]) == (False, False, False)
    assert got["windows"] == got["expected_windows"]
    want = small_expected.astype(np.float32)
    key = np.lexsort(want.T[::-1])
    for name in sorted(p for p in os.listdir(tmp_path) if p.endswith(".npy")):
        values = np.load(tmp_path / name)
        if name.startswith(("none-sequential", "disk-sequential")):
            np.testing.assert_array_equal(values, want, err_msg=name)  # row order
        else:
            np.testing.assert_array_equal(values[np.lexsort(values.T[::-1])], want[key], name)
