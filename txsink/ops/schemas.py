"""The schema history of a txsink log: every schema change an epoch's decision recorded
(issue #41), for ``txsink status``, ``txsink inspect`` and the report.

Read from two places, because pruning removes old epochs but not their history: the
decisions of the epochs the log still holds, and the ``schema/`` records
:meth:`~txsink.protocol.log.TxLog.prune` writes for each pruned epoch that changed a
schema (a savepoint carries both).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from txsink.protocol.log import SCHEMA_PREFIX, EpochState, TxLog
from txsink.schema import SchemaChange, type_names

__all__ = ["SchemaEvent", "schema_history"]


@dataclasses.dataclass(frozen=True)
class SchemaEvent:
    """One sink's schema change in one epoch. ``committed``: False while the epoch is
    decided but its commit is unfinished (recovery applies the change with its rows)."""

    epoch: int
    sink: str
    change: SchemaChange
    decided_at: float
    committed: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "sink": self.sink,
            "decided_at": self.decided_at,
            "committed": self.committed,
            "change": self.change.describe(),
            "columns": [c.to_json() for c in self.change.columns],
            "old": type_names(self.change.old),
            "new": type_names(self.change.new),
        }

    def line(self) -> str:
        state = "" if self.committed else " (decided, commit pending)"
        return f"epoch {self.epoch} sink {self.sink}: {self.change.describe()}{state}"


def schema_history(log: TxLog, states: Sequence[EpochState] | None = None) -> list[SchemaEvent]:
    """Every recorded schema change of ``log``, by epoch then sink. ``states``: the log's
    epoch states when the caller read them already (``txsink status``): not read again."""
    events: dict[tuple[int, str], SchemaEvent] = {}
    for key in log.store.list(SCHEMA_PREFIX):
        raw = log.store.read(key)
        if raw is None:
            continue
        doc = json.loads(raw)
        for uid, change in doc.get("schema", {}).items():
            epoch = int(doc["epoch"])
            at = float(doc.get("decided_at", 0.0))
            events[(epoch, uid)] = SchemaEvent(epoch, uid, SchemaChange.from_json(uid, change), at)
    for state in log.states() if states is None else states:
        decision = state.decision
        if decision is None or not decision.schema:
            continue
        for uid, doc in decision.schema.items():
            change = SchemaChange.from_json(uid, doc)
            done = state.committed is not None
            events[(state.epoch, uid)] = SchemaEvent(
                state.epoch, uid, change, decision.decided_at, done
            )
    return [events[k] for k in sorted(events)]
