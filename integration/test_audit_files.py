"""``txsink audit`` against the files sink (a local folder) and the S3 sink (MinIO): a clean
run of three epochs audits clean, metadata and deep; each tampering with the output after
the run (a data file deleted, copied under another name, rewritten with other rows of the
same count; a manifest deleted) makes the audit fail, naming the epoch, the sink and the
difference; an audit of the last epoch reads only that epoch.

The epochs run through :class:`~txsink.Coordinator` with the partition tasks in this
process (:func:`txsink.protocol.task.run_partition`, the tasks' own code: the same
evidence a Spark task records), so no Spark session is needed; the targets are real.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from txsink import Coordinator
from txsink.connectors.files import FilesSink
from txsink.connectors.s3 import S3Sink
from txsink.contract import SinkContract
from txsink.kit import manifests
from txsink.kit.formats import Format
from txsink.kit.manifest_audit import in_audited_folders
from txsink.ops.audit.run import AuditReport, AuditRow, audit_log
from txsink.protocol.log import TxLog, open_log
from txsink.protocol.task import Ack, TaskPlan, run_partition

APP = "app"
UID = "audited"
EPOCHS = 3
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _name(i: int) -> str:
    """A high-entropy value per row: its bytes appear verbatim in an uncompressed file."""
    return hashlib.sha256(str(i).encode()).hexdigest()[:16]


def _batch(epoch: int, partition: int, regions: bool = False) -> pa.RecordBatch:
    ids = [epoch * 1000 + partition * 100 + i for i in range(5)]
    columns = {
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([_name(i) for i in ids], pa.string()),
        "amount": pa.array([i / 4 for i in ids], pa.float64()),
        "at": pa.array([T0 + timedelta(seconds=i) for i in ids], pa.timestamp("us", "UTC")),
    }
    if regions:  # a Hive column: dropped from the objects, typed back from the folder
        columns["region"] = pa.array([i % 2 for i in ids], pa.int32())
    return pa.RecordBatch.from_pydict(columns)


def _precommit(epoch: int, regions: bool = False) -> Callable[[TaskPlan], list[Ack]]:
    def run(plan: TaskPlan) -> list[Ack]:
        batches = [[_batch(epoch, p, regions)] for p in range(2)]
        return [a for p in range(2) for a in run_partition(plan, p, p, batches[p])]

    return run


class Output:
    """One sink's output and the hands that tamper with it (names relative to it)."""

    def __init__(self, sink: SinkContract[Any, Any], kind: str) -> None:
        self.sink = sink
        self.kind = kind

    def names(self, epoch: int) -> list[str]:
        raise NotImplementedError

    def get(self, name: str) -> bytes:
        raise NotImplementedError

    def put(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError

    def where(self, name: str) -> str:
        raise NotImplementedError


class FilesOut(Output):
    def __init__(self, root: Path) -> None:
        super().__init__(FilesSink(root, UID, compression="none"), "files")
        self.root = root

    def names(self, epoch: int) -> list[str]:
        return sorted(f"epoch={epoch}/{n}" for n in os.listdir(self.root / f"epoch={epoch}"))

    def get(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def put(self, name: str, data: bytes) -> None:
        (self.root / name).unlink(missing_ok=True)  # a hard link shares its bytes: a new file
        (self.root / name).write_bytes(data)

    def delete(self, name: str) -> None:
        (self.root / name).unlink()

    def where(self, name: str) -> str:
        return str(self.root / name)


class S3Out(Output):
    def __init__(self, s3: Any, bucket: str, **kwargs: Any) -> None:
        options = {
            "endpoint_url": s3.endpoint,
            "aws_access_key_id": s3.access_key,
            "aws_secret_access_key": s3.secret_key,
            "region_name": s3.region,
        }
        sink = S3Sink(
            f"s3://{bucket}/out", UID, compression="none", client_options=options, **kwargs
        )
        super().__init__(sink, "s3")
        self.client, self.bucket = s3.client(), bucket

    def names(self, epoch: int) -> list[str]:
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"out/epoch={epoch}/")
        return sorted(o["Key"][4:] for o in found.get("Contents", []))

    def get(self, name: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.bucket, Key=f"out/{name}")["Body"].read())

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"out/{name}", Body=data)

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=f"out/{name}")

    def where(self, name: str) -> str:
        return f"s3://{self.bucket}/out/{name}"


