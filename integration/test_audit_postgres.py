"""``txsink audit`` of the Postgres sink (issue #42): a clean run audits clean, metadata and
deep, in both commit protocols; tampering with the table after the run (a row deleted, a
value changed, the table truncated, a row copied) fails the audit naming the epoch, the
sink and the difference; a bounded audit reads only its epochs; a table without
``epoch_column`` audits from the progress table only, and says what it cannot see.

Epochs run through :class:`~txsink.Coordinator` with Spark into a real PostgreSQL; the
audit goes through :func:`~txsink.ops.audit.run.audit_log` with a sink built anew (as the
CLI would: no start-up check ran on it). Tampering is done with psycopg of its own.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from txsink import Coordinator
from txsink.connectors.postgres import PostgresSink
from txsink.errors import ConfigurationError
from txsink.ops.audit.run import AuditReport, AuditRow, audit_log
from txsink.protocol.log import open_log
from txsink.testing.contract import SCHEMA

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

APP = "audit"
UID = "pg-audit"
DDL = (
    "id long, amount decimal(10,2), name string, score double, ts timestamp, day date, "
    "flag boolean, small int"
)
ROWS = 6  # per epoch
EPOCHS = 3


def _rows(epoch: int) -> list[tuple[Any, ...]]:
    base = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    return [
        (
            epoch * 100 + i,
            Decimal(epoch * 100 + i) / 4,
            f"name {epoch}-{i}" if i % 3 else None,
            i / 3,
            base + dt.timedelta(days=epoch, seconds=i, microseconds=7),
            dt.date(2026, 1, 1 + i),
            i % 2 == 0,
            i,
        )
        for i in range(ROWS)
    ]


def _sink(server: Any, table: str, **options: Any) -> PostgresSink:
    return PostgresSink(server.dsn, table, uid=UID, stall_timeout_s=30, **options)


def _run(spark: Any, server: Any, tmp: Path, **options: Any) -> tuple[str, Path]:
    """EPOCHS epochs of ROWS rows (two partitions each) into a new table; its name, the log."""
    table, log, _ = _run_with(spark, server, tmp, **options)
    return table, log


def _run_with(spark: Any, server: Any, tmp: Path, **options: Any) -> tuple[str, Path, PostgresSink]:
    """:func:`_run`, and the coordinator's sink (its start-up check ran)."""
    options.setdefault("epoch_column", "txsink_epoch")
    table = f"{server.new_schema('audit')}.events"
    log = tmp / "txlog"
    sink = _sink(server, table, create_table=True, **options)
    coordinator = Coordinator([sink], log=str(log), app_id=APP)
    for epoch in range(EPOCHS):
        df = spark.createDataFrame(_rows(epoch), DDL).repartition(2)
        assert coordinator.write(df, epoch=epoch).status == "committed"
    return table, log, sink


def _audit(
    server: Any, table: str, log: Path, *, deep: bool = False, **options: Any
) -> AuditReport:
    """The audit as the CLI runs it: a sink built anew, no start-up check."""
    options.setdefault("epoch_column", "txsink_epoch")
    last = options.pop("last", None)
    sink = _sink(server, table, **options)
    return audit_log(open_log(str(log)), [sink], deep=deep, last=last)


def _sql(server: Any, statement: str) -> None:
    with server.connect() as conn:
        conn.execute(statement)


def _row(report: AuditReport, epoch: int) -> AuditRow:
    (row,) = [r for r in report.rows if r.epoch == epoch]
    return row


def _assert_clean(report: AuditReport, *, deep: bool) -> None:
    assert report.ok, report.to_json()
    assert [r.epoch for r in report.rows] == list(range(EPOCHS))
    for row in report.rows:
        assert (row.sink, row.status, row.expected, row.found) == (UID, "ok", ROWS, ROWS)
        assert row.checksum == ("ok" if deep else "not read")
    assert report.extras[UID] == []


def _assert_only(report: AuditReport, epoch: int, *, checksum: str = "not read") -> AuditRow:
    """The audit fails on ``epoch`` of our sink, and only there; that row."""
    assert not report.ok
    row = _row(report, epoch)
    assert (row.sink, row.status, row.checksum) == (UID, "mismatch", checksum)
    assert [r.epoch for r in report.rows if r.status != "ok"] == [epoch]
    return row


