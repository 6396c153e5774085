"""S3Sink against the real S3-compatible server (MinIO): hooks phase by phase, the bucket
inspected after each, start checks, bad rows, secrets, and streaming queries under every
crash point and mode, read back through the epoch manifests."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.s3 import S3Handle, S3Sink, markers, read_committed, read_manifests
from txsink.errors import CommitError, ConfigurationError, EpochAbortedError, WriteError
from txsink.handles import dump_handle, load_handle
from txsink.protocol.faults import FaultPlan
from txsink.testing.verifiers import Verdict, count_ids
from txsink.txid import TxnId

pytestmark = pytest.mark.s3
SCHEMA = pa.schema(
    [("id", pa.int64()), ("key", pa.string()), ("amount", pa.float64()), ("payload", pa.string())]
)
MiB = 1024 * 1024


def _uid() -> str:
    return "s" + uuid.uuid4().hex[:10]


def _options(s3: Any, **overrides: Any) -> dict[str, Any]:
    from botocore.config import Config

    options: dict[str, Any] = {
        "endpoint_url": s3.endpoint,
        "aws_access_key_id": s3.access_key,
        "aws_secret_access_key": s3.secret_key,
        "region_name": s3.region,
        "config": Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
    }
    options.update(overrides)
    return options


def _sink(s3: Any, bucket: str, uid: str, prefix: str = "out", **kwargs: Any) -> S3Sink:
    return S3Sink(f"s3://{bucket}/{prefix}", uid, client_options=_options(s3), **kwargs)


def _batch(ids: range, *, payload_bytes: int = 0, key: Callable[[int], Any] | None = None) -> Any:
    return pa.RecordBatch.from_pydict(
        {
            "id": list(ids),
            "key": [key(i) if key else f"k{i % 3}" for i in ids],
            "amount": [i / 4 for i in ids],
            "payload": [
                os.urandom(payload_bytes // 2).hex() if payload_bytes else f"p{i}" for i in ids
            ],
        },
        schema=SCHEMA,
    )


def _prepared(sink: S3Sink, app: str, epoch: int, partition: int, *batches: Any) -> S3Handle:
    txn = sink.begin(TxnId(app, sink.uid, epoch, 0, partition, partition + 100), SCHEMA)
    for batch in batches:
        sink.write(txn, batch)
    return sink.prepare(txn)


def _uploads(s3: Any, bucket: str) -> list[tuple[str, str]]:
    """Every open multipart upload in the bucket (listed without a prefix: MinIO)."""
    client = s3.client()
    return [
        (u["Key"], u["UploadId"])
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket)
        for u in page.get("Uploads", [])
    ]


def _keys(s3: Any, bucket: str, prefix: str = "") -> list[str]:
    client = s3.client()
    return sorted(
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for o in page.get("Contents", [])
    )


def _markers(s3: Any, bucket: str, prefix: str = "out/") -> list[str]:
    return _keys(s3, bucket, f"{prefix}_txsink/uploads/")


def _ids(s3: Any, bucket: str, uid: str | None = None, prefix: str = "out") -> list[int]:
    table = read_committed(f"s3://{bucket}/{prefix}", uid, client_options=_options(s3))
    return table.column("id").to_pylist() if "id" in table.column_names else []


def _roundtrip(handle: S3Handle) -> S3Handle:
    loaded = load_handle(json.loads(json.dumps(dump_handle(handle))))
    assert isinstance(loaded, S3Handle)
    return loaded


# -- hooks, phase by phase -----------------------------------------------------------------------


def test_prepared_is_invisible_commit_publishes_once_and_is_idempotent(s3: Any) -> None:
    bucket = s3.new_bucket()
    uid = _uid()
    sink = _sink(
        s3,
        bucket,
        uid,
        format="jsonl",
        part_bytes=5 * MiB,
        target_object_bytes=6 * MiB,
    )
    sink.check(SCHEMA, "app")
    # ~2.2 MB per batch of incompressible JSON: the first object takes three batches and
    # two parts (5 MiB + the small rest), the fourth batch rolls into a second object.
    batches = [_batch(range(i * 5000, (i + 1) * 5000), payload_bytes=400) for i in range(4)]
    handle = _prepared(sink, "app", 0, 1, *batches)
    assert handle.rows == 20000
    assert [len(o.parts) for o in handle.objects] == [2, 1]
    assert [o.key for o in handle.objects] == [
        f"out/epoch=0/{uid}-p00001-0000.jsonl",
        f"out/epoch=0/{uid}-p00001-0001.jsonl",
    ]
    # Prepared: uploads open, nothing visible but the marker.
    assert sorted(_uploads(s3, bucket)) == sorted((o.key, o.upload_id) for o in handle.objects)
    assert _keys(s3, bucket) == _markers(s3, bucket)
    assert [h.txn for h in sink.list_prepared("app")] == [handle.txn]
    assert list(sink.list_prepared("other-app")) == []

    decided = _roundtrip(handle)
    assert decided == handle
    sink.commit(decided)
    head = s3.client().head_object(Bucket=bucket, Key=handle.objects[0].key)
    assert head["ETag"].strip('"') == handle.objects[0].etag  # md5-of-md5s-2, as predicted
    assert head["ContentLength"] == handle.objects[0].nbytes
    assert _uploads(s3, bucket) == [] and _markers(s3, bucket) == []
    assert list(sink.list_prepared("app")) == []
    sink.commit(decided)  # again: the uploads are gone, the objects verified
    fresh = _sink(s3, bucket, uid, format="jsonl")
    fresh.commit(decided)  # a new driver
    sink.finish_epoch(0, [decided])
    fresh.finish_epoch(0, [decided])  # an identical manifest exists: accepted
    assert sorted(_ids(s3, bucket)) == list(range(20000))
    (manifest,) = read_manifests(f"s3://{bucket}/out", client_options=_options(s3))
    assert manifest["rows"] == 20000 and manifest["app_id"] == "app"
    assert [o["key"] for o in manifest["objects"]] == [
        f"epoch=0/{uid}-p00001-0000.jsonl",
        f"epoch=0/{uid}-p00001-0001.jsonl",
    ]


@pytest.mark.parametrize(
    ("fmt", "compression"),
    [("parquet", None), ("parquet", "zstd"), ("jsonl", "gzip"), ("csv", None), ("csv", "gzip")],
)
def test_small_output_is_one_small_part(s3: Any, fmt: str, compression: str | None) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid(), format=fmt, compression=compression)
    sink.check(SCHEMA, "app")
    handle = _prepared(sink, "app", 3, 0, _batch(range(10)), _batch(range(10, 25)))
    (obj,) = handle.objects
    assert len(obj.parts) == 1 and obj.nbytes < 5 * MiB and obj.rows == 25
    sink.commit(_roundtrip(handle))
    sink.finish_epoch(3, [handle])
    table = read_committed(f"s3://{bucket}/out", client_options=_options(s3))
    assert sorted(table.column("id").to_pylist()) == list(range(25))
    assert set(table.column("_epoch").to_pylist()) == {3}
    assert obj.key.endswith(".gz") == (compression == "gzip")


def test_empty_epoch_gets_a_manifest(s3: Any) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid(), partition_by=["key"])
    sink.check(SCHEMA, "app")
    sink.finish_epoch(0, [])
    (manifest,) = read_manifests(f"s3://{bucket}/out", client_options=_options(s3))
    assert (manifest["rows"], manifest["objects"], manifest["app_id"]) == (0, [], "app")
    assert (manifest["partition_by"], manifest["partition_types"]) == (["key"], {"key": "string"})


def test_partition_by_writes_hive_folders_and_drops_the_columns(s3: Any) -> None:
    import pyarrow.parquet as pq

    bucket = s3.new_bucket()
    uid = _uid()
    schema = SCHEMA.append(pa.field("day", pa.int32()))
    sink = S3Sink(
        f"s3://{bucket}/t",
        uid,
        partition_by=["key", "day"],
        client_options=_options(s3),
        max_open_objects=2,
    )
    sink.check(schema, "app")
    values = ["a/b=c", None, "", "x y", "ü%"]
    batch = pa.RecordBatch.from_pydict(
        {
            "id": list(range(10)),
            "key": [values[i % 5] for i in range(10)],
            "amount": [1.0] * 10,
            "payload": ["p"] * 10,
            "day": [7] * 10,
        },
        schema=schema,
    )
    txn = sink.begin(TxnId("app", uid, 2, 0, 0, 0), schema)
    sink.write(txn, batch)
    sink.write(txn, batch.slice(0, 1))  # its object was finished (max_open_objects): a new one
    handle = sink.prepare(txn)
    sink.commit(handle)
    sink.finish_epoch(2, [handle])
    keys = [k for k in _keys(s3, bucket, "t/") if not k.startswith("t/_")]
    # Groups open in order of first appearance (a/b=c, null, x y, ü%); with two open at
    # most, a/b=c was finished when x y opened, so its next row starts a new object.
    assert keys == sorted(
        [
            f"t/key=a%2Fb%3Dc/day=7/epoch=2/{uid}-p00000-0000.parquet",
            f"t/key=__HIVE_DEFAULT_PARTITION__/day=7/epoch=2/{uid}-p00000-0001.parquet",
            f"t/key=x y/day=7/epoch=2/{uid}-p00000-0002.parquet",
            f"t/key=ü%25/day=7/epoch=2/{uid}-p00000-0003.parquet",
            f"t/key=a%2Fb%3Dc/day=7/epoch=2/{uid}-p00000-0004.parquet",
        ]
    )
    body = s3.client().get_object(Bucket=bucket, Key=keys[0])["Body"].read()
    assert pq.read_table(pa.BufferReader(body)).column_names == ["id", "amount", "payload"]
    table = read_committed(f"s3://{bucket}/t", client_options=_options(s3))
    assert table.num_rows == 11
    assert table.schema.field("day").type == pa.int32()
    got = sorted(zip(table.column("id").to_pylist(), table.column("key").to_pylist(), strict=True))
    # Like Spark, '' and null share the default partition and read back as null.
    assert got[:5] == [(0, "a/b=c"), (0, "a/b=c"), (1, None), (2, None), (3, "x y")]


# -- recovery --------------------------------------------------------------------------------


@contextlib.contextmanager
def _dies_at_marker(when: str) -> Iterator[None]:
    """Patch the marker write so a task dies ``after`` CreateMultipartUpload, before it
    records the upload id, or ``before`` it, right after recording its next key."""
    real = markers.put

    def put(target: Any, txn: Any, marker: str, record: Any) -> None:
        if when == "after" and record and record[-1]["upload_id"] is not None:
            raise SystemExit("killed")
        real(target, txn, marker, record)
        if when == "before" and record and record[-1]["upload_id"] is None:
            raise SystemExit("killed")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(markers, "put", put)
        yield


def test_recovery_aborts_uploads_of_dead_and_unused_attempts(s3: Any) -> None:
    bucket = s3.new_bucket()
    uid = _uid()
    sink = _sink(s3, bucket, uid)
    sink.check(SCHEMA, "app")
    decided = _prepared(sink, "app", 0, 0, _batch(range(100)))
    # The same partition again (a retried attempt): same final key, its own upload.
    txn = sink.begin(TxnId("app", uid, 0, 0, 0, 999), SCHEMA)
    sink.write(txn, _batch(range(100)))
    leftover = sink.prepare(txn)
    assert leftover.objects[0].key == decided.objects[0].key
    # A task that died between CreateMultipartUpload and recording its upload id.
    dead_txn = sink.begin(TxnId("app", uid, 0, 0, 1, 5), SCHEMA)
    with _dies_at_marker("after"), pytest.raises(SystemExit):
        sink.write(dead_txn, _batch(range(100, 200)))
    # One that died before it created its upload: only its marker is left.
    early_txn = sink.begin(TxnId("app", uid, 0, 0, 2, 4), SCHEMA)
    with _dies_at_marker("before"), pytest.raises(SystemExit):
        sink.write(early_txn, _batch(range(100, 200)))
    # And one that died before prepare with its upload recorded.
    open_txn = sink.begin(TxnId("app", uid, 0, 0, 1, 6), SCHEMA)
    sink.write(open_txn, _batch(range(100, 200)))
    assert len(_uploads(s3, bucket)) == 4

    sink.commit(decided)
    listed = {str(h.txn): h for h in sink.list_prepared("app")}
    assert sorted(listed) == sorted(
        str(t) for t in (leftover.txn, dead_txn.txn, early_txn.txn, open_txn.txn)
    )
    assert len(listed[str(dead_txn.txn)].objects) == 1  # found by its key, not by a recorded id
    assert listed[str(early_txn.txn)].objects == ()
    for handle in listed.values():
        sink.abort(handle)
        sink.abort(handle)  # idempotent
    assert _uploads(s3, bucket) == [] and _markers(s3, bucket) == []
    sink.finish_epoch(0, [decided])
    assert sorted(_ids(s3, bucket)) == list(range(100))  # the decided attempt's object intact


def test_discard_aborts_what_the_task_opened(s3: Any) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid())
    txn = sink.begin(TxnId("app", sink.uid, 0, 0, 0, 0), SCHEMA)
    sink.write(txn, _batch(range(10)))
    sink.discard(txn)
    assert _uploads(s3, bucket) == [] and _keys(s3, bucket) == []


def test_commit_after_the_upload_was_aborted_says_rows_are_lost(s3: Any) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid())
    handle = _prepared(sink, "app", 0, 0, _batch(range(10)))
    obj = handle.objects[0]
    s3.client().abort_multipart_upload(Bucket=bucket, Key=obj.key, UploadId=obj.upload_id)
    with pytest.raises(CommitError, match=r"10 rows are LOST.*lifecycle") as info:
        sink.commit(handle)
    assert (info.value.sink_uid, info.value.epoch, info.value.phase) == (sink.uid, 0, "commit")


def test_commit_never_overwrites_a_foreign_object(s3: Any) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid())
    handle = _prepared(sink, "app", 0, 0, _batch(range(10)))
    s3.client().put_object(Bucket=bucket, Key=handle.objects[0].key, Body=b"someone else")
    with pytest.raises(CommitError, match="another writer uses this prefix"):
        sink.commit(handle)
    body = s3.client().get_object(Bucket=bucket, Key=handle.objects[0].key)["Body"].read()
    assert body == b"someone else"
    sink.abort(handle)
    assert _uploads(s3, bucket) == []


def test_an_object_changed_after_its_commit_fails_verification(s3: Any) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid())
    handle = _prepared(sink, "app", 0, 0, _batch(range(10)))
    sink.commit(handle)
    obj = handle.objects[0]
    body = s3.client().get_object(Bucket=bucket, Key=obj.key)["Body"].read()
    s3.client().put_object(  # same name, same metadata, other bytes of the same size
        Bucket=bucket,
        Key=obj.key,
        Body=body[:-1] + b"!",
        Metadata={"txsink-txn": str(handle.txn)},
    )
    with pytest.raises(CommitError, match="not what it prepared"):
        sink.commit(handle)


def test_a_different_manifest_for_the_same_epoch_is_refused(s3: Any) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid())
    first = _prepared(sink, "app", 0, 0, _batch(range(10)))
    sink.commit(first)
    sink.finish_epoch(0, [first])
    with pytest.raises(CommitError, match="already exists and lists other objects"):
        sink.finish_epoch(0, [])


# -- start checks, bad rows, secrets ------------------------------------------------------------


def test_start_checks_name_the_fix(s3: Any) -> None:
    bucket = s3.new_bucket()
    uid = _uid()
    with pytest.raises(ConfigurationError, match=r"does not exist at this endpoint") as info:
        _sink(s3, "no-such-bucket-" + uid.lower(), uid).check(SCHEMA, "app")
    assert s3.endpoint in str(info.value)
    with pytest.raises(ConfigurationError, match=r"Check the credentials"):
        S3Sink(
            f"s3://{bucket}/out",
            uid,
            client_options=_options(s3, aws_secret_access_key="wrong-secret-123"),
        ).check(SCHEMA, "app")
    from botocore.config import Config

    dead = "http://127.0.0.1:9"
    with pytest.raises(ConfigurationError, match=r"endpoint cannot be reached") as info:
        S3Sink(
            f"s3://{bucket}/out",
            uid,
            client_options=_options(
                s3,
                endpoint_url=dead,
                config=Config(retries={"max_attempts": 1}, connect_timeout=2),
            ),
        ).check(SCHEMA, "app")
    assert dead in str(info.value)
    with pytest.raises(ConfigurationError, match="cannot build an S3 client") as info:
        S3Sink(
            f"s3://{bucket}/out",
            uid,
            client_options={"endpoint": s3.endpoint, "aws_secret_access_key": s3.secret_key},
        ).check(SCHEMA, "app")
    assert s3.secret_key not in str(info.value) and "'***'" in str(info.value)
    with pytest.raises(ConfigurationError, match="partition_by column 'nope' is not in"):
        _sink(s3, bucket, uid, partition_by=["nope"]).check(SCHEMA, "app")
    with pytest.raises(ConfigurationError, match="Hive folders take string"):
        _sink(s3, bucket, uid, partition_by=["amount"]).check(SCHEMA, "app")
    nested = SCHEMA.append(pa.field("tags", pa.list_(pa.string())))
    with pytest.raises(ConfigurationError, match="CSV cannot hold") as info:
        _sink(s3, bucket, uid, format="csv").check(nested, "app")
    assert info.value.column == "tags"
    # A prefix with epochs of this uid written by another app.
    old = _sink(s3, bucket, uid)
    old.check(SCHEMA, "old-app")
    handle = _prepared(old, "old-app", 0, 0, _batch(range(3)))
    old.commit(handle)
    old.finish_epoch(0, [handle])
    with pytest.raises(ConfigurationError, match="written by app 'old-app'"):
        _sink(s3, bucket, uid).check(SCHEMA, "new-app")
    _sink(s3, bucket, uid).check(SCHEMA, "old-app")
    with pytest.raises(ValueError, match="between 5 MiB"):
        S3Sink(f"s3://{bucket}/out", uid, part_bytes=MiB)
    with pytest.raises(ValueError, match="not an S3 URL"):
        S3Sink(f"/{bucket}/out", uid)
    with pytest.raises(ValueError, match="compression='gzip' only"):
        S3Sink(f"s3://{bucket}/out", uid, format="csv", compression="zstd")


def test_bad_rows_name_sink_partition_row_and_column(s3: Any) -> None:
    bucket = s3.new_bucket()
    sink = _sink(s3, bucket, _uid(), format="jsonl", partition_by=["key"])
    sink.check(SCHEMA, "app")
    txn = sink.begin(TxnId("app", sink.uid, 4, 0, 2, 0), SCHEMA)
    sink.write(txn, _batch(range(5)))
    bad = _batch(range(5, 10)).set_column(2, "amount", pa.array([1.0, 2.0, 3.0, float("nan"), 5.0]))
    with pytest.raises(WriteError) as info:
        sink.write(txn, bad)
    err = info.value
    assert (
        err.sink_uid,
        err.epoch,
        err.partition,
        getattr(err.row, "offset", None),
        err.column,
    ) == (
        sink.uid,
        4,
        2,
        8,
        "amount",
    )
    assert "NaN" in str(err) and "format='parquet'" in str(err)
    sink.discard(txn)

    long_key = "x" * 1100
    txn = sink.begin(TxnId("app", sink.uid, 4, 0, 3, 0), SCHEMA)
    with pytest.raises(WriteError, match=r"over S3's 1024-byte limit.*shorten") as info:
        sink.write(txn, _batch(range(3), key=lambda i: long_key if i == 2 else "ok"))
    assert (getattr(info.value.row, "offset", None), info.value.column, info.value.partition) == (
        2,
        "key",
        3,
    )
    sink.discard(txn)
    assert _uploads(s3, bucket) == [] and _keys(s3, bucket) == []


def test_secrets_stay_out_of_reprs_errors_handles_and_logs(
    s3: Any, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = s3.new_bucket()
    secret = s3.secret_key
    caplog.set_level(logging.DEBUG, logger="txsink")
    sink = _sink(s3, bucket, _uid())
    sink.check(SCHEMA, "app")
    handle = _prepared(sink, "app", 0, 0, _batch(range(5)))
    leftover = _prepared(sink, "app", 0, 1, _batch(range(5)))
    sink.commit(handle)
    sink.abort(leftover)
    sink.finish_epoch(0, [handle])
    wrong = "wrong-secret-" + uuid.uuid4().hex
    with pytest.raises(ConfigurationError) as info:
        S3Sink(
            f"s3://{bucket}/out", "x", client_options=_options(s3, aws_secret_access_key=wrong)
        ).check(SCHEMA, "app")
    client = s3.client()
    texts = [
        repr(sink),
        json.dumps(dump_handle(handle)),
        str(info.value) + repr(info.value),
        caplog.text,
        *(
            client.get_object(Bucket=bucket, Key=k)["Body"].read().decode()
            for k in _keys(s3, bucket, "out/_")
        ),
    ]
    assert any("_manifests/" in k for k in _keys(s3, bucket, "out/_"))
    for text in texts:
        assert secret not in text and wrong not in text


# -- streaming -----------------------------------------------------------------------------------


def _verdict(s3: Any, bucket: str, uid: str, rows: int) -> Verdict:
    lingering = len(_uploads(s3, bucket)) + len(_markers(s3, bucket))
    return count_ids(range(rows), _ids(s3, bucket, uid), lingering=lingering)


def _s3_coordinator(
    s3: Any, tmp: Path, bucket: str, uid: str, *, log_on_s3: bool = False, **options: Any
) -> Callable[[], Any]:
    from txsink import Coordinator
    from txsink.protocol.log import open_log

    def make() -> Any:
        sink = _sink(s3, bucket, uid)
        log: Any = (
            open_log(f"s3://{bucket}/txlog", client_options=_options(s3))
            if log_on_s3
            else str(tmp / "txlog")
        )
        return Coordinator([sink], log=log, **options)

    return make


# The crash matrix (driver points with the txsink log on S3) and the kill-driver run are
# integration/test_matrix.py's, for every connector.


@pytest.mark.spark
def test_reader_following_manifests_never_sees_a_partial_epoch(
    spark: Any, s3: Any, tmp_path: Path
) -> None:
    """A crash in the middle of the commit: some objects of epoch 1 are visible to a listing,
    none to a reader that follows the manifests; the restart completes the epoch."""
    from tests.streaming import prepare_input, start_query

    bucket = s3.new_bucket()
    uid = _uid()
    prepare_input(tmp_path, 1000)  # 4 epochs of 250 ids
    plan = FaultPlan.parse("during_commit:raise@1", str(tmp_path / "faults"))
    failing = _s3_coordinator(s3, tmp_path, bucket, uid, faults=plan)()
    query = start_query(spark, tmp_path, failing)
    with pytest.raises(Exception, match="InjectedFault"):
        query.awaitTermination()
    failing.close()  # what the failed query held in this driver (its lease's thread)
    assert (
        len(_keys(s3, bucket, "out/epoch=1/")) == 1
    )  # one of the two partitions' objects completed
    table = read_committed(f"s3://{bucket}/out", uid, client_options=_options(s3))
    assert set(table.column("_epoch").to_pylist()) == {0}
    assert sorted(table.column("id").to_pylist()) == list(range(250))
    restarted = _s3_coordinator(s3, tmp_path, bucket, uid)()
    start_query(spark, tmp_path, restarted).awaitTermination()
    restarted.close()
    verdict = _verdict(s3, bucket, uid, 1000)
    assert verdict.ok, verdict
    table = read_committed(f"s3://{bucket}/out", uid, client_options=_options(s3))
    pairs = zip(table.column("id").to_pylist(), table.column("_epoch").to_pylist(), strict=True)
    by_epoch: dict[int, list[int]] = {}
    for id_, epoch in pairs:
        by_epoch.setdefault(epoch, []).append(id_)
    assert {e: sorted(ids) for e, ids in by_epoch.items()} == {
        e: list(range(e * 250, (e + 1) * 250)) for e in range(4)
    }  # every epoch whole


@pytest.mark.spark
def test_streaming_bad_row_aborts_the_epoch_and_leaves_nothing(
    spark: Any, s3: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    from tests.streaming import prepare_input, start_query
    from txsink import Coordinator

    bucket = s3.new_bucket()
    uid = _uid()
    prepare_input(tmp_path, 1000)

    def nan_at_600(df: Any) -> Any:
        return df.withColumn(
            "amount", F.when(F.col("id") == 600, F.lit(float("nan"))).otherwise(F.col("amount"))
        ).withColumn("part", F.col("id") % 3)

    sink = _sink(s3, bucket, uid, format="jsonl", partition_by=["part"])
    query = start_query(
        spark, tmp_path, Coordinator([sink], log=str(tmp_path / "txlog")), transform=nan_at_600
    )
    with pytest.raises(Exception, match=r"EpochAbortedError") as info:
        query.awaitTermination()
    text = str(info.value)
    assert "epoch 2 aborted, nothing of it is visible" in text
    assert f"sink_uid={uid}" in text and "column=amount" in text and "NaN" in text
    assert sorted(_ids(s3, bucket, uid)) == list(range(500))  # epochs 0 and 1 only
    assert _uploads(s3, bucket) == [] and _markers(s3, bucket) == []
    assert not [k for k in _keys(s3, bucket, "out/") if "/epoch=2/" in k]
    assert EpochAbortedError.__name__ in text


# Slow: the default suite kills the driver at every point with this sink inside the
# cross-system coordinator (integration/test_cross_system.py), one child run for all targets.
