"""One streaming query per writer, run to its end, metered epoch by epoch.

The listener of :mod:`benchmarks._bench.epochs` takes a CPU snapshot and the time at each
epoch's progress event; the measured window runs from the end of epoch ``skip - 1`` to the
end of the last epoch, so the first epochs (JIT, imports, producers, txsink's once-per-run
checks) stay out of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._bench.epochs import Epoch, Meter, listener
from benchmarks.kafka.producer import write_producer
from benchmarks.kafka.records import run_feed
from benchmarks.kafka.spark_sink import SPARK_KAFKA_OPTIONS
from benchmarks.kafka.txsink_writer import mode_options

from txsink import Coordinator
from txsink.connectors.kafka.sink import KafkaSink

__all__ = ["TXSINK_MODES", "WRITERS", "Epoch", "Meter", "Target", "listener", "run_query", "start"]

WRITERS = ("spark", "producer", "direct", "wal", "replay")
TXSINK_MODES = ("direct", "wal", "replay")


@dataclass(frozen=True)
class Target:
    """Where a query writes: broker, topic, marker topic, its folder (checkpoint, log, WAL)."""

    bootstrap: str
    topic: str
    marker_topic: str
    folder: Path
    partitions: int


def _batch_writer(writer: str, target: Target) -> Callable[[Any, int], Any]:
    if writer == "producer":
        return lambda df, epoch: write_producer(target.bootstrap, df, target.topic)
    if writer == "feed":
        return lambda df, epoch: run_feed(df)
    options = mode_options(writer, target.folder / "wal", target.partitions)
    uid = target.topic.removeprefix("txsink-bench-")
    sink = KafkaSink(
        target.bootstrap, target.topic, uid, marker_topic=target.marker_topic, **options
    )
    coordinator: Callable[[Any, int], Any] = Coordinator([sink], log=target.folder / "log")
    return coordinator


def start(writer: str, stream: Any, target: Target, name: str) -> Any:
    """Start ``writer``'s query over ``stream``; it ends by itself after the last epoch."""
    out = stream.writeStream.option("checkpointLocation", str(target.folder / "checkpoint"))
    out = out.trigger(availableNow=True).queryName(name)
    if writer == "spark":
        out = (
            out.format("kafka")
            .option("kafka.bootstrap.servers", target.bootstrap)
            .option("topic", target.topic)
        )
        for key, value in SPARK_KAFKA_OPTIONS.items():
            out = out.option(key, value)
        return out.start()
    return out.foreachBatch(_batch_writer(writer, target)).start()


def run_query(
    writer: str, stream: Any, target: Target, meters: dict[str, Meter], epochs: int
) -> Meter:
    """Run ``writer``'s query to its end; its epochs as the listener saw them. Raises the
    query's error if it failed."""
    meter = Meter(f"steady-{writer}-{target.topic}")
    meters[meter.name] = meter
    query = start(writer, stream, target, meter.name)
    try:
        query.awaitTermination()
        error = query.exception()
        if error is not None:
            raise RuntimeError(f"query {writer} failed: {error}")
        if not meter.wait_for(epochs - 1):
            raise RuntimeError(
                f"query {writer}: no progress event for epoch {epochs - 1} (saw "
                f"{sorted(meter.epochs)})"
            )
    finally:
        if query.isActive:
            query.stop()
    return meter
