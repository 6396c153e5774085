"""OpenTelemetry exporter of txsink's metrics (``pip install 'txsink[otel]'``).

:class:`OTelMetrics` records through ``opentelemetry-api``: a no-op until the application
configures an SDK ``MeterProvider`` (with the exporter of its choice: OTLP, Prometheus,
console). Names follow OpenTelemetry's semantic conventions: dotted, with UCUM units, and
attributes ``txsink.app_id``, ``txsink.sink.uid``, ``txsink.connector``, ``txsink.outcome``,
``txsink.phase`` (docs/observability.md has the table).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from txsink._version import __version__
from txsink.errors import ConfigurationError
from txsink.metrics import Metrics

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

__all__ = ["GAUGE_NAMES", "OTelMetrics"]

#: txsink's gauge name -> (OpenTelemetry name, unit, description)
GAUGE_NAMES: dict[str, tuple[str, str, str]] = {
    "last_committed_epoch": ("txsink.epoch.last_committed", "{epoch}", "Last committed epoch."),
    "decided_uncommitted_epochs": (
        "txsink.epoch.decided_uncommitted", "{epoch}", "Epochs decided, commit unfinished.",
    ),
    "lingering_prepared": (
        "txsink.transaction.lingering", "{transaction}",
        "Prepared transactions found by the last recovery.",
    ),
    "oldest_prepared_timestamp": (
        "txsink.transaction.oldest_prepared.age", "s",
        "Age of the oldest still-prepared transaction (0: none).",
    ),
    "commit_timeout_ratio": (
        "txsink.commit.timeout_ratio", "1",
        "Last commit's duration over the target's transaction timeout.",
    ),
    "blocked_epochs": (
        "txsink.epoch.blocked", "{epoch}",
        "Decided epochs the target refuses until an operator acts.",
    ),
    "last_audited_epoch": (
        "txsink.audit.last_epoch", "{epoch}",
        "Newest epoch of the sink the continuous audit checked in its target.",
    ),
}  # fmt: skip


def _attrs(app_id: str, sink_uid: str = "", connector: str = "", **more: str) -> dict[str, str]:
    out = {"txsink.app_id": app_id}
    if sink_uid:
        out.update({"txsink.sink.uid": sink_uid, "txsink.connector": connector})
    out.update({f"txsink.{k}": v for k, v in more.items()})
    return out


class OTelMetrics(Metrics):
    """txsink's metrics through the OpenTelemetry API.

    ``meter_provider``: the provider to use (default: the global one, which is a no-op
    until the application sets one). Pickling carries nothing of it: the receiving
    process uses its own global provider.
    """

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        self._provider = meter_provider
        self._setup()

    def _setup(self) -> None:
        try:
            from opentelemetry import metrics
        except ImportError as err:
            raise ConfigurationError(
                "OTelMetrics needs the opentelemetry-api package: pip install 'txsink[otel]'"
            ) from err

        m = metrics.get_meter("txsink", __version__, meter_provider=self._provider)
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
        self._epochs = m.create_counter("txsink.epochs", "{epoch}", "Epochs by outcome.")
        self._rows = m.create_counter("txsink.rows.written", "{row}", "Rows committed.")
        self._bytes = m.create_counter("txsink.bytes.written", "By", "Bytes committed.")
        self._handles = m.create_counter("txsink.handles", "{handle}", "Handles by outcome.")
        self._audit_epochs = m.create_counter(
            "txsink.audit.epochs", "{epoch}", "Epochs the continuous audit checked."
        )
        self._audit_mismatches = m.create_counter(
            "txsink.audit.mismatches", "{epoch}", "Audited epochs that did not match."
        )
        self._phases = m.create_histogram(
            "txsink.phase.duration", "s", "Duration of an epoch's phases."
        )
        for key, (name, unit, text) in GAUGE_NAMES.items():
            m.create_observable_gauge(name, [self._observer(key)], unit, text)

    def _observer(self, key: str) -> Any:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            import time

            from opentelemetry.metrics import Observation

            with self._lock:
                values = dict(self._values.get(key, {}))
            now = time.time()
            for attrs, value in values.items():
                age = key == "oldest_prepared_timestamp"
                yield Observation((now - value if value else 0.0) if age else value, dict(attrs))

        return observe

    def epoch(self, app_id: str, outcome: str) -> None:
        self._epochs.add(1, _attrs(app_id, outcome=outcome))

    def rows(self, app_id: str, sink_uid: str, connector: str, rows: int, nbytes: int) -> None:
        self._rows.add(rows, _attrs(app_id, sink_uid, connector))
        self._bytes.add(nbytes, _attrs(app_id, sink_uid, connector))

    def handles(self, app_id: str, sink_uid: str, connector: str, outcome: str, count: int) -> None:
        self._handles.add(count, _attrs(app_id, sink_uid, connector, outcome=outcome))

    def phase(self, app_id: str, phase: str, seconds: float) -> None:
        self._phases.record(seconds, _attrs(app_id, phase=phase))

    def audit(
        self, app_id: str, sink_uid: str, connector: str, epochs: int, mismatches: int
    ) -> None:
        self._audit_epochs.add(epochs, _attrs(app_id, sink_uid, connector))
        self._audit_mismatches.add(mismatches, _attrs(app_id, sink_uid, connector))

    def gauge(
        self, app_id: str, name: str, value: float, sink_uid: str = "", connector: str = ""
    ) -> None:
        key = tuple(sorted(_attrs(app_id, sink_uid, connector).items()))
        with self._lock:
            self._values.setdefault(name, {})[key] = value

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._provider = None
        self._setup()

    def __repr__(self) -> str:
        return "OTelMetrics()"
