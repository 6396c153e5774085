"""Recovery's actions: one step of a plan (commit, mark committed, void, abort...), how it
reads as one line, and a plan told in one sentence.

:mod:`txsink.protocol.recovery` makes and runs the plans; the operator commands print them.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from txsink.handles import Handle, load_handle
from txsink.protocol.log import EpochDecision

__all__ = ["ABORTS", "ActionKind", "RecoveryAction", "decided", "on_handle", "summary"]


class ActionKind(enum.StrEnum):
    """One kind of recovery step; the value is its name in plans and CLI output."""

    COMMIT = "commit"
    MARK_COMMITTED = "mark_committed"
    SKIP_NOT_RESTORED = "skip_not_restored"
    ABORT_NOT_RESTORED = "abort_not_restored"
    VOID = "void"
    ABORT = "abort"
    ABORT_PRUNED = "abort_pruned"


ABORTS = (ActionKind.ABORT, ActionKind.ABORT_PRUNED, ActionKind.ABORT_NOT_RESTORED)

#: (dry run, done) verbs per kind, for one line per action.
_VERBS: dict[ActionKind, tuple[str, str]] = {
    ActionKind.COMMIT: ("would commit", "committed"),
    ActionKind.MARK_COMMITTED: ("would mark committed", "marked committed"),
    ActionKind.SKIP_NOT_RESTORED: ("would skip (not restored)", "skipped (not restored)"),
    ActionKind.ABORT_NOT_RESTORED: ("would abort (not restored)", "aborted (not restored)"),
    ActionKind.VOID: ("would void", "voided"),
    ActionKind.ABORT: ("would abort", "aborted"),
    ActionKind.ABORT_PRUNED: ("would abort", "aborted"),
}


@dataclass(frozen=True)
class RecoveryAction:
    """One step of a recovery plan.

    ``handles`` are the loaded handles the step acts on: a sink's decided handles of the
    epoch for ``commit`` (possibly none: its share of the epoch is empty), one for the
    aborts; none for ``void``, ``mark_committed`` and ``skip_not_restored``, which cannot
    load handles of a sink that is not configured. ``not_restored`` lists the sink uids
    a ``mark_committed`` records as not restored.
    """

    kind: ActionKind
    epoch: int
    round: int | None = None
    sink_uid: str | None = None
    txn: str | None = None
    reason: str = ""
    handles: tuple[Handle, ...] = ()
    not_restored: tuple[str, ...] = ()

    def describe(self, *, done: bool, names: bool = True) -> str:
        """One line: ``would abort pg txsink.app.pg.e3.r0.p1.a7: epoch 3 round 0 is ...``.

        ``names=False``: a commit counts its transactions instead of naming them (a log line).
        """
        verb = _VERBS[self.kind][1 if done else 0]
        what = self.txn or ""
        if self.kind is ActionKind.VOID:
            what = f"round {self.round} of epoch {self.epoch}"
        elif self.kind is ActionKind.MARK_COMMITTED:
            what = f"epoch {self.epoch} (round {self.round})"
            if self.not_restored:
                what += f", not restored: {', '.join(self.not_restored)}"
        elif self.kind is ActionKind.COMMIT:
            listed = ", ".join(str(h.txn) for h in self.handles[:3]) if names else ""
            more = f", +{len(self.handles) - 3} more" if listed and len(self.handles) > 3 else ""
            what = f"epoch {self.epoch} ({len(self.handles)} handle(s){': ' if listed else ''}"
            what += f"{listed}{more})"
        elif self.kind is ActionKind.SKIP_NOT_RESTORED:
            what = f"epoch {self.epoch}"
        parts = [verb]
        if self.sink_uid is not None:
            parts.append(self.sink_uid)
        parts.append(what)
        line = " ".join(p for p in parts if p)
        return f"{line}: {self.reason}" if self.reason else line

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form (no handle data: it may name buckets, paths or upload ids)."""
        return {
            "kind": str(self.kind),
            "epoch": self.epoch,
            "round": self.round,
            "sink_uid": self.sink_uid,
            "txn": self.txn,
            "txns": [str(h.txn) for h in self.handles],
            "reason": self.reason,
            "handles": len(self.handles),
            "not_restored": list(self.not_restored),
        }


def on_handle(kind: ActionKind, uid: str, handle: Handle, why: str) -> RecoveryAction:
    txn = handle.txn
    return RecoveryAction(kind, txn.epoch, txn.round, uid, str(txn), why, (handle,))


def decided(decision: EpochDecision, uid: str) -> tuple[Handle, ...]:
    return tuple(load_handle(doc, sink_uid=uid) for doc in decision.handles.get(uid, []))


def summary(actions: Sequence[RecoveryAction]) -> str:
    """A plan in one sentence: what the previous run left unfinished, and what is done.

    ``the previous run did not finish: epoch 3 is decided but not committed (commit it);
    2 prepared transaction(s) of epoch 4 no decision names (abort them)``.
    """
    finishing = sorted({a.epoch for a in actions if a.kind is ActionKind.MARK_COMMITTED})
    aborts = [a for a in actions if a.kind in ABORTS and a.epoch not in finishing]
    again = [a for a in actions if a.kind is ActionKind.COMMIT and a.epoch not in finishing]
    parts = []
    if finishing:
        verb = "is" if len(finishing) == 1 else "are"
        them = "it" if len(finishing) == 1 else "them"
        parts.append(f"{_epochs(finishing)} {verb} decided but not committed (commit {them})")
    if aborts:
        parts.append(
            f"{len(aborts)} prepared transaction(s) of {_epochs({a.epoch for a in aborts})} "
            "no decision names (abort them)"
        )
    if again:
        parts.append(
            f"{_epochs({a.epoch for a in again})} committed, with transactions still "
            "prepared (commit them again)"
        )
    return "the previous run did not finish: " + "; ".join(parts) if parts else "nothing to do"


def _epochs(epochs: Sequence[int] | set[int]) -> str:
    ordered = sorted(epochs)
    if len(ordered) == 1:
        return f"epoch {ordered[0]}"
    return f"epochs {', '.join(str(e) for e in ordered)}"
