"""Schema evolution of the S3 connector on a real server (issue #41): an epoch that adds a
column and a struct field and widens an int, partitioned by a Hive column; read back with
boto3 and pyarrow (not txsink's reader) and with ``read_committed``. A crash during the
evolving epoch's commit recovers it once; ``strict`` stops before any upload; a driver
killed after the decision (a child process) leaves the epoch to the restart.

The files version, with every driver crash point, is tests/test_evolve_files.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txsink import Coordinator
from txsink.connectors.s3 import S3Sink, committed_schema, read_committed
from txsink.contract import EpochCommit
from txsink.errors import InjectedFault
from txsink.kit import manifests
from txsink.protocol.faults import FaultPlan
from txsink.schema import SchemaEvolutionError, schema_from_json
from txsink.txid import TxnId

pytestmark = [pytest.mark.s3, pytest.mark.spark]

OLD_DDL = "id long, region string, amount int, payload struct<a:string>"
NEW_DDL = "id long, region string, amount long, payload struct<a:string,b:string>, note string"
UID = "evo"


def _options(s3: Any) -> dict[str, Any]:
    return {
        "endpoint_url": s3.endpoint,
        "aws_access_key_id": s3.access_key,
        "aws_secret_access_key": s3.secret_key,
        "region_name": s3.region,
    }


def _coordinator(
    s3: Any, bucket: str, tmp: Path, policy: str = "add-columns", faults: str = ""
) -> Any:
    sink = S3Sink(
        f"s3://{bucket}/out",
        UID,
        partition_by=["region"],
        client_options=_options(s3),
        schema_evolution=policy,
    )
    plan = FaultPlan.parse(faults, str(tmp / "faults")) if faults else None
    return Coordinator([sink], log=tmp / "log", app_id="app", faults=plan, outage_s=0)


def _old(spark: Any, ids: range) -> Any:
    return spark.createDataFrame([(i, f"r{i % 2}", i, {"a": f"a{i}"}) for i in ids], OLD_DDL)


def _new(spark: Any, ids: range) -> Any:
    rows = [(i, f"r{i % 2}", i * 10**10, {"a": f"a{i}", "b": f"b{i}"}, f"n{i}") for i in ids]
    return spark.createDataFrame(rows, NEW_DDL)


def _manifest(s3: Any, bucket: str, epoch: int) -> dict[str, Any] | None:
    client = s3.client()
    try:
        body = client.get_object(Bucket=bucket, Key=f"out/{manifests.key(UID, epoch)}")["Body"]
    except client.exceptions.NoSuchKey:
        return None
    return dict(json.loads(body.read()))


def _read_with_boto3(s3: Any, bucket: str) -> pa.Table:
    """A reader that is not ours: the manifests' objects through boto3, each read with
    pyarrow, joined by pyarrow's permissive promotion (the Hive column is in the key)."""
    client = s3.client()
    listed = client.list_objects_v2(Bucket=bucket, Prefix="out/_manifests/")
    tables = []
    for item in sorted(o["Key"] for o in listed.get("Contents", [])):
        doc = json.loads(client.get_object(Bucket=bucket, Key=item)["Body"].read())
        for obj in doc["objects"]:
            raw = client.get_object(Bucket=bucket, Key=f"out/{obj['key']}")["Body"].read()
            tables.append(pq.read_table(io.BytesIO(raw)))
    return pa.concat_tables(tables, promote_options="permissive")


def _assert_evolved(s3: Any, bucket: str) -> None:
    doc = _manifest(s3, bucket, 1)
    assert doc is not None
    schema = schema_from_json(doc["schema"])
    assert schema.names == ["id", "region", "amount", "payload", "note"]
    assert schema.field("amount").type == pa.int64()
    assert committed_schema(f"s3://{bucket}/out", client_options=_options(s3)) == schema
    ours = read_committed(f"s3://{bucket}/out", client_options=_options(s3))
    assert ours.schema.names == [*schema.names, "_epoch"]
    for table in (_read_with_boto3(s3, bucket), ours):
        rows = sorted(table.to_pylist(), key=lambda r: r["id"])
        assert [r["id"] for r in rows] == list(range(20))
        assert table.schema.field("amount").type == pa.int64()
        assert rows[3]["note"] is None and rows[3]["payload"] == {"a": "a3", "b": None}
        assert rows[13]["note"] == "n13" and rows[13]["amount"] == 13 * 10**10
    assert {r["region"] for r in ours.to_pylist()} == {"r0", "r1"}


