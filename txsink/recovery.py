"""Recovery actions: what :meth:`txsink.Coordinator.recover` does (or would do), one step each.

Recovery is planned, then executed, by the coordinator alone (the protocol lives
in one place): a query runs the plan before its first epoch, an operator runs the
same plan by hand (``txsink recover``, ``txsink abort``) or only prints it
(``--dry-run``). A plan is a list of :class:`RecoveryAction`, in execution order:

1. for each decided-but-uncommitted epoch, ascending: ``commit`` (or
   ``commit_from_data``) every decided handle of a configured sink; ``skip`` or
   ``abort_not_restored`` the handles of removed or retired sinks (only with
   ``allow_non_restored_state``); ``finish_epoch`` per sink; ``mark_committed``;
2. for each prepared transaction the sinks list that step 1 does not cover:
   ``abort_pruned`` (its epoch's records were pruned long after it committed),
   ``commit`` (a decision names it), or ``void`` its round then ``abort`` it (no
   decision names it; the void first, so that no zombie driver can decide it
   afterwards — if the void loses because a zombie decided meanwhile, the
   executor finishes that decision instead and reports what it really did).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from txsink.handles import Handle

__all__ = ["ActionKind", "RecoveryAction"]


class ActionKind(enum.StrEnum):
    """One kind of recovery step; the value is its name in plans and CLI output."""

    COMMIT = "commit"
    COMMIT_FROM_DATA = "commit_from_data"
    FINISH_EPOCH = "finish_epoch"
    MARK_COMMITTED = "mark_committed"
    SKIP_NOT_RESTORED = "skip_not_restored"
    ABORT_NOT_RESTORED = "abort_not_restored"
    VOID = "void"
    ABORT = "abort"
    ABORT_PRUNED = "abort_pruned"


#: (dry run, done) verbs per kind, for one line per action.
_VERBS: dict[ActionKind, tuple[str, str]] = {
    ActionKind.COMMIT: ("would commit", "committed"),
    ActionKind.COMMIT_FROM_DATA: ("would commit from the replayed rows", "committed"),
    ActionKind.FINISH_EPOCH: ("would finish", "finished"),
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

    ``handles`` are the loaded handles the step acts on (one for ``commit`` and the
    aborts, all of a sink's for ``commit_from_data`` and ``finish_epoch``; none for
    ``void``, ``mark_committed`` and ``skip_not_restored``, which cannot load handles of
    a sink that is not configured). ``not_restored`` lists the sink uids a
    ``mark_committed`` records as not restored.
    """

    kind: ActionKind
    epoch: int
    round: int | None = None
    sink_uid: str | None = None
    txn: str | None = None
    reason: str = ""
    handles: tuple[Handle, ...] = ()
    not_restored: tuple[str, ...] = ()

    def describe(self, *, done: bool) -> str:
        """One line: ``would abort postgres txsink.app.pg.e3.r0.p1.a7 (epoch 3 ...)``."""
        verb = _VERBS[self.kind][1 if done else 0]
        what = self.txn or ""
        if self.kind is ActionKind.VOID:
            what = f"round {self.round} of epoch {self.epoch}"
        elif self.kind is ActionKind.MARK_COMMITTED:
            what = f"epoch {self.epoch} (round {self.round})"
            if self.not_restored:
                what += f", not restored: {', '.join(self.not_restored)}"
        elif self.kind is ActionKind.FINISH_EPOCH:
            what = f"epoch {self.epoch} ({len(self.handles)} handles)"
        elif self.kind in (ActionKind.COMMIT_FROM_DATA, ActionKind.SKIP_NOT_RESTORED):
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
            "reason": self.reason,
            "handles": len(self.handles),
            "not_restored": list(self.not_restored),
        }
