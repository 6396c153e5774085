"""The epoch coordinator: Flink's two-phase commit on Spark micro-batches.

One :class:`Coordinator` drives one or more sinks with one decision per
epoch, so several targets move atomically. Use it as
``df.writeStream.foreachBatch(coordinator)`` or, for a static DataFrame,
``coordinator.write(df)``.

Replay edge cases this handles (the reason for each step):

* Spark re-runs the last batch after a crash with the same ``batch_id``: a
  committed epoch is skipped (step 2) and writes nothing.
* The driver dies after the decision: the next run commits the decided
  handles before anything else (step 1); the decision stands.
* The driver dies before the decision, or a task attempt fails, is retried
  or runs speculatively: those transactions are named by no decision and are
  aborted (step 1 at the next start, step 5 after each epoch).
* A zombie driver still runs an epoch another driver took over: rounds and
  voids in the log let only one of them decide (see :mod:`txsink.log`).
* The Spark checkpoint was reset or restored from an old copy while the log
  was kept: refused, because epoch numbers no longer mean the same rows.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, final

from txsink import _spark
from txsink._logging import get_logger
from txsink._task import Ack, TaskPlan
from txsink.errors import (
    CheckpointMismatchError,
    CommitError,
    ConfigurationError,
    EpochAbortedError,
    FencedError,
    NonRestoredStateError,
    StateError,
    TxsinkError,
)
from txsink.faults import CrashPoint, FaultPlan
from txsink.handles import Handle, load_handle
from txsink.log import EpochDecision, LogStore, TxLog, open_log
from txsink.recovery import ActionKind, RecoveryAction
from txsink.sink import TwoPhaseCommitSink
from txsink.txid import check_name

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["Coordinator", "EpochResult"]

AnySink = TwoPhaseCommitSink[Any, Any]
Precommit = Callable[[TaskPlan], list[Ack]]
_COMMITS = (ActionKind.COMMIT, ActionKind.COMMIT_FROM_DATA)
_ABORTS = (ActionKind.ABORT, ActionKind.ABORT_PRUNED, ActionKind.ABORT_NOT_RESTORED)
_TARGET_ACTIONS = (ActionKind.COMMIT, *_ABORTS)


@dataclass(frozen=True)
class EpochResult:
    """What one call did: ``committed``, or ``skipped`` (already committed: a replay)."""

    epoch: int
    status: str
    round: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    handles: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class Coordinator:
    """Runs the txsink protocol for each epoch over a set of sinks.

    Args:
        sinks: one sink or several; all share one decision per epoch.
        log: where the txsink log lives (a path, or a :class:`~txsink.log.LogStore`).
        app_id: the app's stable id. Defaults to the streaming query's id, which
            Spark keeps in its checkpoint. Required for :meth:`write` on a
            fresh log.
        allow_non_restored_state: start even if the log holds pending handles
            for a sink uid that is not configured any more (they are skipped
            and reported in the epoch's committed record).
        retired: sinks removed from the pipeline, kept only so recovery can clean
            up after them. They are never written: no pre-commit, no commit of a
            new epoch. Recovery aborts their lingering prepared transactions (which
            would otherwise hold Postgres locks, S3 multipart uploads or WAL files
            forever: a sink simply left out is never listed again). Their decided
            but uncommitted handles are aborted only with
            ``allow_non_restored_state=True``, recorded in the epoch's
            ``committed.json`` as ``not_restored`` and logged as a WARNING.
            The trade-off: that epoch's rows then exist in the other targets and
            never in the retired one — the one place where atomicity across
            targets is given up, on purpose and on record. Without the flag the
            coordinator raises :class:`~txsink.errors.NonRestoredStateError`, and
            keeping the sink configured one more run (recovery commits the
            decision) is the lossless way out.
        retain_epochs: how many epochs of records the log keeps.
        faults: a fault plan, its text form, or ``None`` to read ``TXSINK_FAULT``.
        from_savepoint: a savepoint (``txsink savepoint create``) to start from: on
            first use, an empty ``log`` is filled from it (a restore cut short is
            completed; a log that has moved on since is left alone). Spark reads its
            checkpoint before ``foreachBatch`` runs, so the checkpoint copy must be
            restored before the query starts (``txsink savepoint restore
            --checkpoint``); see docs/upgrades.md.
    """

    def __init__(
        self,
        sinks: AnySink | Sequence[AnySink],
        *,
        log: str | os.PathLike[str] | LogStore | TxLog,
        app_id: str | None = None,
        allow_non_restored_state: bool = False,
        retired: Sequence[AnySink] = (),
        retain_epochs: int = 100,
        faults: FaultPlan | str | None = None,
        from_savepoint: str | os.PathLike[str] | LogStore | TxLog | None = None,
    ) -> None:
        self.sinks: tuple[AnySink, ...] = (
            (sinks,) if isinstance(sinks, TwoPhaseCommitSink) else tuple(sinks)
        )
        if not self.sinks:
            raise ValueError("Coordinator needs at least one sink")
        self.retired: tuple[AnySink, ...] = tuple(retired)
        uids = [s.uid for s in (*self.sinks, *self.retired)]
        if len(set(uids)) != len(uids):
            raise ValueError(
                f"sink uids must be unique within a coordinator (sinks and retired), got {uids}"
            )
        if retain_epochs < 1:
            raise ValueError("retain_epochs must be >= 1")
        self.log = open_log(log)
        self.app_id = check_name("app id", app_id) if app_id is not None else None
        self.allow_non_restored_state = allow_non_restored_state
        self.retain_epochs = retain_epochs
        self.faults = FaultPlan.parse(faults) if isinstance(faults, str) else faults
        if self.faults is None:
            self.faults = FaultPlan.from_env()
        self.from_savepoint = from_savepoint
        self._restored = from_savepoint is None
        self._bound_app: str | None = None
        self._checked_queries: set[str] = set()
        self._checked_schema: pa.Schema | None = None
        self._needs_recovery = True
        self._last_committed: int | None = None
        self._log = get_logger(__name__, uid="+".join(uids))

    # -- entry points ------------------------------------------------------------------

    @final
    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point: run epoch ``batch_id`` over ``df``."""
        query_id = _spark.streaming_query_id(df)
        app_id = self.app_id or query_id
        if app_id is None:
            raise ConfigurationError(
                "txsink.Coordinator was called outside a streaming query's foreachBatch and "
                "without app_id: pass app_id=..., or use coordinator.write(df) for a static "
                "DataFrame"
            )
        if query_id is not None and query_id not in self._checked_queries:
            _spark.check_query_mode(df, query_id)
            self._checked_queries.add(query_id)
            self._needs_recovery = True  # a new query run: recover before its first epoch
        self._bind(app_id)  # the log's own checks come before the sinks'
        self._check_schema(df, app_id)
        self._run_spark_epoch(int(batch_id), df, app_id)

    @final
    def write(self, df: DataFrame, epoch: int | None = None) -> EpochResult:
        """Write a static DataFrame as one epoch (the next one unless ``epoch`` is given).

        Re-running the same call with the same explicit ``epoch`` after a crash
        writes nothing twice; without ``epoch`` every call is a new epoch.
        """
        app_id = self.app_id or self._app_from_log()
        self._bind(app_id)
        self._check_schema(df, app_id)
        if epoch is None:
            self._recover_if_needed(app_id)
            last = self.log.last_committed()
            epoch = 0 if last is None else last + 1
        return self._run_spark_epoch(epoch, df, app_id)

    @final
    def recovery_plan(self, app_id: str | None = None) -> list[RecoveryAction]:
        """What :meth:`recover` would do now, in order; changes nothing (a dry run).

        ``app_id`` defaults to the coordinator's, else the log's. Raises
        :class:`~txsink.errors.NonRestoredStateError` as recovery would.
        """
        return self._plan(self._operator_app(app_id))

    @final
    def recover(self, app_id: str | None = None, *, dry_run: bool = False) -> list[RecoveryAction]:
        """Run recovery now, outside a query (an operator's ``txsink recover``).

        The same plan and execution a query runs before its first epoch: commit
        every decided-but-uncommitted epoch and mark it committed; void, then
        abort, every prepared transaction no decision names. Returns the actions
        done (with ``dry_run``, the plan). A sink that commits by re-reading the
        epoch's rows (Kafka replay mode) cannot be finished here: that raises
        :class:`~txsink.errors.CommitError` saying to restart the query. Run it
        while the query is stopped: a running query's in-flight round is voided.
        """
        app = self._operator_app(app_id)
        plan = self._plan(app)
        if dry_run:
            return plan
        done = self._execute(plan)
        self._needs_recovery = True  # the next epoch looks again
        return done

    @final
    def abort(
        self, app_id: str | None = None, *, epoch: int | None = None, dry_run: bool = False
    ) -> list[RecoveryAction]:
        """Abort lingering, undecided prepared transactions by hand (``txsink abort``).

        Each one's round is voided first, so no zombie driver can decide it
        afterwards. ``epoch`` limits the abort to one epoch. A decided epoch is
        never aborted — its decision stands and :meth:`recover` commits it — so
        naming one raises :class:`~txsink.errors.StateError`, unless only
        removed or retired sinks hold its handles: then their share is given up
        as with ``allow_non_restored_state`` (retired sinks' handles aborted, the
        epoch marked committed with them as ``not_restored``). Without ``epoch``
        decided epochs are left alone. Returns the actions done (or the plan).
        """
        app = self._operator_app(app_id)
        plan = self._plan(app, abort=True, epoch=epoch)
        if dry_run:
            return plan
        done = self._execute(plan)
        self._needs_recovery = True
        return done

    def _operator_app(self, app_id: str | None) -> str:
        """The app id for an operator's call, checked against the log (which must exist)."""
        meta = self.log.meta()
        if meta is None:
            raise StateError(
                f"there is no txsink log at {self.log.location} (no meta.json): nothing to "
                "recover or abort. Check the --log location"
            )
        owner = str(meta["app_id"])
        app = app_id or self.app_id or owner
        if app != owner:
            raise CheckpointMismatchError(
                f"the txsink log at {self.log.location} belongs to app {owner!r}, not {app!r}: "
                "pass the log of that app, or its app id"
            )
        return app

    def _run_spark_epoch(self, epoch: int, df: DataFrame, app_id: str) -> EpochResult:
        data = self._partitioned(df)
        if not any(s.commits_from_data for s in self.sinks):
            return self.run_epoch(epoch, _spark.precommit_job(data), app_id=app_id)
        # The commit reads the rows again: keep this epoch's rows instead of
        # recomputing them (a recomputation after a crash is what the checksums catch).
        data = data.persist()
        try:
            return self.run_epoch(epoch, _spark.precommit_job(data), app_id=app_id, data=data)
        finally:
            data.unpersist()

    @final
    def run_epoch(
        self, epoch: int, precommit: Precommit, *, app_id: str, data: Any = None
    ) -> EpochResult:
        """Run the protocol for one epoch. ``precommit`` runs the partition tasks.

        ``data`` is the epoch's rows for sinks that commit from data (Kafka replay).

        1. Recover: commit a decided-but-uncommitted epoch; abort every prepared
           transaction no decision names (on the first call and after failures).
        2. Skip the epoch if it is already committed (Spark's replay).
        3. Pre-commit: every partition writes and prepares (``precommit``).
        4. Decide: create the epoch's decision record; the commit point.
        5. Commit every handle, finish the epoch, write the committed mark,
           abort the epoch's leftover attempts.
        """
        self._bind(app_id)
        timings: dict[str, float] = {}
        # Step 1
        t0 = time.monotonic()
        self._recover_if_needed(app_id, data=data, epoch=epoch)
        timings["recover"] = time.monotonic() - t0
        # Step 2
        if self._already_committed(epoch):
            self._log.bind(epoch=epoch).info("epoch already committed: replay skipped")
            return EpochResult(epoch, "skipped")
        try:
            # Step 3
            t0 = time.monotonic()
            round_ = self.log.claim_round(epoch)
            handles, rows = self._precommit(epoch, round_, precommit, app_id)
            timings["precommit"] = time.monotonic() - t0
            # Step 4
            t0 = time.monotonic()
            self._decide(epoch, round_, handles, rows, {"precommit": timings["precommit"]})
            timings["decide"] = time.monotonic() - t0
            # Step 5
            t0 = time.monotonic()
            self._commit(epoch, round_, handles, data)
            self._abort_leftovers(epoch, handles, app_id)
            self._last_committed = epoch
            self.log.prune(self.retain_epochs)
        except BaseException:
            # Whatever failed, the next call must look at the log and the targets
            # again before doing anything else (a decision may stand unfinished).
            self._needs_recovery = True
            raise
        timings["commit"] = time.monotonic() - t0
        count = sum(len(hs) for hs in handles.values())
        self._log.bind(epoch=epoch).info(
            "epoch committed: %d handles, rows %s, seconds %s",
            count,
            rows,
            {k: round(v, 3) for k, v in timings.items()},
        )
        return EpochResult(epoch, "committed", round_, rows, count, timings)

    # -- step 1: recover -----------------------------------------------------------------

    def _recover_if_needed(self, app_id: str, data: Any = None, epoch: int | None = None) -> None:
        self._bind(app_id)
        if not self._needs_recovery:
            return
        self._recover(app_id, data, epoch)
        self._needs_recovery = False

    def _recover(self, app_id: str, data: Any = None, current: int | None = None) -> None:
        """Step 1: the same plan and execution an operator's :meth:`recover` runs."""
        self._execute(self._plan(app_id), data, current)

    # -- recovery: plan ------------------------------------------------------------------

    def _plan(
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
                actions += self._plan_finish(decision, self.allow_non_restored_state)
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

    def _plan_finish(self, decision: EpochDecision, allow: bool) -> list[RecoveryAction]:
        """Commit every handle of a decided epoch, then mark it committed."""
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
        actions: list[RecoveryAction] = []
        handles = {s.uid: self._decided(decision, s.uid) for s in (*self.sinks, *self.retired)}
        for sink in self.sinks:
            mine = handles[sink.uid]
            if sink.commits_from_data and mine:
                actions.append(
                    RecoveryAction(
                        ActionKind.COMMIT_FROM_DATA, epoch, round_, sink.uid, None, why, mine
                    )
                )
            elif not sink.commits_from_data:
                actions += [
                    RecoveryAction(
                        ActionKind.COMMIT, epoch, round_, sink.uid, str(h.txn), why, (h,)
                    )
                    for h in mine
                ]
        for uid in missing:
            if uid in retired:
                actions += [
                    RecoveryAction(
                        ActionKind.ABORT_NOT_RESTORED,
                        epoch,
                        round_,
                        uid,
                        str(h.txn),
                        f"{why}, sink retired",
                        (h,),
                    )
                    for h in handles[uid]
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
        actions += [
            RecoveryAction(ActionKind.FINISH_EPOCH, epoch, round_, s.uid, handles=handles[s.uid])
            for s in self.sinks
        ]
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
        return self._plan_finish(decision, allow=True)

    def _plan_lingering(self, app_id: str, covered: set[str]) -> list[RecoveryAction]:
        """Every prepared transaction no pending decision covers: commit, or void + abort."""
        epochs = self.log.epochs()
        floor = epochs[0] if epochs else None
        decisions: dict[int, EpochDecision | None] = {}
        voided: set[tuple[int, int]] = set()
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
                    actions.append(self._abort_action(ActionKind.ABORT_PRUNED, sink, handle, why))
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
                    actions.append(self._abort_action(ActionKind.ABORT, sink, handle, why))
                elif name not in decision.txn_names():
                    why = f"an attempt decided epoch {txn.epoch} round {decision.round} did not use"
                    actions.append(self._abort_action(ActionKind.ABORT, sink, handle, why))
                elif retired and self._given_up(txn.epoch, sink.uid):
                    why = f"decided epoch {txn.epoch} committed without it (not restored)"
                    actions.append(
                        self._abort_action(ActionKind.ABORT_NOT_RESTORED, sink, handle, why)
                    )
                else:
                    # Commit what the decision recorded, never the listed stand-in:
                    # a listed handle may not carry everything commit needs.
                    (decided,) = [
                        h for h in self._decided(decision, sink.uid) if str(h.txn) == name
                    ]
                    actions.append(
                        RecoveryAction(
                            ActionKind.COMMIT,
                            txn.epoch,
                            txn.round,
                            sink.uid,
                            name,
                            f"decided epoch {txn.epoch}, still prepared",
                            (decided,),
                        )
                    )
        return actions

    def _given_up(self, epoch: int, uid: str) -> bool:
        record = self.log.committed(epoch)
        return record is not None and uid in record.not_restored

    @staticmethod
    def _abort_action(kind: ActionKind, sink: AnySink, handle: Handle, why: str) -> RecoveryAction:
        txn = handle.txn
        return RecoveryAction(kind, txn.epoch, txn.round, sink.uid, str(txn), why, (handle,))

    @staticmethod
    def _decided(decision: EpochDecision, uid: str) -> tuple[Handle, ...]:
        return tuple(load_handle(doc, sink_uid=uid) for doc in decision.handles.get(uid, []))

    # -- recovery: execute -------------------------------------------------------------

    def _execute(
        self, actions: list[RecoveryAction], data: Any = None, current: int | None = None
    ) -> list[RecoveryAction]:
        """Run a plan in order; returns what was done (a lost void changes the plan).

        ``data`` is the rows of epoch ``current`` when this runs inside its replay
        (sinks that commit from data need them). ``during_recovery`` fires after the
        first commit of each epoch finished, or after the first other commit or
        abort when no epoch needed finishing.
        """
        finishing = {a.epoch for a in actions if a.kind is ActionKind.MARK_COMMITTED}
        fired: set[int] = set()
        acted = bool(finishing)
        lost: dict[tuple[int, int], EpochDecision] = {}
        done: list[RecoveryAction] = []
        announced: set[int] = set()
        for planned in actions:
            if planned.epoch in finishing and planned.epoch not in announced:
                announced.add(planned.epoch)
                self._log.bind(epoch=planned.epoch).warning(
                    "recovery finishes decided epoch %d (round %s)", planned.epoch, planned.round
                )
            if planned.kind is ActionKind.VOID:
                done += self._void(planned, lost, data, current)
                continue
            action = self._run_action(
                planned, lost.get((planned.epoch, planned.round or 0)), data, current
            )
            done.append(action)
            if action.kind in _COMMITS and action.epoch in finishing:
                if action.epoch not in fired:
                    fired.add(action.epoch)
                    self._fire(CrashPoint.DURING_RECOVERY, action.epoch)
            elif action.kind in _TARGET_ACTIONS and not acted:
                acted = True
                self._fire(CrashPoint.DURING_RECOVERY, action.epoch)
        return done

    def _void(
        self,
        action: RecoveryAction,
        lost: dict[tuple[int, int], EpochDecision],
        data: Any,
        current: int | None,
    ) -> list[RecoveryAction]:
        """Void an undecided round; if a zombie decided it meanwhile, finish its epoch."""
        epoch, round_ = action.epoch, action.round or 0
        decision = self.log.void(epoch, round_, "aborted by recovery")
        if decision is None:
            return [action]
        lost[(epoch, round_)] = decision
        self._log.bind(epoch=epoch).warning("round %d was decided meanwhile: finishing it", round_)
        if self.log.committed(epoch) is not None:
            return []
        plan = self._plan_finish(decision, self.allow_non_restored_state)
        return self._execute(plan, data if epoch == current else None, current)

    def _run_action(
        self, action: RecoveryAction, lost: EpochDecision | None, data: Any, current: int | None
    ) -> RecoveryAction:
        """Do one planned step (never a void); returns what was done."""
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
        if kind in _ABORTS and lost is not None and action.txn in lost.txn_names():
            # Its round was decided between our scan and the void: commit, never abort.
            (decided,) = [h for h in self._decided(lost, sink.uid) if str(h.txn) == action.txn]
            action = RecoveryAction(
                ActionKind.COMMIT,
                epoch,
                action.round,
                sink.uid,
                action.txn,
                "decided by another driver meanwhile",
                (decided,),
            )
            kind = action.kind
        if kind in _ABORTS:
            level = log.warning if kind is ActionKind.ABORT_NOT_RESTORED else log.info
            level("recovery aborts %s (%s)", action.txn, action.reason)
            sink.abort(action.handles[0])
        elif kind is ActionKind.COMMIT:
            log.warning("recovery commits decided transaction %s", action.txn)
            self._commit_one(sink, action.handles[0], epoch)
        elif kind is ActionKind.COMMIT_FROM_DATA:
            if epoch != current or data is None:
                raise CommitError(
                    f"epoch {epoch} is decided, and sink {sink.uid} commits it by reading its "
                    "rows again, which only the replay of that epoch provides: restart the "
                    "query from its checkpoint (Spark replays the epoch) to finish it",
                    sink_uid=sink.uid,
                    epoch=epoch,
                    phase="recover",
                )
            self._commit_from_data(sink, data, epoch, list(action.handles))
        elif kind is ActionKind.FINISH_EPOCH:
            sink.finish_epoch(epoch, list(action.handles))
        return action

    def _sink(self, uid: str | None) -> AnySink:
        for sink in (*self.sinks, *self.retired):
            if sink.uid == uid:
                return sink
        raise ValueError(f"no sink {uid!r} in this coordinator")  # plans name only ours

    # -- step 2: skip ----------------------------------------------------------------

    def _already_committed(self, epoch: int) -> bool:
        if self._last_committed is None:
            self._last_committed = self.log.last_committed()
        last = self._last_committed
        if last is not None and epoch < last:
            raise CheckpointMismatchError(
                f"epoch {epoch} was asked for, but the txsink log at {self.log.location} has "
                f"already committed epoch {last}: the Spark checkpoint was reset or restored "
                "from an older copy while the txsink log was kept (or write() was given an "
                "epoch lower than the log's last), so epoch numbers no longer name the same "
                "rows. Restore the matching checkpoint, or start the query with a new "
                "checkpoint AND a new txsink log (and a new output folder or sink uid)",
                epoch=epoch,
            )
        if last is not None and epoch > last + 1:
            self._log.bind(epoch=epoch).warning(
                "the txsink log's last committed epoch is %d: epochs in between were not "
                "written through this log",
                last,
            )
        return self.log.committed(epoch) is not None

    # -- step 3: pre-commit ------------------------------------------------------------

    def _precommit(
        self, epoch: int, round_: int, precommit: Precommit, app_id: str
    ) -> tuple[dict[str, list[Handle]], dict[str, int]]:
        plan = TaskPlan(
            app_id, epoch, round_, self.sinks, self.faults, os.getpid(), socket.gethostname()
        )
        try:
            acks = precommit(plan)
            errors = [a.error for a in acks if a.error is not None]
            if errors:
                first = errors[0]
                raise EpochAbortedError(
                    f"epoch {epoch} aborted, nothing of it is visible: {first.message}",
                    causes=errors,
                    sink_uid=first.sink_uid,
                    epoch=epoch,
                    partition=first.partition,
                    phase="precommit",
                    connector=first.connector,
                    row=first.row,
                    column=first.column,
                )
            handles, rows = self._collect(epoch, acks)
        except BaseException as err:
            self._needs_recovery = True
            self._abort_round(epoch, round_, app_id)
            if isinstance(err, EpochAbortedError) or not isinstance(err, Exception):
                raise
            context = err.context if isinstance(err, TxsinkError) else {"epoch": epoch}
            causes = [err] if isinstance(err, TxsinkError) else []
            summary = err.message if isinstance(err, TxsinkError) else _first_line(err)
            raise EpochAbortedError(
                f"epoch {epoch} aborted, nothing of it is visible: {summary}",
                causes=causes,
                **context,
            ) from err
        self._fire(CrashPoint.BEFORE_DECISION, epoch)
        return handles, rows

    def _collect(
        self, epoch: int, acks: Iterable[Ack]
    ) -> tuple[dict[str, list[Handle]], dict[str, int]]:
        """Check every (sink, partition) acked exactly once; load the handles."""
        handles: dict[str, list[Handle]] = {s.uid: [] for s in self.sinks}
        rows: dict[str, int] = {s.uid: 0 for s in self.sinks}
        seen: set[tuple[str, int]] = set()
        for ack in acks:
            key = (ack.sink, ack.partition)
            if ack.sink not in handles or key in seen:
                raise EpochAbortedError(
                    f"unexpected pre-commit ack {key} (unknown sink or duplicate partition)",
                    epoch=epoch,
                    sink_uid=ack.sink,
                    partition=ack.partition,
                )
            seen.add(key)
            if ack.handle is not None:
                handles[ack.sink].append(load_handle(ack.handle, sink_uid=ack.sink))
                rows[ack.sink] += ack.rows
        partitions = {p for _, p in seen}
        for sink in self.sinks:
            acked = {p for u, p in seen if u == sink.uid}
            if acked != partitions:
                raise EpochAbortedError(
                    f"sink {sink.uid} did not ack partitions {sorted(partitions - acked)}",
                    epoch=epoch,
                    sink_uid=sink.uid,
                )
        return handles, rows

    def _abort_round(self, epoch: int, round_: int, app_id: str) -> None:
        """Abort every transaction of this round; void it so it can never be decided."""
        decision = self.log.void(epoch, round_, "pre-commit failed")
        if decision is not None:  # cannot happen: only this driver holds the round
            raise FencedError(f"round {round_} of epoch {epoch} was decided meanwhile", epoch=epoch)
        for sink in self.sinks:
            for handle in list(sink.list_prepared(app_id)):
                if handle.txn.epoch == epoch and handle.txn.round == round_:
                    try:
                        sink.abort(handle)
                    except Exception as err:  # recovery will retry it
                        self._log.bind(uid=sink.uid, epoch=epoch).warning(
                            "could not abort %s: %s", handle.txn, err
                        )

    # -- step 4: decide ----------------------------------------------------------------

    def _decide(
        self,
        epoch: int,
        round_: int,
        handles: dict[str, list[Handle]],
        rows: dict[str, int],
        seconds: dict[str, float] | None = None,
    ) -> None:
        from txsink.handles import dump_handle

        for earlier in range(round_):
            if self.log.void(epoch, earlier, f"superseded by round {round_}") is not None:
                self._lost(epoch, round_, handles, f"round {earlier} was decided by another driver")
        docs = {uid: [dump_handle(h) for h in hs] for uid, hs in handles.items()}
        stats: dict[str, Any] = {"rows": rows}
        if seconds:
            stats["seconds"] = {k: round(v, 6) for k, v in seconds.items()}
        if not self.log.decide(epoch, round_, docs, stats):
            self._lost(epoch, round_, handles, f"round {round_} was voided by another driver")
        self._fire(CrashPoint.AFTER_DECISION, epoch)

    def _lost(self, epoch: int, round_: int, handles: dict[str, list[Handle]], why: str) -> None:
        self._needs_recovery = True
        for sink in self.sinks:
            for handle in handles[sink.uid]:
                sink.abort(handle)
        raise FencedError(
            f"this driver lost epoch {epoch} (its round {round_}): {why}. Its transactions "
            "were aborted; the other driver's decision stands. Another query is writing "
            "with the same txsink log: stop one of them",
            epoch=epoch,
            phase="decide",
        )

    # -- step 5: commit --------------------------------------------------------------

    def _commit(
        self, epoch: int, round_: int, handles: dict[str, list[Handle]], data: Any = None
    ) -> None:
        try:
            first = True
            for sink in self.sinks:
                if sink.commits_from_data:
                    self._commit_from_data(sink, data, epoch, handles[sink.uid])
                    if first:
                        first = False
                        self._fire(CrashPoint.DURING_COMMIT, epoch)
                    continue
                for handle in handles[sink.uid]:
                    self._commit_one(sink, handle, epoch)
                    if first:
                        first = False
                        self._fire(CrashPoint.DURING_COMMIT, epoch)
            for sink in self.sinks:
                sink.finish_epoch(epoch, handles[sink.uid])
            self._fire(CrashPoint.AFTER_COMMIT_BEFORE_MARK, epoch)
            self.log.mark_committed(epoch, round_)
        except BaseException:
            # The decision stands; the next run's recovery finishes the commit.
            self._needs_recovery = True
            raise

    def _commit_one(self, sink: AnySink, handle: Handle, epoch: int) -> None:
        try:
            sink.commit(handle)
        except TxsinkError as err:
            err.with_context(
                sink_uid=sink.uid, epoch=epoch, phase="commit", connector=sink.connector
            )
            raise
        except Exception as err:
            raise CommitError(
                f"commit of {handle.txn} failed: {err!r}; the decision stands and recovery "
                "retries it on the next run",
                sink_uid=sink.uid,
                epoch=epoch,
                partition=handle.txn.partition,
                phase="commit",
                connector=sink.connector,
            ) from err

    def _commit_from_data(
        self, sink: AnySink, data: Any, epoch: int, handles: list[Handle]
    ) -> None:
        if not handles:
            return
        try:
            sink.commit_from_data(data, epoch, handles)
        except TxsinkError as err:
            err.with_context(
                sink_uid=sink.uid, epoch=epoch, phase="commit", connector=sink.connector
            )
            raise

    def _abort_leftovers(self, epoch: int, handles: dict[str, list[Handle]], app_id: str) -> None:
        """Abort this epoch's transactions from attempts whose result was not used."""
        decided = {str(h.txn) for hs in handles.values() for h in hs}
        for sink in self.sinks:
            for handle in list(sink.list_prepared(app_id)):
                if handle.txn.epoch == epoch and str(handle.txn) not in decided:
                    self._log.bind(uid=sink.uid, epoch=epoch).info(
                        "aborting leftover attempt %s", handle.txn
                    )
                    sink.abort(handle)

    # -- helpers ---------------------------------------------------------------------

    def _restore_once(self) -> None:
        """Fill an empty log from ``from_savepoint`` (once per coordinator)."""
        if self._restored or self.from_savepoint is None:
            return
        from txsink.savepoint import restore_if_empty

        if restore_if_empty(self.from_savepoint, self.log):
            self._log.info("restored the txsink log from savepoint %s", self.from_savepoint)
        self._restored = True

    def _bind(self, app_id: str) -> None:
        if self._bound_app != app_id:
            self._restore_once()
            self.log.bind_app(app_id)
            self._bound_app = app_id
            self._last_committed = None
            self._needs_recovery = True

    def _app_from_log(self) -> str:
        self._restore_once()
        meta = self.log.meta()
        if meta is None:
            raise ConfigurationError(
                f"the txsink log at {self.log.location} is empty and no app_id was given: "
                "pass app_id=... for a one-shot write"
            )
        return str(meta["app_id"])

    def _partitioned(self, df: DataFrame) -> DataFrame:
        """Repartition as the sinks require (upsert keys, Kafka shards), if any."""
        wanted = {s.required_partitioning() for s in self.sinks} - {None}
        if not wanted:
            return df
        if len(wanted) > 1:
            raise ConfigurationError(
                f"sinks of one coordinator need different partitioning {sorted(map(str, wanted))}: "
                "use the same key (and shard count) for all of them, or separate coordinators"
            )
        part = wanted.pop()
        if part is None:  # pragma: no cover - removed above
            return df
        if part.num_partitions is not None:
            return df.repartition(part.num_partitions, *part.columns)
        return df.repartition(*part.columns)

    def _check_schema(self, df: DataFrame, app_id: str) -> None:
        schema = _spark.arrow_schema(df)
        if self._checked_schema is not None and schema.equals(self._checked_schema):
            return
        for sink in self.sinks:
            try:
                sink.check(schema, app_id)
            except TxsinkError as err:
                err.with_context(sink_uid=sink.uid, phase="check", connector=sink.connector)
                raise
        self._checked_schema = schema

    def _fire(self, point: CrashPoint, epoch: int) -> None:
        if self.faults is not None:
            self.faults.fire(point, epoch=epoch)

    def __repr__(self) -> str:
        return f"Coordinator(sinks={list(self.sinks)!r}, log={self.log.location!r})"


def _first_line(err: BaseException) -> str:
    """A one-line summary; Spark's own messages carry a JVM stack trace after the first line."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:500]