@pytest.mark.parametrize("commit", ["2pc", "staging"])
def test_a_clean_run_audits_clean_metadata_and_deep(
    spark: Any, postgres: Any, tmp_path: Path, commit: str
) -> None:
    table, log, sink = _run_with(spark, postgres, tmp_path, commit=commit)
    with postgres.connect() as conn:
        tagged = conn.execute(
            f"SELECT txsink_epoch, count(*) FROM {table} GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert tagged == [(e, ROWS) for e in range(EPOCHS)]
    _assert_clean(_audit(postgres, table, log), deep=False)
    _assert_clean(_audit(postgres, table, log, deep=True), deep=True)
    # The coordinator's own sink (its check ran: the written Arrow types are known).
    _assert_clean(audit_log(open_log(str(log)), [sink], deep=True), deep=True)


def test_a_deleted_row_is_one_missing_in_its_epoch(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    table, log = _run(spark, postgres, tmp_path)
    _sql(postgres, f"DELETE FROM {table} WHERE id = 103")
    row = _assert_only(_audit(postgres, table, log), 1)
    assert (row.expected, row.found) == (ROWS, ROWS - 1)
    assert row.differences == (f"expected {ROWS} rows, found {ROWS - 1} (1 missing)",)


def test_a_changed_value_fails_the_deep_audit_naming_the_column(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    """The count is unchanged, so the metadata audit passes (it cannot see a value); the
    deep audit names the epoch and the column."""
    table, log = _run(spark, postgres, tmp_path)
    _sql(postgres, f"UPDATE {table} SET amount = amount + 0.01 WHERE id = 204")
    assert _audit(postgres, table, log).ok
    row = _assert_only(_audit(postgres, table, log, deep=True), 2, checksum="differs")
    assert row.found == ROWS
    assert row.differences == ("checksum differs in column(s) amount",)


def test_a_truncated_table_misses_every_epoch(spark: Any, postgres: Any, tmp_path: Path) -> None:
    table, log = _run(spark, postgres, tmp_path)
    _sql(postgres, f"TRUNCATE {table}")
    for deep in (False, True):
        report = _audit(postgres, table, log, deep=deep)
        assert not report.ok
        for row in report.rows:
            assert (row.sink, row.status, row.found) == (UID, "mismatch", 0)
            assert f"expected {ROWS} rows, found 0 ({ROWS} missing)" in row.differences


def test_a_copied_row_is_one_extra_in_its_epoch(spark: Any, postgres: Any, tmp_path: Path) -> None:
    table, log = _run(spark, postgres, tmp_path)
    _sql(postgres, f"INSERT INTO {table} SELECT * FROM {table} WHERE id = 101")
    row = _assert_only(_audit(postgres, table, log), 1)
    assert (row.expected, row.found) == (ROWS, ROWS + 1)
    assert row.differences == (f"expected {ROWS} rows, found {ROWS + 1} (1 extra)",)
    deep = _row(_audit(postgres, table, log, deep=True), 1)
    assert deep.status == "mismatch" and deep.checksum == "differs"


def test_rows_of_an_epoch_this_sink_did_not_write_are_extras(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    """An epoch with no rows for the sink has no handles: rows tagged with it are ours by
    the column, and named by no decision."""
    table, log = _run(spark, postgres, tmp_path)
    coordinator = Coordinator(
        [_sink(postgres, table, epoch_column="txsink_epoch")], log=str(log), app_id=APP
    )
    empty = spark.createDataFrame([], DDL)
    assert coordinator.write(empty, epoch=EPOCHS).status == "committed"
    assert _audit(postgres, table, log).ok
    _sql(postgres, f"UPDATE {table} SET txsink_epoch = {EPOCHS} WHERE id = 2")
    report = _audit(postgres, table, log)
    assert not report.ok
    assert _row(report, 0).differences == (f"expected {ROWS} rows, found {ROWS - 1} (1 missing)",)
    (extra,) = report.extras[UID]
    assert (extra.epoch, extra.rows) == (EPOCHS, 1)
    assert f"txsink_epoch = {EPOCHS}" in extra.what and "no decision" in extra.what


def test_the_last_epoch_audit_reads_only_that_epoch(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    """``last=1`` audits the newest epoch only: epoch 0's rows deleted and a row of epoch 1
    changed, the bounded audit (metadata and deep) still passes, because it reads neither
    epoch; the full audit fails on both."""
    table, log = _run(spark, postgres, tmp_path)
    _sql(postgres, f"DELETE FROM {table} WHERE txsink_epoch = 0")
    _sql(postgres, f"UPDATE {table} SET name = 'changed' WHERE id = 101")
    for deep in (False, True):
        bounded = _audit(postgres, table, log, deep=deep, last=1)
        assert bounded.ok and bounded.epochs == [EPOCHS - 1]
        assert [r.epoch for r in bounded.rows] == [EPOCHS - 1]
    full = _audit(postgres, table, log, deep=True)
    assert [r.epoch for r in full.mismatches] == [0, 1]


def test_without_an_epoch_column_the_progress_table_is_audited_and_the_notes_say_so(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    """No epoch column: the audit reads the progress table only. A clean run passes and the
    notes say what is not seen (a row deleted by hand passes too: the notes' point); a
    transaction's progress row gone fails, naming it."""
    table, log = _run(spark, postgres, tmp_path, epoch_column=None)
    for deep in (False, True):
        report = _audit(postgres, table, log, deep=deep, epoch_column=None)
        assert report.ok, report.to_json()
        assert all(r.found is None and r.checksum == "not read" for r in report.rows)
        assert all("progress table" in r.how for r in report.rows)
        notes = " ".join(report.notes[UID])
        assert "no epoch_column" in notes and "TRUNCATE" in notes
        assert ("deep: not read" in notes) == deep
    _sql(postgres, f"DELETE FROM {table} WHERE id = 1")
    assert _audit(postgres, table, log, epoch_column=None).ok  # what it cannot see
    schema = table.split(".")[0]
    with postgres.connect() as conn:
        (gid,) = conn.execute(
            f"DELETE FROM {schema}.txsink_progress WHERE gid = "
            f"(SELECT min(gid) FROM {schema}.txsink_progress WHERE epoch = 2) RETURNING gid"
        ).fetchone()
    row = _assert_only(_audit(postgres, table, log, epoch_column=None), 2)
    assert row.differences == (
        f"transaction {gid} has no row in the progress table {schema}.txsink_progress "
        "(txsink's record of its commit)",
    )


@pytest.mark.parametrize("commit", ["2pc", "staging"])
def test_upsert_tags_each_key_with_the_epoch_that_last_wrote_it(
    spark: Any, postgres: Any, tmp_path: Path, commit: str
) -> None:
    schema = postgres.new_schema("audit")
    table = f"{schema}.kv"
    _sql(postgres, f"CREATE TABLE {table} (k bigint PRIMARY KEY, v text, ep bigint)")
    coordinator = Coordinator(
        [_sink(postgres, table, mode="upsert", key=["k"], commit=commit, epoch_column="ep")],
        log=str(tmp_path / "txlog"),
        app_id=APP,
    )
    for epoch, keys in enumerate([range(0, 4), range(2, 6)]):
        df = spark.createDataFrame([(k, f"v{epoch}") for k in keys], "k long, v string")
        assert coordinator.write(df, epoch=epoch).status == "committed"
    with postgres.connect() as conn:
        got = conn.execute(f"SELECT k, v, ep FROM {table} ORDER BY k").fetchall()
    assert got == [(k, f"v{int(k >= 2)}", int(k >= 2)) for k in range(6)]
    log = tmp_path / "txlog"
    report = _audit(postgres, table, log, deep=True, epoch_column="ep", mode="upsert", key=["k"])
    assert report.ok, report.to_json()
    assert "upsert" in " ".join(report.notes[UID])
    _sql(postgres, f"INSERT INTO {table} VALUES (10, 'x', 0), (11, 'x', 0), (12, 'x', 0)")
    report = _audit(postgres, table, log, epoch_column="ep", mode="upsert", key=["k"])
    row = _assert_only(report, 0)
    assert row.differences == (
        f"5 rows of {table} carry ep = 0, more than the 4 rows the epoch wrote",
    )


def test_the_epoch_column_is_checked_at_start(postgres: Any) -> None:
    """Refused naming the column and the fix: carried by the DataFrame, missing from the
    table, of another type. ``create_table`` creates it."""
    schema = postgres.new_schema("audit")
    _sql(postgres, f"CREATE TABLE {schema}.t (id bigint, name text, ep integer)")
    cases = [
        ("id", "Drop it from the DataFrame"),
        ("missing", 'ADD COLUMN "missing" bigint'),
        ("ep", 'ALTER COLUMN "ep" TYPE bigint'),
    ]
    for column, fix in cases:
        with pytest.raises(ConfigurationError) as info:
            _sink(postgres, f"{schema}.t", epoch_column=column).check(SCHEMA, APP)
        assert column in str(info.value) and fix in str(info.value)
        assert info.value.sink_uid == UID
    _sink(postgres, f"{schema}.new", epoch_column="ep", create_table=True).check(SCHEMA, APP)
    with postgres.connect() as conn:
        found = conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'new' AND column_name = 'ep'",
            (schema,),
        ).fetchall()
    assert found == [("bigint",)]
    with pytest.raises(ValueError, match="upsert key"):
        _sink(postgres, f"{schema}.t", mode="upsert", key=["ep"], epoch_column="ep")


@pytest.mark.parametrize("commit", ["2pc", "staging"])
def test_an_epoch_that_adds_a_column_is_tagged_and_audits_clean(
    spark: Any, postgres: Any, tmp_path: Path, commit: str
) -> None:
    """An evolving epoch is staged (whatever ``commit``) and moved with the epoch column; the
    deep audit reads each epoch's own columns (epoch 0's rows have no ``note``)."""
    table = f"{postgres.new_schema('audit')}.events"
    _sql(postgres, f"CREATE TABLE {table} (id bigint, name text, txsink_epoch bigint)")
    options: dict[str, Any] = {"commit": commit, "epoch_column": "txsink_epoch"}
    sink = _sink(postgres, table, schema_evolution="add-columns", **options)
    log = tmp_path / "txlog"
    coordinator = Coordinator([sink], log=str(log), app_id=APP)
    old = spark.createDataFrame([(i, f"n{i}") for i in range(4)], "id long, name string")
    rows = [(i, f"n{i}", f"note {i}") for i in range(4, 9)]
    new = spark.createDataFrame(rows, "id long, name string, note string")
    assert coordinator.write(old, epoch=0).status == "committed"
    assert coordinator.write(new, epoch=1).status == "committed"
    with postgres.connect() as conn:
        got = conn.execute(f"SELECT txsink_epoch, count(note) FROM {table} GROUP BY 1 ORDER BY 1")
        assert got.fetchall() == [(0, 0), (1, 5)]
    report = _audit(postgres, table, log, deep=True, **options)
    assert report.ok and [r.found for r in report.rows] == [4, 5], report.to_json()
    assert all(r.checksum == "ok" for r in report.rows)


def test_values_the_table_spells_otherwise_audit_clean_from_a_new_sink(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    """A table made by hand whose columns spell the values otherwise than the DataFrame
    (a double into ``numeric``, a date into ``timestamptz``): a sink built anew (as the CLI
    builds it, no start-up check) reads them back as the tasks had them, from the Arrow
    schema the decision records. Without that record the digest would compare a decimal
    with a double."""
    table = f"{postgres.new_schema('audit')}.spelled"
    _sql(
        postgres,
        f"CREATE TABLE {table} (id bigint, score numeric(10,4), day timestamptz, "
        "txsink_epoch bigint)",
    )
    log = tmp_path / "txlog"
    coordinator = Coordinator(
        [_sink(postgres, table, epoch_column="txsink_epoch")], log=str(log), app_id=APP
    )
    for epoch in range(2):
        rows = [(epoch * 10 + i, i / 4, dt.date(2026, 1, 1 + i)) for i in range(ROWS)]
        df = spark.createDataFrame(rows, "id long, score double, day date")
        assert coordinator.write(df, epoch=epoch).status == "committed"
    decision = open_log(str(log)).decision(0)
    assert decision is not None and decision.stats.get("schema")
    report = _audit(postgres, table, log, deep=True)
    assert report.ok, report.to_json()
    assert {r.checksum for r in report.rows} == {"ok"}
    _sql(postgres, f"UPDATE {table} SET score = score + 1 WHERE id = 12")
    row = _assert_only(_audit(postgres, table, log, deep=True), 1, checksum="differs")
    assert row.differences == ("checksum differs in column(s) score",)
