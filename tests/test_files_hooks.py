"""The files connector's hooks, driven directly (no Spark): each phase inspected on disk."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pyarrow as pa
import pytest

from txsink.connectors.files import (
    STAGING,
    FilesSink,
    iter_final_files,
    read_committed,
)
from txsink.errors import CommitError, ConfigurationError, WriteError
from txsink.rowref import RowRef
from txsink.txid import TxnId

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("x", pa.float64()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)


def _batch(ids: range, x: float = 1.5) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "id": list(ids),
            "name": [f"n{i}" for i in ids],
            "x": [x] * len(ids),
            "ts": [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * len(ids),
        },
        schema=SCHEMA,
    )


def _staged(path: Path) -> list[str]:
    d = path / STAGING
    return sorted(os.listdir(d)) if d.exists() else []


# The sink contract itself (nothing visible before commit, idempotent commit and abort,
# "already committed" verified, crashed attempts listed, a fresh process committing from
# the handle) is checked by txsink.testing.contract for every connector
# (integration/test_contract.py); what follows is the files connector's own behaviour.


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv"])
def test_every_format_round_trips(tmp_path: Path, fmt: str) -> None:
    sink = FilesSink(tmp_path, "s1", format=fmt)  # type: ignore[arg-type]
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", "s1", 0, 0, 1, 9), SCHEMA)
    sink.write(open_, _batch(range(0, 50)))
    sink.write(open_, _batch(range(50, 100)))
    handle = sink.prepare(open_)
    sink.commit(handle)
    assert len(list(iter_final_files(tmp_path))) == 1
    assert read_committed(tmp_path).num_rows == 0  # no manifest yet: readers see nothing
    sink.finish_epoch(0, [handle])
    table = read_committed(tmp_path)
    assert sorted(table.column("id").to_pylist()) == list(range(100))


def test_discard_leaves_nothing(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "s1")
    b = sink.begin(TxnId("app", "s1", 0, 0, 1, 2), SCHEMA)
    sink.write(b, _batch(range(10, 20)))
    sink.discard(b)
    assert _staged(tmp_path) == [] and list(iter_final_files(tmp_path)) == []


def test_rolls_files_at_target_size(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "s1", target_file_bytes=1000)
    t = sink.begin(TxnId("app", "s1", 3, 0, 0, 0), SCHEMA)
    for i in range(5):
        sink.write(t, _batch(range(i * 100, i * 100 + 100)))
    handle = sink.prepare(t)
    assert len(handle.files) == 5
    sink.commit(handle)
    sink.finish_epoch(3, [handle])
    assert read_committed(tmp_path).num_rows == 500


def test_commit_never_overwrites_a_different_file(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "s1")
    t = sink.begin(TxnId("app", "s1", 0, 0, 0, 0), SCHEMA)
    sink.write(t, _batch(range(10)))
    handle = sink.prepare(t)
    final = tmp_path / handle.files[0].final
    final.parent.mkdir(parents=True)
    final.write_bytes(b"someone else")
    with pytest.raises(CommitError, match="not the staged file"):
        sink.commit(handle)
    assert final.read_bytes() == b"someone else"


def test_json_rejects_nan_with_row_and_column(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "s1", format="jsonl")
    t = sink.begin(TxnId("app", "s1", 0, 0, 2, 0), SCHEMA)
    bad = pa.RecordBatch.from_pydict(
        {"id": [1, 2], "name": ["a", "b"], "x": [0.5, float("nan")], "ts": [None, None]},
        schema=SCHEMA,
    )
    with pytest.raises(WriteError) as info:
        sink.write(t, bad)
    row = info.value.row
    assert isinstance(row, RowRef) and (row.offset, row.partition) == (1, 2)
    assert str(row) == "id=2, name='b', x=nan at partition 2, offset 1"
    assert (info.value.column, info.value.sink_uid) == ("x", "s1")
    assert "NaN" in str(info.value)


def test_csv_refuses_nested_columns_at_start(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "s1", format="csv")
    with pytest.raises(ConfigurationError, match=r"'tags'.*CSV cannot hold"):
        sink.check(pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string()))]), "app")


def test_bad_options_fail_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format"):
        FilesSink(tmp_path, "s1", format="xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sink uid"):
        FilesSink(tmp_path, "has space")


def test_json_maps_are_objects_and_read_back(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("attrs", pa.map_(pa.string(), pa.int64()))])
    sink = FilesSink(tmp_path, "s1", format="jsonl")
    t = sink.begin(TxnId("app", "s1", 0, 0, 0, 0), schema)
    sink.write(
        t, pa.RecordBatch.from_pylist([{"id": 1, "attrs": [("a", 1)]}, {"id": 2}], schema=schema)
    )
    handle = sink.prepare(t)
    sink.commit(handle)
    sink.finish_epoch(0, [handle])
    assert read_committed(tmp_path).to_pylist()[0]["attrs"] == {"a": 1}


def test_another_apps_epochs_in_the_folder_are_refused(tmp_path: Path) -> None:
    sink = FilesSink(tmp_path, "s1")
    sink.check(SCHEMA, "app-1")
    t = sink.begin(TxnId("app-1", "s1", 0, 0, 0, 0), SCHEMA)
    sink.write(t, _batch(range(3)))
    handle = sink.prepare(t)
    sink.commit(handle)
    sink.finish_epoch(0, [handle])
    sink.check(SCHEMA, "app-1")  # the same app may go on
    with pytest.raises(ConfigurationError, match=r"written by app 'app-1'.*new output folder"):
        sink.check(SCHEMA, "app-2")


def test_a_foreign_manifest_for_the_same_epoch_is_refused(tmp_path: Path) -> None:
    """Regression: files used to keep another writer's manifest silently (S3 refuses it)."""
    sink = FilesSink(tmp_path, "s1")
    t = sink.begin(TxnId("app", "s1", 4, 0, 0, 0), SCHEMA)
    sink.write(t, _batch(range(10)))
    handle = sink.prepare(t)
    sink.commit(handle)
    sink.finish_epoch(4, [handle])
    sink.finish_epoch(4, [handle])  # a recovery re-run writes the same manifest: accepted
    manifest = tmp_path / "_manifests" / f"s1-{4:020d}.json"
    before = manifest.read_bytes()
    # Another query's epoch 4 of the same uid (here: one with no rows) must not pass as ours.
    with pytest.raises(CommitError, match="already exists and lists other data files") as info:
        sink.finish_epoch(4, [])
    err = info.value
    assert (err.sink_uid, err.epoch, err.phase, err.connector) == ("s1", 4, "commit", "files")
    assert str(manifest) in str(err) and "own output folder or sink uid" in str(err)
    assert manifest.read_bytes() == before  # nothing overwritten
    assert sorted(read_committed(tmp_path).column("id").to_pylist()) == list(range(10))
