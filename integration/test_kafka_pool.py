"""Pooled transactional producers (txsink/connectors/kafka/clients/pool.py) against the real broker:
reused across replay commit tasks of one process, replaced when another producer took
their transactional id over, dropped after a failed transaction; the WAL driver
initialises each shard once. Read back with read_committed."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from readback import open_transactions, read_topic

from txsink.connectors.kafka import KafkaReplayHandle, KafkaSink
from txsink.connectors.kafka.clients import pool
from txsink.connectors.kafka.clients.producers import ShardProducers
from txsink.connectors.kafka.fromreplay import ShardCommit
from txsink.contract import EpochCommit, TaskInfo
from txsink.txid import TxnId

pytestmark = pytest.mark.kafka
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])
APP = "app"


@pytest.fixture(autouse=True)
def _empty_pool() -> Iterator[None]:
    pool.clear()
    yield
    pool.clear()


@pytest.fixture
def inits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The transactional ids ``init_transactions`` ran on, in this process, in order."""
    import confluent_kafka

    seen: list[str] = []
    real = confluent_kafka.Producer

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, conf: dict[str, Any]) -> None:
            super().__init__(conf)
            self.tid = str(conf.get("transactional.id"))

        def init_transactions(self, *args: Any) -> None:
            seen.append(self.tid)
            super().init_transactions(*args)

    monkeypatch.setattr(confluent_kafka, "Producer", Counting)
    return seen


def _batch(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": list(ids), "key": [f"k{i % 7}" for i in ids]}, schema=SCHEMA
    )


def _sink(kafka: Any, topic: str, uid: str, **options: Any) -> KafkaSink:
    """A replay-mode sink with its own marker topic (the shared default one may be held
    back by other tests' open transactions)."""
    markers = kafka.new_topic(1, prefix="m", config={"cleanup.policy": "compact"})
    return KafkaSink(
        kafka.bootstrap, topic, uid=uid, mode="replay", key="key", marker_topic=markers, **options
    )


def _task(sink: KafkaSink, epoch: int, ids: range, *, shard: int = 0) -> ShardCommit:
    """The replay commit task of ``epoch`` on ``shard``, as the driver decided it (its
    pre-commit counted ``ids``)."""
    open_ = sink.begin(TxnId(APP, sink.uid, epoch, 0, shard, shard), SCHEMA)
    sink.write(open_, _batch(ids))
    h = sink.prepare(open_)
    assert isinstance(h, KafkaReplayHandle)
    decided = {shard: (h.rows, h.checksum, h.checksum_version)}
    return ShardCommit(sink.settings, sink.records, APP, epoch, decided)


def _run(task: ShardCommit, ids: range, *, shard: int = 0) -> tuple[str, int]:
    """The task's status and the rows it committed (0 unless it committed)."""
    done = task(TaskInfo(shard, 1), iter([_batch(ids)]))
    return done.status, done.rows if done.status == "committed" else 0


def _ids(kafka: Any, topic: str) -> list[int]:
    return sorted(json.loads(r.value or b"null")["id"] for r in read_topic(kafka.bootstrap, topic))


def test_a_worker_initialises_a_shard_once_across_tasks(kafka: Any, inits: list[str]) -> None:
    topic = kafka.new_topic(2)
    sink = _sink(kafka, topic, "k" + uuid.uuid4().hex[:10])
    sink.check(SCHEMA, APP)  # the driver fences (its own producer, closed after)
    inits.clear()
    for epoch in range(3):
        ids = range(epoch * 100, epoch * 100 + 100)
        assert _run(_task(sink, epoch, ids), ids) == ("committed", 100)
    assert inits == [sink.transactional_id(0)]  # once, not once per task
    producer, fresh = pool.pooled_producer(sink.settings, 0)
    assert not fresh and producer is pool.shard_producers(sink.settings).get(0)
    # A task of an epoch committed already: read from the marker, nothing produced.
    assert _run(_task(sink, 1, range(100, 200)), range(100, 200)) == ("already-committed", 0)
    assert _ids(kafka, topic) == list(range(300))
    assert open_transactions(kafka.bootstrap, topic) == 0


