"""Schema evolution of the Delta connector (#41): an epoch that adds a column and a struct
field evolves the table in the commit that makes its rows visible, one Delta version with
``metaData``, ``add`` and ``txn``; refusals before anything is written; the crash points of
an evolving epoch. Read back with delta-rs and pyarrow's dataset (not txsink's code), and in
one slow cell with Spark's own Delta reader.

Run as a script (``python integration/test_evolve_delta.py ARGS``) it is the driver of the
kill-driver cell: a streaming query whose input gains the columns at epoch 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from txsink.connectors.delta import DeltaHandle, DeltaSink
from txsink.connectors.delta import storage as delta_storage
from txsink.connectors.delta.commit import app_txn_id
from txsink.contract import EpochCommit
from txsink.schema import SchemaChange, SchemaEvolutionError
from txsink.spark.checks import check_sinks
from txsink.txid import TxnId

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD0 = pa.struct([("a", pa.string())])
PAYLOAD1 = pa.struct([("a", pa.string()), ("b", pa.string())])
OLD = pa.schema([("id", pa.int64()), ("name", pa.string()), ("payload", PAYLOAD0)])
NEW = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("payload", PAYLOAD1), ("note", pa.string())]
)
#: The streaming input: FILES files of PER rows, one per epoch; epoch 0 has the old shape.
FILES, PER = 3, 40


def _rows(ids: range, *, new: bool) -> list[dict[str, Any]]:
    if not new:
        return [{"id": i, "name": f"n{i}", "payload": {"a": f"a{i}"}} for i in ids]
    return [
        {"id": i, "name": f"n{i}", "payload": {"a": f"a{i}", "b": f"b{i}"}, "note": f"note{i}"}
        for i in ids
    ]


def _sink(table: str, uid: str = "d", **options: Any) -> DeltaSink:
    options.setdefault("create_table", True)
    return DeltaSink(table, uid, **options)


def _epoch(sink: DeltaSink, epoch: int, schema: pa.Schema, ids: range) -> DeltaHandle:
    open_ = sink.begin(TxnId("app", sink.uid, epoch, 0, 0, 1), schema)
    rows = _rows(ids, new=schema is NEW)
    sink.write(open_, pa.RecordBatch.from_pylist(rows, schema=schema))
    return sink.prepare(open_)


def _first_epoch(sink: DeltaSink) -> None:
    check_sinks([sink], OLD, "app", None)
    sink.commit_epoch(EpochCommit(0, (_epoch(sink, 0, OLD, range(0, 3)),)))


def _table(table: str, options: dict[str, str] | None = None) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(table, storage_options=options)


def _log_entry(table: str, version: int, options: dict[str, str] | None) -> list[dict[str, Any]]:
    """The actions of one version of the table's log, read as a file (not through txsink)."""
    fs, root = delta_storage.Storage(table, options or {}).filesystem()
    with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as f:
        return [json.loads(line) for line in f.read().decode().splitlines() if line.strip()]


def _assert_evolved_once(table: str, options: dict[str, str] | None = None) -> None:
    """Old rows null in the new column and field, new rows with values; the table's schema
    has them; the version that added them holds metaData, add and txn together."""
    t = _table(table, options)
    assert pa.schema(t.schema().to_arrow()).names == ["id", "name", "payload", "note"]
    rows = {r["id"]: r for r in t.to_pyarrow_table().to_pylist()}
    assert sorted(rows) == list(range(6))
    assert rows[0]["note"] is None and rows[0]["payload"] == {"a": "a0", "b": None}
    assert rows[4]["note"] == "note4" and rows[4]["payload"] == {"a": "a4", "b": "b4"}
    if options is None:  # pyarrow's own dataset over the table's files, in its schema
        files = ds.dataset(t.file_uris(), format="parquet", schema=pa.schema(t.schema().to_arrow()))
        notes = dict(zip(*files.to_table(columns=["id", "note"]).to_pydict().values(), strict=True))
        assert notes[1] is None and notes[5] == "note5"
    version = t.version()
    kinds = [next(iter(a)) for a in _log_entry(table, version, options)]
    assert kinds.count("metaData") == 1 and "add" in kinds and "txn" in kinds, kinds
    for earlier in range(1, version):  # after the creation, the schema changed there only
        assert "metaData" not in [next(iter(a)) for a in _log_entry(table, earlier, options)]
    assert t.transaction_version(app_txn_id("app", "d")) == 1


def _evolve(sink: DeltaSink) -> SchemaChange:
    changes = check_sinks([sink], NEW, "app", None)
    return changes[sink.uid]


