"""The history a concurrent reader saw, checked as it happens.

A verifier reads each target once, after the run: it proves the end state. Jepsen-style
checking asks more: was every state a reader saw *during* the run one the guarantee
allows? The :class:`~txsink.testing.observer.Observer` samples every target while the
pipeline runs (and crashes, and recovers); it hands each sample of a guaranteed view to a
:class:`HistoryChecker`, which keeps what it needs to judge the whole history without
keeping every sample (the ids seen so far, when each was first seen, each Kafka
partition's position) and reports the first violation of each kind, with its evidence:

``duplicate``
    an id visible twice at the same moment (two rows, two records, a Kafka record of an
    aborted attempt next to the committed one).
``vanished``
    an id visible in one sample and absent from a later one, and back by the end: a row
    taken back and shown again (a commit undone, a recovery re-committing over it).
``aborted read``
    an id visible in one sample and absent from then to the end: the reader saw data of
    a transaction that never committed.
``unexpected``
    an id that is in no epoch of the input.
``overfull``
    an epoch showing more rows than it has (a view that counts rows without ids: an S3
    epoch's manifests counted twice).
``order``
    a log view's (Kafka's) partition showing a record of epoch ``e`` after one of a later
    epoch: epochs commit in order, so a key routed to one partition reads in epoch order
    (the order docs/connectors/kafka.md promises; within an epoch, Spark gives none).

Why samples and not a changefeed: a reader of the guarantee's kind (``read_committed``,
a SQL query, manifests) is what users run; a sample is what one of them sees at a time.
A violation between two samples can be missed; one that lasts a sampling interval
(50 ms by default) is seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["HistoryChecker", "HistoryViolation"]

#: The kinds of violation, in the order the report lists them.
KINDS = ("duplicate", "aborted read", "vanished", "unexpected", "overfull", "order")


@dataclass(frozen=True)
class HistoryViolation:
    """The first violation of one kind in one target's history, with its evidence."""

    kind: str
    target: str
    at: float
    evidence: str
    #: How many times this kind was seen in this target in all (the evidence is the first).
    count: int = 1

    def __str__(self) -> str:
        more = f" (and {self.count - 1} more)" if self.count > 1 else ""
        return f"{self.target}: {self.kind}: {self.evidence}{more}"


@dataclass
class _Seen:
    """One target's history so far."""

    samples: int = 0
    start: float | None = None
    #: id -> (sample number, time) it was first seen
    first: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: ids of the last sample that had ids, its number and time
    last: frozenset[int] = frozenset()
    last_n: int = 0
    last_at: float = 0.0
    #: id -> (sample number, time) it was last seen before it went missing
    gone: dict[int, tuple[int, float, int, float]] = field(default_factory=dict)
    #: Kafka partition -> (records checked, the highest epoch so far, at which offset)
    logs: dict[int, tuple[int, int, int]] = field(default_factory=dict)


