"""Cache locks where ``fcntl`` is missing (Windows: issue #42 item 9; Note: lock kinds in
tsfile_torch.sources.cachedir): a child interpreter whose ``import fcntl`` fails (and which has
no ``msvcrt``) locks with ``O_EXCL`` files and trains two ``cache="disk"`` epochs, the second
from the cache, with exact values and no lock left held.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

_DISK_EPOCHS = r"""
import json, os, sys
sys.modules["fcntl"] = None  # import fcntl: ImportError, as on Windows
import numpy as np
import pytest
from tsfile_torch import TsFileIterableDataset
from tsfile_torch.sources.cachedir import file_lock, lock_kind

cache = sys.argv[2]
ds = TsFileIterableDataset(sys.argv[1], batch_size=1000, cache="disk", cache_dir=cache,
                           dtype="float64")
epochs = [np.concatenate([b.numpy() for b in ds]) for _ in range(2)]
np.save(os.path.join(sys.argv[3], "epochs.npy"), np.stack(epochs))
lock = os.path.join(cache, "probe.lock")
with file_lock(lock) as held, file_lock(lock, blocking=False) as second:
    both = [held, second]
with open(lock + ".held", "w") as fh:  # left by a process that died holding it
    fh.write("999999999")
with file_lock(lock, blocking=False) as taken:
    stale = taken
left = sorted(name for _, _, names in os.walk(cache) for name in names if name.endswith(".held"))
print(json.dumps({"kind": lock_kind(), "both": both, "stale_taken": stale, "left": left}))
"""


@pytest.mark.slow  # a child interpreter, two disk-cache epochs: about 4-9 s
def test_a_disk_cache_without_fcntl_locks_with_exclusive_files_and_reads_exactly(
    small_dir, small_expected, tmp_path, private_cache, run_python
):
    cache = tmp_path / "disk"
    env = {**os.environ, "XDG_CACHE_HOME": str(private_cache), "PYTHONPATH": str(REPO)}
    done = run_python(_DISK_EPOCHS, str(small_dir), str(cache), str(tmp_path), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"kind": "exclusive-file", "both": [True, False], "stale_taken": True, "left": []}
    epochs = np.load(tmp_path / "epochs.npy")
    for values in epochs:
        np.testing.assert_array_equal(values, small_expected)
    assert any(cache.rglob("*.tsc")), sorted(p.name for p in cache.rglob("*"))


def test_the_lock_kind_here_is_flock_on_posix():
    from tsfile_torch.sources.cachedir import lock_kind

    assert lock_kind() == ("msvcrt" if sys.platform == "win32" else "flock")
