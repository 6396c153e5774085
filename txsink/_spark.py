"""Spark glue: the pre-commit job, the query's identity, and guard checks.

Kept apart from the protocol so the coordinator can be driven without Spark.
Classic PySpark only (not Spark Connect): the coordinator needs the
SparkContext's local properties and runs a Python function in every task.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from txsink._task import (
    ACK_SCHEMA_DDL,
    Ack,
    TaskPlan,
    acks_from_batch,
    acks_to_batch,
    run_partition,
)
from txsink.errors import ConfigurationError, UnsupportedQueryError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

__all__ = ["arrow_schema", "check_query_mode", "precommit_job", "streaming_query_id"]

# Execution classes that break "one foreachBatch call = one replayable epoch".
_REFUSED_EXECUTIONS = {
    "AsyncProgressTrackingMicroBatchExecution": "async progress tracking",
    "ContinuousExecution": "a continuous trigger",
}


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


def _map_partition(plan: TaskPlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("txsink pre-commit must run inside a Spark task")
    yield acks_to_batch(run_partition(plan, ctx.partitionId(), ctx.taskAttemptId(), batches))


def precommit_job(df: DataFrame) -> Callable[[TaskPlan], list[Ack]]:
    """The pre-commit step as one Spark job over ``df``'s partitions.

    Alignment is the collect: it returns only when every partition task has
    acked, and holds exactly one result per partition (the attempt whose
    result the driver received); other attempts' transactions are aborted by
    the coordinator.
    """

    def run(plan: TaskPlan) -> list[Ack]:
        job = df.mapInArrow(functools.partial(_map_partition, plan), ACK_SCHEMA_DDL)
        return acks_from_batch(row.asDict() for row in job.collect())

    return run
