"""Verifiers: what a sink really holds after a chaos run, compared with what it should.

A verifier answers three questions, each by reading the target the way a downstream
reader would (never from txsink's own log):

- :meth:`SinkVerifier.expected_ids`: the ids the input holds (each must arrive once);
- :meth:`SinkVerifier.read_ids`: the ids a reader sees, duplicates included;
- :meth:`SinkVerifier.lingering`: prepared-but-undecided leftovers still in the target
  (staged files, prepared transactions, open multipart uploads, open Kafka transactions).

Implement the protocol for your own sink; :func:`verify` turns it into a
:class:`Verdict`. Each connector ships its own in its testing module
(``txsink.connectors.<name>.testing``: ``FilesVerifier``, ``PostgresVerifier``,
``KafkaVerifier``, ``S3Verifier``), and its adapter builds it from a target's spec.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = ["IdsVerifier", "SinkVerifier", "Verdict", "assert_audited", "count_ids", "verify"]


@dataclass(frozen=True)
class Verdict:
    """The exactly-once verdict for one sink."""

    rows_expected: int
    rows_written: int
    duplicates: int
    missing: int
    unexpected: int
    lingering: int
    epochs: int

    @property
    def ok(self) -> bool:
        return (
            self.duplicates == 0
            and self.missing == 0
            and self.unexpected == 0
            and self.lingering == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def count_ids(
    expected: Iterable[int], written: Iterable[int], *, lingering: int = 0, epochs: int = 0
) -> Verdict:
    """Compare written ids with the expected set (each expected exactly once)."""
    want = set(expected)
    seen = Counter(written)
    return Verdict(
        rows_expected=len(want),
        rows_written=sum(seen.values()),
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
        missing=len(want - seen.keys()),
        unexpected=len(seen.keys() - want),
        lingering=lingering,
        epochs=epochs,
    )


@runtime_checkable
class SinkVerifier(Protocol):
    """Reads one sink back. Called once, in the test process, after the run ended."""

    def expected_ids(self) -> Iterable[int]:
        """Every id the input holds; each must be read back exactly once."""
        ...

    def read_ids(self) -> Iterable[int]:
        """Every id a reader of the target sees now, duplicates included."""
        ...

    def lingering(self) -> int:
        """How many prepared-but-undecided leftovers the target still holds (0 when clean)."""
        ...


def verify(verifier: SinkVerifier) -> Verdict:
    """The verdict for one sink: duplicates, missing, unexpected ids, lingering leftovers.

    ``epochs`` comes from the verifier's optional ``epochs()`` method (0 without it).
    """
    epochs_of = getattr(verifier, "epochs", None)
    epochs = int(epochs_of()) if callable(epochs_of) else 0
    return count_ids(
        verifier.expected_ids(),
        verifier.read_ids(),
        lingering=int(verifier.lingering()),
        epochs=epochs,
    )


@dataclass
class IdsVerifier:
    """A verifier from plain values or callables: for tests and quick custom sinks.

    ``read`` and ``lingering_count`` may be values or zero-argument callables.
    """

    expected: Iterable[int]
    read: Iterable[int] | Any
    lingering_count: int | Any = 0

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> Iterable[int]:
        return list(self.read() if callable(self.read) else self.read)

    def lingering(self) -> int:
        value = self.lingering_count() if callable(self.lingering_count) else self.lingering_count
        return int(value)


def assert_audited(log: Any, sinks: Iterable[Any], *, deep: bool = True) -> Any:
    """``txsink audit`` (``deep``: rows read and checksummed) of every committed epoch of
    ``log`` in the targets of ``sinks`` (built as the pipeline builds them; those that
    cannot be audited as configured, ``SinkContract.auditable``, are left out); raise
    ``AssertionError`` with the rows that do not match, else return the
    :class:`~txsink.ops.audit.AuditReport`. The verifiers read the targets with clients that
    are not ours; the audit checks the decisions' own promise, epoch by epoch."""
    from txsink.ops.audit import audit_log
    from txsink.ops.audit.table import render_text
    from txsink.protocol.log import open_log

    audited = [s for s in sinks if s.auditable]
    if not audited:  # no sink of the run can be audited as configured (``auditable``)
        return None
    report = audit_log(open_log(log), audited, deep=deep)
    if not report.ok:
        raise AssertionError("txsink audit failed:\n" + render_text(report, all_rows=False))
    if not report.rows:
        raise AssertionError(f"txsink audit found no committed epoch in {log}: the check is void")
    return report
