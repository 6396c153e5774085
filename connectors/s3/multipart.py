"""Multipart uploads: an object's rows become parts, then one complete makes it visible.

Write side (tasks): :func:`open_object` records the key in the transaction's marker, starts
the upload (``txsink-txn`` metadata, CRC32 checksums) and records its upload id; a
:class:`~txsink.kit.formats.FormatWriter` encodes rows into an in-memory buffer, cut into
``part_bytes`` parts that upload on the task's threads while encoding goes on;
:func:`finish_object` sends the last (possibly small) part and notes the expected ETag and
composite CRC32 of the completed object.

Commit side (driver): :func:`complete` with ``If-None-Match: *``; any failure is checked in
the bucket (:func:`verify`), never assumed from an error code: MinIO answers a second
complete with NoSuchUpload, moto with success, and an abort of a completed upload with
success. :func:`abort` and :func:`discard` abort uploads, then delete the marker.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
import zlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.connectors.s3 import markers
from txsink.connectors.s3.errors import describe, is_missing, is_no_such_upload
from txsink.connectors.s3.handles import S3Handle, S3Object, S3Part
from txsink.connectors.s3.target import S3Target
from txsink.errors import CommitError, ConfigurationError, TxsinkError
from txsink.kit import formats
from txsink.kit.formats import FormatWriter
from txsink.rowref import RowNaming
from txsink.txid import TxnId

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

__all__ = [
    "MAX_OBJECT_BYTES",
    "MAX_PARTS",
    "MAX_PART_BYTES",
    "MIN_PART_BYTES",
    "TXN_METADATA",
    "OpenObject",
    "OpenUploads",
    "abort",
    "complete",
    "composite_crc32",
    "discard",
    "finish_object",
    "multipart_etag",
    "open_object",
    "size",
    "verify",
    "write_rows",
]

TXN_METADATA = "txsink-txn"
MiB = 1024 * 1024
MIN_PART_BYTES = 5 * MiB
MAX_PART_BYTES = 5 * 1024 * MiB
MAX_PARTS = 10_000
#: S3's largest object: CompleteMultipartUpload refuses a larger one (EntityTooLarge),
#: which would be after the decision, so the pre-commit refuses it while uploading.
MAX_OBJECT_BYTES = 5 * 1024 * 1024 * MiB
_MD5_HEX = re.compile(r"^[0-9a-f]{32}$")


class _Buffer:
    """Where the encoder writes; the bytes wait here until they fill a part."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b: Any) -> None:
        self.data += b


@dataclass
class OpenObject:
    """One object being written: encoder → buffer → parts of its multipart upload."""

    key: str
    upload_id: str
    partition: tuple[tuple[str, str | None], ...]
    buffer: _Buffer
    writer: FormatWriter
    parts: list[S3Part] = field(default_factory=list)
    uploaded: int = 0  # bytes handed to part uploads (sent or in flight)
    next_part: int = 1
    in_flight: list[Future[S3Part]] = field(default_factory=list)


@dataclass
class OpenUploads:
    """A task's open transaction: its objects, open and finished, and its marker record."""

    txn: TxnId
    file_schema: pa.Schema
    partition_schema: tuple[tuple[str, str], ...]
    marker: str  # the marker's full key
    part_bytes: int
    upload_threads: int
    record: list[dict[str, str | None]] = field(default_factory=list)  # key, upload_id
    open: dict[tuple[str | None, ...], OpenObject] = field(default_factory=dict)
    done: list[S3Object] = field(default_factory=list)
    seq: int = 0
    rows: int = 0
    uploader: ThreadPoolExecutor | None = None  # part uploads overlap the encoding
    schema: str = ""  # the epoch's schema, partition columns included (encoded, for the handle)


# -- write side ------------------------------------------------------------------------------


