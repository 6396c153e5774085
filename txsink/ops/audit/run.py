"""The audit: what the log promised for each committed epoch, against what each target holds.

For the epochs in range (``since`` / ``last``; only epochs whose decision the log still
holds: pruning ends what can be audited), each sink's hook reads its target
(:meth:`~txsink.contract.SinkContract.audit`) and the core compares, per epoch and sink:

* the rows: the decision's count (the digests' ``rows``) against the target's;
* with ``deep``: the digest of the rows read back against the decision's, and on a
  difference the columns whose sums differ;
* what the hook saw itself (a missing file, another size) and extras of ours that no
  decision names.

An epoch x sink is ``ok`` only if all of these agree; a sink whose connector has no audit,
or whose target could not be read, is ``not audited``, and the audit does not pass either.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from txsink.audit.digest import Digest
from txsink.audit.found import AuditRequest, EpochFound, EpochToAudit, Extra
from txsink.contract import SinkContract
from txsink.errors import ConfigurationError, TxsinkError
from txsink.handles import load_handle
from txsink.protocol.log import EpochState, TxLog, open_log
from txsink.store import LogStore

__all__ = ["AuditReport", "AuditRow", "audit_log", "committed_in_range"]

OK, MISMATCH, NOT_AUDITED = "ok", "mismatch", "not audited"


@dataclass(frozen=True)
class AuditRow:
    """One epoch x sink: what was promised, what was found, and the verdict."""

    epoch: int
    sink: str
    expected: int
    found: int | None
    checksum: str  # "ok", "differs", "not read" (metadata audit), "no evidence"
    status: str  # OK, MISMATCH, NOT_AUDITED
    differences: tuple[str, ...] = ()
    how: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch, "sink": self.sink, "expected_rows": self.expected,
            "found_rows": self.found, "checksum": self.checksum, "status": self.status,
            "differences": list(self.differences), "how": self.how,
        }  # fmt: skip


@dataclass
class AuditReport:
    """The audit of a range of epochs: one :class:`AuditRow` per epoch x sink, the extras
    (per sink), and what could not be checked."""

    log: str
    epochs: list[int]
    deep: bool
    rows: list[AuditRow] = field(default_factory=list)
    extras: dict[str, list[Extra]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)  # decided but not committed yet
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every row ok and no extras: what ``txsink audit``'s exit code 0 means."""
        return all(r.status == OK for r in self.rows) and not any(self.extras.values())

    @property
    def mismatches(self) -> list[AuditRow]:
        return [r for r in self.rows if r.status != OK]

    def to_json(self) -> dict[str, Any]:
        return {
            "log": self.log, "ok": self.ok, "deep": self.deep, "epochs": self.epochs,
            "rows": [r.to_json() for r in self.rows],
            "extras": {
                uid: [{"what": x.what, "epoch": x.epoch, "rows": x.rows} for x in xs]
                for uid, xs in self.extras.items() if xs
            },
            "notes": {uid: ns for uid, ns in self.notes.items() if ns},
            "not_yet_committed": self.skipped, "seconds": round(self.seconds, 3),
        }  # fmt: skip


def committed_in_range(
    log: TxLog, *, since: int | None = None, last: int | None = None, until: int | None = None
) -> tuple[list[EpochState], list[int]]:
    """The committed epochs from ``since`` (or the newest ``last`` of them) up to ``until``,
    oldest first, read from the log; and the decided epochs in range not committed yet."""
    epochs = [
        e for e in log.epochs() if (since is None or e >= since) and (until is None or e <= until)
    ]
    states: list[EpochState] = []
    found = 0
    for epoch in reversed(epochs):  # newest first: ``last`` reads only as far back as it needs
        if last is not None and found >= last:
            break
        state = log.state(epoch)
        states.append(state)
        found += state.status == "committed" and state.decision is not None
    states.reverse()
    committed = [s for s in states if s.status == "committed" and s.decision is not None]
    waiting = [s.epoch for s in states if s.status in ("decided", "blocked")]
    return committed, waiting


