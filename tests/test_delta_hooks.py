"""The Delta connector's hooks, driven directly (no Spark), on local tables read back with
delta-rs: what the shared contract suite (integration/test_contract.py) does not cover."""

from __future__ import annotations

import datetime as dt
import json
import logging
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError

from txsink.connectors.delta import DeltaHandle, DeltaSink
from txsink.connectors.delta.commit import ATTEMPTS, app_txn_id
from txsink.contract import EpochCommit
from txsink.errors import CommitError, ConfigurationError, WriteError
from txsink.handles import Handle, dump_handle
from txsink.rowref import RowRef
from txsink.txid import TxnId

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("day", pa.date32())])


def _batch(ids: Sequence[int], keys: Sequence[str | None] | None = None) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": list(ids),
            "key": list(keys) if keys is not None else [f"k{i % 3}" for i in ids],
            "day": [dt.date(2026, 1, 1 + i % 28) for i in ids],
        },
        schema=SCHEMA,
    )


def _sink(path: Path, uid: str = "d1", **options: Any) -> DeltaSink:
    options.setdefault("create_table", True)
    sink = DeltaSink(str(path), uid, **options)
    sink.check(SCHEMA, "app")
    return sink


def _prepare(
    sink: DeltaSink, epoch: int, ids: Sequence[int], *, partition: int = 0, attempt: int = 1
) -> DeltaHandle:
    open_ = sink.begin(TxnId("app", sink.uid, epoch, 0, partition, attempt), SCHEMA)
    sink.write(open_, _batch(ids))
    return sink.prepare(open_)


def _commit(sink: DeltaSink, epoch: int, *handles: DeltaHandle) -> list[Sequence[Handle]]:
    units: list[Sequence[Handle]] = []
    sink.commit_epoch(EpochCommit(epoch, tuple(handles), None, units.append))
    return units


def _ids(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())


def test_the_commit_records_the_epoch_and_the_app_in_the_log(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "t")
    _commit(sink, 4, _prepare(sink, 4, [1, 2]), _prepare(sink, 4, [3], partition=1))
    table = DeltaTable(str(tmp_path / "t"))
    assert table.transaction_version(app_txn_id("app", "d1")) == 4
    (last,) = table.history(1)
    assert (last["txsink.app"], last["txsink.uid"], last["txsink.epoch"]) == ("app", "d1", 4)
    assert last["txsink.rows"] == 3
    assert table.version() == 1  # the creation, then one commit for the whole epoch
    assert _ids(tmp_path / "t") == [1, 2, 3]


def test_an_epoch_the_log_records_is_not_added_again(tmp_path: Path) -> None:
    """delta-rs does not enforce the txn version: txsink reads it and skips."""
    sink = _sink(tmp_path / "t")
    _commit(sink, 2, _prepare(sink, 2, [1, 2]))
    # Another attempt of the same epoch (a zombie driver), and an older epoch arriving late.
    again = _prepare(sink, 2, [1, 2], attempt=2)
    late = _prepare(sink, 1, [7])
    assert _commit(sink, 2, again) == [(again,)]  # reported as committed: verified in the log
    _commit(sink, 1, late)
    assert _ids(tmp_path / "t") == [1, 2]
    assert DeltaTable(str(tmp_path / "t")).version() == 1


def test_an_empty_epoch_makes_no_commit(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "t")
    _commit(sink, 0)
    assert DeltaTable(str(tmp_path / "t")).version() == 0


def test_a_file_gone_before_the_commit_is_a_commit_error(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "t")
    handle = _prepare(sink, 0, [1, 2])
    (tmp_path / "t" / handle.files[0].path).unlink()
    with pytest.raises(CommitError, match="its rows are lost") as info:
        _commit(sink, 0, handle)
    assert (info.value.sink_uid, info.value.epoch, info.value.connector) == ("d1", 0, "delta")
    assert DeltaTable(str(tmp_path / "t")).version() == 0


