"""Live metrics: the coordinator's hook, with no dependency (exporters in
:mod:`txsink.observe.prometheus` and :mod:`txsink.observe.otel`; docs/observability.md).

``Coordinator(..., metrics=...)`` takes one :class:`Metrics` or several. Every call is
made on the driver, from what the protocol knows anyway (the task acks carry rows and
bytes): nothing runs on the data path. A :class:`Metrics` that raises never fails an
epoch: the failure is logged once, at WARNING, and that exporter is left out afterwards.

A metrics object travels with the coordinator when Spark Connect pickles it: each
exporter pickles its configuration only and starts again in the receiving process.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "EPOCH_OUTCOMES",
    "GAUGES",
    "HANDLE_OUTCOMES",
    "Metrics",
    "RecordingMetrics",
]

#: Outcomes of an epoch (``committed`` counts epochs finished by recovery too; ``voided``
#: counts rounds made undecidable: a failed pre-commit's round, or one recovery voided).
EPOCH_OUTCOMES = ("committed", "skipped", "aborted", "voided")
#: Handle outcomes, in the vocabulary of Flink's committer metrics.
HANDLE_OUTCOMES = ("committed", "already_committed", "failed", "retried", "aborted")
#: The gauges, by name: what each one holds.
GAUGES: Mapping[str, str] = {
    "last_committed_epoch": "the last epoch this driver committed (or recovery finished)",
    "decided_uncommitted_epochs": "epochs decided whose commit is not finished",
    "lingering_prepared": "prepared transactions of a sink that recovery found",
    "oldest_prepared_timestamp": "Unix time at which the oldest prepared transaction of a "
    "sink still open was prepared (0: none)",
    "commit_timeout_ratio": "the last commit's duration as a share of the target's "
    "transaction timeout (reported by the connector)",
    "blocked_epochs": "decided epochs of a sink its target refuses until an operator acts "
    "(EpochBlockedError; txsink status shows the reason and fix)",
    "last_audited_epoch": "the newest epoch of a sink the continuous audit checked "
    "(Coordinator(audit_every=...); txsink.ops.audit)",
}


class Metrics:
    """Receives txsink's metrics on the driver. Every method is a no-op: override those
    you export. ``app_id`` labels every call; sinks are named by uid and connector."""

    def epoch(self, app_id: str, outcome: str) -> None:
        """An epoch ended with ``outcome`` (one of :data:`EPOCH_OUTCOMES`); called after
        the epoch's other metrics (an exporter may push here)."""

    def rows(self, app_id: str, sink_uid: str, connector: str, rows: int, nbytes: int) -> None:
        """A sink's share of an epoch became visible: ``rows`` rows, ``nbytes`` bytes (as
        its tasks counted them; 0 where a connector does not count bytes)."""

    def handles(self, app_id: str, sink_uid: str, connector: str, outcome: str, count: int) -> None:
        """``count`` handles of a sink ended with ``outcome`` (:data:`HANDLE_OUTCOMES`)."""

    def phase(self, app_id: str, phase: str, seconds: float) -> None:
        """A phase of an epoch took ``seconds`` (recover, precommit, decide, commit; the
        single pass reports its own phases)."""

    def audit(
        self, app_id: str, sink_uid: str, connector: str, epochs: int, mismatches: int
    ) -> None:
        """The continuous audit checked ``epochs`` epochs of a sink in its target, and
        ``mismatches`` of them did not match (or could not be audited), extras included."""

    def gauge(
        self, app_id: str, name: str, value: float, sink_uid: str = "", connector: str = ""
    ) -> None:
        """Gauge ``name`` (one of :data:`GAUGES`) is now ``value``; per sink where a sink
        is named, else per app."""


class RecordingMetrics(Metrics):
    """Keeps every value in memory: counters summed, gauges as last set, phases as lists.
    For tests, and a source for a Spark-side view. Keys are tuples of label values."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.epochs: dict[tuple[str, str], int] = {}
        self.rows_written: dict[tuple[str, str, str], int] = {}
        self.bytes_written: dict[tuple[str, str, str], int] = {}
        self.handle_counts: dict[tuple[str, str, str, str], int] = {}
        self.phases: dict[tuple[str, str], list[float]] = {}
        self.gauges: dict[tuple[str, str, str, str], float] = {}
        self.audited: dict[tuple[str, str, str], list[int]] = {}  # [epochs, mismatches]

    def epoch(self, app_id: str, outcome: str) -> None:
        with self._lock:
            self.epochs[(app_id, outcome)] = self.epochs.get((app_id, outcome), 0) + 1

    def rows(self, app_id: str, sink_uid: str, connector: str, rows: int, nbytes: int) -> None:
        key = (app_id, sink_uid, connector)
        with self._lock:
            self.rows_written[key] = self.rows_written.get(key, 0) + rows
            self.bytes_written[key] = self.bytes_written.get(key, 0) + nbytes

    def handles(self, app_id: str, sink_uid: str, connector: str, outcome: str, count: int) -> None:
        key = (app_id, sink_uid, connector, outcome)
        with self._lock:
            self.handle_counts[key] = self.handle_counts.get(key, 0) + count

    def phase(self, app_id: str, phase: str, seconds: float) -> None:
        with self._lock:
            self.phases.setdefault((app_id, phase), []).append(seconds)

    def gauge(
        self, app_id: str, name: str, value: float, sink_uid: str = "", connector: str = ""
    ) -> None:
        with self._lock:
            self.gauges[(app_id, name, sink_uid, connector)] = value

    def audit(
        self, app_id: str, sink_uid: str, connector: str, epochs: int, mismatches: int
    ) -> None:
        with self._lock:
            counts = self.audited.setdefault((app_id, sink_uid, connector), [0, 0])
            counts[0] += epochs
            counts[1] += mismatches

    def epoch_count(self, outcome: str) -> int:
        """Epochs with ``outcome``, over every app."""
        return sum(n for (_app, o), n in self.epochs.items() if o == outcome)

    def handle_count(self, outcome: str, sink_uid: str | None = None) -> int:
        """Handles with ``outcome`` (of one sink, or all)."""
        return sum(
            n
            for (_a, uid, _c, o), n in self.handle_counts.items()
            if o == outcome and sink_uid in (None, uid)
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
