"""What the brokers say about the topics a sink writes, and the records they would refuse.

Everything here runs **before the decision**: at the start-up check (driver) for the
sink's ``topic``, and in the pre-commit tasks for the topics a ``topic_column`` names. A
topic is described once per process (:class:`TopicLookup` caches it, and the check's
answers travel into the tasks with the sink) from:

- ``list_topics``: whether it exists and its partition count;
- ``describe_configs`` on the TOPIC resource: its effective ``max.message.bytes`` (its own
  setting, or the broker's ``message.max.bytes`` it defaults to);
- ``describe_topics(include_authorized_operations=True)`` (KIP-430): whether this
  principal may WRITE to it (the brokers answer every operation when they run no
  authorizer).

:func:`check_records` then refuses, naming the row, a record whose topic does not
exist, whose partition is outside the topic's partitions, or whose batch is larger than
the smallest limit that applies (:mod:`~txsink.connectors.kafka.records.limits`): each would
otherwise be refused by the producer or the broker after the decision, in WAL and replay
mode at the commit, when nothing can take the epoch back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from txsink.connectors.kafka.clients.errors import check_error, has_code
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.records.limits import (
    RecordLimit,
    batch_sizes,
    effective_limit,
    largest_batch_size,
)
from txsink.errors import ConfigurationError, RetryableError, TxsinkError, WriteError

__all__ = ["TopicInfo", "TopicLookup", "check_records", "describe_topics"]

#: ``ConfigSource`` names of a topic config that comes from the broker, not the topic.
_FROM_BROKER = ("DYNAMIC_BROKER_CONFIG", "DYNAMIC_DEFAULT_BROKER_CONFIG", "STATIC_BROKER_CONFIG")


@dataclass(frozen=True)
class TopicInfo:
    """One topic as the brokers describe it to this sink."""

    partitions: int
    #: The effective ``max.message.bytes`` (None: the brokers did not say).
    max_message_bytes: int | None
    #: Where it comes from, for the fix: "set on the topic" or "the broker's default".
    source: str = ""
    #: Whether this principal may WRITE to it (None: the brokers did not say).
    writable: bool | None = None


def describe_topics(
    admin: Any, topics: list[str], timeout_s: float, *, meta: Any = None
) -> dict[str, TopicInfo | None]:
    """``topics`` as the brokers describe them (None: the topic does not exist); ``meta``:
    the cluster's topics as listed just before (default: listed now).

    Raises ``KafkaException`` as the admin client does (the caller classifies it).
    """
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclOperation,
        ConfigResource,
        ResourceType,
    )

    if meta is None:
        meta = admin.list_topics(timeout=timeout_s)
    found: dict[str, TopicInfo | None] = {t: None for t in topics}
    existing = [t for t in topics if t in meta.topics and meta.topics[t].error is None]
    if not existing:
        return found
    resources = {t: ConfigResource(ResourceType.TOPIC, t) for t in existing}
    configs = admin.describe_configs(list(resources.values()))
    described = admin.describe_topics(
        TopicCollection(existing), request_timeout=timeout_s, include_authorized_operations=True
    )
    may_write = {AclOperation.WRITE, AclOperation.ALL}
    for topic in existing:
        entry = configs[resources[topic]].result(timeout=timeout_s).get("max.message.bytes")
        limit = int(entry.value) if entry is not None and entry.value else None
        source = "" if entry is None else _source(entry.source)
        ops = described[topic].result(timeout=timeout_s).authorized_operations
        writable = None if ops is None else bool(may_write & set(ops))
        found[topic] = TopicInfo(len(meta.topics[topic].partitions), limit, source, writable)
    return found


def _source(source: Any) -> str:
    """Where a topic's config value comes from (``ConfigEntry.source``: a ``ConfigSource``
    value, an int in confluent-kafka 2.x), for the fix an error gives."""
    from confluent_kafka.admin import ConfigSource  # type: ignore[attr-defined]

    try:
        name = ConfigSource(int(getattr(source, "value", source))).name
    except ValueError:
        return ""
    if name == "DYNAMIC_TOPIC_CONFIG":
        return "set on the topic"
    if name in _FROM_BROKER or name == "DEFAULT_CONFIG":
        return "the broker's message.max.bytes"
    return ""


@dataclass
class TopicLookup:
    """Each topic described once per process and sink; picklable (the admin client is made
    on first use and stays in its process; what was learnt travels with the sink)."""

    settings: KafkaSettings
    #: The sink's ``max_record_bytes`` (None: derived from the topic and the producer).
    explicit_max: int | None = None
    #: The producer's ``message.max.bytes``.
    producer_max: int = 1_000_000
    known: dict[str, TopicInfo | None] = field(default_factory=dict)
    _admin: Any = field(default=None, repr=False)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_admin"] = None
        return state

    def seed(self, topic: str, info: TopicInfo | None) -> None:
        """What the check learnt about ``topic`` (the tasks need not ask again)."""
        self.known[topic] = info

    def info(self, topics: list[str], ctx: dict[str, Any]) -> dict[str, TopicInfo | None]:
        """``topics`` described (from the cache, else asked once), or a txsink error:
        RetryableError if the brokers cannot be reached, ConfigurationError if refused."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        missing = [t for t in topics if t not in self.known]
        if missing:
            try:
                if self._admin is None:
                    self._admin = AdminClient(self.settings.client_config())
                self.known.update(describe_topics(self._admin, missing, self.settings.timeout_s))
            except KafkaException as err:
                raise _lookup_error(err.args[0], self.settings, missing, ctx) from err
        return {t: self.known[t] for t in topics}

    def limit(self, topic: str, info: TopicInfo) -> RecordLimit:
        """The smallest record limit for ``topic`` (the sink's check refused an explicit
        ``max_record_bytes`` above it for its ``topic``; for a ``topic_column`` topic the
        smaller of the two applies)."""
        derived = effective_limit(
            topic,
            topic_max=info.max_message_bytes,
            topic_max_source=info.source,
            producer_max=self.producer_max,
        )
        if self.explicit_max is not None and self.explicit_max < derived.nbytes:
            return RecordLimit(self.explicit_max, f"max_record_bytes={self.explicit_max}")
        return derived


