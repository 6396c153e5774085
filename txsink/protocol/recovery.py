"""Recovery (step 1 of the protocol): a plan of actions (:mod:`txsink.protocol.plan`), then
its execution; and the void and abort of a failed round, which are recovery's own steps
for an undecided round, run while the epoch is still in hand.

The same plan and execution serve a query's recovery before its first epoch and an
operator's ``txsink recover`` / ``txsink abort`` (or only printed, ``--dry-run``). If a
planned void loses because a zombie driver decided that round meanwhile, the execution
finishes that decision instead and reports what it really did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from txsink.contract import EpochData, SinkContract, TaskRunner, local_tasks
from txsink.errors import FencedError
from txsink.handles import Handle
from txsink.observe.logs import EpochLogger, one_line
from txsink.observe.metering import Meter
from txsink.protocol.commit import abort_one, commit_share
from txsink.protocol.faults import CrashPoint
from txsink.protocol.log import EpochDecision, TxLog
from txsink.protocol.plan import (
    ABORTS,
    ActionKind,
    RecoveryAction,
    RecoveryPlanner,
    decided,
    on_handle,
)
from txsink.protocol.taskerror import cleanup_after, epoch_aborted, unless_raised_again

__all__ = ["ActionKind", "EpochRounds", "Recovery", "RecoveryAction", "on_handle", "summary"]

AnySink = SinkContract[Any, Any]


class Recovery(RecoveryPlanner):
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
        super().__init__(
            log, sinks, retired, allow_non_restored_state=allow_non_restored_state, meter=meter
        )
        self._fire = fire
        self._log = logger
        #: Runs commits spread over the cluster: the coordinator sets the query's Spark
        #: tasks while it runs an epoch; in-process otherwise (``txsink recover``).
        self.tasks: TaskRunner = local_tasks

    def rounds(self, app_id: str, epoch: int) -> EpochRounds:
        """The steps of ``epoch``'s rounds (:class:`~txsink.protocol.rounds.RoundSteps`)."""
        return EpochRounds(self, app_id, epoch)

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
                schema_change=action.schema_change,
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


@dataclass(frozen=True)
class EpochRounds:
    """One epoch's rounds as the protocol runs them (:func:`~txsink.protocol.rounds.
    run_in_rounds`): a new round is claimed in the log; a failed one is voided, then what it
    prepared is aborted; the last failure aborts the epoch."""

    recovery: Recovery
    app_id: str
    epoch: int

    def claim(self) -> int:
        return self.recovery.log.claim_round(self.epoch)

    def void(self, round_: int, err: BaseException) -> None:
        """Void the round first, so it can never be decided, then abort what it prepared
        (best effort: recovery retries; ``err`` stays the error told)."""
        recovery, epoch = self.recovery, self.epoch
        with cleanup_after(err, "voiding the round", recovery._log.bind(epoch=epoch)):
            if recovery.log.void(epoch, round_, "pre-commit failed") is not None:
                # Cannot happen: only this driver holds the round.
                raise FencedError(
                    f"round {round_} of epoch {epoch} was decided meanwhile", epoch=epoch
                ) from err
            recovery.abort_attempts(self.app_id, epoch, round_=round_, best_effort=True)
        recovery.meter.voided(recovery.sinks)

    def abort(self, round_: int, err: BaseException) -> NoReturn:
        """A pre-commit failed: void and abort the round; raise the epoch's abort."""
        with unless_raised_again(err):  # the clean-up failed too: noted on err, told below
            self.void(round_, err)
        self.recovery.meter.epoch("aborted")
        raise epoch_aborted(self.epoch, err)


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