def test_a_table_deleted_before_the_commit_is_a_commit_error(tmp_path: Path) -> None:
    import shutil

    sink = _sink(tmp_path / "t")
    handle = _prepare(sink, 0, [1])
    shutil.rmtree(tmp_path / "t" / "_delta_log")
    with pytest.raises(CommitError, match=r"no Delta table at .* any more") as info:
        _commit(sink, 0, handle)
    assert (info.value.phase, info.value.epoch) == ("commit", 0)


def test_an_ambiguous_commit_is_decided_from_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log entry landed but the call failed (a timeout after the PUT): not added twice."""
    sink = _sink(tmp_path / "t")
    handle = _prepare(sink, 0, [1, 2, 3])
    real = DeltaTable.create_write_transaction
    calls: list[int] = []

    def landed_then_failed(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        real(self, *args, **kwargs)
        raise OSError("connection reset after the PUT")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", landed_then_failed)
    assert _commit(sink, 0, handle) == [(handle,)]
    assert calls == [1]
    assert _ids(tmp_path / "t") == [1, 2, 3]


def test_a_failed_commit_is_retried_and_a_lasting_failure_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = _sink(tmp_path / "t")
    handle = _prepare(sink, 0, [1, 2])
    real = DeltaTable.create_write_transaction
    failures = [OSError("timeout before the PUT")]

    def fails_once(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        if failures:
            raise failures.pop()
        real(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", fails_once)
    _commit(sink, 0, handle)
    assert _ids(tmp_path / "t") == [1, 2]

    def always(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        raise OSError("storage down")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", always)
    with pytest.raises(CommitError, match=f"after {ATTEMPTS} attempts"):
        _commit(sink, 1, _prepare(sink, 1, [5]))


def test_a_conflict_with_a_commit_of_the_same_epoch_keeps_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two drivers commit the same epoch at once: the loser re-reads the log and stops."""
    sink = _sink(tmp_path / "t")
    mine, theirs = _prepare(sink, 0, [1, 2]), _prepare(sink, 0, [1, 2], attempt=2)
    real = DeltaTable.create_write_transaction

    def other_driver_wins(self: DeltaTable, *args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(DeltaTable, "create_write_transaction", real)
        _commit(_sink(tmp_path / "t"), 0, theirs)
        raise CommitFailedError("Transaction failed: concurrent transaction")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", other_driver_wins)
    assert _commit(sink, 0, mine) == [(mine,)]
    assert _ids(tmp_path / "t") == [1, 2]
    assert DeltaTable(str(tmp_path / "t")).version() == 1


def test_partitioned_tables_get_hive_folders_and_partition_values(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "t", partition_by=["key"])
    open_ = sink.begin(TxnId("app", "d1", 0, 0, 0, 1), SCHEMA)
    sink.write(open_, _batch([1, 2, 3, 4], ["a", "a:b c/d", None, ""]))
    handle = sink.prepare(open_)
    folders = sorted(f.path.split("/")[0] for f in handle.files)
    assert folders == ["key=__HIVE_DEFAULT_PARTITION__", "key=a", "key=a%3Ab%20c%2Fd"]
    _commit(sink, 0, handle)
    table = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().sort_by("id")
    # '' is null in a partition value, as Spark writes it.
    assert table.column("key").to_pylist() == ["a", "a:b c/d", None, None]
    assert table.column("id").to_pylist() == [1, 2, 3, 4]
    assert list(sink.list_prepared("app")) == []


def test_list_prepared_finds_only_this_app_and_uid_and_not_what_the_table_holds(
    tmp_path: Path,
) -> None:
    sink = _sink(tmp_path / "t")
    other_uid = _sink(tmp_path / "t", uid="d2")
    committed = _prepare(sink, 0, [1])
    _commit(sink, 0, committed)
    mine = _prepare(sink, 1, [2], attempt=3)
    _prepare(other_uid, 1, [3])
    open_ = sink.begin(TxnId("other-app", "d1", 1, 0, 0, 1), SCHEMA)
    sink.write(open_, _batch([4]))
    sink.prepare(open_)
    listed = list(sink.list_prepared("app"))
    assert [h.txn for h in listed] == [mine.txn]
    assert [f.path for f in listed[0].files] == [f.path for f in mine.files]
    sink.abort(listed[0])
    sink.abort(listed[0])
    assert list(sink.list_prepared("app")) == []
    assert _ids(tmp_path / "t") == [1]


def test_the_add_actions_carry_exact_statistics(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "t")
    _commit(sink, 0, _prepare(sink, 0, [5, 9, 7]))
    actions = pa.table(DeltaTable(str(tmp_path / "t")).get_add_actions(flatten=True))
    row = actions.to_pylist()[0]
    assert row["num_records"] == 3
    assert (row["min.id"], row["max.id"]) == (5, 9)
    assert (row["min.key"], row["max.key"]) == ("k0", "k2")
    assert row["null_count.id"] == 0
    # A reader that skips files by them still finds the rows.
    found = DeltaTable(str(tmp_path / "t")).to_pyarrow_table(filters=[("id", "=", 9)])
    assert found.column("id").to_pylist() == [9]


def test_a_missing_table_is_refused_unless_create_table(tmp_path: Path) -> None:
    sink = DeltaSink(str(tmp_path / "none"), "d1")
    with pytest.raises(ConfigurationError, match="create_table=True") as info:
        sink.check(SCHEMA, "app")
    assert (info.value.sink_uid, info.value.phase) == ("d1", "check")
    assert not (tmp_path / "none").exists()


def test_an_existing_table_is_used_with_its_partitioning(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "t"), _batch([100]), partition_by=["key"])
    sink = DeltaSink(str(tmp_path / "t"), "d1")
    sink.check(SCHEMA, "app")
    _commit(sink, 0, _prepare(sink, 0, [1, 2]))
    assert _ids(tmp_path / "t") == [1, 2, 100]
    with pytest.raises(ConfigurationError, match="partitioned by"):
        DeltaSink(str(tmp_path / "t"), "d1", partition_by=["day"]).check(SCHEMA, "app")


