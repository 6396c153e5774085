"""What a coordinator carries to another Python process: its configuration, its log as a
location, and none of what the process it came from learnt.

Spark Connect runs ``foreachBatch`` in a Python process of its server, which unpickles the
coordinator the client pickled (once per query run). There the log is opened again from
its location, on the server's filesystem or network (a path means a path on the Spark
server), and the first batch binds the app and recovers, as a new driver does.
"""

from __future__ import annotations

import os
from typing import Any

from txsink.observe.logs import install_console
from txsink.protocol.log import open_log

__all__ = ["arrived_state", "location_of", "portable_state"]


def location_of(log: object) -> str | os.PathLike[str] | None:
    """The location to reopen a log from in another process (``None``: a store or an open
    log was given, which travels as it is, if it pickles at all)."""
    return log if isinstance(log, (str, os.PathLike)) else None


def portable_state(state: dict[str, Any]) -> dict[str, Any]:
    """A coordinator's ``__dict__`` as it travels: the open log left behind when it has a
    location, recovery rebuilt on arrival, and the run's knowledge reset (the bound app,
    the last committed epoch; the Spark side resets its checked queries and schema itself:
    :meth:`txsink.spark.epoch.SparkEpochs.__getstate__`): the receiving process checks and
    recovers before its first epoch."""
    out = dict(state)
    if out.get("_log_location") is not None:
        out["log"] = None
    out.update(
        _recovery=None,
        _bound_app=None,
        _needs_recovery=True,
        _last_committed=None,
        _lease=None,  # the receiving process is another driver process: its own lease
    )
    return out


def arrived_state(state: dict[str, Any]) -> dict[str, Any]:
    """:func:`portable_state` on arrival: the log opened again from its location, and
    txsink's console line installed in this process too (one line per epoch)."""
    out = dict(state)
    if out.get("log") is None:
        out["log"] = open_log(out["_log_location"])
    install_console()
    return out