def test_an_epoch_evolves_and_a_crash_in_its_commit_recovers(
    spark: Any, s3: Any, tmp_path: Path
) -> None:
    bucket = s3.new_bucket()
    _coordinator(s3, bucket, tmp_path)(_old(spark, range(10)), 0)
    crashing = _coordinator(s3, bucket, tmp_path, faults="during_commit:raise@1")
    with pytest.raises(InjectedFault):
        crashing(_new(spark, range(10, 20)), 1)
    assert _manifest(s3, bucket, 1) is None  # the first object is visible, the schema not
    _coordinator(s3, bucket, tmp_path)(_new(spark, range(10, 20)), 1)
    _assert_evolved(s3, bucket)


def test_strict_stops_before_any_upload(spark: Any, s3: Any, tmp_path: Path) -> None:
    bucket = s3.new_bucket()
    coordinator = _coordinator(s3, bucket, tmp_path, "strict")
    coordinator(_old(spark, range(10)), 0)
    with pytest.raises(SchemaEvolutionError, match="schema_evolution='add-columns'") as caught:
        coordinator(_new(spark, range(10, 20)), 1)
    assert caught.value.column == "amount" and "note" in str(caught.value)
    client = s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert not [k for k in keys if "epoch=1" in k or k.endswith(f"{1:020d}.json")]
    assert not client.list_multipart_uploads(Bucket=bucket).get("Uploads")


CHILD = """
import sys, json
from txsink.spark.localspark import local_spark
sys.path.insert(0, {here!r})
import test_evolve_s3 as t
spark = local_spark("local[2,2]", "evolve-child")
args = json.loads(sys.argv[1])
class S3: pass
s3 = S3(); s3.__dict__.update(args["s3"])
tmp = t.Path(args["tmp"])
coordinator = t._coordinator(s3, args["bucket"], tmp)
if not (tmp / "spark-committed-0").exists():  # as Spark's checkpoint: batch 0 is done
    coordinator(t._old(spark, range(10)), 0)
    (tmp / "spark-committed-0").touch()
coordinator(t._new(spark, range(10, 20)), 1)
print("CHILD DONE", flush=True)
"""


@pytest.mark.slow
@pytest.mark.chaos
def test_a_driver_killed_after_the_evolving_decision(s3: Any, tmp_path: Path) -> None:
    """A driver process SIGKILLed right after the evolving epoch's decision; the next
    driver's first call finishes it (objects, then the manifest with the new schema)."""
    bucket = s3.new_bucket()
    here = str(Path(__file__).resolve().parent)
    fields = ("endpoint", "access_key", "secret_key", "region")
    args = {"s3": {k: getattr(s3, k) for k in fields}, "bucket": bucket, "tmp": str(tmp_path)}
    env = dict(
        os.environ,
        TXSINK_FAULT="after_decision:kill-driver@1",
        TXSINK_FAULT_STATE=str(tmp_path / "faults"),
    )
    command = [sys.executable, "-c", CHILD.format(here=here), json.dumps(args)]
    first = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == -9, first.stderr[-2000:]
    assert _manifest(s3, bucket, 1) is None and _manifest(s3, bucket, 0) is not None
    second = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0 and "CHILD DONE" in second.stdout, second.stderr[-2000:]
    _assert_evolved(s3, bucket)


def test_an_old_manifest_without_a_schema_is_read_from_its_footer(s3: Any) -> None:
    """An output an older txsink wrote (version-1 handles, manifests without a schema):
    the target's schema comes from the first object's Parquet footer (a ranged GET) and
    the manifest's partition types; the next epoch's manifest records it."""
    bucket = s3.new_bucket()
    sink = S3Sink(
        f"s3://{bucket}/out", UID, partition_by=["region"], client_options=_options(s3),
        schema_evolution="add-columns",
    )  # fmt: skip
    schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("amount", pa.int32())])
    sink.check(schema, "app")
    txn = sink.begin(TxnId("app", UID, 0, 0, 0, 1), schema)
    sink.write(
        txn, pa.record_batch([[1, 2], ["r0", "r1"], pa.array([1, 2], pa.int32())], schema=schema)
    )
    handle = dataclasses.replace(sink.prepare(txn), schema="")  # as a version-1 handle
    sink.commit_epoch(EpochCommit(0, (handle,)))
    doc = _manifest(s3, bucket, 0)
    assert doc is not None and "schema" not in doc
    legacy = pa.schema([("id", pa.int64()), ("amount", pa.int32()), ("region", pa.string())])
    assert sink.target_schema("app") == legacy
    # The next epoch, with no change, records the old epochs' schema.
    txn = sink.begin(TxnId("app", UID, 1, 0, 0, 2), schema)
    sink.write(txn, pa.record_batch([[3], ["r0"], pa.array([3], pa.int32())], schema=schema))
    sink.commit_epoch(EpochCommit(1, (sink.prepare(txn),)))
    doc = _manifest(s3, bucket, 1)
    assert doc is not None and schema_from_json(doc["schema"]) == legacy
    table = read_committed(f"s3://{bucket}/out", client_options=_options(s3))
    assert sorted(table.column("id").to_pylist()) == [1, 2, 3]
