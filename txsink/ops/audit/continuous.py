"""The coordinator's continuous audit (``Coordinator(audit_every=N)``): every N committed
epochs, a background thread audits the epochs committed since the last audit, in every
sink's target, off the commit's critical path.

Why a thread and not a step of the epoch: an audit reads the targets (a deep one reads the
rows), which may take longer than an epoch; the query must not wait for it, and an audit
that fails (a target briefly away) must not fail the query. One audit runs at a time: when
the next is due while one still runs, it waits for the next turn and then covers both
spans. What it finds goes to the metrics (``txsink_audit_epochs_total``,
``txsink_audit_mismatches_total``, ``txsink_last_audited_epoch``) and to the log: one ERROR
line per epoch x sink that does not match, and per extra.

It audits the epochs this driver committed (from the first one, on): epochs before a
restart are ``txsink audit --since``'s. Audited epochs must still be in the log, so
``audit_every`` must stay below ``retain_epochs``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from txsink.contract import SinkContract
from txsink.observe.logs import EpochLogger
from txsink.observe.metering import Meter
from txsink.ops.audit.run import OK, AuditReport, audit_log
from txsink.ops.audit.table import summary_line
from txsink.protocol.log import TxLog

__all__ = ["ContinuousAudit", "check_audit_every"]


def check_audit_every(every: int | None, retain_epochs: int) -> int | None:
    """``audit_every`` as given, or ``ValueError`` saying why not."""
    if every is None:
        return None
    if type(every) is not int or every < 1:
        raise ValueError(f"audit_every must be a whole number >= 1, got {every!r}")
    if every >= retain_epochs:
        raise ValueError(
            f"audit_every={every} must be below retain_epochs={retain_epochs}: the log "
            "prunes the decisions an audit compares with"
        )
    return every


class ContinuousAudit:
    """Audits in a background thread every ``every`` committed epochs (see the module)."""

    def __init__(
        self,
        log: TxLog,
        sinks: Sequence[SinkContract[Any, Any]],
        *,
        every: int,
        deep: bool,
        meter: Meter,
        logger: EpochLogger,
    ) -> None:
        self.log, self.sinks, self.every, self.deep = log, tuple(sinks), every, deep
        self._meter, self._log = meter, logger
        self._first: int | None = None  # the first epoch this driver committed
        self.last_audited: int | None = None
        self._due = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.reports: list[AuditReport] = []  # the last few, for tests and a debugger

    def committed(self, epoch: int) -> None:
        """Epoch ``epoch`` is committed (called on the driver, after the commit)."""
        if self._first is None:
            self._first = epoch
        self._due += 1
        with self._lock:
            if self._due < self.every or (self._thread is not None and self._thread.is_alive()):
                return
            self._due = 0
            since = self._first if self.last_audited is None else self.last_audited + 1
            self._thread = threading.Thread(
                target=self._run, args=(since, epoch), name="txsink-audit", daemon=True
            )
            self._thread.start()

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a running audit to end (the tests' and :meth:`close`'s)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self, since: int, until: int) -> None:
        try:
            report = audit_log(self.log, self.sinks, since=since, until=until, deep=self.deep)
        except Exception as err:  # a target away, a log being pruned: try again next turn
            self._log.warning("audit of epochs %d-%d could not run: %s", since, until, err)
            return
        self.reports = [*self.reports[-9:], report]
        self.last_audited = until
        self._publish(report)

    def _publish(self, report: AuditReport) -> None:
        for sink in self.sinks:
            rows = [r for r in report.rows if r.sink == sink.uid]
            extras = report.extras.get(sink.uid, [])
            bad = [r for r in rows if r.status != OK]
            self._meter.audited(sink, len(rows), len(bad) + len(extras))
            if rows:
                self._meter.gauge("last_audited_epoch", max(r.epoch for r in rows), sink)
            for row in bad:
                self._log.bind(epoch=row.epoch).error(
                    "audit: sink %s %s: %s (txsink audit --since %d shows it)",
                    row.sink, row.status, "; ".join(row.differences) or "-", row.epoch,
                )  # fmt: skip
            for x in extras:
                at = f"epoch {x.epoch}: " if x.epoch is not None else ""
                self._log.error("audit: sink %s: extra of ours: %s%s", sink.uid, at, x.what)
        level = self._log.info if report.ok else self._log.error
        level("%s", summary_line(report))
