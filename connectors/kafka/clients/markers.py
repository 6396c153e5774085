"""The compacted marker topic: which epoch each shard committed last.

A marker is a record keyed ``<app>/<uid>/<shard>`` whose value names the epoch, written
inside the shard's commit transaction: a ``read_committed`` read shows it exactly when
the epoch's records are visible. The topic is compacted (one partition), so markers never
expire — consumer-group offsets, Beam's choice, expire after 7 days by default.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from txsink.connectors.kafka.clients.errors import client_calls, has_code
from txsink.connectors.kafka.clients.offsets import Isolation, partition_ends
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.errors import ConfigurationError, RetryableError

__all__ = ["Markers", "ensure_marker_topic", "marker_key"]

_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": "3600000",
    "min.cleanable.dirty.ratio": "0.1",
}


def marker_key(app: str, uid: str, shard: int) -> str:
    return f"{app}/{uid}/{shard}"


class Markers:
    """The markers of one sink, read from the marker topic and cached in this process.

    The cache is right only while this process's producer of a shard is the shard's
    owner: :class:`~txsink.connectors.kafka.clients.producers.ShardProducers` forgets a shard's
    entry whenever it (re)initialises or loses that producer.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._known: dict[int, int] = {}  # shard -> epoch; -1: read, none yet
        self._admin: Any = None

    def record(self, app: str, shard: int, epoch: int) -> tuple[bytes, bytes]:
        """The marker record (key, value) saying ``shard`` committed ``epoch``."""
        value = {
            "app": app,
            "uid": self.settings.uid,
            "shard": shard,
            "shards": self.settings.shards,
            "epoch": epoch,
            "at": time.time(),
        }
        return marker_key(app, self.settings.uid, shard).encode(), json.dumps(value).encode()

    def last(self, app: str, shard: int) -> int | None:
        """The last committed epoch of ``shard`` (cached; call after init_transactions)."""
        self.load(app, [shard])
        found = self._known[shard]
        return None if found < 0 else found

    def load(self, app: str, shards: Sequence[int]) -> None:
        """Read the markers of those ``shards`` not cached yet, in one pass."""
        unread = [shard for shard in shards if shard not in self._known]
        if unread:
            self._known.update(self.read(app, unread))

    def reread(self, app: str, shard: int, *, wait_s: float | None = None) -> int | None:
        """The marker of ``shard`` read again, past the cache (another driver may have
        committed since); ``wait_s`` as for :meth:`read`."""
        self._known.update(self.read(app, [shard], wait_s=wait_s))
        return self.last(app, shard)

    def remember(self, shard: int, epoch: int) -> None:
        self._known[shard] = epoch

    def forget(self, shard: int) -> None:
        self._known.pop(shard, None)

    def clear(self) -> None:
        self._known.clear()

    def read(
        self,
        app: str,
        shards: Sequence[int],
        *,
        wait_s: float | None = None,
        phase: str = "commit",
    ) -> dict[int, int]:
        """:meth:`_read`, its client errors classified and named (a leader election on the
        marker topic is a RetryableError naming the shard, never a raw KafkaException);
        ``phase``: the protocol step reading (the commit, recovery's look at the markers)."""
        shard = shards[0] if len(shards) == 1 else None
        with client_calls(self.settings, "reading the marker topic", phase=phase, shard=shard):
            return self._read(app, shards, wait_s=wait_s)

    def _read(
        self, app: str, shards: Sequence[int], *, wait_s: float | None = None
    ) -> dict[int, int]:
        """Read the markers of ``shards`` (-1: none) from the marker topic, read_committed.

        Complete up to the marker topic's end as of this call: first wait until the
        partition's last stable offset reaches its high watermark. Another producer's
        transaction left open on the shared marker topic (another query mid-commit, a
        dead one until its transaction times out) holds the last stable offset below
        markers committed after it; a read that stopped there would miss our newest
        marker and commit that epoch again. ``wait_s``: how long to wait for that
        (default ``timeout_s``): a reused producer waits briefly, then initialises a new
        producer, which aborts what a dead producer of its transactional id left open.
        """
        from confluent_kafka import Consumer, TopicPartition

        s = self.settings
        ctx = s.context("commit")
        started = time.monotonic()
        deadline = started + s.timeout_s
        waited = s.timeout_s if wait_s is None else min(wait_s, s.timeout_s)
        end = self._end("read_uncommitted")
        while (stable := self._end("read_committed")) < end:
            if time.monotonic() > started + waited:
                raise RetryableError(
                    f"marker topic {s.marker_topic!r}: a transaction of another producer has "
                    f"been open for over {waited:.0f}s (last stable offset {stable}, end "
                    f"{end}), so the markers cannot be read completely. It ends when that "
                    "producer commits or its transaction.timeout.ms passes; retry then",
                    **ctx,
                )
            time.sleep(0.05)
        wanted = {marker_key(app, s.uid, shard).encode(): shard for shard in shards}
        found = dict.fromkeys(shards, -1)
        if end == 0:
            return found
        consumer = Consumer(
            {
                **s.client_config(),
                "group.id": f"txsink-marker-{s.uid}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
            }
        )
        try:
            consumer.assign([TopicPartition(s.marker_topic, 0, 0)])
            while True:
                msg = consumer.poll(max(0.0, deadline - time.monotonic()))
                if msg is None:
                    raise RetryableError(
                        f"timed out reading marker topic {s.marker_topic!r}", **ctx
                    )
                err = msg.error()
                if err is not None:
                    if not has_code(err, "_PARTITION_EOF"):
                        raise RetryableError(
                            f"cannot read marker topic {s.marker_topic!r}: {err.str()}", **ctx
                        )
                    if (msg.offset() or 0) >= end:  # EOF sits at the last stable offset
                        break
                    continue
                shard = wanted.get(msg.key() or b"")
                if shard is not None and msg.value() is not None:
                    found[shard] = int(json.loads(msg.value() or b"{}")["epoch"])
        finally:
            consumer.close()
        s.reachable()
        return found

    def _end(self, isolation: Isolation) -> int:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self.settings.client_config())
        s = self.settings
        return partition_ends(self._admin, s.marker_topic, [0], isolation, s.timeout_s)[0]