def open_object(
    target: S3Target,
    txn: OpenUploads,
    key: str,
    partition: tuple[tuple[str, str | None], ...],
    *,
    format: str,
    compression: str | None,
) -> OpenObject:
    """Start the multipart upload of ``key``, recorded in the marker before and after."""
    client = target.client
    # Step 1: the key goes into the marker before the upload exists, so recovery can
    # find an upload whose id this task never got to record.
    txn.record.append({"key": key, "upload_id": None})
    markers.put(target, txn.txn, txn.marker, txn.record)
    try:
        upload = client.create_multipart_upload(
            Bucket=target.bucket,
            Key=key,
            Metadata={TXN_METADATA: str(txn.txn)},
            ContentType=formats.content_type(format, compression),
            ChecksumAlgorithm="CRC32",
        )
    except Exception as err:
        raise target.error(
            err, "start the multipart upload", key, phase="write", txn=txn.txn
        ) from err
    # Step 2: the upload id, so abort and commit name exactly this upload.
    txn.record[-1]["upload_id"] = upload["UploadId"]
    markers.put(target, txn.txn, txn.marker, txn.record)
    buffer = _Buffer()
    writer = FormatWriter(
        buffer,
        format,
        txn.file_schema,
        compression=compression,
        context=target.ctx(epoch=txn.txn.epoch, partition=txn.txn.partition),
    )
    return OpenObject(
        key=key, upload_id=upload["UploadId"], partition=partition, buffer=buffer, writer=writer
    )


def size(obj: OpenObject) -> int:
    """Encoded bytes of the object so far (the rolling rule of S3 counts these)."""
    return obj.uploaded + len(obj.buffer.data)


def write_rows(
    target: S3Target,
    txn: OpenUploads,
    obj: OpenObject,
    rows: pa.RecordBatch,
    first_row: int,
    *,
    naming: RowNaming | None = None,
) -> None:
    """Encode ``rows`` into ``obj`` and hand every full part to the upload threads
    (``naming``: how an error names a row)."""
    obj.writer.write(rows, first_row=first_row, naming=naming)
    _send_full_parts(target, txn, obj)


def _send_full_parts(target: S3Target, txn: OpenUploads, obj: OpenObject) -> None:
    data = obj.buffer.data
    while len(data) >= txn.part_bytes:
        _upload_part(target, txn, obj, bytes(data[: txn.part_bytes]))
        del data[: txn.part_bytes]


def finish_object(target: S3Target, txn: OpenUploads, obj: OpenObject) -> None:
    """Encoder footer, last part, wait for every part; the object joins ``txn.done``."""
    obj.writer.close()
    _send_full_parts(target, txn, obj)
    if obj.buffer.data or obj.next_part == 1:
        # The last part may be smaller than 5 MiB; so may the only part.
        _upload_part(target, txn, obj, bytes(obj.buffer.data))
        obj.buffer.data.clear()
    _wait_parts(obj, keep=0)
    obj.parts.sort(key=lambda p: p.number)
    txn.done.append(
        S3Object(
            key=obj.key,
            upload_id=obj.upload_id,
            parts=tuple(obj.parts),
            rows=obj.writer.rows,
            nbytes=obj.uploaded,
            etag=multipart_etag(obj.parts),
            checksum=composite_crc32(obj.parts),
            partition=obj.partition,
        )
    )


