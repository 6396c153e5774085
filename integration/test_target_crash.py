"""The target crashes: its server SIGKILLed in the middle of an epoch, restarted, recovered.

txsink's own crash points kill txsink's side. Here the *server* dies (issue 20, part 1): a
private PostgreSQL cluster, MinIO server or Kafka broker (:mod:`crashable_targets`, never
the shared ones) is SIGKILLed whole when the pipeline reaches a crash point of epoch 1, and stays
down until the supervisor restarts the query (the server is started again first, as an
operator or an orchestrator would). The server's own recovery must bring back what was
prepared (PostgreSQL's prepared transactions from its WAL, MinIO's open multipart uploads
from its disk, Kafka's transaction state), and txsink's recovery must commit the decided
ones and abort the rest. The target is then read back (psycopg; boto3 through the
manifests; a read_committed consumer): every id once, nothing prepared or open left.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from crashable_targets import CrashableKafka, CrashableMinio, CrashablePostgres

from tests.streaming import prepare_input, run_until_done
from txsink import Coordinator
from txsink.protocol.log import open_log
from txsink.testing.hooks import PointHooks

ROWS, FILES = 600, 3

#: Where the server dies (epoch 1): a task's transaction prepared, nothing decided; the
#: decision written, nothing committed; one unit committed, the others still prepared.
POINTS = ["after_precommit", "after_decision", "during_commit"]


def _crash_run(
    spark: Any, tmp_path: Path, point: str, server: Any, make_sink: Callable[[], Any]
) -> list[BaseException]:
    """The query with the server killed at ``point`` of epoch 1, restarted until done."""
    prepare_input(tmp_path, ROWS, FILES)
    hooks = PointHooks(tmp_path / "hooks")
    where = {"partition": 0} if point == "after_precommit" else {}
    hooks.at(point, server.kill, epoch=1, **where)
    log = str(tmp_path / "txlog")
    starts = []

    def make() -> Coordinator:
        if not server.running():  # the orchestrator brings the server back first
            server.start()
            starts.append(point)
        # The server stays down until this restart: nothing to ride out (outage_s=0).
        return Coordinator([make_sink()], log=log, faults=hooks.plan(), outage_s=0)

    with hooks:
        restarts, errors = run_until_done(spark, tmp_path, make)
    assert server.kills == 1 and starts == [point], (server.kills, starts)
    assert restarts >= 1, "the server's death did not fail the query: test is void"
    txlog = open_log(log)
    assert txlog.pending() == [] and txlog.last_committed() == FILES - 1
    return errors


#: The two PostgreSQL servers, each with its own points: one configured for two-phase commit
#: (the harness's default), and one with PostgreSQL's default ``max_prepared_transactions = 0``
#: (``commit="auto"`` picks the staging commit). Ids read ``two-phase-<point>`` /
#: ``stock-<point>``.
PG_CASES = [
    *(pytest.param(50, point, id=f"two-phase-{point}") for point in POINTS),
    # the decision written, nothing moved: the staged rows must survive the crash
    pytest.param(0, "after_decision", id="stock-after_decision"),
    pytest.param(0, "after_precommit", id="stock-after_precommit", marks=pytest.mark.slow),
    pytest.param(0, "during_commit", id="stock-during_commit", marks=pytest.mark.slow),
]


@pytest.mark.spark
@pytest.mark.postgres  # the harness installs Debian's PostgreSQL binaries
@pytest.mark.parametrize(("max_prepared", "point"), PG_CASES)
def test_postgres_killed_mid_epoch_and_restarted(
    spark: Any, tmp_path: Path, max_prepared: int, point: str
) -> None:
    """The postmaster dies at ``point``; its crash recovery keeps what was prepared (two-phase:
    the prepared transactions from its WAL; stock: the staged rows, a logged table), and
    txsink's recovery commits the decided ones once. Read back with psql-like queries: every
    id once, no prepared transaction left, and on the stock server no staged row left."""
    import psycopg

    from txsink.connectors.postgres import PostgresSink
    from txsink.connectors.postgres.testing import staged_names

    server = CrashablePostgres.create(max_prepared=max_prepared)
    try:
        errors = _crash_run(
            spark,
            tmp_path,
            point,
            server,
            lambda: PostgresSink(
                server.dsn, "public.orders", uid="pg", create_table=True, stall_timeout_s=8
            ),
        )
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM public.orders ORDER BY id")]
            prepared = conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
            staged = staged_names(conn, "public.orders", "txsink.")
            setting = conn.execute("SHOW max_prepared_transactions").fetchone()
    finally:
        server.stop()
    assert setting == (str(max_prepared),)
    assert ids == list(range(ROWS)), (len(ids), len(set(ids)), errors[-1:])
    assert prepared == [] and staged == [], (prepared, staged)


@pytest.mark.spark
@pytest.mark.s3  # the harness builds the MinIO binary
@pytest.mark.parametrize("point", POINTS)
def test_s3_server_killed_mid_epoch_and_restarted(spark: Any, tmp_path: Path, point: str) -> None:
    from txsink.connectors.s3 import S3Sink
    from txsink.connectors.s3.client import make_client
    from txsink.connectors.s3.testing import S3Verifier, client_options
    from txsink.testing.verifiers import verify

    server = CrashableMinio.create(tmp_path / "minio")
    try:
        options = client_options(server.env())
        make_client(options).create_bucket(Bucket="crash")
        url = "s3://crash/orders/"
        errors = _crash_run(
            spark, tmp_path, point, server, lambda: S3Sink(url, "s3", client_options=options)
        )
        verdict = verify(S3Verifier(url, range(ROWS), uid="s3", client_options=options))
    finally:
        server.stop()
    assert verdict.ok and verdict.lingering == 0, (verdict, errors[-1:])


@pytest.mark.spark
@pytest.mark.kafka  # the harness fetches the broker's jars
@pytest.mark.parametrize(
    "point",
    [
        pytest.param("after_decision", marks=pytest.mark.slow),
        # one shard's transaction committed, the other's open; slow (30 s: the broker's
        # restart), the default suite's target crashes are PostgreSQL's and MinIO's
        pytest.param("during_commit", marks=pytest.mark.slow),
    ],
)
def test_kafka_broker_killed_mid_epoch_and_restarted(
    spark: Any, tmp_path: Path, point: str
) -> None:
    """The broker (a private single-node KRaft cluster) dies; its restart reloads the
    transaction state, and txsink's recovery commits the epoch's shards from the WAL once:
    read_committed, every id once, no transaction left open (LSO = high watermark)."""
    from txsink.testing.adapter import adapter
    from txsink.testing.verifiers import verify

    server = CrashableKafka.create(tmp_path / "kafka")
    kafka = adapter("kafka")
    env = {"TXSINK_KAFKA_BOOTSTRAP": server.bootstrap}
    try:
        spec = {**kafka.new_target(tmp_path, "crash", env), "timeout_s": 10}
        errors = _crash_run(spark, tmp_path, point, server, lambda: kafka.build_sink(spec, env))
        verdict = verify(kafka.verifier(spec, range(ROWS), env, log=str(tmp_path / "txlog")))
    finally:
        server.stop()
    assert verdict.ok and verdict.lingering == 0, (verdict, errors[-1:])


# -- kill-target faults through the chaos toolkit: the cross-system move, the soak ---------


def _private_servers(tmp_path: Path) -> tuple[Any, Any, dict[str, str]]:
    import os

    pg = CrashablePostgres.create()
    minio = CrashableMinio.create(tmp_path / "minio")
    env = {**os.environ, "TXSINK_PG_DSN": pg.dsn, **minio.env()}
    return pg, minio, env


CROSS = ("files", "postgres", "s3")


@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.parametrize(
    ("connectors", "plan"),
    [
        (CROSS, "after_decision:kill-target=postgres@1"),
        pytest.param(CROSS, "during_commit:kill-target=s3@1", marks=pytest.mark.slow),
        # a task's transaction prepared in both servers, then both die at once
        pytest.param(CROSS, "after_precommit:kill-target@1#0", marks=pytest.mark.slow),
        # no crash point: PostgreSQL dies whenever the clock says (timer below)
        pytest.param(CROSS, "", marks=pytest.mark.slow),
        # Iceberg: its SQL catalog dies with the decision made; its warehouse with a
        # task's data files written
        pytest.param(
            ("iceberg", "postgres"), "after_decision:kill-target=postgres@1", marks=pytest.mark.slow
        ),
        pytest.param(("iceberg",), "after_precommit:kill-target=s3@1#0", marks=pytest.mark.slow),
        # the broker dies with PostgreSQL's transactions prepared and the decision made
        pytest.param(
            ("kafka", "postgres"), "after_decision:kill-target=kafka@1", marks=pytest.mark.slow
        ),
    ],
)
def test_cross_system_move_survives_a_target_crash(
    tmp_path: Path, connectors: tuple[str, ...], plan: str
) -> None:
    """One coordinator writes to ``connectors``; a ``kill-target`` fault SIGKILLs a server
    mid-epoch (run by :func:`txsink.testing.run_chaos`, which starts it again before the
    query restarts) while concurrent readers watch every target. Every target reads back
    every id once, nothing lingering, the readers' history is clean, and the report names
    the kill."""
    from txsink.testing import run_chaos
    from txsink.testing.inputs import input_epochs, make_input
    from txsink.testing.targets import child_env, new_targets

    pg, minio, env = _private_servers(tmp_path)
    servers: dict[str, Any] = {"postgres": pg, "s3": minio}
    if "kafka" in connectors:
        servers["kafka"] = CrashableKafka.create(tmp_path / "kafka")
        env["TXSINK_KAFKA_BOOTSTRAP"] = servers["kafka"].bootstrap
    try:
        make_input(tmp_path / "input", ROWS, FILES)
        made = new_targets(list(connectors), tmp_path, tag="xcrash", env=env)
        log = str(tmp_path / "txlog")
        report = run_chaos(
            "txsink.testing.pipelines:run_stream",
            plan,
            workdir=tmp_path,
            sinks_verifiers={t.connector: t.verifier(range(ROWS), log=log) for t in made},
            args={"workdir": str(tmp_path), "sinks": [t.spec for t in made], "log": log},
            env={**env, **child_env(made)},
            targets=servers,
            down_s=1.0,
            kill_target_after=None if plan else (8.0, "postgres"),
            observe=[view for t in made for view in t.observer_targets()],
            expected_epochs=input_epochs(tmp_path / "input"),
        )
    finally:
        for server in servers.values():
            server.stop()
    assert report.ok, report.table()
    killed = len(servers) if "kill-target@" in plan else 1
    assert len(report.target_kills) == killed and report.restarts >= 1, report.table()
    assert all(v.lingering == 0 for v in report.verdicts.values()), report.table()
    assert all(n > 0 for n in report.samples.values()), report.samples


@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.slow
def test_soak_draws_target_crashes_and_resumes(tmp_path: Path) -> None:
    """Two plans of ``kill-target`` faults, then one more from the same results file: the
    second run runs index 2 only, and the file tallies all three."""
    from txsink.testing.chaos.soak import soak
    from txsink.testing.chaos.soaklog import read, summary

    pg, minio, env = _private_servers(tmp_path)
    results = tmp_path / "results.jsonl"
    try:
        common: dict[str, Any] = {
            "workdir": tmp_path / "plans",
            "connectors": ["postgres", "s3"],
            "modes": ["kill-target"],
            "env": env,
            "targets": {"postgres": pg, "s3": minio},
            "down_s": 1.0,
            "results": results,
        }
        first = soak(2, 11, **common)
        second = soak(1, 11, **common)
    finally:
        pg.stop()
        minio.stop()
    assert first.ok and second.ok, (first.table(), second.table())
    assert [line["index"] for line in read(results)] == [0, 1, 2]
    kills = sum(len(r.target_kills) for r in first.reports + second.reports)
    assert kills >= 3, (first.table(), second.table())
    assert "| 3 | 11 | postgres, s3 |" in summary(results)
