"""KafkaSink (WAL mode) against the real Kafka broker, read back with read_committed."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from readback import open_transactions, read_topic

from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka import direct as direct_pool
from txsink.connectors.kafka.readback import delete_topic
from txsink.contract import EpochCommit
from txsink.errors import CommitError, ConfigurationError, FencedError, WriteError
from txsink.handles import dump_handle, load_handle
from txsink.protocol.faults import FaultPlan
from txsink.testing.verifiers import Verdict, count_ids
from txsink.txid import TxnId

pytestmark = pytest.mark.kafka
SCHEMA = pa.schema(
    [("id", pa.int64()), ("key", pa.string()), ("amount", pa.float64()), ("payload", pa.string())]
)


def _uid() -> str:
    return "k" + uuid.uuid4().hex[:10]


def _batch(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": list(ids),
            "key": [f"k{i % 7}" for i in ids],
            "amount": [0.5] * len(ids),
            "payload": [f"p{i}" for i in ids],
        },
        schema=SCHEMA,
    )


def _ids(kafka: Any, topic: str) -> list[int]:
    return [json.loads(r.value or b"null")["id"] for r in read_topic(kafka.bootstrap, topic)]


def _prepared_one(sink: KafkaSink, app: str, epoch: int, partition: int, ids: range) -> Any:
    open_ = sink.begin(TxnId(app, sink.uid, epoch, 0, partition, partition), SCHEMA)
    sink.write(open_, _batch(ids))
    return sink.prepare(open_)


def _commit(sink: KafkaSink, epoch: int, handles: list[Any]) -> list[list[Any]]:
    """``commit_epoch`` as the coordinator calls it; the units it reported committed."""
    units: list[list[Any]] = []
    sink.commit_epoch(EpochCommit(epoch, tuple(handles), on_committed=lambda h: units.append([*h])))
    return units


def test_commit_is_visible_once_and_idempotent(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(3)
    uid = _uid()
    sink = KafkaSink(kafka.bootstrap, topic, uid=uid, wal=tmp_path / "wal", key="key", shards=2)
    sink.check(SCHEMA, "app")
    handles = [_prepared_one(sink, "app", 0, p, range(p * 100, p * 100 + 100)) for p in range(3)]
    assert _ids(kafka, topic) == []  # prepared = in the WAL, nothing in Kafka
    assert sorted(h.txn for h in sink.list_prepared("app")) == sorted(h.txn for h in handles)
    restored = [load_handle(json.loads(json.dumps(dump_handle(h)))) for h in handles]
    units = _commit(sink, 0, restored)
    # One unit per shard (partition % shards), reported after its transaction committed.
    assert [[h.txn.partition for h in unit] for unit in units] == [[0, 2], [1]]
    assert sorted(_ids(kafka, topic)) == list(range(300))
    assert len(_commit(sink, 0, restored)) == 2  # the same driver again: verified, reported
    fresh = KafkaSink(kafka.bootstrap, topic, uid=uid, wal=tmp_path / "wal", key="key", shards=2)
    fresh.check(SCHEMA, "app")
    _commit(fresh, 0, restored)  # a new driver: reads the marker
    records = read_topic(kafka.bootstrap, topic)
    assert sorted(json.loads(r.value)["id"] for r in records) == list(range(300))  # type: ignore[arg-type]
    assert {r.key for r in records} == {f"k{i}".encode() for i in range(7)}
    assert list(sink.list_prepared("app")) == []
    assert open_transactions(kafka.bootstrap, topic) == 0


def test_oversized_record_is_refused_before_the_decision(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(1)
    sink = KafkaSink(
        kafka.bootstrap,
        topic,
        uid=_uid(),
        wal=tmp_path / "wal",
        value="payload",
        max_record_bytes=1000,
    )
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", sink.uid, 0, 0, 2, 0), SCHEMA)
    sink.write(open_, _batch(range(5)))
    big = pa.RecordBatch.from_pydict(
        {"id": [5, 6], "key": ["a", "b"], "amount": [1.0, 1.0], "payload": ["x", "y" * 5000]},
        schema=SCHEMA,
    )
    with pytest.raises(WriteError) as info:
        sink.write(open_, big)
    err = info.value
    assert (getattr(err.row, "offset", None), err.column, err.partition) == (6, "payload", 2)
    assert "larger than max_record_bytes=1000" in str(err)


def test_zombie_producer_is_fenced_and_its_transaction_aborted(kafka: Any, tmp_path: Path) -> None:
    from confluent_kafka import KafkaException, Producer

    topic = kafka.new_topic(1)
    sink = KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal=tmp_path / "wal")
    zombie = Producer(kafka.config(**{"transactional.id": sink.transactional_id(0)}))
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, value=b'{"id": -1}')
    zombie.flush(10)
    sink.check(SCHEMA, "app")  # init_transactions: fences the zombie, aborts its transaction
    with pytest.raises(KafkaException):
        zombie.commit_transaction(10)
    handle = _prepared_one(sink, "app", 0, 0, range(20))
    _commit(sink, 0, [handle])
    assert sorted(_ids(kafka, topic)) == list(range(20))
    assert open_transactions(kafka.bootstrap, topic) == 0


def test_marker_read_waits_for_open_transactions_on_the_marker_topic(
    kafka: Any, tmp_path: Path
) -> None:
    """Another producer's open transaction on the shared marker topic holds its last stable
    offset below our newest marker: reading only up to it would miss the marker and commit
    the epoch again. The read must wait until the records before it are decided."""
    import threading

    from confluent_kafka import Producer

    topic = kafka.new_topic(1)
    markers = kafka.new_topic(1, prefix="m", config={"cleanup.policy": "compact"})
    uid = _uid()

    def sink() -> KafkaSink:
        return KafkaSink(
            kafka.bootstrap, topic, uid=uid, wal=tmp_path / "wal", marker_topic=markers
        )

    first = sink()
    first.check(SCHEMA, "app")
    _commit(first, 0, [_prepared_one(first, "app", 0, 0, range(0, 10))])
    foreign = Producer(kafka.config(**{"transactional.id": "foreign-" + uid}))
    foreign.init_transactions(30)
    foreign.begin_transaction()
    foreign.produce(markers, key=b"someone/else/0", value=b"{}", partition=0)
    foreign.flush(10)  # open, below our next marker
    _commit(first, 1, [_prepared_one(first, "app", 1, 0, range(10, 20))])  # cached marker
    timer = threading.Timer(3.0, lambda: foreign.commit_transaction(30))
    timer.start()
    try:
        second = sink()  # a new driver after a crash: reads the markers
        second.check(SCHEMA, "app")
        _commit(second, 1, [_prepared_one(second, "app", 1, 0, range(10, 20))])
    finally:
        timer.join()
    assert sorted(_ids(kafka, topic)) == list(range(20))


def test_a_direct_mode_epoch_does_not_hold_back_other_queries_marker_reads(
    kafka: Any, tmp_path: Path
) -> None:
    """A direct-mode epoch holds its transactions open on its marker topic until the
    decision. By default that topic is the sink's own, so a query on the shared marker
    topic reads its markers at once (on a shared topic it would wait out the epoch)."""
    topic = kafka.new_topic(1)
    direct = KafkaSink(kafka.bootstrap, topic, uid=_uid(), mode="direct", shards=1)
    assert direct.marker_topic == f"txsink-markers-{direct.uid}"
    direct.check(SCHEMA, "app")
    held = direct.begin(TxnId("app", direct.uid, 0, 0, 0, 0), SCHEMA)  # its marker: open
    try:
        wal = KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal=tmp_path / "wal", timeout_s=5)
        wal.check(SCHEMA, "app")
        _commit(wal, 0, [_prepared_one(wal, "app", 0, 0, range(10))])  # reads its marker
        assert sorted(_ids(kafka, topic)) == list(range(10))
    finally:
        direct.discard(held)
        direct_pool.clear()  # begin() ran a task's code here: its pooled producer
        delete_topic(kafka.bootstrap, direct.marker_topic)


def test_a_direct_mode_marker_topic_named_after_an_illegal_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="not a legal Kafka topic name: pass marker_topic="):
        KafkaSink("127.0.0.1:1", "t", uid="u", mode="direct", transactional_id_prefix="a/b")
    sink = KafkaSink(
        "127.0.0.1:1",
        "t",
        uid="u",
        mode="direct",
        transactional_id_prefix="a/b",
        marker_topic="m",
    )
    assert sink.marker_topic == "m"


def test_corrupted_wal_is_refused_not_committed(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(1)
    sink = KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal=tmp_path / "wal")
    sink.check(SCHEMA, "app")
    handle = _prepared_one(sink, "app", 0, 0, range(50))
    path = tmp_path / "wal" / handle.path
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CommitError, match="is corrupted"):
        _commit(sink, 0, [handle])
    assert _ids(kafka, topic) == []
    assert open_transactions(kafka.bootstrap, topic) == 0


def test_two_live_writers_sharing_an_id_get_a_clear_error(kafka: Any, tmp_path: Path) -> None:
    """A driver committing without a cluster keeps its producers across epochs: another
    writer's init_transactions on the same id fences them, and the next commit says so."""
    topic = kafka.new_topic(1)
    uid = _uid()
    first = KafkaSink(kafka.bootstrap, topic, uid=uid, wal=tmp_path / "a")
    first.check(SCHEMA, "app-a")
    _commit(first, 0, [_prepared_one(first, "app-a", 0, 0, range(5))])
    second = KafkaSink(kafka.bootstrap, topic, uid=uid, wal=tmp_path / "b")
    second.check(SCHEMA, "app-b")  # takes the transactional id over
    handle = _prepared_one(first, "app-a", 1, 0, range(5, 10))
    with pytest.raises(FencedError, match="taken over by another producer"):
        _commit(first, 1, [handle])
    assert sorted(_ids(kafka, topic)) == list(range(5))


