"""Time runs out: real servers with short limits expire what txsink prepared (issue 20, 2).

txsink's crash tests stop *txsink* at a point; here the *server's clock* does the damage,
between the prepare and the commit or while the query is down. Each case must end in a
correct recovery (every id exactly once, nothing left open) or a loud, typed error that
docs/time-limits.md documents — never a silent loss or duplicate:

1. Kafka, a commit past ``transaction.timeout.ms`` (the broker aborts the transaction and
   fences its producer). WAL mode: the commit transaction outlives the timeout (its WAL
   store stalls mid-transaction); the commit fails, the restart replays the WAL. Direct
   mode: the driver pauses at ``after_decision`` while every task holds its transaction
   open; the tasks' commits fail and the driver commits the epoch from its replay.
2. Kafka, ``transactional.id.expiration.ms`` passes while the query is down (after the
   prepare, after the decision): the broker forgets the sink's transactional ids; the
   restart initialises new producer ids and recovers from the markers.
3. Kafka, the marker topic compacted as hard as the broker can across many epochs, then
   a restart at ``after_commit_before_mark``: the marker alone says the epoch committed.
4. S3 on MinIO with a stale-upload expiry of seconds: a decided epoch's uploads purged
   while the query is down is a CommitError naming the sink, the epoch and the object
   (their rows are lost, the query refuses to go on); an undecided epoch's purged uploads
   are aborted as gone and the epoch is written again.

Every server is a private one (:mod:`crashable_targets`): the shared servers keep their
defaults. The targets are read back with clients that are not txsink's: confluent-kafka
consumers (``read_committed`` for what a reader sees, ``read_uncommitted`` to see that an
aborted transaction's records really reached the broker), the broker's own transaction
log (``__transaction_state``: the abort, the expiry), boto3 (the purge: ``ListParts``
answers NoSuchUpload; MinIO's ``ListMultipartUploads`` keeps listing purged uploads from a
cache of its own, so it is not used to tell).
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crashable_targets import CrashableKafka, CrashableMinio
from pyarrow.fs import FileSystemHandler

from tests.streaming import prepare_input, run_until_done, start_query
from txsink import Coordinator
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log
from txsink.testing.hooks import PointHooks

ROWS, FILES = 600, 3
#: The shortest transaction.timeout.ms the Kafka sink accepts (connectors/kafka/checks.py).
TXN_TIMEOUT_MS = 10_000
#: The private broker's limits: every transaction timeout as short as the sink allows,
#: timed-out transactions aborted within half a second, transactional ids forgotten 6 s
#: after their last transaction, the log cleaner looking for work every 100 ms.
BROKER = {
    "transaction.max.timeout.ms": str(TXN_TIMEOUT_MS),
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
    "transactional.id.expiration.ms": "6000",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "500",
    "log.cleaner.backoff.ms": "100",
}
#: MinIO forgets a multipart upload 5 s after it began (checked every second): set only
#: while the query is down (:func:`_purge_while_down`).
MINIO = {
    "MINIO_API_STALE_UPLOADS_EXPIRY": "5s",
    "MINIO_API_STALE_UPLOADS_CLEANUP_INTERVAL": "1s",
}
#: __transaction_state's TransactionStatus values (Kafka's TransactionState ids).
COMPLETE_ABORT = 5


# -- the private broker, shared by this module's Kafka tests ------------------------------


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CrashableKafka]:
    server = CrashableKafka.create(tmp_path_factory.mktemp("expiry") / "kafka", broker=BROKER)
    try:
        yield server
    finally:
        server.stop()


def _create_topic(bootstrap: str, name: str, partitions: int, **config: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)
    admin.create_topics([topic])[name].result(30)


def _kafka_sink(
    broker: CrashableKafka | str, topic: str, tmp_path: Path, mode: str, **options: Any
) -> Any:
    from txsink.connectors.kafka import KafkaSink

    options.setdefault("wal", str(tmp_path / "wal") if mode == "wal" else None)
    options.setdefault("shards", 2 if mode == "wal" else 8)
    return KafkaSink(
        broker if isinstance(broker, str) else broker.bootstrap,
        topic,
        uid="orders",
        mode=mode,  # type: ignore[arg-type]
        key="key",
        transactional_id_prefix=topic,
        producer_config={"transaction.timeout.ms": TXN_TIMEOUT_MS},
        timeout_s=15,
        **options,
    )


def _read_ids(bootstrap: str, topic: str, isolation: str) -> list[int]:
    """Every id in ``topic`` as a ``isolation`` consumer reads it, to the end (a
    read_committed consumer's end is the last stable offset)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"expiry-{uuid.uuid4().hex}",
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        ids, left, deadline = [], set(parts), time.monotonic() + 60
        while left and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                left.discard(msg.partition())
                continue
            ids.append(int(json.loads(msg.value() or b"null")["id"]))
        assert not left, f"{topic}: no end reached in partitions {left}"
        return ids
    finally:
        consumer.close()


def _open_transactions(bootstrap: str, topic: str) -> int:
    """Partitions of ``topic`` whose last stable offset is behind the high watermark (a
    transaction open there)."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = admin.list_topics(topic, timeout=30).topics[topic].partitions

    def ends(isolation: Any) -> dict[int, int]:
        wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in parts}  # type: ignore[no-untyped-call]
        found = admin.list_offsets(wanted, isolation_level=isolation)
        return {tp.partition: fut.result(30).offset for tp, fut in found.items()}

    stable, high = ends(IsolationLevel.READ_COMMITTED), ends(IsolationLevel.READ_UNCOMMITTED)
    return sum(1 for p, end in high.items() if stable[p] < end)


def _transaction_log(bootstrap: str) -> list[tuple[str, int | None, int | None]]:
    """The broker's transaction log (``__transaction_state``, one partition here), as
    (transactional id, producer epoch, status) per record; a tombstone (the id expired)
    has ``None`` for both. Kafka's TransactionLogValue starts with ProducerId (int64),
    ProducerEpoch (int16), TransactionTimeoutMs (int32), TransactionStatus (int8), after
    its int16 version; the key is the version and the id (an int16-length string)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"expiry-txlog-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    found: list[tuple[str, int | None, int | None]] = []
    try:
        consumer.assign([TopicPartition("__transaction_state", 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:  # type: ignore[union-attr]
                    break
                raise AssertionError(msg.error())
            key = msg.key() or b""
            (length,) = struct.unpack(">h", key[2:4])
            tid = key[4 : 4 + length].decode()
            value = msg.value()
            if value is None:
                found.append((tid, None, None))
            else:
                (epoch,) = struct.unpack(">h", value[10:12])
                found.append((tid, epoch, value[16]))
    finally:
        consumer.close()
    return found


def _fired(faults: Path) -> bool:
    """The fault plan's fault fired (it leaves a file in its state folder). A restart for
    another reason (a CommitError the restart recovers from) is not the downtime."""
    return faults.is_dir() and any(faults.iterdir())


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout_s:.0f}s")
        time.sleep(0.25)


def _expired(bootstrap: str, tids: list[str]) -> bool:
    """Every one of ``tids`` has been forgotten: its newest record is a tombstone."""
    last: dict[str, int | None] = {}
    for tid, _, status in _transaction_log(bootstrap):
        last[tid] = status
    return all(tid in last and last[tid] is None for tid in tids)


def _aborted_by_broker(bootstrap: str, prefix: str) -> list[str]:
    """Transactional ids of ``prefix`` with a CompleteAbort in the broker's log."""
    return sorted(
        {
            tid
            for tid, _, status in _transaction_log(bootstrap)
            if tid.startswith(prefix) and status == COMPLETE_ABORT
        }
    )


def _verdict(broker: CrashableKafka, topic: str, tmp_path: Path, log: str) -> None:
    """Every id once for a read_committed reader, no transaction open, no WAL file left,
    the txsink log fully committed."""
    ids = _read_ids(broker.bootstrap, topic, "read_committed")
    assert sorted(ids) == list(range(ROWS)), (len(ids), len(set(ids)))
    assert _open_transactions(broker.bootstrap, topic) == 0
    wal = tmp_path / "wal"
    left = [p for p in wal.rglob("*") if p.is_file() and "_probe" not in str(p)]
    assert left == [], left
    txlog = open_log(log)
    assert txlog.pending() == [] and txlog.last_committed() == FILES - 1


def _txsink_error(err: BaseException) -> str:
    """The txsink error's line in a failed query's error (its last ``txsink.errors``)."""
    lines = [line for line in str(err).splitlines() if "txsink.errors." in line]
    return lines[-1].strip() if lines else str(err)[-3000:]


# -- 1. a commit past transaction.timeout.ms ------------------------------------------------


class _StallingHandler(FileSystemHandler):  # type: ignore[misc]
    """A local ``pyarrow.fs`` filesystem (``PyFileSystem`` over ``LocalFileSystem``)
    whose second read of a WAL file stalls ``stall_s`` once (flag files in ``flags``,
    claimed by whichever process reads). The WAL commit reads a shard's files one after
    the other inside the shard's Kafka transaction, so the transaction, begun with the
    first file's records, outlives ``transaction.timeout.ms``: what a slow object store
    does in production. Pickled by value into the commit tasks (:func:`by_value`)."""

    def __init__(self, flags: str, stall_s: float) -> None:
        from pyarrow.fs import LocalFileSystem

        self.flags, self.stall_s, self.fs = flags, stall_s, LocalFileSystem()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _StallingHandler) and other.flags == self.flags

    def __hash__(self) -> int:
        return hash(self.flags)

    def equals(self, other: Any) -> bool:
        return bool(self == other)

    def get_type_name(self) -> str:
        return "stalling"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> Any:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: Any) -> Any:
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise OSError("not here")

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        if path.endswith("records.arrow") and self._claim():
            time.sleep(self.stall_s)
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        return self.fs.open_append_stream(path, metadata=metadata)

    def _claim(self) -> bool:
        """True at the second WAL read of the test, once."""
        for name in ("first-read", "stalled"):
            with contextlib.suppress(FileExistsError):
                os.close(os.open(os.path.join(self.flags, name), os.O_CREAT | os.O_EXCL))
                return name == "stalled"
        return False


def _stalling_filesystem(flags: Path, stall_s: float) -> Any:
    from pyarrow.fs import PyFileSystem

    flags.mkdir(parents=True, exist_ok=True)
    return PyFileSystem(_StallingHandler(str(flags), stall_s))


@pytest.fixture
def by_value() -> Iterator[None]:
    """Spark's workers cannot import this module: pickle its classes by value."""
    from pyspark import cloudpickle

    module = sys.modules[__name__]
    cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow  # the broker's start and a stall past the 10 s transaction timeout
def test_kafka_wal_commit_past_transaction_timeout(
    spark: Any, tmp_path: Path, broker: CrashableKafka, by_value: None
) -> None:
    """The broker aborts the WAL commit's transaction; the error says so; the restart
    commits the epoch again from its WAL files: every id once."""
    topic = f"wal-timeout-{uuid.uuid4().hex[:6]}"
    _create_topic(broker.bootstrap, topic, 3)
    prepare_input(tmp_path, ROWS, FILES)
    flags = tmp_path / "stall"
    fs = _stalling_filesystem(flags, stall_s=TXN_TIMEOUT_MS / 1000 + 4)
    log = str(tmp_path / "txlog")

    def make() -> Coordinator:
        sink = _kafka_sink(
            broker,
            topic,
            tmp_path,
            "wal",
            shards=1,
            wal=str(tmp_path / "wal"),
            wal_filesystem=fs,
        )
        return Coordinator([sink], log=log)

    restarts, errors = run_until_done(spark, tmp_path, make)
    assert (flags / "stalled").exists(), "the WAL read never stalled: test is void"
    assert restarts >= 1, f"the stalled commit did not fail: {errors}"
    text = _txsink_error(errors[0])
    assert "CommitError" in text and "the broker aborted the commit transaction" in text, text
    assert "past transaction.timeout.ms (10s)" in text, text
    print(text)
    # The broker aborted the shard's transaction: the first file's records reached it
    # (a read_uncommitted reader sees them) and its log has the abort.
    assert _aborted_by_broker(broker.bootstrap, topic) == [f"{topic}-orders-0"]
    uncommitted = _read_ids(broker.bootstrap, topic, "read_uncommitted")
    assert len(uncommitted) > ROWS, "no aborted records at the broker: test is void"
    _verdict(broker, topic, tmp_path, log)


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow  # the broker's start and a pause past the 10 s transaction timeout
def test_kafka_direct_commit_past_transaction_timeout(
    spark: Any, tmp_path: Path, broker: CrashableKafka
) -> None:
    """The driver pauses after the decision while the tasks hold their transactions
    open, until the broker has aborted them; the tasks' commits fail (fenced), and the
    driver commits the decided shards from the epoch's replay: every id once."""
    topic = f"direct-timeout-{uuid.uuid4().hex[:6]}"
    _create_topic(broker.bootstrap, topic, 3)
    prepare_input(tmp_path, ROWS, FILES)
    hooks = PointHooks(tmp_path / "hooks")
    bootstrap = broker.bootstrap

    def until_aborted() -> None:
        _wait_for(
            "the broker to abort the epoch's transactions",
            lambda: len(_aborted_by_broker(bootstrap, topic)) >= 2,
            timeout_s=TXN_TIMEOUT_MS / 1000 * 4,
        )

    hooks.at("after_decision", until_aborted, epoch=1)
    log = str(tmp_path / "txlog")

    def make() -> Coordinator:
        return Coordinator(
            [_kafka_sink(broker, topic, tmp_path, "direct")], log=log, faults=hooks.plan()
        )

    with hooks:
        restarts, errors = run_until_done(spark, tmp_path, make)
    assert hooks.fired and not hooks.errors, hooks.errors
    aborted = _aborted_by_broker(bootstrap, topic)
    assert {f"{topic}-orders-0", f"{topic}-orders-1"} <= set(aborted), aborted
    uncommitted = _read_ids(bootstrap, topic, "read_uncommitted")
    assert len(uncommitted) > ROWS, "no aborted records at the broker: test is void"
    _verdict(broker, topic, tmp_path, log)
    print(f"direct mode, commit past the timeout: {restarts} restarts, errors {errors}")


# -- 2. transactional ids expire while the query is down ---------------------------------------


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["wal", "direct"])
@pytest.mark.parametrize("point", ["before_decision", "after_decision"])
def test_kafka_transactional_ids_expire_while_down(
    spark: Any, tmp_path: Path, broker: CrashableKafka, mode: str, point: str
) -> None:
    """The query stops at ``point`` of epoch 1 (prepared; decided) and stays down until
    the broker has forgotten every transactional id of the sink
    (``transactional.id.expiration.ms``); the restart recovers: every id once."""
    topic = f"expire-{mode}-{uuid.uuid4().hex[:6]}"
    _create_topic(broker.bootstrap, topic, 3)
    prepare_input(tmp_path, ROWS, FILES)
    log = str(tmp_path / "txlog")
    shards = 2 if mode == "wal" else 8
    tids = [f"{topic}-orders-{shard}" for shard in range(shards)]
    faults = tmp_path / "faults"
    plan = FaultPlan.parse(f"{point}:raise@1", str(faults))
    waited: list[str] = []

    def make() -> Coordinator:
        if _fired(faults) and not waited:  # down: until the broker forgot the sink's ids
            known = {tid for tid, _, _ in _transaction_log(broker.bootstrap)}
            mine = [tid for tid in tids if tid in known]
            assert mine, "the sink's transactional ids never reached the broker"
            _wait_for("the transactional ids to expire", lambda: _expired(broker.bootstrap, mine))
            waited.extend(mine)
        return Coordinator([_kafka_sink(broker, topic, tmp_path, mode)], log=log, faults=plan)

    restarts, errors = run_until_done(spark, tmp_path, make)
    assert waited and restarts >= 1, (restarts, errors)
    assert any("InjectedFault" in str(e) for e in errors), errors
    _verdict(broker, topic, tmp_path, log)


