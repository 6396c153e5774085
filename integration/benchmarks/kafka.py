"""Kafka benchmark: txsink's KafkaSink (WAL and replay modes) next to a plain idempotent
producer and Spark's built-in Kafka sink, writing the same cached records into fresh topics.

    integration/benchmarks/run kafka [--rows N] [--partitions 2,8] [--repeat K]

Records: a string key (``user-NNNNNNN``) and a ~207-byte JSON value (a web-shop event built
in Spark with ``to_json(named_struct(...))``, its first field the unique ``id``).

Writers (each into its own fresh topic of --topic-partitions partitions, deleted after its
output is verified):

wal       ``Coordinator([KafkaSink(mode="wal", key="key", value="value")]).write(df,
          epoch=0)``: every task writes its records to an Arrow IPC WAL file and fsyncs it;
          the driver records the decision, then a commit job (one task per shard,
          shards=<partitions>) produces every WAL record plus the shard's marker in one
          Kafka transaction per shard. Full protocol.
replay    ``KafkaSink(mode="replay", shards=<partitions>)``: the epoch is resharded by the
          key's hash and persisted; pre-commit tasks count and checksum their shard; the
          commit job re-reads the persisted rows, one task per shard, each producing its
          records plus the marker in one transaction. Full protocol.
producer  the ceiling: ``mapInArrow`` tasks, each with a plain (non-transactional)
          idempotent confluent-kafka Producer (``acks=all``, txsink's ``linger.ms=20``,
          ``compression.type=lz4``, ``murmur2_random``), the same produce loop with a
          delivery callback, ``flush()`` at the end.
spark     Spark's built-in Kafka sink (``df.write.format("kafka")``), Java KafkaProducer with
          the same acks, idempotence, linger.ms and compression.
feed      no Kafka: ``mapInArrow`` tasks only receive the batches (Spark's own cost).

Verification: the topic is read back with ``isolation.level=read_committed`` up to its last
stable offsets: exactly N records, N distinct ids (parsed from the value) in range, and the
sums of key/value lengths and CRC32s equal to the source's; no transaction may be left open
(last stable offset == high watermark) and no WAL file left behind.

Plus, unless ``--no-extras``: txsink's phases (EpochResult.seconds), a per-step profile of
one extra run of each mode (precommit tasks, commit), and single-process (no Spark) rates
of the steps KafkaSink's commit is made of.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar, cast
from unittest import mock

import pyarrow as pa
from typing_extensions import override

try:
    from benchmarks import _bench, _spark_kafka
except ImportError:  # run as a plain script: python integration/benchmarks/kafka.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench, _spark_kafka

from _services.common import quiet_logger

from txsink import Coordinator
from txsink.connectors.kafka import fromreplay as kafka_replay
from txsink.connectors.kafka import readback as kafka_readback
from txsink.connectors.kafka import wal as kafka_wal
from txsink.connectors.kafka.clients import pool as kafka_pool
from txsink.connectors.kafka.clients.markers import Markers
from txsink.connectors.kafka.clients.offsets import Isolation, settled_ends, topic_ends
from txsink.connectors.kafka.clients.producers import ShardProducers, produce_records
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.fromreplay import ShardResult
from txsink.connectors.kafka.readback import admin_client
from txsink.connectors.kafka.records.checksum import CHECKSUM_VERSION, checksum
from txsink.connectors.kafka.records.format import RecordFormat
from txsink.connectors.kafka.sink import KafkaHandle, KafkaSink, OpenTxn
from txsink.contract import EpochCommit, EpochData, TaskInfo
from txsink.txid import TxnId

R = TypeVar("R")

# txsink's producer settings (clients.KafkaSettings.producer_conf); the ceiling and Spark's
# sink get the same.
PRODUCER_SETTINGS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "compression.type": "lz4",
    "partitioner": "murmur2_random",
    "delivery.report.only.error": True,
}
SPARK_KAFKA_OPTIONS = {
    "kafka.acks": "all",
    "kafka.enable.idempotence": "true",
    "kafka.linger.ms": "20",
    "kafka.compression.type": "lz4",
}
TXN_PREFIX = "txsink-bench"
# How long the verification waits for every partition's last stable offset to reach its high
# watermark (the commit markers land a moment after the commit returns).
LSO_WAIT_S = 30.0

KEY_EXPR = "concat('user-', lpad(cast((id * 7919) % 250000 AS string), 7, '0'))"
# A web-shop event; ``id`` first, so the verifier parses it from the value's prefix.
VALUE_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "id"),
    (
        "type",
        "element_at(array('page_view', 'click', 'add_to_cart', 'search', 'purchase'), "
        "cast(id % 5 + 1 AS int))",
    ),
    ("user", KEY_EXPR),
    ("session", "substr(sha2(cast(id DIV 20 AS string), 256), 1, 16)"),
    (
        "ts",
        "date_format(timestamp_micros(1704067200000000 + id * 31536000), "
        "\"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\")",
    ),
    ("page", "concat('/products/', lpad(cast((id * 31) % 50000 AS string), 6, '0'))"),
    ("device", "element_at(array('ios', 'android', 'web'), cast(id % 3 + 1 AS int))"),
    (
        "country",
        "element_at(array('DE', 'US', 'FR', 'GB', 'CH', 'NL'), cast(id % 6 + 1 AS int))",
    ),
    ("amount", "cast(((id * 7907) % 100000) / 100.0 AS decimal(10,2))"),
    ("currency", "'EUR'"),
)
VALUE_EXPR = (
    "to_json(named_struct(" + ", ".join(f"'{name}', {expr}" for name, expr in VALUE_FIELDS) + "))"
)
ID_PREFIX = b'{"id":'
# What "the same records" means: count, key/value bytes and CRC32 sums equal the source's.
FINGERPRINT_SPARK = (
    "count(*)",
    "sum(octet_length(key))",
    "sum(octet_length(value))",
    "sum(crc32(cast(key AS binary)))",
    "sum(crc32(cast(value AS binary)))",
)

WRITERS = ("direct", "wal", "replay", "producer", "spark")
LABELS = {
    "direct": 'txsink KafkaSink mode="direct"',
    "wal": 'txsink KafkaSink mode="wal"',
    "replay": 'txsink KafkaSink mode="replay"',
    "producer": "plain idempotent producer",
    "spark": "Spark Kafka sink",
    "feed": "(Spark feed only, no Kafka)",
}
#: Issue #15's targets, against Spark's own Kafka sink (the bar users hold us to).
TARGETS = {"direct": 0.85, "wal": 0.7, "replay": 0.5}


# -- task functions: these run in Spark's Python workers; keep them self-contained -----------


def _produce_task(
    bootstrap: str, topic: str, config: dict[str, Any], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ceiling: one plain idempotent producer per task, the same records, flush at the end."""
    from confluent_kafka import Producer

    producer = Producer({**config, "bootstrap.servers": bootstrap})
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None and not errors:
            errors.append(f"{err.str()} (partition {msg.partition()})")

    rows = 0
    for batch in batches:
        keys = batch.column(0).cast(pa.binary()).to_pylist()
        values = batch.column(1).cast(pa.binary()).to_pylist()
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)  # local queue full: let deliveries drain
        producer.poll(0)
        rows += batch.num_rows
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"plain producer: {left} records undelivered, errors {errors[:1]}")
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def _feed_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Only receive the batches: what Spark costs before any writer does anything."""
    # Warm the worker up (imports) so the first writer measured does not pay for it.
    import confluent_kafka  # noqa: F401

    import txsink.connectors.kafka  # noqa: F401

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


# -- profile runs: timers around the sink's seams ------------------------------------------
#
# The numbers of the profile tables, and where each is taken (the timers wrap whole hooks,
# calls or batches, never single records):
#
#   check, begin, write, prepare   the sink's hooks (ProfiledKafkaSink)
#   total          the WAL driver's commit_epoch, or one replay commit task (ShardCommit)
#   producer       ShardProducers.get: a new producer + init_transactions (~0 when cached)
#   marker         Markers.read: reading the marker topic
#   transaction    ShardProducers.transaction: begin, body, marker record, commit_transaction
#   body           the records of the transaction: reading them (the WAL file, or Spark's
#                  persisted rows + records + checksum) and the produce loop
#   records        RecordFormat.encode in a replay commit task
#   produce        producers.produce_records, per batch: the produce loop
#   delete_wal     WAL mode: a shard's files are deleted between its transaction and
#                  request.committed(), so the time between the two


class Profile:
    """Seconds by step, summed over calls, of one unit: a pre-commit task or a commit."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, key: str, t0: float) -> float:
        """Add the time since ``t0`` (``time.perf_counter()``) to ``key``; returns now."""
        now = time.perf_counter()
        self.seconds[key] = self.seconds.get(key, 0.0) + now - t0
        return now

    def dump(self, profile_dir: str, name: str, record: dict[str, Any]) -> None:
        """Write ``record`` and the seconds to ``<profile_dir>/<name>.json``."""
        write_record(profile_dir, name, {**record, **self.seconds})