def test_start_checks(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(1)
    with pytest.raises(ConfigurationError, match="does not exist: create it"):
        KafkaSink(kafka.bootstrap, "no-such-topic-" + _uid(), uid=_uid(), wal=tmp_path).check(
            SCHEMA, "app"
        )
    with pytest.raises(ConfigurationError, match=r"above the broker's transaction.max.timeout.ms"):
        KafkaSink(
            kafka.bootstrap,
            topic,
            uid=_uid(),
            wal=tmp_path,
            producer_config={"transaction.timeout.ms": 3_600_000},
        ).check(SCHEMA, "app")
    with pytest.raises(ConfigurationError, match="too short"):
        KafkaSink(
            kafka.bootstrap,
            topic,
            uid=_uid(),
            wal=tmp_path,
            producer_config={"transaction.timeout.ms": 2000},
        ).check(SCHEMA, "app")
    not_compacted = kafka.new_topic(1, prefix="m")
    with pytest.raises(ConfigurationError, match="markers would expire"):
        KafkaSink(
            kafka.bootstrap, topic, uid=_uid(), wal=tmp_path, marker_topic=not_compacted
        ).check(SCHEMA, "app")
    with pytest.raises(ConfigurationError, match="key='nope' is not a column"):
        KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal=tmp_path, key="nope").check(SCHEMA, "app")
    with pytest.raises(ValueError, match="enforces acks=all"):
        KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal=tmp_path, producer_config={"acks": "1"})


