"""Recovery (step 1 of the protocol): a plan of actions, then its execution.

The same plan and execution serve a query's recovery before its first epoch and an
operator's ``txsink recover`` / ``txsink abort`` (or only printed, ``--dry-run``).
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
   the void first, so that no zombie driver can decide it afterwards — if the void
   loses because a zombie decided meanwhile, the executor finishes that decision
   instead and reports what it really did).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txsink._commit import commit_share
from txsink._logging import EpochLogger
from txsink.contract import EpochData, SinkContract
from txsink.errors import CheckpointMismatchError, NonRestoredStateError, StateError
from txsink.faults import CrashPoint
from txsink.handles import Handle, load_handle
from txsink.log import EpochDecision, TxLog

__all__ = ["ActionKind", "Recovery", "RecoveryAction"]

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


_ABORTS = (ActionKind.ABORT, ActionKind.ABORT_PRUNED, ActionKind.ABORT_NOT_RESTORED)

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

    def describe(self, *, done: bool) -> str:
        """One line: ``would abort pg txsink.app.pg.e3.r0.p1.a7: epoch 3 round 0 is ...``."""
        verb = _VERBS[self.kind][1 if done else 0]
        what = self.txn or ""
        if self.kind is ActionKind.VOID:
            what = f"round {self.round} of epoch {self.epoch}"
        elif self.kind is ActionKind.MARK_COMMITTED:
            what = f"epoch {self.epoch} (round {self.round})"
            if self.not_restored:
                what += f", not restored: {', '.join(self.not_restored)}"
        elif self.kind is ActionKind.COMMIT:
            names = ", ".join(str(h.txn) for h in self.handles[:3])
            more = f", +{len(self.handles) - 3} more" if len(self.handles) > 3 else ""
            what = f"epoch {self.epoch} ({len(self.handles)} handle(s){': ' if names else ''}"
            what += f"{names}{more})"
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


class Recovery:
    """Plans and executes recovery for one coordinator's sinks against its log.

    ``fire`` is the coordinator's crash-point hook (``during_recovery`` fires here);
    ``logger`` its logger.
    """

    def __init__(
        self,
        log: TxLog,
        sinks: Sequence[AnySink],
        retired: Sequence[AnySink],
        *,
        allow_non_restored_state: bool,
        fire: Callable[[CrashPoint, int], None],
        logger: EpochLogger,
    ) -> None:
        self.log = log
        self.sinks = tuple(sinks)
        self.retired = tuple(retired)
        self.allow_non_restored_state = allow_non_restored_state
        self._fire = fire
        self._log = logger

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
        for decision in self.log.pending():
            covered |= decision.txn_names()
            if not abort:
                actions += self.plan_finish(decision, self.allow_non_restored_state)
            elif decision.epoch == epoch:
                actions += self._plan_give_up(decision)
        lingering = self._plan_lingering(app_id, covered)
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
                ActionKind.COMMIT, epoch, round_, s.uid, None, why, _decided(decision, s.uid)
            )
            for s in self.sinks
        ]
        for uid in missing:
            if uid in retired:
                actions += [
                    _on_handle(ActionKind.ABORT_NOT_RESTORED, uid, h, f"{why}, sink retired")
                    for h in _decided(decision, uid)
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
            for handle in list(sink.list_prepared(app_id)):
                txn = handle.txn
                name = str(txn)
                if name in covered:
                    continue
                if floor is not None and txn.epoch < floor:
                    why = "its epoch's records were pruned after it committed"
                    actions.append(_on_handle(ActionKind.ABORT_PRUNED, sink.uid, handle, why))
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
                    actions.append(_on_handle(ActionKind.ABORT, sink.uid, handle, why))
                elif name not in decision.txn_names():
                    why = f"an attempt decided epoch {txn.epoch} round {decision.round} did not use"
                    actions.append(_on_handle(ActionKind.ABORT, sink.uid, handle, why))
                elif retired and self._given_up(txn.epoch, sink.uid):
                    why = f"decided epoch {txn.epoch} committed without it (not restored)"
                    actions.append(_on_handle(ActionKind.ABORT_NOT_RESTORED, sink.uid, handle, why))
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
                            _decided(decision, sink.uid),
                        )
                    )
        return actions

    def _given_up(self, epoch: int, uid: str) -> bool:
        record = self.log.committed(epoch)
        return record is not None and uid in record.not_restored

    def abort_attempts(
        self,
        app_id: str,
        epoch: int,
        *,
        round_: int | None = None,
        keep: frozenset[str] | set[str] = frozenset(),
        best_effort: bool = False,
    ) -> None:
        """Abort ``epoch``'s prepared transactions (of one round, if given) not in ``keep``.

        After an epoch committed, the attempts whose results were not used (retried,
        speculative); after a failed pre-commit, the voided round's. ``best_effort``:
        a failing abort is logged, not raised (recovery retries it; the error being
        handled matters more).
        """
        for sink in self.sinks:
            for handle in list(sink.list_prepared(app_id)):
                txn = handle.txn
                if txn.epoch != epoch or str(txn) in keep:
                    continue
                if round_ is not None and txn.round != round_:
                    continue
                log = self._log.bind(uid=sink.uid, epoch=epoch)
                log.info("aborting attempt %s", txn)
                try:
                    sink.abort(handle)
                except Exception as err:
                    if not best_effort:
                        raise
                    log.warning("could not abort %s: %s", txn, err)

    # -- execute -----------------------------------------------------------------------

    def execute(
        self,
        actions: list[RecoveryAction],
        data: EpochData | None = None,
        current: int | None = None,
    ) -> list[RecoveryAction]:
        """Run a plan in order; returns what was done (a lost void changes the plan).

        ``data`` is the rows of epoch ``current`` when this runs inside its replay
        (sinks that commit from data need them). ``during_recovery`` fires after the
        first unit of each finished epoch became visible, or, when no epoch needed
        finishing, after the first other commit or abort.
        """
        run = _Run(data, current, {a.epoch for a in actions if a.kind is ActionKind.MARK_COMMITTED})
        done: list[RecoveryAction] = []
        for planned in actions:
            if planned.epoch in run.finishing and planned.epoch not in run.announced:
                run.announced.add(planned.epoch)
                self._log.bind(epoch=planned.epoch).warning(
                    "recovery finishes decided epoch %d (round %s)", planned.epoch, planned.round
                )
            if planned.kind is ActionKind.VOID:
                done += self._void(planned, run)
                continue
            action = self._run_action(planned, run)
            if action is not None:
                done.append(action)
        return done

    def _void(self, action: RecoveryAction, run: _Run) -> list[RecoveryAction]:
        """Void an undecided round; if a zombie decided it meanwhile, finish its epoch."""
        epoch, round_ = action.epoch, action.round or 0
        decision = self.log.void(epoch, round_, "aborted by recovery")
        if decision is None:
            return [action]
        run.lost[(epoch, round_)] = decision
        self._log.bind(epoch=epoch).warning("round %d was decided meanwhile: finishing it", round_)
        if self.log.committed(epoch) is not None:
            return []
        plan = self.plan_finish(decision, self.allow_non_restored_state)
        return self.execute(plan, run.data if epoch == run.current else None, run.current)

    def _run_action(self, action: RecoveryAction, run: _Run) -> RecoveryAction | None:
        """Do one planned step (never a void); returns what was done (``None``: nothing)."""
        kind, epoch = action.kind, action.epoch
        log = self._log.bind(uid=action.sink_uid, epoch=epoch)
        if kind is ActionKind.MARK_COMMITTED:
            if action.not_restored:
                log.warning(
                    "epoch %d committed WITHOUT sink uid(s) %s: their decided rows of this "
                    "epoch are not written (allow_non_restored_state)",
                    epoch,
                    list(action.not_restored),
                )
            self.log.mark_committed(epoch, action.round or 0, not_restored=action.not_restored)
            log.info("recovery finished decided epoch %d", epoch)
            return action
        if kind is ActionKind.SKIP_NOT_RESTORED:
            log.warning("recovery skips decided handles of unconfigured sink %s", action.sink_uid)
            return action
        sink = self._sink(action.sink_uid)
        lost = run.lost.get((epoch, action.round or 0))
        if kind in _ABORTS and lost is not None and action.txn in lost.txn_names():
            # Its round was decided between our scan and the void, and its epoch finished
            # by _void: it is committed, never to be aborted.
            if (sink.uid, epoch) in run.committed:
                return None
            action = RecoveryAction(
                ActionKind.COMMIT,
                epoch,
                lost.round,
                sink.uid,
                None,
                "decided by another driver meanwhile",
                _decided(lost, sink.uid),
            )
            kind = action.kind
        if kind in _ABORTS:
            level = log.warning if kind is ActionKind.ABORT_NOT_RESTORED else log.info
            level("recovery aborts %s (%s)", action.txn, action.reason)
            sink.abort(action.handles[0])
            if not run.finishing and not run.fired:
                run.fired.add(epoch)
                self._fire(CrashPoint.DURING_RECOVERY, epoch)
            return action
        if kind is ActionKind.COMMIT:
            if action.handles:
                log.warning("recovery commits %d decided handle(s)", len(action.handles))
            commit_share(
                sink,
                epoch,
                action.handles,
                data=run.data if epoch == run.current else None,
                on_committed=lambda _handles: self._committed(epoch, run),
            )
            run.committed.add((sink.uid, epoch))
        return action

    def _committed(self, epoch: int, run: _Run) -> None:
        """A unit of ``epoch`` became visible: ``during_recovery`` fires at the first."""
        first_of_epoch = epoch in run.finishing and epoch not in run.fired
        first_at_all = not run.finishing and not run.fired
        if first_of_epoch or first_at_all:
            run.fired.add(epoch)
            self._fire(CrashPoint.DURING_RECOVERY, epoch)

    def _sink(self, uid: str | None) -> AnySink:
        for sink in (*self.sinks, *self.retired):
            if sink.uid == uid:
                return sink
        raise ValueError(f"no sink {uid!r} in this coordinator")  # plans name only ours


@dataclass
class _Run:
    """The state of one :meth:`Recovery.execute`."""

    data: EpochData | None
    current: int | None
    finishing: set[int]
    announced: set[int] = field(default_factory=set)
    fired: set[int] = field(default_factory=set)
    lost: dict[tuple[int, int], EpochDecision] = field(default_factory=dict)
    committed: set[tuple[str, int]] = field(default_factory=set)


def _on_handle(kind: ActionKind, uid: str, handle: Handle, why: str) -> RecoveryAction:
    txn = handle.txn
    return RecoveryAction(kind, txn.epoch, txn.round, uid, str(txn), why, (handle,))


def _decided(decision: EpochDecision, uid: str) -> tuple[Handle, ...]:
    return tuple(load_handle(doc, sink_uid=uid) for doc in decision.handles.get(uid, []))
