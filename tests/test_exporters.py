"""The Prometheus and OpenTelemetry exporters, fed by a coordinator driven without Spark
(tests/test_metrics.py's World): the real HTTP endpoint scraped and parsed with
prometheus_client's own parser, a push received by a recording HTTP server (there is no
Pushgateway binary here), and the OpenTelemetry SDK's in-memory reader."""

from __future__ import annotations

import pickle
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar

import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("opentelemetry.sdk")

from prometheus_client.parser import text_string_to_metric_families

from tests.test_metrics import APP, EPOCHS, PARTITIONS, ROWS, UIDS, World, _step
from txsink.observe.otel import OTelMetrics
from txsink.observe.prometheus import PrometheusMetrics


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return samples(resp.read().decode())


def sink_labels(uid: str, **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"app_id": APP, "sink_uid": uid, "connector": "memory", **more}.items()))


@pytest.fixture
def prom() -> Iterator[PrometheusMetrics]:
    p = PrometheusMetrics(port=0)
    yield p
    p.close()


def test_endpoint_after_a_crash_and_recovery(prom: PrometheusMetrics) -> None:
    world = World(metrics=prom)
    world.run(crash_at=_step("a commit") + 1)  # epoch 0 half committed, then recovered
    assert prom.port is not None
    got = scrape(prom.port)
    app = (("app_id", APP),)
    assert got[("txsink_epochs_total", (*app, ("outcome", "committed")))] == EPOCHS
    for uid in UIDS:
        visible = len(world.targets[uid].visible())
        assert got[("txsink_written_rows_total", sink_labels(uid))] == visible
        assert visible == EPOCHS * PARTITIONS * ROWS
    assert got[("txsink_handles_total", sink_labels("a", outcome="already_committed"))] == 1
    assert got[("txsink_handles_total", sink_labels("a", outcome="committed"))] == 5
    assert got[("txsink_handles_total", sink_labels("b", outcome="committed"))] == 6
    assert got[("txsink_handles_total", sink_labels("a", outcome="retried"))] == 2
    assert got[("txsink_last_committed_epoch", app)] == EPOCHS - 1
    assert got[("txsink_decided_uncommitted_epochs", app)] == 0
    assert got[("txsink_lingering_prepared_transactions", sink_labels("b"))] == 2
    assert got[("txsink_oldest_prepared_timestamp_seconds", sink_labels("b"))] == 0
    phases = {dict(k[1]).get("phase") for k in got if k[0].startswith("txsink_phase_duration")}
    assert {"recover", "precommit", "decide", "commit"} <= phases
    count = ("txsink_phase_duration_seconds_count", (*app, ("phase", "commit")))
    assert got[count] == EPOCHS - 1  # epoch 0's commit was finished by recovery


