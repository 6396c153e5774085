"""How an epoch's rows are laid out in tasks before the pre-commit job.

Two inputs decide it: the partitioning the sinks need (rows of one upsert key in one task,
one task per shard: :meth:`~txsink.contract.SinkContract.required_partitioning`), and the
coordinator's ``max_tasks``, an upper bound on the epoch's task count.

Why a bound: every pre-commit task pays a fixed cost (a Python worker's hand-over, a
connection or a producer, a file per task for a table), and a stream read from many
input partitions runs its epoch in many small tasks, in waves on a small cluster. A
``coalesce`` (no shuffle) to the number of task slots keeps every slot busy with fewer,
larger tasks: fewer prepared transactions per epoch, fewer and larger files in a table.
It cannot run in a barrier stage (sinks that commit in their tasks), and it would break
a fixed task count a sink asks for, so both are refused when the coordinator is built.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from txsink.contract import Partitioning, SinkContract
from txsink.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from txsink.observe.logs import EpochLogger

__all__ = [
    "SLOT_WAIT_S",
    "MaxTasks",
    "check_max_tasks",
    "check_single_pass",
    "laid_out",
    "required_partitioning",
    "resolve_max_tasks",
    "task_slots",
]

#: An upper bound on an epoch's task count: a number, ``"slots"`` (the task slots the
#: cluster runs at once, read at each epoch), None (the DataFrame's own partitions), or
#: ``"auto"``: ``"slots"`` when every sink prefers fewer tasks
#: (:attr:`~txsink.contract.SinkContract.fewer_tasks`: tables), else None.
MaxTasks: TypeAlias = int | Literal["slots", "auto"] | None


def resolve_max_tasks(
    max_tasks: MaxTasks, sinks: Sequence[SinkContract[Any, Any]]
) -> int | Literal["slots"] | None:
    """``max_tasks`` with ``"auto"`` decided for these sinks (checked: :func:`check_max_tasks`)."""
    if max_tasks != "auto":
        return max_tasks
    if all(s.fewer_tasks for s in sinks) and not any(_refuses(s) for s in sinks):
        return "slots"
    return None


def _refuses(sink: SinkContract[Any, Any]) -> bool:
    part = sink.required_partitioning()
    return sink.commits_in_task or (part is not None and part.num_partitions is not None)


def check_max_tasks(max_tasks: MaxTasks, sinks: Sequence[SinkContract[Any, Any]]) -> None:
    """Refuse, when the coordinator is built, a ``max_tasks`` its sinks cannot run with."""
    if max_tasks is None or max_tasks == "auto":
        return
    if max_tasks != "slots" and (
        not isinstance(max_tasks, int) or isinstance(max_tasks, bool) or max_tasks < 1
    ):
        raise ValueError(
            f"max_tasks must be an int >= 1, 'slots', 'auto' or None, got {max_tasks!r}"
        )
    for sink in sinks:
        if sink.commits_in_task:
            raise ConfigurationError(
                "max_tasks cannot apply to a sink that commits in its tasks: its epoch is one "
                "barrier stage, where Spark cannot coalesce(). Drop max_tasks and "
                "repartition the stream by key columns before the sink (df.repartition(n, 'key'): "
                "a round-robin repartition(n) would deal a replay's rows differently)",
                sink_uid=sink.uid,
                phase="check",
            )
        part = sink.required_partitioning()
        if part is not None and part.num_partitions is not None:
            raise ConfigurationError(
                f"max_tasks cannot apply: this sink needs exactly {part.num_partitions} tasks "
                "per epoch (one per shard). Drop max_tasks, or use a separate coordinator for "
                "this sink",
                sink_uid=sink.uid,
                phase="check",
            )


def required_partitioning(wanted: Iterable[Partitioning | None]) -> Partitioning | None:
    """The one partitioning the sinks need (None: any), checked: the sinks agree (their
    columns are checked against each epoch's DataFrame by
    :func:`~txsink.spark.checks.check_columns`)."""
    parts = set(wanted) - {None}
    if len(parts) > 1:
        raise ConfigurationError(
            f"sinks of one coordinator need different partitioning {sorted(map(str, parts))}: "
            "use the same key (and shard count) for all of them, or separate coordinators",
            phase="check",
        )
    return parts.pop() if parts else None


def task_slots(session: Any) -> int | None:
    """How many tasks the cluster runs at once now; None where Spark does not tell
    (Spark Connect: no SparkContext)."""
    try:
        jsc = session.sparkContext._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # Spark Connect, or a Spark without these
        return None


def laid_out(
    df: DataFrame,
    part: Partitioning | None,
    max_tasks: int | Literal["slots"] | None = None,
) -> DataFrame:
    """``df`` partitioned as the sinks require (``part``: upsert keys, shards; from
    :func:`required_partitioning`), then coalesced to at
    most ``max_tasks`` tasks (``"slots"``: the cluster's task slots; left alone where they
    are unknown or none are up). A coalesce never adds partitions or shuffles rows, and
    keeps the rows of one key together."""
    if part is not None:
        df = (
            df.repartition(part.num_partitions, *part.columns)
            if part.num_partitions is not None
            else df.repartition(*part.columns)
        )
    bound = task_slots(df.sparkSession) if max_tasks == "slots" else max_tasks
    if bound is None or bound < 1:
        return df
    return df.coalesce(bound)


#: How long a single-pass epoch on a cluster waits for task slots to come back (an executor
#: lost and started again just before it) before it refuses to run.
SLOT_WAIT_S = 60.0


def check_single_pass(
    df: DataFrame,
    sink_uid: str,
    connect: bool,
    *,
    log: EpochLogger | None = None,
    wait_s: float = SLOT_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Refuse, before the job, a single-pass epoch Spark cannot run all at once; the
    epoch's partition count (1 where Spark does not tell: ``connect``, Spark Connect).

    A barrier stage needs a task slot for each of its partitions at the same time, and no
    dynamic allocation; Spark itself would retry the slot check for minutes
    (``spark.scheduler.barrier.maxConcurrentTasksCheck.*``) before failing. On a cluster,
    missing slots are first waited for up to ``wait_s``: right after an executor was lost
    (the epoch before failed with it), its worker is starting it again.
    """
    session = df.sparkSession
    if str(session.conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        raise ConfigurationError(
            "a sink of this coordinator commits in its tasks (a single-pass epoch: one "
            "barrier stage), which Spark cannot run with dynamic allocation: set "
            "spark.dynamicAllocation.enabled=false, or use a mode that does not commit in "
            "the tasks",
            sink_uid=sink_uid,
            phase="check",
        )
    if connect:
        # No SparkContext, no RDD: the slots and the partitions are out of sight; Spark's
        # own barrier check (spark.scheduler.barrier.maxConcurrentTasksCheck.*) applies.
        return 1
    now = task_slots(session)
    try:
        partitions = int(df.rdd.getNumPartitions())
    except Exception:  # a Spark without these: Spark checks it itself
        return 1
    if now is None:
        return 1
    if partitions > now and not str(session.conf.get("spark.master", "")).startswith("local"):
        if log is not None:
            log.warning(
                "%d partitions, %d task slots: waiting up to %.0f s for executors",
                partitions,
                now,
                wait_s,
            )
        for _ in range(int(wait_s / 0.5)):
            sleep(0.5)
            now = task_slots(session) or now
            if partitions <= now:
                break
    if partitions > now:
        raise ConfigurationError(
            f"this epoch has {partitions} partitions, but the cluster runs {now} tasks at "
            "once, and a single-pass epoch (a sink that commits in its tasks) runs all of its "
            f"tasks together: repartition the stream to at most {now} partitions before "
            "the sink by key columns (df.repartition(n, 'key'): coalesce() cannot run in a "
            "barrier stage, and a round-robin repartition(n) deals a replay differently), read "
            "fewer input partitions, or add executors",
            sink_uid=sink_uid,
            phase="check",
        )
    return partitions
