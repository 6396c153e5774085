"""The single-pass epoch: pre-commit, decision and commit in one Spark stage.

For sinks whose prepared transaction lives in the task that opened it
(:attr:`~txsink.contract.SinkContract.commits_in_task`: a Kafka producer's transaction
cannot move to another process), Flink's model on Spark: the sink's own writer commits
once the checkpoint is complete. One barrier job (all tasks at once, or none)::

    task     write and prepare every sink (txsink.protocol.task.run_partition), holding the
             in-task sinks' transactions open; vote to the driver (txsink.protocol.votes)
    driver   when every task voted: before_decision, the decision (txsink.protocol.decide, the
             same record, rounds and voids as ever), after_decision; answer "commit"
    task     before_task_commit; commit_in_task for each held transaction; return
    driver   the coordinator's step 5 for what the tasks did not commit: the other
             sinks' handles, and any in-task handle whose task failed after the decision

A task that gets "abort", or no answer at all (the driver died, the connection
dropped), discards what it holds: nothing is visible, and if the decision was written
the driver (or the next run's recovery) commits the epoch from the decided handles. A
task without an answer also fails (so Spark stops the other tasks of the stage at once,
instead of their waiting for an answer until the vote timeout), naming the address.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa

from txsink.contract import EpochData, TaskInfo, TaskRunner
from txsink.errors import (
    ConfigurationError,
    EpochAbortedError,
    RetryableError,
    TxsinkError,
)
from txsink.handles import Handle, load_handle
from txsink.observe.logs import EpochLogger, get_logger
from txsink.protocol.decide import decide_epoch
from txsink.protocol.faults import CrashPoint
from txsink.protocol.log import TxLog
from txsink.protocol.rounds import OutageBound, RoundSteps
from txsink.protocol.rounds import run_in_rounds as rounds
from txsink.protocol.task import Ack, TaskPlan, collect_acks, discard_all, run_partition
from txsink.protocol.taskerror import carried, document, rebuild
from txsink.protocol.votes import COMMIT, DECIDED, NO_ANSWER, Vote, VoteService, cast_vote, ping

__all__ = [
    "SinglePassJob",
    "SinglePassOutcome",
    "probe_vote_service",
    "run_single_pass",
    "run_single_pass_in_rounds",
]

#: How long a task waits for the driver's answer before it gives up and aborts.
VOTE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class SinglePassJob:
    """The coordinator's step 3 when a sink commits in its tasks: the epoch's rows, and
    the driver address the tasks reach the vote service at."""

    data: EpochData
    host: str
    #: How many times a failed job is run again (a new round) before the epoch fails:
    #: Spark's task retries (a barrier result stage is never retried by Spark itself).
    retries: int = 0


#: How long the start-up check's tasks try to reach the vote service.
PROBE_TIMEOUT_S = 10.0


def probe_vote_service(tasks: TaskRunner, host: str, n: int, *, sink_uid: str) -> None:
    """Refuse, before a run's first single-pass epoch reads a row, executors that cannot
    reach the driver's vote service: ``n`` tasks (the epoch's partitions, as spread over
    the cluster as Spark places them) each connect and get an answer.

    Without this the first epoch would be written, every task would find no driver to
    vote to and abort, and the error would only say the epoch was not decided.
    """
    logger = get_logger(__name__, uid=sink_uid)
    with VoteService(host, lambda votes: None, log=logger) as service:
        probe = functools.partial(_probe, service.address, service.token)
        failures = [why for why in tasks.run(probe, list(range(n))) if why is not None]
    if failures:
        address = f"{host}:{service.address[1]}"
        raise ConfigurationError(
            f"{len(failures)} of {n} tasks could not reach the driver's vote service at "
            f"{address} ({failures[0]}): a sink of this coordinator commits in its tasks (a "
            "single-pass epoch), and every task votes to the driver. Set spark.driver.host to "
            "an address the executors reach (and spark.driver.bindAddress if the driver "
            "binds another), let the executors connect to the driver on any port (the "
            "service takes a free one), or use a mode that does not commit in the tasks",
            sink_uid=sink_uid,
            phase="check",
        )


def _probe(address: tuple[str, int], token: str, item: int) -> str | None:
    return ping(address, token, timeout_s=PROBE_TIMEOUT_S)


@dataclass(frozen=True)
class _TaskResult:
    acks: list[Ack]
    committed: list[str]  # sink uids whose transaction this task committed
    answer: str


@dataclass
class SinglePassOutcome:
    """What the single-pass job did: the decided handles and rows (when decided), and
    which in-task handles their tasks committed (by transaction name)."""

    decided: bool = False
    #: The Spark job failed (a task or executor lost), as opposed to the driver's side.
    job_failed: bool = False
    handles: dict[str, list[Handle]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    committed: set[str] = field(default_factory=set)
    seconds: dict[str, float] = field(default_factory=dict)


def run_single_pass(
    *,
    log: TxLog,
    plan: TaskPlan,
    data: EpochData,
    host: str,
    fire: Callable[[CrashPoint, int], None],
    logger: EpochLogger,
) -> SinglePassOutcome:
    """Run epoch ``plan.epoch`` round ``plan.round`` as one barrier job; decide in between.

    Returns once the job ended with the epoch decided (some in-task handles may be
    uncommitted: the caller commits them from data). Raises the job's or the decision's
    failure otherwise; ``outcome.decided`` tells the caller, through the exception's
    ``txsink_single_pass`` attribute, whether the decision stands.
    """
    epoch, round_ = plan.epoch, plan.round
    outcome = SinglePassOutcome()
    started = time.monotonic()

    def on_votes(votes: list[Vote]) -> None:
        acks = [Ack(**ack) for vote in votes for ack in vote.acks]
        outcome.handles, outcome.rows = collect_acks(plan.sinks, epoch, acks)
        outcome.seconds["precommit"] = time.monotonic() - started
        fire(CrashPoint.BEFORE_DECISION, epoch)
        t0 = time.monotonic()
        decide_epoch(
            log,
            plan.sinks,
            epoch,
            round_,
            outcome.handles,
            rows=outcome.rows,
            seconds=dict(outcome.seconds),
            logger=logger,
            schema=plan.schema,
            rows_schema=plan.rows_schema,
        )
        outcome.decided = True
        outcome.seconds["decide"] = time.monotonic() - t0
        fire(CrashPoint.AFTER_DECISION, epoch)

    try:
        with VoteService(host, on_votes, log=logger) as service:
            to = _VoteTo(service.address, service.token, VOTE_TIMEOUT_S)
            try:
                results = data.map_partitions(
                    functools.partial(_single_pass_task, plan, to), barrier=True
                )
            except BaseException as err:
                outcome.job_failed = service.failure is None
                voted = _voted_error(service, err)
                if voted is not None:
                    raise voted from err
                raise
    except BaseException as failed:
        failed.txsink_single_pass = outcome  # type: ignore[attr-defined]
        raise
    if service.failure is not None:  # the decision failed, or a fault fired around it
        service.failure.txsink_single_pass = outcome  # type: ignore[attr-defined]
        raise service.failure
    errors = [a.error for r in results for a in r.acks if a.error is not None]
    if not outcome.decided:
        aborted = (
            EpochAbortedError.of(epoch, errors)
            if errors
            else EpochAbortedError(
                f"epoch {epoch} was not decided: the single-pass job ended without every "
                "task's vote (a task failed before voting, or the stage was retried)",
                epoch=epoch,
                phase="precommit",
            )
        )
        aborted.txsink_single_pass = outcome  # type: ignore[attr-defined]
        raise aborted
    names = {uid: {str(h.txn) for h in hs} for uid, hs in outcome.handles.items()}
    for result in results:
        for ack in result.acks:
            if ack.sink in result.committed and ack.handle is not None:
                name = _txn_name(ack)
                if name in names.get(ack.sink, ()):
                    outcome.committed.add(name)
    return outcome


def run_single_pass_in_rounds(
    round_: int,
    retries: int,
    *,
    outage_s: float = 0.0,
    run: Callable[[int], SinglePassOutcome],
    steps: RoundSteps,
    logger: EpochLogger,
    describe: Callable[[BaseException], str],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[int, SinglePassOutcome]:
    """``run(round)`` until one job ends decided; the round and its outcome
    (:func:`txsink.protocol.rounds.run_in_rounds`, the two-phase path's rounds too).

    A job that fails before the decision (a task, an executor lost, a target unreachable)
    runs again in a new round: at once, as often as Spark would retry a task (Spark never
    retries a failed barrier result stage); then, for up to ``outage_s`` seconds after the
    epoch's first failure, after pauses. A task's deterministic refusal is no failed job
    (it comes back in the votes): it aborts the epoch at once, as any other failure before
    the decision does. A job that fails after the decision returns its decided handles
    with nothing committed by tasks: the caller's step 5 commits them from the replay. A
    fenced driver, or a decision that stands without the job failing, raises.
    """

    def after_decision(r: int) -> SinglePassOutcome:
        try:
            return run(r)
        except BaseException as err:
            failed: SinglePassOutcome | None = getattr(err, "txsink_single_pass", None)
            if failed is None or not failed.decided or not _from_job(err):
                raise
            logger.warning(
                "a task failed after the decision (%s): its shards are committed "
                "from the epoch's replay",
                describe(err),
            )
            failed.committed = set()
            return failed

    return rounds(
        round_,
        run=after_decision,
        retry=_from_job,
        steps=steps,
        bound=OutageBound(outage_s, clock, sleep),
        logger=logger,
        describe=describe,
        retries=retries,
        stands=_decided,
    )


def _from_job(err: BaseException) -> bool:
    """The barrier job failed (a task raised, an executor was lost): not a refusal."""
    failed: SinglePassOutcome | None = getattr(err, "txsink_single_pass", None)
    return (
        failed is not None
        and failed.job_failed
        and isinstance(err, Exception)
        and not isinstance(err, ConfigurationError)
    )


def _decided(err: BaseException) -> bool:
    failed: SinglePassOutcome | None = getattr(err, "txsink_single_pass", None)
    return failed is not None and failed.decided


def _voted_error(service: VoteService, err: BaseException) -> TxsinkError | None:
    """The error a failed task's vote carried, when the job's failure ``err`` carries no
    txsink error of its own (a barrier stage's failure may tell only that a task failed);
    None otherwise."""
    if service.task_error is None or not isinstance(err, Exception) or carried(err) is not None:
        return None
    return rebuild(service.task_error)


def _txn_name(ack: Ack) -> str:
    return str(load_handle(ack.handle or {}, sink_uid=ack.sink).txn)


@dataclass(frozen=True)
class _VoteTo:
    """Where a task votes: the service's address and this epoch run's token."""

    address: tuple[str, int]
    token: str
    timeout_s: float


def _single_pass_task(
    plan: TaskPlan, to: _VoteTo, task: TaskInfo, batches: Iterator[pa.RecordBatch]
) -> _TaskResult:
    """One task of the single-pass job: prepare, vote, then commit or discard."""
    held: dict[str, Any] = {}
    vote = Vote(task.partition, task.attempt, task.tasks or 1)
    try:
        acks = run_partition(plan, task.partition, task.attempt, batches, held=held)
    except BaseException as err:
        # Tell the driver at once, so the other tasks are answered "abort" now; with the
        # error itself (type, message, context), not only its text.
        failed = Vote(
            **{
                **asdict(vote),
                "error": f"{type(err).__name__}: {err}",
                "carried": document(err, partition=task.partition, epoch=plan.epoch),
            }
        )
        with contextlib.suppress(Exception):
            cast_vote(to.address, to.token, failed, timeout_s=5.0)
        raise
    error = next((a.error for a in acks if a.error is not None), None)
    shown = [
        {
            "sink": a.sink,
            "partition": a.partition,
            "attempt": a.attempt,
            "handle": a.handle,
            "rows": a.rows,
            "nbytes": a.nbytes,
        }
        for a in acks
    ]
    vote = Vote(**{**asdict(vote), "acks": shown, "error": str(error) if error else None})
    answer, why = cast_vote(to.address, to.token, vote, timeout_s=to.timeout_s)
    if answer == NO_ANSWER:
        discard_all(plan, {}, held)
        # Fail the task: Spark then fails the barrier stage and stops the other tasks at
        # once, where a task returning would leave them waiting for an answer until the
        # vote timeout (the service answers when every task voted).
        raise RetryableError(
            f"partition {task.partition}: {why}; its transactions were aborted. The "
            f"executors must reach the driver at spark.driver.host ({to.address[0]}) on the "
            "free port its vote service takes for each epoch: set spark.driver.host to an "
            "address they reach, and let them connect to the driver's ports",
            epoch=plan.epoch,
            partition=task.partition,
            phase="vote",
        )
    log = get_logger(__name__, uid="+".join(s.uid for s in plan.sinks), epoch=plan.epoch)
    if answer != COMMIT:
        if answer != DECIDED and error is None:
            log.info(
                "partition %d: %s (%s); its transactions are aborted", task.partition, answer, why
            )
        discard_all(plan, {}, held)
        return _TaskResult(acks, [], answer)
    try:
        plan.fire(CrashPoint.BEFORE_TASK_COMMIT, task.partition)
    except BaseException:
        discard_all(plan, {}, held)  # the driver commits them from the decided handles
        raise
    committed: list[str] = []
    for sink in plan.sinks:
        txn = held.pop(sink.uid, None)
        if txn is None:
            continue
        try:
            sink.commit_in_task(txn)
        except Exception as err:  # the driver commits it from the decided handle
            log.warning(
                "partition %d: %s could not commit in the task (the driver finishes it): %s",
                task.partition,
                sink.uid,
                err if isinstance(err, TxsinkError) else repr(err),
            )
            with contextlib.suppress(Exception):
                sink.discard(txn)
            continue
        committed.append(sink.uid)
    return _TaskResult(acks, committed, answer)
