"""Follow a txsink log from another process: the epoch lines where the coordinator is not.

Under Spark Connect the coordinator runs in a Python process of the Spark server, so
txsink's one line per epoch goes to the server's log and the client prints nothing while
the query runs. The log holds what that line says (each epoch's decision, with its rows per
sink and its pre-commit time, then its committed mark), so a client that can read the log
(a shared path, ``s3://``) prints the same lines itself::

    query = stream.writeStream.foreachBatch(coordinator)...start()
    with coordinator.follow(query):        # or txsink.follow(log, query)
        query.awaitTermination()

Contract:

* **Read-only, and never in the query's way.** The follower only lists and reads the log,
  in a daemon thread of the client; any failure of its own (the log unreachable, a record
  it cannot parse) is reported once as a WARNING line and retried, never raised. Leaving
  the ``with`` block (the query ended, or raised) stops it; nothing it does can delay or
  fail the query.
* **Stops with the query**: when the ``with`` block is left, or when the query is no longer
  active; a last look at the log first, so the last epoch's line is not lost. A log that
  was never there (a path only the server sees looks like an empty folder here) is told by
  a WARNING once the query ended, if it wrote rows.
* **Cheap**: one listing of the log's ``epochs/`` per poll (as long as the log keeps
  epochs: ``retain_epochs``, 100 by default), polls every 0.5 s after something new and
  backing off to every 5 s while nothing moves; an epoch's records are read when its
  committed mark (or a blocked record) appears, a finished epoch never again.
* **Lines, not history**: epochs already committed when it starts are not printed
  (``txsink status`` lists them); it prints each later epoch's ``committed:`` line (the
  server's line, with the commit phase measured from the log's timestamps) and a WARNING
  for a blocked epoch.
* **Only where the lines are missing**: with a classic query (its ``foreachBatch`` runs in
  this process, whose console shows the lines already) it does nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from txsink.observe.logs import committed_text, get_logger, install_console, one_line
from txsink.protocol.log import TxLog, open_log
from txsink.store import LogStore

__all__ = ["LogFollower", "follow"]

_EPOCHS = "epochs/"
#: Poll interval after something new appeared, and the most it backs off to.
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.5, 5.0


@contextlib.contextmanager
def follow(
    log: str | os.PathLike[str] | LogStore | TxLog,
    query: Any = None,
    *,
    label: str | None = None,
) -> Iterator[LogFollower | None]:
    """Print the epoch lines of the txsink log at ``log`` while the ``with`` block runs
    (module doc). ``query``: the streaming query writing it; the follower stops when it is
    no longer active, and a classic query (not Spark Connect) needs no follower (``None``
    is yielded). ``label``: the name in the lines' brackets (default: the sink uids of
    each epoch's decision, joined with ``+`` as a coordinator names itself)."""
    if query is not None and not type(query).__module__.startswith("pyspark.sql.connect."):
        yield None
        return
    install_console()
    follower = LogFollower(open_log(log), query, label=label)
    follower.start()
    try:
        yield follower
    except BaseException:
        follower.stop()
        raise
    follower.stop()
    follower.tell_if_unseen()


