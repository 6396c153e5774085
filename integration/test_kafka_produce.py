"""The produce path (``producers.produce_records``) against the real broker: every record
once and in order, also when librdkafka's local queue fills up mid-batch and the C-level
loop stops at the refused record; read back with read_committed."""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pytest
from readback import read_topic

from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.clients.producers import ShardProducers, produce_records
from txsink.connectors.kafka.records.format import RECORD_SCHEMA

pytestmark = pytest.mark.kafka
APP = "app"


def _records(topic: str, n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "topic": [topic] * n,
            "partition": [None] * n,
            "key": [f"k{i % 13}".encode() for i in range(n)],
            "value": [str(i).encode() for i in range(n)],
            "headers": [None] * n,
        },
        schema=RECORD_SCHEMA,
    )


@pytest.mark.parametrize("queue", [3, 100_000])
def test_every_record_once_and_in_order_when_the_local_queue_fills(kafka: Any, queue: int) -> None:
    """``queue.buffering.max.messages=3``: nearly every produce call finds the queue full
    (BufferError), the record it refused is produced again once there is room, and no
    other record twice."""
    topic = kafka.new_topic(1)
    markers = kafka.new_topic(1, prefix="m", config={"cleanup.policy": "compact"})
    sink = KafkaSink(
        kafka.bootstrap,
        topic,
        uid="p" + uuid.uuid4().hex[:8],
        mode="replay",
        key="key",
        marker_topic=markers,
        producer_config={"queue.buffering.max.messages": queue, "linger.ms": 1},
    )
    producers = ShardProducers(sink.settings)
    n = 3_000
    try:
        producers.transaction(0, APP, 1, lambda p: produce_records(p, _records(topic, n)))
    finally:
        producers.close()
    values = [r.value for r in read_topic(kafka.bootstrap, topic)]
    assert values == [str(i).encode() for i in range(n)]
