"""Reading an S3 sink's output the safe way: through its epoch manifests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from txsink.connectors.s3.client import make_client, parse_s3_url
from txsink.connectors.s3.hive import partition_types
from txsink.connectors.s3.store import S3Objects
from txsink.errors import TxsinkError
from txsink.kit import formats, manifests

__all__ = ["read_committed", "read_manifests"]


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

    return manifests.read_committed(read_manifests(url, uid, client_options), read, "objects")