@pytest.fixture(params=["files", pytest.param("s3", marks=pytest.mark.s3)])
def ran(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Output, TxLog]]:
    """Three epochs (two partitions of five rows each) committed by one Coordinator."""
    if request.param == "files":
        out: Output = FilesOut(tmp_path / "out")
    else:
        s3 = request.getfixturevalue("s3")
        out = S3Out(s3, s3.new_bucket())
    coordinator = Coordinator([out.sink], log=tmp_path / "log", app_id=APP, outage_s=0)
    for epoch in range(EPOCHS):
        coordinator.run_epoch(epoch, _precommit(epoch), app_id=APP)
    yield out, open_log(str(tmp_path / "log"))


def _audit(out: Output, log: TxLog, **kwargs: Any) -> AuditReport:
    return audit_log(log, [out.sink], **kwargs)


def _row(report: AuditReport, epoch: int) -> AuditRow:
    (row,) = [r for r in report.rows if r.epoch == epoch]
    return row


def _assert_only_mismatch(report: AuditReport, epoch: int) -> AuditRow:
    """The audit fails at ``epoch`` of our sink alone; the other epochs are ok."""
    assert not report.ok
    assert {r.epoch for r in report.rows if r.status != "ok"} == {epoch}, report.to_json()
    row = _row(report, epoch)
    assert (row.sink, row.status) == (UID, "mismatch")
    return row


def test_a_clean_run_audits_clean(ran: tuple[Output, TxLog]) -> None:
    out, log = ran
    meta = _audit(out, log)
    assert meta.ok, meta.to_json()
    assert [(r.epoch, r.sink, r.expected, r.found, r.status) for r in meta.rows] == [
        (e, UID, 10, 10, "ok") for e in range(EPOCHS)
    ]
    assert {r.checksum for r in meta.rows} == {"not read"}
    deep = _audit(out, log, deep=True)
    assert deep.ok, deep.to_json()
    assert {(r.status, r.checksum) for r in deep.rows} == {("ok", "ok")}
    assert deep.notes[UID], "the audit says what it cannot see"


def test_a_deleted_data_file_names_the_epoch_and_the_file(ran: tuple[Output, TxLog]) -> None:
    out, log = ran
    gone = out.names(1)[0]
    out.delete(gone)
    for deep in (False, True):
        row = _assert_only_mismatch(_audit(out, log, deep=deep), 1)
        assert row.found == 5
        assert f"data file {out.where(gone)} is missing (the manifest lists it with 5 rows)" in (
            row.differences
        )
        assert "expected 10 rows, found 5 (5 missing)" in row.differences


def test_a_copy_under_another_name_is_an_extra(ran: tuple[Output, TxLog]) -> None:
    """Every epoch still matches its manifest; the copy is ours (epoch 1's bytes in epoch
    1's folder) and a reader of the folder would read its rows twice."""
    out, log = ran
    copy = "epoch=1/part-00000-copy.parquet"
    out.put(copy, out.get(out.names(1)[0]))
    for deep in (False, True):
        report = _audit(out, log, deep=deep)
        assert not report.ok
        assert all(r.status == "ok" for r in report.rows)
        (extra,) = report.extras[UID]
        assert extra.epoch == 1
        assert extra.what.startswith(f"{out.where(copy)}: a data file that no manifest")
    # Outside the audited epochs the copy is not looked at: an audit of epoch 2 passes.
    assert _audit(out, log, since=2).ok


