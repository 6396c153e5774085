"""Checks before the stream starts, against the real servers: a missing table, a missing
schema (with ``create_table=True``), an unreachable server (a closed port) for Postgres,
Kafka and S3. Each is one clean error naming the sink, the phase and the fix, found before
the query starts (``Coordinator.check`` and ``txsink check``); the same failure at a first
batch is logged once at ERROR, as a txsink error, not a driver's.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from psycopg import sql

from txsink import Coordinator
from txsink.cli import main
from txsink.connectors.kafka import KafkaSink
from txsink.connectors.postgres import PostgresSink, redact_dsn
from txsink.connectors.s3 import S3Sink
from txsink.errors import ConfigurationError, RetryableError
from txsink.testing.inputs import INPUT_SCHEMA, make_input
from txsink.txid import TxnId

CHECK = {"phase": "check"}


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stream(spark: Any, tmp_path: Path) -> Any:
    make_input(tmp_path / "input", 10, 1)
    return spark.readStream.schema(INPUT_SCHEMA).parquet(str(tmp_path / "input"))


def _check(spark: Any, tmp_path: Path, sink: Any) -> ConfigurationError:
    """The error ``Coordinator.check`` raises for ``sink``; nothing was bound."""
    with pytest.raises(ConfigurationError) as caught:
        Coordinator([sink], log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert not (tmp_path / "log").exists()
    assert "\n" not in str(caught.value)
    return caught.value


def _cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], make_sink: str) -> list[str]:
    """``txsink check`` of a pipeline whose sink is ``make_sink``: its stderr lines (exit 1)."""
    job = tmp_path / "job.py"
    job.write_text(
        "from txsink import Coordinator\n"
        "from txsink.connectors.kafka import KafkaSink\n"
        "from txsink.connectors.postgres import PostgresSink\n"
        "from txsink.connectors.s3 import S3Sink\n\n"
        "def pipeline():\n"
        f"    return Coordinator([{make_sink}], log={str(tmp_path / 'cli-log')!r})\n"
    )
    code = main(["check", "--pipeline", f"{job}:pipeline", "--schema", INPUT_SCHEMA])
    out, err = capsys.readouterr()
    assert code == 1, out
    assert out.splitlines()[-1] == "txsink check: 1 of 5 checks failed"
    return err.splitlines()


# -- Postgres ------------------------------------------------------------------------------


@pytest.mark.postgres
def test_postgres_missing_table(
    spark: Any, tmp_path: Path, postgres: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    schema = postgres.new_schema("chk")
    err = _check(spark, tmp_path, PostgresSink(postgres.dsn, f"{schema}.orders", uid="orders"))
    assert str(err) == (
        f"[sink_uid=orders, phase=check, connector=postgres] table {schema}.orders does not "
        "exist: create it, or pass create_table=True to create it from the DataFrame's schema"
    )
    lines = _cli(tmp_path, capsys, f"PostgresSink({postgres.dsn!r}, '{schema}.orders', 'orders')")
    assert lines == [f"txsink check: {err}"]


@pytest.mark.postgres
def test_postgres_missing_schema_with_create_table(
    spark: Any, tmp_path: Path, postgres: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' own ``"sales.orders"`` on a server without schema ``sales``: a clean
    ConfigurationError saying to create the schema, not psycopg's InvalidSchemaName."""
    missing = f"nosuch_{tmp_path.name[-20:].lower().replace('-', '_')}"
    sink = PostgresSink(postgres.dsn, f"{missing}.orders", uid="orders", create_table=True)
    err = _check(spark, tmp_path, sink)
    assert err.context == {"sink_uid": "orders", "phase": "check", "connector": "postgres"}
    assert err.message.startswith(
        f"schema '{missing}' of table {missing}.orders does not exist: create it "
        f'(CREATE SCHEMA "{missing}")'
    )
    with postgres.connect() as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (missing,))
        assert found.fetchone() is None  # nothing created
    made = f"PostgresSink({postgres.dsn!r}, '{missing}.orders', 'orders', create_table=True)"
    assert _cli(tmp_path, capsys, made) == [f"txsink check: {err}"]


