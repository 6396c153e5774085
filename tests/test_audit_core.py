"""The audit's core, with in-memory targets (no Spark, no servers): the evidence every
decision records, and the engine's comparison (:mod:`txsink.ops.audit`).

The targets of each connector are audited against real servers in
``integration/test_audit_*.py``; here the comparison itself is held to account: each kind
of difference a target can show (a missing row, a changed value, a value moved between
rows, an extra of ours, a connector without an audit) must fail the audit and name the
epoch, the sink and the difference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import pyarrow as pa
import pytest
from typing_extensions import override

from tests.memsink import Crasher, MemHandle, MemSink, MemStore, MemTarget
from txsink import Coordinator
from txsink.audit.digest import Digest, digest_batch, digest_rows
from txsink.audit.found import AuditRequest, EpochFound, Extra, TargetAudit
from txsink.cli import main as cli_main
from txsink.errors import ConfigurationError
from txsink.handles import dump_handle, load_handle
from txsink.metrics import RecordingMetrics
from txsink.ops.audit import audit_log
from txsink.protocol.log import TxLog
from txsink.protocol.task import Ack, TaskPlan, run_partition
from txsink.store import FileStore
from txsink.txid import TxnId

APP = "app-audit"


@dataclass
class RowsTarget(MemTarget):
    """A target that keeps each committed transaction's rows as Arrow batches."""

    batches: dict[str, list[pa.RecordBatch]] = field(default_factory=dict)
    committed_at: dict[str, int] = field(default_factory=dict)


class AuditedSink(MemSink):
    """:class:`MemSink` that keeps its rows, and audits them: the model of a hook."""

    connector: ClassVar[str] = "memory"

    def __init__(self, uid: str, target: RowsTarget) -> None:
        super().__init__(uid, target, Crasher())
        self.rows_target = target
        self.open: dict[str, list[pa.RecordBatch]] = {}

    @override
    def write(self, txn: object, batch: pa.RecordBatch) -> None:
        super().write(txn, batch)  # type: ignore[arg-type]
        self.open.setdefault(str(txn.txn), []).append(batch)  # type: ignore[attr-defined]

    @override
    def commit(self, handle: MemHandle) -> None:
        super().commit(handle)
        name = str(handle.txn)
        self.rows_target.batches[name] = self.open.pop(name, self.rows_target.batches.get(name, []))
        self.rows_target.committed_at[name] = handle.txn.epoch

    @override
    def audit(self, request: AuditRequest) -> TargetAudit:
        out = TargetAudit()
        wanted = {e.epoch for e in request.epochs}
        named = {n for e in request.epochs for n in e.txn_names}
        for e in request.epochs:
            batches = [b for n in e.txn_names for b in self.rows_target.batches.get(n, [])]
            problems = [
                f"transaction {n} is gone" for n in e.txn_names if n not in self.rows_target.batches
            ]
            digest = digest_rows(batches) if request.deep else None
            rows = sum(b.num_rows for b in batches)
            out.epochs[e.epoch] = EpochFound(rows, digest, problems, "the target's batches")
        for name, epoch in self.rows_target.committed_at.items():
            if epoch in wanted and name not in named and name in self.rows_target.batches:
                rows = sum(b.num_rows for b in self.rows_target.batches[name])
                out.extras.append(Extra(f"transaction {name}", epoch, rows))
        return out


class UnauditedSink(MemSink):
    connector: ClassVar[str] = "memory"


