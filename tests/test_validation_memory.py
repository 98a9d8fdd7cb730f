"""A validation child short of memory is a ResourceError, never a damage verdict (issue #42
item 5; Note: a validation child short of memory in tsfile_torch.integrity.validate).

The limit is real: a child interpreter builds a dataset whose validation child (a fork) sets its
own address-space limit (``RLIMIT_AS``) a little above what it holds before it checks the files
(a limit on the whole tree would fail the builder's own allocations first, by chance). tsfile's
reader then aborts (``std::bad_alloc``), crashes (SIGSEGV) or raises, by where the allocation
fails.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from tsfile_torch import TsFileIterableDataset
from tsfile_torch.sources.content import recall

_BUILD_UNDER_A_LIMIT = r"""
import json, os, resource, sys
from tsfile_torch import ResourceError, TsFileFormatError, TsFileIterableDataset
from tsfile_torch.integrity import validate

check = validate._child

def short_of_memory(*args):  # the forked validation child: what it holds and a little more
    vm = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = vm + (int(sys.argv[2]) << 10)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    check(*args)

validate._child = short_of_memory
for headroom_kib in sys.argv[2].split(","):
    sys.argv[2] = headroom_kib
    try:
        TsFileIterableDataset(sys.argv[1], batch_size=1000, on_damaged="skip")
        out = {"result": "built"}
    except (ResourceError, TsFileFormatError) as err:
        out = {"result": type(err).__name__, "message": str(err)}
    print(json.dumps(out))
"""

#: KiB of address space above what the building process holds
HEADROOMS_KIB = (0, 256)


@pytest.mark.slow  # a child interpreter building twice: about 3 s
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and RLIMIT_AS")
def test_a_validation_child_out_of_memory_is_a_resource_error_and_no_verdict(
    small_dir, private_cache, run_python
):
    env = {**os.environ, "XDG_CACHE_HOME": str(private_cache)}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(__file__)), env.get("PYTHONPATH", "")]
    )
    headrooms = ",".join(map(str, HEADROOMS_KIB))
    done = run_python(_BUILD_UNDER_A_LIMIT, str(small_dir), headrooms, env=env)
    assert done.returncode == 0, done.stderr[-3000:]  # an error, not a signal
    outcomes = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(outcomes) == len(HEADROOMS_KIB), done.stderr[-3000:]
    for got in outcomes:
        assert got["result"] == "ResourceError", got  # not "damaged", nothing skipped
        message = got["message"]
        for said in ("part000.tsfile: validating it", "ran out of memory", "RLIMIT_AS", " MiB"):
            assert said in message, message
        assert "the file is damaged" not in message, message
    ds = TsFileIterableDataset(small_dir, batch_size=1000, on_damaged="skip")  # no verdict
    assert ds.skipped == [] and len(ds.core.catalog.files) == 3
    info = ds.core.catalog.files[0]
    assert "damaged" not in recall(info.index_key)