@pytest.mark.known_leak(
    rdkafka="the fenced producers stay alive: the fenced error's traceback (its frames hold "
    "them) is kept by a holder gc cannot see, likely confluent-kafka's C code "
    "(docs/testing.md, Leak checks)"
)
def test_a_pooled_producer_fenced_by_another_is_replaced(kafka: Any, inits: list[str]) -> None:
    """Another worker's task of the same shard ran init_transactions: the pooled producer
    is fenced. Found before the task's records are lost; a new producer does the work once."""
    topic = kafka.new_topic(2)
    sink = _sink(kafka, topic, "k" + uuid.uuid4().hex[:10])
    _run(_task(sink, 0, range(100)), range(100))
    stale, _ = pool.pooled_producer(sink.settings, 0)
    other = ShardProducers(sink.settings)  # another worker, with its own producer
    other.get(0)  # init_transactions: fences ours
    assert _run(_task(sink, 1, range(100, 200)), range(100, 200)) == ("committed", 100)
    replaced, fresh = pool.pooled_producer(sink.settings, 0)
    assert replaced is not stale and not fresh
    assert inits.count(sink.transactional_id(0)) == 3  # ours, the other's, the new one
    # The other worker's producer is the fenced one now: its task fails, writes nothing.
    with pytest.raises(Exception, match=r"fenced|taken over"):
        other.transaction(0, APP, 2, lambda p: p.produce(topic, b'{"id": -1}'))
    assert _ids(kafka, topic) == list(range(200))
    assert open_transactions(kafka.bootstrap, topic) == 0


def test_a_pooled_producer_sees_the_epoch_another_committed(kafka: Any) -> None:
    topic = kafka.new_topic(1)
    sink = _sink(kafka, topic, "k" + uuid.uuid4().hex[:10])
    _run(_task(sink, 0, range(10)), range(10))
    other = ShardProducers(sink.settings)  # another worker commits epoch 1 first
    task = _task(sink, 1, range(10, 20))
    records = sink.records.encode(_batch(range(10, 20)), 0, 0)
    from txsink.connectors.kafka.clients.producers import produce_records

    other.transaction(0, APP, 1, lambda p: produce_records(p, records))
    # Our pooled (now fenced) producer's task reads the marker: committed, nothing to do.
    assert _run(task, range(10, 20)) == ("already-committed", 0)
    assert _ids(kafka, topic) == list(range(20))


def test_a_dead_producers_open_marker_transaction_does_not_stall_a_pooled_one(
    kafka: Any,
) -> None:
    """A task died between producing its marker and committing (its transaction stays open
    until transaction.timeout.ms): a pooled producer waits only briefly for the marker
    topic, then a new producer's init_transactions aborts that transaction."""
    from confluent_kafka import Producer

    topic = kafka.new_topic(1)
    sink = _sink(kafka, topic, "k" + uuid.uuid4().hex[:10], timeout_s=20.0)
    _run(_task(sink, 0, range(10)), range(10))
    dead = Producer(kafka.config(**{"transactional.id": sink.transactional_id(0)}))
    dead.init_transactions(30)
    dead.begin_transaction()
    dead.produce(topic, value=b'{"id": -1}')
    dead.produce(sink.marker_topic, key=b"x", value=b"{}", partition=0)
    dead.flush(10)
    started = time.monotonic()
    assert _run(_task(sink, 1, range(10, 20)), range(10, 20)) == ("committed", 10)
    assert time.monotonic() - started < pool.REUSED_MARKER_WAIT_S + 10
    assert _ids(kafka, topic) == list(range(20))
    assert open_transactions(kafka.bootstrap, topic) == 0


def test_a_failed_transaction_evicts_the_producer(kafka: Any) -> None:
    topic = kafka.new_topic(1)
    sink = _sink(kafka, topic, "k" + uuid.uuid4().hex[:10])
    _run(_task(sink, 0, range(10)), range(10))
    assert pool.shard_producers(sink.settings).has(0)
    task = _task(sink, 1, range(10, 20))
    # One record more than decided: aborted, and only counted (the driver matches the
    # replay's partitions by content, and refuses a shard none of them holds).
    assert _run(task, range(10, 21)) == ("tallied", 0)
    assert not pool.shard_producers(sink.settings).has(0)  # not handed to the next task
    assert _run(task, range(10, 20)) == ("committed", 10)
    assert _ids(kafka, topic) == list(range(20))
    assert open_transactions(kafka.bootstrap, topic) == 0