# -- the hooks, on a local table and on S3 ------------------------------------------------


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    if request.param == "local":
        yield str(tmp_path / "t"), None
        return
    from txsink.connectors.delta.testing import ADAPTER, storage_options

    s3 = request.getfixturevalue("s3")
    spec = ADAPTER.new_target(tmp_path, "evo", s3.env())
    try:
        yield spec["table"], storage_options(spec["table"], s3.env())
    finally:
        ADAPTER.drop_target(spec, s3.env())


def test_an_epoch_that_adds_a_column_and_a_field_commits_them_with_its_rows(
    where: tuple[str, Any],
) -> None:
    table, options = where
    sink = _sink(table, schema_evolution="add-columns", storage_options=options)
    _first_epoch(sink)
    change = _evolve(sink)
    assert [c.column for c in change.columns] == ["payload.b", "note"]
    handle = _epoch(sink, 1, NEW, range(3, 6))
    assert _table(table, options).version() == 1  # prepared: nothing visible yet
    sink.commit_epoch(EpochCommit(1, (handle,), schema_change=change))
    _assert_evolved_once(table, options)
    # Recovery calls the commit again: the table records the epoch, nothing is applied twice.
    again = _sink(table, schema_evolution="add-columns", storage_options=options)
    again.commit_epoch(EpochCommit(1, (handle,), schema_change=change))
    assert _table(table, options).version() == 2
    # The next epoch, same schema: no change planned, a plain commit of the new columns.
    assert check_sinks([again], NEW, "app", None) == {}
    again.commit_epoch(EpochCommit(2, (_epoch(again, 2, NEW, range(6, 8)),)))
    assert _table(table, options).to_pyarrow_table().num_rows == 8


def test_a_partitioned_table_evolves_with_escaped_partition_folders(tmp_path: Path) -> None:
    """The hand-written add actions name the files as delta-rs does (a partition value with
    a space and a colon is escaped twice: in the folder, then in the log)."""
    table = str(tmp_path / "t")
    sink = _sink(table, schema_evolution="add-columns", partition_by=["name"])
    check_sinks([sink], OLD, "app", None)
    open_ = sink.begin(TxnId("app", "d", 0, 0, 0, 1), OLD)
    sink.write(
        open_, pa.RecordBatch.from_pylist([{"id": 0, "name": "a b:c", "payload": None}], OLD)
    )
    sink.commit_epoch(EpochCommit(0, (sink.prepare(open_),)))
    change = _evolve(sink)
    open_ = sink.begin(TxnId("app", "d", 1, 0, 0, 1), NEW)
    rows = [{"id": 1, "name": "a b:c", "payload": None, "note": "x"},
            {"id": 2, "name": "d%e", "payload": {"a": "1", "b": "2"}, "note": None}]  # fmt: skip
    sink.write(open_, pa.RecordBatch.from_pylist(rows, NEW))
    sink.commit_epoch(EpochCommit(1, (sink.prepare(open_),), schema_change=change))
    t = _table(table)
    got = sorted(t.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["name"], r["note"]) for r in got] == [
        (0, "a b:c", None), (1, "a b:c", "x"), (2, "d%e", None)
    ]  # fmt: skip
    assert got[2]["payload"] == {"a": "1", "b": "2"}
    assert t.metadata().partition_columns == ["name"]
    assert sink.recorded_epoch("app") == 1 and list(sink.list_prepared("app")) == []


