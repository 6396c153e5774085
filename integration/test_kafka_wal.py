"""KafkaSink's WAL mode on object storage (MinIO) and its commit in Spark tasks, against the
real broker, read back with read_committed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
import zlib
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from readback import open_transactions, read_topic

from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.testing import s3_wal_options
from txsink.connectors.kafka.wal import ShardResult
from txsink.contract import EpochCommit, TaskRunner
from txsink.errors import CommitError, ConfigurationError
from txsink.handles import dump_handle, load_handle
from txsink.txid import TxnId

pytestmark = [pytest.mark.kafka, pytest.mark.s3]
SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def _uid() -> str:
    return "w" + uuid.uuid4().hex[:10]


def _batch(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": list(ids), "key": [f"k{i % 5}" for i in ids]}, schema=SCHEMA
    )


def _ids(kafka: Any, topic: str) -> list[int]:
    return sorted(json.loads(r.value or b"null")["id"] for r in read_topic(kafka.bootstrap, topic))


def _sink(kafka: Any, s3: Any, topic: str, wal: str, **options: Any) -> KafkaSink:
    return KafkaSink(
        kafka.bootstrap,
        topic,
        uid=options.pop("uid", None) or _uid(),
        wal=wal,
        wal_options=options.pop("wal_options", None) or s3_wal_options(s3.env()),
        key="key",
        **options,
    )


def _prepare(sink: KafkaSink, app: str, epoch: int, partition: int, ids: range) -> Any:
    open_ = sink.begin(TxnId(app, sink.uid, epoch, 0, partition, partition), SCHEMA)
    sink.write(open_, _batch(ids))
    return sink.prepare(open_)


def _keys(s3: Any, bucket: str) -> list[str]:
    """The bucket's objects, but pyarrow's empty directory markers (``wal/``)."""
    listing = s3.client().list_objects_v2(Bucket=bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []) if not o["Key"].endswith("/"))


class Recording:
    """A :class:`TaskRunner` that keeps what the tasks returned."""

    def __init__(self, runner: TaskRunner) -> None:
        self.runner = runner
        self.results: list[Any] = []

    def run(self, fn: Any, items: Any) -> list[Any]:
        self.results = self.runner.run(fn, items)
        return self.results


def test_wal_on_s3_commits_lists_and_aborts(kafka: Any, s3: Any) -> None:
    topic = kafka.new_topic(3)
    bucket = s3.new_bucket("wal")
    sink = _sink(kafka, s3, topic, f"s3://{bucket}/wal", shards=2)
    sink.check(SCHEMA, "app")
    assert _keys(s3, bucket) == []  # the check's probe is gone
    handles = [_prepare(sink, "app", 0, p, range(p * 100, p * 100 + 100)) for p in range(3)]
    assert _keys(s3, bucket) == sorted(f"wal/{h.path}" for h in handles)
    assert _ids(kafka, topic) == []  # prepared = in the WAL, nothing in Kafka
    assert sorted(h.txn for h in sink.list_prepared("app")) == sorted(h.txn for h in handles)
    restored = [load_handle(json.loads(json.dumps(dump_handle(h)))) for h in handles]
    units: list[list[Any]] = []
    sink.commit_epoch(EpochCommit(0, tuple(restored), on_committed=lambda h: units.append([*h])))
    assert [[h.txn.partition for h in unit] for unit in units] == [[0, 2], [1]]
    assert _ids(kafka, topic) == list(range(300))
    assert _keys(s3, bucket) == [] and list(sink.list_prepared("app")) == []
    leftover = _prepare(sink, "app", 1, 0, range(5))
    sink.abort(leftover)
    sink.abort(leftover)  # idempotent
    assert _keys(s3, bucket) == [] and list(sink.list_prepared("app")) == []
    assert open_transactions(kafka.bootstrap, topic) == 0


@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_torn_or_missing_s3_wal_object_is_refused(kafka: Any, s3: Any, damage: str) -> None:
    topic = kafka.new_topic(1)
    bucket = s3.new_bucket("wal")
    sink = _sink(kafka, s3, topic, f"s3://{bucket}/wal")
    sink.check(SCHEMA, "app")
    handle = _prepare(sink, "app", 0, 0, range(50))
    key = f"wal/{handle.path}"
    client = s3.client()
    if damage == "torn":
        whole = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        client.put_object(Bucket=bucket, Key=key, Body=whole[: len(whole) // 2])
        expected = r"is corrupted or torn \(\d+ bytes"
    else:
        client.delete_object(Bucket=bucket, Key=key)
        expected = r"WAL files \[.*\] are gone from s3://.*records are lost"
    with pytest.raises(CommitError, match=expected) as info:
        sink.commit_epoch(EpochCommit(0, (handle,)))
    assert (info.value.sink_uid, info.value.epoch, info.value.phase) == (sink.uid, 0, "commit")
    assert _ids(kafka, topic) == []
    assert open_transactions(kafka.bootstrap, topic) == 0


def test_check_refuses_an_unreachable_or_unwritable_location(kafka: Any, s3: Any) -> None:
    topic = kafka.new_topic(1)
    secret = "not-the-key-" + uuid.uuid4().hex
    bad_key = {**s3_wal_options(s3.env()), "access_key": "nobody", "secret_key": secret}
    cases = {
        f"s3://no-such-bucket-{_uid()}/wal": None,
        f"s3://{s3.new_bucket('wal')}/wal": bad_key,
    }
    for url, options in cases.items():
        sink = _sink(kafka, s3, topic, url, wal_options=options)
        with pytest.raises(ConfigurationError, match=r"cannot write to the WAL location") as info:
            sink.check(SCHEMA, "app")
        err = info.value
        assert (err.sink_uid, err.phase, err.connector) == (sink.uid, "check", "kafka")
        assert "Fix: check that the location exists (the bucket)" in str(err)
        assert secret not in str(err) and secret not in repr(sink)
    with pytest.raises(ValueError, match="must not carry credentials"):
        KafkaSink(kafka.bootstrap, topic, uid=_uid(), wal="s3://key:secret@bucket/wal")


@pytest.mark.spark
def test_wal_commit_runs_in_spark_tasks(spark: Any, kafka: Any, s3: Any) -> None:
    """One Spark task per shard produces the shard's records: the driver produces none."""
    from txsink.spark.jobs import SparkTaskRunner

    topic = kafka.new_topic(3)
    bucket = s3.new_bucket("wal")
    sink = _sink(kafka, s3, topic, f"s3://{bucket}/wal", shards=3)
    sink.check(SCHEMA, "app")
    handles = [_prepare(sink, "app", 0, p, range(p * 100, p * 100 + 100)) for p in range(3)]
    tasks = Recording(SparkTaskRunner(spark))
    units: list[list[Any]] = []
    request = EpochCommit(0, tuple(handles), on_committed=lambda h: units.append([*h]), tasks=tasks)
    sink.commit_epoch(request)
    results: list[ShardResult] = tasks.results
    assert [(r.shard, r.outcome, r.records) for r in results] == [
        (s, "committed", 100) for s in range(3)
    ]
    assert os.getpid() not in {r.pid for r in results}  # produced in Spark's Python workers
    assert sorted(len(u) for u in units) == [1, 1, 1]
    assert _ids(kafka, topic) == list(range(300))
    assert _keys(s3, bucket) == []
    # Again (a retried commit): every shard's marker says done, nothing is produced twice.
    again = [_prepare(sink, "app", 0, p, range(p * 100, p * 100 + 100)) for p in range(3)]
    sink.commit_epoch(EpochCommit(0, tuple(again), tasks=tasks))
    assert {r.outcome for r in tasks.results} == {"already-committed"}
    assert _ids(kafka, topic) == list(range(300)) and _keys(s3, bucket) == []