def write_record(profile_dir: str, name: str, record: dict[str, Any]) -> None:
    """One profile record, ``<profile_dir>/<name>.json`` (read back by ``profile_run``)."""
    Path(profile_dir, f"{name}.json").write_text(json.dumps(record))


class ProfiledMarkers(Markers):
    """Markers whose reads of the marker topic are timed (``marker``)."""

    def __init__(self, settings: KafkaSettings, profile: Profile) -> None:
        super().__init__(settings)
        self.profile = profile

    @override
    def read(
        self,
        app: str,
        shards: Sequence[int],
        *,
        wait_s: float | None = None,
        phase: str = "commit",
    ) -> dict[int, int]:
        t0 = time.perf_counter()
        found = super().read(app, shards, wait_s=wait_s, phase=phase)
        self.profile.add("marker", t0)
        return found


class ProfiledShardProducers(ShardProducers):
    """ShardProducers with ``producer``, ``marker``, ``transaction`` and ``body`` timed.

    ``ended`` is when the last transaction committed (for WAL mode's ``delete_wal``).
    """

    def __init__(self, settings: KafkaSettings, profile: Profile) -> None:
        super().__init__(settings)
        self.profile = profile
        self.markers = ProfiledMarkers(settings, profile)
        self.ended: float | None = None

    @override
    def get(self, shard: int, phase: str = "commit") -> Any:
        t0 = time.perf_counter()
        producer = super().get(shard, phase)
        self.profile.add("producer", t0)
        return producer

    @override
    def transaction(
        self,
        shard: int,
        app: str,
        epoch: int,
        body: Callable[[Any], None],
        *,
        reused: bool = False,
    ) -> None:
        def timed_body(producer: Any) -> None:
            t1 = time.perf_counter()
            body(producer)
            self.profile.add("body", t1)

        t0 = time.perf_counter()
        super().transaction(shard, app, epoch, timed_body, reused=reused)
        self.ended = self.profile.add("transaction", t0)


@dataclass(frozen=True)
class ProfiledRecordFormat(RecordFormat):
    """RecordFormat with ``encode`` timed (``records``)."""

    profile: Profile = field(default_factory=Profile, compare=False)

    @classmethod
    def of(cls, fmt: RecordFormat, profile: Profile) -> ProfiledRecordFormat:
        options = {f.name: getattr(fmt, f.name) for f in dataclasses.fields(fmt)}
        return cls(**options, profile=profile)

    @override
    def encode(self, batch: pa.RecordBatch, partition: int, first_row: int) -> pa.RecordBatch:
        t0 = time.perf_counter()
        records = super().encode(batch, partition, first_row)
        self.profile.add("records", t0)
        return records


@contextlib.contextmanager
def timed_produce(profile: Profile) -> Iterator[None]:
    """While open, the WAL and replay commits' produce loop is timed per batch (``produce``).

    ``produce_records`` is a module function that ``wal`` and ``replay`` import by name, with
    no seam to wrap it by: it is swapped in those two modules, in this process only, for one
    profiled commit.
    """

    def timed(producer: Any, batch: pa.RecordBatch, columns: Any = None) -> None:
        t0 = time.perf_counter()
        produce_records(producer, batch, columns)
        profile.add("produce", t0)

    with (
        mock.patch.object(kafka_wal, "produce_records", timed),
        mock.patch.object(kafka_replay, "produce_records", timed),
    ):
        yield


@dataclass(frozen=True)
class ProfiledCommitTask:
    """Replay mode's commit task (``replay.ShardCommit``, pickled into each task) with its
    steps timed; writes ``commit-shard-<shard>-<epoch>.json``.

    The task takes its producers from the Python worker's pool (``kafka.pool``; librdkafka
    clients do not pickle): the pool makes profiling ones while this runs, and a pooled
    profiling one reports to this task's profile.
    """

    task: kafka_replay.ShardCommit
    profile_dir: str

    def __call__(self, info: TaskInfo, batches: Iterator[pa.RecordBatch]) -> ShardResult:
        prof = Profile()
        task = dataclasses.replace(self.task, fmt=ProfiledRecordFormat.of(self.task.fmt, prof))
        producers = functools.partial(ProfiledShardProducers, profile=prof)
        t0 = time.perf_counter()
        with timed_produce(prof), mock.patch.object(kafka_pool, "ShardProducers", producers):
            pooled = kafka_pool.shard_producers(task.settings)
            if isinstance(pooled, ProfiledShardProducers):  # made by an earlier task
                pooled.profile = prof
                if isinstance(pooled.markers, ProfiledMarkers):
                    pooled.markers.profile = prof
            out = task(info, batches)
        prof.add("total", t0)
        prof.dump(
            self.profile_dir,
            f"commit-shard-{info.partition}-{task.epoch}",
            {"kind": "commit", "where": "task"},
        )
        return out


@dataclass(frozen=True)
class ProfiledData:
    """The epoch's rows (replay mode), running the commit tasks as ProfiledCommitTask."""

    data: EpochData
    profile_dir: str

    def map_partitions(
        self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], R], *, barrier: bool = False
    ) -> list[R]:
        if not isinstance(task, kafka_replay.ShardCommit):
            return self.data.map_partitions(task, barrier=barrier)
        results = self.data.map_partitions(ProfiledCommitTask(task, self.profile_dir))
        return cast("list[R]", results)


