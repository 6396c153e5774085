"""Recovery's plan (step 1 of the protocol, read-only): its actions (commit, mark
committed, void, abort...), each told in one line, and how a plan is made from the log and
the sinks' prepared transactions.

A plan is a list of :class:`RecoveryAction`, in execution order:

1. for each decided-but-uncommitted epoch, ascending: ``commit`` each configured
   sink's share (its :meth:`~txsink.contract.SinkContract.commit_epoch`, with every
   decided handle of the sink, or none); ``skip`` or ``abort_not_restored`` the
   handles of removed or retired sinks (only with ``allow_non_restored_state``);
   ``mark_committed``;
2. for each prepared transaction the sinks list that step 1 does not cover:
   ``abort_pruned`` (its epoch's records were pruned long after it committed),
   ``commit`` (a committed epoch names it: its sink's share is committed again,
   idempotently), or ``void`` its round then ``abort`` it (no decision names it;
   the void first, so that no zombie driver can decide it afterwards).

:mod:`txsink.protocol.recovery` runs the plans; the operator commands print them.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from txsink.contract import SinkContract
from txsink.errors import CheckpointMismatchError, NonRestoredStateError, StateError
from txsink.handles import Handle, load_handle
from txsink.observe.metering import Meter
from txsink.protocol.log import EpochDecision, TxLog
from txsink.schema import SchemaChange

__all__ = [
    "ABORTS",
    "ActionKind",
    "RecoveryAction",
    "RecoveryPlanner",
    "checkpoint_reset_error",
    "decided",
    "on_handle",
]

AnySink = SinkContract[Any, Any]


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
    #: A commit's schema change, as its epoch's decision records it (:mod:`txsink.schema`).
    schema_change: SchemaChange | None = None

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


class RecoveryPlanner:
    """Makes recovery plans for one coordinator's sinks against its log; changes nothing.

    :class:`~txsink.protocol.recovery.Recovery` is this with the execution.
    """

    def __init__(
        self,
        log: TxLog,
        sinks: Sequence[AnySink],
        retired: Sequence[AnySink],
        *,
        allow_non_restored_state: bool,
        meter: Meter | None = None,
    ) -> None:
        self.log = log
        self.sinks = tuple(sinks)
        self.retired = tuple(retired)
        self.allow_non_restored_state = allow_non_restored_state
        #: The coordinator's metrics (none for an operator's command).
        self.meter = meter or Meter(None)
        self._found: dict[AnySink, list[Handle]] = {}
        self._since: dict[str, float] = {}

    def operator_app(self, app_id: str | None) -> str:
        """The app id for an operator's call (default: the log's), checked against the log."""
        meta = self.log.meta()
        if meta is None:
            raise StateError(
                f"there is no txsink log at {self.log.location} (no meta.json): nothing to "
                "recover or abort. Check the --log location"
            )
        owner = str(meta["app_id"])
        if app_id is not None and app_id != owner:
            raise CheckpointMismatchError(
                f"the txsink log at {self.log.location} belongs to app {owner!r}, not "
                f"{app_id!r}: pass the log of that app, or its app id"
            )
        return owner

    # -- plan --------------------------------------------------------------------------

    def plan(
        self, app_id: str, *, abort: bool = False, epoch: int | None = None
    ) -> list[RecoveryAction]:
        """What recovery (or, with ``abort``, the operator's abort) would do now.

        Reads the log and lists the sinks' prepared transactions; changes nothing.
        ``abort``: decided epochs are left alone (their decision stands), except
        ``epoch`` when only removed or retired sinks hold its handles; ``epoch``
        limits an abort to one epoch.
        """
        actions: list[RecoveryAction] = []
        covered: set[str] = set()  # transactions a pending decision's finish handles
        pending = self.log.pending()
        self._found, self._since = {}, {}
        for decision in pending:
            covered |= decision.txn_names()
            block = self.log.block(decision.epoch)
            if block is not None and self.meter:
                for sink in self.sinks:
                    if sink.uid == block.sink_uid:
                        self.meter.blocked(sink, decision.epoch, True)
            if not abort:
                actions += self.plan_finish(decision, self.allow_non_restored_state)
            elif decision.epoch == epoch:
                actions += self._plan_give_up(decision)
        lingering = self._plan_lingering(app_id, covered)
        self.meter.recovery_found([d.epoch for d in pending], self._found, self._since)
        if abort:
            lingering = [
                a
                for a in lingering
                if a.kind is not ActionKind.COMMIT and (epoch is None or a.epoch == epoch)
            ]
        return actions + lingering

    def plan_finish(self, decision: EpochDecision, allow: bool) -> list[RecoveryAction]:
        """Commit every configured sink's share of a decided epoch, then mark it committed."""
        epoch, round_ = decision.epoch, decision.round
        configured = {s.uid for s in self.sinks}
        retired = {s.uid for s in self.retired}
        missing = tuple(
            sorted(u for u, docs in decision.handles.items() if docs and u not in configured)
        )
        if missing and not allow:
            raise NonRestoredStateError(
                f"the txsink log holds decided, uncommitted handles of epoch {epoch} for sink "
                f"uid(s) {list(missing)} that this coordinator does not configure "
                f"(configured: {sorted(configured)}, retired: {sorted(retired)}). Add the sink "
                "back with the same uid so recovery can commit them, or pass "
                "allow_non_restored_state=True to skip them (or, for a retired sink, abort "
                "them): their rows of that epoch will not be written",
                epoch=epoch,
            )
        why = f"decided epoch {epoch} round {round_}"
        actions = [
            RecoveryAction(
                ActionKind.COMMIT,
                epoch,
                round_,
                s.uid,
                None,
                why,
                decided(decision, s.uid),
                schema_change=decision.schema_change(s.uid),
            )
            for s in self.sinks
        ]
        for uid in missing:
            if uid in retired:
                actions += [
                    on_handle(ActionKind.ABORT_NOT_RESTORED, uid, h, f"{why}, sink retired")
                    for h in decided(decision, uid)
                ]
            else:
                n = len(decision.handles[uid])
                actions.append(
                    RecoveryAction(
                        ActionKind.SKIP_NOT_RESTORED,
                        epoch,
                        round_,
                        uid,
                        reason=f"{why}: {n} handle(s) of a sink not configured stay prepared",
                    )
                )
        actions.append(
            RecoveryAction(ActionKind.MARK_COMMITTED, epoch, round_, not_restored=missing)
        )
        return actions

    def _plan_give_up(self, decision: EpochDecision) -> list[RecoveryAction]:
        """An operator's abort of a decided epoch: only removed and retired sinks' share."""
        configured = {s.uid for s in self.sinks}
        live = sorted(u for u, docs in decision.handles.items() if docs and u in configured)
        if live:
            raise StateError(
                f"epoch {decision.epoch} is decided (round {decision.round}): its decision "
                f"stands, and sink(s) {live} hold handles of it. A decided epoch cannot be "
                "aborted: `txsink recover` commits it. To drop the share of a sink removed "
                "from the pipeline, configure that sink as retired=[...] (or leave it out) "
                "and run recover with allow_non_restored_state=True",
                epoch=decision.epoch,
                phase="abort",
            )
        return self.plan_finish(decision, allow=True)

    def _plan_lingering(self, app_id: str, covered: set[str]) -> list[RecoveryAction]:
        """Every prepared transaction no pending decision covers: commit, or void + abort."""
        epochs = self.log.epochs()
        floor = epochs[0] if epochs else None
        decisions: dict[int, EpochDecision | None] = {}
        voided: set[tuple[int, int]] = set()
        recommitted: set[tuple[str, int]] = set()
        actions: list[RecoveryAction] = []
        for sink in (*self.sinks, *self.retired):
            retired = sink in self.retired
            self._found[sink] = list(sink.list_prepared(app_id))
            for handle in self._found[sink]:
                txn = handle.txn
                name = str(txn)
                self._prepared_at(sink.uid, txn.epoch)
                if name in covered:
                    continue
                if floor is not None and txn.epoch < floor:
                    why = "its epoch's records were pruned after it committed"
                    actions.append(on_handle(ActionKind.ABORT_PRUNED, sink.uid, handle, why))
                    continue
                if txn.epoch not in decisions:
                    decisions[txn.epoch] = self.log.decision(txn.epoch)
                decision = decisions[txn.epoch]
                if decision is None:
                    if (txn.epoch, txn.round) not in voided:
                        voided.add((txn.epoch, txn.round))
                        actions.append(
                            RecoveryAction(
                                ActionKind.VOID,
                                txn.epoch,
                                txn.round,
                                reason="undecided: no driver can decide it afterwards",
                            )
                        )
                    why = f"epoch {txn.epoch} round {txn.round} is undecided"
                    actions.append(on_handle(ActionKind.ABORT, sink.uid, handle, why))
                elif name not in decision.txn_names():
                    why = f"an attempt decided epoch {txn.epoch} round {decision.round} did not use"
                    actions.append(on_handle(ActionKind.ABORT, sink.uid, handle, why))
                elif retired and self._given_up(txn.epoch, sink.uid):
                    why = f"decided epoch {txn.epoch} committed without it (not restored)"
                    actions.append(on_handle(ActionKind.ABORT_NOT_RESTORED, sink.uid, handle, why))
                elif (sink.uid, txn.epoch) not in recommitted:
                    # Commit what the decision recorded, never the listed stand-in (it may
                    # not carry everything a commit needs): the sink's whole share again.
                    recommitted.add((sink.uid, txn.epoch))
                    actions.append(
                        RecoveryAction(
                            ActionKind.COMMIT,
                            txn.epoch,
                            decision.round,
                            sink.uid,
                            None,
                            f"committed epoch {txn.epoch}, {name} still prepared",
                            decided(decision, sink.uid),
                            schema_change=decision.schema_change(sink.uid),
                        )
                    )
        return actions

    def _prepared_at(self, uid: str, epoch: int) -> None:
        """When a prepared transaction was prepared, at the latest: its epoch's decision,
        else now (its age is then a lower bound, from this recovery on)."""
        decision = self.log.decision(epoch) if self.meter else None
        at = decision.decided_at if decision is not None and decision.decided_at else time.time()
        self._since[uid] = min(self._since.get(uid, at), at)

    def _given_up(self, epoch: int, uid: str) -> bool:
        record = self.log.committed(epoch)
        return record is not None and uid in record.not_restored


def checkpoint_reset_error(location: str, epoch: int, last: int) -> CheckpointMismatchError:
    """Epoch ``epoch`` asked for (Spark's next batch) below the log's last committed."""
    return CheckpointMismatchError(
        f"epoch {epoch} was asked for, but the txsink log at {location} has "
        f"already committed epoch {last}: the Spark checkpoint was reset or restored "
        "from an older copy while the txsink log was kept (or write() was given an "
        "epoch lower than the log's last), so epoch numbers no longer name the same "
        "rows. Restore the matching checkpoint, or start the query with a new "
        "checkpoint AND a new txsink log (and a new output folder or sink uid)",
        epoch=epoch,
    )
