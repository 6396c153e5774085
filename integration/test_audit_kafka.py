"""The Kafka sink's audit (issue #42) against a real KRaft broker: epochs run through
``Coordinator.write`` (Spark), then ``audit_log`` reads the topic back.

A clean run audits clean (metadata and deep, each mode); then the topic is tampered with
after the run, as operators and brokers do, and the audit names the epoch, the sink and
the difference:

* the topic deleted and created again (empty): every epoch's records missing;
* ``delete_records`` up to an offset inside epoch 1 (what retention does early): epoch 1
  short, the partition's new start named; epochs 2 and 3 still ok;
* another producer appending to the topic: not ours (no epoch header), the audit stays ok;
  the same producer appending records *with our header* of an epoch no decision names: an
  extra, the audit fails.

Each tamper test asserts the audit of the same topic passed before the tampering, so a hook
that ignored the difference (or found nothing at all) fails the test.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from txsink import Coordinator
from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.readback import create_topic, delete_topic
from txsink.connectors.kafka.records.format import EPOCH_HEADER, epoch_tag
from txsink.ops.audit.run import AuditReport, audit_log
from txsink.protocol.log import open_log

pytestmark = [pytest.mark.kafka]

EPOCHS, ROWS, PARTS = 3, 40, 2  # epochs 1..3 of 40 rows each, 2 topic partitions


def _sink(kafka: Any, topic: str, tmp: Path, mode: str = "wal") -> KafkaSink:
    options: dict[str, Any] = {"wal": tmp / "wal"} if mode == "wal" else {"shards": 2}
    return KafkaSink(
        kafka.bootstrap,
        topic,
        uid=topic,  # the marker topic is shared by the session's tests
        mode=mode,  # type: ignore[arg-type]
        key="key",
        value="value",
        epoch_header=True,
        transactional_id_prefix=topic,
        timeout_s=20,
        **options,
    )


def _run(spark: Any, kafka: Any, tmp: Path, mode: str = "wal") -> tuple[str, KafkaSink, str]:
    """Epochs 1..EPOCHS through the coordinator; the topic, the sink and the log."""
    topic = kafka.new_topic(PARTS, prefix=f"audit-{mode}")
    sink, log = _sink(kafka, topic, tmp, mode), str(tmp / "txlog")
    coordinator = Coordinator([sink], log=log, app_id="app")
    try:
        for epoch in range(1, EPOCHS + 1):
            lo = (epoch - 1) * ROWS
            df = spark.sql(
                f"SELECT CONCAT('k', id % 7) AS key, CONCAT('v', id) AS value "
                f"FROM range({lo}, {lo + ROWS}, 1, 2)"
            )
            coordinator.write(df, epoch=epoch)
    finally:
        coordinator.close()
    return topic, sink, log


def _audit(log: str, sink: KafkaSink, **options: Any) -> AuditReport:
    return audit_log(open_log(log), [sink], **options)


def _assert_clean(report: AuditReport, deep: bool) -> None:
    assert report.ok, report.to_json()
    assert [r.status for r in report.rows] == ["ok"] * len(report.rows)
    assert [r.checksum for r in report.rows] == ["ok" if deep else "not read"] * len(report.rows)


@pytest.mark.parametrize("mode", ["wal", "replay", "direct"])
def test_a_clean_run_audits_clean(spark: Any, kafka: Any, tmp_path: Path, mode: str) -> None:
    _, sink, log = _run(spark, kafka, tmp_path, mode)
    for deep in (False, True):
        report = _audit(log, sink, deep=deep)
        assert report.epochs == [1, 2, 3]
        assert [(r.epoch, r.expected, r.found) for r in report.rows] == [
            (e, ROWS, ROWS) for e in (1, 2, 3)
        ]
        _assert_clean(report, deep)


def test_a_recreated_topic_misses_every_epoch(spark: Any, kafka: Any, tmp_path: Path) -> None:
    topic, sink, log = _run(spark, kafka, tmp_path)
    _assert_clean(_audit(log, sink), deep=False)
    delete_topic(kafka.bootstrap, topic)
    _recreate(kafka, topic)
    report = _audit(log, sink, deep=True)
    assert not report.ok
    rows = {r.epoch: r for r in report.rows}
    for epoch in (1, 2, 3):
        row = rows[epoch]
        assert (row.sink, row.status, row.found) == (topic, "mismatch", 0)
        assert f"no committed record of epoch {epoch} in topic {topic!r}" in row.differences[0]
        assert f"expected {ROWS} rows, found 0 ({ROWS} missing)" in row.differences


def test_records_deleted_inside_epoch_1(spark: Any, kafka: Any, tmp_path: Path) -> None:
    """``delete_records`` up to 10 records into epoch 1 of partition 0: epoch 1 is short
    and the partition's new start is named; epochs 2 and 3 still audit ok."""
    topic, sink, log = _run(spark, kafka, tmp_path, "replay")
    _assert_clean(_audit(log, sink, deep=True), deep=True)
    cut = _delete_records(kafka, topic, partition=0, before=10)
    report = _audit(log, sink, deep=True)
    assert not report.ok
    rows = {r.epoch: r for r in report.rows}
    one = rows[1]
    assert (one.sink, one.status, one.expected, one.found) == (
        topic,
        "mismatch",
        ROWS,
        ROWS - 10,
    )
    assert f"expected {ROWS} rows, found {ROWS - 10} (10 missing)" in one.differences
    assert (
        f"topic {topic!r} partition 0 starts at offset {cut}: the records before it were "
        "deleted (retention, delete_records, or a recreated topic)"
    ) in one.differences
    assert any("replay checksum of epoch 1's records" in d for d in one.differences)
    assert [(rows[e].status, rows[e].checksum) for e in (2, 3)] == [("ok", "ok")] * 2


