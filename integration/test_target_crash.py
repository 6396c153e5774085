"""The target crashes: PostgreSQL SIGKILLed in the middle of an epoch, restarted, recovered.

txsink's own crash points kill txsink's side. Here the *server* dies (issue 20, part 1):
a private PostgreSQL cluster (:mod:`crashable_postgres`, never the shared one) is SIGKILLed
whole — postmaster and backends — when the pipeline reaches a crash point of epoch 1, and
stays down until the supervisor restarts the query (the server is started again first, as
an operator or an orchestrator would). PostgreSQL's crash recovery must bring back every
prepared transaction, and txsink's recovery must commit the decided ones and abort the
rest. The table is then read with psycopg: every id once, no prepared transaction left.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crashable_postgres import CrashablePostgres

from tests.streaming import prepare_input, run_until_done
from txsink import Coordinator
from txsink.connectors.postgres import PostgresSink
from txsink.log import open_log
from txsink.testing.hooks import PointHooks

ROWS, FILES = 600, 3

#: Where the server dies (epoch 1): a task's transaction prepared, nothing decided; the
#: decision written, nothing committed; one partition's transaction committed, the other
#: still prepared.
POINTS = ["after_precommit", "after_decision", "during_commit"]


@pytest.fixture
def server() -> Any:
    pg = CrashablePostgres.create()
    yield pg
    pg.stop()


@pytest.mark.spark
@pytest.mark.postgres  # the harness installs Debian's PostgreSQL binaries
@pytest.mark.parametrize("point", POINTS)
def test_postgres_killed_mid_epoch_and_restarted(
    spark: Any, tmp_path: Path, server: CrashablePostgres, point: str
) -> None:
    prepare_input(tmp_path, ROWS, FILES)
    hooks = PointHooks(tmp_path / "hooks")
    hooks.at(
        point, server.kill, epoch=1, **({"partition": 0} if point.startswith("after_p") else {})
    )
    log = str(tmp_path / "txlog")
    starts = []

    def make() -> Coordinator:
        if not server.running():  # the orchestrator brings the database back first
            server.start()
            starts.append(point)
        sink = PostgresSink(
            server.dsn, "public.orders", uid="pg", create_table=True, stall_timeout_s=8
        )
        return Coordinator([sink], log=log, faults=hooks.plan())

    with hooks:
        restarts, errors = run_until_done(spark, tmp_path, make)
    assert server.kills == 1 and starts == [point], (server.kills, starts)
    assert restarts >= 1, "the server's death did not fail the query: test is void"
    import psycopg

    with psycopg.connect(server.dsn, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM public.orders ORDER BY id")]
        prepared = conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
    assert ids == list(range(ROWS)), (len(ids), len(set(ids)), errors[-1:])
    assert prepared == [], prepared
    txlog = open_log(log)
    assert txlog.pending() == [] and txlog.last_committed() == FILES - 1
