"""Live metrics against real targets: a streaming query into PostgreSQL with a crash and
its recovery, the real Prometheus endpoint scraped over HTTP between the runs and after,
parsed with prometheus_client's own parser; every counter equals the target's read-back."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _rows(postgres: Any, query: str) -> list[tuple[Any, ...]]:
    with postgres.connect() as conn:
        return conn.execute(query).fetchall()  # type: ignore[no-any-return]


def _prepared(postgres: Any, uid: str) -> int:
    gids = _rows(postgres, "SELECT gid FROM pg_prepared_xacts")
    return sum(1 for (g,) in gids if f".{uid}." in g)


@pytest.mark.postgres
@pytest.mark.spark
def test_prometheus_counters_equal_postgres_after_crash_and_recovery(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    from tests.streaming import prepare_input, run_until_done
    from txsink import Coordinator
    from txsink.connectors.postgres import PostgresSink
    from txsink.observe.prometheus import PrometheusMetrics

    uid = postgres.new_schema("met")
    with postgres.connect() as conn:
        conn.execute(
            f"CREATE TABLE {uid}.events (id bigint, key text, amount float8, payload text)"
        )
    prepare_input(tmp_path, 1000, files=4)  # four epochs
    # Epoch 2's commit raises once after its first transaction became visible.
    plan = FaultPlan.parse("during_commit:raise@2", str(tmp_path / "faults"))
    prom = PrometheusMetrics(port=0)
    assert prom.port is not None
    app = (("app_id", "metrics-app"),)
    sink_labels = (("app_id", "metrics-app"), ("connector", "postgres"), ("sink_uid", uid))
    between: list[tuple[Samples, int]] = []

    def make() -> Coordinator:
        if len(starts) == 1:  # the restart: scrape what the failed run left, and the target
            between.append((scrape(prom.port or 0), _prepared(postgres, uid)))
        starts.append(1)
        sink = PostgresSink(postgres.dsn, f"{uid}.events", uid=uid)
        return Coordinator(
            [sink], log=str(tmp_path / "txlog"), app_id="metrics-app", faults=plan, metrics=prom
        )

    starts: list[int] = []
    try:
        restarts, _errors = run_until_done(spark, tmp_path, make)
        after = scrape(prom.port)
    finally:
        prom.close()
    assert restarts == 1

    # Between the runs: epoch 2 decided, its commit unfinished; part of it still prepared.
    mid, still_prepared = between[0]
    assert mid[("txsink_decided_uncommitted_epochs", app)] == 1
    assert mid[("txsink_epochs_total", (*app, ("outcome", "committed")))] == 2
    assert (
        mid[("txsink_handles_total", tuple(sorted((*sink_labels, ("outcome", "failed")))))]
        == still_prepared
    )
    assert still_prepared >= 1

    # After: every counter equals the read-back.
    (count,) = _rows(postgres, f"SELECT count(*) FROM {uid}.events")[0]
    assert count == 1000
    assert after[("txsink_written_rows_total", sink_labels)] == count
    txlog = open_log(str(tmp_path / "txlog"))
    committed_epochs = [e for e in txlog.epochs() if txlog.committed(e) is not None]
    assert committed_epochs == [0, 1, 2, 3]
    assert after[("txsink_epochs_total", (*app, ("outcome", "committed")))] == 4
    assert after[("txsink_epochs_total", (*app, ("outcome", "skipped")))] == 1  # Spark's replay
    decided = {e: txlog.decision(e) for e in committed_epochs}
    handles = {e: len(d.handles.get(uid, [])) for e, d in decided.items() if d is not None}

    def outcome(name: str) -> float:
        return after.get(
            ("txsink_handles_total", tuple(sorted((*sink_labels, ("outcome", name))))), 0.0
        )

    # Epoch 2: the failed run committed (and counted) what PostgreSQL no longer held
    # prepared at the restart; recovery committed the rest and confirmed those as
    # "already committed".
    live = mid[("txsink_handles_total", tuple(sorted((*sink_labels, ("outcome", "committed")))))]
    assert live == handles[0] + handles[1] + handles[2] - still_prepared
    assert outcome("already_committed") == handles[2] - still_prepared
    assert outcome("committed") == live + still_prepared + handles[3]
    assert outcome("retried") == handles[2]
    assert after[("txsink_last_committed_epoch", app)] == 3
    assert after[("txsink_decided_uncommitted_epochs", app)] == 0
    assert after[("txsink_lingering_prepared_transactions", sink_labels)] == still_prepared
    assert after[("txsink_oldest_prepared_timestamp_seconds", sink_labels)] == 0
    assert _prepared(postgres, uid) == 0
    recover = ("txsink_phase_duration_seconds_count", (*app, ("phase", "recover")))
    assert after[recover] >= 1


@pytest.mark.kafka
def test_kafka_reports_its_commit_time_against_transaction_timeout(
    kafka: Any, tmp_path: Path
) -> None:
    """A WAL-mode commit reports its span over ``transaction.timeout.ms`` once, through
    the generic ``EpochCommit.report_timeout_ratio``; the core never names Kafka."""
    import time
    import uuid

    import pyarrow as pa

    from txsink.connectors.kafka import KafkaSink
    from txsink.contract import EpochCommit
    from txsink.txid import TxnId

    schema = pa.schema([("id", pa.int64()), ("key", pa.string())])
    topic, uid = kafka.new_topic(2), "k" + uuid.uuid4().hex[:10]
    config = {"transaction.timeout.ms": 20000}
    sink = KafkaSink(
        kafka.bootstrap, topic, uid=uid, wal=tmp_path / "wal", key="key", shards=2,
        producer_config=config,
    )  # fmt: skip
    sink.check(schema, "app")
    handles = []
    for p in range(2):
        open_ = sink.begin(TxnId("app", uid, 0, 0, p, p), schema)
        sink.write(open_, pa.RecordBatch.from_pydict({"id": [p], "key": ["k"]}, schema=schema))
        handles.append(sink.prepare(open_))
    ratios: list[float] = []
    started = time.monotonic()
    sink.commit_epoch(EpochCommit(0, tuple(handles), on_timeout_ratio=ratios.append))
    elapsed = time.monotonic() - started
    assert len(ratios) == 1
    assert 0 < ratios[0] <= elapsed / 20.0
