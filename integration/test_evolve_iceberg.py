"""Schema evolution into an Iceberg table (issue #41), on a local SQL catalog (SQLite) and a
local warehouse: no server. Read back with pyiceberg's own catalog and scan, never the
sink's objects.

Epoch 0 writes ``(id long, amount int, price decimal(10,2), payload struct<a string>)``;
epoch 1 adds ``note string`` and ``payload.b``, widens ``amount`` to long and ``price`` to
decimal(12,2). The protocol runs as the Spark path runs it (the core's ``check_sinks``
before each epoch, recovery's ``replan``), its tasks in this process on a pickled copy of
the plan (as Spark ships the sink); the streaming cells run a real query.

Every metadata version of the table is read back (:func:`versions`): the new schema is
current in exactly the versions that hold epoch 1's snapshot, before and after every crash.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from evolving_stream import BIG, CATALOG, TABLE, UID, catalog_properties, iceberg_sink

from tests.memsink import memory_precommit
from txsink import Coordinator
from txsink.connectors.iceberg.commit import epoch_key
from txsink.errors import EpochBlockedError, InjectedFault, TxsinkError
from txsink.protocol.faults import FaultPlan
from txsink.protocol.task import TaskPlan
from txsink.schema import SchemaEvolutionError
from txsink.spark.checks import check_sinks

pytest.importorskip("pyiceberg")

APP = "evo"

OLD = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.int32()),
        ("price", pa.decimal128(10, 2)),
        ("payload", pa.struct([("a", pa.string())])),
    ]
)
NEW = pa.schema(
    [
        ("id", pa.int64()),
        ("amount", pa.int64()),
        ("price", pa.decimal128(12, 2)),
        ("payload", pa.struct([("a", pa.string()), ("b", pa.int32())])),
        ("note", pa.string()),
    ]
)
WIDE = Decimal("1234567890.12")  # a price only decimal(12, 2) holds


def old_rows(ids: range) -> list[dict[str, Any]]:
    return [{"id": i, "amount": i, "price": Decimal(i) / 4, "payload": {"a": f"a{i}"}} for i in ids]


def new_rows(ids: range) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "amount": BIG + i,
            "price": WIDE,
            "payload": {"a": f"a{i}", "b": i},
            "note": f"n{i}",
        }
        for i in ids
    ]


# -- the target, read as another reader would -------------------------------------------


def table(tmp_path: Path) -> Any:
    """The table from a fresh pyiceberg catalog of its own (not the sink's)."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog(CATALOG, **catalog_properties(tmp_path))
    try:
        return catalog.load_table(TABLE)
    finally:
        catalog.close()


def rows_by_id(tmp_path: Path) -> dict[int, dict[str, Any]]:
    found = table(tmp_path).scan().to_arrow().to_pylist()
    ids = [r["id"] for r in found]
    assert len(ids) == len(set(ids)), "a row was written twice"
    return {r["id"]: r for r in found}


def epochs(t: Any) -> list[int]:
    """The txsink epochs of the table's snapshots, in commit order."""
    return [int(s.summary["txsink.epoch"]) for s in t.snapshots() if s.summary is not None]


def versions(tmp_path: Path, column: str = "note") -> Iterator[tuple[bool, list[int]]]:
    """Every metadata version the table went through: (whether its current schema has the
    added ``column``, the txsink epochs of its snapshots)."""
    from pyiceberg.serializers import FromInputFile

    t = table(tmp_path)
    paths = [entry.metadata_file for entry in t.metadata.metadata_log] + [t.metadata_location]
    for path in paths:
        meta = FromInputFile.table_metadata(t.io.new_input(path))
        has = column in meta.schema().column_names
        ids = [int(str(s.summary["txsink.epoch"])) for s in meta.snapshots if s.summary is not None]
        yield has, ids


def assert_evolved_with_epoch_1(tmp_path: Path, old: range, new: range) -> None:
    """The table after epoch 1: its schema, its rows, one snapshot per epoch, and the new
    schema in exactly the metadata versions that hold epoch 1."""
    from pyiceberg.types import DecimalType, IntegerType, LongType, StringType, StructType

    t = table(tmp_path)
    schema = t.schema()
    assert schema.find_field("amount").field_type == LongType()
    assert schema.find_field("price").field_type == DecimalType(12, 2)
    payload = schema.find_field("payload").field_type
    assert isinstance(payload, StructType)
    assert payload.field_by_name("b") is not None
    assert payload.field_by_name("b").field_type == IntegerType()  # type: ignore[union-attr]
    note = schema.find_field("note")
    assert note.field_type == StringType() and not note.required
    assert epochs(t) == [0, 1]  # exactly one snapshot per epoch
    assert t.properties[epoch_key(APP, UID)] == "1"
    seen = rows_by_id(tmp_path)
    assert sorted(seen) == [*old, *new]
    for i in old:  # written before the change: null in what it added, promoted in the rest
        assert seen[i]["note"] is None and seen[i]["payload"] == {"a": f"a{i}", "b": None}
        assert seen[i]["amount"] == i and seen[i]["price"] == Decimal(i) / 4
    for i in new:
        assert seen[i]["note"] == f"n{i}" and seen[i]["payload"] == {"a": f"a{i}", "b": i}
        assert seen[i]["amount"] == BIG + i and seen[i]["price"] == WIDE
    for has, ids in versions(tmp_path, "payload.b"):  # only epoch 1's commit adds it
        assert has == (1 in ids), (has, ids)


def assert_not_evolved(tmp_path: Path, rows: int) -> None:
    from pyiceberg.types import IntegerType

    t = table(tmp_path)
    assert t.schema().find_field("amount").field_type == IntegerType()
    assert "note" not in t.schema().column_names
    assert epochs(t) == [0]
    assert len(rows_by_id(tmp_path)) == rows
    assert all(not has for has, _ in versions(tmp_path))


# -- the protocol as the Spark path runs it, tasks in this process --------------------------


def coordinator(tmp_path: Path, policy: str = "add-columns", faults: str = "") -> Coordinator:
    plan = FaultPlan.parse(faults, str(tmp_path / "faults")) if faults else None
    return Coordinator(
        [iceberg_sink(tmp_path, policy)], log=str(tmp_path / "txlog"), app_id=APP, faults=plan
    )


def shipped(batches: list[list[pa.RecordBatch]]) -> Callable[[TaskPlan], Any]:
    """The partition tasks, run on a pickled copy of the plan (as Spark ships its sinks)."""
    run = memory_precommit(batches)
    return lambda plan: run(pickle.loads(pickle.dumps(plan)))


def run_epoch(
    coord: Coordinator,
    epoch: int,
    schema: pa.Schema,
    ids: range,
    make: Callable[[range], list[dict[str, Any]]] | None = None,
) -> Any:
    """One epoch as ``Coordinator(df, epoch)`` runs it: the sinks' checks plan the schema
    change, then the protocol (recovery first, planning again if it changed the table).
    ``make``: the rows of some ids (default: OLD's or NEW's)."""
    make = make or (new_rows if schema is NEW else old_rows)
    half = len(ids) // 2
    parts = [ids[:half], ids[half:]]
    batches = [[pa.RecordBatch.from_pylist(make(p), schema=schema)] for p in parts]

    def plan() -> None:
        coord.schema_plan = check_sinks(coord.sinks, schema, APP, None, log=coord.log)

    plan()
    return coord.run_epoch(epoch, shipped(batches), app_id=APP, replan=plan)


OLD_IDS, NEW_IDS = range(0, 6), range(100, 106)


def two_epochs(tmp_path: Path, coord: Coordinator) -> None:
    run_epoch(coord, 0, OLD, OLD_IDS)
    run_epoch(coord, 1, NEW, NEW_IDS)


def test_an_epoch_that_adds_and_widens_evolves_the_table_in_its_own_commit(
    tmp_path: Path,
) -> None:
    coord = coordinator(tmp_path)
    two_epochs(tmp_path, coord)
    assert_evolved_with_epoch_1(tmp_path, OLD_IDS, NEW_IDS)
    # The next epoch of the same schema plans nothing and writes the new schema as is.
    run_epoch(coord, 2, NEW, range(200, 202))
    assert coord.schema_plan == {}
    assert rows_by_id(tmp_path)[201]["note"] == "n201"
    assert epochs(table(tmp_path)) == [0, 1, 2]
    coord.close()


def test_an_evolving_epoch_without_rows_commits_its_change_alone(tmp_path: Path) -> None:
    """An evolving epoch whose tasks wrote nothing still takes its change (the next
    epochs' tasks write the new schema, planned against it): with its committed epoch
    when a handle names the app, idempotently without one."""
    from txsink.contract import EpochCommit

    coord = coordinator(tmp_path)
    run_epoch(coord, 0, OLD, OLD_IDS)
    changes = check_sinks(coord.sinks, NEW, APP, None, log=coord.log)
    sink = iceberg_sink(tmp_path)
    for _ in range(2):  # recovery's second call finds it applied
        sink.commit_epoch(EpochCommit(1, (), None, lambda _h: None, schema_change=changes[UID]))
    coord.close()
    t = table(tmp_path)
    assert "note" in t.schema().column_names and epochs(t) == [0]
    assert t.metadata.last_column_id == 7  # payload.b and note, once
    assert list(versions(tmp_path)) == [(False, []), (False, [0]), (True, [0])]


def test_strict_refuses_before_writing_and_names_the_column_and_the_option(
    tmp_path: Path,
) -> None:
    coord = coordinator(tmp_path, policy="strict")
    run_epoch(coord, 0, OLD, OLD_IDS)
    files = sorted(p.name for p in tmp_path.rglob("*.parquet"))
    with pytest.raises(SchemaEvolutionError) as err:
        run_epoch(coord, 1, NEW, NEW_IDS)
    assert err.value.sink_uid == UID and err.value.column == "amount"
    assert "schema_evolution='add-columns'" in str(err.value) and "adds note" in str(err.value)
    assert_not_evolved(tmp_path, len(OLD_IDS))
    assert sorted(p.name for p in tmp_path.rglob("*.parquet")) == files  # no data file
    coord.close()


@pytest.mark.parametrize(
    ("stream", "column", "match"),
    [
        (pa.schema([*OLD, ("Amount", pa.int64())]), "Amount", "only by case"),
        (
            pa.schema([*list(OLD)[:2], ("price", pa.decimal256(40, 2)), OLD.field("payload")]),
            "price",
            "at most 38 digits",
        ),
    ],
    ids=["case-collision", "decimal-over-38"],
)
def test_a_change_iceberg_will_not_take_stops_the_epoch_before_anything_is_written(
    tmp_path: Path, stream: pa.Schema, column: str, match: str
) -> None:
    coord = coordinator(tmp_path)
    run_epoch(coord, 0, OLD, OLD_IDS)
    with pytest.raises(SchemaEvolutionError, match=match) as err:
        coord.schema_plan = check_sinks(coord.sinks, stream, APP, None, log=coord.log)
    assert err.value.column == column and err.value.sink_uid == UID
    assert TABLE in str(err.value) and "Fix:" in str(err.value)
    assert_not_evolved(tmp_path, len(OLD_IDS))
    coord.close()


def test_a_partitioned_table_evolves_a_nested_field_a_float_and_its_partition_source(
    tmp_path: Path,
) -> None:
    """Partitioned by ``amount`` (identity, widened to long) and a bucket of ``id``: the
    tasks split rows by the evolved spec's values; a field added two structs deep and a
    float widened to double."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import BucketTransform, IdentityTransform
    from pyiceberg.types import DoubleType, FloatType, IntegerType, LongType, NestedField
    from pyiceberg.types import StructType as Struct

    (tmp_path / "warehouse").mkdir()
    catalog = load_catalog(CATALOG, **catalog_properties(tmp_path))
    catalog.create_namespace("ns")
    inner = Struct(NestedField(5, "x", IntegerType(), required=False))
    catalog.create_table(
        TABLE,
        schema=Schema(
            NestedField(1, "id", LongType(), required=False),
            NestedField(2, "amount", IntegerType(), required=False),
            NestedField(3, "s", Struct(NestedField(4, "inner", inner, required=False))),
            NestedField(6, "f", FloatType(), required=False),
        ),
        partition_spec=PartitionSpec(
            PartitionField(2, 1000, IdentityTransform(), "amount"),
            PartitionField(1, 1001, BucketTransform(4), "id_bucket"),
        ),
    )
    catalog.close()
    deep = pa.struct([("inner", pa.struct([("x", pa.int32()), ("y", pa.string())]))])
    before = pa.schema([("id", pa.int64()), ("amount", pa.int32()), ("f", pa.float32())])
    after = pa.schema(
        [("id", pa.int64()), ("amount", pa.int64()), ("s", deep), ("f", pa.float64())]
    )

    def rows_after(ids: range) -> list[dict[str, Any]]:
        return [
            {"id": i, "amount": BIG + i % 3, "s": {"inner": {"x": i, "y": f"y{i}"}}, "f": i / 3}
            for i in ids
        ]

    coord = coordinator(tmp_path)
    run_epoch(coord, 0, before, range(8), lambda ids: [
        {"id": i, "amount": i % 2, "f": 0.5} for i in ids
    ])  # fmt: skip
    run_epoch(coord, 1, after, range(100, 108), rows_after)
    coord.close()
    t = table(tmp_path)
    assert t.schema().find_field("amount").field_type == LongType()
    assert t.schema().find_field("f").field_type == DoubleType()
    assert t.schema().find_field("s.inner.y").field_id == 7  # after the table's last id, 6
    seen = rows_by_id(tmp_path)
    assert seen[1]["s"] is None and seen[1]["amount"] == 1 and seen[1]["f"] == 0.5
    assert seen[104] == {"id": 104, **rows_after(range(104, 105))[0]}
    assert t.scan(row_filter=f"amount = {BIG + 1}").to_arrow().num_rows == 3  # pruned by spec
    assert epochs(t) == [0, 1]
    for has, ids in versions(tmp_path, "s.inner.y"):
        assert has == (1 in ids), (has, ids)


#: Spark's Arrow types of a batch, the ones whose Iceberg type reads back as another Arrow
#: spelling (large strings and lists, UTC, int for int8/16, float for float32).
SPARK_TYPES = pa.schema(
    [
        ("id", pa.int64()),
        ("s", pa.string()),
        ("ts", pa.timestamp("us", tz="Etc/UTC")),
        ("ntz", pa.timestamp("us")),
        ("d", pa.date32()),
        ("b", pa.binary()),
        ("dec", pa.decimal128(10, 2)),
        ("l", pa.list_(pa.string())),
        ("m", pa.map_(pa.string(), pa.int64())),
        ("st", pa.struct([("x", pa.string())])),
        ("ls", pa.list_(pa.struct([("y", pa.int32())]))),
        ("i8", pa.int8()),
        ("i16", pa.int16()),
        ("f", pa.float32()),
        ("bo", pa.bool_()),
    ]
)


def test_a_table_of_sparks_types_is_no_schema_change_under_strict(tmp_path: Path) -> None:
    """The table created from Spark's Arrow types, read back as Arrow by ``target_schema``
    (large strings, UTC, int for int8), is the same schema to the core: a strict sink
    writes a second epoch of those types, planning no change."""
    import datetime as dt

    def rows(ids: range) -> list[dict[str, Any]]:
        at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
        return [
            {
                "id": i, "s": f"s{i}", "ts": at, "ntz": at.replace(tzinfo=None),
                "d": at.date(), "b": b"x", "dec": Decimal("1.25"), "l": ["a"],
                "m": [("k", i)], "st": {"x": "x"}, "ls": [{"y": i}], "i8": 1, "i16": 2,
                "f": 0.5, "bo": True,
            }
            for i in ids
        ]  # fmt: skip

    coord = coordinator(tmp_path, policy="strict")
    run_epoch(coord, 0, SPARK_TYPES, range(4), rows)  # creates the table
    run_epoch(coord, 1, SPARK_TYPES, range(4, 8), rows)
    assert coord.schema_plan == {}
    coord.close()
    seen = rows_by_id(tmp_path)
    assert sorted(seen) == list(range(8)) and seen[5]["m"] == [("k", 5)]
    assert seen[6]["ls"] == [{"y": 6}] and seen[7]["st"] == {"x": "x"}


# -- crash points on the evolving epoch ---------------------------------------------------------


#: The points before the decision: the epoch aborts and leaves no schema change behind.
BEFORE = ("before_precommit", "after_precommit", "before_decision")


@pytest.mark.parametrize(
    "point",
    [
        "before_precommit",
        "after_precommit",
        "before_decision",
        "after_decision",
        "during_commit",
        "after_commit_before_mark",
        "during_recovery",
    ],
)
def test_a_crash_on_the_evolving_epoch_leaves_schema_and_rows_together(
    tmp_path: Path, point: str
) -> None:
    """The driver (or a task) raises at ``point`` of epoch 1; a new driver (a restart) runs
    epoch 1 again, until it goes through: before the decision it is written anew, after it
    recovery commits the recorded change with the rows, once (``during_recovery``: the
    first recovery fails too)."""
    spec = f"{point}:raise@1" + ("#1" if point in BEFORE[:2] else "")
    if point == "during_recovery":
        spec = f"during_commit:raise@1,{spec}"
    first = coordinator(tmp_path, faults=spec)
    run_epoch(first, 0, OLD, OLD_IDS)
    with pytest.raises(TxsinkError):
        run_epoch(first, 1, NEW, NEW_IDS)
    first.close()
    if point in BEFORE:
        assert_not_evolved(tmp_path, len(OLD_IDS))  # aborted: no schema change behind
    for has, ids in versions(tmp_path):
        assert has == (1 in ids), (has, ids)
    for _ in range(2):
        again = coordinator(tmp_path, faults=spec)  # a fault fired once does not again
        try:
            result = run_epoch(again, 1, NEW, NEW_IDS)
            break
        except TxsinkError:  # during_recovery: the restart's recovery fails once
            continue
        finally:
            again.close()
    assert result.status == ("committed" if point in BEFORE else "skipped")
    assert_evolved_with_epoch_1(tmp_path, OLD_IDS, NEW_IDS)


@pytest.mark.parametrize("landed", [True, False], ids=["landed-then-lost", "lost-before"])
def test_a_target_failure_in_the_evolving_commit_is_read_back_and_applied_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """The catalog fails the commit of epoch 1 (the answer lost after it landed, or the
    call cut before): the sink reads the table back, and commits the change and the rows
    once."""
    from pyiceberg.table import Transaction

    real = Transaction.commit_transaction
    calls: list[int] = []

    def flaky(self: Transaction) -> Any:
        calls.append(1)
        if len(calls) == 1:
            if landed:
                real(self)
            raise OSError("connection reset by the catalog")
        return real(self)

    coord = coordinator(tmp_path)
    run_epoch(coord, 0, OLD, OLD_IDS)
    monkeypatch.setattr(Transaction, "commit_transaction", flaky)
    run_epoch(coord, 1, NEW, NEW_IDS)
    monkeypatch.undo()
    assert len(calls) == (1 if landed else 2)
    assert_evolved_with_epoch_1(tmp_path, OLD_IDS, NEW_IDS)
    coord.close()


def lingering(tmp_path: Path) -> list[str]:
    """Transaction-named data files no snapshot references."""
    from txsink.connectors.iceberg import catalog as cat
    from txsink.connectors.iceberg.naming import txn_of

    t = table(tmp_path)
    referenced = cat.referenced(t)
    return [k for k in cat.list_files(t) if txn_of(k) is not None and k not in referenced]


def test_another_writers_schema_change_after_the_decision_is_committed_with_the_right_ids(
    tmp_path: Path,
) -> None:
    """Another writer adds a column between epoch 1's decision and its commit: the field
    ids the tasks wrote now name its column (Iceberg never reuses an id), so the commit
    writes the epoch's files again with the table's ids, and every value lands in its own
    column."""
    from pyiceberg.types import StringType

    first = coordinator(tmp_path, faults="after_decision:raise@1")
    run_epoch(first, 0, OLD, OLD_IDS)
    with pytest.raises(InjectedFault):
        run_epoch(first, 1, NEW, NEW_IDS)
    first.close()
    with table(tmp_path).update_schema() as update:
        update.add_column("other", StringType())  # takes the id epoch 1 planned for payload.b
    again = coordinator(tmp_path)
    assert run_epoch(again, 1, NEW, NEW_IDS).status == "skipped"  # recovery committed it
    again.close()
    assert_evolved_with_epoch_1(tmp_path, OLD_IDS, NEW_IDS)
    assert all(r["other"] is None for r in rows_by_id(tmp_path).values())
    assert lingering(tmp_path) == []  # the tasks' own files, rewritten, are gone


def test_files_that_cannot_be_written_again_by_name_block_the_epoch(tmp_path: Path) -> None:
    """As above, on a table with a column name Parquet must escape (``odd-name``): names
    alone cannot map the file's columns back, so the epoch is blocked, nothing visible,
    naming the column whose id moved and the fix."""
    from pyiceberg.types import StringType

    first = coordinator(tmp_path, faults="after_decision:raise@1")
    run_epoch(first, 0, OLD, OLD_IDS)
    with table(tmp_path).update_schema() as update:
        update.add_column("odd-name", StringType())  # the stream never writes it: nulls
    with pytest.raises(InjectedFault):
        run_epoch(first, 1, NEW, NEW_IDS)
    first.close()
    with table(tmp_path).update_schema() as update:
        update.add_column("other", StringType())
    again = coordinator(tmp_path)
    with pytest.raises(EpochBlockedError) as err:
        run_epoch(again, 1, NEW, NEW_IDS)
    again.close()
    assert err.value.column == "payload.b" and "field id" in str(err.value)
    assert "register_table" in (err.value.fix or "")
    assert epochs(table(tmp_path)) == [0]


def test_a_column_another_writer_gave_another_type_blocks_the_epoch_until_fixed(
    tmp_path: Path,
) -> None:
    """Another writer adds ``note`` as an int between the decision and the commit: the
    restarted query refuses the stream before anything (its ``note`` is a string), and
    ``txsink recover`` finds the recorded change no longer applies: the epoch is blocked
    (nothing visible) naming the column and the fix. Once the column is dropped, the
    query's recovery commits it."""
    from pyiceberg.types import IntegerType

    first = coordinator(tmp_path, faults="after_decision:raise@1")
    run_epoch(first, 0, OLD, OLD_IDS)
    with pytest.raises(InjectedFault):
        run_epoch(first, 1, NEW, NEW_IDS)
    first.close()
    with table(tmp_path).update_schema() as update:
        update.add_column("note", IntegerType())
    again = coordinator(tmp_path)
    with pytest.raises(SchemaEvolutionError, match="cannot be promoted") as refused:
        run_epoch(again, 1, NEW, NEW_IDS)
    assert refused.value.column == "note"
    with pytest.raises(EpochBlockedError) as err:
        again.recover()
    again.close()
    assert err.value.column == "note" and "another writer" in str(err.value)
    assert err.value.fix and "Fix:" in str(err.value)
    assert epochs(table(tmp_path)) == [0]
    with table(tmp_path).update_schema() as update:
        update.delete_column("note")
    fixed = coordinator(tmp_path)
    assert run_epoch(fixed, 1, NEW, NEW_IDS).status == "skipped"
    fixed.close()
    assert_evolved_with_epoch_1(tmp_path, OLD_IDS, NEW_IDS)
    assert lingering(tmp_path) == []


# -- a streaming query whose input changes shape mid-stream ---------------------------------

ROWS, FILES = 300, 3  # one file per epoch; epoch 1 brings the change


def assert_stream_evolved(tmp_path: Path) -> None:
    """Every input id once; epoch 0's rows null in what epoch 1 added; the new schema in
    exactly the metadata versions that hold epoch 1."""
    from pyiceberg.types import LongType

    from txsink.testing.inputs import input_epochs

    first = set(input_epochs(tmp_path / "input")[0])
    seen = rows_by_id(tmp_path)
    assert sorted(seen) == list(range(ROWS))
    for i, row in seen.items():
        if i in first:
            assert row["note"] is None and row["payload"]["b"] is None and row["amount"] < BIG
        else:
            assert row["note"] == f"n{i}" and row["payload"]["b"] == i % 7
            assert row["amount"] >= BIG
    t = table(tmp_path)
    assert t.schema().find_field("amount").field_type == LongType()
    assert epochs(t) == list(range(FILES))
    for has, ids in versions(tmp_path):
        assert has == (1 in ids), (has, ids)


@pytest.mark.spark
@pytest.mark.parametrize(
    ("point", "mode"),
    [
        # the default suite runs a streaming query through the kill-driver cell below
        pytest.param("during_commit", "raise", marks=pytest.mark.slow),
        pytest.param("before_decision", "raise", marks=pytest.mark.slow),
        pytest.param("after_precommit", "kill-worker", marks=pytest.mark.slow),
    ],
)
def test_a_query_whose_input_gains_a_column_and_widens_another_runs_through(
    spark: Any, tmp_path: Path, point: str, mode: str
) -> None:
    """``schema_evolution="add-columns"``, no manual step: a fault on the evolving epoch,
    the query restarted as a supervisor would, every row once."""
    from evolving_stream import Evolving, start

    from txsink.testing.inputs import make_input

    make_input(tmp_path / "input", ROWS, FILES)
    spec = f"{point}:{mode}@1" + ("#1" if mode == "kill-worker" else "")
    plan = FaultPlan.parse(spec, str(tmp_path / "faults"))
    runs = 0
    for _ in range(4):
        runs += 1
        coord = Coordinator([iceberg_sink(tmp_path)], log=str(tmp_path / "txlog"), faults=plan)
        batch = Evolving(coord)
        try:
            start(spark, tmp_path, batch).awaitTermination()
            break
        except Exception:  # the injected fault stops the query: restart it
            continue
        finally:
            batch.close()
    assert plan.fired(), "the fault never fired: test is void"
    assert runs <= 2
    assert_stream_evolved(tmp_path)


@pytest.mark.spark
def test_strict_stops_the_query_before_writing_anything(spark: Any, tmp_path: Path) -> None:
    from evolving_stream import Evolving, start
    from pyspark.errors import StreamingQueryException

    from txsink.testing.inputs import make_input

    make_input(tmp_path / "input", ROWS, FILES)
    batch = Evolving(Coordinator([iceberg_sink(tmp_path, "strict")], log=str(tmp_path / "txlog")))
    with pytest.raises(StreamingQueryException) as err:
        start(spark, tmp_path, batch).awaitTermination()
    batch.close()
    text = str(err.value)
    assert "schema_evolution='add-columns'" in text and "adds note" in text, text[-2000:]
    t = table(tmp_path)
    assert epochs(t) == [0] and "note" not in t.schema().column_names
    assert all(not has for has, _ in versions(tmp_path))


@pytest.mark.spark
@pytest.mark.parametrize(
    "point",
    [
        "after_decision",
        pytest.param("before_decision", marks=pytest.mark.slow),
        pytest.param("during_commit", marks=pytest.mark.slow),
    ],
)
def test_the_driver_killed_on_the_evolving_epoch(tmp_path: Path, point: str) -> None:
    """The driver process SIGKILLed at ``point`` of the evolving epoch, restarted by the
    runner until the input is done: schema and rows together, every row once."""
    import json
    import os
    import sys

    from txsink.runner import run_until_done
    from txsink.testing.inputs import make_input

    make_input(tmp_path / "input", ROWS, FILES)
    pipeline = Path(__file__).with_name("evolving_stream.py")
    env = dict(
        os.environ,
        TXSINK_FAULT=f"{point}:kill-driver@1",
        TXSINK_FAULT_STATE=str(tmp_path / "faults"),
    )
    report = run_until_done(
        [sys.executable, "-m", "txsink.runner", f"{pipeline}:run",
         json.dumps({"workdir": str(tmp_path)})],
        env=env,
        max_runs=4,
    )  # fmt: skip
    assert report.finished and report.restarts == 1, report
    assert_stream_evolved(tmp_path)


# -- a second reader: Spark with Apache Iceberg's own runtime ------------------------------


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.s3
def test_spark_with_icebergs_runtime_reads_old_and_new_rows(
    spark: Any,
    request: pytest.FixtureRequest,
    record_property: Callable[[str, object], None],
    tmp_path: Path,
) -> None:
    """The evolving stream into a table of the SQL catalog on PostgreSQL with its warehouse
    on S3, read back by Spark with Iceberg's runtime (``integration/iceberg_spark_reader.py``
    in a child process, as ``integration/test_iceberg_second_reader.py`` runs it): epoch
    0's rows null in the added column and field, the others with their values, the
    widened column promoted."""
    import json
    import os
    import subprocess

    import spark_jars
    from evolving_stream import Evolving, start

    from conftest import variant_target
    from txsink.connectors.iceberg.testing import catalog_properties as target_catalog
    from txsink.testing.inputs import input_epochs, make_input

    reader = spark_jars.iceberg_reader()
    if isinstance(reader, str):
        pytest.skip(reader)
    if reader.elsewhere:
        record_property("matrix_note", reader.elsewhere)
    target = variant_target(request, tmp_path, "iceberg", "sql-s3", tag="evo2r")
    spec, name = target.spec, f"{target.spec['table']}_evolved"
    make_input(tmp_path / "input", ROWS, FILES)
    batch = Evolving(
        Coordinator(
            [
                iceberg_sink(
                    tmp_path,
                    catalog=target_catalog(spec, target.env),
                    catalog_name=spec["catalog_name"],
                    table=name,
                )
            ],
            log=str(tmp_path / "txlog"),
        )
    )
    try:
        start(spark, tmp_path, batch).awaitTermination()
    finally:
        batch.close()
    script = Path(__file__).with_name("iceberg_spark_reader.py")
    args = [spec["catalog_name"], name, spec["warehouse"], "id", "id,amount,note,payload"]
    done = subprocess.run(
        [reader.python, str(script), *args],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env={**os.environ, **target.env, **reader.env},  # the servers of this session
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {int(r["id"]): r for r in seen["rows"]}
    assert sorted(rows) == list(range(ROWS)) and len(seen["rows"]) == ROWS
    first = set(input_epochs(tmp_path / "input")[0])
    for i, row in rows.items():
        if i in first:
            assert row["note"] is None and row["payload"]["b"] is None and row["amount"] < BIG
        else:
            assert row["note"] == f"n{i}" and row["payload"]["b"] == i % 7
            assert row["amount"] >= BIG
    assert sorted(int(s["summary"]["txsink.epoch"]) for s in seen["snapshots"]) == [0, 1, 2]