@pytest.mark.postgres
def test_postgres_unreachable_server(
    spark: Any, tmp_path: Path, postgres: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _closed_port()
    dsn = f"postgresql://txsink:s3cret-pw@127.0.0.1:{port}/txsink"
    err = _check(spark, tmp_path, PostgresSink(dsn, "public.orders", uid="orders"))
    assert err.context == {"sink_uid": "orders", "phase": "check", "connector": "postgres"}
    assert err.message.startswith(f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: ")
    assert "password=***" in err.message and "s3cret-pw" not in err.message
    assert "Check that the server is running and reachable at that host and port" in err.message
    lines = _cli(tmp_path, capsys, f"PostgresSink({dsn!r}, 'public.orders', 'orders')")
    assert len(lines) == 1 and "cannot connect to PostgreSQL" in lines[0]
    assert "s3cret-pw" not in lines[0]


@pytest.mark.postgres
def test_postgres_unreachable_in_a_task_stays_retryable(postgres: Any) -> None:
    dsn = f"postgresql://txsink:txsink@127.0.0.1:{_closed_port()}/txsink"
    sink = PostgresSink(dsn, "public.orders", uid="orders")
    with pytest.raises(RetryableError) as caught:
        sink.begin(TxnId("app", "orders", 3, 0, 1, 7), pa.schema([("id", pa.int64())]))
    assert caught.value.context == {
        "sink_uid": "orders",
        "epoch": 3,
        "partition": 1,
        "phase": "begin",
        "connector": "postgres",
    }


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR and record.name.startswith("txsink."):
            self.errors.append(record.getMessage())


@pytest.fixture
def txsink_errors() -> Iterator[_Records]:
    handler = _Records()
    logger = logging.getLogger("txsink")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.mark.postgres
def test_postgres_missing_schema_at_the_first_batch_is_one_clean_error_line(
    spark: Any, tmp_path: Path, postgres: Any, txsink_errors: _Records
) -> None:
    """Without the check before the start: the first batch fails with txsink's error,
    logged once at ERROR (the driver's InvalidSchemaName never reaches the user)."""
    sink = PostgresSink(postgres.dsn, "nosuch_first_batch.orders", uid="orders", create_table=True)
    query = (
        _stream(spark, tmp_path)
        .writeStream.foreachBatch(Coordinator([sink], log=tmp_path / "log"))
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="schema 'nosuch_first_batch'") as caught:
        query.awaitTermination()
    assert "InvalidSchemaName" not in str(caught.value)
    assert len(txsink_errors.errors) == 1
    assert txsink_errors.errors[0].startswith(
        "[uid=orders epoch=0] ConfigurationError: [sink_uid=orders, phase=check, "
        "connector=postgres] schema 'nosuch_first_batch' of table nosuch_first_batch.orders "
        "does not exist: create it"
    )


@pytest.mark.postgres
def test_postgres_check_passes_and_creates_only_the_table(
    spark: Any, tmp_path: Path, postgres: Any
) -> None:
    schema = postgres.new_schema("chk")
    sink = PostgresSink(postgres.dsn, f"{schema}.orders", uid="orders", create_table=True)
    results = Coordinator([sink], log=tmp_path / "log").check(_stream(spark, tmp_path))
    assert all(r.ok for r in results)
    with postgres.connect() as conn:
        count = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, "orders"))
        )
        assert count.fetchone() == (0,)