def _child_stream(workdir: str, bootstrap: str, topic: str) -> None:
    """A direct-mode query in a process of its own (``python -m txsink.runner``), killed
    by its ``TXSINK_FAULT``: the driver's death takes Spark's JVM and workers with it, and
    the tasks' open transactions stay at the broker."""
    from txsink.spark.localspark import local_spark
    from txsink.testing.pipelines import input_stream

    spark = local_spark("local[2]", "txsink-expiry")
    sink = _kafka_sink(bootstrap, topic, Path(workdir), "direct")
    coordinator = Coordinator([sink], log=str(Path(workdir, "txlog")))
    query = (
        input_stream(spark, workdir, 2)
        .writeStream.foreachBatch(coordinator)
        .option("checkpointLocation", str(Path(workdir, "checkpoint")))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow  # two driver processes, each with its own Spark
def test_kafka_direct_driver_killed_ids_expire_while_down(
    tmp_path: Path, broker: CrashableKafka
) -> None:
    """The driver is SIGKILLed at ``after_decision`` of epoch 1 while its tasks hold the
    epoch's transactions open. The tasks lose the driver's vote connection and abort them
    at once (measured: nothing is left open by the time the driver's process is gone);
    the query stays down until the broker has forgotten the transactional ids
    (``transactional.id.expiration.ms``); the restart commits the decided epoch from its
    replay: every id once."""
    from txsink.runner import run_until_done as run_child

    topic = f"killed-{uuid.uuid4().hex[:6]}"
    _create_topic(broker.bootstrap, topic, 3)
    prepare_input(tmp_path, ROWS, FILES)
    tids = [f"{topic}-orders-0", f"{topic}-orders-1"]
    seen_open: list[int] = []

    def down(run: int, code: int) -> None:
        seen_open.append(_open_transactions(broker.bootstrap, topic))
        _wait_for("the open transactions to expire", lambda: _expired(broker.bootstrap, tids))

    repo = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        TXSINK_FAULT="after_decision:kill-driver@1",
        TXSINK_FAULT_STATE=str(tmp_path / "faults"),
        PYTHONPATH=os.pathsep.join([str(repo), str(repo / "integration")]),
    )
    args = {"workdir": str(tmp_path), "bootstrap": broker.bootstrap, "topic": topic}
    command = [
        sys.executable,
        "-m",
        "txsink.runner",
        f"{Path(__file__).resolve()}:_child_stream",
        json.dumps(args),
    ]
    report = run_child(command, env=env, max_runs=3, on_restart=down)
    assert report.finished and report.restarts == 1, report
    # The killed driver's tasks aborted their transactions (the broker's log has the
    # aborts, nothing was open while the query was down), and the ids then expired.
    assert seen_open == [0], seen_open
    assert set(tids) <= set(_aborted_by_broker(broker.bootstrap, topic))
    _verdict(broker, topic, tmp_path, str(tmp_path / "txlog"))