def _upload_part(target: S3Target, txn: OpenUploads, obj: OpenObject, data: bytes) -> None:
    """Hand one part to the task's upload threads; at most ``upload_threads`` wait.

    The encoder goes on while parts travel (memory: up to ``upload_threads`` parts in
    flight per task). Numbers are assigned here, in order; a failed upload surfaces at the
    next wait, typed like a synchronous one.
    """
    number = obj.next_part
    if number > MAX_PARTS:
        raise ConfigurationError(
            f"object {obj.key} needs more than {MAX_PARTS} parts of part_bytes="
            f"{txn.part_bytes}: raise part_bytes or lower target_object_bytes",
            **target.ctx(phase="write", epoch=txn.txn.epoch, partition=txn.txn.partition),
        )
    if obj.uploaded + len(data) > MAX_OBJECT_BYTES:
        raise ConfigurationError(
            f"object {obj.key} would be larger than S3's largest object (5 TiB), which "
            "CompleteMultipartUpload would refuse after the decision: lower "
            "target_object_bytes (objects roll over at it)",
            **target.ctx(phase="write", epoch=txn.txn.epoch, partition=txn.txn.partition),
        )
    obj.next_part += 1
    obj.uploaded += len(data)
    if txn.uploader is None:
        txn.uploader = ThreadPoolExecutor(
            max_workers=txn.upload_threads, thread_name_prefix="txsink-s3-part"
        )
    client = target.client
    obj.in_flight.append(
        txn.uploader.submit(
            _send_part,
            target,
            client,
            txn.txn,
            key=obj.key,
            upload_id=obj.upload_id,
            number=number,
            data=data,
        )
    )
    _wait_parts(obj, keep=txn.upload_threads)


def _wait_parts(obj: OpenObject, keep: int) -> None:
    """Collect finished part uploads until at most ``keep`` are in flight."""
    while len(obj.in_flight) > keep:
        obj.parts.append(obj.in_flight.pop(0).result())


def _send_part(
    target: S3Target,
    client: S3Client,
    txn: TxnId,
    *,
    key: str,
    upload_id: str,
    number: int,
    data: bytes,
) -> S3Part:
    try:
        answer = client.upload_part(
            Bucket=target.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=data,
            ChecksumAlgorithm="CRC32",
        )
    except Exception as err:
        raise target.error(err, f"upload part {number}", key, phase="write", txn=txn) from err
    return S3Part(number, answer["ETag"].strip('"'), answer.get("ChecksumCRC32", "") or "")


def multipart_etag(parts: Sequence[S3Part]) -> str:
    """S3's ETag of a completed multipart upload, if every part ETag is an MD5."""
    if not parts or not all(_MD5_HEX.match(p.etag) for p in parts):
        return ""
    digest = hashlib.md5(b"".join(bytes.fromhex(p.etag) for p in parts))  # noqa: S324 - S3's ETag
    return f"{digest.hexdigest()}-{len(parts)}"


def composite_crc32(parts: Sequence[S3Part]) -> str:
    """S3's composite CRC32 of a multipart upload: the CRC32 of the part CRC32s."""
    if not parts or not all(p.crc32 for p in parts):
        return ""
    raw = b"".join(base64.b64decode(p.crc32) for p in parts)
    return f"{base64.b64encode(zlib.crc32(raw).to_bytes(4, 'big')).decode()}-{len(parts)}"


def discard(target: S3Target, txn: OpenUploads) -> None:
    """Best effort: abort the task's uploads; recovery aborts whatever this leaves."""
    if txn.uploader is not None:  # let part uploads end before their uploads are aborted
        txn.uploader.shutdown(wait=True, cancel_futures=True)
    try:
        client = target.client
    except TxsinkError:
        return
    for entry in txn.record:
        if entry["upload_id"] is not None:
            with contextlib.suppress(Exception):
                client.abort_multipart_upload(
                    Bucket=target.bucket, Key=str(entry["key"]), UploadId=entry["upload_id"]
                )
    if all(e["upload_id"] is not None for e in txn.record):
        with contextlib.suppress(Exception):
            client.delete_object(Bucket=target.bucket, Key=txn.marker)


# -- commit side ---------------------------------------------------------------------------------