def test_testing_adapter_verifies_and_drops_its_topic(kafka: Any, tmp_path: Path) -> None:
    """The testing adapter's target: committed ids read back, nothing lingering, and
    ``drop_target`` deletes the topic (best effort: a second drop raises nothing)."""
    import time

    from txsink.connectors.kafka.testing import ADAPTER

    env = {"TXSINK_KAFKA_BOOTSTRAP": kafka.bootstrap}
    spec = ADAPTER.new_target(tmp_path, "drop-" + _uid(), env, uid=_uid())
    sink = ADAPTER.build_sink(spec, env)
    assert isinstance(sink, KafkaSink)
    sink.check(SCHEMA, "app")
    _commit(sink, 0, [_prepared_one(sink, "app", 0, p, range(p * 10, p * 10 + 10)) for p in (0, 1)])
    verifier = ADAPTER.verifier(spec, range(20), env)
    assert sorted(verifier.read_ids()) == list(range(20)) and verifier.lingering() == 0
    ADAPTER.drop_target(spec, env)
    deadline = time.monotonic() + 30
    while spec["topic"] in kafka.admin().list_topics(timeout=10).topics:
        assert time.monotonic() < deadline, f"topic {spec['topic']} still there"
        time.sleep(0.2)
    ADAPTER.drop_target(spec, env)


