"""Prometheus exporter of txsink's metrics (``pip install 'txsink[prometheus]'``).

:class:`PrometheusMetrics` keeps the metrics in a registry of its own and serves it over
HTTP on the driver (``port``), or pushes it to a Pushgateway after each epoch
(``push_gateway``, for ``availableNow`` and one-shot jobs), or both. Names and labels
follow Prometheus' conventions (docs/observability.md has the table).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigurationError
from txsink.metrics import Metrics
from txsink.observe.logs import get_logger

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["GAUGE_NAMES", "PrometheusMetrics"]

_APP, _SINK = ("app_id",), ("app_id", "sink_uid", "connector")
#: txsink's gauge name -> (Prometheus name, labels, help)
GAUGE_NAMES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "last_committed_epoch": (
        "txsink_last_committed_epoch", _APP, "Last epoch committed (by an epoch or recovery).",
    ),
    "decided_uncommitted_epochs": (
        "txsink_decided_uncommitted_epochs", _APP,
        "Epochs decided whose commit is not finished.",
    ),
    "lingering_prepared": (
        "txsink_lingering_prepared_transactions", _SINK,
        "Prepared transactions of the sink found by the last recovery.",
    ),
    "oldest_prepared_timestamp": (
        "txsink_oldest_prepared_timestamp_seconds", _SINK,
        "Unix time the oldest still-prepared transaction of the sink was prepared (0: none).",
    ),
    "commit_timeout_ratio": (
        "txsink_commit_timeout_ratio", _SINK,
        "Last commit's duration over the target's transaction timeout (connector-reported).",
    ),
    "blocked_epochs": (
        "txsink_blocked_epochs", _SINK,
        "Decided epochs of the sink its target refuses until an operator acts (blocked).",
    ),
    "last_audited_epoch": (
        "txsink_last_audited_epoch", _SINK,
        "Newest epoch of the sink the continuous audit checked in its target.",
    ),
}  # fmt: skip
#: Phase-duration buckets, seconds: small epochs to slow commits.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class PrometheusMetrics(Metrics):
    """txsink's metrics for Prometheus.

    Args:
        port: serve ``/metrics`` over HTTP on the driver at this port (0: any free port,
            see :attr:`port`); ``None``: no endpoint.
        addr: the address the endpoint listens on (``127.0.0.1``: this host only).
        push_gateway: a Pushgateway URL: the registry is pushed (``PUT``, the group
            replaced) after every epoch, under ``job`` and ``grouping_key``.
        job: the Pushgateway job label.
        grouping_key: further Pushgateway grouping labels.

    Pickling (Spark Connect) carries this configuration only: the receiving process
    starts its own endpoint and counts from zero, as a restarted driver does.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        addr: str = "127.0.0.1",
        push_gateway: str | None = None,
        job: str = "txsink",
        grouping_key: dict[str, str] | None = None,
    ) -> None:
        if port is None and push_gateway is None:
            raise ConfigurationError(
                "PrometheusMetrics needs port= (an HTTP endpoint on the driver) or "
                "push_gateway= (a Pushgateway URL), or both"
            )
        self._config: dict[str, Any] = {
            "port": port,
            "addr": addr,
            "push_gateway": push_gateway,
            "job": job,
            "grouping_key": dict(grouping_key or {}),
        }
        self._setup()

    def _setup(self) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ImportError as err:
            raise ConfigurationError(
                "PrometheusMetrics needs the prometheus-client package: pip install "
                "'txsink[prometheus]'"
            ) from err

        self.registry: CollectorRegistry = CollectorRegistry()
        r = self.registry
        self._lock = threading.Lock()
        self._server: Any = None
        self._epochs = Counter(
            "txsink_epochs", "Epochs by outcome.", ["app_id", "outcome"], registry=r
        )
        self._rows = Counter("txsink_written_rows", "Rows committed.", _SINK, registry=r)
        self._bytes = Counter("txsink_written_bytes", "Bytes committed.", _SINK, registry=r)
        self._handles = Counter(
            "txsink_handles", "Handles by outcome.", [*_SINK, "outcome"], registry=r
        )
        self._audit_epochs = Counter(
            "txsink_audit_epochs", "Epochs the continuous audit checked.", _SINK, registry=r
        )
        self._audit_mismatches = Counter(
            "txsink_audit_mismatches",
            "Audited epochs that did not match their decision (or could not be audited).",
            _SINK,
            registry=r,
        )
        self._phases = Histogram(
            "txsink_phase_duration_seconds",
            "Duration of an epoch's phases.",
            ["app_id", "phase"],
            buckets=BUCKETS,
            registry=r,
        )
        self._gauges = {
            key: Gauge(name, help_, labels, registry=r)
            for key, (name, labels, help_) in GAUGE_NAMES.items()
        }
        port = self._config["port"]
        if port is not None:
            from prometheus_client import start_http_server

            addr = str(self._config["addr"])
            try:
                self._server, _thread = start_http_server(int(port), addr=addr, registry=r)
            except OSError as err:
                raise ConfigurationError(
                    f"PrometheusMetrics cannot serve on {addr}:{port} ({err.strerror or err}): "
                    "choose a free port (port=0 picks one: see .port), or stop what holds it"
                ) from err

    @property
    def port(self) -> int | None:
        """The port the endpoint listens on (``None`` without one)."""
        return int(self._server.server_port) if self._server is not None else None

    # -- Metrics -----------------------------------------------------------------------

    def epoch(self, app_id: str, outcome: str) -> None:
        self._epochs.labels(app_id, outcome).inc()
        if self._config["push_gateway"] is not None and outcome != "voided":
            self.push()

    def rows(self, app_id: str, sink_uid: str, connector: str, rows: int, nbytes: int) -> None:
        self._rows.labels(app_id, sink_uid, connector).inc(rows)
        self._bytes.labels(app_id, sink_uid, connector).inc(nbytes)

    def handles(self, app_id: str, sink_uid: str, connector: str, outcome: str, count: int) -> None:
        self._handles.labels(app_id, sink_uid, connector, outcome).inc(count)

    def phase(self, app_id: str, phase: str, seconds: float) -> None:
        self._phases.labels(app_id, phase).observe(seconds)

    def audit(
        self, app_id: str, sink_uid: str, connector: str, epochs: int, mismatches: int
    ) -> None:
        self._audit_epochs.labels(app_id, sink_uid, connector).inc(epochs)
        self._audit_mismatches.labels(app_id, sink_uid, connector).inc(mismatches)

    def gauge(
        self, app_id: str, name: str, value: float, sink_uid: str = "", connector: str = ""
    ) -> None:
        gauge = self._gauges[name]
        labels = (app_id,) if len(GAUGE_NAMES[name][1]) == 1 else (app_id, sink_uid, connector)
        gauge.labels(*labels).set(value)

    # -- push and close ----------------------------------------------------------------

    def push(self) -> None:
        """Push the registry to the Pushgateway now (``PUT``: this job's group replaced).
        Called after each epoch; call it once more at the end of a one-shot job."""
        gateway = self._config["push_gateway"]
        if gateway is None:
            return
        from prometheus_client import push_to_gateway

        with self._lock:
            push_to_gateway(
                str(gateway),
                job=str(self._config["job"]),
                registry=self.registry,
                grouping_key=self._config["grouping_key"],
                timeout=10,
            )

    def close(self) -> None:
        """Stop the HTTP endpoint (the registry stays readable)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_config": self._config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._config = state["_config"]
        try:
            self._setup()
        except ConfigurationError as err:  # the port is taken on this process' host
            get_logger(__name__).warning(
                "metrics: no Prometheus endpoint on port %s here (%s); counting without one",
                self._config["port"],
                err,
            )
            self._config = {**self._config, "port": None}
            self._setup()

    def __repr__(self) -> str:
        where = f"port={self.port}" if self._server is not None else "no endpoint"
        return f"PrometheusMetrics({where}, push_gateway={self._config['push_gateway']!r})"