@pytest.mark.parametrize(
    ("schema", "column", "words"),
    [
        (SCHEMA.append(pa.field("extra", pa.int32())), "extra", "not in the Delta table"),
        (SCHEMA.remove(2), "day", "missing from the DataFrame"),
        (SCHEMA.set(0, pa.field("id", pa.string())), "id", "cast it to the table's type"),
        (SCHEMA.set(0, pa.field("id", pa.float64())), "id", "cast it to the table's type"),
    ],
)
def test_a_schema_that_does_not_fit_is_refused_at_start(
    tmp_path: Path, schema: pa.Schema, column: str, words: str
) -> None:
    _sink(tmp_path / "t")
    with pytest.raises(ConfigurationError, match=words) as info:
        DeltaSink(str(tmp_path / "t"), "d1").check(schema, "app")
    assert info.value.column == column


def test_narrower_integers_are_widened(tmp_path: Path) -> None:
    _sink(tmp_path / "t")
    narrow = SCHEMA.set(0, pa.field("id", pa.int32()))
    sink = DeltaSink(str(tmp_path / "t"), "d1")
    sink.check(narrow, "app")
    open_ = sink.begin(TxnId("app", "d1", 0, 0, 0, 1), narrow)
    sink.write(open_, _batch([1, 2]).cast(narrow))
    _commit(sink, 0, sink.prepare(open_))
    assert _ids(tmp_path / "t") == [1, 2]


