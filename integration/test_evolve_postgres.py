"""Schema evolution into PostgreSQL (issue #41): an epoch whose DataFrame gains a column adds
it to the table in the commit that makes the epoch's rows visible, in both commit protocols
(a two-phase-commit sink stages an evolving epoch); ``strict`` and the widenings a table
cannot take are refused before anything is written; crash points on the evolving epoch.

Every check reads the server back with psycopg queries of its own (``information_schema``,
the table, ``pg_prepared_xacts``, the staging tables by name pattern), never through the
sink.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink import Coordinator
from txsink.connectors.postgres import PostgresSink
from txsink.connectors.postgres.testing import staged_names
from txsink.errors import ConfigurationError
from txsink.protocol.faults import FaultPlan
from txsink.schema import SchemaChange, SchemaEvolutionError, diff

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

OLD = "id long, amount decimal(10,2), name string"
NEW = OLD + ", note string"
APP = "evo"


def _table(server: Any, ddl: str = "id bigint, amount numeric(10,2), name text") -> str:
    schema = server.new_schema("evo")
    with server.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.events ({ddl})")
    return f"{schema}.events"


def _sink(server: Any, table: str, **options: Any) -> PostgresSink:
    options.setdefault("schema_evolution", "add-columns")
    return PostgresSink(server.dsn, table, uid="evo", stall_timeout_s=20, **options)


def _old(spark: Any, ids: range) -> Any:
    rows = [(i, Decimal(i) / 4, f"n{i}") for i in ids]
    return spark.createDataFrame(rows, OLD)


def _new(spark: Any, ids: range) -> Any:
    rows = [(i, Decimal(i) / 4, f"n{i}", f"note {i}") for i in ids]
    return spark.createDataFrame(rows, NEW)


def _columns(server: Any, table: str) -> list[tuple[str, str]]:
    schema, name = table.split(".")
    with server.connect() as conn:
        rows = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (schema, name),
        ).fetchall()
    return [(str(c), str(t)) for c, t in rows]


def _rows(server: Any, table: str, columns: str = "id") -> list[tuple[Any, ...]]:
    with server.connect() as conn:
        return [tuple(r) for r in conn.execute(f"SELECT {columns} FROM {table} ORDER BY id")]


def _leftovers(server: Any, table: str) -> list[str]:
    with server.connect() as conn:
        staged = staged_names(conn, table, "txsink.")
        prepared = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"txsink.{APP}.",)
        ).fetchall()
    return staged + [str(r[0]) for r in prepared]


def _coordinator(server: Any, table: str, tmp: Path, **options: Any) -> Coordinator:
    faults = options.pop("faults", None)
    sink = _sink(server, table, **options)
    return Coordinator([sink], log=str(tmp / "txlog"), app_id=APP, faults=faults)


def _assert_evolved(server: Any, table: str, old: range, new: range) -> None:
    """The column is there exactly with the evolving epoch's rows, each row once; a reader
    that is not txsink's reads old rows (NULL note) and new ones."""
    assert ("note", "text") in _columns(server, table)
    got = _rows(server, table, "id, amount, name, note")
    assert [r[0] for r in got] == [*old, *new]
    assert all(r[3] is None for r in got if r[0] in old)
    assert all(r[3] == f"note {r[0]}" and r[1] == Decimal(r[0]) / 4 for r in got if r[0] in new)
    assert _leftovers(server, table) == []


@pytest.mark.parametrize("commit", ["2pc", "staging"])
def test_an_epoch_that_gains_a_column_adds_it_with_its_rows(
    spark: Any, postgres: Any, tmp_path: Path, commit: str
) -> None:
    table = _table(postgres)
    coordinator = _coordinator(postgres, table, tmp_path, commit=commit)
    coordinator.write(_old(spark, range(0, 10)), epoch=0)
    coordinator.write(_new(spark, range(10, 20)), epoch=1)
    _assert_evolved(postgres, table, range(0, 10), range(10, 20))
    # The next epoch of the new schema goes the sink's own way again (2pc: prepared).
    coordinator.write(_new(spark, range(20, 25)), epoch=2)
    assert [r[0] for r in _rows(postgres, table)] == list(range(25))
    assert _leftovers(postgres, table) == []


