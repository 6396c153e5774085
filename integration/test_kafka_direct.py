"""Kafka's direct mode over a Kafka source: a decided epoch stays finishable (issue 34, 6-7).

The source is :mod:`kafka_partitions_source` (a Python streaming source over a Kafka topic
whose partition listing order a run chooses). Read back with a confluent-kafka
``read_committed`` consumer (not txsink's): every id once, nothing open at the broker.

1. A round-robin ``repartition(n)`` before a direct-mode sink is refused by the start-up
   check and by the first batch, before any row is read, with the fix.
2. The driver SIGKILLed right after epoch 1's decision (``after_decision:kill-driver``,
   in a child process restarted by :mod:`txsink.runner`), restarted with the source listing
   its partitions the other way round (the source runs the whole input as epoch 0 under
   availableNow, so the kill is at epoch 0): with ``repartition(2, "key")`` the replay deals the
   same rows (hash); without any repartition the replay's partitions are swapped, and the
   commit matches them to the decided shards by content.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from txsink import Coordinator
from txsink.errors import ConfigurationError
from txsink.protocol.log import open_log

ROWS, PARTITIONS, STEP = 400, 2, 50  # 4 epochs of 2 x 50 records
#: What the commit logs when it matches a shard to a replayed partition of another number.
MATCHED = "the replay numbers the epoch's partitions otherwise"


def _bootstrap() -> str:
    found = os.environ.get("TXSINK_KAFKA_BOOTSTRAP")
    if not found:
        pytest.skip("needs TXSINK_KAFKA_BOOTSTRAP (integration/services up)")
    return found


def _input_topic(bootstrap: str) -> str:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"direct-in-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])[
        topic
    ].result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(ROWS):
        row = {"id": i, "key": f"k{i % 13}"}
        producer.produce(topic, json.dumps(row).encode(), partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    return topic


def _stream(spark: Any, bootstrap: str, topic: str, order: str) -> Any:
    import kafka_partitions_source
    from pyspark import cloudpickle

    # Spark's Python processes cannot import integration/: the source travels by value.
    cloudpickle.register_pickle_by_value(kafka_partitions_source)  # type: ignore[no-untyped-call]
    spark.dataSource.register(kafka_partitions_source.KafkaPartitionsSource)
    return (
        spark.readStream.format("kafka_partitions")
        .option("bootstrap", bootstrap)
        .option("topic", topic)
        .option("order", order)
        .option("step", str(STEP))
        .load()
        .select("id", "key")
    )


def _sink(bootstrap: str, topic: str) -> Any:
    from txsink.connectors.kafka import KafkaSink

    return KafkaSink(
        bootstrap,
        topic,
        uid="direct",
        mode="direct",
        key="key",
        shards=PARTITIONS,
        transactional_id_prefix=topic,
        timeout_s=15,
    )


def _read_committed(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        ids: list[int] = []
        left, deadline = set(parts), time.monotonic() + 60
        while left and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    left.discard(msg.partition())
                continue
            ids.append(int(json.loads(msg.value() or b"{}")["id"]))
        assert not left, f"partitions not read to their end: {left}"
        return ids
    finally:
        consumer.close()


def _open_transactions(bootstrap: str, topic: str) -> int:
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


def _create_output(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"direct-out-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])[topic].result(30)
    return topic


#: Their input is kafka_partitions_source, a Python Data Source (Spark 4.0+).
_SOURCE_NEEDS_SPARK_4 = pytest.mark.spark_line("4")


@_SOURCE_NEEDS_SPARK_4
@pytest.mark.spark
@pytest.mark.kafka
def test_round_robin_repartition_is_refused_before_any_row(spark: Any, tmp_path: Path) -> None:
    bootstrap = _bootstrap()
    source, out = _input_topic(bootstrap), _create_output(bootstrap)
    log = str(tmp_path / "txlog")
    coordinator = Coordinator([_sink(bootstrap, out)], log=log, app_id="rr")
    df = _stream(spark, bootstrap, source, "forward").repartition(2)
    with pytest.raises(
        ConfigurationError,
        match=r"repartition\(2\) deals rows round-robin.*"
        r"df\.repartition\(n, 'key'\).*mode='wal'",
    ):
        coordinator.check(df)
    query = (
        df.writeStream.foreachBatch(coordinator)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="round-robin"):
        query.awaitTermination()
    assert _read_committed(bootstrap, out) == []
    assert open_log(log).states() == []
    # By key, the same pipeline passes the check.
    coordinator.check(_stream(spark, bootstrap, source, "forward").repartition(2, "key"))


def _child(workdir: str, bootstrap: str, source: str, out: str, layout: str) -> None:
    """The query in a process of its own: the first run lists the source's partitions
    forward, every restart the other way round."""
    from txsink.spark.localspark import local_spark

    first = not Path(workdir, "ran").exists()
    Path(workdir, "ran").touch()
    spark = local_spark("local[2]", "txsink-direct")
    df = _stream(spark, bootstrap, source, "forward" if first else "reverse")
    if layout == "hash":
        df = df.repartition(PARTITIONS, "key")
    coordinator = Coordinator([_sink(bootstrap, out)], log=str(Path(workdir, "txlog")))
    query = (
        df.writeStream.foreachBatch(coordinator)
        .option("checkpointLocation", str(Path(workdir, "checkpoint")))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


@_SOURCE_NEEDS_SPARK_4
@pytest.mark.spark
@pytest.mark.kafka
# The source layout's cell (about 2.5 minutes on the 2-core machine) is --run-slow's; the
# hash layout's keeps the default suite's cover of a restart listing partitions otherwise.
@pytest.mark.parametrize("layout", ["hash", pytest.param("source", marks=pytest.mark.slow)])
def test_driver_killed_after_decision_restarts_with_partitions_listed_otherwise(
    tmp_path: Path, layout: str
) -> None:
    from txsink.runner import run_until_done as run_child

    bootstrap = _bootstrap()
    source, out = _input_topic(bootstrap), _create_output(bootstrap)
    repo = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        TXSINK_FAULT="after_decision:kill-driver@0",
        TXSINK_FAULT_STATE=str(tmp_path / "faults"),
        PYTHONPATH=os.pathsep.join([str(repo), str(repo / "integration")]),
    )
    args = {"workdir": str(tmp_path), "bootstrap": bootstrap, "source": source, "out": out}
    command = [
        sys.executable,
        "-m",
        "txsink.runner",
        f"{Path(__file__).resolve()}:_child",
        json.dumps({**args, "layout": layout}),
    ]
    lines: list[str] = []
    report = run_child(command, env=env, max_runs=3, on_line=lines.append)
    assert report.finished and report.restarts == 1, (report, lines[-40:])
    # The commit's own line when it matched shards under other partition numbers: the
    # source layout must take that path (its partitions are swapped), the hash one not.
    matched = [line for line in lines if MATCHED in line]
    assert bool(matched) == (layout == "source"), matched
    ids = _read_committed(bootstrap, out)
    assert sorted(ids) == list(range(ROWS)), (len(ids), len(set(ids)))
    assert _open_transactions(bootstrap, out) == 0
    txlog = open_log(str(tmp_path / "txlog"))
    assert txlog.pending() == [] and txlog.last_committed() is not None


#: Loaded by every Python process of the child (driver, Spark's Python workers) through
#: PYTHONPATH: prints the direct-mode sink's DEBUG lines, so the test can see that a shard's
#: producer was fenced by another worker's (the case librdkafka reports as FATAL).
_SITECUSTOMIZE = """
import logging, sys
_h = logging.StreamHandler(sys.stderr)
_h.setFormatter(logging.Formatter("txsink-test-debug: %(message)s"))
_l = logging.getLogger("txsink.connectors.kafka.direct")
_l.addHandler(_h)
_l.setLevel(logging.DEBUG)
"""
#: A line of any process at ERROR or worse: Python logging's level names (txsink's,
#: Spark's log4j), librdkafka's own FATAL, and librdkafka's raw syslog levels 0-3.
_BAD_LINE = re.compile(r"\b(ERROR|FATAL|CRITICAL)\b|^%[0-3]\|")
_MOVED = "was fenced by another worker's"


@pytest.mark.spark
@pytest.mark.kafka
def test_a_direct_mode_run_without_faults_logs_no_error_line(tmp_path: Path) -> None:
    """Issue 34 point 7: no ERROR/FATAL line in a run without faults, over enough epochs
    that Spark runs a shard's task in another Python worker (its pooled producer then is
    fenced by the new one, which librdkafka reports as FATAL): every line of the driver,
    Spark and the Python workers is scanned. Read back with a read_committed consumer."""
    from txsink.runner import run_until_done as run_child
    from txsink.testing.inputs import make_input
    from txsink.testing.targets import child_env, new_targets

    bootstrap = _bootstrap()
    rows, files = 1600, 16
    env = {"TXSINK_KAFKA_BOOTSTRAP": bootstrap}
    options = {"kafka": {"mode": "direct", "shards": 2}}
    (target,) = new_targets(["kafka"], tmp_path, tag=f"quiet-{uuid.uuid4().hex[:8]}", env=env,
                            options=options)  # fmt: skip
    make_input(tmp_path / "input", rows, files)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    repo = Path(__file__).resolve().parent.parent
    child = dict(os.environ, **child_env([target]))
    child["PYTHONPATH"] = os.pathsep.join([str(site), str(repo)])
    child.pop("TXSINK_FAULT", None)
    args = {"workdir": str(tmp_path), "sinks": [target.spec], "partitions": 2}
    command = [
        sys.executable, "-m", "txsink.runner", "txsink.testing.pipelines:run_stream",
        json.dumps(args),
    ]  # fmt: skip
    lines: list[str] = []
    report = run_child(command, env=child, max_runs=1, on_line=lines.append)
    assert report.finished, lines[-40:]
    committed = [line for line in lines if "] committed: " in line]
    assert len(committed) == files, committed
    moved = [line for line in lines if _MOVED in line]
    assert moved, "no shard's task ran in another Python worker: the test proves nothing"
    bad = [line for line in lines if _BAD_LINE.search(line)]
    assert bad == [], bad[:20]
    ids = _read_committed(bootstrap, target.spec["topic"])
    assert sorted(ids) == list(range(rows)), (len(ids), len(set(ids)))
    assert _open_transactions(bootstrap, target.spec["topic"]) == 0