class _Recorder(BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_PUT(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.requests.append(("PUT", self.path, body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_push_mode_puts_the_registry_after_each_epoch() -> None:
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.requests = []
    try:
        push = PrometheusMetrics(
            push_gateway=f"http://127.0.0.1:{server.server_port}",
            job="nightly",
            grouping_key={"instance": "driver-1"},
        )
        world = World(metrics=push)
        world.run()
    finally:
        server.shutdown()
        server.server_close()
    assert len(_Recorder.requests) == EPOCHS
    method, path, body = _Recorder.requests[-1]
    assert (method, path) == ("PUT", "/metrics/job/nightly/instance/driver-1")
    got = samples(body.decode())
    assert got[("txsink_epochs_total", (("app_id", APP), ("outcome", "committed")))] == EPOCHS
    # pushed after the epoch's other metrics: the last push holds every row
    assert got[("txsink_written_rows_total", sink_labels("a"))] == EPOCHS * PARTITIONS * ROWS


def test_prometheus_needs_an_endpoint_or_a_gateway() -> None:
    from txsink.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"port= .* or push_gateway="):
        PrometheusMetrics()


def test_a_taken_port_is_a_configuration_error(prom: PrometheusMetrics) -> None:
    from txsink.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=rf"127\.0\.0\.1:{prom.port} .*choose a free port"):
        PrometheusMetrics(port=prom.port)


def test_prometheus_metrics_pickle_as_configuration(prom: PrometheusMetrics) -> None:
    prom.epoch(APP, "committed")
    again = pickle.loads(pickle.dumps(prom))
    try:
        assert again.port is not None and again.port != prom.port  # port 0: a new one
        assert ("txsink_epochs_total", (("app_id", APP), ("outcome", "committed"))) not in (
            scrape(again.port)
        )  # counts from zero, as a restarted driver
    finally:
        again.close()


def test_otel_through_the_sdk_in_memory_reader() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    world = World(metrics=OTelMetrics(provider))
    world.run(crash_at=_step("log.create epochs/00000000000000000001/decision") + 1)
    data = reader.get_metrics_data()
    assert data is not None
    points: dict[str, list[Any]] = {}
    units: dict[str, str] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "txsink"
            for metric in sm.metrics:
                points[metric.name] = list(metric.data.data_points)
                units[metric.name] = metric.unit or ""

    def total(name: str, **attrs: str) -> float:
        return sum(
            float(p.value)
            for p in points[name]
            if all(p.attributes.get(f"txsink.{k}") == v for k, v in attrs.items())
        )

    assert total("txsink.epochs", outcome="committed") == EPOCHS
    assert total("txsink.rows.written", **{"sink.uid": "a"}) == len(world.targets["a"].visible())
    assert total("txsink.handles", outcome="retried") == 2 * PARTITIONS
    assert total("txsink.epoch.last_committed") == EPOCHS - 1
    assert total("txsink.transaction.lingering", **{"sink.uid": "a"}) == PARTITIONS
    assert units["txsink.phase.duration"] == "s" and units["txsink.bytes.written"] == "By"
    assert {p.attributes["txsink.phase"] for p in points["txsink.phase.duration"]} >= {
        "recover",
        "commit",
    }


def test_otel_is_a_no_op_without_an_sdk() -> None:
    world = World(metrics=OTelMetrics())
    world.run()  # the global provider is the API's no-op: nothing to see, nothing fails
    assert len(world.targets["a"].visible()) == EPOCHS * PARTITIONS * ROWS


def test_a_coordinator_with_exporters_travels_as_spark_connect_pickles_it(
    tmp_path: Any,
) -> None:
    """Spark Connect pickles the coordinator: its exporters travel as configuration and
    start again on arrival (a new endpoint; OTel on the receiving process' provider)."""
    from tests.memsink import Crasher, MemSink, MemTarget, batches_for, memory_precommit
    from txsink import Coordinator

    prom = PrometheusMetrics(port=0)
    sink = MemSink("a", MemTarget(), Crasher())
    coord = Coordinator(
        [sink], log=str(tmp_path / "log"), app_id=APP, metrics=[prom, OTelMetrics()]
    )
    coord.run_epoch(0, memory_precommit(batches_for(0, 1, 1)), app_id=APP)
    arrived = pickle.loads(pickle.dumps(coord))
    try:
        new_prom = arrived._meter.metrics[0]
        assert isinstance(new_prom, PrometheusMetrics) and new_prom.port not in (None, prom.port)
        assert arrived._meter.app == "" and arrived._recovery.meter is arrived._meter
        arrived.run_epoch(1, memory_precommit(batches_for(1, 1, 1)), app_id=APP)
        got = scrape(new_prom.port or 0)
        assert got[("txsink_epochs_total", (("app_id", APP), ("outcome", "committed")))] == 1
    finally:
        prom.close()
        arrived._meter.metrics[0].close()


def test_the_grafana_dashboard_queries_only_metrics_the_exporter_has() -> None:
    import json
    import re
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).parent.parent / "docs/grafana-dashboard.json").read_text()
    )
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {name for e in exprs for name in re.findall(r"\btxsink_[a-z_]+", e)}
    prom = PrometheusMetrics(push_gateway="http://unused.invalid")
    known = {
        family.name + suffix
        for family in prom.registry.collect()
        for suffix in ("", "_total", "_bucket", "_count", "_sum")
    }
    assert used and used <= known, sorted(used - known)
    assert {"txsink_decided_uncommitted_epochs", "txsink_commit_timeout_ratio"} <= used
    assert {"txsink_audit_mismatches_total", "txsink_last_audited_epoch"} <= used