# -- streaming ---------------------------------------------------------------------------


def _verdict(kafka: Any, topic: str, wal: Path, rows: int) -> Verdict:
    """Ids read back with read_committed; lingering: WAL files left, plus 1 if a transaction
    is still open on the topic (its last stable offset behind the high watermark)."""
    lingering = len(os.listdir(wal)) if wal.exists() else 0
    lingering += open_transactions(kafka.bootstrap, topic)
    return count_ids(range(rows), _ids(kafka, topic), lingering=lingering)


def _kafka_coordinator(
    kafka: Any, tmp: Path, topic: str, uid: str, mode: str = "wal", **options: Any
) -> Callable[[], Any]:
    from txsink import Coordinator

    def make() -> Any:
        sink = KafkaSink(
            kafka.bootstrap,
            topic,
            uid=uid,
            wal=tmp / "wal",
            key="key",
            shards=2,
            mode=mode,  # type: ignore[arg-type]
        )
        return Coordinator([sink], log=str(tmp / "txlog"), **options)

    return make


# The crash matrix (both modes) and the kill-driver runs are integration/test_matrix.py's,
# for every connector; the contract (abort, idempotent commit...) is the contract suite's.


@pytest.mark.spark
def test_during_commit_fires_after_every_shard_task_committed(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    """WAL mode, 2 shards committed by parallel Spark tasks: ``during_commit`` fires once
    the tasks returned, so a read_committed reader sees all of epoch 1 (never one shard of
    it: the driver cannot report between the shards of parallel tasks). The restart
    verifies the markers and writes nothing twice."""
    from tests.streaming import prepare_input, start_query

    topic = kafka.new_topic(3)
    uid = _uid()
    prepare_input(tmp_path, 1000)  # 4 epochs of 250 ids: epoch 1 is ids 250..499
    plan = FaultPlan.parse("during_commit:raise@1", str(tmp_path / "faults"))
    query = start_query(
        spark, tmp_path, _kafka_coordinator(kafka, tmp_path, topic, uid, faults=plan)()
    )
    with pytest.raises(Exception, match="InjectedFault"):
        query.awaitTermination()
    assert sorted(_ids(kafka, topic)) == list(range(500))
    query = start_query(spark, tmp_path, _kafka_coordinator(kafka, tmp_path, topic, uid)())
    query.awaitTermination()
    verdict = _verdict(kafka, topic, tmp_path / "wal", 1000)
    assert verdict.ok, verdict


@pytest.mark.spark
@pytest.mark.parametrize("kmode", ["wal", "replay"])
def test_restart_with_another_partition_count(
    spark: Any, kafka: Any, tmp_path: Path, kmode: str
) -> None:
    """Decided with 2 Spark partitions, recovered by a query with 3: exactly the decided records."""
    from tests.streaming import prepare_input, start_query

    topic = kafka.new_topic(2)
    uid = _uid()
    prepare_input(tmp_path, 1000)
    plan = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    query = start_query(
        spark, tmp_path, _kafka_coordinator(kafka, tmp_path, topic, uid, kmode, faults=plan)()
    )
    with pytest.raises(Exception, match="InjectedFault"):
        query.awaitTermination()
    make = _kafka_coordinator(kafka, tmp_path, topic, uid, kmode)
    query = start_query(spark, tmp_path, make(), transform=lambda df: df.repartition(3, "id"))
    query.awaitTermination()
    assert _verdict(kafka, topic, tmp_path / "wal", 1000).ok


@pytest.mark.spark
def test_replay_mode_refuses_a_non_deterministic_replay(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    """A random value the plan cannot show (a Python UDF that says it is deterministic, so
    the start-up check's plan rules pass it; ``rand()`` itself is refused there): the
    replay after a crash differs, it is refused at the commit, and nothing else is
    written."""
    import random

    from pyspark.sql import functions as F

    from tests.streaming import prepare_input, start_query

    topic = kafka.new_topic(2)
    uid = _uid()
    prepare_input(tmp_path, 1000)
    hidden = F.udf(lambda _id: random.random(), "double")

    def noisy(df: Any) -> Any:
        return df.withColumn("amount", hidden(F.col("id")))

    plan = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    make = _kafka_coordinator(kafka, tmp_path, topic, uid, "replay", faults=plan)
    query = start_query(spark, tmp_path, make(), transform=noisy)
    with pytest.raises(Exception, match="InjectedFault"):
        query.awaitTermination()
    before = sorted(_ids(kafka, topic))
    assert before == list(range(250))  # epoch 0 only (file 0); epoch 1 decided, not produced
    query = start_query(
        spark,
        tmp_path,
        _kafka_coordinator(kafka, tmp_path, topic, uid, "replay")(),
        transform=noisy,
    )
    with pytest.raises(Exception, match=r"NonDeterministicReplayError.*not deterministic"):
        query.awaitTermination()
    assert sorted(_ids(kafka, topic)) == before  # nothing else was written
    # The refused shard's transaction was aborted, not left open: readers are not held back.
    assert open_transactions(kafka.bootstrap, topic) == 0


# WAL mode is slow here: the default suite covers it in the cross-system coordinator
# (integration/test_cross_system.py); replay mode is only here.
# -- Avro with a Schema Registry ------------------------------------------------------


def _avro_values(registry: Any, kafka: Any, topic: str) -> list[dict[str, Any]]:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    decode = AvroDeserializer(registry.client())
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [decode(r.value, ctx) for r in read_topic(kafka.bootstrap, topic)]


@pytest.mark.registry
def test_avro_values_round_trip_through_the_registry(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(2)
    subject = schema_registry.topic_subject(topic)
    sink = KafkaSink(
        kafka.bootstrap,
        topic,
        uid=_uid(),
        wal=tmp_path / "wal",
        key="key",
        value_format="avro",
        schema_registry=schema_registry.config(),
    )
    sink.check(SCHEMA, "app")  # registers the derived schema at start
    registered = schema_registry.client().get_latest_version(subject)
    fields = json.loads(registered.schema.schema_str)["fields"]
    assert [f["name"] for f in fields] == ["id", "amount", "payload"]
    handles = [_prepared_one(sink, "app", 0, p, range(p * 50, p * 50 + 50)) for p in range(2)]
    _commit(sink, 0, handles)
    values = sorted(_avro_values(schema_registry, kafka, topic), key=lambda v: v["id"])
    assert values == [{"id": i, "amount": 0.5, "payload": f"p{i}"} for i in range(100)]
    assert {r.key for r in read_topic(kafka.bootstrap, topic)} == {
        f"k{i}".encode() for i in range(7)
    }


@pytest.mark.registry
def test_avro_incompatible_schema_fails_at_start(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    from confluent_kafka.schema_registry import Schema

    topic = kafka.new_topic(1)
    subject = schema_registry.topic_subject(topic)
    schema_registry.client().register_schema(subject, Schema('"string"', "AVRO"))
    sink = KafkaSink(
        kafka.bootstrap,
        topic,
        uid=_uid(),
        wal=tmp_path / "wal",
        value_format="avro",
        schema_registry=schema_registry.config(),
    )
    with pytest.raises(ConfigurationError, match="refused the value schema") as info:
        sink.check(SCHEMA, "app")
    assert info.value.sink_uid == sink.uid


@pytest.mark.registry
def test_avro_bad_row_is_refused_in_precommit_naming_row_and_column(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(1)
    schema_registry.topic_subject(topic)
    strict = {
        "type": "record",
        "name": "Event",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "amount", "type": "double"},
            {"name": "payload", "type": {"type": "enum", "name": "P", "symbols": ["p0", "p1"]}},
        ],
    }
    sink = KafkaSink(
        kafka.bootstrap,
        topic,
        uid=_uid(),
        wal=tmp_path / "wal",
        key="key",
        value_format="avro",
        value_schema=json.dumps(strict),
        schema_registry=schema_registry.config(),
    )
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", sink.uid, 0, 0, 1, 0), SCHEMA)
    with pytest.raises(WriteError, match="cannot encode the value as Avro") as info:
        sink.write(open_, _batch(range(5)))
    assert (getattr(info.value.row, "offset", None), info.value.partition, info.value.sink_uid) == (
        2,
        1,
        sink.uid,
    )
    sink.discard(open_)
    assert _ids_raw_count(kafka, topic) == 0


def _ids_raw_count(kafka: Any, topic: str) -> int:
    return len(read_topic(kafka.bootstrap, topic))


@pytest.mark.spark
@pytest.mark.registry
def test_avro_replay_mode_streaming_after_a_crash(
    spark: Any, kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    """Avro bytes are deterministic for a replay: the checksum of the re-encoded epoch matches."""
    from tests.streaming import prepare_input, run_until_done
    from txsink import Coordinator

    topic = kafka.new_topic(2)
    schema_registry.topic_subject(topic)
    prepare_input(tmp_path, 1000)
    plan = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    uid = _uid()

    def make() -> Any:
        sink = KafkaSink(
            kafka.bootstrap,
            topic,
            uid=uid,
            key="key",
            shards=2,
            mode="replay",
            value_format="avro",
            schema_registry=schema_registry.config(),
        )
        return Coordinator([sink], log=str(tmp_path / "txlog"), faults=plan)

    restarts, _ = run_until_done(spark, tmp_path, make)
    assert restarts == 1 and plan.fired()
    ids = [v["id"] for v in _avro_values(schema_registry, kafka, topic)]
    assert count_ids(range(1000), ids).ok


def test_verifier_waits_once_on_an_open_transaction(kafka: Any) -> None:
    """The verifier's reader and its lingering count each wait up to 10 s for a topic's
    last stable offset to reach its high watermark (commit markers in flight); with a
    transaction really open, the second call sees the same offsets and does not wait
    again (the contract's "nothing visible before commit" reads both: 20 s -> 10 s)."""
    import time

    from confluent_kafka import Producer

    from txsink.connectors.kafka.testing import KafkaVerifier

    topic = kafka.new_topic(1)
    producer = Producer(kafka.config(**{"transactional.id": f"open-{_uid()}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, json.dumps({"id": 1}).encode())
    producer.flush(30)
    try:
        verifier = KafkaVerifier(kafka.bootstrap, topic, [1])
        t0 = time.monotonic()
        assert verifier.read_ids() == []
        first = time.monotonic() - t0
        assert verifier.lingering() == 1
        second = time.monotonic() - t0 - first
        assert first >= 9.5, first  # it did wait for markers that never came
        assert second < 5.0, f"waited again for the same open transaction: {second:.1f} s"
    finally:
        producer.abort_transaction(30)
    assert verifier.lingering() == 0 and verifier.read_ids() == []