def test_last_1_reads_only_the_last_epoch(
    spark: Any, kafka: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Epoch 1 damaged (``delete_records`` inside it): the full audit fails on epoch 1, the
    ``last=1`` audit reads only epoch 3 and passes. The records the reader hands the audit
    are counted (the real reader, counted on the way): of epochs 1 and 2 (80 records) it
    reads one per probe of the binary search only, not the epochs."""
    from txsink.connectors.kafka import audit

    topic, sink, log = _run(spark, kafka, tmp_path)
    _delete_records(kafka, topic, partition=0, before=10)
    assert [r.epoch for r in _audit(log, sink).mismatches] == [1]
    read: list[int] = []
    scan = audit._Reader.scan

    def counted(self: Any, p: int, start: int, end: int) -> Any:
        for item in scan(self, p, start, end):
            read.append(item[1])
            yield item

    monkeypatch.setattr(audit._Reader, "scan", counted)
    report = _audit(log, sink, last=1, deep=True)
    assert report.epochs == [3]
    assert [(r.epoch, r.status, r.found) for r in report.rows] == [(3, "ok", ROWS)]
    _assert_clean(report, deep=True)
    older = sum(1 for e in read if e < 3)
    assert read.count(3) >= ROWS
    assert older <= 2 * 8, f"read {older} records of epochs 1 and 2 for an audit of epoch 3"


def test_a_foreign_producer_is_not_ours_but_our_header_is(
    spark: Any, kafka: Any, tmp_path: Path
) -> None:
    """Records another producer appends (no epoch header) are not ours: the audit stays ok.
    Records carrying this app's and sink's header of epoch 2 appended again (what a double
    commit would leave) are counted in epoch 2: the audit fails, naming 2 extra rows."""
    from confluent_kafka import Producer

    topic, sink, log = _run(spark, kafka, tmp_path, "direct")
    producer = Producer(kafka.config())
    for i in range(5):
        producer.produce(topic, key=b"x", value=f"foreign {i}".encode(), partition=i % PARTS)
    assert producer.flush(20) == 0
    _assert_clean(_audit(log, sink, deep=True), deep=True)
    tag = epoch_tag("app", sink.uid, 2)
    for i in range(2):
        producer.produce(
            topic, key=b"k1", value=b"v%d" % i, partition=1, headers=[(EPOCH_HEADER, tag)]
        )
    assert producer.flush(20) == 0
    report = _audit(log, sink)
    assert not report.ok
    assert [(r.epoch, r.sink, r.status) for r in report.mismatches] == [(2, topic, "mismatch")]
    assert report.mismatches[0].differences == (
        f"expected {ROWS} rows, found {ROWS + 2} (2 extra)",
    )


def _recreate(kafka: Any, topic: str) -> None:
    """Create ``topic`` again once its deletion completed, and wait for its leaders."""
    deadline = time.monotonic() + 30
    while True:  # the deletion completes in the background
        try:
            create_topic(kafka.bootstrap, topic, partitions=PARTS)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    admin = kafka.admin()
    while True:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        parts = meta.partitions.values() if meta is not None and meta.error is None else []
        if len(parts) == PARTS and all(p.leader >= 0 for p in parts):
            return
        assert time.monotonic() < deadline, f"topic {topic} has no leaders after 30s"
        time.sleep(0.1)


def _delete_records(kafka: Any, topic: str, *, partition: int, before: int) -> int:
    """``delete_records`` in ``partition`` up to ``before`` records of ours past its start;
    the new start offset."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from txsink.connectors.kafka.readback import read_records

    ours = [r for r in read_records(kafka.bootstrap, topic) if r.partition == partition]
    cut = ours[before].offset
    admin = AdminClient(kafka.config())
    futures = admin.delete_records([TopicPartition(topic, partition, cut)])
    for future in futures.values():
        future.result(timeout=30)
    return cut
