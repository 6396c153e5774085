"""Spark glue: the partition jobs every epoch runs, and the single pass's job.

Kept apart from the protocol so the coordinator can be driven without Spark, and
so connectors never import Spark: every job txsink runs (the pre-commit, a
connector's commit that reads the epoch again) goes through
:class:`SparkEpochData`. Classic PySpark and Spark Connect alike: every job is a
``mapInArrow`` + ``collect``; what Connect cannot see (the SparkContext's query id, the
query object through py4j, the cluster's task slots) is said at each function.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import pickle
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from txsink.contract import TaskInfo, TaskRunner
from txsink.errors import (
    ConfigurationError,
    InjectedFault,
    RetryableError,
    TxsinkError,
)
from txsink.protocol.singlepass import SinglePassJob, probe_vote_service
from txsink.protocol.taskerror import carried, failure_text, mark
from txsink.spark import versions as _versions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "SparkEpochData",
    "SparkTaskRunner",
    "driver_host",
    "failure_text",
    "settle_worker_heap",
    "task_retries",
]

R = TypeVar("R")
T = TypeVar("T")

_RESULT_SCHEMA = pa.schema([("partition", pa.int64()), ("result", pa.binary())])
_RESULT_DDL = "partition long, result binary"


@functools.cache
def _result_schema() -> Any:
    """:data:`_RESULT_DDL` as a ``StructType``: a DDL string costs a parse in the JVM on
    every job (~5 ms per epoch on the driver)."""
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    return StructType([StructField("partition", LongType()), StructField("result", BinaryType())])


def driver_host(df: DataFrame) -> str:
    """The address the executors reach the driver at (``spark.driver.host``)."""
    import socket

    host: str | None = df.sparkSession.conf.get("spark.driver.host", None)
    return host or socket.gethostname()


def task_retries(df: DataFrame) -> int:
    """How often Spark retries a failed task here: ``local[N,F]`` -> F - 1, ``local[N]`` ->
    0, a cluster -> ``spark.task.maxFailures`` - 1 (default 3)."""
    session = df.sparkSession
    master = str(session.conf.get("spark.master", ""))
    found = re.fullmatch(r"local\[[^,\]]+,\s*(\d+)\]", master)
    if found:
        return max(0, int(found[1]) - 1)
    if master.startswith("local"):
        return 0
    return max(0, int(session.conf.get("spark.task.maxFailures", "4") or 4) - 1)


def single_pass_job(
    df: DataFrame, data: DataFrame, parts: int, sink_uid: str, tasks: TaskRunner, *, probe: bool
) -> SinglePassJob:
    """The epoch as one single-pass job over its ``parts`` partitions, after
    :func:`~txsink.spark.layout.check_single_pass` (``probe``: check first that the
    executors reach the driver's vote service, once per query run). One pass: the rows
    are read once; only a failure after the decision reads them again (Spark's replay of
    the epoch, verified against the decision)."""
    host = driver_host(df)
    if probe:
        probe_vote_service(tasks, host, parts, sink_uid=sink_uid)
    return SinglePassJob(SparkEpochData(data), host, task_retries(df))


class SparkTaskRunner:
    """:class:`~txsink.contract.TaskRunner` on a Spark session: one task per item, in one
    job over ``range(n)`` in ``n`` partitions (``mapInArrow``: classic and Connect alike)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        if not items:
            return []
        n = len(items)
        frame = self.session.range(0, n, 1, n)
        job = frame.mapInArrow(functools.partial(_run_items, fn, list(items)), _result_schema())
        with _task_errors():
            return _results(job.collect())

    def __repr__(self) -> str:
        return "SparkTaskRunner"


#: Spark 4's cap on the bytes of one Arrow batch handed to a Python task (default 64MB,
#: :func:`txsink.spark.versions.arrow_byte_cap_setting`) is
#: checked after every row by measuring the batch being built: in a ``mapInArrow`` job
#: that is about half of the JVM's work of handing rows over (1M rows of the benchmarks'
#: order line: 1.1 -> 0.55 CPU-s). At Int.MaxValue Spark skips the check, as Spark 3.5 does
#: (it has no such cap): batches are then cut by ``spark.sql.execution.arrow.maxRecordsPerBatch``
#: (10,000 rows) alone. A value the user set is kept (wide rows: set it, or fewer records per
#: batch).
_NO_BYTE_CAP = str(2**31 - 1)


@contextlib.contextmanager
def arrow_batches_cut_by_rows(session: Any) -> Iterator[None]:
    """Within the block, Spark cuts the Arrow batches of txsink's own jobs by rows only,
    unless the session sets the byte cap itself (then that holds). Nothing to lift on a
    Spark without the cap (3.5)."""
    setting = _versions.arrow_byte_cap_setting()
    conf = session.conf
    if setting is None or conf.get(setting, None) is not None:
        yield
        return
    conf.set(setting, _NO_BYTE_CAP)
    try:
        yield
    finally:
        conf.unset(setting)


class SparkEpochData:
    """An epoch's DataFrame as :class:`~txsink.contract.EpochData`: one job, one task per
    partition, results pickled back to the driver.

    Alignment is the collect: it returns only when every partition task has finished,
    and holds exactly one result per partition (the attempt whose result the driver
    received).
    """

    def __init__(self, df: DataFrame) -> None:
        self.df = df

    def map_partitions(
        self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], R], *, barrier: bool = False
    ) -> list[R]:
        run = functools.partial(_run_task, task, barrier)
        try:
            with arrow_batches_cut_by_rows(self.df.sparkSession), _task_errors():
                job = self.df.mapInArrow(run, _result_schema(), barrier=barrier)
                return _results(job.collect())
        except Exception as err:
            if barrier and "BarrierJobUnsupportedRDDChainException" in str(err):
                raise ConfigurationError(
                    "the epoch's plan cannot run as one barrier stage (a single-pass epoch: "
                    "a sink commits in its tasks): it has a coalesce(), union() or another "
                    "step that changes the number of partitions within the stage. Use "
                    "repartition(n, 'key') instead of coalesce(n) before the sink (a shuffle ends "
                    "the stage), or a mode that does not commit in the tasks",
                    phase="check",
                ) from err
            raise


