"""Reading an S3 sink's output the safe way: through its epoch manifests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txsink.connectors.s3.client import make_client, parse_s3_url
from txsink.connectors.s3.hive import partition_types
from txsink.connectors.s3.store import S3Objects
from txsink.errors import TxsinkError
from txsink.kit import evolving, formats, manifests

__all__ = ["committed_schema", "legacy_schema", "read_committed", "read_manifests"]


def _as_it_is(op: str, where: str, err: Exception) -> Exception:
    return err  # readers let botocore's errors through, as boto3 users expect


def _store(url: str, client_options: Mapping[str, Any] | None) -> S3Objects:
    loc = parse_s3_url(url)
    return S3Objects(make_client(client_options), loc.bucket, loc.prefix, fail=_as_it_is)


def read_manifests(
    url: str, uid: str | None = None, client_options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The epoch manifests of an S3 sink, by epoch (optionally of one sink uid)."""
    return manifests.read_manifests(_store(url, client_options), uid)


def read_committed(
    url: str, uid: str | None = None, client_options: Mapping[str, Any] | None = None
) -> pa.Table:
    """Read every row of whole committed epochs only, following the manifests.

    Adds the ``partition_by`` columns back (typed as written) and an ``_epoch`` column.
    JSON lines come back as JSON types (strings for timestamps, decimals and binary).
    Parquet epochs of different schemas come back in the widest one, the newest
    manifest's (:func:`txsink.kit.evolving.widest`): rows of older epochs null in columns
    added since, widened columns cast up.
    """
    store = _store(url, client_options)
    types = partition_types()

    def read(doc: Mapping[str, Any], entry: Mapping[str, Any]) -> pa.Table:
        raw = store.read(str(entry["key"]))
        if raw is None:
            raise TxsinkError(
                f"{store.location}{entry['key']} is listed in the manifest of epoch "
                f"{doc['epoch']} but does not exist: was it deleted by hand?",
                sink_uid=doc["uid"],
                epoch=doc["epoch"],
                connector="s3",
                phase="read",
            )
        table = formats.read_table(raw, doc["format"], doc.get("compression"))
        kinds = doc.get("partition_types", {})
        for col in doc["partition_by"]:
            array = pa.array([entry["partition"].get(col)] * len(table), pa.string())
            table = table.append_column(
                col, array.cast(types.get(str(kinds.get(col)), pa.string()))
            )
        return table

    docs = read_manifests(url, uid, client_options)
    return evolving.widest(manifests.read_committed(docs, read, "objects"), docs)


def committed_schema(
    url: str, uid: str | None = None, client_options: Mapping[str, Any] | None = None
) -> pa.Schema | None:
    """The widest schema the manifests record (the newest epoch's, for one sink uid),
    partition columns included: what to give another reader of the Parquet objects, e.g.
    Spark's ``spark.read.schema(from_arrow_schema(...))`` (docs/connectors/s3.md). None
    when no manifest records one."""
    return evolving.widest_recorded(read_manifests(url, uid, client_options))


def legacy_schema(
    client: Any, bucket: str, prefix: str, doc: Mapping[str, Any]
) -> pa.Schema | None:
    """The schema of an epoch whose manifest records none (written before schemas were):
    its first object's Parquet footer (one ranged GET, two for a footer over 64 KiB), then
    the partition columns as the manifest types them. None for JSON lines and CSV, which
    carry no types."""
    objects = doc.get("objects") or []
    if doc.get("format") != "parquet" or not objects:
        return None
    key = f"{prefix}{objects[0]['key']}"
    tail = _tail(client, bucket, key, 64 * 1024)
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if need > len(tail):
        tail = _tail(client, bucket, key, need)
    schema = pq.read_schema(pa.BufferReader(tail[-need:]))
    types, kinds = partition_types(), doc.get("partition_types", {})
    for col in doc.get("partition_by", []):
        schema = schema.append(pa.field(col, types.get(str(kinds.get(col)), pa.string())))
    return schema


def _tail(client: Any, bucket: str, key: str, size: int) -> bytes:
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=-{size}")["Body"]
    try:
        return bytes(body.read())
    finally:
        body.close()
