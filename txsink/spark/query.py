"""The streaming query behind a ``foreachBatch`` call: its durable id, whether it runs
under Spark Connect, the settings that break the guarantee (refused), its trigger, and
whether it still runs (for the driver lease's renewal).

Classic PySpark sees the query through the SparkContext and py4j; Spark Connect's
``foreachBatch`` sees none of it, which each function says. :func:`identify` asks all of it
at once, once per query run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.errors import UnsupportedQueryError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "QueryBatch",
    "check_query_mode",
    "identify",
    "is_connect",
    "query_active_probe",
    "streaming_query_id",
    "trigger_interval_s",
]

# Execution classes that break "one foreachBatch call = one replayable epoch".
_REFUSED_EXECUTIONS = {
    "AsyncProgressTrackingMicroBatchExecution": "async progress tracking",
    "ContinuousExecution": "a continuous trigger",
}


@dataclass(frozen=True)
class QueryBatch:
    """What one ``foreachBatch`` call tells of its query.

    ``query_id``: the durable id (``None`` outside a query and under Spark Connect);
    ``connect``: a Spark Connect DataFrame; ``new_run``: the first batch of a query run in
    this process (its mode checked), with the run's ``trigger_s`` and ``active`` probe
    (:func:`trigger_interval_s`, :func:`query_active_probe`).
    """

    query_id: str | None
    connect: bool
    new_run: bool = False
    trigger_s: float | None = None
    active: Callable[[], bool | None] | None = None


def identify(df: DataFrame, known: set[str]) -> QueryBatch:
    """The query of this batch; for a query id not in ``known`` (a new run), its mode is
    checked (:func:`check_query_mode`) and its trigger and probe read."""
    query_id, connect = streaming_query_id(df), is_connect(df)
    if query_id is None or query_id in known:
        return QueryBatch(query_id, connect)
    check_query_mode(df, query_id)
    trigger, active = trigger_interval_s(df, query_id), query_active_probe(df, query_id)
    return QueryBatch(query_id, connect, True, trigger, active)


def is_connect(df: DataFrame) -> bool:
    """Whether ``df`` is a Spark Connect DataFrame (in Connect's ``foreachBatch`` process,
    or a client's), rather than a classic one with a SparkContext behind it."""
    return type(df).__module__.startswith("pyspark.sql.connect.")


def streaming_query_id(df: DataFrame) -> str | None:
    """The durable id of the streaming query running this foreachBatch call.

    It is stored in the checkpoint, so it survives restarts (unlike the run id). ``None``
    outside a query, and always under Spark Connect: its ``foreachBatch`` gets a DataFrame
    of a session cloned for the batch, which has no SparkContext and lists no active query
    (checked against a real Connect server in integration/test_connect.py), so a
    coordinator there needs ``app_id=``.
    """
    if is_connect(df):
        return None
    query_id: str | None = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    return query_id


def check_query_mode(df: DataFrame, query_id: str) -> None:
    """Refuse query settings that break the guarantee, before anything is written.

    Classic PySpark only (the query object through py4j). Under Spark Connect it is not
    needed for ``foreachBatch``: Spark itself refuses both at ``start()`` ("'foreachBatch'
    is not supported with continuous trigger"; "Sink ForeachBatchSink does not support
    async progress tracking"), which integration/test_connect.py checks.
    """
    if is_connect(df):
        return
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


def _running_query(df: DataFrame, query_id: str) -> Any:
    """The JVM's running query ``query_id`` (its ``StreamExecution``), ``None`` once stopped.

    Inside ``foreachBatch``, ``df.sparkSession`` is the stream's own *clone* of the user's
    session, whose ``streams`` lists no query at all; the registry every clone shares
    (``SharedState.activeStreamingQueries``, Spark's own guard against two runs of one
    query in an application) has it. Raises on a Spark without it."""
    jvm = df.sparkSession._jvm
    if jvm is None:
        raise RuntimeError("no JVM behind this session")
    shared = df.sparkSession._jsparkSession.sharedState()
    return shared.activeStreamingQueries().get(jvm.java.util.UUID.fromString(query_id))


def trigger_interval_s(df: DataFrame, query_id: str) -> float | None:
    """The streaming query's processing-time trigger interval in seconds (classic PySpark);
    ``None`` when unknown (Spark Connect, another trigger, another Spark's internals)."""
    if is_connect(df):
        return None
    try:
        query = _running_query(df, query_id)
        trigger = query.trigger() if query is not None else None
        if trigger is not None and trigger.getClass().getSimpleName() == "ProcessingTimeTrigger":
            return float(trigger.intervalMs()) / 1000.0
    except Exception:  # another Spark's internals: the default lease then
        return None
    return None


def query_active_probe(df: DataFrame, query_id: str) -> Callable[[], bool | None] | None:
    """A call saying whether the streaming query ``query_id`` still runs (``None`` once it
    stopped), for the driver lease's renewal thread; ``None`` where it cannot be told
    (Spark Connect, another Spark's internals): the lease is then renewed while the
    process lives."""
    if is_connect(df):
        return None
    try:
        _running_query(df, query_id)
    except Exception:
        return None

    def active() -> bool | None:
        query = _running_query(df, query_id)
        return True if query is not None and query.isActive() else None

    return active
