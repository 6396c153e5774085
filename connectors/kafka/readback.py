"""Read a Kafka topic back as a downstream reader would: last stable offsets, committed
values, and topic creation (for the testing adapter, the integration suite and the
benchmarks)."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

__all__ = ["create_topic", "end_offsets", "read_committed_values"]


def _quiet() -> logging.Logger:
    logger = logging.getLogger("txsink.connectors.kafka.readback.rdkafka")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False
    return logger


def end_offsets(bootstrap: str, topic: str, isolation: str, timeout_s: float) -> dict[int, int]:
    """Per partition, the offset a reader with ``isolation`` reads up to (LSO or HW)."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _quiet()}
    admin = AdminClient(conf)
    tmeta = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if tmeta is None or tmeta.error is not None:
        raise LookupError(f"topic {topic!r} not found")
    level = (
        IsolationLevel.READ_COMMITTED
        if isolation == "read_committed"
        else IsolationLevel.READ_UNCOMMITTED
    )
    latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets(
        {TopicPartition(topic, p): latest for p in tmeta.partitions},
        isolation_level=level,
        request_timeout=timeout_s,
    )
    return {tp.partition: int(f.result().offset) for tp, f in futures.items()}


def read_committed_values(bootstrap: str, topic: str, timeout_s: float) -> list[bytes | None]:
    """Every value a ``read_committed`` reader sees, up to the last stable offsets now."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    ends = end_offsets(bootstrap, topic, "read_committed", timeout_s)
    pending = {p for p, end in ends.items() if end > 0}
    values: list[bytes | None] = []
    if not pending:
        return values
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"txsink-chaos-{uuid.uuid4().hex[:12]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "logger": _quiet(),
    }
    consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(pending)])
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic!r}: partitions {sorted(pending)} not read")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            part, offset, err = msg.partition(), msg.offset() or 0, msg.error()
            if part is None:
                continue
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"topic {topic!r}: {err}")
                if offset >= ends.get(part, 0):
                    pending.discard(part)
                continue
            if offset < ends[part]:
                values.append(msg.value())
            if offset + 1 >= ends[part]:
                pending.discard(part)
    finally:
        consumer.close()
    return values


def create_topic(bootstrap: str, topic: str, partitions: int = 2, timeout_s: float = 30.0) -> None:
    """Create ``topic`` (replication 1) unless it exists."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _quiet()}
    admin = AdminClient(conf)
    future = admin.create_topics([NewTopic(topic, partitions, 1)])[topic]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as err:
        if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
