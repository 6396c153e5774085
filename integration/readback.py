"""Read what a sink really left in each target system, the way a downstream reader would.

Why separate helpers: an exactly-once claim is only as good as its verifier. These read
Kafka with ``isolation.level=read_committed`` up to the last stable offset of every
partition, Postgres through plain SQL (and ``pg_prepared_xacts`` for lingering 2PC
transactions), and S3 through listings, including unfinished multipart uploads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.connectors.kafka.clients.offsets import Isolation, settled_ends, topic_ends
from txsink.connectors.kafka.readback import KafkaRecord, admin_client, read_records

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


# -- Kafka ------------------------------------------------------------------------------


def end_offsets(
    bootstrap: str, topic: str, *, isolation: Isolation = "read_committed", timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition, the offset a reader with ``isolation`` can read up to, once the
    markers of the transactions committed so far are in every partition.

    With ``read_committed`` that is the last stable offset (LSO): records of a still-open
    transaction lie beyond it. Right after a commit returns, Kafka may still be writing
    its markers, so this waits (a few seconds at most) for the LSO to reach the high
    watermark (:func:`txsink.connectors.kafka.clients.offsets.settled_ends`, the connector's one
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
    """Every record of ``topic`` a reader with ``isolation`` sees (the connector's reader,
    :func:`txsink.connectors.kafka.readback.read_records`)."""
    return read_records(bootstrap, topic, isolation=isolation, timeout_s=timeout_s, config=config)


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
