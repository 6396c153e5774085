"""The Spark-native view: each epoch's txsink record joined with the query's progress.

A ``foreachBatch`` function cannot add to its query's progress (``observedMetrics`` come
from ``df.observe`` on the streaming DataFrame, before ``writeStream``; what the batch
function does is not part of the plan Spark observes). So the view goes the other way: a
:class:`~pyspark.sql.streaming.StreamingQueryListener` that, for each progress event of a
query the coordinator writes, reads that epoch (``batchId``) from the txsink log and keeps
both side by side (:class:`EpochProgress`), for a callback, a log line or a table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from txsink.protocol.log import TxLog
    from txsink.spark.epoch import SparkEpochs

__all__ = ["EpochProgress", "Writer", "progress_listener"]


class Writer(Protocol):
    """What the view reads of a :class:`txsink.Coordinator`: its txsink log, and its Spark
    side (which knows the queries it wrote). A Protocol, so this room names no face."""

    log: TxLog
    _spark: SparkEpochs


@dataclass(frozen=True)
class EpochProgress:
    """One micro-batch as Spark and txsink saw it.

    ``status``: the txsink log's (``committed``, ``decided``, ``aborted``, ``open``, or
    ``unknown`` when the log has no record of it: a batch txsink did not write).
    ``rows``: rows per sink uid from the epoch's decision; ``txsink_seconds``: the phases
    the decision recorded; ``spark_ms``: the progress' ``durationMs``.
    """

    query_id: str
    epoch: int
    status: str
    input_rows: int
    rows: dict[str, int] = field(default_factory=dict)
    txsink_seconds: dict[str, float] = field(default_factory=dict)
    spark_ms: dict[str, int] = field(default_factory=dict)


def progress_listener(
    coordinator: Writer,
    on_epoch: Callable[[EpochProgress], None] | None = None,
) -> Any:
    """A ``StreamingQueryListener`` for the queries ``coordinator`` writes: add it with
    ``spark.streams.addListener(listener)``. Each progress event becomes an
    :class:`EpochProgress`, kept in ``listener.epochs`` and passed to ``on_epoch``.

    Spark delivers listener events asynchronously, after the batch (and so after
    txsink's commit): a record lags its batch by a moment.
    """
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class _Listener(StreamingQueryListener):
        def __init__(self) -> None:
            self.epochs: list[EpochProgress] = []

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            query_id = str(progress.id)
            if query_id not in coordinator._spark.checked_queries:
                return  # another query of the session
            record = joined(coordinator, query_id, progress)
            self.epochs.append(record)
            if on_epoch is not None:
                on_epoch(record)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return _Listener()


def joined(coordinator: Writer, query_id: str, progress: Any) -> EpochProgress:
    """The :class:`EpochProgress` of one progress object (``batchId``, ``numInputRows``,
    ``durationMs``) and the coordinator's txsink log."""
    epoch = int(progress.batchId)
    state = coordinator.log.state(epoch)
    status = state.status if state.rounds or state.committed else "unknown"
    rows: dict[str, int] = {}
    seconds: dict[str, float] = {}
    if state.decision is not None:
        stats = state.decision.stats
        rows = {str(k): int(v) for k, v in dict(stats.get("rows", {})).items()}
        seconds = {str(k): float(v) for k, v in dict(stats.get("seconds", {})).items()}
    durations = {str(k): int(v) for k, v in dict(progress.durationMs or {}).items()}
    return EpochProgress(
        query_id, epoch, status, int(progress.numInputRows), rows, seconds, durations
    )
