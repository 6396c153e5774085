"""Read a Kafka topic back as a downstream reader would (committed values up to the last
stable offsets), and create or delete topics: for the testing adapter."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txsink.connectors.kafka.clients.errors import has_code
from txsink.connectors.kafka.clients.offsets import Isolation, settled_ends, topic_ends
from txsink.connectors.kafka.clients.settings import rdkafka_logger

__all__ = [
    "KafkaRecord",
    "admin_client",
    "create_topic",
    "delete_topic",
    "read_committed_values",
    "read_records",
]


@dataclass(frozen=True)
class KafkaRecord:
    """One record as a reader gets it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


def _headers(raw: Any) -> tuple[tuple[str, bytes | None], ...]:
    """Normalise librdkafka headers (list of pairs, or dict) to (name, bytes) pairs."""
    if not raw:
        return ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple(
        (str(k), v.encode() if isinstance(v, str) else (bytes(v) if v is not None else None))
        for k, v in pairs
    )


def _quiet() -> logging.Logger:
    return rdkafka_logger("txsink.connectors.kafka.readback.rdkafka", silent=True)


def admin_client(bootstrap: str, client_config: Mapping[str, Any] | None = None) -> Any:
    """An ``AdminClient`` for ``bootstrap`` that keeps librdkafka quiet; ``client_config``:
    the client's own settings (TLS, SASL) on a secured cluster."""
    from confluent_kafka.admin import AdminClient

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": _quiet()}
    conf.update(client_config or {})
    return AdminClient(conf)


def read_committed_values(bootstrap: str, topic: str, timeout_s: float) -> list[bytes | None]:
    """Every value a ``read_committed`` reader sees (:func:`read_records`)."""
    return [r.value for r in read_records(bootstrap, topic, timeout_s=timeout_s)]


def read_records(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout_s: float = 60.0,
    config: dict[str, Any] | None = None,
    ends: Mapping[int, int] | None = None,
    client_config: Mapping[str, Any] | None = None,
) -> list[KafkaRecord]:
    """Every record of ``topic`` a reader with ``isolation`` sees, all partitions, in order.

    Reads from the beginning to the end offsets as of the call (for ``read_committed``, once
    the markers of the transactions committed so far are in every partition:
    :func:`~txsink.connectors.kafka.clients.offsets.settled_ends`), or to ``ends`` (per partition)
    when given; raises TimeoutError if that end is not reached in ``timeout_s``. No
    consumer group offsets are committed. ``client_config`` (TLS, SASL) serves the admin
    client and the consumer; ``config``, the consumer only.
    """
    from confluent_kafka import Consumer, TopicPartition

    admin = admin_client(bootstrap, client_config)
    if ends is not None:
        ends = dict(ends)
    elif isolation == "read_committed":
        ends, _, _ = settled_ends(admin, topic, timeout_s, wait_s=10.0)
    else:
        ends = topic_ends(admin, topic, isolation, timeout_s)
    pending = {p for p, end in ends.items() if end > 0}
    records: list[KafkaRecord] = []
    if not pending:
        return records
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"txsink-readback-{uuid.uuid4().hex[:12]}",
        "isolation.level": isolation,
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "logger": _quiet(),
    }
    conf.update(client_config or {})
    conf.update(config or {})
    consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(pending)])
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"read_records({topic!r}): partitions {sorted(pending)} did not reach "
                    f"{ {p: ends[p] for p in pending} } in {timeout_s}s"
                )
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            part = msg.partition()
            err = msg.error()
            if err is not None:
                if has_code(err, "_PARTITION_EOF"):
                    # EOF is reported at the end of what this isolation level can read;
                    # control records (commit/abort markers) are skipped up to there.
                    if part is not None and (msg.offset() or 0) >= ends.get(part, 0):
                        pending.discard(part)
                    continue
                raise RuntimeError(f"read_records({topic!r}): {err}")
            offset = msg.offset()
            if part is None or offset is None:
                continue
            if offset >= ends[part]:
                pending.discard(part)
                continue
            headers = _headers(msg.headers())
            records.append(
                KafkaRecord(
                    topic=topic,
                    partition=part,
                    offset=offset,
                    key=msg.key(),
                    value=msg.value(),
                    headers=headers,
                    timestamp_ms=msg.timestamp()[1],
                )
            )
            if offset + 1 >= ends[part]:
                pending.discard(part)
    finally:
        consumer.close()
    records.sort(key=lambda r: (r.partition, r.offset))
    return records


def create_topic(
    bootstrap: str,
    topic: str,
    partitions: int = 2,
    timeout_s: float = 30.0,
    config: Mapping[str, str] | None = None,
    *,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Create ``topic`` (replication 1, topic ``config``) unless it exists, and wait until
    the brokers' metadata lists it (the controller accepts a topic before every broker
    knows it, and a sink's start-up check right after would find no such topic).
    ``client_config``: the admin client's own settings on a secured cluster."""
    import time

    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = admin_client(bootstrap, client_config)  # held until the answer (its futures)
    future = admin.create_topics([NewTopic(topic, partitions, 1, config=dict(config or {}))])[topic]
    try:
        future.result(timeout=timeout_s)
    except KafkaException as err:
        if not has_code(err.args[0], "TOPIC_ALREADY_EXISTS"):
            raise
    deadline = time.monotonic() + timeout_s
    while (found := admin.list_topics(timeout=timeout_s).topics.get(topic)) is None or (
        found.error is not None
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"create_topic({topic!r}): created, but not in the metadata")
        time.sleep(0.05)


def delete_topic(
    bootstrap: str,
    topic: str,
    timeout_s: float = 30.0,
    *,
    client_config: Mapping[str, Any] | None = None,
) -> None:
    """Delete ``topic`` and wait for the answer; an error (a topic already gone, a broker
    that refuses) is raised as confluent-kafka's ``KafkaException``."""
    admin = admin_client(bootstrap, client_config)  # held until the answer (its futures)
    future = admin.delete_topics([topic], operation_timeout=timeout_s)[topic]
    future.result(timeout=timeout_s)