class HistoryChecker:
    """Judges one or more targets' histories, fed sample by sample (thread-safe use: one
    caller at a time, e.g. under the observer's lock).

    Args:
        epoch_of: every input id -> its epoch.
        expected: epoch -> how many ids it has.
    """

    def __init__(self, epoch_of: Mapping[int, int], expected: Mapping[int, int]) -> None:
        self.epoch_of = epoch_of
        self.expected = expected
        self._seen: dict[str, _Seen] = {}
        self._first: dict[tuple[str, str], HistoryViolation] = {}

    def _flag(self, kind: str, target: str, at: float, evidence: str) -> None:
        key = (target, kind)
        found = self._first.get(key)
        if found is None:
            self._first[key] = HistoryViolation(kind, target, at, evidence)
        else:
            self._first[key] = HistoryViolation(
                kind, target, found.at, found.evidence, found.count + 1
            )

    def observe(
        self,
        target: str,
        at: float,
        *,
        rows: Mapping[int, int],
        ids: Iterable[int] | None = None,
        duplicates: Sequence[int] = (),
        logs: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        """One sample of ``target`` taken at ``at``: rows per epoch; the visible ids when the
        view has them (with ``duplicates``: ids visible more than once); ``logs`` for a log
        view: partition -> every id read from it so far, in log order."""
        seen = self._seen.setdefault(target, _Seen())
        seen.samples += 1
        n = seen.samples
        if seen.start is None:
            seen.start = at
        for epoch, count in rows.items():
            full = self.expected.get(epoch)
            if full is not None and count > full:
                self._flag(
                    "overfull", target, at, f"epoch {epoch} showed {count} of its {full} rows"
                )
        for dup in duplicates[:1]:
            self._flag(
                "duplicate",
                target,
                at,
                f"id {dup} (epoch {self.epoch_of.get(dup)}) visible twice at sample {n}",
            )
        if ids is not None:
            self._ids(target, seen, n, at, frozenset(ids))
        if logs is not None:
            self._order(target, seen, at, logs)

    def _ids(self, target: str, seen: _Seen, n: int, at: float, now: frozenset[int]) -> None:
        for id_ in now - seen.last:
            if id_ not in self.epoch_of and id_ not in seen.first:
                self._flag("unexpected", target, at, f"id {id_} is in no epoch of the input")
            seen.first.setdefault(id_, (n, at))
            went = seen.gone.pop(id_, None)
            if went is not None:
                last_n, last_at, miss_n, miss_at = went
                self._flag(
                    "vanished",
                    target,
                    miss_at,
                    f"id {id_} (epoch {self.epoch_of.get(id_)}) visible at sample {last_n} "
                    f"(+{last_at - (seen.start or 0):.2f}s), gone at sample {miss_n} "
                    f"(+{miss_at - (seen.start or 0):.2f}s), back at sample {n}",
                )
        for id_ in seen.last - now:
            seen.gone.setdefault(id_, (seen.last_n, seen.last_at, n, at))
        seen.last, seen.last_n, seen.last_at = now, n, at

    def _order(
        self, target: str, seen: _Seen, at: float, logs: Mapping[int, Sequence[int]]
    ) -> None:
        for partition, records in logs.items():
            checked, top, top_at = seen.logs.get(partition, (0, -1, -1))
            for offset in range(checked, len(records)):
                epoch = self.epoch_of.get(records[offset])
                if epoch is None:
                    continue
                if epoch < top:
                    self._flag(
                        "order",
                        target,
                        at,
                        f"partition {partition}: record {offset} (id {records[offset]}) is of "
                        f"epoch {epoch}, after record {top_at} of epoch {top}",
                    )
                elif epoch > top:
                    top, top_at = epoch, offset
            seen.logs[partition] = (len(records), top, top_at)

    def violations(self) -> list[HistoryViolation]:
        """The first violation of each kind per target; ids still missing at the last sample
        are ``aborted read`` (seen, then never again)."""
        found = dict(self._first)
        for target, seen in self._seen.items():
            for id_, (last_n, _last_at, miss_n, miss_at) in sorted(seen.gone.items()):
                if id_ not in self.epoch_of:
                    continue  # reported as unexpected already
                first_n, first_at = seen.first[id_]
                violation = HistoryViolation(
                    "aborted read",
                    target,
                    miss_at,
                    f"id {id_} (epoch {self.epoch_of.get(id_)}) visible from sample {first_n} "
                    f"(+{first_at - (seen.start or 0):.2f}s) to {last_n}, gone from sample "
                    f"{miss_n} (+{miss_at - (seen.start or 0):.2f}s) to the end",
                )
                before = found.get((target, "aborted read"))
                found[(target, "aborted read")] = (
                    violation
                    if before is None
                    else HistoryViolation(
                        before.kind, target, before.at, before.evidence, before.count + 1
                    )
                )
        return sorted(found.values(), key=lambda v: (v.target, KINDS.index(v.kind)))

    def samples(self) -> dict[str, int]:
        return {target: seen.samples for target, seen in self._seen.items()}
