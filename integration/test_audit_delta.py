"""The Delta sink's audit (#42): epochs run through the protocol (``Coordinator.run_epoch``,
tasks in this process) into a real table, on local storage and on MinIO; then the table is
tampered with by other means than txsink (storage deletes, delta-rs' DELETE, hand-written
adds, another writer's append and overwrite + VACUUM) and ``audit_log`` must name the epoch,
the sink and the difference. A clean run audits clean, at both levels.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txsink.connectors.delta import DeltaSink
from txsink.connectors.delta import audit as delta_audit
from txsink.connectors.delta.storage import Storage
from txsink.ops.audit.run import AuditReport, AuditRow, audit_log
from txsink.protocol.log import TxLog
from txsink.spark.checks import check_sinks

SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("day", pa.date32())]
)
#: Rows per epoch, split over two tasks; each task writes one file per ``day``.
PER = 40
EPOCHS = 3
UID = "d"


def _rows(epoch: int) -> list[dict[str, Any]]:
    return [
        {"id": i, "name": f"n{i}", "amount": i * 1.5, "day": dt.date(2026, 1, 1 + i % 2)}
        for i in range(epoch * PER, (epoch + 1) * PER)
    ]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """A table location and its storage options: a local folder, or a table on MinIO."""
    if request.param == "local":
        yield str(tmp_path / "t"), None
        return
    from txsink.connectors.delta.testing import ADAPTER, storage_options

    s3 = request.getfixturevalue("s3")
    spec = ADAPTER.new_target(tmp_path, "audit", s3.env())
    try:
        yield spec["table"], storage_options(spec["table"], s3.env())
    finally:
        ADAPTER.drop_target(spec, s3.env())


@pytest.fixture
def local(tmp_path: Path) -> tuple[str, Any]:
    return str(tmp_path / "t"), None


def _sink(table: str, options: dict[str, str] | None) -> DeltaSink:
    return DeltaSink(table, UID, create_table=True, partition_by=["day"], storage_options=options)


def _run(table: str, options: dict[str, str] | None, log: Path, epochs: int = EPOCHS) -> TxLog:
    """Epochs up to ``epochs`` through the protocol, each of two tasks (those the log
    committed before are skipped); returns the txsink log."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.memsink import memory_precommit
    from txsink import Coordinator

    sink = _sink(table, options)
    coordinator = Coordinator([sink], log=str(log), app_id="app")
    for epoch in range(epochs):
        if coordinator.log.committed(epoch) is not None:
            continue  # run before (as Spark does not replay a committed batch)
        coordinator.schema_plan = check_sinks([sink], SCHEMA, "app", None)
        rows = _rows(epoch)
        parts = [[pa.RecordBatch.from_pylist(rows[p::2], SCHEMA)] for p in range(2)]
        coordinator.run_epoch(epoch, memory_precommit(parts), app_id="app")
    txlog = coordinator.log
    assert isinstance(txlog, TxLog)
    return txlog


def _audit(log: TxLog, table: str, options: dict[str, str] | None, **kwargs: Any) -> AuditReport:
    return audit_log(log, [_sink(table, options)], **kwargs)


def _row(report: AuditReport, epoch: int) -> AuditRow:
    (row,) = [r for r in report.rows if r.epoch == epoch]
    return row


def _epoch_files(table: str, options: dict[str, str] | None, epoch: int) -> list[str]:
    """The stored paths of the files the table's current version holds for ``epoch``
    (by delta-rs, not by the sink)."""
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(table, storage_options=options).get_add_actions(flatten=True))
    return sorted(p for p in actions.column("path").to_pylist() if f".{UID}.e{epoch}." in p)


def _fs(table: str, options: dict[str, str] | None) -> tuple[Any, str]:
    return Storage(table, options or {}).filesystem()


def _assert_only(report: AuditReport, epoch: int, *texts: str) -> AuditRow:
    """``epoch`` is the one mismatch, of sink ``UID``, its differences holding ``texts``."""
    assert not report.ok
    bad = report.mismatches
    assert [(r.epoch, r.sink, r.status) for r in bad] == [(epoch, UID, "mismatch")], bad
    joined = " | ".join(bad[0].differences)
    for text in texts:
        assert text in joined, joined
    return bad[0]


