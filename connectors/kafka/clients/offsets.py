"""How far a reader can read: per partition, the last stable offset (``read_committed``)
or the high watermark (``read_uncommitted``).

The one reader of end offsets in the connector: the marker read waits for the first to
reach the second, and the test verifiers count a partition whose first lags the second as
a transaction left open.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Literal

__all__ = ["Isolation", "partition_ends", "settled_ends", "topic_ends"]

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


def settled_ends(
    admin: Any, topic: str, timeout_s: float, *, wait_s: float = 30.0
) -> tuple[dict[int, int], dict[int, int], float]:
    """The last stable offsets and high watermarks of ``topic`` once they agree, and the
    seconds waited for that.

    Kafka's EndTxn returns once the transaction coordinator has logged the commit, before
    it has written the commit markers to every partition: right after a commit returns, a
    partition's last stable offset can still lag its high watermark, and a reader stopping
    there would miss committed records (or take them for an open transaction). Waits up to
    ``wait_s`` for every partition's last stable offset to reach its high watermark; one
    still behind after that holds a transaction left open (the caller reports it).
    """
    t0 = time.monotonic()
    waited = 0.0  # stays 0 when they agree at once
    while True:
        # The last stable offsets first: a marker written between the two reads makes
        # them differ and the loop read again, never agree on a stale high watermark.
        stable = topic_ends(admin, topic, "read_committed", timeout_s)
        high = topic_ends(admin, topic, "read_uncommitted", timeout_s)
        if all(e >= high.get(p, e) for p, e in stable.items()) or waited > wait_s:
            return stable, high, waited
        time.sleep(0.05)
        waited = time.monotonic() - t0