def test_a_version_taken_by_a_concurrent_commit_is_retried_from_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits the version the evolving entry was to take: the entry is not
    written over it; the commit reads the log again and takes the next version."""
    from deltalake import write_deltalake

    table = str(tmp_path / "t")
    sink = _sink(table, schema_evolution="add-columns")
    _first_epoch(sink)
    change = _evolve(sink)
    handle = _epoch(sink, 1, NEW, range(3, 6))
    real = delta_storage.Storage.create_log_entry
    raced: list[str] = []

    def racing(self: delta_storage.Storage, name: str, data: bytes) -> bool:
        if not raced:
            raced.append(name)
            write_deltalake(table, pa.Table.from_pylist(_rows(range(100, 101), new=False), OLD),
                            mode="append")  # fmt: skip
        return real(self, name, data)

    monkeypatch.setattr(delta_storage.Storage, "create_log_entry", racing)
    sink.commit_epoch(EpochCommit(1, (handle,), schema_change=change))
    t = _table(table)
    assert raced == [f"{2:020d}.json"] and t.version() == 3
    assert sorted(t.to_pyarrow_table().column("id").to_pylist()) == [0, 1, 2, 3, 4, 5, 100]
    assert "note" in pa.schema(t.schema().to_arrow()).names
    assert not [p for p in (tmp_path / "t" / "_delta_log").iterdir() if p.name.endswith(".tmp")]


def test_a_log_entry_is_created_only_if_absent(where: tuple[str, Any]) -> None:
    """The guard of the hand-written entry, on each storage: the second writer of a version
    is told so (locally a hard link, on S3 a conditional PUT answered 412) and changes
    nothing."""
    table, options = where
    _first_epoch(_sink(table, storage_options=options))
    store = delta_storage.Storage(table, options or {})
    name = f"{2:020d}.json"
    first = json.dumps({"commitInfo": {"timestamp": 1, "operation": "WRITE"}}) + "\n"
    assert store.create_log_entry(name, first.encode()) is True
    assert store.create_log_entry(name, b"{}\n") is False
    assert _log_entry(table, 2, options) == [json.loads(first)]


def test_strict_stops_before_writing_naming_the_column_and_the_option(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    sink = _sink(table)
    _first_epoch(sink)
    with pytest.raises(SchemaEvolutionError) as info:
        check_sinks([sink], NEW, "app", None)
    assert info.value.column == "payload.b" and info.value.sink_uid == "d"
    assert "schema_evolution='add-columns'" in str(info.value) and "note" in str(info.value)
    assert _table(table).version() == 1


def test_a_widening_is_refused_naming_the_column(tmp_path: Path) -> None:
    """Delta widens a type only with the typeWidening feature, a protocol upgrade delta-rs
    does not write with data: refused before the epoch, whatever the policy."""
    from deltalake import DeltaTable

    table = str(tmp_path / "t")
    DeltaTable.create(table, pa.schema([("id", pa.int64()), ("n", pa.int32())]))
    sink = _sink(table, schema_evolution="add-columns")
    with pytest.raises(SchemaEvolutionError, match=r"widens n int32 -> int64") as info:
        check_sinks([sink], pa.schema([("id", pa.int64()), ("n", pa.int64())]), "app", None)
    assert info.value.column == "n" and info.value.connector == "delta"
    assert _table(table).version() == 0


@pytest.mark.parametrize(
    ("incoming", "configuration", "column", "says"),
    [
        (pa.schema([("id", pa.int64()), ("Id", pa.string())]), None, "Id", "only in case"),
        (pa.schema([("id", pa.int64()), ("a b", pa.string())]), None, "a b", "rename it"),
        (
            pa.schema([("id", pa.int64()), ("x", pa.string())]),
            {"delta.columnMapping.mode": "name"},
            "x",
            "column mapping",
        ),
    ],
    ids=["case", "character", "column-mapping"],
)
def test_a_column_the_table_cannot_take_is_refused_before_writing(
    tmp_path: Path, incoming: pa.Schema, configuration: Any, column: str, says: str
) -> None:
    from deltalake import DeltaTable

    table = str(tmp_path / "t")
    try:
        DeltaTable.create(table, pa.schema([("id", pa.int64())]), configuration=configuration)
    except Exception as err:  # pragma: no cover - a delta-rs that cannot make the table
        pytest.skip(f"delta-rs cannot create the table: {err}")
    sink = _sink(table, schema_evolution="add-columns")
    with pytest.raises(SchemaEvolutionError, match=says) as info:
        check_sinks([sink], incoming, "app", None)
    assert info.value.column == column and info.value.sink_uid == "d"
    assert _table(table).version() == 0


# -- streaming queries: the input gains the columns at epoch 1 ----------------------------


def _input(folder: Path) -> None:
    folder.mkdir(parents=True)
    for n in range(FILES):
        ids = range(n * PER, (n + 1) * PER)
        path = folder / f"{n:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(_rows(ids, new=True), NEW), path)
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # the file source's order


def _shaped(coordinator: Any) -> Any:
    """foreachBatch: epoch 0 without ``note`` and ``payload.b`` (the old shape), the
    others with them (the upstream team's new fields)."""
    from pyspark.sql import functions as F

    def batch(df: Any, epoch: int) -> None:
        if epoch == 0:
            df = df.select("id", "name", F.struct(F.col("payload.a").alias("a")).alias("payload"))
        coordinator(df, epoch)

    return batch


def _run(spark: Any, work: Path, coordinator: Any) -> None:
    df = (
        spark.readStream.schema("id long, name string, payload struct<a:string,b:string>, "
                                "note string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(work / "input"))
        .repartition(2, "id")
    )  # fmt: skip
    query = (
        df.writeStream.foreachBatch(_shaped(coordinator))
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:  # what the stopped query held in this driver (its lease's thread): released
        coordinator.close()


def _assert_stream_evolved(table: str) -> None:
    t = _table(table)
    rows = {r["id"]: r for r in t.to_pyarrow_table().to_pylist()}
    assert sorted(rows) == list(range(FILES * PER))  # every row once
    assert all(rows[i]["note"] is None and rows[i]["payload"]["b"] is None for i in range(PER))
    assert all(rows[i]["note"] == f"note{i}" for i in range(PER, FILES * PER))
    history = {h["version"]: h for h in t.history()}
    evolving = [v for v, h in history.items() if h.get("txsink.epoch") == 1]
    assert len(evolving) == 1, history  # one commit for the evolving epoch
    kinds = [next(iter(a)) for a in _log_entry(table, evolving[0], None)]
    assert "metaData" in kinds and "add" in kinds and "txn" in kinds
    assert "note" not in _schema_at(table, evolving[0] - 1)
    assert "note" in _schema_at(table, evolving[0])


def _schema_at(table: str, version: int) -> list[str]:
    from deltalake import DeltaTable

    names: list[str] = pa.schema(DeltaTable(table, version=version).schema().to_arrow()).names
    return names


@pytest.mark.spark
def test_a_stream_that_gains_columns_runs_through_with_add_columns(
    spark: Any, tmp_path: Path
) -> None:
    from txsink import Coordinator

    _input(tmp_path / "input")
    table = str(tmp_path / "t")
    sink = _sink(table, schema_evolution="add-columns")
    _run(spark, tmp_path, Coordinator([sink], log=str(tmp_path / "txlog")))
    _assert_stream_evolved(table)
    assert _schema_at(table, 1) == ["id", "name", "payload"]  # epoch 0: the old schema


@pytest.mark.spark
def test_a_stream_under_strict_stops_before_writing_the_epoch(spark: Any, tmp_path: Path) -> None:
    from pyspark.errors import StreamingQueryException

    from txsink import Coordinator

    _input(tmp_path / "input")
    table = str(tmp_path / "t")
    with pytest.raises(StreamingQueryException, match="schema_evolution='add-columns'"):
        _run(spark, tmp_path, Coordinator([_sink(table)], log=str(tmp_path / "txlog")))
    t = _table(table)
    assert t.version() == 1 and t.to_pyarrow_table().num_rows == PER  # epoch 0 only
    on_disk = sorted(p.name for p in Path(table).iterdir() if p.name.endswith(".parquet"))
    assert on_disk == sorted(f.split("/")[-1] for f in t.file_uris())  # none of epoch 1


@pytest.mark.spark
@pytest.mark.parametrize(
    ("point", "mode"),
    [
        ("during_commit", "raise"),
        pytest.param("after_decision", "raise", marks=pytest.mark.slow),
        pytest.param("before_decision", "raise", marks=pytest.mark.slow),
        pytest.param("after_precommit", "kill-worker", marks=pytest.mark.slow),
    ],
)
def test_a_crash_in_the_evolving_epoch_leaves_schema_and_rows_together(
    spark: Any, tmp_path: Path, point: str, mode: str
) -> None:
    """At the crash the table has the new schema exactly when it has epoch 1's rows; after
    the restart's recovery, both, once."""
    from pyspark.errors import StreamingQueryException

    from txsink import Coordinator
    from txsink.protocol.faults import FaultPlan

    _input(tmp_path / "input")
    table = str(tmp_path / "t")
    spec = f"{point}:{mode}@1" + ("#1" if point == "after_precommit" else "")
    plan = FaultPlan.parse(spec, str(tmp_path / "faults"))
    log = str(tmp_path / "txlog")

    def coordinator() -> Any:
        return Coordinator([_sink(table, schema_evolution="add-columns")], log=log, faults=plan)

    try:
        _run(spark, tmp_path, coordinator())
        crashed = False
    except StreamingQueryException:
        crashed = True
        t = _table(table)
        ids = set(t.to_pyarrow_table().column("id").to_pylist())
        has_rows = bool(ids & set(range(PER, 2 * PER)))
        has_schema = "note" in pa.schema(t.schema().to_arrow()).names
        assert has_rows == has_schema == (point == "during_commit"), (ids, has_schema)
        _run(spark, tmp_path, coordinator())  # the restart: recovery, then the rest
    assert plan.fired(), "the fault never fired: test is void"
    assert crashed == (point != "after_precommit")  # a task fault: Spark's retry absorbs it
    _assert_stream_evolved(table)


# -- kill the driver in the evolving epoch ------------------------------------------------


def _protocol_driver(table: str, log: str) -> None:
    """A child driver without Spark: the epochs of the streaming cells (epoch 0 in the old
    shape, epochs 1 and 2 in the new), each planned as a query's batch is (the sinks'
    checks, then the protocol; tasks in this process), its faults from ``TXSINK_FAULT``.
    Epochs the log records as committed are skipped, as Spark's replay is."""
    sys.path.insert(0, str(ROOT))
    from tests.memsink import memory_precommit
    from txsink import Coordinator

    sink = _sink(table, schema_evolution="add-columns")
    coordinator = Coordinator([sink], log=log, app_id="app")
    for epoch in range(FILES):
        if coordinator.log.committed(epoch) is not None:
            continue  # in Spark's commit log: not replayed
        schema = OLD if epoch == 0 else NEW
        coordinator.schema_plan = check_sinks([sink], schema, "app", None)
        ids = range(epoch * PER, (epoch + 1) * PER)
        parts = [[pa.RecordBatch.from_pylist(_rows(ids[p::2], new=epoch > 0), schema)]
                 for p in range(2)]  # fmt: skip
        coordinator.run_epoch(epoch, memory_precommit(parts), app_id="app")


def _spark_driver(work: str, table: str) -> None:
    """The child driver with Spark: the streaming query of :func:`_run`, its faults from
    ``TXSINK_FAULT`` (the Coordinator reads it)."""
    from pyspark.sql import SparkSession

    from txsink import Coordinator

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    sink = _sink(table, schema_evolution="add-columns")
    _run(spark, Path(work), Coordinator([sink], log=f"{work}/txlog"))
    spark.stop()


@pytest.mark.parametrize(
    ("driver", "point"),
    [
        ("protocol", "after_decision"),
        pytest.param("protocol", "during_commit", marks=pytest.mark.slow),
        pytest.param("spark", "after_decision", marks=[pytest.mark.slow, pytest.mark.spark]),
        pytest.param("spark", "during_commit", marks=[pytest.mark.slow, pytest.mark.spark]),
    ],
)
def test_a_driver_killed_in_the_evolving_epoch_recovers_it_once(
    tmp_path: Path, driver: str, point: str
) -> None:
    """SIGKILL of the driver at the point, in epoch 1; the restarted driver's recovery
    commits epoch 1 from its decision (its schema change included), once."""
    from txsink.runner import run_until_done

    table = str(tmp_path / "t")
    env = dict(
        os.environ,
        TXSINK_FAULT=f"{point}:kill-driver@1",
        TXSINK_FAULT_STATE=str(tmp_path / "faults"),
        PYSPARK_PYTHON=sys.executable,
    )
    if driver == "spark":
        _input(tmp_path / "input")
    command = [sys.executable, __file__, driver, str(tmp_path), table]
    report = run_until_done(command, env=env, max_runs=4, timeout=500)
    assert report.finished and report.restarts == 1, report
    _assert_stream_evolved(table)


# -- Spark's own Delta reader -------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.slow
def test_spark_with_deltas_jar_reads_old_and_new_rows(
    spark: Any, tmp_path: Path, record_property: Any
) -> None:
    import spark_jars

    from txsink import Coordinator

    found = spark_jars.delta_reader()
    if isinstance(found, str):
        pytest.skip(found)
    _input(tmp_path / "input")
    table = str(tmp_path / "t")
    _run(spark, tmp_path, Coordinator([_sink(table, schema_evolution="add-columns")],
                                      log=str(tmp_path / "txlog")))  # fmt: skip
    notes = [None] * PER + sorted(f"note{i}" for i in range(PER, FILES * PER))
    for column, expected in (("id", list(range(FILES * PER))), ("note", notes)):
        done = subprocess.run(
            [found.python, str(ROOT / "integration" / "delta_spark_reader.py"), table, column],
            capture_output=True, text=True, timeout=540, check=False,
            env={**os.environ, **found.env},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert sorted(seen["ids"], key=lambda v: (v is not None, v)) == expected
        assert [op for _, op in seen["operations"]].count("WRITE") == FILES  # one per epoch


if __name__ == "__main__":
    if sys.argv[1] == "spark":
        _spark_driver(sys.argv[2], sys.argv[3])
    else:
        _protocol_driver(sys.argv[3], f"{sys.argv[2]}/txlog")
