"""``txsink audit`` of an Iceberg table (issue #42): a SQL catalog in the test PostgreSQL
server and the warehouse on the test S3 server (MinIO), through the engine
(:func:`txsink.ops.audit.audit_log`) and the sink's hook.

Three epochs run through the coordinator (two partition tasks each, so two data files per
epoch); then the table is tampered with the way people and tools do it, with pyiceberg's
own catalog and the storage's own client (never the sink's objects), and the audit must
name the epoch, the sink and the difference. A clean run audits clean, metadata and deep.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from conftest import variant_target
from tests.memsink import memory_precommit
from txsink import Coordinator
from txsink.connectors.iceberg import catalog as cat
from txsink.connectors.iceberg.testing import catalog_properties
from txsink.ops.audit import AuditReport, AuditRow, audit_log
from txsink.protocol.log import open_log
from txsink.testing.contract import rows

pytest.importorskip("pyiceberg")
pytestmark = [pytest.mark.postgres, pytest.mark.s3]

APP = "audit"
EPOCHS = 3
PER_EPOCH = 40  # rows per epoch, in two tasks of 20: two data files


def ids(epoch: int) -> range:
    return range(epoch * 1000, epoch * 1000 + PER_EPOCH)


@dataclass
class Run:
    """A table after :data:`EPOCHS` committed epochs, and what is needed to audit it."""

    target: Any
    log: str

    @property
    def uid(self) -> str:
        return str(self.target.uid)

    def table(self) -> Any:
        """The table, from a pyiceberg catalog of its own (not the sink's)."""
        spec, env = self.target.spec, self.target.env
        catalog = cat.load_catalog(spec["catalog_name"], catalog_properties(spec, env))
        try:
            return catalog.load_table(spec["table"])
        finally:
            catalog.close()

    def audit(self, *, deep: bool = False, last: int | None = None) -> AuditReport:
        """The audit, as an operator runs it: the log and a freshly built sink."""
        sink = self.target.sink()
        try:
            return audit_log(open_log(self.log), [sink], deep=deep, last=last)
        finally:
            sink.release()

    def snapshot(self, epoch: int) -> Any:
        (found,) = [
            s
            for s in self.table().snapshots()
            if s.summary is not None and s.summary.get("txsink.epoch") == str(epoch)
        ]
        return found

    def files(self, epoch: int) -> list[Any]:
        """The data files epoch ``epoch``'s snapshot added, by path."""
        table, snapshot = self.table(), self.snapshot(epoch)
        return sorted(
            (
                entry.data_file
                for manifest in snapshot.manifests(table.io)
                if manifest.added_snapshot_id == snapshot.snapshot_id
                for entry in manifest.fetch_manifest_entry(table.io)
            ),
            key=lambda f: f.file_path,
        )


@pytest.fixture
def run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Run]:
    target = variant_target(request, tmp_path, "iceberg", "sql-s3", tag="aud")
    log = str(tmp_path / "txlog")
    coord = Coordinator([target.sink()], log=log, app_id=APP)
    try:
        for epoch in range(EPOCHS):
            half = PER_EPOCH // 2
            tasks = [[rows(ids(epoch)[:half])], [rows(ids(epoch)[half:])]]
            coord.run_epoch(epoch, memory_precommit(tasks), app_id=APP)
    finally:
        coord.close()
    yield Run(target, log)


def row(report: AuditReport, epoch: int) -> AuditRow:
    (found,) = [r for r in report.rows if r.epoch == epoch]
    return found


def assert_only_epoch_differs(report: AuditReport, run: Run, epoch: int) -> AuditRow:
    """The report fails on ``epoch`` of the sink, and only there; that row."""
    assert not report.ok
    bad = row(report, epoch)
    assert (bad.epoch, bad.sink, bad.status) == (epoch, run.uid, "mismatch"), bad
    assert all(r.status == "ok" for r in report.rows if r.epoch != epoch), report.rows
    return bad


def test_a_clean_run_audits_clean_metadata_and_deep(run: Run) -> None:
    for deep in (False, True):
        report = run.audit(deep=deep)
        assert report.ok, report.to_json()
        assert report.epochs == list(range(EPOCHS))
        assert [(r.epoch, r.sink) for r in report.rows] == [(e, run.uid) for e in range(EPOCHS)]
        for r in report.rows:
            assert (r.status, r.expected, r.found) == ("ok", PER_EPOCH, PER_EPOCH), r
            assert r.checksum == ("ok" if deep else "not read"), r
            assert "snapshot" in r.how and "2 live" in r.how, r.how
        assert report.notes[run.uid], "the audit says what it cannot see"


def test_an_epoch_whose_tasks_had_no_rows_audits_clean(run: Run) -> None:
    """An epoch of empty tasks: no handle of the sink, no snapshot; nothing of ours found."""
    coord = Coordinator([run.target.sink()], log=run.log, app_id=APP)
    try:
        coord.run_epoch(EPOCHS, memory_precommit([[rows([])], [rows([])]]), app_id=APP)
    finally:
        coord.close()
    assert EPOCHS not in {
        int(str(s.summary.get("txsink.epoch"))) for s in run.table().snapshots() if s.summary
    }
    for deep in (False, True):
        report = run.audit(deep=deep, last=2)
        assert report.ok, report.to_json()
        assert [(r.epoch, r.status, r.found) for r in report.rows] == [
            (EPOCHS - 1, "ok", PER_EPOCH),
            (EPOCHS, "ok", 0),
        ]