# -- 3. the marker topic compacted hard ---------------------------------------------------------


@pytest.mark.spark
@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["wal", "direct"])
def test_kafka_markers_survive_aggressive_compaction(
    spark: Any, tmp_path: Path, broker: CrashableKafka, mode: str
) -> None:
    """Six epochs into a marker topic the cleaner compacts within a second; the query
    stops at ``after_commit_before_mark`` of epoch 4 (committed in Kafka, not in the
    txsink log), the cleaner runs again, the restart must learn from the compacted
    marker alone that epoch 4 is committed (not write it twice) and go on to epoch 5."""
    files = 6
    topic = f"compact-{mode}-{uuid.uuid4().hex[:6]}"
    markers = f"{topic}-markers"
    _create_topic(broker.bootstrap, topic, 3)
    _create_topic(
        broker.bootstrap,
        markers,
        1,
        **{
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.0001",
            "min.compaction.lag.ms": "0",
            "delete.retention.ms": "0",
        },
    )
    prepare_input(tmp_path, ROWS, files)
    log = str(tmp_path / "txlog")
    faults = tmp_path / "faults"
    plan = FaultPlan.parse("after_commit_before_mark:raise@4", str(faults))
    waited: list[int] = []

    def make() -> Coordinator:
        if _fired(faults) and not waited:  # down: the cleaner compacts the marker topic
            _wait_for("the marker topic to be compacted", lambda: _compacted(broker, markers))
            waited.append(1)
        sink = _kafka_sink(broker, topic, tmp_path, mode, marker_topic=markers)
        return Coordinator([sink], log=log, faults=plan)

    _, errors = run_until_done(spark, tmp_path, make)
    assert waited and any("InjectedFault" in str(e) for e in errors), errors
    ids = _read_ids(broker.bootstrap, topic, "read_committed")
    assert sorted(ids) == list(range(ROWS)), (len(ids), len(set(ids)))
    assert _open_transactions(broker.bootstrap, topic) == 0
    txlog = open_log(log)
    assert txlog.pending() == [] and txlog.last_committed() == files - 1