class ProfiledKafkaSink(KafkaSink):
    """KafkaSink that writes the seconds spent in its steps, per task and per commit.

    Used only for the profile runs (their numbers are not in the throughput table). Each
    pre-commit task writes ``precommit-<txn>.json`` at ``prepare``; each commit (the
    driver's ``commit_epoch`` in WAL mode, each replay commit task) writes ``commit-*.json``.
    """

    def __init__(self, *args: Any, profile_dir: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile_dir = profile_dir
        self._prof = Profile()  # the pre-commit task's (new at begin)
        self._started = 0.0  # when the pre-commit task's begin was called
        self._commit_prof = Profile()  # the WAL driver's commit (reset by commit_epoch)
        # The driver's producers (KafkaSink makes them lazily, with no seam to pass others):
        # profiled from the start, as check() initialises them and WAL commits reuse them.
        self._clients = ProfiledShardProducers(self.settings, self._commit_prof)

    # the driver's start-up checks (init_transactions per shard, marker topic, ...)

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        t0 = time.perf_counter()
        super().check(schema, app_id)
        write_record(
            self.profile_dir, "check-driver", {"kind": "check", "seconds": time.perf_counter() - t0}
        )

    # pre-commit tasks

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> OpenTxn:
        t0 = time.perf_counter()
        opened = super().begin(txn, schema)
        self._prof, self._started = Profile(), t0
        self._prof.add("begin", t0)
        return opened

    @override
    def write(self, txn: OpenTxn, batch: pa.RecordBatch) -> None:
        t0 = time.perf_counter()
        super().write(txn, batch)
        self._prof.add("write", t0)

    @override
    def prepare(self, txn: OpenTxn) -> KafkaHandle:
        t0 = time.perf_counter()
        handle = super().prepare(txn)
        end = time.perf_counter()
        p = self._prof.seconds
        write_record(
            self.profile_dir,
            f"precommit-{txn.txn}",
            {
                "kind": "precommit",
                "partition": txn.txn.partition,
                "rows": handle.rows,
                "begin": p.get("begin", 0.0),
                "write": p.get("write", 0.0),
                "prepare": end - t0,
                "span": end - (self._started or t0),
            },
        )
        return handle

    # commit: the driver (WAL) or one task per shard (replay)

    @override
    def commit_epoch(self, request: EpochCommit[Any]) -> None:
        if self.mode == "replay":
            if request.data is not None:
                request = dataclasses.replace(
                    request, data=ProfiledData(request.data, self.profile_dir)
                )
            super().commit_epoch(request)
            return
        # WAL mode commits in one Spark task per shard (the same ShardCommit path as replay
        # without the rows): only the phase's total is measured here, on the driver.
        prof = self._commit_prof
        prof.seconds.clear()
        t0 = time.perf_counter()
        super().commit_epoch(request)
        prof.add("total", t0)
        prof.dump(
            self.profile_dir, f"commit-wal-{request.epoch}", {"kind": "commit", "where": "tasks"}
        )


# -- Kafka helpers --------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` (replication 1) and wait until every partition is served."""
    kafka_readback.create_topic(bootstrap, topic, partitions, timeout_s=60)
    # Wait until every partition's leader serves it: ListOffsets answers only then. (Metadata
    # names a leader a moment before its log exists; an idempotent producer that starts in
    # that moment can get its batches out of sequence: OutOfOrderSequenceException.)
    admin = admin_client(bootstrap)
    deadline = time.monotonic() + 60
    last = ""
    while time.monotonic() < deadline:
        try:
            offsets = topic_ends(admin, topic, "read_uncommitted", 10)
            if len(offsets) == partitions:
                return
            last = f"{len(offsets)} of {partitions} partitions"
        except Exception as err:
            last = str(err)
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} is not served after 60 s: {last}")


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    if not topics:
        return
    admin = admin_client(bootstrap)  # keep it referenced: its futures die with it
    futures = admin.delete_topics(list(topics), operation_timeout=60)
    for topic, future in futures.items():
        try:
            future.result(timeout=60)
        except Exception as err:  # a missing topic is fine; anything else only logged
            _bench.log(f"could not delete topic {topic}: {err}")


def end_offsets(admin: Any, topic: str, isolation: Isolation) -> dict[int, int]:
    """Per partition: the last stable offset (read_committed) or high watermark."""
    return topic_ends(admin, topic, isolation, 60.0)


@dataclass
class Readback:
    """What a read_committed reader sees in a topic, summed (order-independent)."""

    records: int = 0
    key_bytes: int = 0
    value_bytes: int = 0
    key_crc: int = 0
    value_crc: int = 0
    distinct: int = 0
    duplicates: int = 0
    bad_ids: int = 0
    open_partitions: int = 0  # last stable offset < high watermark: a transaction left open
    offsets: int = 0  # sum of high watermarks (records + transaction markers + aborted)
    seconds: float = 0.0  # the whole read-back, lso_wait_s included
    lso_wait_s: float = 0.0  # waiting for the last stable offsets to reach the high watermarks

    def fingerprint(self) -> tuple[int, ...]:
        return (self.records, self.key_bytes, self.value_bytes, self.key_crc, self.value_crc)