class LogFollower:
    """The thread behind :func:`follow`; :meth:`poll` is one look at the log (what the
    thread runs, and what a test can call directly)."""

    def __init__(self, log: TxLog, query: Any = None, *, label: str | None = None) -> None:
        self.log = log
        self._query = query
        self._label = label
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txsink-follow", daemon=True)
        self._seen: set[str] = set()  # keys listed before
        self._done: set[int] = set()  # epochs printed, or committed before the start
        self._failed: str | None = None  # the last failure reported (once per kind)
        #: The lines printed, as (epoch, status): for callers and tests.
        self.printed: list[tuple[int, str]] = []

    def start(self) -> None:
        """Take the log as it is now as history, then follow it in a daemon thread."""
        self._guarded(lambda: self.poll(history=True))
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after a last look at the log; returns within ``timeout_s`` whatever the
        store does (a hung read stays in the daemon thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def tell_if_unseen(self) -> None:
        """After a query that wrote rows: a WARNING if the log was never there to be seen
        (a path only the Spark server sees lists as an empty folder here, not as an error)."""
        if self._seen or self._query is None:
            return
        try:
            wrote = any(p.numInputRows > 0 for p in self._query.recentProgress)
            missing = self.log.store.read("meta.json") is None
        except Exception:  # the server or the store is gone: nothing sure to say
            return
        if wrote and missing:
            get_logger(__name__).warning(
                "the query wrote rows, but the txsink log at %s was never found from this "
                "process, so no epoch line was printed: is it a path only the Spark server "
                "sees? Put the log on storage both can read (a shared mount, an object store)",
                self.log.location,
            )

    def _run(self) -> None:
        interval = MIN_INTERVAL_S
        while not self._stop.wait(interval):
            moved = self._guarded(self.poll)
            if moved:
                interval = MIN_INTERVAL_S
                continue
            interval = min(interval * 2, MAX_INTERVAL_S)
            if self._query is not None and not self._active():
                break
        self._guarded(self.poll)  # the last epoch's mark may have come since the last look

    def _active(self) -> bool:
        try:
            return bool(self._query.isActive)
        except Exception:  # the server is gone: the with block ends us when the query raises
            return True

    def _guarded(self, poll: Any) -> bool:
        """Run ``poll``; a failure is a WARNING line (once while it repeats), never raised."""
        try:
            moved = bool(poll())
        except Exception as err:
            text = one_line(f"{type(err).__name__}: {err}")
            if text != self._failed:
                get_logger(__name__).warning(
                    "cannot follow the txsink log at %s (%s); still trying: the query is not "
                    "affected",
                    self.log.location,
                    text,
                )
            self._failed = text
            return False
        self._failed = None
        return moved

    def poll(self, *, history: bool = False) -> bool:
        """One look at the log: print what is new (``history``: print nothing, take every
        committed epoch as done). Whether any record appeared since the last look."""
        keys = self.log.store.list(_EPOCHS)
        new = {k for k in keys if k not in self._seen}
        by_epoch: dict[int, list[str]] = {}
        for key in keys:
            parts = key.split("/")
            if len(parts) == 3 and parts[1].isdigit():
                by_epoch.setdefault(int(parts[1]), []).append(parts[2])
        for epoch, names in sorted(by_epoch.items()):
            if epoch in self._done:
                continue
            if "committed.json" in names:
                if not history:
                    self._committed(epoch)
                self._done.add(epoch)
            elif not history and any(
                n.startswith("blocked-") and f"{_EPOCHS}{epoch:020d}/{n}" in new for n in names
            ):
                self._blocked(epoch)
        self._seen = set(keys)
        self._done &= set(by_epoch)  # pruned epochs: forget them
        return bool(new)

    def _committed(self, epoch: int) -> None:
        decision, mark = self.log.decision(epoch), self.log.committed(epoch)
        if decision is None or mark is None:  # pruned between the listing and the reads
            return
        rows = {str(uid): int(n) for uid, n in dict(decision.stats.get("rows", {})).items()}
        seconds = {str(k): float(v) for k, v in dict(decision.stats.get("seconds", {})).items()}
        if decision.decided_at and mark.committed_at >= decision.decided_at:
            seconds["commit"] = mark.committed_at - decision.decided_at
        label = self._label or "+".join(rows or decision.handles)
        get_logger(__name__, uid=label, epoch=epoch).info(
            "committed: %s", committed_text(rows, seconds)
        )
        self.printed.append((epoch, "committed"))

    def _blocked(self, epoch: int) -> None:
        block = self.log.block(epoch)
        if block is None:
            return
        fix = f". Fix: {block.fix}" if block.fix and block.fix not in block.reason else ""
        get_logger(__name__, uid=self._label or block.sink_uid, epoch=epoch).warning(
            "BLOCKED (refused attempt %d): %s%s. Once fixed, run `txsink recover` or restart "
            "the query: it commits the epoch",
            block.attempts,
            block.reason.rstrip("."),
            fix,
        )
        self.printed.append((epoch, "blocked"))