@pytest.mark.postgres
def test_postgres_check_warns_of_a_nullable_column_into_a_not_null_one(
    spark: Any, tmp_path: Path, postgres: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 35: the check passed, and the failure came only when a NULL arrived. A warning,
    not a refusal: a nullable Spark column often holds no NULL."""
    schema = postgres.new_schema("chk")
    with postgres.connect() as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint NOT NULL, key text NOT NULL DEFAULT '', "
                "amount double precision NOT NULL, payload text)"
            ).format(sql.Identifier(schema, "orders"))
        )
    sink = PostgresSink(postgres.dsn, f"{schema}.orders", uid="orders")
    # id: not nullable (range); key: nullable into NOT NULL with a default (COPY sends the
    # NULL: refused all the same); amount: a nullable expression; payload: a nullable column.
    df = spark.range(3).selectExpr(
        "id", "cast(null as string) AS key", "if(id > 5, null, 1.5D) AS amount", "'p' AS payload"
    )
    caplog.set_level(logging.WARNING, logger="txsink")
    results = Coordinator([sink], log=tmp_path / "log", app_id="app").check(df)
    assert all(r.ok for r in results)
    warned = [r.getMessage() for r in caplog.records if "is NOT NULL" in r.getMessage()]
    assert [w.split(" of ", 1)[0] for w in warned] == [
        "[uid=orders epoch=None] column 'key'",
        "[uid=orders epoch=None] column 'amount'",
    ], warned
    assert warned[0] == (
        f"[uid=orders epoch=None] column 'key' of {schema}.orders is NOT NULL, and the "
        "DataFrame's 'key' is nullable: a NULL in it refuses its epoch at pre-commit (before "
        "the decision, naming the row), and the query stops until it is fixed. If it may "
        "hold NULLs, filter them (df.where(col('key').isNotNull())) or fill a default "
        "(coalesce(col('key'), lit(...))) before the sink; else accept the risk"
    )


# -- Kafka ---------------------------------------------------------------------------------


@pytest.mark.kafka
def test_kafka_unreachable_broker(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    brokers = f"127.0.0.1:{_closed_port()}"
    sink = KafkaSink(brokers, "orders", uid="orders", wal=str(tmp_path / "wal"), timeout_s=3)
    err = _check(spark, tmp_path, sink)
    assert err.context == {"sink_uid": "orders", "phase": "check", "connector": "kafka"}
    assert err.message.startswith(f"cannot list the topics at {brokers}: ")
    assert "(_TRANSPORT); the brokers cannot be reached: check bootstrap_servers" in err.message
    wal = str(tmp_path / "wal2")
    lines = _cli(
        tmp_path, capsys, f"KafkaSink({brokers!r}, 'o', 'orders', wal={wal!r}, timeout_s=3)"
    )
    assert len(lines) == 1 and "the brokers cannot be reached" in lines[0]


@pytest.mark.kafka
def test_kafka_missing_topic(spark: Any, tmp_path: Path, kafka: Any) -> None:
    sink = KafkaSink(kafka.bootstrap, "no-such-topic", uid="orders", wal=str(tmp_path / "wal"))
    err = _check(spark, tmp_path, sink)
    assert str(err) == (
        "[sink_uid=orders, phase=check, connector=kafka] topic 'no-such-topic' does not exist: "
        "create it (txsink does not create data topics, their partitions and retention are "
        "yours to choose)"
    )


# -- S3 ------------------------------------------------------------------------------------


def _s3_options(s3: Any, endpoint: str | None = None) -> dict[str, Any]:
    from botocore.config import Config

    return {
        "endpoint_url": endpoint or s3.endpoint,
        "aws_access_key_id": s3.access_key,
        "aws_secret_access_key": s3.secret_key,
        "region_name": s3.region,
        "config": Config(retries={"max_attempts": 1}, connect_timeout=2),
    }


@pytest.mark.s3
def test_s3_unreachable_endpoint(
    spark: Any, tmp_path: Path, s3: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    sink = S3Sink("s3://orders/out", "orders", client_options=_s3_options(s3, endpoint))
    err = _check(spark, tmp_path, sink)
    assert err.context == {"sink_uid": "orders", "phase": "check", "connector": "s3"}
    assert f"at {endpoint}: EndpointConnectionError" in err.message
    assert err.message.endswith(
        "The endpoint cannot be reached: check endpoint_url (or AWS_ENDPOINT_URL_S3), the "
        "network and the server"
    )
    assert s3.secret_key not in err.message
    options = {
        "endpoint_url": endpoint,
        "region_name": s3.region,
        "aws_access_key_id": s3.access_key,
        "aws_secret_access_key": s3.secret_key,
    }
    lines = _cli(
        tmp_path, capsys, f"S3Sink('s3://orders/out', 'orders', client_options={options!r})"
    )
    assert len(lines) == 1
    assert lines[0].startswith("txsink check: [sink_uid=orders, phase=check, connector=s3] ")
    assert "The endpoint cannot be reached" in lines[0] and s3.secret_key not in lines[0]


@pytest.mark.s3
def test_s3_missing_bucket(spark: Any, tmp_path: Path, s3: Any) -> None:
    sink = S3Sink("s3://no-such-bucket-chk/out", "orders", client_options=_s3_options(s3))
    err = _check(spark, tmp_path, sink)
    assert err.context == {"sink_uid": "orders", "phase": "check", "connector": "s3"}
    assert "The bucket 'no-such-bucket-chk' does not exist at this endpoint: create it" in str(err)
