"""The driver's side of the metrics hook: what the coordinator and recovery call.

:class:`Meter` turns protocol events (an epoch committed, a share committed, a round
voided, a recovery plan) into calls on the user's :class:`~txsink.metrics.Metrics`, under
the bound app id. A failing exporter is logged once and left out: metrics never fail an
epoch. Handle outcomes: ``committed`` when a sink reported a handle visible that was
prepared (every handle of a live epoch; at recovery, those the sink still listed as
prepared); ``already_committed`` when recovery's sink confirmed a handle no longer
prepared; ``retried`` for each handle recovery commits again; ``failed`` for the handles
of a share whose commit raised before reporting them; ``aborted`` per abort.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from txsink.contract import SinkContract
from txsink.handles import Handle
from txsink.metrics import Metrics
from txsink.observe.logs import get_logger

__all__ = ["Meter"]

_log = get_logger(__name__)


class Meter:
    """The metrics of one coordinator (``metrics``: the user's exporters)."""

    def __init__(self, metrics: Metrics | Sequence[Metrics] | None) -> None:
        if metrics is None:
            metrics = ()
        self.metrics: tuple[Metrics, ...] = (
            (metrics,) if isinstance(metrics, Metrics) else tuple(metrics)
        )
        for m in self.metrics:
            if not isinstance(m, Metrics):
                raise TypeError(f"metrics= takes txsink.metrics.Metrics objects, got {m!r}")
        self.app = ""
        #: Transaction names the sinks listed as prepared at the last recovery.
        self.prepared: set[str] = set()
        self._pending: set[int] = set()
        self._oldest: dict[str, float] = {}  # sink uid -> prepared since (Unix time)
        self._blocked: dict[str, set[int]] = {}  # sink uid -> its blocked epochs
        #: Called with each committed epoch after its metrics (the continuous audit's
        #: turn); a listener that raises is logged and never fails the epoch.
        self.after_commit: list[Callable[[int], None]] = []

    def __getstate__(self) -> dict[str, Any]:
        """Travels as its exporters alone (Spark Connect): what this run learnt stays."""
        return {"metrics": self.metrics}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["metrics"])  # type: ignore[misc]

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def _each(self, call: Callable[[Metrics], None]) -> None:
        for m in self.metrics:
            try:
                call(m)
            except Exception as err:  # an exporter's failure never fails an epoch
                _log.warning("metrics: %r failed (%r); it is left out from now on", m, err)
                self.metrics = tuple(x for x in self.metrics if x is not m)

    # -- events ------------------------------------------------------------------------

    def epoch(self, outcome: str) -> None:
        self._each(lambda m: m.epoch(self.app, outcome))

    def skipped(self, seconds: Mapping[str, float]) -> None:
        """An epoch was skipped (Spark's replay); ``seconds``: the recovery before it."""
        self.phases(seconds)
        self.epoch("skipped")

    def phases(self, seconds: Mapping[str, float]) -> None:
        for phase, s in seconds.items():
            self._each(functools.partial(_phase, app=self.app, phase=phase, seconds=s))

    def handles(self, sink: SinkContract[Any, Any], outcome: str, count: int) -> None:
        if count:
            self._each(lambda m: m.handles(self.app, sink.uid, sink.connector, outcome, count))

    def gauge(self, name: str, value: float, sink: SinkContract[Any, Any] | None = None) -> None:
        uid, connector = (sink.uid, sink.connector) if sink is not None else ("", "")
        self._each(lambda m: m.gauge(self.app, name, value, uid, connector))

    def audited(self, sink: SinkContract[Any, Any], epochs: int, mismatches: int) -> None:
        """The continuous audit checked ``epochs`` epochs of ``sink``; ``mismatches`` failed."""
        self._each(lambda m: m.audit(self.app, sink.uid, sink.connector, epochs, mismatches))

    def preparing(self, sinks: Iterable[SinkContract[Any, Any]]) -> None:
        """An epoch's pre-commit starts: its transactions are prepared from now on."""
        now = time.time()
        for sink in sinks:
            if sink.uid not in self._oldest:
                self._oldest[sink.uid] = now
                self.gauge("oldest_prepared_timestamp", now, sink)

    def decided(self, epoch: int) -> None:
        self._pending.add(epoch)
        self.gauge("decided_uncommitted_epochs", len(self._pending))

    def finished(
        self,
        epoch: int,
        sinks: Iterable[SinkContract[Any, Any]],
        handles: Mapping[str, Sequence[Handle]],
        rows: Mapping[str, int] | None = None,
        seconds: Mapping[str, float] | None = None,
    ) -> None:
        """Epoch ``epoch`` is committed (its mark written): one committed epoch, its rows
        and bytes per sink, its phases' durations, and the gauges it moves."""
        self.phases(seconds or {})
        for sink in sinks:
            mine = handles.get(sink.uid, ())
            n = (
                rows[sink.uid]
                if rows is not None and sink.uid in rows
                else sum(h.rows for h in mine)
            )
            nbytes = sum(h.nbytes for h in mine)
            self._each(functools.partial(_rows, app=self.app, sink=sink, rows=n, nbytes=nbytes))
        self._pending.discard(epoch)
        for sink in sinks:
            if epoch in self._blocked.get(sink.uid, ()):
                self.blocked(sink, epoch, False)
        self.gauge("decided_uncommitted_epochs", len(self._pending))
        self.gauge("last_committed_epoch", epoch)
        self.settled(sinks)
        self.epoch("committed")  # last: an exporter may push on it
        for listener in self.after_commit:
            try:
                listener(epoch)
            except Exception as err:
                _log.warning("after epoch %d: %r failed (%r)", epoch, listener, err)

    def blocked(self, sink: SinkContract[Any, Any], epoch: int, blocked: bool) -> None:
        """Decided ``epoch`` of ``sink`` is refused for good by its target (``blocked``),
        or was committed after all: gauge ``blocked_epochs`` counts the sink's."""
        mine = self._blocked.setdefault(sink.uid, set())
        (mine.add if blocked else mine.discard)(epoch)
        self.gauge("blocked_epochs", len(mine), sink)

    def voided(self, sinks: Iterable[SinkContract[Any, Any]]) -> None:
        """A round was voided and what it prepared aborted."""
        self.epoch("voided")
        self.settled(sinks)

    def settled(self, sinks: Iterable[SinkContract[Any, Any]]) -> None:
        """Nothing of these sinks is left prepared (committed or aborted)."""
        for sink in sinks:
            if self._oldest.pop(sink.uid, None) is not None:
                self.gauge("oldest_prepared_timestamp", 0, sink)

    def recovery_found(
        self,
        pending: Sequence[int],
        prepared: Mapping[SinkContract[Any, Any], Sequence[Handle]],
        since: Mapping[str, float],
    ) -> None:
        """What a recovery plan found: the decided-but-uncommitted epochs, each
        sink's prepared handles, and when the oldest of each was prepared (Unix time:
        its round's decision, else the time it was found)."""
        self._pending = set(pending)
        self.gauge("decided_uncommitted_epochs", len(self._pending))
        self.prepared = {str(h.txn) for hs in prepared.values() for h in hs}
        for sink, hs in prepared.items():
            self.gauge("lingering_prepared", len(hs), sink)
            if hs:
                self._oldest[sink.uid] = since.get(sink.uid, time.time())
                self.gauge("oldest_prepared_timestamp", self._oldest[sink.uid], sink)

    def commit_watch(
        self, sink: SinkContract[Any, Any], *, recovering: bool
    ) -> tuple[Callable[[Sequence[Handle]], None], Callable[[float], None], Callable[[int], None]]:
        """Callbacks for one share's commit: on each report of visible handles, on the
        connector's timeout ratio, and on a failure (``count`` handles decided)."""
        seen: list[int] = [0]

        def reported(hs: Sequence[Handle]) -> None:
            seen[0] += len(hs)
            if not recovering:
                self.handles(sink, "committed", len(hs))
                return
            fresh = sum(1 for h in hs if str(h.txn) in self.prepared)
            self.handles(sink, "committed", fresh)
            self.handles(sink, "already_committed", len(hs) - fresh)

        def ratio(share: float) -> None:
            self.gauge("commit_timeout_ratio", share, sink)

        def failed(count: int) -> None:
            self.handles(sink, "failed", max(count - seen[0], 0))

        return reported, ratio, failed


def _phase(m: Metrics, *, app: str, phase: str, seconds: float) -> None:
    m.phase(app, phase, seconds)


def _rows(m: Metrics, *, app: str, sink: SinkContract[Any, Any], rows: int, nbytes: int) -> None:
    m.rows(app, sink.uid, sink.connector, rows, nbytes)