def _batch(epoch: int, p: int) -> pa.RecordBatch:
    ids = [epoch * 1000 + p * 100 + i for i in range(4)]
    return pa.RecordBatch.from_pydict(
        {"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids], "x": [i / 2 for i in ids]}
    )


def _precommit(epoch: int) -> object:
    def run(plan: TaskPlan) -> list[Ack]:
        return [a for p in range(2) for a in run_partition(plan, p, p, [_batch(epoch, p)])]

    return run


def _run(*sinks: MemSink, epochs: int = 3) -> TxLog:
    log = TxLog(MemStore())
    coord = Coordinator(list(sinks), log=log, app_id=APP, faults=None)
    for epoch in range(epochs):
        coord.run_epoch(epoch, _precommit(epoch), app_id=APP)  # type: ignore[arg-type]
    return log


def test_every_decided_handle_carries_the_digest_of_the_rows_its_sink_was_handed() -> None:
    target = RowsTarget()
    log = _run(AuditedSink("a", target))
    for epoch in range(3):
        decision = log.decision(epoch)
        assert decision is not None
        docs = decision.handles["a"]
        assert len(docs) == 2
        for doc in docs:
            handle = load_handle(doc)
            assert handle.evidence is not None, doc
            p = handle.txn.partition
            assert Digest.from_json(handle.evidence) == digest_batch(_batch(epoch, p))
            assert dump_handle(handle) == doc  # the envelope survives a reload
            assert "evidence" not in doc["data"]  # the connector's data is unchanged


def test_a_clean_run_audits_clean_at_both_levels() -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = _run(sink)
    for deep in (False, True):
        report = audit_log(log, [sink], deep=deep)
        assert report.ok, report.to_json()
        assert [(r.epoch, r.sink, r.expected, r.found) for r in report.rows] == [
            (e, "a", 8, 8) for e in range(3)
        ]
        assert {r.checksum for r in report.rows} == ({"ok"} if deep else {"not read"})


def _txn_of(target: RowsTarget, epoch: int, partition: int) -> str:
    return next(
        n
        for n in target.batches
        if TxnId.parse(n).epoch == epoch and TxnId.parse(n).partition == partition
    )


def test_a_missing_row_fails_naming_the_epoch_the_sink_and_the_count() -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = _run(sink)
    name = _txn_of(target, 1, 0)
    target.batches[name] = [target.batches[name][0].slice(1)]
    report = audit_log(log, [sink])
    assert not report.ok
    (bad,) = report.mismatches
    assert (bad.epoch, bad.sink, bad.expected, bad.found) == (1, "a", 8, 7)
    assert bad.differences == ("expected 8 rows, found 7 (1 missing)",)


def test_a_changed_value_fails_the_deep_audit_naming_the_column() -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = _run(sink)
    name = _txn_of(target, 2, 1)
    batch = target.batches[name][0]
    names = batch.column("name").to_pylist()
    names[0] = "tampered"
    target.batches[name] = [batch.set_column(1, "name", pa.array(names))]
    assert audit_log(log, [sink]).ok  # the metadata audit counts rows only
    report = audit_log(log, [sink], deep=True)
    (bad,) = report.mismatches
    assert (bad.epoch, bad.checksum) == (2, "differs")
    assert bad.differences == ("checksum differs in column(s) name",)


def test_values_moved_between_rows_fail_the_row_checksum() -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = _run(sink)
    name = _txn_of(target, 0, 0)
    batch = target.batches[name][0]
    swapped = list(reversed(batch.column("name").to_pylist()))
    target.batches[name] = [batch.set_column(1, "name", pa.array(swapped))]
    (bad,) = audit_log(log, [sink], deep=True).mismatches
    assert bad.epoch == 0
    assert bad.differences == ("row checksum differs (values moved between rows)",)


def test_an_extra_transaction_of_ours_fails_the_audit() -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = _run(sink)
    stray = str(TxnId(APP, "a", 1, 7, 0, 99))
    target.batches[stray] = [_batch(1, 0)]
    target.committed_at[stray] = 1
    report = audit_log(log, [sink])
    assert all(r.status == "ok" for r in report.rows)  # every epoch's own rows are there
    assert not report.ok
    assert [(x.epoch, x.rows) for x in report.extras["a"]] == [(1, 4)]


def test_a_bounded_audit_reads_only_the_last_epochs() -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = _run(sink)
    del target.batches[_txn_of(target, 0, 0)]  # epoch 0 damaged
    assert not audit_log(log, [sink]).ok
    report = audit_log(log, [sink], last=2)
    assert report.epochs == [1, 2] and report.ok
    assert audit_log(log, [sink], since=1).ok
    assert not audit_log(log, [sink], since=0, until=0).ok


def test_a_sink_without_an_audit_is_not_audited_and_the_audit_does_not_pass() -> None:
    log = _run(UnauditedSink("plain", MemTarget(), Crasher()))
    report = audit_log(log, [UnauditedSink("plain", MemTarget(), Crasher())])
    assert not report.ok
    assert {r.status for r in report.rows} == {"not audited"}
    assert "UnauditedSink has no audit" in report.notes["plain"][0]


def test_the_report_is_json() -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    doc = audit_log(_run(sink, epochs=1), [sink], deep=True).to_json()
    assert doc["ok"] is True and doc["epochs"] == [0]
    assert doc["rows"][0] == {
        "epoch": 0, "sink": "a", "expected_rows": 8, "found_rows": 8, "checksum": "ok",
        "status": "ok", "differences": [], "how": "the target's batches",
    }  # fmt: skip


def test_a_log_without_an_app_cannot_be_audited() -> None:
    with pytest.raises(ConfigurationError, match="nothing to audit"):
        audit_log(TxLog(MemStore()), [AuditedSink("a", RowsTarget())])


#: The sinks ``txsink audit --pipeline tests.test_audit_core:pipeline`` audits.
PIPELINE: list[MemSink] = []


def pipeline() -> list[MemSink]:
    return PIPELINE


def test_the_command_prints_the_table_and_exits_0_only_if_all_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = TxLog(FileStore(tmp_path / "log"))
    coord = Coordinator([sink], log=log, app_id=APP, faults=None)
    for epoch in range(3):
        coord.run_epoch(epoch, _precommit(epoch), app_id=APP)  # type: ignore[arg-type]
    PIPELINE[:] = [sink]
    args = ["audit", "--log", str(tmp_path / "log"), "--pipeline", f"{__name__}:pipeline"]
    assert cli_main([*args, "--deep"]) == 0
    out = capsys.readouterr().out
    assert "epoch  sink  expected  found  checksum  status" in out
    assert "audit (deep (rows read)) of epochs 0-2 x 1 sink(s)" in out
    assert out.rstrip().endswith("every epoch matches")

    name = _txn_of(target, 1, 1)
    target.batches[name] = [target.batches[name][0].slice(2)]
    assert cli_main([*args, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False
    (bad,) = [r for r in doc["rows"] if r["status"] != "ok"]
    assert (bad["epoch"], bad["sink"], bad["differences"]) == (
        1, "a", ["expected 8 rows, found 6 (2 missing)"],
    )  # fmt: skip
    assert cli_main([*args, "--last", "1"]) == 0
    assert "of epoch 2 x 1 sink(s)" in capsys.readouterr().out
    assert cli_main([*args, "--mismatches-only"]) == 1
    out = capsys.readouterr().out
    assert "    expected 8 rows, found 6 (2 missing)" in out and "\n0  " not in out


def test_the_continuous_audit_runs_every_n_epochs_off_the_commit_and_counts_mismatches(
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    metrics = RecordingMetrics()
    log = TxLog(MemStore())
    coord = Coordinator([sink], log=log, app_id=APP, faults=None, metrics=metrics, audit_every=2)
    auditor = coord.auditor
    assert auditor is not None
    for epoch in range(4):
        coord.run_epoch(epoch, _precommit(epoch), app_id=APP)  # type: ignore[arg-type]
        auditor.wait(10)
    assert [r.epochs for r in auditor.reports] == [[0, 1], [2, 3]]
    assert metrics.audited == {(APP, "a", "memory"): [4, 0]}
    assert metrics.gauges[(APP, "last_audited_epoch", "a", "memory")] == 3

    del target.batches[_txn_of(target, 3, 0)]  # damage an audited epoch: not looked at again
    coord.run_epoch(4, _precommit(4), app_id=APP)  # type: ignore[arg-type]
    # damage epoch 4 as soon as it is committed: the next audit (after epoch 5) covers it
    target.batches[_txn_of(target, 4, 1)] = []
    with caplog.at_level("ERROR", logger="txsink"):
        coord.run_epoch(5, _precommit(5), app_id=APP)  # type: ignore[arg-type]
        auditor.wait(10)
    assert auditor.reports[-1].epochs == [4, 5]
    assert metrics.audited == {(APP, "a", "memory"): [6, 1]}
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(
        "audit: sink a mismatch: expected 8 rows, found 4 (4 missing)" in x for x in lines
    ), lines
    coord.close()


def test_audit_every_must_stay_below_retain_epochs() -> None:
    sink = AuditedSink("a", RowsTarget())
    with pytest.raises(ValueError, match="below retain_epochs=5"):
        Coordinator([sink], log=TxLog(MemStore()), app_id=APP, retain_epochs=5, audit_every=5)
    with pytest.raises(ValueError, match=">= 1"):
        Coordinator([sink], log=TxLog(MemStore()), app_id=APP, audit_every=0)


def test_prometheus_names_the_audit_metrics_as_the_dashboard_reads_them() -> None:
    from prometheus_client import generate_latest

    from txsink.observe.prometheus import PrometheusMetrics

    m = PrometheusMetrics(port=0)
    m.audit(APP, "a", "memory", 4, 1)
    m.gauge(APP, "last_audited_epoch", 3, "a", "memory")
    text = generate_latest(m.registry).decode()
    labels = f'app_id="{APP}",connector="memory",sink_uid="a"'
    assert f"txsink_audit_epochs_total{{{labels}}} 4.0" in text
    assert f"txsink_audit_mismatches_total{{{labels}}} 1.0" in text
    assert f"txsink_last_audited_epoch{{{labels}}} 3.0" in text
    m.close()


def test_inspect_adds_the_audit_section(tmp_path: Path) -> None:
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = TxLog(FileStore(tmp_path / "log"))
    coord = Coordinator([sink], log=log, app_id=APP, faults=None)
    for epoch in range(2):
        coord.run_epoch(epoch, _precommit(epoch), app_id=APP)  # type: ignore[arg-type]
    PIPELINE[:] = [sink]
    out = tmp_path / "report.html"
    base = ["inspect", "--log", str(tmp_path / "log"), "--out", str(out)]
    assert cli_main(base) == 0
    assert "Not audited (pass --pipeline and --audit)" in out.read_text()
    del target.batches[_txn_of(target, 1, 0)]
    assert cli_main([*base, "--pipeline", f"{__name__}:pipeline", "--audit", "deep"]) == 0
    html = out.read_text()
    assert '<section id="audit">' in html
    assert "audit (deep (rows read)) of epochs 0-1 x 1 sink(s)" in html
    assert "expected 8 rows, found 4 (4 missing)" in html


def test_without_the_digest_the_audit_compares_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """``TXSINK_ROW_DIGEST=off``: no evidence in the decision; the deep audit says so and
    still counts (the handles' own rows), and a missing row still fails it."""
    monkeypatch.setenv("TXSINK_ROW_DIGEST", "off")
    target = RowsTarget()
    sink = AuditedSink("a", target)
    log = _run(sink)
    decision = log.decision(0)
    assert decision is not None and all("evidence" not in d for d in decision.handles["a"])
    report = audit_log(log, [sink], deep=True)
    assert report.ok and {r.checksum for r in report.rows} == {"no evidence"}
    name = _txn_of(target, 2, 0)
    target.batches[name] = [target.batches[name][0].slice(1)]
    (bad,) = audit_log(log, [sink], deep=True).mismatches
    assert (bad.epoch, bad.differences) == (2, ("expected 8 rows, found 7 (1 missing)",))


def test_a_sink_says_whether_it_can_be_audited_and_the_toolkit_leaves_out_those_that_cannot(
    tmp_path: Path,
) -> None:
    from txsink.testing import assert_audited

    target = RowsTarget()
    audited, plain = AuditedSink("a", target), UnauditedSink("p", MemTarget(), Crasher())
    assert audited.auditable and not plain.auditable
    log = TxLog(FileStore(tmp_path / "log"))
    coord = Coordinator([audited, plain], log=log, app_id=APP, faults=None)
    coord.run_epoch(0, _precommit(0), app_id=APP)  # type: ignore[arg-type]
    report = assert_audited(str(tmp_path / "log"), [audited, plain])
    assert {r.sink for r in report.rows} == {"a"}
    assert assert_audited(str(tmp_path / "log"), [plain]) is None
    del target.batches[_txn_of(target, 0, 0)]
    with pytest.raises(AssertionError, match="expected 8 rows, found 4"):
        assert_audited(str(tmp_path / "log"), [audited, plain])


def test_the_decision_records_the_rows_schema_for_the_audit() -> None:
    """The caller's ``rows_schema`` (SparkEpochs sets it from the DataFrame) is in the
    decision's stats, and the audit hands it to each hook with the epoch."""
    seen: list[pa.Schema | None] = []

    class Seeing(AuditedSink):
        def audit(self, request: AuditRequest) -> TargetAudit:
            seen.extend(e.schema for e in request.epochs)
            return super().audit(request)

    sink = Seeing("a", RowsTarget())
    log = TxLog(MemStore())
    coord = Coordinator([sink], log=log, app_id=APP, faults=None)
    coord.rows_schema = _batch(0, 0).schema
    coord.run_epoch(0, _precommit(0), app_id=APP)  # type: ignore[arg-type]
    assert audit_log(log, [sink]).ok
    assert seen == [_batch(0, 0).schema]
