"""How far a reader can read: per partition, the last stable offset (``read_committed``)
or the high watermark (``read_uncommitted``).

The one reader of end offsets in the connector: the marker read waits for the first to
reach the second, and the test verifiers count a partition whose first lags the second as
a transaction left open.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

__all__ = ["Isolation", "partition_ends", "topic_ends"]

Isolation = Literal["read_committed", "read_uncommitted"]


def partition_ends(
    admin: Any, topic: str, partitions: Iterable[int], isolation: Isolation, timeout_s: float
) -> dict[int, int]:
    """Per partition of ``topic``, the offset a reader with ``isolation`` reads up to.

    With ``read_committed`` that is the last stable offset (LSO): records of a still-open
    transaction lie beyond it, so such a reader never waits for a transaction that may not
    end. ``admin`` is a confluent-kafka ``AdminClient``.
    """
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

    level = (
        IsolationLevel.READ_COMMITTED
        if isolation == "read_committed"
        else IsolationLevel.READ_UNCOMMITTED
    )
    latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets(
        {TopicPartition(topic, p): latest for p in partitions},
        isolation_level=level,
        request_timeout=timeout_s,
    )
    return {tp.partition: int(f.result(timeout=timeout_s).offset) for tp, f in futures.items()}


def topic_ends(admin: Any, topic: str, isolation: Isolation, timeout_s: float) -> dict[int, int]:
    """:func:`partition_ends` of every partition of ``topic``; ``LookupError`` if it is missing."""
    tmeta = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if tmeta is None or tmeta.error is not None:
        raise LookupError(f"topic {topic!r} not found")
    return partition_ends(admin, topic, tmeta.partitions, isolation, timeout_s)
