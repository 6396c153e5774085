"""Schema evolution of the files connector (issue #41): an epoch that adds a column and a
struct field and widens an int, on the shared local Spark session; the epoch's manifest
carries the new schema, readers that are not ours read old and new rows, ``strict`` stops
before writing, and the crash points on the evolving epoch recover it once.

The S3 version, on MinIO, is integration/test_evolve_s3.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txsink import Coordinator
from txsink.connectors.files import FilesHandle, FilesSink, committed_schema, read_committed
from txsink.contract import EpochCommit
from txsink.errors import InjectedFault
from txsink.handles import dump_handle, load_handle
from txsink.kit import manifests
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import open_log
from txsink.schema import SchemaChange, SchemaEvolutionError, diff, schema_from_json
from txsink.txid import TxnId

OLD_DDL = "id long, amount int, payload struct<a:string>"
NEW_DDL = "id long, amount long, payload struct<a:string,b:string>, note string"
NEW = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.int64()),
        ("payload", pa.struct([("a", pa.string()), ("b", pa.string())])),
        ("note", pa.string()),
    ]
)


def _old(spark: Any, ids: range) -> Any:
    return spark.createDataFrame([(i, i, {"a": f"a{i}"}) for i in ids], OLD_DDL)


def _new(spark: Any, ids: range) -> Any:
    rows = [(i, i * 10**10, {"a": f"a{i}", "b": f"b{i}"}, f"n{i}") for i in ids]
    return spark.createDataFrame(rows, NEW_DDL)


def _coordinator(tmp: Path, policy: str = "add-columns", faults: str | None = None) -> Any:
    sink = FilesSink(tmp / "out", "out", schema_evolution=policy)
    plan = FaultPlan.parse(faults, str(tmp / "faults")) if faults else None
    return Coordinator([sink], log=tmp / "log", app_id="app", faults=plan, outage_s=0)


def _manifest(tmp: Path, epoch: int) -> dict[str, Any] | None:
    path = tmp / "out" / manifests.key("out", epoch)
    return json.loads(path.read_text()) if path.exists() else None


def _read_with_pyarrow(tmp: Path) -> pa.Table:
    """What a reader that is not ours does: each epoch's Parquet files through the
    manifests, one table (pyarrow promotes and fills the missing columns)."""
    tables = []
    for name in sorted(os.listdir(tmp / "out" / "_manifests")):
        doc = json.loads((tmp / "out" / "_manifests" / name).read_text())
        tables += [pq.read_table(tmp / "out" / f["path"]) for f in doc["files"]]
    return pa.concat_tables(tables, promote_options="permissive")


def _assert_evolved(tmp: Path) -> None:
    """Epochs 0 (old schema, ids 0-9) and 1 (new, ids 10-19), each once, read back."""
    doc = _manifest(tmp, 1)
    assert doc is not None
    assert schema_from_json(doc["schema"]) == NEW
    assert doc["schema"]["columns"]["amount"] == "int64"
    old = _manifest(tmp, 0)
    assert old is not None and schema_from_json(old["schema"]).field("amount").type == pa.int32()
    for table in (_read_with_pyarrow(tmp), read_committed(tmp / "out")):
        rows = sorted(table.to_pylist(), key=lambda r: r["id"])
        assert [r["id"] for r in rows] == list(range(20))
        assert table.schema.field("amount").type == pa.int64()
        assert rows[3]["note"] is None and rows[3]["payload"] == {"a": "a3", "b": None}
        assert rows[13]["note"] == "n13" and rows[13]["amount"] == 13 * 10**10
    assert read_committed(tmp / "out").schema.names == [*NEW.names, "_epoch"]
    assert committed_schema(tmp / "out") == NEW
    assert open_log(tmp / "log").pending() == []


@pytest.mark.spark
@pytest.mark.matrix("schema_evolution")
def test_an_epoch_adds_and_widens_with_add_columns(spark: Any, tmp_path: Path) -> None:
    coordinator = _coordinator(tmp_path)
    coordinator(_old(spark, range(10)), 0)
    coordinator(_new(spark, range(10, 20)), 1)
    _assert_evolved(tmp_path)
    # The next epoch with the narrower, older schema changes nothing: the target keeps
    # the wider one (no change under strict either).
    strict = _coordinator(tmp_path, "strict")
    strict(_old(spark, range(20, 25)), 2)
    doc = _manifest(tmp_path, 2)
    assert doc is not None and schema_from_json(doc["schema"]) == NEW
    assert read_committed(tmp_path / "out").num_rows == 25


@pytest.mark.spark
@pytest.mark.matrix("schema_evolution")
def test_strict_stops_before_writing(spark: Any, tmp_path: Path) -> None:
    coordinator = _coordinator(tmp_path, "strict")
    coordinator(_old(spark, range(10)), 0)
    with pytest.raises(SchemaEvolutionError) as caught:
        coordinator(_new(spark, range(10, 20)), 1)
    text = str(caught.value)
    assert "schema_evolution='add-columns'" in text
    for part in ("amount int32 -> int64", "payload.b", "note"):
        assert part in text
    assert caught.value.column == "amount"
    assert _manifest(tmp_path, 1) is None
    assert not (tmp_path / "out" / "epoch=1").exists()
    assert os.listdir(tmp_path / "out" / "_txsink" / "staging") == []
    assert read_committed(tmp_path / "out").num_rows == 10


@pytest.mark.spark
@pytest.mark.chaos
@pytest.mark.parametrize(
    "point", ["after_precommit", "before_decision", "after_decision", "during_commit"]
)
def test_a_crash_on_the_evolving_epoch(spark: Any, tmp_path: Path, point: str) -> None:
    """Raise at ``point`` of the evolving epoch; a new coordinator replays the epoch (as a
    restarted query does): the epoch is visible once, with its schema, or (before the
    decision) not at all until the replay writes it. ``after_precommit``: the task's
    Python worker is killed twice (Spark's one retry does not absorb it), the epoch fails."""
    _coordinator(tmp_path)(_old(spark, range(10)), 0)
    spec = f"{point}:kill-worker@1#1*2" if point == "after_precommit" else f"{point}:raise@1"
    crashing = _coordinator(tmp_path, faults=spec)
    with pytest.raises(Exception) as caught:
        crashing(_new(spark, range(10, 20)), 1)
    assert point == "after_precommit" or isinstance(caught.value, InjectedFault)
    if point != "during_commit":
        assert _manifest(tmp_path, 1) is None  # the schema has not changed: no epoch 1 yet
        assert committed_schema(tmp_path / "out") == _schema_of(OLD_DDL)
    _coordinator(tmp_path)(_new(spark, range(10, 20)), 1)
    _assert_evolved(tmp_path)


def _schema_of(ddl: str) -> pa.Schema:
    assert ddl == OLD_DDL
    return pa.schema(
        [("id", pa.int64()), ("amount", pa.int32()), ("payload", pa.struct([("a", pa.string())]))]
    )


# -- the hooks, without Spark ---------------------------------------------------------


def _write_epoch(sink: FilesSink, epoch: int, table: pa.Table) -> FilesHandle:
    txn = sink.begin(TxnId("app", sink.uid, epoch, 0, 0, 1), table.schema)
    for batch in table.to_batches():
        sink.write(txn, batch)
    return sink.prepare(txn)


def test_csv_refuses_a_struct_column_before_the_epoch(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "out", format="csv", schema_evolution="add-columns")
    old = pa.schema([("id", pa.int64())])
    new = old.append(pa.field("payload", pa.struct([("a", pa.string())])))
    found = diff(old, new)
    change = SchemaChange("out", old, found.merged, found.changes)
    with pytest.raises(SchemaEvolutionError) as caught:
        sink.prepare_evolution(change, "app")
    assert caught.value.column == "payload"
    assert "CSV" in str(caught.value) and "format='parquet'" in str(caught.value)
    assert not (tmp_path / "_manifests").exists()  # wrote nothing


def test_old_manifests_without_a_schema_stay_readable(tmp_path: Path) -> None:
    """A manifest an older txsink wrote (no schema, version-1 handles): its schema comes
    from its Parquet footer, and the next epoch's manifest records it, widened."""
    sink = FilesSink(tmp_path, "out", schema_evolution="add-columns")
    sink.check(_schema_of(OLD_DDL), "app")
    old = pa.table(
        {"id": [1], "amount": pa.array([1], pa.int32()), "payload": [{"a": "x"}]},
        schema=_schema_of(OLD_DDL),
    )
    handle = _write_epoch(sink, 0, old)
    # What an older txsink decided: a version-1 handle, without the schema.
    doc = dump_handle(handle)
    doc["version"], doc["data"] = 1, {k: v for k, v in doc["data"].items() if k != "schema"}
    v1 = load_handle(doc)
    assert isinstance(v1, FilesHandle) and v1.schema == ""
    sink.commit(v1)
    sink.finish_epoch(0, [v1])
    manifest = json.loads((tmp_path / manifests.key("out", 0)).read_text())
    assert "schema" not in manifest
    assert sink.target_schema("app") == _schema_of(OLD_DDL)
    new = pa.table({"id": [2], "amount": [2**40], "note": ["n"]})
    handle = _write_epoch(sink, 1, new)
    found = diff(_schema_of(OLD_DDL), new.schema)
    change = SchemaChange("out", _schema_of(OLD_DDL), found.merged, found.changes)
    sink.commit_epoch(EpochCommit(1, (handle,), schema_change=change))
    sink.commit_epoch(EpochCommit(1, (handle,), schema_change=change))  # idempotent
    assert sink.target_schema("app") == found.merged
    table = read_committed(tmp_path)
    assert table.column("amount").to_pylist() == [1, 2**40]
    assert table.column("note").to_pylist() == [None, "n"]
    assert table.column("payload").to_pylist() == [{"a": "x"}, None]


def test_an_empty_first_epoch_records_no_schema(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "out", schema_evolution="add-columns")
    sink.check(_schema_of(OLD_DDL), "app")
    sink.finish_epoch(0, [])
    assert sink.target_schema("app") is None
    shutil.rmtree(tmp_path / "_manifests")
    assert sink.target_schema("app") is None


@pytest.mark.spark
@pytest.mark.slow
def test_spark_reads_the_evolved_output(spark: Any, tmp_path: Path) -> None:
    """Spark's own Parquet reader, as docs/connectors/files.md says: ``mergeSchema``
    joins added columns and struct fields; a widened column needs the newest schema
    given (Spark's schema merge refuses int and bigint in one column)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    coordinator = _coordinator(tmp_path)
    coordinator(_old(spark, range(10)), 0)
    adds = "id long, amount int, payload struct<a:string,b:string>, note string"
    coordinator(spark.createDataFrame([(10, 10, {"a": "a", "b": "b"}, "n")], adds), 1)
    out = str(tmp_path / "out")
    merged = spark.read.option("mergeSchema", "true").parquet(out)
    rows = {r["id"]: r for r in merged.collect()}
    assert len(rows) == 11 and rows[3]["note"] is None and rows[10]["payload"]["b"] == "b"
    coordinator(_new(spark, range(11, 20)), 2)
    schema = committed_schema(out)
    assert schema is not None and schema.field("amount").type == pa.int64()
    rows = {r["id"]: r for r in spark.read.schema(from_arrow_schema(schema)).parquet(out).collect()}
    assert len(rows) == 20 and rows[3]["amount"] == 3 and rows[13]["amount"] == 13 * 10**10
    assert rows[3]["payload"]["b"] is None and rows[13]["note"] == "n13"


def test_json_lines_epochs_of_two_schemas_read_back(tmp_path: Path) -> None:
    """JSON lines carry no types: the manifest records them, and read_committed joins the
    epochs with their inferred types (a column added later is null in older rows)."""
    sink = FilesSink(tmp_path, "out", format="jsonl", schema_evolution="add-columns")
    old = pa.table({"id": [1], "amount": pa.array([1], pa.int32())})
    sink.check(old.schema, "app")
    sink.commit_epoch(EpochCommit(0, (_write_epoch(sink, 0, old),)))
    assert sink.target_schema("app") == old.schema
    new = pa.table({"id": [2], "amount": [2**40], "note": ["n"]})
    found = diff(old.schema, new.schema)
    change = SchemaChange("out", old.schema, found.merged, found.changes)
    sink.prepare_evolution(change, "app")
    sink.commit_epoch(EpochCommit(1, (_write_epoch(sink, 1, new),), schema_change=change))
    assert sink.target_schema("app") == found.merged
    table = read_committed(tmp_path)
    assert table.column("note").to_pylist() == [None, "n"]
    assert table.column("amount").to_pylist() == [1, 2**40]


def test_a_uid_that_prefixes_another_reads_its_own_schema(tmp_path: Path) -> None:
    """Uid ``out`` lists ``_manifests/out-2-...`` of uid ``out-2`` too: never its schema."""
    schema = pa.schema([("id", pa.int64())])
    mine, other = FilesSink(tmp_path, "out"), FilesSink(tmp_path, "out-2")
    for sink in (mine, other):
        sink.check(schema, "app")
    mine.commit_epoch(EpochCommit(0, (_write_epoch(mine, 0, pa.table({"id": [1]})),)))
    wide = pa.table({"id": [1], "x": ["x"]})
    for epoch in range(12):
        other.commit_epoch(EpochCommit(epoch, (_write_epoch(other, epoch, wide),)))
    assert mine.target_schema("app") == schema
    assert other.target_schema("app") == wide.schema
    os.remove(tmp_path / manifests.key("out", 0))  # the fast path finds nothing: listing
    mine.commit_epoch(EpochCommit(1, (_write_epoch(mine, 1, pa.table({"id": [2]})),)))
    assert mine.target_schema("app") == schema
