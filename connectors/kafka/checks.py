"""The Kafka sink's checks at start (driver, before anything is written).

- every named column exists in the DataFrame;
- the brokers answer, and the topic exists (txsink does not create data topics);
- the topic's effective ``max.message.bytes`` with the producer's ``message.max.bytes``
  give the record limit the pre-commit checks (an explicit ``max_record_bytes`` above it
  is refused here), and the producers' ``batch.size`` is capped so a batch fits too
  (:mod:`~txsink.connectors.kafka.records.limits`);
- this principal may WRITE to the topic and the marker topic (KIP-430's authorized
  operations; ``init_transactions`` on the sink's transactional ids then proves WRITE on
  them);
- ``transaction.timeout.ms`` is at least 10 s and at most the broker's
  ``transaction.max.timeout.ms`` (else every transaction would be refused);
- the marker topic exists with ``cleanup.policy=compact``, or is created so;
- the Avro schemas are fixed and registered (an incompatible one fails here, not in a task).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from txsink.connectors.kafka.clients.errors import check_error
from txsink.connectors.kafka.clients.markers import ensure_marker_topic
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.records.format import RecordFormat
from txsink.connectors.kafka.records.limits import batch_cap, effective_limit
from txsink.connectors.kafka.records.topics import TopicInfo, describe_topics
from txsink.errors import ConfigurationError

__all__ = [
    "MIN_TXN_TIMEOUT_MS",
    "Cluster",
    "check_avro",
    "check_brokers",
    "check_columns",
    "check_topics",
    "list_cluster",
]

#: An epoch's commit produces all of a shard's records in one transaction.
MIN_TXN_TIMEOUT_MS = 10_000


def check_columns(schema: pa.Schema, fmt: RecordFormat, ctx: dict[str, Any]) -> None:
    for name, column in fmt.columns().items():
        if column is not None and column not in schema.names:
            raise ConfigurationError(
                f"{name}={column!r} is not a column of the DataFrame (columns: {schema.names})",
                column=column,
                **ctx,
            )


@dataclass(frozen=True)
class Cluster:
    """An admin client and the cluster's metadata (brokers, topics) it listed: listed once
    at start, shared by the rights check, :func:`check_brokers` and :func:`check_topics`."""

    admin: Any
    meta: Any


def list_cluster(settings: KafkaSettings) -> Cluster:
    """List the cluster's brokers and topics (any principal may list the topics it sees):
    brokers that are down are told as such here, first."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient(settings.client_config())
        return Cluster(admin, admin.list_topics(timeout=settings.timeout_s))
    except KafkaException as err:
        raise check_error(err.args[0] if err.args else err, settings, "list the topics") from err
    except TimeoutError as err:
        raise check_error(err, settings, "list the topics") from err


def check_brokers(
    settings: KafkaSettings, topic: str | None, cluster: Cluster, ctx: dict[str, Any]
) -> Cluster:
    """``topic`` exists, the transaction timeout fits, the marker topic is there and
    compacted (``cluster``: :func:`list_cluster`'s answer). Returns ``cluster``, listed
    again only when this check created the marker topic (the next checks describe it)."""
    from confluent_kafka import KafkaException

    admin, meta = cluster.admin, cluster.meta
    doing = "check the topic"
    try:
        if topic is not None and topic not in meta.topics:
            raise ConfigurationError(
                f"topic {topic!r} does not exist: create it (txsink does not create data "
                "topics, their partitions and retention are yours to choose)",
                **ctx,
            )
        doing = "read the brokers' transaction.max.timeout.ms"
        _check_transaction_timeout(admin, meta, settings, ctx)
        doing = f"check the marker topic {settings.marker_topic!r}"
        if ensure_marker_topic(admin, meta, settings, ctx):
            return replace(cluster, meta=admin.list_topics(timeout=settings.timeout_s))
    except KafkaException as err:
        raise check_error(err.args[0] if err.args else err, settings, doing) from err
    except TimeoutError as err:  # a future's result(timeout=...) that did not come
        raise check_error(err, settings, doing) from err
    return cluster