def test_a_rewrite_with_other_rows_of_the_same_count_fails_deep(
    ran: tuple[Output, TxLog],
) -> None:
    """The same bytes but one value (same length): same size, same row count. The files
    metadata audit cannot see it (it reads no content: documented); S3's sees the ETag
    change; the deep audit of both reads the rows and names the column."""
    out, log = ran
    name = out.names(1)[0]
    data = out.get(name)
    table = pq.read_table(io.BytesIO(data))
    old = str(table.column("name")[0])
    assert data.count(old.encode()) >= 1, "the value is stored verbatim (no compression)"
    tampered = data.replace(old.encode(), old[::-1].encode())
    assert len(tampered) == len(data) and tampered != data
    assert pq.read_table(io.BytesIO(tampered)).num_rows == table.num_rows
    out.put(name, tampered)
    meta = _audit(out, log)
    if out.kind == "files":
        assert meta.ok, "a same-size rewrite passes the files metadata audit"
    else:
        row = _assert_only_mismatch(meta, 1)
        assert any(d.startswith(f"object {out.where(name)} has ETag") for d in row.differences)
    row = _assert_only_mismatch(_audit(out, log, deep=True), 1)
    assert (row.found, row.checksum) == (10, "differs")
    assert "checksum differs in column(s) name" in row.differences
    if out.kind == "files":
        assert any(f"data file {out.where(name)}" in d and "sha256" in d for d in row.differences)


def test_the_same_rows_in_another_file_are_a_size_difference(
    ran: tuple[Output, TxLog],
) -> None:
    """A file rewritten by hand with its own rows (another codec, as a compaction would):
    the metadata audit names the size; the deep audit finds the rows equal (checksum ok)
    and still fails on the size (and the sha256, files; the ETag, S3)."""
    out, log = ran
    name = out.names(2)[0]
    before = out.get(name)
    buffer = io.BytesIO()
    pq.write_table(pq.read_table(io.BytesIO(before)), buffer, compression="gzip")
    out.put(name, buffer.getvalue())
    size = f"data file {out.where(name)} is {len(buffer.getvalue())} bytes, the manifest "
    row = _assert_only_mismatch(_audit(out, log), 2)
    assert row.found == 10
    assert f"{size}recorded {len(before)}" in row.differences
    row = _assert_only_mismatch(_audit(out, log, deep=True), 2)
    assert (row.found, row.checksum) == (10, "ok")
    assert f"{size}recorded {len(before)}" in row.differences


def test_a_deleted_manifest_names_the_epoch(ran: tuple[Output, TxLog]) -> None:
    out, log = ran
    out.delete(manifests.key(UID, 1))
    for deep in (False, True):
        row = _assert_only_mismatch(_audit(out, log, deep=deep), 1)
        assert row.found == 0
        assert row.differences[0].startswith(
            f"the manifest {out.where(manifests.key(UID, 1))} of epoch 1 is missing"
        )
        assert "expected 10 rows, found 0 (10 missing)" in row.differences


def test_the_last_epoch_audit_reads_only_the_last_epoch(ran: tuple[Output, TxLog]) -> None:
    """Epoch 0 tampered (a file and the manifest of epoch 1 gone, a file of epoch 0
    rewritten): an audit of the whole range fails, an audit of the last epoch (``last=1``)
    passes, metadata and deep: it reads epoch 2's manifest and files, nothing older."""
    out, log = ran
    out.delete(manifests.key(UID, 1))
    out.delete(out.names(1)[0])
    first = out.names(0)[0]
    out.put(first, b"not parquet at all")
    assert not _audit(out, log).ok
    for deep in (False, True):
        report = _audit(out, log, last=1, deep=deep)
        assert report.ok, report.to_json()
        assert [r.epoch for r in report.rows] == [EPOCHS - 1]