def _lookup_error(
    err: Any, settings: KafkaSettings, topics: list[str], ctx: dict[str, Any]
) -> TxsinkError:
    doing = f"describe the topic(s) {topics}"
    if err.retriable() or has_code(err, "_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN"):
        return RetryableError(
            f"cannot {doing} at {settings.bootstrap_servers}: {err.str()} ({err.name()}); "
            "Spark retries the task",
            **ctx,
        )
    return ConfigurationError(check_error(err, settings, doing).message, **ctx)


def check_records(
    records: pa.RecordBatch,
    lookup: TopicLookup,
    *,
    compressed: bool,
    first_row: int,
    ctx: dict[str, Any],
    columns: dict[str, str | None],
) -> None:
    """Refuse the first record of ``records`` (:data:`~txsink.connectors.kafka.records.format.
    RECORD_SCHEMA`) that Kafka would refuse: its topic missing, its partition outside the
    topic's, its batch over the topic's limit. ``columns``: the sink's column options
    (``topic_column``, ``partition_column``, ``value``) for the error."""
    if not records.num_rows:
        return
    topic = records.column(0)
    uniq = pc.unique(topic)
    names = [str(t) for t in uniq.to_pylist()]
    infos = lookup.info(names, ctx)
    where = pc.index_in(topic, value_set=uniq)

    def per_row(values: list[int]) -> pa.Array:
        return pc.take(pa.array(values, pa.int64()), where)

    def refuse(mask: pa.Array, message: Callable[[int], str], column: str | None) -> None:
        if pc.any(mask).as_py():
            row = int(pc.index(mask, True).as_py())
            raise WriteError(message(row), row=first_row + row, column=column, **ctx)

    gone = [t for t in names if infos[t] is None]
    if gone:
        refuse(
            pc.is_in(topic, value_set=pa.array(gone, pa.string())),
            lambda row: (
                f"topic {topic[row].as_py()!r} does not exist (or this principal may not "
                "describe it): the producer would fail on it after the decision. Create the "
                "topic (txsink does not create data topics), or fix the row's "
                f"{columns['topic_column'] or 'topic'}"
            ),
            columns["topic_column"],
        )
    known = {t: info for t, info in infos.items() if info is not None}
    denied = [t for t, info in known.items() if info.writable is False]
    if denied:
        raise ConfigurationError(
            f"this principal may not WRITE to topic(s) {denied} (the brokers' authorized "
            f"operations): grant WRITE on Topic:{denied[0]} to the sink's principal",
            **ctx,
        )
    part = records.column(1)
    if part.null_count < len(part):
        counts = per_row([known[t].partitions for t in names])
        refuse(
            pc.fill_null(pc.or_(pc.less(part, 0), pc.greater_equal(part, counts)), False),
            lambda row: (
                f"partition {part[row].as_py()} is not a partition of topic "
                f"{topic[row].as_py()!r}, which has {known[topic[row].as_py()].partitions}: the "
                "broker would refuse the record after the decision. Fix the row's "
                f"{columns['partition_column']}, or add partitions to the topic"
            ),
            columns["partition_column"],
        )
    limits = {t: lookup.limit(t, known[t]) for t in names}
    bound = largest_batch_size(
        records.column(2), records.column(3), records.column(4), compressed=compressed
    )
    if bound is not None and bound <= min(limit.nbytes for limit in limits.values()):
        return  # even its longest key with its longest value fits: no size per record
    sizes = batch_sizes(
        records.column(2), records.column(3), records.column(4), compressed=compressed
    )
    refuse(
        pc.greater(sizes, per_row([limits[t].nbytes for t in names])),
        lambda row: _too_large(
            int(sizes[row].as_py()), limits[topic[row].as_py()], topic[row].as_py(), compressed
        ),
        columns["value"] or "value",
    )


def _too_large(size: int, limit: RecordLimit, topic: str, compressed: bool) -> str:
    how = "key, value, headers and the 61-byte record batch header" + (
        ", with the compression margin" if compressed else ""
    )
    return (
        f"record of {size} bytes as the broker counts it ({how}) is larger than {limit.source}, "
        f"the limit for topic {topic!r}; Kafka would refuse it after the decision. Shrink or "
        "split the value, or raise the limit it names (the topic's max.message.bytes with "
        f"kafka-configs --alter --entity-type topics --entity-name {topic} --add-config "
        "max.message.bytes=<bytes>, and message.max.bytes in producer_config)"
    )
