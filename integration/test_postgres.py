"""PostgresSink against the real PostgreSQL server: hooks phase by phase, checks at start,
bad rows, upsert, and streaming queries under every crash point and mode."""

from __future__ import annotations

import datetime as dt
import decimal
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from psycopg import sql

from txsink.connectors.postgres import PostgresSink, redact_dsn
from txsink.errors import ConfigurationError, EpochAbortedError, WriteError
from txsink.protocol.faults import FaultPlan
from txsink.rowref import RowRef
from txsink.sink import Partitioning
from txsink.testing.verifiers import Verdict, count_ids
from txsink.txid import TxnId

pytestmark = pytest.mark.postgres
SCHEMA = pa.schema(
    [("id", pa.int64()), ("key", pa.string()), ("amount", pa.float64()), ("payload", pa.string())]
)
DDL = "CREATE TABLE {} (id bigint, key text, amount double precision, payload text)"


@pytest.fixture
def table(postgres: Any) -> tuple[str, str]:
    """A fresh schema with an ``events`` table; returns (qualified table, uid)."""
    schema = postgres.new_schema("tpg")
    with postgres.connect() as conn:
        conn.execute(sql.SQL(DDL).format(sql.Identifier(schema, "events")))
    return f"{schema}.events", schema


def _batch(ids: range, key: str = "k") -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": list(ids),
            "key": [key] * len(ids),
            "amount": [1.25] * len(ids),
            "payload": [f"p{i}" for i in ids],
        },
        schema=SCHEMA,
    )


def _rows(postgres: Any, query: str) -> list[tuple[Any, ...]]:
    with postgres.connect() as conn:
        return conn.execute(query).fetchall()  # type: ignore[no-any-return]


def _prepared(postgres: Any, uid: str) -> list[str]:
    return [g for (g,) in _rows(postgres, "SELECT gid FROM pg_prepared_xacts") if f".{uid}." in g]


# The sink contract (prepared is invisible, commit from a new driver verified by the
# progress row, abort idempotent, commit after abort refused) is the contract suite's, run
# for every connector by integration/test_contract.py; the crash matrix and the kill-driver
# run are integration/test_matrix.py's.


def test_discarded_transaction_rolls_back(postgres: Any, table: tuple[str, str]) -> None:
    name, uid = table
    sink = PostgresSink(postgres.dsn, name, uid=uid)
    sink.check(SCHEMA, "app")
    other = sink.begin(TxnId("app", uid, 0, 0, 1, 1), SCHEMA)
    sink.write(other, _batch(range(10)))
    sink.discard(other)  # an unprepared transaction just rolls back
    assert _rows(postgres, f"SELECT count(*) FROM {name}") == [(0,)]
    assert _prepared(postgres, uid) == []


def test_upsert_last_row_of_a_key_wins(postgres: Any) -> None:
    schema = postgres.new_schema("up")
    with postgres.connect() as conn:
        conn.execute(
            f"CREATE TABLE {schema}.kv (id bigint PRIMARY KEY, key text, amount "
            "double precision, payload text)"
        )
        conn.execute(f"INSERT INTO {schema}.kv VALUES (1, 'old', 0, 'old'), (99, 'keep', 0, 'x')")
    sink = PostgresSink(postgres.dsn, f"{schema}.kv", uid=schema, mode="upsert", key=["id"])
    sink.check(SCHEMA, "app")
    assert sink.required_partitioning() == Partitioning(("id",))
    open_ = sink.begin(TxnId("app", schema, 0, 0, 0, 0), SCHEMA)
    sink.write(open_, _batch(range(0, 5), key="first"))
    sink.write(open_, _batch(range(1, 3), key="second"))  # ids 1, 2 again: these win
    sink.commit(sink.prepare(open_))
    rows = dict(_rows(postgres, f"SELECT id, key FROM {schema}.kv"))
    assert rows == {0: "first", 1: "second", 2: "second", 3: "first", 4: "first", 99: "keep"}
    assert not _rows(postgres, "SELECT 1 FROM pg_tables WHERE tablename LIKE 'txsink_stage_%'")