# -- a clean run -------------------------------------------------------------------------


def test_a_clean_run_audits_clean_metadata_and_deep(where: tuple[str, Any], tmp_path: Path) -> None:
    table, options = where
    log = _run(table, options, tmp_path / "txlog")
    report = _audit(log, table, options)
    assert report.ok, report.to_json()
    assert [(r.epoch, r.sink, r.expected, r.found, r.status, r.checksum) for r in report.rows] == [
        (e, UID, PER, PER, "ok", "not read") for e in range(EPOCHS)
    ]
    deep = _audit(log, table, options, deep=True)
    assert deep.ok, deep.to_json()
    assert [(r.epoch, r.found, r.status, r.checksum) for r in deep.rows] == [
        (e, PER, "ok", "ok") for e in range(EPOCHS)
    ]
    assert not deep.extras[UID]
    assert any("not named by txsink" in n for n in deep.notes[UID])


def test_a_column_added_by_schema_evolution_audits_clean(
    local: tuple[str, Any], tmp_path: Path
) -> None:
    """Epoch 0 in the old shape, epochs 1 and 2 with a new column (the commit of epoch 1
    evolves the table, a log entry txsink writes itself): each epoch digests the columns it
    was written with, the deep audit is clean."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from deltalake import DeltaTable

    from tests.memsink import memory_precommit
    from txsink import Coordinator

    table, _ = local
    wide = SCHEMA.append(pa.field("note", pa.string()))
    sink = DeltaSink(
        table, UID, create_table=True, partition_by=["day"], schema_evolution="add-columns"
    )
    coordinator = Coordinator([sink], log=str(tmp_path / "txlog"), app_id="app")
    for epoch in range(EPOCHS):
        schema = SCHEMA if epoch == 0 else wide
        rows = [{**r, "note": f"e{epoch}"} if epoch else r for r in _rows(epoch)]
        coordinator.schema_plan = check_sinks([sink], schema, "app", None)
        parts = [[pa.RecordBatch.from_pylist(rows[p::2], schema)] for p in range(2)]
        coordinator.run_epoch(epoch, memory_precommit(parts), app_id="app")
    assert pa.schema(DeltaTable(table).schema().to_arrow()).names[-1] == "note"
    assert isinstance(coordinator.log, TxLog)
    report = audit_log(coordinator.log, [sink], deep=True)
    assert report.ok, report.to_json()
    assert [(r.epoch, r.found, r.checksum) for r in report.rows] == [
        (e, PER, "ok") for e in range(EPOCHS)
    ]


# -- tampering -----------------------------------------------------------------------------


def test_a_data_file_deleted_from_storage_fails_its_epoch(
    where: tuple[str, Any], tmp_path: Path
) -> None:
    """One file of epoch 1 deleted behind the table's back: its log still adds it, the
    record counts still add up; the HEAD of each file finds it gone."""
    table, options = where
    log = _run(table, options, tmp_path / "txlog")
    gone = _epoch_files(table, options, 1)[0]
    fs, root = _fs(table, options)
    fs.delete_file(f"{root}/{gone}")
    report = _audit(log, table, options)
    row = _assert_only(report, 1, f"data file {gone} of epoch 1 is gone from storage")
    assert row.found == PER  # the metadata still counts it: the stat found the gap
    deep = _audit(log, table, options, deep=True)
    row = _assert_only(deep, 1, f"data file {gone} of epoch 1 is gone from storage", "missing")
    assert row.found is not None and row.found < PER


def test_rows_deleted_by_another_writer_fail_their_epoch(
    where: tuple[str, Any], tmp_path: Path
) -> None:
    """delta-rs' DELETE of one row of epoch 2 rewrites its file: the file txsink committed
    is removed by a version that is not txsink's, named with its operation."""
    from deltalake import DeltaTable

    table, options = where
    log = _run(table, options, tmp_path / "txlog")
    DeltaTable(table, storage_options=options).delete(f"id = {2 * PER + 4}")
    version = DeltaTable(table, storage_options=options).version()
    report = _audit(log, table, options)
    row = _assert_only(
        report, 2, "rows of epoch 2 removed at version", f"{version} (operation DELETE"
    )
    assert row.found is not None and row.found < PER
    assert "missing" in " ".join(row.differences)