def audit_log(
    log: str | os.PathLike[str] | LogStore | TxLog,
    sinks: Sequence[SinkContract[Any, Any]],
    *,
    since: int | None = None,
    last: int | None = None,
    until: int | None = None,
    deep: bool = False,
) -> AuditReport:
    """Audit the committed epochs in range of ``log`` (a location, store or open log) in
    every sink's target (see the module's docstring); read-only. Raises
    :class:`~txsink.errors.ConfigurationError` if there is no log at ``log``."""
    started = time.monotonic()
    log = open_log(log)
    meta = log.meta()
    if meta is None:
        raise ConfigurationError(f"no txsink log at {log.location}: nothing to audit")
    app_id = str(meta.get("app_id"))
    states, waiting = committed_in_range(log, since=since, last=last, until=until)
    report = AuditReport(log.location, [s.epoch for s in states], deep, skipped=waiting)
    for sink in sinks:
        request = AuditRequest(app_id, tuple(_to_audit(sink.uid, s) for s in states), deep)
        if not request.epochs:
            continue
        try:
            found = sink.audit(request)
        except (NotImplementedError, TxsinkError) as err:
            if isinstance(err, TxsinkError):
                err.with_context(sink_uid=sink.uid, phase="audit")
            report.notes[sink.uid] = [f"not audited: {err}"]
            report.rows += [_unaudited(e, sink.uid, str(err)) for e in request.epochs]
            continue
        report.rows += [
            _compare(e, sink.uid, found.epochs.get(e.epoch), deep) for e in request.epochs
        ]
        report.extras[sink.uid] = list(found.extras)
        report.notes[sink.uid] = list(found.notes)
    report.seconds = time.monotonic() - started
    return report


def _to_audit(uid: str, state: EpochState) -> EpochToAudit:
    decision = state.decision
    docs = decision.handles.get(uid, []) if decision is not None else []
    raw = decision.stats.get("schema") if decision is not None else None
    schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw))) if raw else None
    return EpochToAudit(state.epoch, tuple(load_handle(d, sink_uid=uid) for d in docs), schema)


def _unaudited(epoch: EpochToAudit, uid: str, why: str) -> AuditRow:
    return AuditRow(epoch.epoch, uid, epoch.rows, None, "not read", NOT_AUDITED, (why,))


def _compare(epoch: EpochToAudit, uid: str, found: EpochFound | None, deep: bool) -> AuditRow:
    expected = epoch.expected
    if found is None:
        if not epoch.handles:  # no rows promised, none looked for
            return AuditRow(epoch.epoch, uid, 0, 0, "ok" if deep else "not read", OK)
        why = "the target's audit did not report this epoch"
        return AuditRow(epoch.epoch, uid, epoch.rows, None, "not read", NOT_AUDITED, (why,))
    differences = list(found.problems)
    if found.rows is not None and found.rows != epoch.rows:
        gap = found.rows - epoch.rows
        what = f"{-gap} missing" if gap < 0 else f"{gap} extra"
        differences.append(f"expected {epoch.rows} rows, found {found.rows} ({what})")
    checksum = _checksum(expected, found.digest, deep, differences)
    status = MISMATCH if differences else OK
    return AuditRow(
        epoch.epoch, uid, epoch.rows, found.rows, checksum, status, tuple(differences), found.how
    )


def _checksum(
    expected: Digest | None, found: Digest | None, deep: bool, differences: list[str]
) -> str:
    """Compare the digests over the columns the target kept; note what differs."""
    if not deep or found is None:
        return "not read"
    if expected is None:
        return "no evidence"
    kept = set(found.cols)
    if kept == set(expected.cols):
        same = found.sum == expected.sum
    else:  # the target keeps some of the columns: compare those
        same = all(found.cols[c] == expected.cols.get(c) for c in kept)
    if same:
        return "ok"
    columns = [c for c in found.differing_columns(expected) if c in kept]
    if columns:
        differences.append("checksum differs in column(s) " + ", ".join(columns))
    else:
        differences.append("row checksum differs (values moved between rows)")
    return "differs"
