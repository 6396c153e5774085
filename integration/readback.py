"""Read what a sink really left in each target system, the way a downstream reader would.

Why separate helpers: an exactly-once claim is only as good as its verifier. These read
Kafka with ``isolation.level=read_committed`` up to the last stable offset of every
partition, Postgres through plain SQL (and ``pg_prepared_xacts`` for lingering 2PC
transactions), and S3 through listings, including unfinished multipart uploads.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from _services.common import quiet_logger

from txsink.connectors.kafka.offsets import Isolation, settled_ends, topic_ends
from txsink.connectors.kafka.readback import admin_client

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# -- Kafka ------------------------------------------------------------------------------


@dataclass(frozen=True)
class KafkaRecord:
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


def end_offsets(
    bootstrap: str, topic: str, *, isolation: Isolation = "read_committed", timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition, the offset a reader with ``isolation`` can read up to, once the
    markers of the transactions committed so far are in every partition.

    With ``read_committed`` that is the last stable offset (LSO): records of a still-open
    transaction lie beyond it. Right after a commit returns, Kafka may still be writing
    its markers, so this waits (a few seconds at most) for the LSO to reach the high
    watermark (:func:`txsink.connectors.kafka.offsets.settled_ends`, the connector's one
    reader of end offsets); ``LookupError`` if the topic is missing.
    """
    admin = admin_client(bootstrap)
    if isolation == "read_uncommitted":
        return topic_ends(admin, topic, isolation, timeout_s)
    stable, _, _ = settled_ends(admin, topic, timeout_s, wait_s=10.0)
    return stable


def open_transactions(bootstrap: str, topic: str, timeout_s: float = 30.0) -> int:
    """How many partitions of ``topic`` hold a transaction left open (0 when clean)."""
    stable, high, _ = settled_ends(admin_client(bootstrap), topic, timeout_s, wait_s=10.0)
    return sum(1 for p, end in high.items() if stable.get(p, 0) < end)


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    isolation: Isolation = "read_committed",
    timeout_s: float = 60.0,
    config: dict[str, Any] | None = None,
) -> list[KafkaRecord]:
    """Every record of ``topic`` a reader with ``isolation`` sees, all partitions, in order.

    Reads from the beginning to the end offsets taken at call time (see ``end_offsets``);
    raises TimeoutError if that end is not reached in ``timeout_s``. No consumer group
    offsets are committed.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    ends = end_offsets(bootstrap, topic, isolation=isolation, timeout_s=timeout_s)
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
        "logger": quiet_logger(),
    }
    conf.update(config or {})
    consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(pending)])
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"read_topic({topic!r}): partitions {sorted(pending)} did not reach "
                    f"{ {p: ends[p] for p in pending} } in {timeout_s}s"
                )
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            part = msg.partition()
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    # EOF is reported at the end of what this isolation level can read;
                    # control records (commit/abort markers) are skipped up to there.
                    if part is not None and (msg.offset() or 0) >= ends.get(part, 0):
                        pending.discard(part)
                    continue
                raise RuntimeError(f"read_topic({topic!r}): {err}")
            assert part is not None
            offset = msg.offset()
            assert offset is not None
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


def read_values(bootstrap: str, topic: str, **kwargs: Any) -> list[bytes | None]:
    """Just the values, for quick exactly-once assertions (``Counter`` them for duplicates)."""
    return [r.value for r in read_topic(bootstrap, topic, **kwargs)]


# -- Postgres ---------------------------------------------------------------------------


def fetch_rows(
    dsn: str, query: str, params: Sequence[Any] | dict[str, Any] | None = None
) -> list[tuple[Any, ...]]:
    """Run one read-only query in its own connection and return all rows."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        return list(conn.execute(query, params).fetchall())


def list_prepared(dsn: str, prefix: str = "") -> list[str]:
    """gids of prepared (two-phase) transactions in the DSN's database starting with prefix."""
    rows = fetch_rows(
        dsn,
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s) ORDER BY prepared",
        (prefix,),
    )
    return [str(r[0]) for r in rows]


def count_prepared(dsn: str, prefix: str = "") -> int:
    """How many prepared transactions whose gid starts with ``prefix`` are still pending."""
    return len(list_prepared(dsn, prefix))


# -- S3 ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class MultipartUpload:
    key: str
    upload_id: str


def list_objects(client: S3Client, bucket: str, prefix: str = "") -> list[str]:
    """All object keys under ``prefix`` (paginated), sorted."""
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(obj["Key"] for obj in page.get("Contents", []))
    return sorted(keys)


def read_object(client: S3Client, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


def list_multipart_uploads(
    client: S3Client, bucket: str, prefix: str = ""
) -> list[MultipartUpload]:
    """Unfinished multipart uploads under ``prefix``: prepared-but-undecided S3 writes.

    Lists the whole bucket and filters here: MinIO treats ``Prefix`` of
    ListMultipartUploads as an exact object key (a real prefix returns nothing), while S3
    and moto treat it as a prefix. Listing without ``Prefix`` is right on all of them.
    """
    uploads: list[MultipartUpload] = []
    kwargs: dict[str, Any] = {"Bucket": bucket}
    while True:
        page = client.list_multipart_uploads(**kwargs)
        uploads.extend(
            MultipartUpload(key=u["Key"], upload_id=u["UploadId"])
            for u in page.get("Uploads", [])
            if u["Key"].startswith(prefix)
        )
        if not page.get("IsTruncated"):
            break
        kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
        kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")
    return sorted(uploads, key=lambda u: (u.key, u.upload_id))