def read_back(bootstrap: str, topic: str, rows: int, timeout_s: float = 300.0) -> Readback:
    """Read ``topic`` with read_committed to its last stable offsets; sum what it holds.

    First waits (up to ``LSO_WAIT_S``) until the commit markers are in every partition
    (:func:`settled_ends`), and logs how long if it had to. Then one consumer over all
    partitions, batched ``consume``; per record only the CRC32s, lengths and the id (from
    the value's ``{"id":N,`` prefix) in a bitmap of ``rows``.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    t0 = time.perf_counter()
    out = Readback()
    ends, hwm, out.lso_wait_s = settled_ends(
        admin_client(bootstrap), topic, 60.0, wait_s=LSO_WAIT_S
    )
    if out.lso_wait_s > 0:
        _bench.log(
            f"read_back({topic}): waited {out.lso_wait_s:.2f} s until the last stable offsets "
            "reached the high watermarks (the commit markers were still being written)"
        )
    out.offsets = sum(hwm.values())
    out.open_partitions = sum(1 for p, e in ends.items() if e < hwm.get(p, e))
    pending = {p for p, end in ends.items() if end > 0}
    seen = bytearray(rows)
    if pending:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"txsink-bench-{uuid.uuid4().hex[:12]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.max.bytes": 64 << 20,
                "max.partition.fetch.bytes": 16 << 20,
                "logger": quiet_logger(),
            }
        )
        crc32 = zlib.crc32
        eof = KafkaError._PARTITION_EOF
        records = key_bytes = value_bytes = key_crc = value_crc = dups = bad = 0
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in sorted(pending)])
            deadline = time.monotonic() + timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"read_back({topic}): {sorted(pending)} not at their end")
                for msg in consumer.consume(20_000, 0.5):
                    err = msg.error()
                    part = msg.partition()
                    offset = msg.offset()
                    if err is not None and err.code() != eof:
                        raise RuntimeError(f"read_back({topic}): {err}")
                    if part is None or offset is None:
                        continue
                    if err is not None:  # end of partition
                        if offset >= ends[part]:
                            pending.discard(part)
                        continue
                    if offset >= ends[part]:
                        pending.discard(part)
                        continue
                    key = msg.key() or b""
                    value = msg.value() or b""
                    records += 1
                    key_bytes += len(key)
                    value_bytes += len(value)
                    key_crc += crc32(key)
                    value_crc += crc32(value)
                    comma = value.find(b",", 6)
                    try:
                        ident = int(value[6:comma]) if value.startswith(ID_PREFIX) else -1
                    except ValueError:
                        ident = -1
                    if 0 <= ident < rows:
                        if seen[ident]:
                            dups += 1
                        else:
                            seen[ident] = 1
                    else:
                        bad += 1
                    if offset + 1 >= ends[part]:
                        pending.discard(part)
        finally:
            consumer.close()
        out.records, out.key_bytes, out.value_bytes = records, key_bytes, value_bytes
        out.key_crc, out.value_crc, out.duplicates, out.bad_ids = key_crc, value_crc, dups, bad
        out.distinct = records - dups - bad
    out.seconds = time.perf_counter() - t0
    return out


# -- the benchmark ----------------------------------------------------------------------------


@dataclass
class Bench:
    spark: Any
    bootstrap: str
    topic_partitions: int
    workdir: Path
    cpu: _bench.CpuMeter
    run_id: str
    marker_topic: str
    topics: list[str] = field(default_factory=list)
    void: list[str] = field(default_factory=list)


def make_frame(spark: Any, rows: int, partitions: int) -> Any:
    """The input: key and value generated in Spark, cached (see ``_bench.cached_frame``)."""
    exprs = [f"{KEY_EXPR} AS key", f"{VALUE_EXPR} AS value"]
    return _bench.cached_frame(spark, rows, partitions, exprs)


def spark_fingerprint(df: Any) -> tuple[int, ...]:
    row = df.selectExpr(*FINGERPRINT_SPARK).collect()[0]
    return tuple(int(x) for x in row)


def _rows_from(job: Any) -> int:
    return int(sum(r["rows"] for r in job.collect()))


def _sink(
    bench: Bench, mode: str, topic: str, uid: str, wal: Path, partitions: int, profile_dir: str
) -> KafkaSink:
    kwargs: dict[str, Any] = {
        "key": "key",
        "value": "value",
        "marker_topic": bench.marker_topic,
        "transactional_id_prefix": TXN_PREFIX,
    }
    if mode == "wal":
        kwargs.update(mode="wal", wal=wal, shards=partitions)  # one commit task per partition
    elif mode == "direct":
        kwargs.update(mode="direct", shards=max(8, partitions))
    else:
        kwargs.update(mode="replay", shards=partitions)
    if profile_dir:
        return ProfiledKafkaSink(bench.bootstrap, topic, uid, profile_dir=profile_dir, **kwargs)
    return KafkaSink(bench.bootstrap, topic, uid, **kwargs)


def write_txsink(
    bench: Bench, mode: str, df: Any, topic: str, partitions: int, profile_dir: str = ""
) -> dict[str, Any]:
    uid = topic.removeprefix("txsink-bench-")  # unique per run: markers are per app/uid/shard
    with tempfile.TemporaryDirectory(dir=bench.workdir, prefix=f"{mode}-") as tmp:
        wal = Path(tmp, "wal")
        sink = _sink(bench, mode, topic, uid, wal, partitions, profile_dir)
        coordinator = Coordinator([sink], log=Path(tmp, "log"), app_id=f"bench-{bench.run_id}")
        result = coordinator.write(df, epoch=0)
        leftover = sum(1 for _ in wal.rglob("*.arrow")) if wal.exists() else 0
    if result.status != "committed":
        raise RuntimeError(f"txsink epoch not committed: {result}")
    return {"phases": dict(result.seconds), "handles": result.handles, "wal_left": leftover}


def write_producer(bench: Bench, df: Any, topic: str) -> dict[str, Any]:
    job = df.select("key", "value").mapInArrow(
        functools.partial(_produce_task, bench.bootstrap, topic, PRODUCER_SETTINGS), "rows long"
    )
    return {"task_rows": _rows_from(job)}


def write_spark(bench: Bench, df: Any, topic: str) -> dict[str, Any]:
    writer = (
        df.selectExpr("key", "value")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bench.bootstrap)
        .option("topic", topic)
    )
    for key, value in SPARK_KAFKA_OPTIONS.items():
        writer = writer.option(key, value)
    writer.save()
    return {}


def run_feed(df: Any) -> int:
    return _rows_from(df.mapInArrow(_feed_task, "rows long"))


def measure(
    bench: Bench,
    writer: str,
    df: Any,
    *,
    rows: int,
    partitions: int,
    expected: tuple[int, ...],
    tag: str,
    profile_dir: str = "",
) -> _bench.Measurement:
    """Time one writer into a fresh topic, verify what read_committed sees, delete the topic."""
    topic = f"txsink-bench-{writer}-{tag}-{bench.run_id}".replace("_", "-")
    if writer != "feed":
        create_topic(bench.bootstrap, topic, bench.topic_partitions)
        bench.topics.append(topic)
    writers: dict[str, Callable[[], dict[str, Any]]] = {
        "direct": lambda: write_txsink(bench, "direct", df, topic, partitions, profile_dir),
        "wal": lambda: write_txsink(bench, "wal", df, topic, partitions, profile_dir),
        "replay": lambda: write_txsink(bench, "replay", df, topic, partitions, profile_dir),
        "producer": lambda: write_producer(bench, df, topic),
        "spark": lambda: write_spark(bench, df, topic),
        "feed": lambda: {"task_rows": run_feed(df)},
    }
    error = ""

    def write() -> dict[str, Any]:
        nonlocal error
        try:
            return writers[writer]()
        except Exception as err:  # a writer that fails is void; the others still run
            error = _first_line(err)
            return {}

    try:
        m = _bench.timed_run(bench.cpu, writer, partitions, rows, write)
        found = read_back(bench.bootstrap, topic, rows) if writer != "feed" else None
    finally:
        if writer != "feed":
            delete_topics(bench.bootstrap, [topic])
            bench.topics.remove(topic)
    extra = m.extra
    problems = [f"failed: {error}"] if error else []
    if found is None:
        if extra.get("task_rows") != rows:
            problems.append(f"the feed job saw {extra['task_rows']} rows")
    else:
        extra["readback_s"] = found.seconds
        extra["lso_wait_s"] = found.lso_wait_s
        extra["offsets"] = found.offsets
        if (found.records, found.distinct) != (rows, rows):
            problems.append(
                f"read_committed sees {found.records} records, {found.distinct} distinct ids "
                f"({found.duplicates} duplicates, {found.bad_ids} bad ids; want {rows})"
            )
        elif found.fingerprint() != expected:
            problems.append(
                f"key/value lengths or CRCs differ: {found.fingerprint()} != {expected}"
            )
        if found.open_partitions:
            problems.append(
                f"{found.open_partitions} partitions hold an open transaction (last stable "
                f"offset below the high watermark after {found.lso_wait_s:.1f} s of waiting)"
            )
    if extra.get("wal_left", 0):
        problems.append(f"{extra['wal_left']} WAL files left behind")
    _bench.void_if(problems, m, tag, bench.void)
    tail = ""
    if found is not None:
        tail = f"  readback {found.seconds:.1f} s"
        if found.lso_wait_s:
            tail += f" (of which {found.lso_wait_s:.2f} s waiting for the commit markers)"
    _bench.log_run(m, tag, width=8, unit="rec/s", tail=tail)
    return m


def _first_line(err: BaseException) -> str:
    """The exception's first line (and its Java cause's, for Spark's errors), for a log line."""
    text = str(err).strip()
    lines = text.splitlines() or [type(err).__name__]
    causes = [line for line in lines if line.startswith("Caused by:")]
    return f"{type(err).__name__}: {lines[0][:300]}" + (f" ({causes[-1][:300]})" if causes else "")


# -- extras: where the time goes ----------------------------------------------------------


def profile_run(bench: Bench, mode: str, df: Any, **kw: Any) -> dict[str, Any]:
    """One untimed txsink run with ProfiledKafkaSink: seconds by step, summed over tasks."""
    profile_dir = tempfile.mkdtemp(dir=bench.workdir, prefix=f"profile-{mode}-")
    m = measure(bench, mode, df, profile_dir=profile_dir, **kw)
    records = [json.loads(p.read_text()) for p in Path(profile_dir).glob("*.json")]
    pre = [r for r in records if r["kind"] == "precommit"]
    com = [r for r in records if r["kind"] == "commit"]
    check = [r for r in records if r["kind"] == "check"]

    def total(rs: list[dict[str, Any]], key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in rs)

    out: dict[str, Any] = {
        "wall": m.seconds,
        "phases": dict(m.extra.get("phases", {})),
        "void": "void" in m.extra,
        "pre_tasks": len(pre),
        "commit_units": len(com),
        "commit_where": com[0]["where"] if com else "",
        "check": total(check, "seconds"),
    }
    for key in ("begin", "write", "prepare", "span"):
        out[f"pre_{key}"] = total(pre, key)
    out["pre_feed"] = out["pre_span"] - out["pre_begin"] - out["pre_write"] - out["pre_prepare"]
    out["pre_prepare_max"] = max((float(r["prepare"]) for r in pre), default=0.0)
    for key in ("total", "producer", "marker", "transaction", "body", "records", "produce"):
        out[f"c_{key}"] = total(com, key)
    out["c_delete_wal"] = total(com, "delete_wal")
    # body = reading (WAL file, or Spark's rows + records + checksum) + the produce loop;
    # transaction - body = begin_transaction + the marker + commit_transaction (the flush).
    out["c_read"] = out["c_body"] - out["c_produce"]
    out["c_commit_txn"] = out["c_transaction"] - out["c_body"]
    out["c_other"] = (
        out["c_total"]
        - out["c_producer"]
        - out["c_marker"]
        - out["c_transaction"]
        - out["c_delete_wal"]
    )
    shutil.rmtree(profile_dir, ignore_errors=True)
    if mode == "replay":
        out["shuffle_s"] = shuffle_seconds(df, kw["partitions"])
    return out