def check_topics(
    settings: KafkaSettings, fmt: RecordFormat, cluster: Cluster, ctx: dict[str, Any]
) -> int | None:
    """Describe the topics the sink writes: refuse what the brokers would refuse after the
    decision (no WRITE right, an explicit ``max_record_bytes`` above the topic's limit),
    seed ``fmt.topics`` for the tasks, and return the producers' ``batch.size`` cap.

    With ``topic_column`` the tasks describe each topic they meet; the cap is then the
    smallest limit of the cluster's topics now (a topic created later with a smaller one
    is an operator change: docs/reliability.md). ``cluster``: :func:`check_brokers`'s.
    """
    from confluent_kafka import KafkaException

    lookup = fmt.topics
    if lookup is None:  # pragma: no cover - the sink always gives one
        return None
    doing = "describe the topics"
    try:
        admin = cluster.admin
        wanted = [settings.marker_topic] + ([fmt.topic] if fmt.topic is not None else [])
        found = describe_topics(admin, wanted, settings.timeout_s, meta=cluster.meta)
        for topic, info in found.items():
            _check_writable(topic, info, settings, ctx)
        if fmt.topic is None:
            doing = "read the topics' max.message.bytes"
            floor = _smallest_limit(admin, cluster.meta, settings.timeout_s)
            return None if floor is None else batch_cap(floor, fmt.compressed)
    except KafkaException as err:
        raise check_error(err.args[0], settings, doing) from err
    info = found[fmt.topic]
    if info is None:  # pragma: no cover - check_brokers refused it first
        raise ConfigurationError(f"topic {fmt.topic!r} does not exist", **ctx)
    try:
        limit = effective_limit(
            fmt.topic,
            topic_max=info.max_message_bytes,
            topic_max_source=info.source,
            producer_max=lookup.producer_max,
            explicit=lookup.explicit_max,
        )
    except ValueError as err:
        raise ConfigurationError(str(err), **ctx) from err
    lookup.seed(fmt.topic, info)
    return batch_cap(limit.nbytes, fmt.compressed)


def _check_writable(
    topic: str, info: TopicInfo | None, settings: KafkaSettings, ctx: dict[str, Any]
) -> None:
    if info is not None and info.writable is False:
        raise ConfigurationError(
            f"this principal may not WRITE to topic {topic!r} (the brokers' authorized "
            f"operations for it lack WRITE): every commit would be refused. Grant it, e.g. "
            f"kafka-acls --add --allow-principal User:<sink's principal> --operation Write "
            f"--operation Describe --topic {topic}; and WRITE on TransactionalId "
            f"{settings.prefix}-{settings.uid}-*",
            **ctx,
        )


def _smallest_limit(admin: Any, meta: Any, timeout_s: float) -> int | None:
    """The smallest ``max.message.bytes`` of the cluster's topics (internal ones aside)."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    names = [t for t in meta.topics if not t.startswith("__")]
    if not names:
        return None
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, t) for t in names])
    limits = []
    for future in futures.values():
        entry = future.result(timeout=timeout_s).get("max.message.bytes")
        if entry is not None and entry.value:
            limits.append(int(entry.value))
    return min(limits, default=None)


def _check_transaction_timeout(
    admin: Any, meta: Any, settings: KafkaSettings, ctx: dict[str, Any]
) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    ours = settings.txn_timeout_ms
    if ours < MIN_TXN_TIMEOUT_MS:
        raise ConfigurationError(
            f"transaction.timeout.ms={ours} is too short: an epoch's commit produces all of a "
            f"shard's records in one transaction; use at least {MIN_TXN_TIMEOUT_MS}",
            **ctx,
        )
    broker = str(next(iter(meta.brokers)))
    res = ConfigResource(ResourceType.BROKER, broker)
    configs = admin.describe_configs([res])[res].result(timeout=settings.timeout_s)
    entry = configs.get("transaction.max.timeout.ms")
    limit = int(entry.value) if entry is not None and entry.value else None
    if limit is not None and ours > limit:
        raise ConfigurationError(
            f"transaction.timeout.ms={ours} is above the broker's "
            f"transaction.max.timeout.ms={limit}: the broker would refuse every transaction. "
            "Lower transaction.timeout.ms in producer_config, or raise the broker setting",
            **ctx,
        )


def check_avro(schema: pa.Schema, fmt: RecordFormat, ctx: dict[str, Any]) -> None:
    """Fix and register the Avro schemas now: a bad one fails at start, not in a task.

    Fixing mutates the encoders of ``fmt`` (the record's name, the subject's latest version a
    derived value schema keeps): the sink pickled into the tasks afterwards carries them.
    Under schema evolution this check sees the columns the subject already has, so it
    registers its latest version again (a no-op); the epoch's tasks register the new one.
    """
    evolving = fmt.evolving_value()
    for field_, encoder in fmt.avro.items():
        column = fmt.key if field_ == "key" else fmt.value
        arrow_type = (
            schema.field(column).type
            if column is not None
            else pa.struct([schema.field(n) for n in fmt.payload_columns(schema.names)])
        )
        latest = None
        if encoder is evolving and fmt.topic is not None:
            found = encoder.latest_fields(fmt.topic, ctx)
            latest = found[1] if found is not None else None
        try:
            text = encoder.resolve_schema(arrow_type, fmt.topic, latest)
        except ValueError as err:
            raise ConfigurationError(
                f"cannot derive an Avro {field_} schema from column "
                f"{column or '(payload columns)'!r}: {err}. Pass {field_}_schema='<Avro JSON>' "
                "or cast the column",
                column=column,
                **ctx,
            ) from err
        if fmt.topic is not None:  # with topic_column, tasks register per topic
            encoder.register(fmt.topic, ctx, text)