def complete(target: S3Target, completing: S3Client, handle: S3Handle, obj: S3Object) -> None:
    """CompleteMultipartUpload with ``If-None-Match: *``, or verified as completed before."""
    parts: list[CompletedPartTypeDef] = []
    for p in obj.parts:
        part: CompletedPartTypeDef = {"PartNumber": p.number, "ETag": f'"{p.etag}"'}
        if p.crc32:
            part["ChecksumCRC32"] = p.crc32
        parts.append(part)
    try:
        completing.complete_multipart_upload(
            Bucket=handle.bucket,
            Key=obj.key,
            UploadId=obj.upload_id,
            MultipartUpload={"Parts": parts},
            IfNoneMatch="*",
        )
        return
    except Exception as err:
        failure = err
    # Completed before (by a driver that crashed, or by a retried request whose answer
    # was lost), or refused: the object itself says which.
    try:
        found = verify(target, target.client, handle, obj)
    except TxsinkError:
        raise
    except Exception as err:
        raise target.error(
            err, "verify the object", obj.key, phase="commit", txn=handle.txn
        ) from err
    if found:
        target.log(handle.txn.epoch).info(
            "%s was already completed (verified in the bucket): %s", obj.key, describe(failure)
        )
        return
    if is_no_such_upload(failure):
        raise CommitError(
            f"cannot commit {handle.txn}: its multipart upload of s3://{handle.bucket}/"
            f"{obj.key} is gone and the object was never completed, so its {obj.rows} rows "
            "are LOST. Was the upload aborted by hand, or expired by the server (a bucket "
            "lifecycle rule AbortIncompleteMultipartUpload, MinIO's api stale_uploads_expiry "
            "of 24h by default)? Those must allow more than the query's longest downtime",
            **target.ctx(phase="commit", epoch=handle.txn.epoch, partition=handle.txn.partition),
        )
    raise target.error(failure, "complete the upload", obj.key, phase="commit", txn=handle.txn)


def verify(target: S3Target, client: S3Client, handle: S3Handle, obj: S3Object) -> bool:
    """True if the object is the one this handle's upload completes to; False if absent.

    Raises:
        CommitError: the object exists but another writer's, or changed after the commit.
    """
    try:
        head = client.head_object(Bucket=handle.bucket, Key=obj.key, ChecksumMode="ENABLED")
    except Exception as err:
        if is_missing(err):
            return False
        raise
    ctx = target.ctx(phase="commit", epoch=handle.txn.epoch, partition=handle.txn.partition)
    where = f"s3://{handle.bucket}/{obj.key}"
    owner = head.get("Metadata", {}).get(TXN_METADATA)
    if owner != str(handle.txn):
        raise CommitError(
            f"cannot commit {handle.txn}: {where} exists but was written by "
            f"{owner or 'something other than txsink'}; another writer uses this prefix "
            "with the same sink uid. Stop it, and move the object away only if it is not "
            "output you need",
            **ctx,
        )
    size = head.get("ContentLength")
    etag = head.get("ETag", "").strip('"')
    checksum = head.get("ChecksumCRC32", "")
    parts = f"-{len(obj.parts)}"
    mismatch = None
    if size != obj.nbytes:
        mismatch = f"size {size} vs {obj.nbytes}"
    elif obj.checksum and checksum.endswith(parts):
        # The composite CRC32 is computed on the data, whatever the encryption.
        if checksum != obj.checksum:
            mismatch = f"CRC32 {checksum} vs {obj.checksum}"
    elif obj.etag and (etag.endswith(parts) or _MD5_HEX.match(etag)) and etag != obj.etag:
        # No composite checksum reported (moto): the md5-of-md5s ETag instead. A plain
        # MD5 ETag is an object from a single PUT, never from our multipart upload.
        mismatch = f"ETag {etag} vs {obj.etag}"
    if mismatch is not None:
        raise CommitError(
            f"cannot commit {handle.txn}: {where} was written by this transaction but is "
            f"not what it prepared ({mismatch}); the object was changed after it was "
            "committed",
            **ctx,
        )
    return True


def abort(target: S3Target, handle: S3Handle) -> None:
    """Abort every upload of ``handle`` (gone already is fine), then delete its marker."""
    client = target.client
    for obj in handle.objects:
        try:
            client.abort_multipart_upload(Bucket=handle.bucket, Key=obj.key, UploadId=obj.upload_id)
        except Exception as err:
            if not is_no_such_upload(err):
                raise target.error(
                    err, "abort the upload", obj.key, phase="abort", txn=handle.txn
                ) from err
    markers.delete(target, handle, phase="abort")