def test_create_table_maps_types_and_round_trips(postgres: Any) -> None:
    schema = postgres.new_schema("ct")
    arrow = pa.schema(
        [
            ("id", pa.int64()),
            ("flag", pa.bool_()),
            ("small", pa.int16()),
            ("n", pa.int32()),
            ("price", pa.decimal128(12, 3)),
            ("ratio", pa.float32()),
            ("name", pa.string()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("local", pa.timestamp("us")),
            ("day", pa.date32()),
            ("blob", pa.binary()),
            ("tags", pa.list_(pa.string())),
            ("attrs", pa.map_(pa.string(), pa.int64())),
            ("point", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
        ]
    )
    sink = PostgresSink(postgres.dsn, f"{schema}.wide", uid=schema, create_table=True)
    sink.check(arrow, "app")
    types = dict(
        _rows(
            postgres,
            f"SELECT attname, format_type(atttypid, atttypmod) FROM "
            f"pg_attribute WHERE attrelid = '{schema}.wide'::regclass AND attnum > 0",
        )
    )
    assert types["price"] == "numeric(12,3)" and types["at"] == "timestamp with time zone"
    assert types["tags"] == "text[]" and types["attrs"] == "jsonb" and types["blob"] == "bytea"
    at = dt.datetime(2026, 11, 22, 1, 2, 3, 456789, tzinfo=dt.UTC)
    batch = pa.RecordBatch.from_pylist(
        [
            {
                "id": 1,
                "flag": True,
                "small": 2,
                "n": 3,
                "price": decimal.Decimal("12.345"),
                "ratio": 0.5,
                "name": "a",
                "at": at,
                "local": dt.datetime(2026, 1, 1),
                "day": dt.date(2026, 1, 2),
                "blob": b"\x00\xff",
                "tags": ["x", "y"],
                "attrs": [("k", 1)],
                "point": {"x": 1.0, "y": 2.0},
            },
            {"id": 2},  # every other column null
        ],
        schema=arrow,
    )
    open_ = sink.begin(TxnId("app", schema, 0, 0, 0, 0), arrow)
    sink.write(open_, batch)
    sink.commit(sink.prepare(open_))
    got = _rows(
        postgres, f"SELECT price, at, blob, tags, attrs, point, name FROM {schema}.wide ORDER BY id"
    )
    assert got[0] == (
        decimal.Decimal("12.345"),
        at,
        b"\x00\xff",
        ["x", "y"],
        {"k": 1},
        {"x": 1.0, "y": 2.0},
        "a",
    )
    assert got[1] == (None,) * 7


@pytest.mark.parametrize(
    ("ddl", "batch", "column", "row", "sqlstate"),
    [
        (
            "id bigint, key text NOT NULL, amount double precision, payload text",
            pa.RecordBatch.from_pydict(
                {
                    "id": [1, 2, 3],
                    "key": ["a", None, "c"],
                    "amount": [1.0] * 3,
                    "payload": ["x"] * 3,
                },
                schema=SCHEMA,
            ),
            "key",
            None,
            "23502",
        ),
        (
            "id bigint, key varchar(3), amount double precision, payload text",
            pa.RecordBatch.from_pydict(
                {
                    "id": [1, 2, 3],
                    "key": ["a", "b", "toolong"],
                    "amount": [1.0] * 3,
                    "payload": ["x"] * 3,
                },
                schema=SCHEMA,
            ),
            "key",
            2,
            "22001",
        ),
    ],
)
def test_bad_rows_name_sink_partition_and_column(
    postgres: Any, ddl: str, batch: pa.RecordBatch, column: str, row: int | None, sqlstate: str
) -> None:
    schema = postgres.new_schema("bad")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t ({ddl})")
    sink = PostgresSink(postgres.dsn, f"{schema}.t", uid=schema)
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", schema, 0, 0, 3, 0), SCHEMA)
    with pytest.raises(WriteError) as info:
        sink.write(open_, batch)
        sink.prepare(open_)
    err = info.value
    assert (err.sink_uid, err.partition, err.column) == (schema, 3, column)
    if row is not None:  # named by the first columns (no key), at its offset
        assert isinstance(err.row, RowRef) and err.row.offset == row
    assert sqlstate in str(err) and "nothing of this epoch was committed" in str(err)
    assert _prepared(postgres, schema) == []


def test_wrong_type_is_refused_at_start_and_at_copy(postgres: Any) -> None:
    schema = postgres.new_schema("wt")
    with postgres.connect() as conn:
        conn.execute(
            f"CREATE TABLE {schema}.t (id bigint, key integer, amount double precision, "
            "payload text)"
        )
    sink = PostgresSink(postgres.dsn, f"{schema}.t", uid=schema)
    with pytest.raises(ConfigurationError, match=r"'key' of .* is integer, which cannot take"):
        sink.check(SCHEMA, "app")
    # A task of a sink whose check did not pass plans from the table itself: refused too.
    with pytest.raises(ConfigurationError, match="is integer, which cannot take") as refused:
        sink.begin(TxnId("app", schema, 0, 0, 0, 0), SCHEMA)
    assert (refused.value.column, refused.value.phase) == ("key", "begin")
    # Past the check (the table changed meanwhile), the binary COPY names row and column.
    with postgres.connect() as conn:
        conn.execute(f"ALTER TABLE {schema}.t ALTER COLUMN key TYPE text")
    sink.check(SCHEMA, "app")
    with postgres.connect() as conn:
        conn.execute(f"ALTER TABLE {schema}.t ALTER COLUMN key TYPE integer USING NULL")
    open_ = sink.begin(TxnId("app", schema, 0, 0, 0, 0), SCHEMA)
    with pytest.raises(WriteError, match="changed after the sink's check") as info:
        sink.write(open_, _batch(range(3), key="abc"))
        sink.prepare(open_)
    assert (info.value.column, getattr(info.value.row, "offset", None)) == ("key", 0)
    assert _prepared(postgres, schema) == []


def test_start_checks_name_the_fix(postgres: Any) -> None:
    schema = postgres.new_schema("chk")
    with pytest.raises(ConfigurationError, match="does not exist: create it, or pass create_table"):
        PostgresSink(postgres.dsn, f"{schema}.missing", uid=schema).check(SCHEMA, "app")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t (id bigint, key text, must int NOT NULL)")
        conn.execute(
            f"CREATE TABLE {schema}.u (id bigint, key text, amount double precision, "
            "payload text, must int NOT NULL)"
        )
        conn.execute(
            f"CREATE TABLE {schema}.v (id bigint, key text, amount double precision, payload text)"
        )
    with pytest.raises(ConfigurationError, match="no column 'amount'"):
        PostgresSink(postgres.dsn, f"{schema}.t", uid=schema).check(SCHEMA, "app")
    with pytest.raises(ConfigurationError, match=r"'must' .* NOT NULL without a default"):
        PostgresSink(postgres.dsn, f"{schema}.u", uid=schema).check(SCHEMA, "app")
    with pytest.raises(ConfigurationError, match="unique index or primary key on exactly"):
        PostgresSink(postgres.dsn, f"{schema}.v", uid=schema, mode="upsert", key=["id"]).check(
            SCHEMA, "app"
        )


def test_secrets_stay_out_of_reprs_and_errors(postgres: Any) -> None:
    dsn = "postgresql://txsink:s3cret-pw@127.0.0.1:1/txsink?connect_timeout=2"
    sink = PostgresSink(dsn, "t", uid="s")
    assert "s3cret-pw" not in repr(sink) and "***" in redact_dsn(dsn)
    with pytest.raises(Exception) as info:
        sink.check(SCHEMA, "app")
    assert "s3cret-pw" not in str(info.value)


def test_old_prepared_transactions_are_reported(
    postgres: Any, table: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    name, uid = table
    sink = PostgresSink(postgres.dsn, name, uid=uid, prepared_age_warning_s=0)
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", uid, 0, 0, 0, 0), SCHEMA)
    sink.write(open_, _batch(range(3)))
    handle = sink.prepare(open_)
    with caplog.at_level(logging.WARNING, logger="txsink"):
        sink.check(SCHEMA, "app")
    assert any(
        str(handle.txn) in r.getMessage() and "blocks vacuum" in r.getMessage()
        for r in caplog.records
    )
    sink.abort(handle)


# -- streaming ---------------------------------------------------------------------------


def _verdict(postgres: Any, name: str, uid: str, rows: int) -> Verdict:
    ids = [r[0] for r in _rows(postgres, f"SELECT id FROM {name}")]
    return count_ids(range(rows), ids, lingering=len(_prepared(postgres, uid)))


def _pg_coordinator(
    postgres: Any, tmp: Path, name: str, uid: str, **options: Any
) -> Callable[[], Any]:
    from txsink import Coordinator

    def make() -> Any:
        sink = PostgresSink(
            postgres.dsn,
            name,
            uid=uid,
            mode=options.pop("mode", "append"),
            key=options.pop("key", ()),
        )
        return Coordinator([sink], log=str(tmp / "txlog"), **options)

    return make


@pytest.mark.spark
def test_streaming_upsert_under_crash(spark: Any, postgres: Any, tmp_path: Path) -> None:
    from tests.streaming import prepare_input, run_until_done

    schema = postgres.new_schema("ups")
    with postgres.connect() as conn:
        conn.execute(
            f"CREATE TABLE {schema}.kv (id bigint PRIMARY KEY, key text, amount "
            "double precision, payload text)"
        )
    prepare_input(tmp_path, 1000)
    plan = FaultPlan.parse("during_commit:raise@2", str(tmp_path / "faults"))
    restarts, _ = run_until_done(
        spark,
        tmp_path,
        _pg_coordinator(
            postgres, tmp_path, f"{schema}.kv", schema, mode="upsert", key=["id"], faults=plan
        ),
    )
    assert restarts == 1
    assert _rows(
        postgres, f"SELECT count(*), count(DISTINCT id), min(id), max(id) FROM {schema}.kv"
    ) == [(1000, 1000, 0, 999)]
    assert _prepared(postgres, schema) == []


@pytest.mark.spark
def test_streaming_bad_row_aborts_epoch(spark: Any, postgres: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from tests.streaming import prepare_input, run_until_done, start_query

    schema = postgres.new_schema("br")
    with postgres.connect() as conn:
        conn.execute(
            f"CREATE TABLE {schema}.t (id bigint, key text NOT NULL, amount double "
            "precision, payload text)"
        )
    prepare_input(tmp_path, 1000)
    make = _pg_coordinator(postgres, tmp_path, f"{schema}.t", schema)

    def poison(df: Any) -> Any:
        return df.withColumn("key", F.when(F.col("id") == 600, F.lit(None)).otherwise(F.col("key")))

    query = start_query(spark, tmp_path, make(), transform=poison)
    with pytest.raises(Exception) as info:
        query.awaitTermination()
    text = str(info.value)
    assert "EpochAbortedError" in text and f"sink_uid={schema}" in text and "column=key" in text
    assert "partition=" in text and "23502" in text
    assert _rows(postgres, f"SELECT count(*), max(id) FROM {schema}.t") == [(500, 499)]
    assert _prepared(postgres, schema) == []
    restarts, _ = run_until_done(
        spark, tmp_path, make, transform=lambda df: poison(df).fillna({"key": "fixed"})
    )
    assert restarts == 0
    assert _verdict(postgres, f"{schema}.t", schema, 1000).ok


@pytest.mark.postgres_stock
def test_no_two_phase_commit_server_is_refused_at_start_for_2pc(postgres_stock: Any) -> None:
    """The harness's second server, as PostgreSQL ships (max_prepared_transactions = 0):
    two-phase commit, asked for, is refused naming both fixes; the default (auto) takes the
    staging commit (integration/test_postgres_staging.py)."""
    sink = PostgresSink(postgres_stock.dsn, "t", uid="s", commit="2pc")
    with pytest.raises(ConfigurationError, match="max_prepared_transactions = 0") as info:
        sink.check(SCHEMA, "app")
    assert "commit='staging'" in str(info.value)


def test_epoch_aborted_error_is_exported() -> None:
    assert issubclass(EpochAbortedError, Exception)


def test_missing_privileges_are_named_at_start(postgres: Any, table: tuple[str, str]) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    admin_pw = Path(__file__).with_name(".work") / "postgres" / "admin-password"
    if not admin_pw.exists():
        pytest.skip("needs the harness's own server (superuser password) to create a role")
    name, uid = table
    params = conninfo_to_dict(postgres.dsn)
    admin = make_conninfo(
        "", **{**params, "user": "postgres", "password": admin_pw.read_text().strip()}
    )
    role = f"ro_{uid}"
    with postgres.connect(dsn=admin) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'ro'").format(sql.Identifier(role)))
        conn.execute(
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                sql.Identifier(uid), sql.Identifier(role)
            )
        )
        conn.execute(
            sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.Identifier(uid, "events"), sql.Identifier(role)
            )
        )
    try:
        ro = make_conninfo("", **{**params, "user": role, "password": "ro"})
        with pytest.raises(
            ConfigurationError, match=r"INSERT on table .*events \(.*\): GRANT INSERT ON TABLE"
        ):
            PostgresSink(ro, name, uid=uid).check(SCHEMA, "app")
        with postgres.connect(dsn=admin) as conn:
            conn.execute(
                sql.SQL("GRANT INSERT ON {} TO {}").format(
                    sql.Identifier(uid, "events"), sql.Identifier(role)
                )
            )
        with pytest.raises(
            ConfigurationError, match=r"CREATE on schema .* \(creates the progress table"
        ):
            PostgresSink(ro, name, uid=uid).check(SCHEMA, "app")
        # Created beforehand by someone who may, the table is enough without CREATE.
        PostgresSink(postgres.dsn, name, uid=uid).check(SCHEMA, "app")
        with postgres.connect(dsn=admin) as conn:
            conn.execute(
                sql.SQL("GRANT INSERT, SELECT, DELETE ON {} TO {}").format(
                    sql.Identifier(uid, "txsink_progress"), sql.Identifier(role)
                )
            )
        PostgresSink(ro, name, uid=uid).check(SCHEMA, "app")
    finally:
        with postgres.connect(dsn=admin) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_repeated_transaction_name_is_a_configuration_error(
    postgres: Any, table: tuple[str, str]
) -> None:
    """A new txsink log with an old app id and uid would repeat transaction names."""
    name, uid = table
    sink = PostgresSink(postgres.dsn, name, uid=uid)
    sink.check(SCHEMA, "app")
    txn = TxnId("app", uid, 0, 0, 0, 0)
    first = sink.begin(txn, SCHEMA)
    sink.write(first, _batch(range(3)))
    sink.commit(sink.prepare(first))
    again = sink.begin(txn, SCHEMA)
    sink.write(again, _batch(range(3)))
    with pytest.raises(ConfigurationError, match="already records a committed transaction"):
        sink.prepare(again)
    assert _rows(postgres, f"SELECT count(*) FROM {name}") == [(3,)]
    assert _prepared(postgres, uid) == []


def test_adapter_drop_target_rolls_back_prepared_and_drops_the_schema(
    postgres: Any, tmp_path: Path
) -> None:
    """The testing adapter's drop_target: a prepared transaction of the sink (holding a
    lock on the table) is rolled back first, so the DROP SCHEMA does not wait on it."""
    import uuid

    from txsink.connectors.postgres.testing import ADAPTER

    env = {"TXSINK_PG_DSN": postgres.dsn}
    spec = ADAPTER.new_target(tmp_path, f"drop_{uuid.uuid4().hex[:10]}", env)
    schema, uid = spec["table"].split(".")[0], spec["uid"]
    sink = ADAPTER.build_sink(spec, env)
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", uid, 0, 0, 0, 0), SCHEMA)
    sink.write(open_, _batch(range(3)))
    sink.prepare(open_)
    assert len(_prepared(postgres, uid)) == 1
    ADAPTER.drop_target(spec, env)
    assert _prepared(postgres, uid) == []
    assert _rows(postgres, f"SELECT 1 FROM pg_namespace WHERE nspname = '{schema}'") == []
    ADAPTER.drop_target(spec, env)  # gone already: nothing to do, no error
