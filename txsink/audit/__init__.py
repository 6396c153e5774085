"""Evidence for ``txsink audit``: the row digest each decision records, and the types a
connector's audit hook speaks (:mod:`txsink.audit.found`). Part of the base API: it imports
only the base."""

from txsink.audit.digest import DIGEST_VERSION, Digest, digest_batch, digest_rows
from txsink.audit.found import AuditRequest, EpochFound, EpochToAudit, Extra, TargetAudit

__all__ = [
    "DIGEST_VERSION",
    "AuditRequest",
    "Digest",
    "EpochFound",
    "EpochToAudit",
    "Extra",
    "TargetAudit",
    "digest_batch",
    "digest_rows",
]