def test_strict_refuses_before_writing_naming_the_column_and_the_option(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    table = _table(postgres)
    coordinator = _coordinator(postgres, table, tmp_path, schema_evolution="strict")
    coordinator.write(_old(spark, range(0, 5)), epoch=0)
    with pytest.raises(SchemaEvolutionError) as info:
        coordinator.write(_new(spark, range(5, 10)), epoch=1)
    text = str(info.value)
    assert "note" in text and "schema_evolution='add-columns'" in text
    assert [c for c, _ in _columns(postgres, table)] == ["id", "amount", "name"]
    assert [r[0] for r in _rows(postgres, table)] == list(range(5))
    assert _leftovers(postgres, table) == []


def test_a_widened_integer_is_refused_naming_the_column(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    """int -> bigint rewrites the table under its ACCESS EXCLUSIVE lock: not in a commit."""
    table = _table(postgres, "id integer, amount numeric(10,2), name text")
    coordinator = _coordinator(postgres, table, tmp_path)
    rows = [(i, Decimal(i), "x") for i in range(3)]
    coordinator.write(spark.createDataFrame(rows, "id int, amount decimal(10,2), name string"), 0)
    with pytest.raises(SchemaEvolutionError) as info:
        coordinator.write(_old(spark, range(3, 6)), epoch=1)
    text = str(info.value)
    assert "widens id int32 -> int64" in text and "its target takes: add" in text
    assert _columns(postgres, table)[0] == ("id", "integer")
    assert [r[0] for r in _rows(postgres, table)] == [0, 1, 2]


def test_a_dataframe_accepted_before_compares_as_no_change(postgres: Any) -> None:
    """Narrower ints, ints into numeric/double/text, timestamps with a time zone: the
    table's Arrow schema leaves them to the sink's own check, as before evolution."""
    table = _table(
        postgres,
        "id bigint NOT NULL, amount numeric(10,2), ratio double precision, name text NOT NULL, "
        "at timestamptz, day date, tags text[], doc jsonb, code varchar(8)",
    )
    sink = _sink(postgres, table)
    target = sink.target_schema(APP)
    assert target is not None
    incoming = pa.schema(
        [
            ("id", pa.int32()),
            ("amount", pa.int64()),
            ("ratio", pa.int32()),
            ("name", pa.int64()),
            ("at", pa.timestamp("us", tz="Europe/Paris")),
            ("day", pa.date32()),
            ("tags", pa.list_(pa.string())),
            ("doc", pa.struct([("a", pa.int64())])),
            ("code", pa.string()),
        ]
    )
    found = diff(target, incoming)
    assert found.changes == () and found.refusals == ()
    sink.check(incoming, APP)  # and the sink accepts it, as before
    sink.release()


def _change(sink: PostgresSink, table_schema: pa.Schema) -> SchemaChange:
    target = sink.target_schema(APP)
    assert target is not None
    found = diff(target, table_schema)
    return SchemaChange(sink.uid, target, found.merged, found.changes)


def test_prepare_evolution_refuses_what_alter_table_would(postgres: Any) -> None:
    """A name too long for PostgreSQL, a system column's name, a table of another role
    (not the owner: ALTER TABLE needs it), a partition; each names the column and writes
    nothing."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    table = _table(postgres)
    schema = table.split(".")[0]
    sink = _sink(postgres, table, commit="staging")
    base = [("id", pa.int64()), ("amount", pa.decimal128(10, 2)), ("name", pa.string())]
    for name, match in (("n" * 64, "longer than"), ("xmin", "keeps for"), ("ok", "")):
        change = _change(sink, pa.schema([*base, (name, pa.string())]))
        if not match:
            sink.prepare_evolution(change, APP)
            continue
        with pytest.raises(SchemaEvolutionError, match=match) as info:
            sink.prepare_evolution(change, APP)
        assert info.value.context.get("column") == name
    admin_pw = Path(__file__).with_name(".work") / "postgres" / "admin-password"
    if not admin_pw.exists():
        pytest.skip("needs the harness's own server (superuser password) to create a role")
    params = conninfo_to_dict(postgres.dsn)
    admin = make_conninfo("", **{**params, "user": "postgres", "password": admin_pw.read_text()})
    role = f"evo_{schema}"[:60]
    with postgres.connect(dsn=admin) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'evo'")
        conn.execute(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT, INSERT ON {table} TO {role}")
    try:
        dsn = make_conninfo("", **{**params, "user": role, "password": "evo"})
        other = PostgresSink(dsn, table, uid="evo", schema_evolution="add-columns")
        change = _change(other, pa.schema([*base, ("note", pa.string())]))
        with pytest.raises(SchemaEvolutionError, match=r"needs its owner.*GRANT") as info:
            other.prepare_evolution(change, APP)
        assert info.value.context.get("column") == "note"
        other.release()
    finally:
        with postgres.connect(dsn=admin) as conn:
            conn.execute(f"DROP OWNED BY {role} CASCADE")
            conn.execute(f"DROP ROLE IF EXISTS {role}")
    assert [c for c, _ in _columns(postgres, table)] == ["id", "amount", "name"]
    sink.release()


def test_the_staging_table_takes_the_new_columns_and_the_target_waits(postgres: Any) -> None:
    """Before the epoch only the staging table changes; a column an aborted epoch brought as
    another type is made again (the staging table is empty)."""
    table = _table(postgres)
    sink = _sink(postgres, table, commit="2pc")
    base = [("id", pa.int64()), ("amount", pa.decimal128(10, 2)), ("name", pa.string())]
    for arrow, pg_type in ((pa.string(), "text"), (pa.int64(), "bigint")):
        sink.prepare_evolution(_change(sink, pa.schema([*base, ("note", arrow)])), APP)
        sink.check(pa.schema(base), APP)
        with postgres.connect() as conn:
            row = conn.execute(
                "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                "to_regclass(%s) AND attname = 'note' AND NOT attisdropped",
                (sink.staging.regclass,),
            ).fetchone()
        assert row == (pg_type,)
        assert [c for c, _ in _columns(postgres, table)] == ["id", "amount", "name"]
    sink.release()


def test_a_two_phase_commit_sink_on_a_table_with_a_unique_index_is_refused(
    postgres: Any,
) -> None:
    """Its evolving epoch would be staged, and a unique index could refuse the move."""
    table = _table(postgres, "id bigint PRIMARY KEY, amount numeric(10,2), name text")
    sink = _sink(postgres, table, commit="2pc")
    base = [("id", pa.int64()), ("amount", pa.decimal128(10, 2)), ("name", pa.string())]
    change = _change(sink, pa.schema([*base, ("note", pa.string())]))
    with pytest.raises(SchemaEvolutionError, match="unique index") as info:
        sink.prepare_evolution(change, APP)
    assert "ADD COLUMN) with the query stopped" in str(info.value)
    assert isinstance(info.value, ConfigurationError)
    sink.release()


def test_upsert_evolves_through_the_staging_move(spark: Any, postgres: Any, tmp_path: Path) -> None:
    table = _table(postgres, "id bigint PRIMARY KEY, amount numeric(10,2), name text")
    coordinator = _coordinator(postgres, table, tmp_path, mode="upsert", key=["id"])
    coordinator.write(_old(spark, range(0, 10)), epoch=0)
    coordinator.write(_new(spark, range(5, 15)), epoch=1)
    got = _rows(postgres, table, "id, note")
    assert [r[0] for r in got] == list(range(15))
    assert [r[1] for r in got] == [None] * 5 + [f"note {i}" for i in range(5, 15)]
    assert _leftovers(postgres, table) == []


# -- crash points on the evolving epoch --------------------------------------------------


@pytest.mark.parametrize(
    ("point", "commit"),
    [
        ("before_decision", "2pc"),
        ("after_decision", "2pc"),
        pytest.param("during_commit", "staging", marks=pytest.mark.slow),
        pytest.param("after_decision", "staging", marks=pytest.mark.slow),
        pytest.param("during_commit", "2pc", marks=pytest.mark.slow),
        pytest.param("before_decision", "staging", marks=pytest.mark.slow),
    ],
)
def test_a_crash_on_the_evolving_epoch(
    spark: Any, postgres: Any, tmp_path: Path, point: str, commit: str
) -> None:
    """The crash leaves no column before the decision (and nothing staged or prepared once
    the next run recovers); after it, the next run's recovery adds the column with the
    epoch's rows, once, and the replay writes nothing twice."""
    table = _table(postgres)
    plan = FaultPlan.parse(f"{point}:raise@1", str(tmp_path / "faults"))
    first = _coordinator(postgres, table, tmp_path, commit=commit, faults=plan)
    first.write(_old(spark, range(0, 10)), epoch=0)
    with pytest.raises(Exception, match="InjectedFault"):
        first.write(_new(spark, range(10, 20)), epoch=1)
    if point == "before_decision":
        assert ("note", "text") not in _columns(postgres, table)
        assert [r[0] for r in _rows(postgres, table)] == list(range(10))
    again = _coordinator(postgres, table, tmp_path, commit=commit)
    again.write(_new(spark, range(10, 20)), epoch=1)
    _assert_evolved(postgres, table, range(0, 10), range(10, 20))
    again.write(_new(spark, range(20, 22)), epoch=2)
    assert [r[0] for r in _rows(postgres, table)] == list(range(22))


_DRIVER = """
import sys
from decimal import Decimal

from txsink import Coordinator
from txsink.connectors.postgres import PostgresSink
from txsink.protocol.faults import FaultPlan
from txsink.spark.localspark import local_spark

dsn, table, log, state, commit = sys.argv[1:]
spark = local_spark("local[2,2]", "evo-driver")
sink = PostgresSink(dsn, table, uid="evo", commit=commit, schema_evolution="add-columns")
plan = FaultPlan.parse("after_decision:kill-driver@1", state)
coordinator = Coordinator([sink], log=log, app_id="evo", faults=plan)
old = [(i, Decimal(i) / 4, f"n{i}") for i in range(0, 10)]
coordinator.write(spark.createDataFrame(old, OLD_SCHEMA), epoch=0)
new = [(i, Decimal(i) / 4, f"n{i}", f"note {i}") for i in range(10, 20)]
coordinator.write(spark.createDataFrame(new, NEW_SCHEMA), epoch=1)
print("the driver survived its kill")
"""


@pytest.mark.parametrize("commit", ["2pc", pytest.param("staging", marks=pytest.mark.slow)])
def test_a_driver_killed_after_the_decision_of_the_evolving_epoch(
    spark: Any, postgres: Any, tmp_path: Path, commit: str
) -> None:
    """SIGKILL of the driver process between the decision and the commit of the epoch that
    adds the column: the table has neither; the next driver's recovery adds both, once."""
    import subprocess
    import sys

    table = _table(postgres)
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER.replace("OLD_SCHEMA", repr(OLD)).replace("NEW_SCHEMA", repr(NEW)))
    log, state = str(tmp_path / "txlog"), str(tmp_path / "faults")
    done = subprocess.run(
        [sys.executable, str(script), postgres.dsn, table, log, state, commit],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == -9, done.stderr[-3000:]
    assert ("note", "text") not in _columns(postgres, table)
    assert [r[0] for r in _rows(postgres, table)] == list(range(10))
    again = _coordinator(postgres, table, tmp_path, commit=commit)
    again.write(_new(spark, range(10, 20)), epoch=1)
    _assert_evolved(postgres, table, range(0, 10), range(10, 20))


# -- a streaming query whose batches gain a column ---------------------------------------

ROWS, FILES, GAINS_AT = 400, 4, 2  # file i is epoch i; epochs from GAINS_AT have a note


class _Gaining:
    """foreachBatch: the coordinator, with ``note`` from epoch GAINS_AT on (by batch id, so
    a replay of an epoch has its schema); ``close`` closes the coordinator (the runner
    releases what a stopped query held, its lease's thread included)."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator

    def __call__(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        if batch_id >= GAINS_AT:
            df = df.withColumn("note", F.concat(F.lit("n"), F.col("id").cast("string")))
        self.coordinator(df, batch_id)

    def close(self) -> None:
        self.coordinator.close()


def _assert_gained(conn: Any, table: str) -> None:
    got = [tuple(r) for r in conn.execute(f"SELECT id, note FROM {table} ORDER BY id")]
    per = ROWS // FILES
    assert [r[0] for r in got] == list(range(ROWS))
    assert [r[1] for r in got] == [None] * (per * GAINS_AT) + [
        f"n{i}" for i in range(per * GAINS_AT, ROWS)
    ]


def test_a_streaming_query_gains_a_column_mid_stream_under_a_crash(
    spark: Any, postgres: Any, tmp_path: Path
) -> None:
    """No manual step: the table is created from the first batch, gains ``note`` in the
    epoch that brings it (which fails once after its decision), exactly-once."""
    from tests.streaming import prepare_input, run_until_done

    schema = postgres.new_schema("evs")
    table = f"{schema}.events"
    prepare_input(tmp_path, ROWS, FILES)
    plan = FaultPlan.parse(f"after_decision:raise@{GAINS_AT}", str(tmp_path / "faults"))

    def make() -> Any:
        sink = _sink(postgres, table, create_table=True)
        return _Gaining(Coordinator([sink], log=str(tmp_path / "txlog"), faults=plan))

    restarts, _ = run_until_done(spark, tmp_path, make)
    assert restarts == 1
    with postgres.connect() as conn:
        _assert_gained(conn, table)
    assert _leftovers(postgres, table) == []


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_decision", "during_commit"])
def test_the_server_killed_on_the_evolving_epoch(spark: Any, tmp_path: Path, point: str) -> None:
    """The PostgreSQL server SIGKILLed at ``point`` of the epoch that adds the column, and
    started again before the restart: its crash recovery keeps the staged rows (a logged
    table), and txsink's recovery adds the column with them, once."""
    import psycopg
    from crashable_targets import CrashablePostgres

    from tests.streaming import prepare_input, run_until_done
    from txsink.testing.hooks import PointHooks

    server = CrashablePostgres.create(max_prepared=50)
    try:
        prepare_input(tmp_path, ROWS, FILES)
        hooks = PointHooks(tmp_path / "hooks")
        hooks.at(point, server.kill, epoch=GAINS_AT)

        def make() -> Any:
            if not server.running():
                server.start()
            sink = PostgresSink(
                server.dsn,
                "public.events",
                uid="evo",
                create_table=True,
                stall_timeout_s=8,
                schema_evolution="add-columns",
            )
            log = str(tmp_path / "txlog")
            return _Gaining(Coordinator([sink], log=log, faults=hooks.plan(), outage_s=0))

        with hooks:
            restarts, _ = run_until_done(spark, tmp_path, make)
        assert server.kills == 1 and restarts >= 1
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            _assert_gained(conn, "public.events")
            assert staged_names(conn, "public.events", "txsink.") == []
            assert conn.execute("SELECT gid FROM pg_prepared_xacts").fetchall() == []
    finally:
        server.stop()
