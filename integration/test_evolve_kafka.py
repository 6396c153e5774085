"""Schema evolution of Kafka's Avro values (issue #41), against the real broker and Schema
Registry, read back with confluent-kafka's own ``Consumer`` (``read_committed``) and the
registry's ``AvroDeserializer``, not with txsink's reader.

Epoch 0 writes ``(id long, amount int, name string)``; epoch 1 adds ``note string`` and
widens ``amount`` to ``long``. Under ``add-columns`` the subject gets its second version,
registered by the epoch's tasks before the decision; old records read without ``note`` (or
with ``note`` null for a reader with the latest schema), new ones with it, every id once.
Under ``strict``, or when the subject's compatibility refuses the change, nothing of the
epoch is written and no version registered. Crash points on the evolving epoch: nothing
visible before the decision (the version an aborted attempt registered is the one its
retry registers again, with the same id); after the decision, recovery writes the records
once, encoded again with the same schema id (replay and direct mode check this with their
checksums); the driver killed after the decision, in a process of its own.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.kafka import KafkaSink
from txsink.contract import EpochCommit
from txsink.errors import ConfigurationError
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log
from txsink.schema import SchemaEvolutionError
from txsink.spark.checks import check_sinks
from txsink.txid import TxnId

pytestmark = [pytest.mark.kafka, pytest.mark.registry]

OLD = pa.schema([("id", pa.int64()), ("amount", pa.int32()), ("name", pa.string())])
NEW = pa.schema(
    [("id", pa.int64()), ("amount", pa.int64()), ("name", pa.string()), ("note", pa.string())]
)
ROWS, FILES = 200, 2  # the streaming cells: epoch 0 (the old schema), epoch 1 (the new one)


def _uid() -> str:
    return "e" + uuid.uuid4().hex[:10]


def _batch(schema: pa.Schema, ids: range) -> pa.RecordBatch:
    cols: dict[str, Any] = {"id": list(ids), "amount": [i % 1000 for i in ids]}
    cols["name"] = [f"n{i}" for i in ids]
    if "note" in schema.names:
        cols["note"] = [f"note-{i}" for i in ids]
    if schema.field("amount").type == pa.int64():
        cols["amount"] = [i + 2**40 for i in ids]  # beyond an int: only a long holds it
    return pa.RecordBatch.from_pydict(cols, schema=schema)


def _sink(kafka: Any, registry: Any, topic: str, tmp: Path, **options: Any) -> KafkaSink:
    options.setdefault("schema_evolution", "add-columns")
    if options.get("mode", "wal") == "wal":
        options.setdefault("wal", tmp / "wal")
    return KafkaSink(
        kafka.bootstrap,
        topic,
        uid=options.pop("uid", None) or _uid(),
        value_format="avro",
        schema_registry=registry.config(),
        **options,
    )


def _epoch(sink: KafkaSink, epoch: int, schema: pa.Schema, parts: list[range]) -> Any:
    """One epoch as the coordinator runs it, without Spark: the checks and the planned
    change on the driver, the sink pickled into each task, the handles."""
    changes = check_sinks([sink], schema, "app", None)
    task = pickle.loads(pickle.dumps(sink))  # as Spark ships it
    handles = []
    for p, ids in enumerate(parts):
        open_ = task.begin(TxnId("app", sink.uid, epoch, 0, p, p), schema)
        task.write(open_, _batch(schema, ids))
        handles.append(task.prepare(open_))
    return changes.get(sink.uid), handles


def _commit(sink: KafkaSink, epoch: int, handles: list[Any], change: Any) -> None:
    sink.commit_epoch(EpochCommit(epoch, tuple(handles), schema_change=change))


def _run(sink: KafkaSink, epoch: int, schema: pa.Schema, parts: list[range]) -> None:
    change, handles = _epoch(sink, epoch, schema, parts)
    _commit(sink, epoch, handles, change)


def read_values(
    bootstrap: str, registry_url: str, topic: str, reader: str | None = None
) -> list[Any]:
    """Every value a ``read_committed`` consumer sees (``readback.read_records``, to the
    settled ends), decoded by the registry's ``AvroDeserializer`` (with the writer's
    schema, or ``reader``'s)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from txsink.connectors.kafka import readback

    decode = AvroDeserializer(SchemaRegistryClient({"url": registry_url}), reader)
    ctx = SerializationContext(topic, MessageField.VALUE)
    return [decode(r.value, ctx) for r in readback.read_records(bootstrap, topic)]