def test_a_compaction_keeps_every_epoch_counted_and_says_so(
    local: tuple[str, Any], tmp_path: Path
) -> None:
    """``OPTIMIZE`` rewrites the epochs' files with ``dataChange: false``: the table's own
    statement that the rows are the same. The audit counts them as committed (metadata and
    deep pass), says which files were compacted, and does not read them per epoch; a DELETE
    after it is still a mismatch (its remove says ``dataChange: true``)."""
    from deltalake import DeltaTable

    table, options = local
    log = _run(table, options, tmp_path / "txlog")
    DeltaTable(table).optimize.compact()
    for deep in (False, True):
        report = _audit(log, table, options, deep=deep)
        assert report.ok, report.to_json()
        assert [(r.found, r.checksum) for r in report.rows] == [(PER, "not read")] * EPOCHS
        assert any("without a data change" in n and "OPTIMIZE" in n for n in report.notes[UID])
    DeltaTable(table).delete(f"id = {2 * PER + 4}")
    report = _audit(log, table, options)
    assert not report.ok  # the compacted file holding every epoch's rows was rewritten
    assert {r.epoch for r in report.rows if r.status != "ok"} == {0, 1, 2}
    text = " ".join(report.rows[2].differences)
    assert "were compacted at version" in text and "(operation DELETE" in text, text


def test_a_copy_of_an_epoch_file_added_by_hand_is_an_extra(
    local: tuple[str, Any], tmp_path: Path
) -> None:
    """A copy of a file of epoch 1 under a txsink name, committed by a hand-written add
    action (not a txsink commit): the epoch's own files are all there (its row is ok), the
    copy is an extra of epoch 1 and the audit fails."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    table, options = local
    log = _run(table, options, tmp_path / "txlog")
    source = _epoch_files(table, options, 1)[0]
    copy = source.replace("-0000.parquet", "-0099.parquet")
    assert copy != source
    (Path(table) / copy).write_bytes((Path(table) / source).read_bytes())
    t = DeltaTable(table)
    add = next(
        a for a in pa.table(t.get_add_actions(flatten=True)).to_pylist() if a["path"] == source
    )
    day = str(add["partition.day"])
    t.create_write_transaction(
        [AddAction(copy, (Path(table) / copy).stat().st_size, {"day": day}, 0, True, "")],
        "append",
        t.schema(),
        partition_by=["day"],
    )
    report = _audit(log, table, options)
    assert not report.ok
    assert [r.status for r in report.rows] == ["ok"] * EPOCHS
    (extra,) = report.extras[UID]
    assert extra.epoch == 1 and copy in extra.what and "another writer" in extra.what


def test_another_writers_append_of_the_same_rows_is_not_ours(
    local: tuple[str, Any], tmp_path: Path
) -> None:
    """write_deltalake appends epoch 1's rows again, in files of its own naming: the audit
    cannot tell them from new rows without keys; the epochs still audit ok and the notes say
    a commit that is not txsink's is in the versions read (docs/connectors/delta.md#audit)."""
    from deltalake import write_deltalake

    table, options = local
    log = _run(table, options, tmp_path / "txlog")
    write_deltalake(table, pa.Table.from_pylist(_rows(1), SCHEMA), mode="append")
    report = _audit(log, table, options, deep=True)
    assert report.ok, report.to_json()
    assert any("not txsink's" in n and "WRITE" in n for n in report.notes[UID]), report.notes


