"""What Kafka would refuse after the decision is refused before it, against the real broker.

- a record's size as txsink counts it is the size the broker checks against the topic's
  ``max.message.bytes``, to the byte;
- a record larger than its topic takes (but below the producer's 1,000,000 bytes), in WAL,
  replay and direct mode, behind one coordinator with Postgres and S3 sinks: the epoch is
  aborted and nothing of it is visible anywhere (read back with psycopg, boto3 and a
  read_committed consumer), the error names sink, partition and row; restarted with the
  input fixed, every row lands exactly once;
- a ``partition_column`` outside the topic's partitions and a ``topic_column`` naming a
  missing topic are refused in the pre-commit, and an explicit ``max_record_bytes`` above
  the topic's limit at the check;
- many small records to a topic with a small limit commit: the producers' batches fit it.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cross import Cross
from readback import open_transactions, read_topic

from conftest import services_for
from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.records.limits import batch_size
from txsink.contract import EpochCommit
from txsink.errors import ConfigurationError, WriteError
from txsink.testing.inputs import input_epochs, make_input
from txsink.txid import TxnId

pytestmark = pytest.mark.kafka

LIMIT = 20_000  # the topic's max.message.bytes: far below txsink's old 1,000,000 default
SCHEMA = pa.schema(
    [("id", pa.int64()), ("key", pa.string()), ("amount", pa.float64()), ("payload", pa.string())]
)


def _set_topic_limit(kafka: Any, topic: str, limit: int) -> None:
    """``max.message.bytes`` on ``topic`` (a topic config: the shared broker is untouched),
    waited for until the broker describes it."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    admin = kafka.admin()
    entry = ConfigEntry(
        "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
    )
    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin.incremental_alter_configs([res])[res].result(timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        (future,) = got.values()
        if future.result(timeout=30)["max.message.bytes"].value == str(limit):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{topic}: max.message.bytes={limit} not applied")


# -- the size as the broker counts it -------------------------------------------------------


@pytest.mark.parametrize(("key", "value"), [(None, 1_000), (20, 5_000), (3, 130)])
def test_record_size_is_what_the_broker_checks(kafka: Any, key: int | None, value: int) -> None:
    """A topic whose limit is exactly the computed size takes the record; one byte less
    refuses it (uncompressed, one record per batch)."""
    from confluent_kafka import KafkaError, Producer

    size = batch_size(key, value)
    outcomes: dict[int, Any] = {}
    for limit in (size, size - 1):
        topic = kafka.new_topic(1, config={"max.message.bytes": str(limit)})
        producer = Producer(kafka.config(**{"compression.type": "none", "linger.ms": 0}))
        errors: list[Any] = []

        def delivered(err: Any, _msg: Any, seen: list[Any] = errors) -> None:
            seen.append(err)

        producer.produce(
            topic,
            value=b"v" * value,
            key=None if key is None else b"k" * key,
            on_delivery=delivered,
        )
        producer.flush(30)
        outcomes[limit] = errors[0]
    assert outcomes[size] is None
    assert outcomes[size - 1].code() == KafkaError.MSG_SIZE_TOO_LARGE


# -- one oversized record, three targets, three modes ---------------------------------------

ROWS, FILES = 120, 3
BIG_ID = 50  # in epoch 1 (ids 40-79)


def _write_input(folder: Path, big: bool) -> None:
    """``make_input``'s files; with ``big`` the row ``BIG_ID`` carries a 30 kB payload
    (its Kafka value is larger than the topic's 20,000 bytes, far below 1,000,000), of
    random hex digits: LZ4 (the producer's codec) cannot shrink it below the limit, so the
    broker itself refuses it too."""
    if not folder.exists():
        make_input(folder, ROWS, FILES)
    path = folder / "input-0001.parquet"
    stamp = path.stat().st_mtime  # the file stays epoch 1
    table = pq.read_table(path)
    payload = [
        (random.Random(i).randbytes(15_000).hex() if big and i == BIG_ID else f"event-{i:09d}")
        for i in table.column("id").to_pylist()
    ]
    table = table.set_column(3, "payload", pa.array(payload))
    pq.write_table(table, path)
    os.utime(path, (stamp, stamp))


def _postgres_ids(cross: Cross) -> list[int]:
    import psycopg
    from psycopg import sql

    target = cross.targets["postgres"]
    schema, table = str(target.spec["table"]).split(".")
    with psycopg.connect(target.env["TXSINK_PG_DSN"], autocommit=True) as conn:
        rows = conn.execute(sql.SQL("SELECT id FROM {}").format(sql.Identifier(schema, table)))
        return [int(r[0]) for r in rows]


def _ours_prepared(cross: Cross) -> int:
    import psycopg

    target = cross.targets["postgres"]
    with psycopg.connect(target.env["TXSINK_PG_DSN"], autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s",
            (f"%{target.uid}%",),
        ).fetchone()
    return int(row[0]) if row else 0


def _s3_keys_and_uploads(cross: Cross) -> tuple[list[str], int]:
    import boto3

    target = cross.targets["s3"]
    bucket, _, prefix = str(target.spec["url"]).removeprefix("s3://").partition("/")
    env = target.env
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=env["TXSINK_S3_ENDPOINT"],
        aws_access_key_id=env.get("TXSINK_S3_ACCESS_KEY") or None,
        aws_secret_access_key=env.get("TXSINK_S3_SECRET_KEY") or None,
        region_name=env.get("TXSINK_S3_REGION") or "us-east-1",
    )
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
    return keys, len(uploads)