def _compacted(broker: CrashableKafka, topic: str) -> bool:
    """The cleaner removed superseded markers: fewer marker records than were written,
    every key's newest value kept (its epoch only grows)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    tp = TopicPartition(topic, 0)
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    end = admin.list_offsets({tp: latest})[tp].result(30).offset
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"expiry-{uuid.uuid4().hex}",
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    records = 0
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while True:
            msg = consumer.poll(10)
            assert msg is not None, "no end of the marker topic"
            if msg.error() is not None:
                assert msg.error().code() == KafkaError._PARTITION_EOF  # type: ignore[union-attr]
                break
            records += 1
    finally:
        consumer.close()
    # Each commit wrote a marker record and a commit control record: compaction leaves
    # fewer records than offsets behind.
    return bool(0 < records < end // 2 - 1)


# -- 4. MinIO purges prepared multipart uploads --------------------------------------------------


def _s3(server: CrashableMinio) -> tuple[Any, dict[str, Any]]:
    import boto3

    from txsink.connectors.s3.testing import client_options

    client = boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name="us-east-1",
    )
    return client, client_options(server.env())


def _uploads(client: Any, bucket: str) -> list[tuple[str, str]]:
    """(key, upload id) of the uploads MinIO lists (its list may show purged ones)."""
    listed = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    return [(u["Key"], u["UploadId"]) for u in listed]


def _gone(client: Any, bucket: str, uploads: list[tuple[str, str]]) -> bool:
    """Every one of ``uploads`` is purged: ListParts answers NoSuchUpload."""
    from txsink.connectors.s3.markers import upload_exists

    return not any(upload_exists(client, bucket, key, upload) for key, upload in uploads)


def _purge_while_down(server: CrashableMinio, client: Any, uploads: list[tuple[str, str]]) -> None:
    """While the query is down: MinIO restarted with a stale-upload expiry of seconds
    until it has purged ``uploads``, then restarted without (so that the running query's
    own uploads are never purged: an epoch may take more than 5 s on a busy machine)."""
    if server.running():
        server.kill()
    server.extra_env.update(MINIO)
    server.start()
    _wait_for("MinIO to purge the uploads", lambda: _gone(client, "expiry", uploads))
    server.kill()
    server.extra_env.clear()
    server.start()


def _markers(client: Any, bucket: str) -> list[str]:
    """txsink's upload markers left in the bucket (``<prefix>_txsink/uploads/``)."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix="orders/_txsink/uploads/")
    return [o["Key"] for o in listed.get("Contents", [])]