def test_a_deleted_epoch_folder_misses_every_row(tmp_path: Path) -> None:
    """The folder of an epoch removed by hand (a retention job): all its rows missing."""
    sink = FilesSink(tmp_path / "empty", UID)
    coordinator = Coordinator([sink], log=tmp_path / "log", app_id=APP, outage_s=0)
    coordinator.run_epoch(0, _precommit(0), app_id=APP)
    shutil.rmtree(tmp_path / "empty" / "epoch=0")
    report = audit_log(open_log(str(tmp_path / "log")), [sink])
    row = _assert_only_mismatch(report, 0)
    assert row.found == 0


@pytest.mark.s3
def test_s3_with_partition_by_lists_the_prefix_and_keeps_to_the_audited_epochs(
    s3: Any, tmp_path: Path
) -> None:
    """With ``partition_by`` the epoch folders sit under the Hive folders: the prefix is
    listed once, and only files of the audited epochs (or of none) are extras. The deep
    digest equals the evidence with the Hive column typed back (int32)."""
    out = S3Out(s3, s3.new_bucket(), partition_by=["region"])
    coordinator = Coordinator([out.sink], log=tmp_path / "log", app_id=APP, outage_s=0)
    for epoch in range(EPOCHS):
        coordinator.run_epoch(epoch, _precommit(epoch, regions=True), app_id=APP)
    log = open_log(str(tmp_path / "log"))
    deep = _audit(out, log, deep=True)
    assert deep.ok, deep.to_json()
    assert {(r.status, r.checksum, r.found) for r in deep.rows} == {("ok", "ok", 10)}
    original = "region=0/epoch=1/" + UID + "-p00000-0000.parquet"
    copy = "region=0/epoch=1/copy.parquet"
    out.put(copy, out.get(original))
    (extra,) = _audit(out, log).extras[UID]
    assert extra.epoch == 1 and extra.what.startswith(f"{out.where(copy)}: a data file")
    assert _audit(out, log, since=2).ok, "epoch 1's folder is not the audited epochs'"


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_text_formats_audit_with_their_types_cast_back(tmp_path: Path, fmt: Format) -> None:
    """JSON lines and CSV keep no types and no footer: metadata counts the manifest's rows
    (and still names a missing file), deep reads the text and casts it back to the epoch's
    written types (the timestamps are text in the file) so a clean epoch digests equal."""
    sink = FilesSink(tmp_path / "out", UID, format=fmt)
    coordinator = Coordinator([sink], log=tmp_path / "log", app_id=APP, outage_s=0)
    for epoch in range(2):
        coordinator.run_epoch(epoch, _precommit(epoch), app_id=APP)
    log = open_log(str(tmp_path / "log"))
    for deep in (False, True):
        report = audit_log(log, [sink], deep=deep)
        assert report.ok, report.to_json()
        assert {r.checksum for r in report.rows} == {"ok" if deep else "not read"}
    gone = sorted((tmp_path / "out" / "epoch=0").iterdir())[0]
    gone.unlink()
    row = _assert_only_mismatch(audit_log(log, [sink]), 0)
    assert f"data file {gone} is missing (the manifest lists it with 5 rows)" in row.differences


def test_the_extras_are_looked_for_in_the_audited_epochs_folders_and_the_top_level() -> None:
    """What the listing's files count as: a file in an audited epoch's folder (under Hive
    folders or not) or at the top level; not another epoch's, a hidden one, or a file in a
    folder that is no epoch's (a txsink log kept under the prefix, say)."""
    looked = [
        "epoch=1/a.parquet",
        "region=0/epoch=1/a.parquet",
        "stray.parquet",
        "epoch=0/a.parquet",
        "region=0/epoch=3/a.parquet",
        "epoch=1/_SUCCESS",
        "epoch=1/.a.parquet.crc",
        "_manifests/audited-00000000000000000001.json",
        "log/epochs/1.json",
        "region=0/a.parquet",
    ]
    assert [n for n in looked if in_audited_folders(n, [1, 2])] == looked[:3]


