"""``txsink audit``'s engine: the log's promise against the targets (:mod:`.run`), its
table (:mod:`.table`), and the coordinator's background audit (:mod:`.continuous`)."""

from txsink.ops.audit.run import AuditReport, AuditRow, audit_log, committed_in_range

__all__ = ["AuditReport", "AuditRow", "audit_log", "committed_in_range"]