def test_two_processes_share_a_transactional_id_and_commit_each_epoch_once(
    kafka: Any, tmp_path: Path
) -> None:
    """Two processes (two Python workers) run the commit tasks of one shard in turns, each
    with its pooled producer: each turn fences the other's. Every epoch is in Kafka once."""
    import multiprocessing

    topic = kafka.new_topic(1)
    markers = kafka.new_topic(1, prefix="m", config={"cleanup.policy": "compact"})
    uid = "k" + uuid.uuid4().hex[:10]
    ctx = multiprocessing.get_context("spawn")
    turns = [ctx.Queue() for _ in range(2)]
    done = ctx.Queue()
    workers = [
        ctx.Process(target=_worker, args=(kafka.bootstrap, topic, markers, uid, turns[i], done))
        for i in range(2)
    ]
    for w in workers:
        w.start()
    try:
        for epoch in range(6):
            turns[epoch % 2].put(epoch)
            assert done.get(timeout=120) == (epoch, "committed")
        turns[0].put(2)  # a late retry of a committed epoch: verified by the marker
        assert done.get(timeout=120) == (2, "already-committed")
    finally:
        for q in turns:
            q.put(None)
        for w in workers:
            w.join(60)
    assert _ids(kafka, topic) == list(range(60))
    assert open_transactions(kafka.bootstrap, topic) == 0


def _worker(bootstrap: str, topic: str, markers: str, uid: str, turns: Any, done: Any) -> None:
    sink = KafkaSink(bootstrap, topic, uid=uid, mode="replay", key="key", marker_topic=markers)
    while (epoch := turns.get()) is not None:
        ids = range(epoch * 10, epoch * 10 + 10)
        status, _ = _run(_task(sink, epoch, ids), ids)
        done.put((epoch, status))


def test_the_wal_driver_initialises_each_shard_once(
    kafka: Any, tmp_path: Path, inits: list[str]
) -> None:
    topic = kafka.new_topic(2)
    markers = kafka.new_topic(1, prefix="m", config={"cleanup.policy": "compact"})
    uid = "k" + uuid.uuid4().hex[:10]
    sink = KafkaSink(
        kafka.bootstrap, topic, uid=uid, wal=tmp_path, key="key", shards=2, marker_topic=markers
    )
    sink.check(SCHEMA, APP)
    for epoch in range(3):
        handles = []
        for p in range(2):
            open_ = sink.begin(TxnId(APP, sink.uid, epoch, 0, p, p), SCHEMA)
            sink.write(open_, _batch(range(epoch * 100 + p * 50, epoch * 100 + p * 50 + 50)))
            handles.append(sink.prepare(open_))
        sink.commit_epoch(EpochCommit(epoch, tuple(handles)))
    # check() probes the right to use shard 0's id (connectors/kafka/rights.py), fences each
    # id and closes its producers (commits run in tasks, which have their own); without
    # Spark the driver commits itself, initialising each shard once for all three epochs:
    # twice per id in all (shard 0 once more, the probe), never once per epoch.
    ids = [sink.transactional_id(s) for s in range(2)]
    assert sorted(inits) == sorted([*ids * 2, ids[0]])
    assert _ids(kafka, topic) == list(range(300))


def test_the_pool_is_bounded(kafka: Any) -> None:
    topic = kafka.new_topic(1)
    sinks = [_sink(kafka, topic, f"k{i}" + uuid.uuid4().hex[:8]) for i in range(pool.MAX_SINKS + 1)]
    first = pool.shard_producers(sinks[0].settings)
    assert pool.shard_producers(sinks[0].settings) is first
    for s in sinks[1:]:
        pool.shard_producers(s.settings)
    assert pool.shard_producers(sinks[0].settings) is not first  # closed, least recently used