@pytest.mark.spark
def test_a_spark_written_output_audits_clean_deep(spark: Any, tmp_path: Path) -> None:
    """Through Spark (its tasks digest the rows as Spark hands them: decimals, dates,
    timestamps, nested values), the files read back digest equal; a value changed by hand
    in one file is named by column."""
    ddl = "id long, price decimal(10,2), day date, at timestamp, tags array<string>"
    rows = [
        (i, Decimal(i) / 4, date(2026, 1, 1 + i % 28), T0 + timedelta(hours=i), [f"t{i}"])
        for i in range(40)
    ]
    sink = FilesSink(tmp_path / "out", UID)
    coordinator = Coordinator([sink], log=tmp_path / "log", app_id=APP, outage_s=0)
    for epoch in range(2):
        coordinator(spark.createDataFrame(rows[epoch * 20 : epoch * 20 + 20], ddl), epoch)
    log = open_log(str(tmp_path / "log"))
    report = audit_log(log, [sink], deep=True)
    assert report.ok, report.to_json()
    assert {(r.found, r.checksum) for r in report.rows} == {(20, "ok")}
    path = sorted((tmp_path / "out" / "epoch=1").iterdir())[0]
    table = pq.read_table(path)
    prices = table.column("price").to_pylist()
    path.unlink()  # a hard link: write a new file, not through the published name
    pq.write_table(
        table.set_column(1, "price", pa.array([p + 1 for p in prices], table.column("price").type)),
        path,
    )
    row = _assert_only_mismatch(audit_log(log, [sink], deep=True), 1)
    assert "checksum differs in column(s) price" in row.differences


@pytest.mark.spark
def test_the_continuous_audit_of_a_streaming_query_counts_a_lost_file(
    spark: Any, tmp_path: Path
) -> None:
    """``Coordinator(audit_every=2, audit_deep=True)`` in a streaming query (foreachBatch):
    the background audit covers every epoch as they commit, clean; a data file lost while
    the query runs is counted as a mismatch of its epoch by the next audit, in the metrics
    and in an ERROR line, and the query goes on."""
    import time

    from txsink.metrics import RecordingMetrics

    source = tmp_path / "in"
    source.mkdir()
    metrics = RecordingMetrics()
    sink = FilesSink(tmp_path / "out", UID)
    coordinator = Coordinator(
        [sink], log=tmp_path / "log", app_id=APP, metrics=metrics, audit_every=2,
        audit_deep=True,
    )  # fmt: skip
    ddl = "id long, name string"

    def feed(epoch: int) -> None:
        rows = "".join(f'{{"id": {epoch * 10 + i}, "name": "n{i}"}}\n' for i in range(10))
        (source / f"e{epoch}.json").write_text(rows)

    query = (
        spark.readStream.schema(ddl).option("maxFilesPerTrigger", 1).json(str(source))
        .writeStream.foreachBatch(coordinator)
        .option("checkpointLocation", str(tmp_path / "ckpt")).start()
    )  # fmt: skip
    auditor = coordinator.auditor
    assert auditor is not None
    try:
        for epoch in range(4):
            feed(epoch)
            query.processAllAvailable()
            if epoch == 2:  # lose a file of epoch 2 before the audit of epochs 2-3 runs
                next((tmp_path / "out" / "epoch=2").glob("*.parquet")).unlink()
        deadline = time.monotonic() + 60
        while len(auditor.reports) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        query.stop()
        coordinator.close()
    first, second = auditor.reports[:2]
    assert first.epochs == [0, 1] and first.ok, first.to_json()
    assert second.epochs == [2, 3] and not second.ok
    assert [r.epoch for r in second.mismatches] == [2]
    assert metrics.audited == {(APP, UID, "files"): [4, 1]}
    assert metrics.gauges[(APP, "last_audited_epoch", UID, "files")] == 3