def shuffle_seconds(df: Any, partitions: int) -> float:
    """What replay mode's resharding costs without any sink: the shuffle by the key's hash
    into ``partitions`` shards, persisted and materialised (as the coordinator does)."""
    t0 = time.perf_counter()
    data = df.repartition(partitions, "key").persist()
    try:
        rows = data.count()
        seconds = time.perf_counter() - t0
        if rows != df.count():
            raise RuntimeError("the shuffled frame lost rows")
        return seconds
    finally:
        data.unpersist(blocking=True)


def _producer_conf(bench: Bench, **extra: Any) -> dict[str, Any]:
    return {
        **PRODUCER_SETTINGS,
        "bootstrap.servers": bench.bootstrap,
        "logger": quiet_logger(),
        **extra,
    }


def single_process(bench: Bench, df: Any, rows: int, expected: tuple[int, ...]) -> dict[str, Any]:
    """Without Spark, in this one Python process: the steps KafkaSink's commit is made of.

    ``records`` RecordFormat.encode (Arrow casts); ``checksum`` the replay checksum;
    ``pylist`` to_pylist of the 5 record columns; then producing all records to a fresh
    topic: ``txn_sink`` producers.produce_records in one transaction (what the WAL commit
    does per shard, minus reading the WAL); ``txn_lean`` the same transaction with the
    leanest loop (positional produce() of key and value only); ``plain`` a
    non-transactional idempotent producer. All report failed deliveries only.
    """
    from confluent_kafka import Producer

    data = df.select("key", "value").toArrow()
    batches = data.to_batches(max_chunksize=10_000)
    sink = KafkaSink(
        bench.bootstrap, "probe", "probe", mode="replay", key="key", value="value", shards=1
    )
    out: dict[str, Any] = {"rows": data.num_rows}
    t0 = time.perf_counter()
    records = [sink.records.encode(b, 0, 0) for b in batches]
    out["records_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in records:
        checksum(r, CHECKSUM_VERSION)
    out["checksum_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in records:
        for c in range(r.num_columns):
            r.column(c).to_pylist()
    out["pylist_s"] = time.perf_counter() - t0

    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    def txn_sink(producer: Any, topic: str) -> None:
        producer.begin_transaction()
        for r in records:
            produce_records(producer, _retopic(r, topic))
        producer.commit_transaction(120)

    def txn_lean(producer: Any, topic: str) -> None:
        producer.begin_transaction()
        for r in records:
            keys = r.column(2).to_pylist()
            values = r.column(3).to_pylist()
            for key, value in zip(keys, values, strict=True):
                while True:
                    try:
                        producer.produce(topic, value, key)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
        producer.commit_transaction(120)

    def plain(producer: Any, topic: str) -> None:
        for r in records:
            keys = r.column(2).to_pylist()
            values = r.column(3).to_pylist()
            for key, value in zip(keys, values, strict=True):
                while True:
                    try:
                        producer.produce(topic, value, key, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
        if producer.flush(120):
            errors.append("flush left records undelivered")

    variants: dict[str, tuple[Callable[[Any, str], None], bool]] = {
        "txn_sink": (txn_sink, True),
        "txn_lean": (txn_lean, True),
        "plain": (plain, False),
    }
    # The plain producer's start-up (its producer id) is not timed: one record elsewhere first.
    warm = f"txsink-bench-single-warm-{bench.run_id}"
    create_topic(bench.bootstrap, warm, 1)
    bench.topics.append(warm)
    for name, (run, transactional) in variants.items():
        topic = f"txsink-bench-single-{name}-{bench.run_id}".replace("_", "-")
        create_topic(bench.bootstrap, topic, bench.topic_partitions)
        bench.topics.append(topic)
        try:
            conf = _producer_conf(bench)
            if transactional:
                conf["transactional.id"] = f"{TXN_PREFIX}-single-{name}-{bench.run_id}"
            producer = Producer(conf)
            if transactional:
                producer.init_transactions(30)
            else:
                producer.produce(warm, b"warm-up")
                producer.flush(30)
            errors.clear()
            t0 = time.perf_counter()
            run(producer, topic)
            out[f"{name}_s"] = time.perf_counter() - t0
            found = read_back(bench.bootstrap, topic, rows)
            ok = found.fingerprint() == expected and found.distinct == rows and not errors
            out[f"{name}_ok"] = ok
            if not ok:
                _bench.log(f"single-process {name}: output differs ({found}, errors {errors[:1]})")
        finally:
            delete_topics(bench.bootstrap, [topic])
            bench.topics.remove(topic)
        _bench.log(f"single-process {name}: {out[f'{name}_s']:.2f} s for {data.num_rows:,}")
    delete_topics(bench.bootstrap, [warm])
    bench.topics.remove(warm)
    out.update(startup_costs(bench))
    return out


def startup_costs(bench: Bench, n: int = 3, markers: int = 20) -> dict[str, float]:
    """Median ms of the fixed costs each replay commit task (and the WAL driver) pays:
    a new idempotent producer's first delivery, a new transactional producer's
    init_transactions (``n`` times each), and the marker read, Markers.last (list_offsets
    + a consumer on the marker topic; ``markers`` times, with its max and slow calls).
    """
    from confluent_kafka import Producer

    topic = f"txsink-bench-startup-{bench.run_id}"
    create_topic(bench.bootstrap, topic, bench.topic_partitions)
    bench.topics.append(topic)
    first: list[float] = []
    init: list[float] = []
    marker: list[float] = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            producer = Producer(_producer_conf(bench))
            producer.produce(topic, b"v", b"k")
            producer.flush(30)
            first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            txn = Producer(
                _producer_conf(bench, **{"transactional.id": f"{TXN_PREFIX}-startup-{i}"})
            )
            txn.init_transactions(30)
            init.append(time.perf_counter() - t0)
        sink = KafkaSink(
            bench.bootstrap,
            topic,
            f"startup-{bench.run_id}",
            mode="replay",
            key="key",
            marker_topic=bench.marker_topic,
        )
        shard_markers = Markers(sink.settings)  # what each commit reads its marker with
        for _ in range(markers):
            shard_markers.clear()
            t0 = time.perf_counter()
            shard_markers.last(f"bench-{bench.run_id}", 0)
            marker.append(time.perf_counter() - t0)
    finally:
        delete_topics(bench.bootstrap, [topic])
        bench.topics.remove(topic)
    return {
        "first_delivery_ms": _bench.median(first) * 1000,
        "init_transactions_ms": _bench.median(init) * 1000,
        "marker_ms": _bench.median(marker) * 1000,
        "marker_max_ms": max(marker, default=float("nan")) * 1000,
        "marker_slow": float(sum(1 for m in marker if m > 1.0)),
        "marker_n": float(len(marker)),
    }


def _retopic(records: pa.RecordBatch, topic: str) -> pa.RecordBatch:
    """The same records, for another topic (column 0)."""
    arrays = [pa.array([topic] * records.num_rows, pa.string()), *records.columns[1:]]
    return pa.RecordBatch.from_arrays(arrays, schema=records.schema)


# -- report ---------------------------------------------------------------------------------


@dataclass
class Results(_bench.Results):
    """The runs, plus the extras: profiles per (mode, partitions), single-process steps,
    the data's size, and how Spark's Kafka sink was set up (or why it was not)."""

    name: ClassVar[str] = "kafka"
    title: ClassVar[str] = "Kafka"
    server: ClassVar[str] = "kafka"
    baseline: ClassVar[str] = "producer"
    after: ClassVar[str | None] = "postgres"
    from_args: ClassVar[tuple[str, ...]] = ("topic_partitions",)

    topic_partitions: int = 0
    profiles: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    single: dict[str, Any] = field(default_factory=dict)
    data_bytes: int = 0
    value_bytes: int = 0
    spark_kafka: _spark_kafka.SparkKafkaJars | None = None
    spark_kafka_error: str = ""

    def mb_rate(self, writer: str, partitions: int) -> float:
        secs = _bench.median(self.seconds(writer, partitions))
        return self.data_bytes / 1e6 / secs if secs == secs and secs > 0 else float("nan")

    @override
    def encode(self) -> dict[str, Any]:
        doc = super().encode()
        doc["profiles"] = {f"{mode}:{p}": v for (mode, p), v in self.profiles.items()}
        return doc

    @classmethod
    @override
    def decode(cls, doc: dict[str, Any]) -> dict[str, Any]:
        doc = super().decode(doc)
        profiles: dict[tuple[str, int], dict[str, Any]] = {}
        for key, value in doc["profiles"].items():
            mode, p = key.split(":")
            profiles[(mode, int(p))] = value
        doc["profiles"] = profiles
        jars = doc["spark_kafka"]
        doc["spark_kafka"] = (
            _spark_kafka.SparkKafkaJars(
                [Path(j) for j in jars["jars"]], jars["versions"], jars["notes"]
            )
            if jars
            else None
        )
        return doc


def throughput_table(res: Results) -> str:
    return _bench.throughput_table(
        res,
        LABELS,
        (*WRITERS, "feed"),
        WRITERS,
        rate_header="records/s (median)",
        vs_header="vs plain producer",
        server_header="Kafka",
        columns=[("MB/s", "r", lambda w, p, _: "" if w == "feed" else f"{res.mb_rate(w, p):.1f}")],
    )


def target_table(res: Results) -> str:
    rows = [
        [str(p)]
        + [
            _bench.ratio_cell(res, writer, p, "spark", target=target, single_runs=False)
            for writer, target in TARGETS.items()
        ]
        + [_bench.ratio_cell(res, writer, p, single_runs=False) for writer in TARGETS]
        for p in res.partitions
    ]
    return _bench.markdown_table(
        [
            "partitions",
            *(f"{w} / Spark Kafka sink (target >= {t}x)" for w, t in TARGETS.items()),
            *(f"{w} / plain producer" for w in TARGETS),
        ],
        rows,
        "r" * (1 + 2 * len(TARGETS)),
    )


def phase_table(res: Results) -> str:
    return _bench.phase_table(
        res, ("direct", "wal", "replay"), digits=2, other="check + schema + unpersist"
    )


def _pct(part: float, whole: float) -> str:
    return f"{part:.2f} ({part / whole:.0%})" if whole > 0 else f"{part:.2f}"


def _profiles(res: Results) -> list[tuple[tuple[str, int], dict[str, Any]]]:
    """Profiles by partitions, WAL before replay."""
    return sorted(res.profiles.items(), key=lambda kv: (kv[0][1], WRITERS.index(kv[0][0])))


def precommit_profile_table(res: Results) -> str:
    rows = []
    for (mode, p), pr in _profiles(res):
        span = pr["pre_span"]
        rows.append(
            [
                str(p),
                mode,
                str(pr["pre_tasks"]),
                f"{span:.2f}",
                _pct(pr["pre_feed"], span),
                _pct(pr["pre_write"], span),
                f"{pr['pre_prepare']:.2f} (max {pr['pre_prepare_max'] * 1000:.0f} ms)",
                f"{pr['shuffle_s']:.2f}" if "shuffle_s" in pr else "",
            ]
        )
    return _bench.markdown_table(
        [
            "partitions",
            "mode",
            "tasks",
            "task s (sum)",
            "Spark feed s",
            "write s (records + WAL file / checksum)",
            "prepare s (WAL: close + CRC + fsync)",
            "shuffle + persist alone s",
        ],
        rows,
        "rlrrrrrr",
    )


def commit_profile_table(res: Results) -> str:
    rows = []
    for (mode, p), pr in _profiles(res):
        total = pr["c_total"]
        where = "driver" if pr["commit_where"] == "driver" else f"{pr['commit_units']} tasks"
        if pr["commit_where"] == "tasks":  # WAL mode: not broken down (the tasks' own time)
            where, cells = "one task per shard", ["n/a"] * 6
        else:
            cells = [
                _pct(pr["c_producer"], total),
                _pct(pr["c_marker"], total),
                _pct(pr["c_read"], total),
                _pct(pr["c_produce"], total),
                _pct(pr["c_commit_txn"], total),
                _pct(pr["c_delete_wal"] + pr["c_other"], total),
            ]
        rows.append(
            [
                str(p),
                mode,
                where,
                f"{pr['check']:.2f}",
                f"{pr['phases'].get('commit', float('nan')):.2f}",
                f"{total:.2f}",
                *cells,
            ]
        )
    return _bench.markdown_table(
        [
            "partitions",
            "mode",
            "commit runs on",
            "check s (driver, at start)",
            "commit phase s",
            "commit s (sum)",
            "new producer + init_transactions",
            "marker read",
            "read (WAL / rows + checksum)",
            "produce loop",
            "commit_transaction",
            "delete WAL + other",
        ],
        rows,
        "rllrrrrrrrrr",
    )


def single_table(res: Results) -> str:
    s = res.single
    n = s["rows"]
    labels = {
        "records": "RecordFormat.encode: key/value/topic/partition/headers Arrow columns",
        "checksum": "replay checksum (replay.checksum, Python per record)",
        "pylist": "to_pylist() of the 5 record columns",
        "txn_sink": "produce, 1 transaction, as producers.produce_records + commit",
        "txn_lean": "produce, 1 transaction, positional, no per-record callback + commit",
        "plain": "produce, plain idempotent producer, per-record callback + flush",
    }
    rows = []
    for key, label in labels.items():
        secs = float(s.get(f"{key}_s", float("nan")))
        ok = s.get(f"{key}_ok", True)
        rows.append([label, _bench.fmt_rate(n / secs) + ("" if ok else " VOID"), f"{secs:.2f}"])
    return _bench.markdown_table(["step (one Python process)", "records/s", "s"], rows, "lrr")


def reading(res: Results) -> list[str]:
    """The numbers, read: generated from the results so a rerun cannot contradict them."""
    out: list[str] = []
    for writer, target in TARGETS.items():
        ps = [p for p in res.partitions if res.seconds(writer, p) and res.seconds("spark", p)]
        if not ps:
            continue
        ratios = ", ".join(f"{res.ratio(writer, p, 'spark'):.2f}x at {p}" for p in ps)
        met = all(res.ratio(writer, p, "spark") >= target for p in ps)
        out.append(
            f"**{LABELS[writer]} vs Spark's Kafka sink** ({ratios} partitions): target >= "
            f"{target}x {'met' if met else 'NOT met'}."
        )
    ps = [p for p in res.partitions if res.seconds("producer", p)]
    if ps:
        parts = []
        for writer in TARGETS:
            if all(res.seconds(writer, p) for p in ps):
                ratios = ", ".join(f"{res.ratio(writer, p):.2f}x at {p}" for p in ps)
                parts.append(f"{writer} {ratios} partitions")
        if parts:
            out.append(
                "**txsink vs the plain idempotent producer** (at-least-once, a new producer "
                f"in every task): {'; '.join(parts)}. Spark's sink, the bar above, is "
                "at-least-once too, with a Java producer cached per executor JVM."
            )
    s = res.single
    for p in res.partitions:
        pr = res.profiles.get(("wal", p), {})
        if res.seconds("wal", p):
            ph = res.phases(p, "wal")
            total = _bench.median(res.seconds("wal", p))
            line = (
                f"**WAL mode at {p} partitions**: {total:.2f} s in all; the pre-commit job "
                f"(tasks write their records to the WAL and fsync it) {ph['precommit']:.2f} s "
                f"({ph['precommit'] / total:.0%}), then the commit {ph['commit']:.2f} s "
                f"({ph['commit'] / total:.0%}): a second Spark job, one task per shard "
                f"(shards={p} here), reads the WAL and produces it with the marker."
            )
            out.append(line)
        if res.seconds("direct", p):
            ph = res.phases(p, "direct")
            total = _bench.median(res.seconds("direct", p))
            out.append(
                f"**Direct mode at {p} partitions**: {total:.2f} s in all; the single-pass job "
                f"(tasks encode, checksum and produce into open transactions, vote, wait for "
                f"the decision, commit) {ph['precommit']:.2f} s "
                f"({ph['precommit'] / total:.0%}); {ph['other']:.2f} s "
                f"({ph['other'] / total:.0%}) outside it, mostly `check()` (it fences every "
                "transactional id of the sink: once per query run, not per epoch)."
            )
        pr = res.profiles.get(("replay", p), {})
        if res.seconds("replay", p):
            ph = res.phases(p, "replay")
            total = _bench.median(res.seconds("replay", p))
            line = (
                f"**Replay mode at {p} partitions**: {total:.2f} s in all; pre-commit "
                f"{ph['precommit']:.2f} s ({ph['precommit'] / total:.0%}: a shuffle by the "
                f"key's hash into {p} shards, persisted, then counted and checksummed), commit "
                f"{ph['commit']:.2f} s ({ph['commit'] / total:.0%}: a second job re-reads the "
                "persisted shards, checksums them again and produces), and "
                f"{ph['other']:.2f} s ({ph['other'] / total:.0%}) outside both, mostly "
                "`check()`."
            )
            if pr and pr["c_total"] > 0:
                c = pr["c_total"]
                fixed = pr["c_producer"] + pr["c_marker"]
                units = max(1, pr["commit_units"])
                line += (
                    f" In the profile run: `check()` took {pr['check']:.2f} s on the driver, "
                    f"calling `init_transactions` for the {p} shards one after another and "
                    "then dropping those producers; the pre-commit tasks spent "
                    f"{pr['pre_write']:.2f} s (summed) building records and the checksum; "
                    "the shuffle by the key's hash with its persist alone, without any sink, "
                    f"takes {pr.get('shuffle_s', float('nan')):.2f} s (the plain producer's "
                    f"whole run: {_bench.median(res.seconds('producer', p)):.2f} s); the {units} "
                    f"commit tasks spent {c:.2f} s (summed), {fixed / c:.0%} of it on fixed "
                    f"costs ({fixed / units:.2f} s per task: a new transactional producer "
                    f"with `init_transactions` {pr['c_producer'] / units:.2f} s, the marker "
                    f"read {pr['c_marker'] / units:.2f} s), {pr['c_produce'] / c:.0%} "
                    f"producing, {pr['c_read'] / c:.0%} reading the persisted rows back with "
                    f"records and checksum, {pr['c_commit_txn'] / c:.0%} in "
                    "`commit_transaction`."
                )
            out.append(line)
    if s:
        n = s["rows"]
        out.append(
            f"**One Python process** (no Spark, {n:,} records): KafkaSink's produce loop in "
            f"one transaction runs at {_bench.fmt_rate(n / s['txn_sink_s'])} records/s, the "
            "same transaction with the leanest loop (positional `produce(topic, value, key)` "
            f"of two columns) at {_bench.fmt_rate(n / s['txn_lean_s'])} records/s "
            f"({s['txn_sink_s'] / s['txn_lean_s']:.2f}x), a plain idempotent producer (no "
            "transaction, the same lean loop) at "
            f"{_bench.fmt_rate(n / s['plain_s'])} records/s. All three report failed "
            "deliveries only (`delivery.report.only.error`); `commit_transaction` fails if "
            "any record of the transaction failed. The replay checksum (version "
            f"{CHECKSUM_VERSION}) costs {s['checksum_s']:.2f} s per {n:,} records, in each "
            "of the two passes (pre-commit and commit)."
        )
        if "first_delivery_ms" in s:
            out.append(
                "**Fixed costs per producer** (medians): a new idempotent producer "
                f"delivers its first record after {s['first_delivery_ms']:.0f} ms (librdkafka "
                "acquires the producer id first), `init_transactions` on a new transactional "
                f"producer takes {s['init_transactions_ms']:.0f} ms (median of 3 each), "
                "the marker read (`Markers.last`) "
                f"{s['marker_ms']:.0f} ms (median of {s.get('marker_n', 3):.0f}; a new "
                "AdminClient for `list_offsets`, then a consumer polled in 0.2 s steps until "
                "its position passes the transaction's commit marker"
                + (
                    f"; {s['marker_slow']:.0f} of the calls took over 1 s, the slowest "
                    f"{s['marker_max_ms']:.0f} ms"
                    if "marker_slow" in s
                    else ""
                )
                + "). "
                "The plain producer and replay mode pay the first two in every task; Spark's "
                "sink reuses one cached producer across tasks, which is why it gains the most "
                "from more partitions."
            )
    if res.spark_kafka is not None and res.spark_kafka.notes:
        out.append(
            "**Spark's Kafka connector version**: "
            + "; ".join(res.spark_kafka.notes)
            + f". It ran on PySpark {res.versions.get('pyspark', '?')} without errors, and its "
            "output was verified like every writer's."
        )
    if res.spark_kafka_error:
        out.append(f"**Spark's Kafka sink was not measured**: {res.spark_kafka_error}.")
    return out


def render(res: Results) -> str:
    v, mach = res.versions, res.machine
    avg_value = res.value_bytes / res.rows if res.rows else 0
    sk = res.spark_kafka
    connector = (
        ", ".join(f"{a} {ver}" for a, ver in sorted(sk.versions.items())) if sk else "not measured"
    )
    parts = [
        *_bench.header(res, "Kafka"),
        f"- Versions: PySpark {v['pyspark']} (`local[N]`, N = the most partitions measured, "
        f"for the direct writer's barrier stage; {mach['java']}), Python "
        f"{mach['python']}, pyarrow {v['pyarrow']}, confluent-kafka {v['confluent_kafka']} "
        f"(librdkafka {v['librdkafka']}), Kafka {v['broker']} (one local KRaft broker, "
        f"{v['broker_settings']}); Spark's Kafka sink: {connector}.",
        f"- Data: {res.rows:,} records, a string key (`user-NNNNNNN`, 12 bytes) and a JSON "
        f"value of {avg_value:.0f} bytes on average (a web-shop event, "
        "`to_json(named_struct('id', id, 'type', ..., 'ts', ..., 'amount', ...))`), "
        f"{res.data_bytes / 1e6:.0f} MB of key + value, generated in Spark from `spark.range`, "
        "repartitioned and cached before any timing. Each writer writes into its own fresh "
        f"topic ({res.topic_partitions} partitions, replication 1), deleted after its output is "
        "verified: read back with `isolation.level=read_committed` to the last stable offsets, "
        "exactly N records with N distinct ids, the key/value byte counts and CRC32 sums equal "
        "to the source's, no transaction left open, no WAL file left.",
        '- Writers: **txsink WAL** `Coordinator([KafkaSink(mode="wal", key="key", '
        'value="value")]).write(df, epoch=0)`, the full protocol (WAL file + fsync in each task, '
        "decision in the log, a commit job produces every record and the marker in one "
        "transaction per shard, one task per shard; `shards=<partitions>`); "
        '**txsink replay** `mode="replay", '
        "shards=<partitions>` (reshard by the key's hash, persist, count + checksum in the "
        "tasks, decision, a commit job with one transactional producer per shard); **plain "
        "idempotent producer** `mapInArrow` tasks, each with a non-transactional confluent-kafka "
        "Producer, the same produce loop (delivery callback), `flush()` at the end; **Spark "
        'Kafka sink** `df.selectExpr("key", "value").write.format("kafka")...save()`. All four '
        "with `acks=all`, idempotence, `linger.ms=20` and `compression.type=lz4` (txsink's "
        "defaults). The feed row is Spark alone: tasks that receive the batches and write "
        "nothing.",
        f"- Times are wall-clock per run, {res.repeat} run(s) each; rates use the median; MB/s "
        "counts key + value bytes.",
        *_bench.blocks(throughput_table(res), target_table(res), title="Throughput"),
    ]
    if any(res.seconds(w, p) for w in ("wal", "replay") for p in res.partitions):
        parts += _bench.blocks(
            "Driver phases (`EpochResult.seconds`, median; *check + schema + unpersist* is the "
            "rest of the wall time: the sink's start-up checks with `init_transactions` per "
            "shard, the Arrow schema, and in replay mode the `unpersist` of the epoch):",
            phase_table(res),
            title="Where txsink's time goes",
        )
    if res.profiles:
        parts += _bench.blocks(
            "Pre-commit tasks (one extra, untimed run of each mode with a subclass of KafkaSink "
            "that times its hooks per batch; seconds summed over tasks, 2 run at a time; *Spark "
            "feed* is the task's time outside the sink; replay mode's shuffle runs before these "
            "tasks, in a stage of its own: *shuffle + persist alone* times "
            '`df.repartition(shards, "key").persist().count()` without any sink):',
            precommit_profile_table(res),
            "Commit (same runs; *read* is reading the WAL file, or in replay mode Spark "
            "re-reading the persisted rows plus building the records and the checksum; "
            "*produce loop* is `producers.produce_records`; *commit_transaction* includes "
            "`begin_transaction` and the marker record):",
            commit_profile_table(res),
        )
    if res.single:
        parts += _bench.blocks(
            f"The steps of the commit on all {res.single['rows']:,} records in this process "
            "(each produce variant into a fresh topic, verified like the writers):",
            single_table(res),
            title="One Python process, no Spark",
        )
    parts += _bench.bullets("Reading", reading(res))
    return "\n".join(parts) + "\n"


# -- main -------------------------------------------------------------------------------------


def _broker_pid(bootstrap: str) -> dict[str, int]:
    """``{"kafka": pid}`` of the broker if it is integration/services' local one."""
    if not bootstrap.startswith(("127.0.0.1:", "localhost:")):
        return {}
    try:
        pid = int(_bench.REPO.joinpath("integration/.work/pids/kafka.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return {}
    return {"kafka": pid} if b"kafka" in cmdline else {}


def _versions(bench: Bench) -> dict[str, str]:
    import confluent_kafka
    import pyspark
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    broker = "?"
    if _broker_pid(bench.bootstrap):
        try:
            from _services.kafka import KAFKA_VERSION

            broker = KAFKA_VERSION
        except ImportError:
            pass
    admin = admin_client(bench.bootstrap)
    meta = admin.list_topics(timeout=30)
    res = ConfigResource(ResourceType.BROKER, str(next(iter(meta.brokers))))
    configs = admin.describe_configs([res])[res].result(timeout=30)

    def conf(name: str) -> str:
        entry = configs.get(name)
        return str(entry.value) if entry is not None else "?"

    flush = conf("log.flush.interval.messages")
    settings = (
        "no fsync per write (page cache)" if flush == str(2**63 - 1) else f"flush every {flush}"
    ) + f", num.io.threads {conf('num.io.threads')}, data on the same disk"
    return {
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
        "confluent_kafka": str(confluent_kafka.__version__),
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": broker,
        "broker_settings": settings,
    }


def parser() -> _bench.BenchParser:
    return _bench.BenchParser(
        Results,
        __doc__,
        writers=WRITERS,
        server=_bench.Server("--bootstrap", "TXSINK_KAFKA_BOOTSTRAP", "broker"),
        unit="records",
        partitions="Spark partition counts",
        extras="skip the profile runs and the single-process measurements",
        options=lambda p: p.add_count(
            "--topic-partitions", 8, "partitions of each topic (default 8)"
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every writer at every partition count, then the extras, into ``res``; the void runs."""
    import pyspark

    writers = list(args.writers)
    jars: list[Path] = []
    if "spark" in writers:
        try:
            res.spark_kafka = _spark_kafka.spark_kafka_jars(pyspark.__version__)
            jars = res.spark_kafka.jars
            for note in res.spark_kafka.notes:
                _bench.log(note)
        except (_spark_kafka.SparkKafkaUnavailable, subprocess.SubprocessError, OSError) as err:
            res.spark_kafka_error = str(err)
            _bench.log(f"Spark's Kafka sink skipped: {err}")
            writers.remove("spark")
    # The direct writer runs an epoch's tasks all at once: a slot per partition, for every
    # writer alike (on 2 cores, more slots than cores only interleave the tasks).
    slots = max(2, *args.partitions) if "direct" in args.writers else 2
    spark = _bench.spark_session("txsink-bench-kafka", jars=jars, slots=slots)
    run_id = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="txsink-bench-kafka-"))
    bench = Bench(
        spark,
        args.bootstrap,
        args.topic_partitions,
        workdir,
        _bench.CpuMeter({"spark": os.getpid(), **_broker_pid(args.bootstrap)}),
        run_id,
        marker_topic=f"txsink-bench-markers-{run_id}",
    )
    try:
        res.versions = _versions(bench)
        warm = min(args.rows, 50_000)
        _bench.log(f"warm-up (untimed): each writer once on {warm:,} records")
        df = make_frame(spark, warm, 2)
        expected = spark_fingerprint(df)
        for writer in ("feed", *writers):
            measure(bench, writer, df, rows=warm, partitions=2, expected=expected, tag="warmup")
        df.unpersist(blocking=True)
        for p in args.partitions:
            _bench.log(f"generating {args.rows:,} records in {p} partitions")
            df = make_frame(spark, args.rows, p)
            expected = spark_fingerprint(df)
            res.data_bytes = expected[1] + expected[2]
            res.value_bytes = expected[2]
            common: dict[str, Any] = {"rows": args.rows, "partitions": p, "expected": expected}
            for rep in range(args.repeat):
                res.runs.append(measure(bench, "feed", df, tag=f"p{p}-r{rep}", **common))
                # Rotate the order so no writer always runs first.
                shift = rep % len(writers) if writers else 0
                for writer in writers[shift:] + writers[:shift]:
                    res.runs.append(measure(bench, writer, df, tag=f"p{p}-r{rep}", **common))
            if not args.no_extras:
                for mode in ("wal", "replay"):
                    if mode in writers:
                        _bench.log(f"profile run {mode} P={p}")
                        res.profiles[(mode, p)] = profile_run(
                            bench, mode, df, tag=f"p{p}-profile", **common
                        )
                if p == args.partitions[0]:
                    _bench.log("single-process steps (no Spark)")
                    try:
                        res.single = single_process(bench, df, args.rows, expected)
                    except Exception as err:  # extras only: the tables above still stand
                        _bench.log(f"single-process steps failed: {_first_line(err)}")
            df.unpersist(blocking=True)
    finally:
        delete_topics(bench.bootstrap, [*bench.topics, bench.marker_topic])
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return bench.void


if __name__ == "__main__":
    sys.exit(main())