def _versions(registry: Any, subject: str) -> list[int]:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        return list(registry.client().get_versions(subject))
    except SchemaRegistryError as err:
        if err.http_status_code == 404:
            return []
        raise


def _check_values(values: list[Any], old_ids: range, total: int) -> None:
    """Every id once; old records as the old schema wrote them, new ones with note and a
    long amount."""
    seen = Counter(v["id"] for v in values)
    assert sorted(seen) == list(range(total)), (len(seen), total)
    assert max(seen.values()) == 1, [i for i, n in seen.items() if n > 1][:10]
    for v in values:
        if v["id"] in old_ids:
            assert v == {"id": v["id"], "amount": v["id"] % 1000, "name": f"n{v['id']}"}
        else:
            assert v["note"] == f"note-{v['id']}" and v["amount"] >= 2**40, v


# -- without Spark: the hooks, as the coordinator calls them ------------------------------------


def test_a_new_column_and_a_wider_type_evolve_the_subject_with_the_epoch(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(2)
    subject = schema_registry.topic_subject(topic)
    sink = _sink(kafka, schema_registry, topic, tmp_path)
    change, handles = _epoch(sink, 0, OLD, [range(0, 30), range(30, 50)])
    assert change is None  # no version yet: nothing to compare
    _commit(sink, 0, handles, None)
    assert _versions(schema_registry, subject) == [1]
    fields = sink.target_schema("app")
    assert fields is not None and fields.names == ["id", "amount", "name"]

    # A new driver (no check ran in it yet) meets the evolving epoch.
    sink = _sink(kafka, schema_registry, topic, tmp_path, uid=sink.uid)
    change, handles = _epoch(sink, 1, NEW, [range(50, 80), range(80, 100)])
    assert change is not None
    assert change.describe() == "widens amount int32 -> int64; adds note (string)"
    # The tasks registered the new version as they encoded (before any decision).
    assert _versions(schema_registry, subject) == [1, 2]
    assert read_values(kafka.bootstrap, schema_registry.url, topic) != []  # epoch 0 only
    _commit(sink, 1, handles, change)

    values = read_values(kafka.bootstrap, schema_registry.url, topic)
    _check_values(values, range(50), 100)
    # A reader with the latest schema reads the old records with note null.
    latest = schema_registry.client().get_latest_version(subject).schema.schema_str
    as_latest = read_values(kafka.bootstrap, schema_registry.url, topic, latest)
    assert {v["id"]: v["note"] for v in as_latest if v["id"] < 50} == dict.fromkeys(range(50))
    assert json.loads(latest)["fields"][1]["type"] == ["null", "long"]
    # Nothing left to change: the next epoch of the new schema compares as the target.
    assert check_sinks([sink], NEW, "app", None) == {}


def test_strict_refuses_before_anything_is_written(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(1)
    subject = schema_registry.topic_subject(topic)
    sink = _sink(kafka, schema_registry, topic, tmp_path, schema_evolution="strict")
    _run(sink, 0, OLD, [range(10)])
    with pytest.raises(SchemaEvolutionError) as info:
        check_sinks([sink], NEW, "app", None)
    text = str(info.value)
    assert "widens amount int32 -> int64; adds note (string)" in text
    assert "schema_evolution='add-columns'" in text and info.value.sink_uid == sink.uid
    assert info.value.column == "amount"
    assert _versions(schema_registry, subject) == [1]
    assert len(read_values(kafka.bootstrap, schema_registry.url, topic)) == 10


def test_a_change_the_subject_refuses_stops_before_the_decision(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(1)
    subject = schema_registry.topic_subject(topic)
    sink = _sink(kafka, schema_registry, topic, tmp_path)
    _run(sink, 0, OLD, [range(10)])
    # FULL: old readers must read new records too, and an int reader cannot read a long.
    schema_registry.client().set_compatibility(subject, "FULL")
    with pytest.raises(SchemaEvolutionError) as info:
        check_sinks([sink], NEW, "app", None)
    err, text = info.value, str(info.value)
    assert err.column == "amount" and err.sink_uid == sink.uid and err.phase == "check"
    assert f"subject {subject!r} (compatibility FULL)" in text
    assert "widens amount int32 -> int64" in text and "adds note" not in text
    assert "Cast 'amount' back to int32" in text
    assert _versions(schema_registry, subject) == [1]  # the test registered nothing
    # The new column alone is FULL-compatible (optional, default null): it evolves.
    only_note = NEW.set(1, pa.field("amount", pa.int32()))
    change, handles = _epoch(sink, 1, only_note, [range(10, 20)])
    assert change is not None and change.describe() == "adds note (string)"
    _commit(sink, 1, handles, change)
    assert _versions(schema_registry, subject) == [1, 2]


def test_transitive_levels_and_registration_by_hand(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    """A *_TRANSITIVE level is tested against every version; with auto.register.schemas=False
    the new version must be registered by hand first, and the error gives the schema."""
    from confluent_kafka.schema_registry import Schema

    topic = kafka.new_topic(1)
    subject = schema_registry.topic_subject(topic)
    sink = _sink(kafka, schema_registry, topic, tmp_path)
    _run(sink, 0, OLD, [range(10)])
    schema_registry.client().set_compatibility(subject, "FULL_TRANSITIVE")
    with pytest.raises(SchemaEvolutionError, match=r"\(compatibility FULL_TRANSITIVE\)"):
        check_sinks([sink], NEW, "app", None)
    schema_registry.client().set_compatibility(subject, "BACKWARD")
    by_hand = _sink(kafka, schema_registry, topic, tmp_path, uid=sink.uid,
                    avro_config={"auto.register.schemas": False})  # fmt: skip
    with pytest.raises(SchemaEvolutionError, match=r"auto\.register\.schemas=False") as info:
        check_sinks([by_hand], NEW, "app", None)
    assert _versions(schema_registry, subject) == [1]
    wanted = str(info.value).split("with this schema: ", 1)[1].split("), or let", 1)[0]
    schema_registry.client().register_schema(subject, Schema(wanted, "AVRO"))
    _run(by_hand, 1, NEW, [range(10, 20)])
    assert _versions(schema_registry, subject) == [1, 2]
    _check_values(read_values(kafka.bootstrap, schema_registry.url, topic), range(10), 20)


def test_an_aborted_epochs_version_is_harmless(
    kafka: Any, schema_registry: Any, tmp_path: Path
) -> None:
    topic = kafka.new_topic(1)
    subject = schema_registry.topic_subject(topic)
    sink = _sink(kafka, schema_registry, topic, tmp_path)
    _run(sink, 0, OLD, [range(10)])
    _, handles = _epoch(sink, 1, NEW, [range(10, 20)])  # registered, then never decided
    for handle in handles:
        sink.abort(handle)
    registered = schema_registry.client().get_latest_version(subject)
    assert registered.version == 2  # a registry takes no version back (an admin's delete)
    values = read_values(kafka.bootstrap, schema_registry.url, topic)
    assert sorted(v["id"] for v in values) == list(range(10))  # no record references it
    # The epoch's next attempt: the target already has the new schema, nothing to plan,
    # the identical schema derived again, the same id.
    fresh = _sink(kafka, schema_registry, topic, tmp_path, uid=sink.uid)
    change, handles = _epoch(fresh, 1, NEW, [range(10, 20)])
    assert change is None
    _commit(fresh, 1, handles, change)
    assert _versions(schema_registry, subject) == [1, 2]
    _check_values(read_values(kafka.bootstrap, schema_registry.url, topic), range(10), 20)


def test_json_values_compare_nothing(kafka: Any, tmp_path: Path) -> None:
    topic = kafka.new_topic(1)
    sink = KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal=tmp_path / "wal")
    assert check_sinks([sink], OLD, "app", None) == {}
    assert sink.target_schema("app") is None
    assert check_sinks([sink], NEW, "app", None) == {}  # as before evolution existed


# -- streaming: crash points on the evolving epoch -------------------------------------------


class Evolving:
    """``foreachBatch``: the old schema in epoch 0, the new one from epoch 1 on (the
    input's upstream added a column and widened another between two batches)."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator

    def __call__(self, df: Any, epoch: int) -> None:
        from pyspark.sql import functions as F

        df = df.select("id", (F.col("id") % 1000).cast("int").alias("amount"),
                       F.concat(F.lit("n"), F.col("id").cast("string")).alias("name"))  # fmt: skip
        if epoch >= 1:
            df = df.withColumn("amount", F.col("id") + F.lit(2**40)).withColumn(
                "note", F.concat(F.lit("note-"), F.col("id").cast("string"))
            )
        self.coordinator(df, epoch)

    def close(self) -> None:
        self.coordinator.close()


def _mode_options(mode: str, tmp: Path) -> dict[str, Any]:
    if mode == "replay":
        return {"mode": "replay", "shard_by": ["id"], "shards": 2}
    if mode == "direct":
        return {"mode": "direct", "shards": 2, "timeout_s": 15}
    return {"mode": "wal", "wal": str(tmp / "wal"), "shards": 2}


def _streaming_sink(bootstrap: str, registry_url: str, topic: str, mode: str, tmp: Path) -> Any:
    return KafkaSink(
        bootstrap,
        topic,
        uid="evolving",
        value_format="avro",
        schema_registry={"url": registry_url},
        schema_evolution="add-columns",
        transactional_id_prefix=topic,
        **_mode_options(mode, tmp),
    )


def _check_stream(bootstrap: str, registry: Any, topic: str, tmp: Path) -> None:
    from txsink.testing.inputs import input_epochs

    epochs = input_epochs(tmp / "input")
    values = read_values(bootstrap, registry.url, topic)
    _check_values(values, range(len(epochs[0])), ROWS)
    assert _versions(registry, registry.topic_subject(topic)) == [1, 2]
    log = open_log(str(tmp / "txlog"))
    assert log.pending() == [] and log.last_committed() == FILES - 1


#: (mode, crash point, how): Kafka's Spark queries are the slowest part of the suite, so the
#: default suite keeps one cell (direct mode: the decided epoch's shards committed from its
#: replay, re-encoded), the driver killed after the decision (below) and the cases without
#: Spark (above); the rest is --run-slow's.
CELLS = [
    pytest.param(
        mode,
        point,
        how,
        marks=() if (mode, point) == ("direct", "after_decision") else pytest.mark.slow,
        id=f"{mode}-{point}-{how}",
    )
    for mode in ("wal", "replay", "direct")
    for point, how in (
        ("before_decision", "raise"),
        ("after_decision", "raise"),
        ("after_precommit", "kill-worker"),
    )
]


@pytest.mark.spark
@pytest.mark.parametrize(("mode", "point", "how"), CELLS)
def test_crash_on_the_evolving_epoch(
    spark: Any, kafka: Any, schema_registry: Any, tmp_path: Path, mode: str, point: str, how: str
) -> None:
    from tests.streaming import fault_spec, is_task_point, prepare_input, run_until_done
    from txsink import Coordinator

    topic = kafka.new_topic(2)
    schema_registry.topic_subject(topic)
    prepare_input(tmp_path, ROWS, FILES)
    plan = FaultPlan.parse(fault_spec(point, how, 1, epoch=1), str(tmp_path / "faults"))

    def make() -> Evolving:
        sink = _streaming_sink(kafka.bootstrap, schema_registry.url, topic, mode, tmp_path)
        return Evolving(Coordinator([sink], log=str(tmp_path / "txlog"), faults=plan))

    restarts, errors = run_until_done(spark, tmp_path, make)
    # A task killed once is retried by Spark within the epoch; a driver point restarts.
    assert restarts == (0 if is_task_point(point) else 1) and plan.fired(), errors
    _check_stream(kafka.bootstrap, schema_registry, topic, tmp_path)
    decision = open_log(str(tmp_path / "txlog")).decision(1)
    assert decision is not None
    change = decision.schema_change("evolving")
    if point != "before_decision":  # decided with the change; recovery re-applied nothing
        assert change is not None and change.describe().endswith("adds note (string)")
    else:  # the aborted attempt's version was there: the retry had nothing to change
        assert change is None


@pytest.mark.slow
@pytest.mark.spark
def test_broker_killed_after_the_evolving_epochs_decision(
    spark: Any, schema_registry: Any, tmp_path: Path
) -> None:
    """The target crashes: a private broker SIGKILLed once epoch 1 (the evolving one) is
    decided, started again before the restart; recovery commits the epoch from the WAL."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
    from crashable_targets import CrashableKafka

    from tests.streaming import prepare_input, run_until_done
    from txsink import Coordinator
    from txsink.testing.hooks import PointHooks

    server = CrashableKafka.create(tmp_path / "kafka")
    try:
        topic = f"evolve-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        admin.create_topics([NewTopic(topic, num_partitions=2)])[topic].result(30)
        schema_registry.topic_subject(topic)
        prepare_input(tmp_path, ROWS, FILES)
        hooks = PointHooks(tmp_path / "hooks")
        hooks.at("after_decision", server.kill, epoch=1)

        def make() -> Evolving:
            if not server.running():  # the orchestrator brings the broker back first
                server.start()
            sink = _streaming_sink(server.bootstrap, schema_registry.url, topic, "wal", tmp_path)
            sink.timeout_s = 10
            log = str(tmp_path / "txlog")
            return Evolving(Coordinator([sink], log=log, faults=hooks.plan(), outage_s=0))

        with hooks:
            restarts, errors = run_until_done(spark, tmp_path, make)
        assert server.kills == 1 and restarts >= 1, (server.kills, errors[-1:])
        _check_stream(server.bootstrap, schema_registry, topic, tmp_path)
    finally:
        server.stop()


def _child(workdir: str, bootstrap: str, registry_url: str, topic: str, mode: str) -> None:
    """The streaming query in a process of its own (killed and restarted by the runner)."""
    from tests.streaming import SCHEMA
    from txsink import Coordinator
    from txsink.spark.localspark import local_spark

    spark = local_spark("local[2]", "txsink-evolve")
    sink = _streaming_sink(bootstrap, registry_url, topic, mode, Path(workdir))
    coordinator = Coordinator([sink], log=str(Path(workdir, "txlog")), faults=FaultPlan.from_env())
    df = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(Path(workdir, "input")))
        .repartition(2, "id")
    )
    query = (
        df.writeStream.foreachBatch(Evolving(coordinator))
        .option("checkpointLocation", str(Path(workdir, "checkpoint")))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        coordinator.close()


@pytest.mark.spark
@pytest.mark.parametrize(
    "mode",
    ["replay", pytest.param("wal", marks=pytest.mark.slow),
     pytest.param("direct", marks=pytest.mark.slow)],
)  # fmt: skip
def test_driver_killed_after_the_evolving_epochs_decision(
    kafka: Any, schema_registry: Any, tmp_path: Path, mode: str
) -> None:
    """A new driver recovers the decided epoch: replay and direct mode encode its rows
    again, with the schema derived from the subject's new latest version, and their
    checksums prove the same bytes (the same schema id)."""
    from tests.streaming import prepare_input
    from txsink.runner import run_until_done as run_child

    topic = kafka.new_topic(2)
    schema_registry.topic_subject(topic)
    prepare_input(tmp_path, ROWS, FILES)
    repo = Path(__file__).resolve().parent.parent
    env = dict(
        os.environ,
        TXSINK_FAULT="after_decision:kill-driver@1",
        TXSINK_FAULT_STATE=str(tmp_path / "faults"),
        PYTHONPATH=os.pathsep.join([str(repo), str(repo / "integration")]),
    )
    args = {"workdir": str(tmp_path), "bootstrap": kafka.bootstrap, "topic": topic}
    args |= {"registry_url": schema_registry.url, "mode": mode}
    command = [
        sys.executable,
        "-m",
        "txsink.runner",
        f"{Path(__file__).resolve()}:_child",
        json.dumps(args),
    ]
    lines: list[str] = []
    report = run_child(command, env=env, max_runs=3, on_line=lines.append)
    assert report.finished and report.restarts == 1, (report, lines[-40:])
    _check_stream(kafka.bootstrap, schema_registry, topic, tmp_path)
    decision = open_log(str(tmp_path / "txlog")).decision(1)
    assert decision is not None and decision.schema_change("evolving") is not None


def test_unknown_options_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="schema_evolution must be one of"):
        KafkaSink("127.0.0.1:1", "t", uid="s", wal="/tmp/w", schema_evolution="loose")
    assert issubclass(SchemaEvolutionError, ConfigurationError)
