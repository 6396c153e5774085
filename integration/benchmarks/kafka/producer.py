"""The plain producer, the ceiling: ``mapInArrow`` tasks, each with a plain
(non-transactional) idempotent confluent-kafka Producer (``acks=all``, txsink's
``linger.ms=20``, ``compression.type=lz4``, ``murmur2_random``), the same produce loop with a
delivery callback, ``flush()`` at the end. At-least-once; a new producer in every task."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from benchmarks import _bench

# txsink's producer settings (clients.KafkaSettings.producer_conf); the ceiling and Spark's
# sink get the same.
PRODUCER_SETTINGS: dict[str, Any] = {
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 20,
    "compression.type": "lz4",
    "partitioner": "murmur2_random",
    "delivery.report.only.error": True,
}


# -- the task: runs in Spark's Python workers; keep it self-contained --------------------------


def produce_task(
    bootstrap: str, topic: str, config: dict[str, Any], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ceiling: one plain idempotent producer per task, the same records, flush at the end."""
    from confluent_kafka import Producer

    producer = Producer({**config, "bootstrap.servers": bootstrap})
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None and not errors:
            errors.append(f"{err.str()} (partition {msg.partition()})")

    rows = 0
    for batch in batches:
        keys = batch.column(0).cast(pa.binary()).to_pylist()
        values = batch.column(1).cast(pa.binary()).to_pylist()
        for key, value in zip(keys, values, strict=True):
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.05)  # local queue full: let deliveries drain
        producer.poll(0)
        rows += batch.num_rows
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"plain producer: {left} records undelivered, errors {errors[:1]}")
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def write_producer(bootstrap: str, df: Any, topic: str) -> dict[str, Any]:
    """One epoch of ``df`` into ``topic`` through the plain producer's tasks."""
    job = df.select("key", "value").mapInArrow(
        functools.partial(produce_task, bootstrap, topic, PRODUCER_SETTINGS), "rows long"
    )
    return {"task_rows": _bench.task_rows(job)}


def producer_epochs(bootstrap: str, df: Any, topic: str, epochs: int) -> list[float]:
    """``epochs`` epochs of ``df`` into ``topic`` as a ``foreachBatch`` with confluent-kafka
    writes them (a new producer in each task); the seconds of each."""
    task = functools.partial(produce_task, bootstrap, topic, PRODUCER_SETTINGS)
    seconds = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        df.select("key", "value").mapInArrow(task, "rows long").collect()
        seconds.append(time.perf_counter() - t0)
    return seconds
