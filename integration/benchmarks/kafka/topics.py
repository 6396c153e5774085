"""The broker side: a fresh topic per run, deleted after it, and the verification: what
a ``read_committed`` consumer sees in a topic, summed (order-independent)."""

from __future__ import annotations

import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from _services.common import quiet_logger
from benchmarks import _bench

from txsink.connectors.kafka import readback as kafka_readback
from txsink.connectors.kafka.clients.offsets import Isolation, settled_ends, topic_ends
from txsink.connectors.kafka.readback import admin_client

from .records import ID_PREFIX

# How long the verification waits for every partition's last stable offset to reach its high
# watermark (the commit markers land a moment after the commit returns).
LSO_WAIT_S = 30.0


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` (replication 1) and wait until every partition is served."""
    kafka_readback.create_topic(bootstrap, topic, partitions, timeout_s=60)
    # Wait until every partition's leader serves it: ListOffsets answers only then. (Metadata
    # names a leader a moment before its log exists; an idempotent producer that starts in
    # that moment can get its batches out of sequence: OutOfOrderSequenceException.)
    admin = admin_client(bootstrap)
    deadline = time.monotonic() + 60
    last = ""
    while time.monotonic() < deadline:
        try:
            offsets = topic_ends(admin, topic, "read_uncommitted", 10)
            if len(offsets) == partitions:
                return
            last = f"{len(offsets)} of {partitions} partitions"
        except Exception as err:
            last = str(err)
        time.sleep(0.1)
    raise RuntimeError(f"topic {topic} is not served after 60 s: {last}")


def delete_topics(bootstrap: str, topics: Sequence[str]) -> None:
    if not topics:
        return
    admin = admin_client(bootstrap)  # keep it referenced: its futures die with it
    futures = admin.delete_topics(list(topics), operation_timeout=60)
    for topic, future in futures.items():
        try:
            future.result(timeout=60)
        except Exception as err:  # a missing topic is fine; anything else only logged
            _bench.log(f"could not delete topic {topic}: {err}")


def end_offsets(admin: Any, topic: str, isolation: Isolation) -> dict[int, int]:
    """Per partition: the last stable offset (read_committed) or high watermark."""
    return topic_ends(admin, topic, isolation, 60.0)


@dataclass
class Readback:
    """What a read_committed reader sees in a topic, summed (order-independent)."""

    records: int = 0
    key_bytes: int = 0
    value_bytes: int = 0
    key_crc: int = 0
    value_crc: int = 0
    distinct: int = 0
    duplicates: int = 0
    bad_ids: int = 0
    open_partitions: int = 0  # last stable offset < high watermark: a transaction left open
    offsets: int = 0  # sum of high watermarks (records + transaction markers + aborted)
    seconds: float = 0.0  # the whole read-back, lso_wait_s included
    lso_wait_s: float = 0.0  # waiting for the last stable offsets to reach the high watermarks

    def fingerprint(self) -> tuple[int, ...]:
        return (self.records, self.key_bytes, self.value_bytes, self.key_crc, self.value_crc)


def read_back(bootstrap: str, topic: str, rows: int, timeout_s: float = 300.0) -> Readback:
    """Read ``topic`` with read_committed to its last stable offsets; sum what it holds.

    First waits (up to ``LSO_WAIT_S``) until the commit markers are in every partition
    (:func:`settled_ends`), and logs how long if it had to. Then one consumer over all
    partitions, batched ``consume``; per record only the CRC32s, lengths and the id (from
    the value's ``{"id":N,`` prefix) in a bitmap of ``rows``.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    t0 = time.perf_counter()
    out = Readback()
    ends, hwm, out.lso_wait_s = settled_ends(
        admin_client(bootstrap), topic, 60.0, wait_s=LSO_WAIT_S
    )
    if out.lso_wait_s > 0:
        _bench.log(
            f"read_back({topic}): waited {out.lso_wait_s:.2f} s until the last stable offsets "
            "reached the high watermarks (the commit markers were still being written)"
        )
    out.offsets = sum(hwm.values())
    out.open_partitions = sum(1 for p, e in ends.items() if e < hwm.get(p, e))
    pending = {p for p, end in ends.items() if end > 0}
    seen = bytearray(rows)
    if pending:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"txsink-bench-{uuid.uuid4().hex[:12]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.max.bytes": 64 << 20,
                "max.partition.fetch.bytes": 16 << 20,
                "logger": quiet_logger(),
            }
        )
        crc32 = zlib.crc32
        eof = KafkaError._PARTITION_EOF
        records = key_bytes = value_bytes = key_crc = value_crc = dups = bad = 0
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in sorted(pending)])
            deadline = time.monotonic() + timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"read_back({topic}): {sorted(pending)} not at their end")
                for msg in consumer.consume(20_000, 0.5):
                    err = msg.error()
                    part = msg.partition()
                    offset = msg.offset()
                    if err is not None and err.code() != eof:
                        raise RuntimeError(f"read_back({topic}): {err}")
                    if part is None or offset is None:
                        continue
                    if err is not None:  # end of partition
                        if offset >= ends[part]:
                            pending.discard(part)
                        continue
                    if offset >= ends[part]:
                        pending.discard(part)
                        continue
                    key = msg.key() or b""
                    value = msg.value() or b""
                    records += 1
                    key_bytes += len(key)
                    value_bytes += len(value)
                    key_crc += crc32(key)
                    value_crc += crc32(value)
                    comma = value.find(b",", 6)
                    try:
                        ident = int(value[6:comma]) if value.startswith(ID_PREFIX) else -1
                    except ValueError:
                        ident = -1
                    if 0 <= ident < rows:
                        if seen[ident]:
                            dups += 1
                        else:
                            seen[ident] = 1
                    else:
                        bad += 1
                    if offset + 1 >= ends[part]:
                        pending.discard(part)
        finally:
            consumer.close()
        out.records, out.key_bytes, out.value_bytes = records, key_bytes, value_bytes
        out.key_crc, out.value_crc, out.duplicates, out.bad_ids = key_crc, value_crc, dups, bad
        out.distinct = records - dups - bad
    out.seconds = time.perf_counter() - t0
    return out
