"""The protocol's steps for one epoch, over a set of sinks: Flink's two-phase commit on
micro-batches, and nothing of Spark.

:class:`EpochProtocol` holds what one coordinator knows between epochs (its log, its sinks,
the bound app, whether recovery must run first, the driver lease) and runs
:meth:`~EpochProtocol.run_epoch`: recover, skip, pre-commit (in rounds, or in a single
pass), decide, commit. It never sees a DataFrame: the pre-commit comes in as a callable
(:data:`~txsink.protocol.task.Precommit`) or a :class:`~txsink.protocol.singlepass.SinglePassJob`,
the epoch's rows for a commit that reads them again as :class:`~txsink.contract.EpochData`.
:class:`txsink.Coordinator` is this class with its Spark side and its operator side
(:class:`~txsink.spark.epoch.SparkEpochs`, :class:`~txsink.ops.operator.Operations`).

Replay edge cases this handles (the reason for each step):

* Spark re-runs the last batch after a crash with the same ``batch_id``: a committed epoch
  is skipped (step 2) and writes nothing.
* The driver dies after the decision: the next run commits the decided handles before
  anything else (step 1); the decision stands.
* The driver dies before the decision, or a task attempt fails, is retried or runs
  speculatively: those transactions are named by no decision and are aborted (step 1 at
  the next start, step 5 after each epoch).
* A zombie driver still runs an epoch another driver took over: rounds and voids in the
  log let only one of them decide (see :mod:`txsink.protocol.log`).
* The Spark checkpoint was reset or restored from an old copy while the log was kept:
  refused, because epoch numbers no longer mean the same rows.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, final

import pyarrow as pa

from txsink.contract import EpochData, SinkContract, TaskRunner
from txsink.errors import EpochAbortedError, FencedError
from txsink.handles import Handle
from txsink.metrics import Metrics
from txsink.observe.logs import EpochLogger, committed_text, get_logger
from txsink.observe.metering import Meter
from txsink.protocol import rounds as _rounds
from txsink.protocol.commit import commit_decided
from txsink.protocol.decide import decide_epoch
from txsink.protocol.faults import CrashPoint, FaultPlan
from txsink.protocol.lease import (
    DEFAULT_LEASE_S,
    LeaseKeeper,
    check_lease_s,
    default_lease_s,
)
from txsink.protocol.log import LogStore, TxLog, open_log
from txsink.protocol.plan import checkpoint_reset_error
from txsink.protocol.recovery import Recovery
from txsink.protocol.singlepass import (
    SinglePassJob,
    SinglePassOutcome,
    run_single_pass,
    run_single_pass_in_rounds,
)
from txsink.protocol.task import Precommit, TaskPlan, collect_acks
from txsink.protocol.taskerror import describe
from txsink.schema import SchemaChange
from txsink.txid import check_name

__all__ = ["AnySink", "EpochProtocol", "EpochResult", "checkpoint_reset_error"]

AnySink = SinkContract[Any, Any]
_TWO = "another query is writing with the same txsink log: stop one of them"


@dataclass(frozen=True)
class EpochResult:
    """What one epoch call returned (:meth:`~txsink.Coordinator.write`, ``run_epoch``):
    ``committed``, or ``skipped`` (already committed: a replay)."""

    epoch: int
    status: str
    round: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    handles: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class EpochProtocol:
    """One coordinator's protocol: its sinks, its log and what it learnt between epochs.

    The arguments are :class:`txsink.Coordinator`'s (which documents them), but for
    ``logger``: the name its records go under (``txsink.coordinator``, the name users know
    from the console line and filter on: docs/logging.md).
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
        metrics: Metrics | Sequence[Metrics] | None = None,
        outage_s: float | None = None,
        lease_s: float | None = None,
        logger: str = "txsink.coordinator",
    ) -> None:
        self.sinks = (sinks,) if isinstance(sinks, SinkContract) else tuple(sinks)
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
        self.outage_s = _rounds.outage_bound_s(outage_s)
        self._bound_app: str | None = None
        self._needs_recovery = True
        self._last_committed: int | None = None
        self._meter = Meter(metrics)
        self.lease_s = check_lease_s(lease_s)
        self._lease: LeaseKeeper | None = None
        self._log = get_logger(logger, uid="+".join(uids))
        self._recovery = self._new_recovery()
        #: sink uid -> the schema change the next epoch applies (:mod:`txsink.schema`);
        #: planned by the caller before :meth:`run_epoch`, recorded in the decision.
        self.schema_plan: dict[str, SchemaChange] = {}
        #: The rows' Arrow schema, set by the caller; recorded for the audit (decide_epoch).
        self.rows_schema: pa.Schema | None = None

    def _new_recovery(self) -> Recovery:
        return Recovery(
            self.log,
            self.sinks,
            self.retired,
            allow_non_restored_state=self.allow_non_restored_state,
            fire=self._fire,
            logger=self._log,
            meter=self._meter,
        )

    # -- before an epoch: what the side that feeds the epochs calls (txsink.spark.epoch) --

    def bind(self, app_id: str) -> None:
        """Epochs of app ``app_id`` from now on: the log is bound to it (refused if it is
        another app's), and recovery runs before the next epoch when the app changed."""
        if self._bound_app != app_id:
            self._restore_once()
            self.log.bind_app(app_id)
            self._bound_app = self._meter.app = app_id
            self._last_committed = None
            self._needs_recovery = True

    def start_run(
        self,
        app_id: str,
        trigger_s: float | None = None,
        renew: Callable[[], bool | None] | None = None,
    ) -> None:
        """A new query run of app ``app_id``: recovery runs first, and the driver lease is
        held for the run: its length from the query's trigger interval (``trigger_s``),
        renewed from a thread for as long as ``renew`` says the query runs (between epochs
        too: a long trigger interval). ``renew=None``: renewed at each epoch only (a
        process that cannot watch its query, as Spark Connect's server-side worker)."""
        self._needs_recovery = True
        lease = self._keeper(trigger_s)
        if self.lease_s is None:  # held before start(), when the trigger was unknown
            lease.lengthen(default_lease_s(trigger_s))
        if renew is not None:
            lease.keep_alive(renew)
        self.bind(app_id)

    def begin_write(self, app_id: str, epoch: int | None = None) -> int:
        """Before a one-off epoch (``write``): bound to ``app_id``, the lease held; the
        epoch to write: ``epoch``, or (``None``) the one after the log's last committed,
        once recovery ran."""
        self.bind(app_id)
        self._hold_lease()
        if epoch is not None:
            return epoch
        self._recover_if_needed(app_id)
        last = self.log.last_committed()
        return 0 if last is None else last + 1

    def use_tasks(self, tasks: TaskRunner) -> None:
        """Run the commits spread over the cluster (and recovery's) as ``tasks``: the
        query's Spark tasks while it runs; in-process otherwise."""
        self._recovery.tasks = tasks

    @property
    def tasks(self) -> TaskRunner:
        """What runs the commits spread over the cluster now (:meth:`use_tasks`)."""
        return self._recovery.tasks

    def epoch_logger(self, epoch: int) -> EpochLogger:
        """The coordinator's logger, bound to ``epoch``."""
        return self._log.bind(epoch=epoch)

    @final
    def run_epoch(
        self,
        epoch: int,
        precommit: Precommit | SinglePassJob,
        *,
        app_id: str,
        data: EpochData | None = None,
        tasks_round: int | None = None,
        tasks_seconds: float | None = None,
        replay: bool = True,
        replan: Callable[[], None] | None = None,
    ) -> EpochResult:
        """Run the protocol for one epoch. ``precommit`` runs the partition tasks; a
        :class:`~txsink.protocol.singlepass.SinglePassJob` runs steps 3 to 5 in one job for sinks
        that commit in their tasks (then step 5 here commits only what they did not).

        ``data`` is the epoch's rows for sinks that commit from data (Kafka replay).
        ``tasks_round``: the round the tasks prepared under before this call (the Data Source
        path, where recovery ran before them); claimed exactly, step 1 is not run again.
        ``tasks_seconds``: with ``tasks_round``, how long the tasks' pre-commit took as they
        timed it (``precommit`` here only collects their acks); ``None`` leaves the figure
        out rather than show the collection's ~0 ms.
        ``replay``: an already committed epoch is Spark's replay of its batch (a query);
        False for :meth:`write`, where it is the caller running a committed epoch again.
        ``replan``: plans :attr:`schema_plan` again once recovery changed the targets (a
        decided epoch it finished may have evolved a schema the plan compared against).

        1. Recover: commit a decided-but-uncommitted epoch; abort every prepared
           transaction no decision names (on the first call and after failures).
        2. Skip the epoch if it is already committed (Spark's replay).
        3. Pre-commit: every partition writes and prepares (``precommit``).
        4. Decide: create the epoch's decision record; the commit point.
        5. Commit every handle, finish the epoch, write the committed mark,
           abort the epoch's leftover attempts.

        First the driver lease is held (:mod:`txsink.protocol.lease`): a second live driver
        refuses here, before its recovery voids anything.
        """
        self.bind(app_id)
        self._hold_lease()
        timings: dict[str, float] = {}
        # Step 1
        t0 = time.monotonic()
        recovered = tasks_round is None and self._recover_if_needed(app_id, data, epoch)
        timings["recover"] = time.monotonic() - t0
        if recovered and replan is not None:
            replan()
        # Step 2
        if self._already_committed(epoch):
            self._log.bind(epoch=epoch).info(
                "already committed: Spark's replay skipped"
                if replay
                else "already committed: this epoch was committed before, nothing written"
            )
            self._meter.skipped({k: v for k, v in timings.items() if recovered})
            return EpochResult(epoch, "skipped")
        try:
            round_ = self.log.claim_round(epoch) if tasks_round is None else tasks_round
            if tasks_round is not None and not self.log.claim(epoch, tasks_round):
                raise FencedError(
                    f"round {round_} was claimed by another driver: {_TWO}", epoch=epoch
                )
            done: set[str] = set()
            self._meter.preparing(self.sinks)
            if isinstance(precommit, SinglePassJob):  # steps 3, 4 and most of 5
                round_, handles, rows, done = self._single_pass(
                    epoch, round_, precommit, timings, app_id
                )
            else:
                # Step 3
                t0 = time.monotonic()
                again = tasks_round is None
                round_, handles, rows = self._precommit(
                    epoch, round_, precommit, app_id, again=again
                )
                timings["precommit"] = time.monotonic() - t0
                if tasks_round is not None:  # the tasks ran before this call
                    timings.pop("precommit")
                    if tasks_seconds is not None:
                        timings["precommit"] = tasks_seconds
                # Step 4
                t0 = time.monotonic()
                known = {k: v for k, v in timings.items() if k == "precommit"}
                self._decide(epoch, round_, handles, rows, known)
                timings["decide"] = time.monotonic() - t0
            # Step 5
            t0 = time.monotonic()
            self._commit(epoch, round_, handles, data, done)
            self._recovery.abort_attempts(
                app_id, epoch, keep={str(h.txn) for hs in handles.values() for h in hs}
            )
            self._last_committed = epoch
            self.schema_plan = {}  # applied: the targets have the new schema now
            self.log.prune(self.retain_epochs)
        except BaseException:
            # Whatever failed, the next call must look at the log and the targets
            # again before doing anything else (a decision may stand unfinished).
            self._needs_recovery = True
            raise
        timings["commit"] = time.monotonic() - t0
        count = sum(len(hs) for hs in handles.values())
        shown = {k: v for k, v in timings.items() if recovered or k != "recover"}
        self._meter.finished(epoch, self.sinks, handles, rows, shown)
        self._log.bind(epoch=epoch).info(
            "committed: %s",
            committed_text(rows, shown),
            extra={"txsink_rows": rows, "txsink_seconds": timings, "txsink_handles": count},
        )
        return EpochResult(epoch, "committed", round_, rows, count, timings)

    # -- step 1: recover -----------------------------------------------------------------

    def _recover_if_needed(
        self, app_id: str, data: EpochData | None = None, epoch: int | None = None
    ) -> bool:
        """Recover if needed; whether recovery had anything to do."""
        self.bind(app_id)
        if not self._needs_recovery:
            return False
        # The same plan and execution an operator's recover() runs.
        done = self._recovery.execute(self._recovery.plan(app_id), data, epoch)
        self._needs_recovery = False
        return bool(done)

    # -- step 2: skip ----------------------------------------------------------------

    def _already_committed(self, epoch: int) -> bool:
        if self._last_committed is None:
            self._last_committed = self.log.last_committed()
        last = self._last_committed
        if last is not None and epoch < last:
            raise checkpoint_reset_error(self.log.location, epoch, last)
        if last is not None and epoch > last + 1:
            self._log.bind(epoch=epoch).warning(
                "the txsink log's last committed epoch is %d: epochs in between were not "
                "written through this log",
                last,
            )
        return self.log.committed(epoch) is not None

    # -- step 3: pre-commit ------------------------------------------------------------

    def _precommit(
        self, epoch: int, round_: int, precommit: Precommit, app_id: str, *, again: bool
    ) -> tuple[int, dict[str, list[Handle]], dict[str, int]]:
        """Step 3, in new rounds while a target is briefly unreachable (``again``: the
        tasks run here; :mod:`txsink.protocol.rounds`): the round, its handles and rows."""

        def run(r: int) -> tuple[dict[str, list[Handle]], dict[str, int]]:
            acks = precommit(self._plan(app_id, epoch, r))
            errors = [a.error for a in acks if a.error is not None]
            if errors:
                raise EpochAbortedError.of(epoch, errors)
            return collect_acks(self.sinks, epoch, acks)

        first = round_
        round_, (handles, rows) = _rounds.run_in_rounds(
            round_,
            run=run,
            retry=_rounds.transient if again else lambda err: False,
            steps=self._recovery.rounds(app_id, epoch),
            bound=_rounds.OutageBound(self.outage_s),
            logger=self._log.bind(epoch=epoch),
            describe=_rounds.describe,
        )
        self._needs_recovery |= round_ != first  # a voided round's aborts were best effort
        self._fire(CrashPoint.BEFORE_DECISION, epoch)
        return round_, handles, rows

    def _single_pass(
        self, epoch: int, round_: int, job: SinglePassJob, timings: dict[str, float], app_id: str
    ) -> tuple[int, dict[str, list[Handle]], dict[str, int], set[str]]:
        """Steps 3-4 in one job, in rounds
        (:func:`~txsink.protocol.singlepass.run_single_pass_in_rounds`)."""

        def run(r: int) -> SinglePassOutcome:
            plan = self._plan(app_id, epoch, r)
            return run_single_pass(
                log=self.log, plan=plan, data=job.data, host=job.host, fire=self._fire,
                logger=self._log,
            )  # fmt: skip

        first = round_
        round_, out = run_single_pass_in_rounds(
            round_,
            job.retries,
            outage_s=self.outage_s,
            run=run,
            steps=self._recovery.rounds(app_id, epoch),
            logger=self._log.bind(epoch=epoch),
            describe=describe,
        )
        self._needs_recovery |= round_ != first  # a voided round's aborts were best effort
        timings.update(out.seconds)
        return round_, out.handles, out.rows, out.committed

    def _plan(self, app_id: str, epoch: int, round_: int) -> TaskPlan:
        return TaskPlan(
            app_id, epoch, round_, self.sinks, self.faults, os.getpid(), socket.gethostname(),
            dict(self.schema_plan), self.rows_schema,
        )  # fmt: skip

    # -- step 4: decide ----------------------------------------------------------------

    def _decide(
        self,
        epoch: int,
        round_: int,
        handles: dict[str, list[Handle]],
        rows: dict[str, int],
        seconds: dict[str, float] | None = None,
    ) -> None:
        try:
            decide_epoch(
                self.log,
                self.sinks,
                epoch,
                round_,
                handles,
                rows=rows,
                seconds=seconds,
                logger=self._log,
                meter=self._meter,
                schema=self.schema_plan,
                rows_schema=self.rows_schema,
            )
        except FencedError:
            self._needs_recovery = True
            raise
        self._meter.decided(epoch)
        self._fire(CrashPoint.AFTER_DECISION, epoch)

    # -- step 5: commit --------------------------------------------------------------

    def _commit(
        self,
        epoch: int,
        round_: int,
        handles: dict[str, list[Handle]],
        data: EpochData | None = None,
        done: set[str] | None = None,
    ) -> None:
        """Step 5 (:func:`~txsink.protocol.commit.commit_decided`), then the committed mark."""
        try:
            commit_decided(
                self.sinks, epoch, handles, data=data, done=done or set(),
                first_visible=lambda: self._fire(CrashPoint.DURING_COMMIT, epoch),
                tasks=self._recovery.tasks, meter=self._meter,
                bound=_rounds.OutageBound(self.outage_s), logger=self._log.bind(epoch=epoch),
                log=self.log, round_=round_, schema=self.schema_plan,
            )  # fmt: skip
            self._fire(CrashPoint.AFTER_COMMIT_BEFORE_MARK, epoch)
            self.log.mark_committed(epoch, round_)
        except BaseException:
            # The decision stands; the next run's recovery finishes the commit.
            self._needs_recovery = True
            raise

    # -- helpers ---------------------------------------------------------------------

    def _fire(self, point: CrashPoint, epoch: int) -> None:
        if self.faults is not None:
            self.faults.fire(point, epoch=epoch)

    def _restore_once(self) -> None:
        """Fill an empty log before the first bind: nothing here; the Coordinator's
        operator side starts from a savepoint (:class:`~txsink.ops.operator.Operations`)."""

    # -- the driver lease ----------------------------------------------------------------

    def _keeper(self, trigger_s: float | None = None) -> LeaseKeeper:
        """This driver's lease keeper (made at first use: a coordinator that travelled to
        another process holds its own lease there)."""
        if self._lease is None:
            self._lease = LeaseKeeper(self.log, self.lease_s or default_lease_s(trigger_s))
        return self._lease

    def _lease_as(self, pid: int | None) -> None:
        """Hold the driver lease in the name of process ``pid`` from now on: the Data Source
        path, where planning and Spark's ``commit`` run in Python workers of the driver's JVM
        (each batch maybe another), and the lease is the Spark driver's
        (:func:`txsink.datasource.epoch.driver_pid`). ``None``: this process."""
        self._lease = LeaseKeeper(self.log, self.lease_s or DEFAULT_LEASE_S, pid=pid)

    def _hold_lease(self) -> None:
        """Acquire or renew this driver's lease (:class:`~txsink.errors.DriverLeaseError`
        while another live driver holds it; ``FencedError`` once it was taken over)."""
        self._keeper().hold()
