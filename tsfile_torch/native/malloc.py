"""Note: malloc tuning. Keep glibc from returning tsfile's decode buffers to the OS.

tsfile decodes into freshly allocated native buffers; with glibc's defaults, buffers over the
dynamic mmap threshold are unmapped on free and page-faulted in again on the next query.
``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` and ``mallopt(M_TRIM_THRESHOLD, 1 GiB)`` (what the
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` environment variables do) keep them
mapped (benchmarks/RESULTS.md, "What each mechanism pays": "malloc"). The cost: up to 1 GiB of
freed heap may stay in the process instead of going back to the OS, and glibc's dynamic mmap
threshold stays off for the life of the process (mallopt cannot be undone exactly). Applied by
the reader of a process that reads (``malloc_tuning=True``, the default), once per process;
switched off for every dataset with :func:`tsfile_torch.process.disable` ("malloc").
"""

from __future__ import annotations

import logging
import os

from tsfile_torch import mechanisms

__all__ = ["TESTED_ON", "tune_malloc"]

logger = logging.getLogger(__name__)

#: glibc is the only allocator whose parameters this sets; measured with glibc 2.36.
TESTED_ON = "glibc"

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
_TUNED_PID: int | None = None


#: False: never tune (tsfile_torch.process.disable("malloc")).
enabled = mechanisms.on("malloc")


def tune_malloc() -> bool:
    """Keep glibc from returning decode buffers to the OS (once per process; Note: malloc tuning).

    Returns:
        True if applied (glibc), False where mallopt is unavailable.
    """
    global _TUNED_PID
    if not enabled:
        return False
    if _TUNED_PID == os.getpid():
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1 and ok
    except (OSError, AttributeError):
        return False
    if ok:
        _TUNED_PID = os.getpid()
        logger.debug("glibc malloc tuned for tsfile decoding (pid %d)", _TUNED_PID)
    return ok
