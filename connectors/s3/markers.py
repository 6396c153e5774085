"""Upload markers: which multipart upload is whose, for recovery.

``ListMultipartUploads`` returns keys and upload ids, nothing that names a transaction, and a
replay writes the same key with another upload. So every transaction keeps a small *marker*
object, ``<prefix>_txsink/uploads/<uid>/<txn>.json``, listing its keys and upload ids. The
key is written to the marker *before* CreateMultipartUpload and the upload id right after
it, so recovery (:func:`list_prepared`) finds every upload of ours, including those of a task
that died in between: for a key recorded without an upload id it lists that key's uploads
and takes every upload that no marker names. Commit and abort delete the marker last, so a
crash in between only makes recovery do the same work again.

Listing uploads: MinIO reads ``Prefix`` of ListMultipartUploads as an exact key (a folder
prefix answers nothing), so a key's uploads are listed with ``Prefix=<exact key>`` and, if
that finds none, the bucket's whole list once, without ``Prefix``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txsink.connectors.s3.handles import S3Handle, S3Object
from txsink.connectors.s3.target import S3Target
from txsink.txid import TxnId

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["UPLOADS", "delete", "key", "list_prepared", "put", "uploads_in"]

UPLOADS = "_txsink/uploads/"


def key(target: S3Target, txn: TxnId) -> str:
    """The full key of ``txn``'s marker."""
    return f"{target.prefix}{UPLOADS}{target.uid}/{txn}.json"


def put(
    target: S3Target, txn: TxnId, marker: str, record: Sequence[Mapping[str, str | None]]
) -> None:
    """(Re)write the marker ``marker`` with the transaction's keys and upload ids."""
    doc = {"version": 1, "txn": str(txn), "uploads": list(record)}
    store = target.objects("the upload marker", phase="write", txn=txn)
    store.put(marker[len(target.prefix) :], json.dumps(doc).encode())


def delete(target: S3Target, handle: S3Handle, *, phase: str) -> None:
    """Delete ``handle``'s marker: the last step of its commit or abort."""
    try:
        target.client.delete_object(Bucket=handle.bucket, Key=handle.marker)
    except Exception as err:
        raise target.error(err, "delete the marker", handle.marker, phase=phase) from err


def list_prepared(target: S3Target, app_id: str) -> list[S3Handle]:
    """A handle per marker of this sink and app: its uploads (keys and upload ids only)."""
    store = target.objects("the upload markers", phase="recover")
    folder = f"{UPLOADS}{target.uid}/"
    records: list[tuple[TxnId, str, list[dict[str, Any]]]] = []
    for name in store.list(folder):
        txn = TxnId.try_parse(name[len(folder) :].removesuffix(".json"))
        if txn is None or not txn.belongs_to(app_id, target.uid):
            continue
        raw = store.read(name)
        if raw is not None:  # else committed or aborted meanwhile
            doc = json.loads(raw)
            records.append((txn, target.prefix + name, list(doc.get("uploads", []))))
    known = {str(u["upload_id"]) for _, _, ups in records for u in ups if u["upload_id"]}
    client = target.client
    everything: list[tuple[str, str]] | None = None
    handles = []
    for txn, marker, uploads in records:
        objects = [
            S3Object(key=str(u["key"]), upload_id=str(u["upload_id"]))
            for u in uploads
            if u["upload_id"]
        ]
        for u in uploads:
            if u["upload_id"]:
                continue
            # The task died between recording the key and the upload id: every upload of
            # that key that no marker names is its.
            object_key = str(u["key"])
            try:
                ids = [
                    i for k, i in uploads_in(client, target.bucket, object_key) if k == object_key
                ]
                if not ids:
                    # Rare (a task died right there); some servers filter prefixes oddly,
                    # so look at the whole list once before concluding.
                    if everything is None:
                        everything = uploads_in(client, target.bucket)
                    ids = [i for k, i in everything if k == object_key]
            except Exception as err:
                raise target.error(
                    err, "list the multipart uploads of", object_key, phase="recover"
                ) from err
            objects += [S3Object(key=object_key, upload_id=i) for i in ids if i not in known]
        handles.append(
            S3Handle(txn=txn, bucket=target.bucket, marker=marker, objects=tuple(objects))
        )
    return handles


def uploads_in(client: S3Client, bucket: str, prefix: str = "") -> list[tuple[str, str]]:
    """(key, upload id) of the open multipart uploads whose key starts with ``prefix``.

    MinIO answers nothing for a folder ``Prefix`` ("dir/") but does answer an exact key;
    without ``prefix`` the bucket's whole list.
    """
    pages = client.get_paginator("list_multipart_uploads")
    found: list[tuple[str, str]] = []
    for page in (
        pages.paginate(Bucket=bucket, Prefix=prefix) if prefix else pages.paginate(Bucket=bucket)
    ):
        found.extend(
            (u["Key"], u["UploadId"])
            for u in page.get("Uploads", [])
            if "Key" in u and "UploadId" in u
        )
    return found


def upload_exists(client: S3Client, bucket: str, key: str, upload_id: str) -> bool:
    """Whether a listed multipart upload still holds its parts: MinIO keeps listing an
    upload that its stale-upload expiry purged (``ListParts`` answers ``NoSuchUpload``)."""
    try:
        client.list_parts(Bucket=bucket, Key=key, UploadId=upload_id, MaxParts=1)
    except client.exceptions.NoSuchUpload:
        return False
    return True
