"""Spark glue: partition jobs, the query's identity, guard checks, the epoch's schema.

Kept apart from the protocol so the coordinator can be driven without Spark, and
so connectors never import Spark: every job txsink runs (the pre-commit, a
connector's commit that reads the epoch again) goes through
:class:`SparkEpochData`. Classic PySpark only (not Spark Connect): the
coordinator needs the SparkContext's local properties.
"""

from __future__ import annotations

import functools
import pickle
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from txsink._logging import one_line
from txsink.contract import Partitioning, TaskInfo
from txsink.errors import (
    ConfigurationError,
    InjectedFault,
    RetryableError,
    TxsinkError,
    UnsupportedQueryError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "SparkEpochData",
    "arrow_schema",
    "check_query_mode",
    "failure_text",
    "partitioned",
    "streaming_query_id",
]

R = TypeVar("R")

# Execution classes that break "one foreachBatch call = one replayable epoch".
_REFUSED_EXECUTIONS = {
    "AsyncProgressTrackingMicroBatchExecution": "async progress tracking",
    "ContinuousExecution": "a continuous trigger",
}
_RESULT_SCHEMA = pa.schema([("partition", pa.int64()), ("result", pa.binary())])
_RESULT_DDL = "partition long, result binary"
#: A Java exception's class name inside a JVM message ("org.apache.spark.SparkException: ").
_JAVA_CLASS = re.compile(r"\b(?:[a-z][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error): ")


def streaming_query_id(df: DataFrame) -> str | None:
    """The durable id of the streaming query running this foreachBatch call.

    It is stored in the checkpoint, so it survives restarts (unlike the run id).
    """
    try:
        sc = df.sparkSession.sparkContext
    except Exception as err:  # Spark Connect DataFrames have no SparkContext
        raise ConfigurationError(
            "txsink needs classic PySpark (a SparkContext); Spark Connect is not supported"
        ) from err
    return sc.getLocalProperty("sql.streaming.queryId")


def check_query_mode(df: DataFrame, query_id: str) -> None:
    """Refuse query settings that break the guarantee, before anything is written."""
    jsession = df.sparkSession._jsparkSession
    for jq in jsession.streams().active():
        if jq.id().toString() != query_id:
            continue
        name = jq.streamingQuery().getClass().getSimpleName()
        if name in _REFUSED_EXECUTIONS:
            raise UnsupportedQueryError(
                f"the streaming query {query_id} runs with {_REFUSED_EXECUTIONS[name]}, which "
                "does not replay a failed batch with the same id: txsink cannot be exactly-once. "
                "Remove that option (use a micro-batch trigger without "
                "asyncProgressTrackingEnabled)"
            )


def arrow_schema(df: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    tz = df.sparkSession.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(df.schema, timezone=tz)


def partitioned(df: DataFrame, wanted: Iterable[Partitioning | None]) -> DataFrame:
    """Repartition as the sinks require (upsert keys, Kafka shards), if any."""
    parts = set(wanted) - {None}
    if not parts:
        return df
    if len(parts) > 1:
        raise ConfigurationError(
            f"sinks of one coordinator need different partitioning {sorted(map(str, parts))}: "
            "use the same key (and shard count) for all of them, or separate coordinators"
        )
    part = parts.pop()
    if part is None:  # pragma: no cover - removed above
        return df
    if part.num_partitions is not None:
        return df.repartition(part.num_partitions, *part.columns)
    return df.repartition(*part.columns)


class SparkEpochData:
    """An epoch's DataFrame as :class:`~txsink.contract.EpochData`: one job, one task per
    partition, results pickled back to the driver.

    Alignment is the collect: it returns only when every partition task has finished,
    and holds exactly one result per partition (the attempt whose result the driver
    received).
    """

    def __init__(self, df: DataFrame) -> None:
        self.df = df

    def map_partitions(self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], R]) -> list[R]:
        job = self.df.mapInArrow(functools.partial(_run_task, task), _RESULT_DDL)
        results: list[tuple[int, R]] = []
        for row in job.collect():
            # Our own task pickled it, in this application: trusted input.
            ok, value = pickle.loads(row["result"])  # noqa: S301
            if not ok:
                raise value
            results.append((int(row["partition"]), value))
        return [value for _, value in sorted(results, key=lambda r: r[0])]


def _run_task(
    task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], Any],
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("a txsink partition task must run inside a Spark task")
    info = TaskInfo(ctx.partitionId(), ctx.taskAttemptId())
    try:
        outcome: tuple[bool, Any] = (True, task(info, batches))
    except (RetryableError, InjectedFault):
        raise  # Spark retries the task attempt
    except TxsinkError as err:
        # Fatal for the epoch: no task retry can fix it, so it goes to the driver whole.
        outcome = (False, err.with_context(partition=info.partition))
    yield pa.RecordBatch.from_pydict(
        {"partition": [info.partition], "result": [pickle.dumps(outcome)]}, schema=_RESULT_SCHEMA
    )


def failure_text(err: BaseException) -> str | None:
    """One line for a failed Spark call: the JVM exception's own message (not py4j's "An
    error occurred while calling o73.collectToPython"), without Java class names, cut at a
    word. ``None`` when ``err`` carries no JVM exception."""
    java = getattr(err, "java_exception", None)
    if java is None:
        return None
    try:
        message = str(java.getMessage() or java.toString())
    except Exception:  # the JVM is gone: nothing better to say than py4j's own text
        return None
    return "Spark job failed: " + one_line(_JAVA_CLASS.sub("", message), 300)