@contextlib.contextmanager
def _task_errors() -> Iterator[None]:
    """Around a job's collect: a task's error that failed the job (a Spark failure with
    the task's traceback as text) is raised as that txsink error, the Spark failure as
    its ``__cause__`` (:mod:`txsink.protocol.taskerror`)."""
    try:
        yield
    except Exception as err:
        found = carried(err)
        if found is None or found is err:
            raise
        raise found from err


def _results(rows: Iterable[Any]) -> list[Any]:
    """The tasks' pickled outcomes, in partition order; the first failure raised."""
    results: list[tuple[int, Any]] = []
    for row in rows:
        # Our own task pickled it, in this application: trusted input.
        ok, value = pickle.loads(row["result"])  # noqa: S301
        if not ok:
            raise value
        results.append((int(row["partition"]), value))
    return [value for _, value in sorted(results, key=lambda r: r[0])]


def _run_items(
    fn: Callable[[Any], Any], items: list[Any], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A :class:`SparkTaskRunner` task: ``fn`` over the items its ids name (one, usually).

    An item's index is no partition of the epoch: its errors get no context here (``fn``
    names its own: a Kafka shard's commit its shard)."""
    for batch in batches:
        for index in batch.column("id").to_pylist():
            yield _outcome(index, functools.partial(fn, items[index]), carry={})


def _run_task(
    task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], Any],
    barrier: bool,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    from pyspark import BarrierTaskContext, TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("a txsink partition task must run inside a Spark task")
    tasks = len(BarrierTaskContext.get().getTaskInfos()) if barrier else None
    info = TaskInfo(ctx.partitionId(), ctx.taskAttemptId(), tasks=tasks)
    outcome = _outcome(info.partition, lambda: task(info, batches))
    settle_worker_heap()
    yield outcome


#: ``TXSINK_WORKER_GC_FREEZE=off`` in the executors' environment: no :func:`settle_worker_heap`.
FREEZE_ENV = "TXSINK_WORKER_GC_FREEZE"


@functools.cache  # once per process
def settle_worker_heap() -> None:
    """Once per Python worker process, after its first txsink task: collect the garbage,
    then freeze what is left (:func:`gc.freeze`), so later collections skip it.

    Why: PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker,
    and a full collection walks every object the process holds. What a task imports stays:
    the row digest's compiled loops bring numba, and its object graph made that collection
    cost ~80 ms a task instead of ~7 (docs/benchmarks.md, the row digest). Frozen, those
    objects cost nothing a task. The price, once per process: an object alive now that later
    becomes cyclic garbage is never reclaimed (modules, the first task's plan).
    ``TXSINK_WORKER_GC_FREEZE=off`` in the executors' environment leaves the heap as it is."""
    if os.environ.get(FREEZE_ENV, "on") == "off":
        return
    gc.collect()
    gc.freeze()


def _outcome(
    partition: int, call: Callable[[], Any], carry: dict[str, Any] | None = None
) -> pa.RecordBatch:
    """One result row: ``call()``'s value, or the txsink error that fails the epoch.

    What the task raises instead carries itself to the driver (:func:`~txsink.protocol.taskerror.
    mark`), with ``carry`` as its context (default: this partition)."""
    context = {"partition": partition} if carry is None else carry
    try:
        outcome: tuple[bool, Any] = (True, call())
    except (RetryableError, InjectedFault) as err:
        raise mark(err, **context) from err.__cause__  # Spark retries the task attempt
    except TxsinkError as err:
        # Fatal for the epoch: no task retry can fix it, so it goes to the driver whole.
        outcome = (False, err.with_context(**context))
    except Exception as err:  # a gap in a connector: named on the driver all the same
        raise mark(err, **context) from err.__cause__
    return pa.RecordBatch.from_pydict(
        {"partition": [partition], "result": [pickle.dumps(outcome)]}, schema=_RESULT_SCHEMA
    )