def _kafka_ids(cross: Cross) -> list[int]:
    target = cross.targets["kafka"]
    topic = str(target.spec["topic"])
    bootstrap = target.env["TXSINK_KAFKA_BOOTSTRAP"]
    assert open_transactions(bootstrap, topic) == 0
    return [int(json.loads(r.value or b"null")["id"]) for r in read_topic(bootstrap, topic)]


@pytest.mark.spark
@pytest.mark.postgres
@pytest.mark.s3
@pytest.mark.parametrize("mode", ["wal", "replay", "direct"])
def test_oversized_record_aborts_the_epoch_in_every_target(
    spark: Any, request: pytest.FixtureRequest, kafka: Any, tmp_path: Path, mode: str
) -> None:
    from pyspark.errors import StreamingQueryException

    from tests.streaming import release, start_query

    connectors = ["kafka", "postgres", "s3"]
    options = {"kafka": {"mode": mode, **({"shards": 8} if mode == "direct" else {})}}
    cross = Cross.create(connectors, services_for(request, connectors), tmp_path, options)
    request.addfinalizer(cross.drop)
    topic = str(cross.targets["kafka"].spec["topic"])
    _set_topic_limit(kafka, topic, LIMIT)
    _write_input(tmp_path / "input", big=True)
    epochs = input_epochs(tmp_path / "input")

    def by_key(df: Any) -> Any:  # a stable partitioning (hash of the key) in every mode
        return df.repartition(2, "key")

    coordinator = cross.coordinator()
    query = start_query(spark, tmp_path, coordinator, transform=by_key)
    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination()
    release(coordinator)
    message = str(info.value)
    assert f"sink_uid={cross.targets['kafka'].uid}" in message, message
    assert "epoch=1" in message and "partition=" in message, message
    assert re.search(r"\(row key \w+=.+ at partition \d+, offset \d+\)", message), message
    assert f"max.message.bytes={LIMIT}" in message, message

    # Epoch 0 is committed everywhere, nothing of epoch 1 anywhere, nothing left open.
    assert sorted(_kafka_ids(cross)) == epochs[0]
    assert sorted(_postgres_ids(cross)) == epochs[0]
    assert _ours_prepared(cross) == 0
    keys, uploads = _s3_keys_and_uploads(cross)
    assert uploads == 0 and not [k for k in keys if "epoch=1/" in k], keys

    # The input fixed (the same file, the same ids): every row once, everywhere.
    _write_input(tmp_path / "input", big=False)
    coordinator = cross.coordinator()
    start_query(spark, tmp_path, coordinator, transform=by_key).awaitTermination()
    release(coordinator)
    assert sorted(_kafka_ids(cross)) == list(range(ROWS))
    assert sorted(_postgres_ids(cross)) == list(range(ROWS))
    assert _ours_prepared(cross) == 0
    bad = {name: v for name, v in cross.verdicts(ROWS).items() if not v.ok}
    assert not bad, bad


# -- topic_column, partition_column, max_record_bytes: the hooks, without Spark ------------


def _uid() -> str:
    return "k" + uuid.uuid4().hex[:10]