def test_a_data_file_deleted_from_storage_is_named(run: Run) -> None:
    gone = run.files(1)[0]
    run.table().io.delete(gone.file_path)
    bad = assert_only_epoch_differs(run.audit(), run, 1)
    assert bad.found == PER_EPOCH - gone.record_count
    text = "\n".join(bad.differences)
    assert f"data file {gone.file_path} of epoch 1 is listed by the table but gone" in text
    assert f"({gone.record_count} missing)" in text


@pytest.mark.parametrize("name", ["renamed", "our-name"])
def test_a_copy_of_an_epoch_file_added_to_the_table_is_an_extra(run: Run, name: str) -> None:
    """``add_files`` of a copy of one of epoch 1's files: under another name (found by its
    metadata) or under our own name in another folder (found by its name)."""
    table = run.table()
    original = run.files(1)[0]
    folder, base = original.file_path.rsplit("/", 1)
    copy = f"{folder}/copy-{base}" if name == "renamed" else f"{folder}/dup/{base}"
    with table.io.new_input(original.file_path).open() as src:
        data = src.read()
    with table.io.new_output(copy).create(overwrite=True) as dst:
        dst.write(data)
    table.add_files([copy])
    report = run.audit()
    assert not report.ok
    assert all(r.status == "ok" for r in report.rows), report.rows  # the epochs are whole
    (extra,) = report.extras[run.uid]
    assert (extra.epoch, extra.rows) == (1, original.record_count)
    assert copy in extra.what and "operation append" in extra.what, extra.what


def test_rows_of_an_epoch_deleted_by_another_writer_are_named(run: Run) -> None:
    table = run.table()
    table.delete(f"id in ({ids(2)[0]}, {ids(2)[1]})")  # two rows of one of its files
    table = run.table()
    deleter = table.current_snapshot()
    for deep in (False, True):
        bad = assert_only_epoch_differs(run.audit(deep=deep), run, 2)
        text = "\n".join(bad.differences)
        # copy-on-write: the file holding them left the table, its other rows went to a
        # file of no epoch
        assert f"removed by snapshot {deleter.snapshot_id} (operation overwrite)" in text, text
        assert bad.found is not None and bad.found < PER_EPOCH
        assert "missing)" in text


@pytest.mark.parametrize("expire", [False, True], ids=["rollback", "rollback-and-expire"])
def test_a_rollback_to_before_an_epoch_is_named(run: Run, expire: bool) -> None:
    table = run.table()
    later = [run.snapshot(2).snapshot_id, run.snapshot(1).snapshot_id]
    table.manage_snapshots().rollback_to_snapshot(run.snapshot(0).snapshot_id).commit()
    if expire:
        run.table().maintenance.expire_snapshots().by_ids(later).commit()
    report = run.audit()
    assert not report.ok
    assert row(report, 0).status == "ok"
    for epoch in (1, 2):
        bad = row(report, epoch)
        assert (bad.sink, bad.status, bad.found) == (run.uid, "mismatch", 0), bad
        text = "\n".join(bad.differences)
        if expire:
            assert f"no snapshot of the table carries epoch {epoch}'s marker" in text, text
        else:
            sid = run.snapshot(epoch).snapshot_id
            assert f"epoch {epoch}'s snapshot {sid} is not in the current snapshot's" in text
        assert f"({PER_EPOCH} missing)" in text


def test_a_changed_value_passes_metadata_and_fails_deep(run: Run) -> None:
    """One of epoch 0's files rewritten in place with one value changed (same rows, same
    field ids): only the deep audit reads the values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = run.table()
    victim = run.files(0)[0]
    with table.io.new_input(victim.file_path).open() as src:
        data = pq.read_table(src)
    index = data.schema.get_field_index("amount")
    changed = pc.add(data.column("amount"), pa.scalar(1.0))
    data = data.set_column(index, data.schema.field(index), changed)
    with table.io.new_output(victim.file_path).create(overwrite=True) as dst:
        pq.write_table(data, dst)
    assert run.audit().ok  # the metadata still says the same
    bad = assert_only_epoch_differs(run.audit(deep=True), run, 0)
    assert bad.checksum == "differs" and bad.found == PER_EPOCH
    assert "checksum differs in column(s) amount" in bad.differences


def test_an_audit_of_the_last_epoch_reads_only_that_epoch(run: Run) -> None:
    """Epoch 1's data file and the manifests epochs 0 and 1 wrote deleted from storage: the
    full audit fails (it cannot read them), the audit of the last epoch (``last=1``: epoch
    2) passes, metadata and deep, as it reads only epoch 2's snapshot, the manifests
    written since, and epoch 2's files."""
    table = run.table()
    table.io.delete(run.files(1)[0].file_path)
    for epoch in (0, 1):
        snapshot = run.snapshot(epoch)
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id == snapshot.snapshot_id:
                table.io.delete(manifest.manifest_path)
    full = run.audit()
    assert not full.ok and {r.status for r in full.rows} == {"not audited"}, full.rows
    for deep in (False, True):
        report = run.audit(deep=deep, last=1)
        assert report.ok, report.to_json()
        assert report.epochs == [EPOCHS - 1]
        assert [(r.epoch, r.status) for r in report.rows] == [(EPOCHS - 1, "ok")]
