"""A remote cache_dir that exists but cannot be written is a RemoteError naming it."""

from __future__ import annotations

import ctypes
import json
import os

import pytest

pytest.importorskip("fsspec")


# Builds datasets over memory:// objects with a read-only cache_dir: made read-only before the
# build, and after a build (then the first read writes). Prints the error of each.
PROBE = r"""
import json, os, sys
import fsspec
from tsfile_torch import TsFileDataset, synthetic
work = sys.argv[1]
paths = synthetic.write_table_files(work + "/data", synthetic.DatasetSpec(2, 1, 2, 1000))
fs = fsspec.filesystem("memory")
for p in paths:
    fs.pipe("/ro-cache-test/" + os.path.basename(p), open(p, "rb").read())
cache = work + "/cache"
os.makedirs(cache)
out = {}

def attempt(what, fn):
    try:
        fn()
        out[what] = None
    except Exception as err:
        out[what] = [type(err).__name__, str(err)]

os.chmod(cache, 0o555)
attempt("build", lambda: TsFileDataset("memory://ro-cache-test/", batch_size=500, cache_dir=cache))
os.chmod(cache, 0o755)
ds = TsFileDataset("memory://ro-cache-test/", batch_size=500, cache_dir=cache, validate=False)
os.chmod(cache, 0o555)
attempt("read", lambda: ds[0])
print(json.dumps(out))
"""


def _without_root_override() -> None:
    """In the child: drop the capabilities that let root write into any directory."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, from the bounding set
            if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_cache_dir_is_a_remote_error_at_build_and_at_first_read(tmp_path, run_python):
    proc = run_python(PROBE, str(tmp_path), preexec_fn=_without_root_override)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    cache = str(tmp_path / "cache")
    for what in ("build", "read"):
        kind, message = out[what]
        assert kind == "RemoteError", out
        assert f"cannot write into cache_dir={cache!r}" in message, out
        assert message.startswith("memory://") and "ro-cache-test/" in message, out
        assert "PermissionError" in message, out
