"""What a connector's audit hook is asked, and what it answers (``SinkContract.audit``).

The core reads the log (the promise: each committed epoch's handles, each with the digest
of the rows the sink was handed) and asks each sink what its target holds for those
epochs (:class:`AuditRequest`); the sink answers per epoch with what it found
(:class:`EpochFound`) and what of ours it found that no decision names (:class:`Extra`).
The core compares (:mod:`txsink.ops.audit`): a connector never judges its own count.

A hook reads by means that do not lean on txsink's bookkeeping alone (the target's own
record of the epoch: a table snapshot, the files, the rows, the committed records), reads
only the requested epochs' data (an audit of the last N epochs costs N epochs, not the
table), and changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from txsink.audit.digest import Digest
from txsink.handles import Handle

__all__ = ["AuditRequest", "EpochFound", "EpochToAudit", "Extra", "TargetAudit"]


@dataclass(frozen=True)
class EpochToAudit:
    """One committed epoch of one sink: its decided handles, each with its ``evidence``,
    and ``schema``: the Arrow schema of the rows the tasks were handed (recorded in the
    decision; ``None`` in an epoch decided before it was), for reading values back as they
    were written."""

    epoch: int
    handles: tuple[Handle, ...]
    schema: pa.Schema | None = field(default=None, compare=False)

    @property
    def expected(self) -> Digest | None:
        """The digest the decision promised (``None``: a handle decided before the audit
        existed carries none; its rows are still ``rows``)."""
        if any(h.evidence is None for h in self.handles):
            return None
        return Digest.total(Digest.from_json(h.evidence or {}) for h in self.handles)

    @property
    def rows(self) -> int:
        """The rows the decision promised: the digests' count, else the handles' own."""
        expected = self.expected
        return expected.rows if expected is not None else sum(h.rows for h in self.handles)

    @property
    def txn_names(self) -> frozenset[str]:
        return frozenset(str(h.txn) for h in self.handles)


@dataclass(frozen=True)
class AuditRequest:
    """What to audit in one sink's target.

    ``epochs``: the committed epochs in range, oldest first (an epoch where this sink had no
    rows is there with no handles: whatever of ours the target holds for it is an extra).
    ``deep``: read the rows and digest them (:func:`txsink.audit.digest.digest_rows`), not
    only the metadata.
    """

    app_id: str
    epochs: tuple[EpochToAudit, ...]
    deep: bool = False

    @property
    def first(self) -> int:
        return self.epochs[0].epoch if self.epochs else 0

    @property
    def last(self) -> int:
        return self.epochs[-1].epoch if self.epochs else -1


@dataclass
class EpochFound:
    """What the target holds for one epoch.

    ``rows``: counted in the target (``None``: it cannot be counted, say why in ``how``);
    ``digest``: of the rows read back, deep audits only (it may cover fewer columns than the
    evidence: the ones the target keeps); ``problems``: differences the hook saw itself (a
    file missing or of another size, a snapshot gone), each naming the object;
    ``how``: what was read, for the report ("the epoch's snapshot and its files' record
    counts").
    """

    rows: int | None = None
    digest: Digest | None = None
    problems: list[str] = field(default_factory=list)
    how: str = ""


@dataclass(frozen=True)
class Extra:
    """Something of ours in the target that no decision of the audited range names (a data
    file, a committed transaction, rows of an epoch): ``epoch`` if the target says which."""

    what: str
    epoch: int | None = None
    rows: int | None = None


@dataclass
class TargetAudit:
    """A hook's answer: per epoch of the request, what it found (an epoch left out was not
    looked at), the extras, and notes on what this target's audit cannot see."""

    epochs: dict[int, EpochFound] = field(default_factory=dict)
    extras: list[Extra] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def expected_total(epochs: Sequence[EpochToAudit]) -> Digest | None:
    """The promised digest of several epochs together (``None`` if one has none)."""
    digests = [e.expected for e in epochs if e.handles]
    if any(d is None for d in digests):
        return None
    return Digest.total(d for d in digests if d is not None)