def test_a_task_killed_mid_upload_leaves_no_object(kafka: Any, s3: Any, tmp_path: Path) -> None:
    """A process killed while its WAL file uploads leaves no object (nothing to list or
    commit), only an incomplete multipart upload for the bucket's lifecycle rule."""
    bucket = s3.new_bucket("wal")
    script = textwrap.dedent(
        f"""
        import json, os, sys
        import pyarrow as pa
        from txsink.connectors.kafka.wal.store import WalStore
        store = WalStore("s3://{bucket}/wal", json.loads(sys.argv[1]))
        out = store.writer("txsink.app.u.e0.r0.p0.a0/records.arrow")
        out.write(os.urandom(12 << 20))  # beyond a part: the multipart upload has begun
        os._exit(9)  # killed: no close, no completion
        """
    )
    options = json.dumps(s3_wal_options(s3.env()))
    done = subprocess.run([sys.executable, "-c", script, options], timeout=120, check=False)
    assert done.returncode == 9
    assert _keys(s3, bucket) == []
    uploads = s3.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["wal/txsink.app.u.e0.r0.p0.a0/records.arrow"]
    sink = KafkaSink(
        kafka.bootstrap,
        "unused",
        uid="u",
        wal=f"s3://{bucket}/wal",
        wal_options=s3_wal_options(s3.env()),
    )
    assert list(sink.list_prepared("app")) == []


