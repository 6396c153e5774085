"""The Iceberg connector on a local SQLite catalog and a local warehouse (no servers): the
contract suite, the epoch recorded in the table, partitioned tables, schema checks, recovery."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.iceberg import IcebergHandle
from txsink.connectors.iceberg import catalog as cat
from txsink.connectors.iceberg.commit import epoch_key
from txsink.connectors.iceberg.naming import txn_of
from txsink.connectors.iceberg.testing import ADAPTER, IcebergVerifier
from txsink.errors import CommitError, ConfigurationError
from txsink.handles import Handle
from txsink.testing import contract
from txsink.testing.contract import SCHEMA

pytest.importorskip("pyiceberg")

LOCAL = {"catalog": "sqlite"}


def _iceberg(handles: list[Handle]) -> list[IcebergHandle]:
    return [h for h in handles if isinstance(h, IcebergHandle)]


@pytest.mark.parametrize("check", contract.CHECKS, ids=contract.CHECK_NAMES)
def test_contract_local(check: Callable[[contract.ContractRun], None], tmp_path: Path) -> None:
    check(contract.ContractRun(ADAPTER, tmp_path, env={}, options=LOCAL))


def _run(tmp_path: Path, **options: Any) -> tuple[contract.ContractRun, dict[str, Any], Any]:
    run = contract.ContractRun(ADAPTER, tmp_path, env={}, options={**LOCAL, **options})
    spec, sink = run.target()
    return run, spec, sink


def test_epoch_in_table_properties_and_summary(tmp_path: Path) -> None:
    run, spec, sink = _run(tmp_path)
    run.commit(sink, 0, run.prepare(sink, 0, [[1, 2], [3]]))
    run.commit(sink, 1, run.prepare(sink, 1, [[4]]))
    table = sink._load()
    assert table.properties[epoch_key(run.app_id, sink.uid)] == "1"
    summary = table.current_snapshot().summary
    assert summary["txsink.epoch"] == "1" and summary["txsink.app"] == run.app_id
    assert len(table.snapshots()) == 2  # one snapshot per epoch
    assert IcebergVerifier(spec, {}).epochs() == 2


def test_replayed_epoch_is_skipped_by_the_table_property(tmp_path: Path) -> None:
    run, spec, sink = _run(tmp_path)
    run.commit(sink, 0, run.prepare(sink, 0, [[1, 2]]))
    # A replay of epoch 0 (another attempt, new files): the property says it is done.
    again = run.prepare(sink, 0, [[1, 2]], round_=1)
    run.commit(sink, 0, again)
    seen, _ = run.seen(spec)
    assert sorted(seen) == [1, 2]
    assert len(sink._load().snapshots()) == 1


def test_commit_of_deleted_files_raises(tmp_path: Path) -> None:
    run, _spec, sink = _run(tmp_path)
    handles = run.prepare(sink, 0, [[1, 2]])
    sink._load().io.delete(_iceberg(handles)[0].files[0][0])
    with pytest.raises(CommitError, match="is gone"):
        run.commit(sink, 0, handles)


def test_recovery_deletes_unreferenced_files_only(tmp_path: Path) -> None:
    run, spec, sink = _run(tmp_path)
    run.commit(sink, 0, run.prepare(sink, 0, [[1, 2]]))
    run.prepare(sink, 1, [[3], [4]])  # prepared, never decided: orphans
    listed = list(sink.list_prepared(run.app_id))
    assert sorted(h.txn.partition for h in listed) == [0, 1]
    assert all(h.txn.epoch == 1 for h in listed)
    for handle in listed:
        sink.abort(handle)
    table = sink._load()
    keys = [k for k in cat.list_files(table) if txn_of(k) is not None]
    assert len(keys) == 1  # the committed epoch's file stays
    seen, lingering = run.seen(spec, [1, 2])
    assert (sorted(seen), lingering) == ([1, 2], 0)


@pytest.mark.parametrize("expire", [False, True])
def test_recovery_keeps_the_committed_attempt_of_an_epoch(tmp_path: Path, expire: bool) -> None:
    """A second attempt of a committed epoch (a replay's leftover) is deleted, the committed
    attempt's file stays: read from that epoch's own snapshot, or, once that snapshot is
    expired, from the whole history."""
    run, spec, sink = _run(tmp_path)
    run.commit(sink, 0, run.prepare(sink, 0, [[1, 2]]))
    run.commit(sink, 1, run.prepare(sink, 1, [[3]]))
    if expire:  # epoch 0's snapshot goes; its file is still in epoch 1's
        first = sink._load().snapshots()[0].snapshot_id
        sink._load().maintenance.expire_snapshots().by_id(first).commit()
    run.prepare(sink, 0, [[1, 2]], round_=1)  # the leftover of a replayed attempt
    listed = list(sink.list_prepared(run.app_id))
    assert [(h.txn.epoch, h.txn.round) for h in listed] == [(0, 1)]
    for handle in listed:
        sink.abort(handle)
    keys = [k for k in cat.list_files(sink._load()) if txn_of(k) is not None]
    assert len(keys) == 2  # epochs 0 and 1, committed
    seen, lingering = run.seen(spec, [1, 2, 3])
    assert (sorted(seen), lingering) == ([1, 2, 3], 0)


@pytest.mark.parametrize(
    "partition", [["identity:key"], ["bucket4:id"], ["identity:key", "bucket2:id"]]
)
def test_partitioned_tables(tmp_path: Path, partition: list[str]) -> None:
    run, spec, sink = _run(tmp_path, partition=partition)
    ids = list(range(40))
    handles = run.prepare(sink, 0, [ids[:25], ids[25:]])
    assert sum(len(h.files) for h in _iceberg(handles)) > 2  # split by partition value
    run.commit(sink, 0, handles)
    seen, lingering = run.seen(spec, ids)
    contract.assert_exactly_once(ids, seen, lingering=lingering)
    table = sink._load()
    # pyiceberg prunes by the partition values txsink recorded: they must be right.
    got = table.scan(row_filter="key = 'k3'", selected_fields=("id",)).to_arrow()
    assert sorted(got["id"].to_pylist()) == [3]


@pytest.mark.parametrize("partition", [[], ["identity:key"]])
def test_rows_are_encoded_in_row_groups_as_they_arrive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partition: list[str]
) -> None:
    """A task's rows reach the encoding thread a row group at a time (here 4 rows), into
    one file per partition value across row groups; an encoding error surfaces typed."""
    import pyarrow.parquet as pq

    from txsink.connectors.iceberg import writer
    from txsink.testing.contract import rows
    from txsink.txid import TxnId

    monkeypatch.setattr(writer, "FLUSH_ROWS", 4)
    run, spec, sink = _run(tmp_path, partition=partition)
    ids = list(range(30))
    open_ = sink.begin(TxnId(run.app_id, sink.uid, 0, 0, 0, 1), SCHEMA)
    for start in range(0, 30, 3):
        sink.write(open_, rows(ids[start : start + 3]))
    handle = sink.prepare(open_)
    paths = [f[0] for f in handle.files]
    assert len(paths) == len(set(paths)) == (1 if not partition else len(ids))  # key: k<id>
    if not partition:  # batches of 3 rows, handed over at >= 4 rows: 5 groups of 6
        assert pq.ParquetFile(paths[0].removeprefix("file://")).num_row_groups == 5
    run.commit(sink, 0, [handle])
    seen, lingering = run.seen(spec, ids)
    contract.assert_exactly_once(ids, seen, lingering=lingering)


def test_a_value_the_table_cannot_take_is_a_write_error_from_the_encoding_thread(
    tmp_path: Path,
) -> None:
    """Data the start-up check could not see (here: a batch of another schema) fails in the
    encoding thread; the task gets a WriteError naming the column, and discard() leaves
    no file behind."""
    from txsink.errors import WriteError
    from txsink.txid import TxnId

    run, _spec, sink = _run(tmp_path)
    open_ = sink.begin(TxnId(run.app_id, sink.uid, 0, 0, 0, 1), SCHEMA)
    bad = pa.RecordBatch.from_pydict({"id": [1], "amount": ["not a number"]})
    with pytest.raises(WriteError, match="'amount'") as err:
        sink.write(open_, bad)
        sink.prepare(open_)
    assert (err.value.column, err.value.sink_uid) == ("amount", sink.uid)
    sink.discard(open_)
    assert [k for k in cat.list_files(sink._load()) if txn_of(k) is not None] == []


@pytest.mark.parametrize("redact", [False, True], ids=["values", "redacted"])
def test_a_rejected_row_is_named_by_the_tables_identifier_fields(
    tmp_path: Path, redact: bool
) -> None:
    """A value the table's type cannot hold (a long too large for an int column) names
    its row by the table's identifier fields (its key), its partition and its offset in
    the task (across batches), with ``redact_rows`` by a hash of the values only; without
    identifier fields, by the row's first columns (issue 34, point 5)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import IntegerType, LongType, NestedField, StringType

    from txsink.connectors.iceberg.sink import IcebergSink
    from txsink.errors import WriteError
    from txsink.txid import TxnId

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    catalog = cat.load_catalog("rows", props)
    catalog.create_namespace("ns")
    fields = (
        NestedField(1, "note", StringType(), required=False),
        NestedField(2, "order_id", LongType(), required=True),
        NestedField(3, "qty", IntegerType(), required=False),
    )
    catalog.create_table("ns.keyed", schema=Schema(*fields, identifier_field_ids=[2]))
    catalog.create_table("ns.plain", schema=Schema(*fields))
    stream = pa.schema(
        [
            ("note", pa.string()),
            pa.field("order_id", pa.int64(), nullable=False),
            ("qty", pa.int64()),
        ]
    )

    def rejected(table: str) -> WriteError:
        # Data the start-up check did not see (it refuses a long for an int column): the
        # values are checked again as they are encoded.
        sink = IcebergSink(props, table, uid="u", catalog_name="rows", redact_rows=redact)
        open_ = sink.begin(TxnId("app", "u", 0, 0, 1, 1), stream)
        for first in (10, 13):  # the second batch's second row is too large for an int
            qty = [1, 2**40 if first == 13 else 2, 3]
            ids = [first, first + 1, first + 2]
            sink.write(
                open_,
                pa.RecordBatch.from_pydict(
                    {"note": ["n"] * 3, "order_id": ids, "qty": qty}, schema=stream
                ),
            )
        with pytest.raises(WriteError) as caught:
            sink.prepare(open_)
        sink.discard(open_)
        return caught.value

    keyed, plain = rejected("ns.keyed"), rejected("ns.plain")
    head = "[sink_uid=u, phase=prepare, connector=iceberg, column=qty] column 'qty' cannot be "
    if redact:
        assert re.fullmatch(
            re.escape(head) + r"written as int32: ArrowInvalid; cast or filter it in the query "
            r"\(row key order_id \(values redacted, sha256 [0-9a-f]{16}\) at partition 1, "
            r"offset 4\)",
            str(keyed),
        ), str(keyed)
        assert "14" not in str(keyed) and "1099511627776" not in str(plain)
        assert str(plain).endswith(
            "(row note, order_id, qty (values redacted, sha256 "
            f"{plain.row.digest}) at partition 1, offset 4)"  # type: ignore[union-attr]
        )
    else:
        assert str(keyed) == (
            head + "written as int32: ArrowInvalid; cast or filter it in the query (row key "
            "order_id=14 at partition 1, offset 4)"
        )
        assert str(plain).endswith(
            "(row note='n', order_id=14, qty=1099511627776 at partition 1, offset 4)"
        )


def test_day_partitioned_table(tmp_path: Path) -> None:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    from txsink.connectors.iceberg.sink import IcebergSink

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, TimestampType

    schema = Schema(NestedField(1, "id", LongType()), NestedField(2, "at", TimestampType()))
    catalog = cat.load_catalog("day", props)
    catalog.create_namespace("ns")
    catalog.create_table(
        "ns.t",
        schema=schema,
        partition_spec=PartitionSpec(PartitionField(2, 1000, DayTransform(), "at_day")),
    )
    sink = IcebergSink(props, "ns.t", uid="day", catalog_name="day")
    stream = pa.schema([("id", pa.int32()), ("at", pa.timestamp("ns"))])  # promoted and cast
    sink.check(stream, "app")
    from txsink.txid import TxnId

    open_ = sink.begin(TxnId("app", "day", 0, 0, 0, 1), stream)
    day = 86_400 * 10**9
    sink.write(
        open_, pa.RecordBatch.from_pydict({"id": [1, 2, 3], "at": [0, day, day + 5]}, schema=stream)
    )
    handle = sink.prepare(open_)
    assert len(handle.files) == 2
    contract.commit(sink, 0, [handle])
    assert sorted(sink._load().scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]


@pytest.mark.parametrize(
    ("stream", "column", "match"),
    [
        (pa.schema([("id", pa.int64()), ("nope", pa.string())]), "nope", "has no column 'nope'"),
        (pa.schema([("id", pa.string())]), "id", "does not promote"),
        (pa.schema([("id", pa.float64())]), "id", "does not promote"),
    ],
)
def test_schema_checks(tmp_path: Path, stream: pa.Schema, column: str, match: str) -> None:
    *_, sink = _run(tmp_path)
    with pytest.raises(ConfigurationError, match=match) as err:
        sink.check(stream, "app")
    assert err.value.column == column and err.value.sink_uid == sink.uid


def test_required_columns(tmp_path: Path) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from txsink.connectors.iceberg.sink import IcebergSink

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    catalog = cat.load_catalog("req", props)
    catalog.create_namespace("ns")
    catalog.create_table(
        "ns.t",
        schema=Schema(
            NestedField(1, "id", LongType(), required=True),
            NestedField(2, "note", StringType(), required=False),
        ),
    )
    sink = IcebergSink(props, "ns.t", uid="req", catalog_name="req")
    with pytest.raises(ConfigurationError, match="required column 'id' is missing"):
        sink.check(pa.schema([("note", pa.string())]), "app")
    with pytest.raises(
        ConfigurationError, match=r"required \(NOT NULL\) in the table but nullable"
    ):
        sink.check(pa.schema([("id", pa.int64())]), "app")
    sink.check(pa.schema([pa.field("id", pa.int64(), nullable=False)]), "app")  # note: optional


def test_missing_table_and_create(tmp_path: Path) -> None:
    from txsink.connectors.iceberg.sink import IcebergSink

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    with pytest.raises(ConfigurationError, match="does not exist"):
        IcebergSink(props, "ns.t", uid="u").check(SCHEMA, "app")
    IcebergSink(props, "ns.t", uid="u", create=True).check(SCHEMA, "app")
    assert cat.load_catalog("txsink", props).load_table("ns.t").schema().find_field("payload")


def test_unreachable_catalog_hides_the_uri(tmp_path: Path) -> None:
    from txsink.connectors.iceberg.sink import IcebergSink

    props = {
        "type": "sql",
        "uri": "postgresql+psycopg://u:s3cret@127.0.0.1:1/db",
        "warehouse": tmp_path.as_uri(),
    }
    with pytest.raises(ConfigurationError) as err:
        IcebergSink(props, "ns.t", uid="u").check(SCHEMA, "app")
    assert "s3cret" not in str(err.value) and "catalog" in str(err.value)


def test_unknown_commit_outcome_is_read_back_not_assumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.exceptions import CommitStateUnknownException
    from pyiceberg.table import Transaction

    run, spec, sink = _run(tmp_path)
    handles = run.prepare(sink, 0, [[1, 2], [3]])
    real = Transaction.commit_transaction
    calls: list[str] = []

    def landed_but_lost(self: Transaction) -> Any:
        calls.append("landed")
        real(self)  # the snapshot lands, the answer is lost
        raise CommitStateUnknownException("the answer was lost")

    monkeypatch.setattr(Transaction, "commit_transaction", landed_but_lost)
    run.commit(sink, 0, handles)
    assert calls == ["landed"]  # read back: committed, so no second append
    monkeypatch.undo()
    seen, lingering = run.seen(spec, [1, 2, 3])
    contract.assert_exactly_once([1, 2, 3], seen, lingering=lingering)

    handles = run.prepare(sink, 1, [[4]])

    def lost_before_landing(self: Transaction) -> Any:
        calls.append("lost")
        if calls.count("lost") == 1:
            raise CommitStateUnknownException("cut before the catalog saw it")
        return real(self)

    monkeypatch.setattr(Transaction, "commit_transaction", lost_before_landing)
    run.commit(sink, 1, handles)
    assert calls.count("lost") == 2  # read back: not committed, so committed again
    monkeypatch.undo()
    seen, lingering = run.seen(spec, [1, 2, 3, 4])
    contract.assert_exactly_once([1, 2, 3, 4], seen, lingering=lingering)


def test_concurrent_commit_is_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table import Transaction

    run, spec, sink = _run(tmp_path)
    handles = run.prepare(sink, 0, [[1, 2]])
    real = Transaction.commit_transaction
    other = ADAPTER.build_sink(spec, {})
    raced: list[int] = []

    def race(self: Transaction) -> Any:
        if not raced:  # another writer appends first: this commit loses the race
            raced.append(1)
            monkeypatch.setattr(Transaction, "commit_transaction", real)
            other._load().append(pa.Table.from_batches([contract.rows([500])]))
            raise CommitFailedException("Table has been updated by another process")
        return real(self)

    monkeypatch.setattr(Transaction, "commit_transaction", race)
    run.commit(sink, 0, handles)
    monkeypatch.undo()
    seen, _ = run.seen(spec)
    assert sorted(seen) == [1, 2, 500]


def test_data_source_options_build_the_sink(tmp_path: Path) -> None:
    import json

    from txsink.connectors.iceberg.sink import IcebergSink
    from txsink.datasource.options import parse_options

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    config = parse_options(
        {
            "connector": "iceberg",
            "catalog": json.dumps(props),
            "table": "ns.t",
            "uid": "ds",
            "create": "true",
            "log": str(tmp_path / "log"),
        }
    )
    assert isinstance(config.sink, IcebergSink)
    assert config.sink.catalog_properties == props and config.sink.create is True
    config.sink.check(SCHEMA, "app")  # creates the table


@pytest.mark.spark
@pytest.mark.parametrize(("max_tasks", "files"), [("auto", 2), (None, 6), (3, 3)])
def test_a_table_sink_coalesces_each_epoch_to_the_slots_by_default(
    spark: Any, tmp_path: Path, max_tasks: Any, files: int
) -> None:
    """A table sink prefers fewer, larger tasks: the coordinator's default (``"auto"``)
    coalesces a 6-partition epoch to local[2]'s two slots; None keeps one per partition."""
    from txsink import Coordinator
    from txsink.connectors.iceberg import IcebergSink

    props = {"type": "sql", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": tmp_path.as_uri()}
    sink = IcebergSink(props, "ns.t", uid="auto", catalog_name="auto", create=True)
    coordinator = Coordinator([sink], log=str(tmp_path / "log"), app_id="auto", max_tasks=max_tasks)
    result = coordinator.write(spark.range(0, 600, 1, 6), epoch=0)
    assert (result.status, result.handles) == ("committed", files)
    scan = sink._load().scan()
    assert len(list(scan.plan_files())) == files
    assert sorted(scan.to_arrow()["id"].to_pylist()) == list(range(600))


def test_the_observer_sees_whole_epochs_and_scans_only_a_new_metadata_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyiceberg.table import DataScan

    from txsink.connectors.iceberg.testing import IcebergTarget

    run, spec, sink = _run(tmp_path)
    view = IcebergTarget(spec, {})
    epoch_of = {1: 0, 2: 0, 3: 1}
    scans = 0
    real_to_arrow = DataScan.to_arrow

    def counted(self: DataScan) -> pa.Table:
        nonlocal scans
        scans += 1
        return real_to_arrow(self)

    monkeypatch.setattr(DataScan, "to_arrow", counted)
    assert view.sample(epoch_of).rows == {}
    run.commit(sink, 0, run.prepare(sink, 0, [[1], [2]]))
    assert view.sample(epoch_of).rows == {0: 2}
    assert view.sample(epoch_of).rows == {0: 2}
    assert scans == 2  # the second read of the same metadata file scanned nothing
    run.commit(sink, 1, run.prepare(sink, 1, [[3]]))
    assert view.sample(epoch_of).rows == {0: 2, 1: 1}
    assert scans == 3
    view.close()
    assert view.sample(epoch_of).rows == {0: 2, 1: 1}  # a fresh catalog after close()
    view.close()
