"""Helpers shared by tests/test_process.py and the fresh interpreter it starts (not a test module).

Imports nothing of tsfile_torch at import time, so a fresh interpreter can record Python's
defaults before its first ``import tsfile_torch``.
"""

from __future__ import annotations

import faulthandler
import gc
import multiprocessing
import multiprocessing.forkserver
import signal


def process_state() -> dict:
    """What a library could leave behind in the user's process."""
    return {
        "sigchld": signal.getsignal(signal.SIGCHLD),
        "faulthandler": faulthandler.is_enabled(),
        "start_method": multiprocessing.get_start_method(allow_none=True),
        # no public getter: what multiprocessing.set_forkserver_preload last set
        "forkserver_preload": list(multiprocessing.forkserver._forkserver._preload_modules),
    }


def break_off(ds) -> None:
    """Break out of a 2-worker loader of ``ds`` after three batches, drop it and collect."""
    from tsfile_torch import make_loader

    broken = make_loader(ds, num_workers=2)
    for i, _ in enumerate(broken):
        if i == 2:
            break
    del broken, _
    gc.collect()