def _batch(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def test_partition_outside_the_topic_is_refused_in_the_precommit(
    kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(3)
    schema = pa.schema([("id", pa.int64()), ("p", pa.int32())])
    sink = KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal=tmp_path / "wal", partition_column="p")
    sink.check(schema, "app")
    open_ = sink.begin(TxnId("app", sink.uid, 0, 0, 1, 0), schema)
    sink.write(open_, _batch([{"id": i, "p": i % 3} for i in range(6)], schema))
    with pytest.raises(WriteError) as info:
        sink.write(open_, _batch([{"id": 6, "p": 2}, {"id": 7, "p": 3}], schema))
    err = info.value
    assert err.row is not None and not isinstance(err.row, int)
    assert (err.row.offset, err.column, err.partition) == (7, "p", 1)
    assert f"partition 3 is not a partition of topic {topic!r}, which has 3" in str(err)
    sink.discard(open_)


def test_topic_column_naming_a_missing_topic_is_refused_in_the_precommit(
    kafka: Any, tmp_path: Path
) -> None:
    there = kafka.new_topic(1)
    small = kafka.new_topic(1, config={"max.message.bytes": str(LIMIT)})
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    schema = pa.schema([("id", pa.int64()), ("t", pa.string()), ("v", pa.string())])
    sink = KafkaSink(
        kafka.bootstrap, None, uid=_uid(), wal=tmp_path / "wal", topic_column="t", value="v"
    )
    sink.check(schema, "app")
    open_ = sink.begin(TxnId("app", sink.uid, 0, 0, 0, 0), schema)
    sink.write(open_, _batch([{"id": 0, "t": there, "v": "x" * 30_000}], schema))
    with pytest.raises(WriteError) as info:
        sink.write(
            open_,
            _batch([{"id": 1, "t": there, "v": "a"}, {"id": 2, "t": missing, "v": "b"}], schema),
        )
    assert _offset(info.value) == 2 and info.value.column == "t"
    assert f"topic {missing!r} does not exist" in str(info.value)
    # Each topic's own limit: 30 kB fits the first topic, not the small one.
    with pytest.raises(WriteError) as info:
        sink.write(open_, _batch([{"id": 3, "t": small, "v": "x" * 30_000}], schema))
    assert _offset(info.value) == 1 and info.value.column == "v"
    assert f"topic {small!r} max.message.bytes={LIMIT}" in str(info.value)
    sink.discard(open_)


def test_max_record_bytes_above_the_topics_limit_is_refused_at_the_check(
    kafka: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(1, config={"max.message.bytes": str(LIMIT)})
    sink = KafkaSink(
        kafka.bootstrap, topic, uid=_uid(), wal=tmp_path / "wal", max_record_bytes=100_000
    )
    with pytest.raises(ConfigurationError, match=f"Lower max_record_bytes to at most {LIMIT}"):
        sink.check(SCHEMA, "app")


def test_many_small_records_commit_to_a_topic_with_a_small_limit(
    kafka: Any, tmp_path: Path
) -> None:
    """The broker checks each batch against the topic's limit: the producers' batches must
    fit it, not only each record (WAL mode: the commit produces 400 records of 600 bytes
    at once, 240 kB in one transaction)."""
    topic = kafka.new_topic(1, config={"max.message.bytes": str(LIMIT)})
    sink = KafkaSink(
        kafka.bootstrap,
        topic,
        uid=_uid(),
        wal=tmp_path / "wal",
        value="payload",
        producer_config={"compression.type": "none", "linger.ms": 50},
    )
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", sink.uid, 0, 0, 0, 0), SCHEMA)
    rows = [{"id": i, "key": "k", "amount": 0.0, "payload": f"{i:06d}" * 100} for i in range(400)]
    sink.write(open_, _batch(rows, SCHEMA))
    handle = sink.prepare(open_)
    sink.commit_epoch(EpochCommit(0, (handle,), on_committed=lambda _h: None))
    sink.release()
    assert len(read_topic(kafka.bootstrap, topic)) == 400
    assert open_transactions(kafka.bootstrap, topic) == 0


def _offset(err: WriteError) -> int | None:
    """The refused row's offset in its partition (rows are named by identity: RowRef)."""
    row = err.row
    return row if isinstance(row, int) or row is None else row.offset