def ensure_marker_topic(
    admin: Any, meta: Any, settings: KafkaSettings, ctx: dict[str, Any]
) -> bool:
    """Create the marker topic (compacted, one partition) unless it exists; refuse one
    that is not ``cleanup.policy=compact``: its markers would expire. At start. True when
    it created the topic (``meta`` does not list it then)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    name = settings.marker_topic
    if name not in meta.topics:
        topic = NewTopic(
            name,
            num_partitions=1,
            replication_factor=min(3, len(meta.brokers)),
            config=dict(_TOPIC_CONFIG),
        )
        try:
            admin.create_topics([topic])[name].result(timeout=settings.timeout_s)
        except KafkaException as err:
            if not has_code(err.args[0], "TOPIC_ALREADY_EXISTS"):
                raise ConfigurationError(
                    f"cannot create the marker topic {name!r}: {err}. Create it "
                    "with cleanup.policy=compact, or grant CREATE",
                    **ctx,
                ) from err
        return True
    res = ConfigResource(ResourceType.TOPIC, name)
    policy = (
        admin.describe_configs([res])[res].result(timeout=settings.timeout_s).get("cleanup.policy")
    )
    if policy is None or policy.value.replace(" ", "") != "compact":
        raise ConfigurationError(
            f"marker topic {name!r} has cleanup.policy="
            f"{getattr(policy, 'value', None)!r}: markers would expire and an old epoch "
            "could be written twice. Use a topic with cleanup.policy=compact only",
            **ctx,
        )
    return False
