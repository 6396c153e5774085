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

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from txsink.contract import EpochData, SinkContract, TaskRunner, local_tasks
from txsink.errors import CheckpointMismatchError, NonRestoredStateError, StateError
from txsink.handles import Handle
from txsink.observe.logs import EpochLogger, one_line
from txsink.observe.metering import Meter
from txsink.protocol.actions import ABORTS, ActionKind, RecoveryAction, decided, on_handle, summary
from txsink.protocol.commit import abort_one, commit_share
from txsink.protocol.faults import CrashPoint
from txsink.protocol.log import EpochDecision, TxLog

__all__ = ["ActionKind", "Recovery", "RecoveryAction"]

AnySink = SinkContract[Any, Any]


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
        meter: Meter | None = None,
    ) -> None:
        self.log = log
        self.sinks = tuple(sinks)
        self.retired = tuple(retired)
        self.allow_non_restored_state = allow_non_restored_state
        self._fire = fire
        self._log = logger
        #: Runs commits spread over the cluster: the coordinator sets the query's Spark
        #: tasks while it runs an epoch; in-process otherwise (``txsink recover``).
        self.tasks: TaskRunner = local_tasks
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
                ActionKind.COMMIT, epoch, round_, s.uid, None, why, decided(decision, s.uid)
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
            try:
                prepared = list(sink.list_prepared(app_id))
            except Exception as err:
                if not best_effort:
                    raise
                # The target is unreachable (the failure being handled, often): the next
                # abort_attempts of this epoch, or recovery, finds them.
                self._log.bind(uid=sink.uid, epoch=epoch).warning(
                    "could not list the prepared transactions to abort (recovery retries): %s",
                    one_line(str(err), 500),  # a server's message may span lines
                )
                continue
            for handle in prepared:
                txn = handle.txn
                if txn.epoch != epoch or str(txn) in keep:
                    continue
                if round_ is not None and txn.round != round_:
                    continue
                why = (
                    f"the pre-commit of epoch {epoch} round {txn.round} failed"
                    if round_ is not None
                    else f"an attempt the decision of epoch {epoch} did not use (a retried or "
                    "speculative task)"
                )
                abort_one(
                    sink, handle, why, log=self._log, best_effort=best_effort, meter=self.meter
                )

    # -- execute -----------------------------------------------------------------------

    def execute(
        self,
        actions: list[RecoveryAction],
        data: EpochData | None = None,
        current: int | None = None,
        *,
        announce: bool = True,
    ) -> list[RecoveryAction]:
        """Run a plan in order; returns what was done (a lost void changes the plan).

        ``data`` is the rows of epoch ``current`` when this runs inside its replay
        (sinks that commit from data need them). ``during_recovery`` fires after the
        first unit of each finished epoch became visible, or, when no epoch needed
        finishing, after the first other commit or abort. ``announce``: say first, in
        one WARNING, what the plan finds unfinished.
        """
        run = _Run(data, current, {a.epoch for a in actions if a.kind is ActionKind.MARK_COMMITTED})
        if actions and announce:
            # One WARNING per recovery with work to do: the previous run stopped (or a
            # task attempt was left) mid-protocol. Each action then says itself, at INFO.
            self._log.warning("recovery: %s", summary(actions))
        done: list[RecoveryAction] = []
        for planned in actions:
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
        log = self._log.bind(epoch=epoch)
        if decision is None:
            log.info("recovery: %s", action.describe(done=True))
            self.meter.epoch("voided")
            return [action]
        run.lost[(epoch, round_)] = decision
        log.warning(
            "recovery: round %d of epoch %d was decided meanwhile by another driver: finishing it",
            round_,
            epoch,
        )
        if self.log.committed(epoch) is not None:
            return []
        plan = self.plan_finish(decision, self.allow_non_restored_state)
        data = run.data if epoch == run.current else None
        return self.execute(plan, data, run.current, announce=False)

    def _run_action(self, action: RecoveryAction, run: _Run) -> RecoveryAction | None:
        """Do one planned step (never a void); returns what was done (``None``: nothing)."""
        kind, epoch = action.kind, action.epoch
        log = self._log.bind(uid=action.sink_uid, epoch=epoch)
        if kind is ActionKind.MARK_COMMITTED:
            if action.not_restored:
                log.warning(
                    "recovery: epoch %d committed WITHOUT sink uid(s) %s: their decided rows "
                    "of this epoch are not written (allow_non_restored_state)",
                    epoch,
                    list(action.not_restored),
                )
            self.log.mark_committed(epoch, action.round or 0, not_restored=action.not_restored)
            self.meter.finished(epoch, self.sinks, run.shares.pop(epoch, {}))
            log.info("recovery: %s", action.describe(done=True))
            return action
        if kind is ActionKind.SKIP_NOT_RESTORED:
            log.warning("recovery: %s", action.describe(done=True))
            return action
        sink = self._sink(action.sink_uid)
        lost = run.lost.get((epoch, action.round or 0))
        if kind in ABORTS and lost is not None and action.txn in lost.txn_names():
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
                decided(lost, sink.uid),
            )
            kind = action.kind
        if kind in ABORTS:
            given_up = kind is ActionKind.ABORT_NOT_RESTORED
            why = f"{action.reason} (not restored)" if given_up else action.reason
            level = logging.WARNING if given_up else logging.INFO
            abort_one(
                sink, action.handles[0], why, log=self._log, by="recovery", level=level,
                meter=self.meter,
            )  # fmt: skip
            if not run.finishing and not run.fired:
                run.fired.add(epoch)
                self._fire(CrashPoint.DURING_RECOVERY, epoch)
            return action
        if kind is ActionKind.COMMIT:
            commit_share(
                sink,
                epoch,
                action.handles,
                data=run.data if epoch == run.current else None,
                on_committed=lambda _handles: self._committed(epoch, run),
                tasks=self.tasks,
                meter=self.meter,
                recovering=True,
                log=self.log,
                round_=action.round or 0,
            )
            run.committed.add((sink.uid, epoch))
            if epoch in run.finishing:
                run.shares.setdefault(epoch, {})[sink.uid] = action.handles
            log.info("recovery: %s", action.describe(done=True, names=False))
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
    fired: set[int] = field(default_factory=set)
    lost: dict[tuple[int, int], EpochDecision] = field(default_factory=dict)
    committed: set[tuple[str, int]] = field(default_factory=set)
    shares: dict[int, dict[str, Sequence[Handle]]] = field(default_factory=dict)