@pytest.mark.spark
@pytest.mark.s3
def test_s3_decided_uploads_purged_while_down(spark: Any, tmp_path: Path) -> None:
    """Epoch 1 is decided, the query stops before its commit, MinIO purges its uploads:
    the restart raises CommitError naming the sink, the epoch and the object (the rows
    are lost: loud, and the query refuses to go on, every time)."""
    from pyspark.errors import StreamingQueryException

    from txsink.connectors.s3 import S3Sink

    server = CrashableMinio.create(tmp_path / "minio")
    try:
        client, options = _s3(server)
        client.create_bucket(Bucket="expiry")
        prepare_input(tmp_path, ROWS, FILES)
        log = str(tmp_path / "txlog")
        prepared: list[tuple[str, str]] = []
        hooks = PointHooks(tmp_path / "hooks")
        hooks.at("after_decision", lambda: prepared.extend(_uploads(client, "expiry")), epoch=1)
        plan = hooks.plan(FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults")))

        def run() -> BaseException | None:
            sink = S3Sink("s3://expiry/orders/", "s3", client_options=options)
            query = start_query(spark, tmp_path, Coordinator([sink], log=log, faults=plan))
            try:
                query.awaitTermination()
            except StreamingQueryException as err:
                return err
            return None

        with hooks:
            first = run()
        assert "InjectedFault" in str(first), first
        assert prepared, "epoch 1 prepared no upload: test is void"
        _purge_while_down(server, client, prepared)
        second = run()
    finally:
        server.stop()
    text = _txsink_error(second) if second is not None else ""
    print(text)
    assert "CommitError" in text and "LOST" in text, text[-3000:]
    assert "sink_uid=s3" in text or "sink=s3" in text, text[-3000:]
    assert "epoch=1" in text and any(key in text for key, _ in prepared), text[-3000:]
    txlog = open_log(log)
    assert txlog.last_committed() == 0 and [p.epoch for p in txlog.pending()] == [1]


@pytest.mark.spark
@pytest.mark.s3
def test_s3_undecided_uploads_purged_while_down(spark: Any, tmp_path: Path) -> None:
    """Epoch 1 is prepared, MinIO dies before the decision (so nothing aborts its
    uploads), comes back and purges them while the query is down: recovery aborts what is
    gone, the epoch is written again, every id once, nothing left."""
    from txsink.connectors.s3 import S3Sink
    from txsink.connectors.s3.testing import S3Verifier

    server = CrashableMinio.create(tmp_path / "minio")
    try:
        client, options = _s3(server)
        client.create_bucket(Bucket="expiry")
        prepare_input(tmp_path, ROWS, FILES)
        log = str(tmp_path / "txlog")
        prepared: list[tuple[str, str]] = []

        def kill() -> None:
            prepared.extend(_uploads(client, "expiry"))
            server.kill()

        hooks = PointHooks(tmp_path / "hooks")
        hooks.at("before_decision", kill, epoch=1)
        plan = hooks.plan(FaultPlan.parse("before_decision:raise@1", str(tmp_path / "faults")))

        def make() -> Coordinator:
            if not server.running():
                _purge_while_down(server, client, prepared)
            sink = S3Sink("s3://expiry/orders/", "s3", client_options=options)
            return Coordinator([sink], log=log, faults=plan)

        with hooks:
            restarts, errors = run_until_done(spark, tmp_path, make)
        assert prepared, "epoch 1 prepared no upload: test is void"
        # killed at before_decision, then once more to take the expiry off again
        assert server.kills == 2 and restarts >= 1, (server.kills, restarts, errors)
        verifier = S3Verifier("s3://expiry/orders/", range(ROWS), uid="s3", client_options=options)
        ids = verifier.read_ids()
        live = [u for u in _uploads(client, "expiry") if not _gone(client, "expiry", [u])]
        left = _markers(client, "expiry")
    finally:
        server.stop()
    assert sorted(ids) == list(range(ROWS)), (len(ids), len(set(ids)), errors[-1:])
    assert live == [] and left == [], (live, left)
    txlog = open_log(log)
    assert txlog.pending() == [] and txlog.last_committed() == FILES - 1