def test_an_overwrite_then_vacuum_fails_every_epoch(local: tuple[str, Any], tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    table, options = local
    log = _run(table, options, tmp_path / "txlog")
    write_deltalake(table, pa.Table.from_pylist(_rows(0)[:3], SCHEMA), mode="overwrite")
    t = DeltaTable(table)
    version = t.version()
    assert t.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    report = _audit(log, table, options)
    assert not report.ok
    assert [(r.epoch, r.sink, r.status, r.found) for r in report.rows] == [
        (e, UID, "mismatch", 0) for e in range(EPOCHS)
    ]
    for r in report.rows:
        text = " | ".join(r.differences)
        assert f"rows of epoch {r.epoch} removed at version {version} (operation WRITE" in text
        assert f"expected {PER} rows, found 0 ({PER} missing)" in text


def test_a_file_rewritten_with_other_values_fails_the_deep_checksum(
    local: tuple[str, Any], tmp_path: Path
) -> None:
    """A file of epoch 0 replaced by one with the same rows but another ``name``: the deep
    audit names the column."""
    table, options = local
    log = _run(table, options, tmp_path / "txlog")
    path = Path(table) / _epoch_files(table, options, 0)[0]
    data = pq.read_table(path)
    names = pa.array([f"x{v}" for v in data.column("name").to_pylist()])
    pq.write_table(data.set_column(data.column_names.index("name"), "name", names), path)
    report = _audit(log, table, options)  # metadata: the file's size is not the committed one
    _assert_only(report, 0, f"{path.relative_to(table)} of epoch 0 has", "bytes, the decision")
    deep = _audit(log, table, options, deep=True)
    row = _assert_only(deep, 0, "checksum differs in column(s) name")
    assert row.checksum == "differs" and row.found == PER


def test_a_table_restored_from_an_older_copy_fails_the_epochs_it_lost(
    local: tuple[str, Any], tmp_path: Path
) -> None:
    """The table copied after epoch 1, epoch 2 run, then the copy put back: no version of
    its log records epoch 2 any more."""
    import shutil

    table, options = local
    _run(table, options, tmp_path / "txlog", epochs=2)
    shutil.copytree(table, tmp_path / "backup")
    log = _run(table, options, tmp_path / "txlog", epochs=3)
    shutil.rmtree(table)
    shutil.copytree(tmp_path / "backup", table)
    report = _audit(log, table, options)
    row = _assert_only(report, 2, "no version of the Delta log records epoch 2")
    assert row.found == 0 and f"expected {PER} rows, found 0" in " ".join(row.differences)


# -- bounded ----------------------------------------------------------------------------------


def test_an_audit_of_the_last_epoch_reads_only_that_epoch(
    local: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epochs 0 and 1 tampered with (a file of each deleted from storage): the full audit
    fails on both, the audit of the last epoch passes, having read the log entries from the
    current version down to epoch 1's (where its walk stops) and only epoch 2's data files."""
    table, options = local
    log = _run(table, options, tmp_path / "txlog")
    fs, root = _fs(table, options)
    for epoch in (0, 1):
        fs.delete_file(f"{root}/{_epoch_files(table, options, epoch)[0]}")
    assert [r.epoch for r in _audit(log, table, options).mismatches] == [0, 1]
    entries: list[int] = []
    files: list[str] = []
    read_entry, read_table = delta_audit.read_entry, pq.read_table

    def count_entries(storage: Storage, version: int, app_id: str) -> Any:
        entries.append(version)
        return read_entry(storage, version, app_id)

    def count_files(source: Any, **kwargs: Any) -> Any:
        files.append(str(source))
        return read_table(source, **kwargs)

    monkeypatch.setattr(delta_audit, "read_entry", count_entries)
    monkeypatch.setattr(pq, "read_table", count_files)
    report = _audit(log, table, options, last=1, deep=True)
    assert report.ok, report.to_json()
    assert [(r.epoch, r.status, r.checksum) for r in report.rows] == [(2, "ok", "ok")]
    assert entries == [3, 2]  # version 3 commits epoch 2, version 2 epoch 1: the walk stops
    assert files and all(f".{UID}.e2." in f for f in files), files