def test_a_null_in_a_not_null_column_names_its_row_and_column(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False), ("key", pa.string())])
    DeltaTable.create(str(tmp_path / "t"), strict)
    sink = DeltaSink(str(tmp_path / "t"), "d1")
    given = pa.schema([("id", pa.int64()), ("key", pa.string())])
    caplog.set_level(logging.WARNING, logger="txsink")
    sink.check(given, "app")  # nullable in Spark, no null yet: accepted, with a warning
    assert [r.getMessage() for r in caplog.records] == [
        f"[uid=d1 epoch=None] column 'id' is NOT NULL in the Delta table at {tmp_path / 't'}, "
        "and the DataFrame's 'id' is nullable: a null in it refuses its epoch when written "
        "(before the decision, naming the row), and the query stops until it is fixed. If it "
        "may hold nulls, filter them (df.where(col('id').isNotNull())) or fill a default "
        "(coalesce(col('id'), lit(...))) before the sink; else accept the risk"
    ]
    caplog.clear()
    DeltaSink(str(tmp_path / "t"), "d1").check(strict, "app")  # not nullable: nothing to say
    assert caplog.records == []
    open_ = sink.begin(TxnId("app", "d1", 0, 0, 2, 1), given)
    sink.write(open_, pa.RecordBatch.from_pydict({"id": [1, 2], "key": ["a", "b"]}, given))
    with pytest.raises(WriteError, match="NOT NULL") as info:
        sink.write(open_, pa.RecordBatch.from_pydict({"id": [3, None], "key": ["c", "d"]}, given))
    row = info.value.row
    assert isinstance(row, RowRef) and (row.offset, row.partition) == (3, 2)
    assert (info.value.column, info.value.partition) == ("id", 2)
    sink.discard(open_)
    assert list(sink.list_prepared("app")) == []


def test_unsafe_rename_is_refused() -> None:
    with pytest.raises(ValueError, match="AWS_S3_ALLOW_UNSAFE_RENAME"):
        DeltaSink("s3://b/t", "d1", storage_options={"aws_s3_allow_unsafe_rename": "true"})


def test_no_secret_in_the_repr_the_handle_or_the_errors(tmp_path: Path) -> None:
    secret = "s3cr3t-value"
    sink = DeltaSink(
        "s3://bucket/t",
        "d1",
        storage_options={"AWS_SECRET_ACCESS_KEY": secret, "AWS_ENDPOINT_URL": "http://127.0.0.1:9"},
    )
    handle = DeltaHandle(txn=TxnId("app", "d1", 0, 0, 0, 1), table=sink.table)
    assert secret not in repr(sink)
    assert secret not in json.dumps(dump_handle(handle))
    assert secret not in repr(sink._storage)
    assert pickle.loads(pickle.dumps(sink)).table == "s3://bucket/t"


def test_the_observer_sees_whole_epochs(tmp_path: Path) -> None:
    from txsink.connectors.delta.testing import DeltaTableTarget

    sink = _sink(tmp_path / "t")
    view = DeltaTableTarget(str(tmp_path / "t"))
    epoch_of = {1: 0, 2: 0, 3: 1}
    handles = [_prepare(sink, 0, [1, 2]), _prepare(sink, 1, [3])]
    assert view.sample(epoch_of).rows == {}
    _commit(sink, 0, handles[0])
    assert view.sample(epoch_of).rows == {0: 2}
    _commit(sink, 1, handles[1])
    assert view.sample(epoch_of).rows == {0: 2, 1: 1}


def test_the_options_endpoint_wins_over_the_environments_s3_specific_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the secured matrix beside the plain server: with ``AWS_ENDPOINT_URL_S3`` in
    the environment (there for boto3 and another server), delta-rs sent the table's requests
    to that server, not to the endpoint the sink's options name. The options' endpoint is
    now passed under the S3-specific name too; an explicit one is kept."""
    from txsink.connectors.delta.storage import Storage

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
    given = {"AWS_ENDPOINT_URL": "https://s3.example:9000", "AWS_ACCESS_KEY_ID": "k"}
    options = Storage("s3://bucket/t", given).delta_options()
    assert options is not None and options["AWS_ENDPOINT_URL_S3"] == "https://s3.example:9000"
    assert "AWS_ALLOW_HTTP" not in options
    explicit = {**given, "aws_endpoint_url_s3": "https://other:9000"}
    options = Storage("s3://bucket/t", explicit).delta_options()
    assert options is not None and options["AWS_ENDPOINT_URL_S3"] == "https://other:9000"
