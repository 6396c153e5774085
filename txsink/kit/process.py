"""Whether a process still runs: the one test behind every "is its owner gone?" of txsink
(a lease's holder, a fault plan's or a CDS build's leftovers), so they all agree."""

from __future__ import annotations

import os

__all__ = ["process_alive"]


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host. Signal 0 checks without sending; a
    process of another user answers ``PermissionError`` and counts as alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
