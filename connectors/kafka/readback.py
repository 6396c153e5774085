"""Read a Kafka topic back as a downstream reader would (committed values up to the last
stable offsets), and create or delete topics: for the testing adapter."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from txsink.connectors.kafka.clients import rdkafka_logger
from txsink.connectors.kafka.errors import has_code
from txsink.connectors.kafka.offsets import settled_ends

__all__ = ["admin_client", "create_topic", "delete_topic", "read_committed_values"]


def _quiet() -> logging.Logger:
    return rdkafka_logger("txsink.connectors.kafka.readback.rdkafka", silent=True)


def admin_client(bootstrap: str) -> Any:
    """An ``AdminClient`` for ``bootstrap`` that keeps librdkafka quiet."""
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _quiet()}
    return AdminClient(conf)


def read_committed_values(bootstrap: str, topic: str, timeout_s: float) -> list[bytes | None]:
    """Every value a ``read_committed`` reader sees, up to the last stable offsets once the
    commit markers of the transactions committed so far are in every partition."""
    from confluent_kafka import Consumer, TopicPartition

    ends, _, _ = settled_ends(admin_client(bootstrap), topic, timeout_s)
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
                if not has_code(err, "_PARTITION_EOF"):
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
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = admin_client(bootstrap)  # held until the answer: its futures die with it
    future = admin.create_topics([NewTopic(topic, partitions, 1)])[topic]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as err:
        if not has_code(err.args[0], "TOPIC_ALREADY_EXISTS"):
            raise


def delete_topic(bootstrap: str, topic: str, timeout_s: float = 30.0) -> None:
    """Delete ``topic`` and wait for the answer; an error (a topic already gone, a broker
    that refuses) is raised as confluent-kafka's ``KafkaException``."""
    admin = admin_client(bootstrap)  # held until the answer: its futures die with it
    future = admin.delete_topics([topic], operation_timeout=timeout_s)[topic]
    future.result(timeout=timeout_s)
