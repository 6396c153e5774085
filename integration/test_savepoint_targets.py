"""Savepoints and uid renames with the cross-system sinks (Kafka WAL + Postgres + S3).

The same flows as tests/test_savepoint_state.py, against the real servers: a savepoint
(kept on S3) restored to new locations (the txsink log moves from a local folder to an
``s3://`` prefix, the Spark checkpoint to a new directory), and a rename of every sink uid
with its target-side migration; each then continues with more input and is read back in
every target: every id exactly once, nothing lingering.
"""

from __future__ import annotations

import shutil
from typing import Any

import psycopg
import pytest
from cross import Cross

from tests.streaming import append_input, prepare_input, start_query
from txsink import Coordinator
from txsink.ops.savepoint import create_savepoint, read_savepoint, restore_savepoint
from txsink.ops.state import rename_uid
from txsink.protocol.log import TxLog, open_log

pytestmark = [pytest.mark.kafka, pytest.mark.postgres, pytest.mark.s3, pytest.mark.spark]
ROWS, FILES, MORE = 400, 2, 200


def _s3_log(cross: Cross, prefix: str) -> TxLog:
    from txsink.connectors.s3.client import parse_s3_url
    from txsink.connectors.s3.testing import client_options

    s3 = cross.targets["s3"]
    bucket = parse_s3_url(s3.spec["url"]).bucket
    return open_log(f"s3://{bucket}/{prefix}", client_options=client_options(s3.env))


def _assert_exactly_once(cross: Cross, rows: int) -> None:
    verdicts = cross.verdicts(rows)
    bad = {name: v for name, v in verdicts.items() if not v.ok}
    assert not bad, f"not exactly-once: {bad}"


def test_savepoint_restored_to_new_locations_continues_exactly_once(
    spark: Any, cross: Cross
) -> None:
    prepare_input(cross.tmp, ROWS, FILES)
    start_query(spark, cross.tmp, cross.coordinator()).awaitTermination()

    savepoint = _s3_log(cross, "savepoints/sp-1")
    sp = create_savepoint(cross.log, savepoint, checkpoint=cross.tmp / "checkpoint")
    assert sp.last_committed == FILES - 1
    assert set(sp.sinks) == set(cross.uids.values())
    moved = _s3_log(cross, "pipelines/moved/txlog")
    restore_savepoint(savepoint, moved, checkpoint=cross.tmp / "ckpt-moved")
    assert read_savepoint(savepoint).records == sp.records
    shutil.rmtree(cross.tmp / "txlog")
    shutil.rmtree(cross.tmp / "checkpoint")

    append_input(cross.tmp / "input", ROWS, MORE, FILES)
    coordinator = Coordinator(cross.sinks(), log=moved)
    start_query(spark, cross.tmp, coordinator, checkpoint="ckpt-moved").awaitTermination()
    _assert_exactly_once(cross, ROWS + MORE)
    assert moved.last_committed() == FILES and moved.pending() == []


def test_rename_every_uid_then_continue(spark: Any, cross: Cross) -> None:
    prepare_input(cross.tmp, ROWS, FILES)
    start_query(spark, cross.tmp, cross.coordinator()).awaitTermination()
    log = open_log(cross.log)
    app = str(log.meta()["app_id"])  # type: ignore[index]
    old = dict(cross.uids)
    # A lingering prepared transaction of the old Postgres uid (a crashed task's leftover):
    # recovery under the new uid would never list it; the rename rolls it back.
    stray = f"txsink.{app}.{old['postgres']}.e1.r7.p0.a9"
    conn = psycopg.connect(cross.services["postgres"].dsn)
    conn.tpc_begin(stray)
    conn.execute("SELECT 1")
    conn.tpc_prepare()
    conn.close()  # a prepared transaction outlives its session

    for name, uid in old.items():
        cross.rename(name, f"{uid[:40]}-v2")
    lines: list[str] = []
    for name, uid in old.items():
        report = rename_uid(log, uid, cross.uids[name], sinks=cross.sinks())
        assert report.epochs == list(range(FILES))
        lines += report.actions
    text = "\n".join(lines)
    assert "aborted 1 lingering transaction(s)" in text, text
    assert f"moved {FILES} epoch manifest(s)" in text, text
    assert "fenced transactional ids" in text, text
    with psycopg.connect(cross.services["postgres"].dsn, autocommit=True) as conn:
        gids = conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall()
    assert (stray,) not in gids
    assert all(
        set(log.decision(e).handles) == set(cross.uids.values())  # type: ignore[union-attr]
        for e in range(FILES)
    )

    append_input(cross.tmp / "input", ROWS, MORE, FILES)
    start_query(spark, cross.tmp, cross.coordinator()).awaitTermination()
    # The S3 verifier reads by the NEW uid: the old epochs' manifests moved with it.
    _assert_exactly_once(cross, ROWS + MORE)
    assert log.last_committed() == FILES and log.pending() == []