def test_a_handle_of_the_previous_version_still_commits(kafka: Any, tmp_path: Path) -> None:
    """A WAL file and handle as txsink 0.1 wrote them (records.arrow written in place,
    handle version 1) commit unchanged."""
    from txsink.connectors.kafka.records.format import RECORD_SCHEMA

    topic = kafka.new_topic(1)
    uid = _uid()
    txn = TxnId("app", uid, 0, 0, 0, 0)
    folder = tmp_path / "wal" / str(txn)
    folder.mkdir(parents=True)
    records = pa.RecordBatch.from_pydict(
        {
            "topic": [topic] * 3,
            "partition": [None] * 3,
            "key": [b"k"] * 3,
            "value": [json.dumps({"id": i}).encode() for i in range(3)],
            "headers": [None] * 3,
        },
        schema=RECORD_SCHEMA,
    )
    with pa.ipc.new_file(str(folder / "records.arrow"), RECORD_SCHEMA) as writer:
        writer.write_batch(records)
    crc = zlib.crc32((folder / "records.arrow").read_bytes())
    doc = {
        "serializer": "kafka.wal",
        "version": 1,
        "data": {
            "txn": str(txn),
            "rows": 3,
            "nbytes": 10,
            "path": f"{txn}/records.arrow",
            "crc32": crc,
        },
    }
    sink = KafkaSink(kafka.bootstrap, topic, uid=uid, wal=tmp_path / "wal")
    sink.check(SCHEMA, "app")
    sink.commit_epoch(EpochCommit(0, (load_handle(doc),)))
    assert _ids(kafka, topic) == [0, 1, 2]
    assert not folder.exists()


@pytest.mark.spark
def test_restart_with_another_partition_count_commits_the_s3_wal(
    spark: Any, kafka: Any, s3: Any, tmp_path: Path
) -> None:
    """Decided with 2 Spark partitions, the WAL on S3; recovered by a query with 3 whose
    commit tasks read the decided files: exactly the decided records, nothing left."""
    from tests.streaming import prepare_input, start_query
    from txsink import Coordinator
    from txsink.protocol.faults import FaultPlan
    from txsink.testing.verifiers import count_ids

    topic = kafka.new_topic(2)
    bucket = s3.new_bucket("wal")
    uid = _uid()
    prepare_input(tmp_path, 1000)

    def coordinator(**options: Any) -> Any:
        sink = _sink(kafka, s3, topic, f"s3://{bucket}/wal", uid=uid, shards=2)
        return Coordinator([sink], log=str(tmp_path / "txlog"), **options)

    plan = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    query = start_query(spark, tmp_path, coordinator(faults=plan))
    with pytest.raises(Exception, match="InjectedFault"):
        query.awaitTermination()
    assert _keys(s3, bucket), "epoch 1's WAL files should wait on S3 for the restart"
    query = start_query(
        spark, tmp_path, coordinator(), transform=lambda df: df.repartition(3, "id")
    )
    query.awaitTermination()
    assert count_ids(range(1000), _ids(kafka, topic)).ok
    assert _keys(s3, bucket) == [] and open_transactions(kafka.bootstrap, topic) == 0
