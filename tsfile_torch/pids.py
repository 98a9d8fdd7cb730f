"""Whether a process runs: the one liveness check (epoch claims, crash reports, downloads)."""

from __future__ import annotations

import os

__all__ = ["alive"]


def alive(pid: int) -> bool:
    """Return whether process ``pid`` runs now (0 and negative pids never do).

    Off POSIX, where ``os.kill(pid, 0)`` would end the process, every positive pid counts as
    alive.
    """
    if pid <= 0:
        return False
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
