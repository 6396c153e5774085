"""Reading an S3 sink's output the safe way: through its epoch manifests; and its audit, the
prefix read back epoch by epoch (:class:`S3Output`, ``txsink audit``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txsink.audit import AuditRequest, TargetAudit
from txsink.connectors.s3.client import make_client, parse_s3_url
from txsink.connectors.s3.errors import is_missing
from txsink.connectors.s3.handles import S3Handle
from txsink.connectors.s3.hive import partition_types
from txsink.connectors.s3.store import S3Objects
from txsink.connectors.s3.target import S3Target
from txsink.errors import TxsinkError
from txsink.handles import Handle
from txsink.kit import evolving, formats, manifests
from txsink.kit.manifest_audit import Stored, audit_manifests

__all__ = [
    "S3Output",
    "committed_schema",
    "legacy_schema",
    "read_committed",
    "read_entry",
    "read_manifests",
]


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

    def read(doc: Mapping[str, Any], entry: Mapping[str, Any]) -> pa.Table:
        return read_entry(store, doc, entry)

    docs = read_manifests(url, uid, client_options)
    return evolving.widest(manifests.read_committed(docs, read, "objects"), docs)


def read_entry(store: S3Objects, doc: Mapping[str, Any], entry: Mapping[str, Any]) -> pa.Table:
    """One object a manifest lists, its ``partition_by`` columns added back (as typed)."""
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
    types, kinds = partition_types(), doc.get("partition_types", {})
    for col in doc["partition_by"]:
        array = pa.array([entry["partition"].get(col)] * len(table), pa.string())
        table = table.append_column(col, array.cast(types.get(str(kinds.get(col)), pa.string())))
    return table


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
    schema = pq.read_schema(_footer(client, bucket, f"{prefix}{objects[0]['key']}"))
    types, kinds = partition_types(), doc.get("partition_types", {})
    for col in doc.get("partition_by", []):
        schema = schema.append(pa.field(col, types.get(str(kinds.get(col)), pa.string())))
    return schema


def _footer(client: Any, bucket: str, key: str) -> pa.BufferReader:
    """A Parquet object's footer: one ranged GET, two for a footer over 64 KiB."""
    tail = _tail(client, bucket, key, 64 * 1024)
    need = int.from_bytes(tail[-8:-4], "little") + 8
    if need > len(tail):
        tail = _tail(client, bucket, key, need)
    return pa.BufferReader(tail[-need:])


def _tail(client: Any, bucket: str, key: str, size: int) -> bytes:
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=-{size}")["Body"]
    try:
        return bytes(body.read())
    finally:
        body.close()


class S3Output:
    """An S3 sink's prefix, as :func:`~txsink.kit.manifest_audit.audit_manifests` reads it
    (``txsink audit``): a HEAD per listed object (size and ETag), a ranged GET of each
    Parquet footer; the audited epochs' ``epoch=<e>/`` folders and the top level listed
    (the whole prefix once with ``partition_by``); deep, each listed object read whole."""

    listing = "objects"
    name_field = "key"

    def __init__(self, target: S3Target, partition_by: Sequence[str]) -> None:
        self.target = target
        self.uid = target.uid
        self.partitioned = bool(partition_by)
        target.client  # noqa: B018 - bad client_options: the sink's ConfigurationError
        # Its own client (the contract's): an audit may run beside a commit of the sink.
        self.client = make_client(target.client_options)

        def fail(op: str, key: str, err: Exception) -> Exception:
            return target.error(err, f"{op} the output at", key, phase="audit")

        self._store = S3Objects(self.client, target.bucket, target.prefix, fail=fail)

    def where(self, name: str) -> str:
        return f"{self.target.url}{name}"

    def manifest(self, epoch: int) -> dict[str, Any] | None:
        raw = self._store.read(manifests.key(self.uid, epoch))
        return dict(json.loads(raw)) if raw is not None else None

    def decided(self, handle: Handle) -> list[str]:
        if not isinstance(handle, S3Handle):
            return []
        return [o.key.removeprefix(self.target.prefix) for o in handle.objects]

    def stat(self, name: str) -> Stored | None:
        key = f"{self.target.prefix}{name}"
        try:
            head = self.client.head_object(Bucket=self.target.bucket, Key=key)
        except Exception as err:
            if is_missing(err):
                return None
            raise self.target.error(err, "read the size of", key, phase="audit") from err
        return Stored(int(head["ContentLength"]), str(head.get("ETag", "")).strip('"'))

    def check(self, entry: Mapping[str, Any], stored: Stored) -> str | None:
        etag = str(entry.get("etag") or "")
        if etag and stored.tag and etag != stored.tag:
            return (
                f"object {self.where(str(entry['key']))} has ETag {stored.tag}, the manifest "
                f"recorded {etag}: it was written again since"
            )
        return None

    def footer_rows(self, name: str, stored: Stored) -> int:
        key = f"{self.target.prefix}{name}"
        try:
            footer = _footer(self.client, self.target.bucket, key)
        except Exception as err:
            raise self.target.error(err, "read the Parquet footer of", key, phase="audit") from err
        return int(pq.read_metadata(footer).num_rows)  # not Parquet: the audit's problem

    def list_data(self, epochs: Sequence[int]) -> list[str]:
        if self.partitioned:  # epoch folders sit under the Hive folders: list them all
            hidden = ("_txsink/", "_manifests/")
            return [n for n in self._store.list("") if not n.startswith(hidden)]
        names = self._top_level()
        for epoch in epochs:
            names += self._store.list(f"epoch={epoch}/")
        return sorted(names)

    def _top_level(self) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2")
        prefix = self.target.prefix
        try:
            return [
                str(o["Key"])[len(prefix) :]
                for page in pages.paginate(Bucket=self.target.bucket, Prefix=prefix, Delimiter="/")
                for o in page.get("Contents", ())
                if "Key" in o
            ]
        except Exception as err:
            raise self.target.error(err, "list", prefix, phase="audit") from err

    def read(self, doc: Mapping[str, Any], entry: Mapping[str, Any]) -> pa.Table:
        return read_entry(self._store, doc, entry)

    def verify(self, entry: Mapping[str, Any]) -> str | None:
        return None  # the ETag (the content's MD5s) is compared at the metadata level

    def notes(self) -> list[str]:
        notes = [
            "metadata: a HEAD per listed object compares its size and its ETag with the "
            "manifest's (a rewrite changes the ETag, even at the same size); an object whose "
            "manifest recorded no ETag is compared by size and footer only"
        ]
        if self.partitioned:
            notes.append(
                "extras: with partition_by the whole prefix is listed once (epoch folders sit "
                "under the Hive folders): a listing, no object is read"
            )
        return notes


def audit(target: S3Target, partition_by: Sequence[str], request: AuditRequest) -> TargetAudit:
    """The S3 sink's answer to ``request`` (:mod:`txsink.kit.manifest_audit`)."""
    return audit_manifests(request, S3Output(target, partition_by))
