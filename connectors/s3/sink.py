"""S3 connector: exactly-once Parquet, JSON lines or CSV objects through multipart uploads.

How the two phases map to S3::

    begin    nothing yet (the first row of a Hive partition opens its object)
    write    per object: record the key in the transaction's marker, CreateMultipartUpload,
             record the upload id in the marker; encode rows into a buffer and UploadPart
             each time it reaches part_bytes
    prepare  finish every object (encoder footer, last part, which may be small); the handle
             lists per object: key, upload id, part numbers + ETags + CRC32s, rows, size,
             and the expected ETag and composite CRC32 of the completed object
    commit   CompleteMultipartUpload with If-None-Match: * per object, then delete the marker
    finish   PUT <prefix>_manifests/<uid>-<epoch:020d>.json with If-None-Match: *
    abort    AbortMultipartUpload per upload, then delete the marker
    recover  list the markers <prefix>_txsink/uploads/<uid>/<txn>.json of this app

Object keys are deterministic, from (uid, epoch, partition, sequence) only, never the round
or the task attempt, so whichever attempt is decided publishes the same names::

    <prefix>[<col>=<value>/...]epoch=<e>/<uid>-p<partition:05d>-<seq:04d>.<ext>

``partition_by`` columns become Hive folders (Spark's escaping, ``__HIVE_DEFAULT_PARTITION__``
for null and the empty string) and are dropped from the objects, as Spark does.

Which upload is whose. ``ListMultipartUploads`` returns keys and upload ids, nothing that
names a transaction, and a replay writes the same key with another upload. So every
transaction keeps a small *marker* object, ``<prefix>_txsink/uploads/<uid>/<txn>.json``,
listing its keys and upload ids. The key is written to the marker *before*
CreateMultipartUpload and the upload id right after it, so recovery finds every upload of
ours, including those of a task that died in between: for a key recorded without an upload
id, recovery lists that key's uploads (``Prefix=<exact key>``: MinIO answers nothing for a
folder prefix) and takes every upload that no marker names. Commit and abort delete the
marker last, so a crash in between only makes recovery do the same work again.

Already committed is verified in the bucket, never assumed from an error code (MinIO answers
a second complete with NoSuchUpload, moto with success, and an abort of a completed upload
with success): the object must exist with the ``txsink-txn`` metadata set when its upload
was created, the recorded size, and the recorded composite CRC32 (``<crc of part crcs>-N``)
or, where the server reports none, the multipart ETag (``md5(part md5s)-N``).
CompleteMultipartUpload carries ``If-None-Match: *``, so commit never overwrites an object it
did not write.

Guarantee: exactly-once for readers that follow the manifests (:func:`read_committed`). A
reader that lists the prefix may see an epoch's objects before its manifest: during the
commit step, or until the restart's recovery if the driver died in the middle of it.
Prepared uploads must survive until they are committed: a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` (AWS) or MinIO's ``api stale_uploads_expiry`` (24 hours by
default) must allow more than the query's longest downtime.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import gzip
import hashlib
import io
import json
import os
import pickle
import re
import threading
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from typing_extensions import override

from txsink._json import json_rows
from txsink._logging import EpochLogger, get_logger
from txsink._target import manifests
from txsink.connectors.s3.client import S3Location, make_client, parse_s3_url, safe_options
from txsink.errors import (
    CommitError,
    ConfigurationError,
    RetryableError,
    TxsinkError,
    WriteError,
)
from txsink.handles import Handle, register_handle
from txsink.log import LogStore
from txsink.sink import TwoPhaseCommitSink
from txsink.txid import TxnId

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

__all__ = [
    "S3Handle",
    "S3Object",
    "S3Part",
    "S3Sink",
    "read_committed",
    "read_manifests",
]

Format = Literal["parquet", "jsonl", "csv"]
_EXT = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}
_CONTENT_TYPE = {
    "parquet": "application/vnd.apache.parquet",
    "jsonl": "application/x-ndjson",
    "csv": "text/csv",
}
_PARQUET_CODECS = frozenset({"snappy", "gzip", "brotli", "zstd", "lz4", "none"})
MANIFESTS = "_manifests/"
UPLOADS = "_txsink/uploads/"
TXN_METADATA = "txsink-txn"
MiB = 1024 * 1024
MIN_PART_BYTES = 5 * MiB
MAX_PART_BYTES = 5 * 1024 * MiB
MAX_PARTS = 10_000
MAX_KEY_BYTES = 1024
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Spark's ExternalCatalogUtils.escapePathName set, plus NUL (S3 listings are XML 1.0).
_ESCAPE = frozenset([chr(c) for c in range(0x00, 0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))
_MD5_HEX = re.compile(r"^[0-9a-f]{32}$")
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "XMinioServerNotInitialized",
        "ConditionalRequestConflict",  # AWS: a conditional write raced another one; retry
    }
)
_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "403",
    }
)


def _partition_types() -> dict[str, pa.DataType]:
    types = [
        pa.string(),
        pa.large_string(),
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.bool_(),
        pa.date32(),
    ]
    return {str(t): t for t in types}


# -- handle ------------------------------------------------------------------------------


@dataclass(frozen=True)
class S3Part:
    """One uploaded part: its number, ETag (without quotes) and base64 CRC32."""

    number: int
    etag: str
    crc32: str = ""


@dataclass(frozen=True)
class S3Object:
    """One object of a transaction: its multipart upload and how to recognise it completed."""

    key: str  # the full key in the bucket
    upload_id: str
    parts: tuple[S3Part, ...] = ()
    rows: int = 0
    nbytes: int = 0
    etag: str = ""  # expected multipart ETag, "<md5 of the part md5s>-<parts>", or ""
    checksum: str = ""  # expected composite CRC32, "<base64>-<parts>", or ""
    partition: tuple[tuple[str, str | None], ...] = ()  # Hive values (None: null)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "upload_id": self.upload_id,
            "parts": [[p.number, p.etag, p.crc32] for p in self.parts],
            "rows": self.rows,
            "nbytes": self.nbytes,
            "etag": self.etag,
            "checksum": self.checksum,
            "partition": [[c, v] for c, v in self.partition],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> S3Object:
        return cls(
            key=str(doc["key"]),
            upload_id=str(doc["upload_id"]),
            parts=tuple(S3Part(int(n), str(e), str(c)) for n, e, c in doc.get("parts", ())),
            rows=int(doc.get("rows", 0)),
            nbytes=int(doc.get("nbytes", 0)),
            etag=str(doc.get("etag", "")),
            checksum=str(doc.get("checksum", "")),
            partition=tuple((str(c), v) for c, v in doc.get("partition", ())),
        )


@register_handle
@dataclass(frozen=True)
class S3Handle(Handle):
    """A transaction's multipart uploads; ``marker`` is its marker object's key.

    Handles listed by :meth:`S3Sink.list_prepared` carry keys and upload ids only
    (enough to abort); decided handles carry the parts too.
    """

    serializer: ClassVar[str] = "s3.multipart"
    version: ClassVar[int] = 1

    bucket: str = ""
    marker: str = ""
    objects: tuple[S3Object, ...] = ()
    format: str = ""  # how the objects are encoded (the manifest says so, not today's options)
    compression: str | None = None
    partition_schema: tuple[tuple[str, str], ...] = ()  # (column, Arrow type) of partition_by

    @override
    def encode(self) -> dict[str, Any]:
        data = super().encode()
        data["objects"] = [o.to_json() for o in self.objects]
        data["partition_schema"] = [[c, t] for c, t in self.partition_schema]
        return data

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> S3Handle:
        fields = dict(data)
        fields["objects"] = tuple(S3Object.from_json(o) for o in fields.get("objects", ()))
        fields["partition_schema"] = tuple(
            (str(c), str(t)) for c, t in fields.get("partition_schema", ())
        )
        return super().decode(version, fields)


# -- open transaction ------------------------------------------------------------------------


class _Buffer(io.RawIOBase):
    """Where an encoder writes; the bytes wait here until they fill a part."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.written = 0

    @override
    def writable(self) -> bool:
        return True

    @override
    def write(self, b: Any) -> int:
        view = memoryview(b)
        self.data += view
        self.written += view.nbytes
        return view.nbytes

    @override
    def tell(self) -> int:
        return self.written


@dataclass
class _OpenObject:
    """One object being written: encoder → buffer → parts of its multipart upload."""

    key: str
    upload_id: str
    partition: tuple[tuple[str, str | None], ...]
    buffer: _Buffer
    stream: Any  # what the encoder writes to: the buffer, or a gzip stream over it
    writer: Any  # ParquetWriter / CSVWriter, or None for JSON lines
    parts: list[S3Part] = field(default_factory=list)
    rows: int = 0
    uploaded: int = 0  # bytes handed to part uploads (sent or in flight)
    next_part: int = 1
    in_flight: list[Future[S3Part]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.uploaded + len(self.buffer.data)


@dataclass
class _OpenUploads:
    """A task's open transaction: its objects, open and finished, and its marker record."""

    txn: TxnId
    file_schema: pa.Schema
    partition_schema: tuple[tuple[str, str], ...]
    marker: str
    record: list[dict[str, str | None]] = field(default_factory=list)  # key, upload_id
    open: dict[tuple[str | None, ...], _OpenObject] = field(default_factory=dict)
    done: list[S3Object] = field(default_factory=list)
    seq: int = 0
    rows: int = 0
    uploader: ThreadPoolExecutor | None = None  # part uploads overlap the encoding


# -- clients: one per process and options, never pickled -------------------------------------

#: Read timeout of CompleteMultipartUpload requests (see S3Sink._completing_client).
COMPLETE_TIMEOUT_S = 600.0
_CLIENTS: dict[tuple[int, str], S3Client] = {}
_CLIENTS_LOCK = threading.Lock()


def _client_for(options: Mapping[str, Any] | None) -> S3Client:
    try:
        fingerprint = hashlib.sha256(pickle.dumps(dict(options or {}))).hexdigest()
    except Exception:  # unpicklable options: no sharing
        return make_client(options)
    key = (os.getpid(), fingerprint)
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = make_client(options)
        return client


# -- the sink ----------------------------------------------------------------------------------


class S3Sink(TwoPhaseCommitSink[_OpenUploads, S3Handle]):
    """Exactly-once objects in S3 (or an S3-compatible server such as MinIO).

    Args:
        url: ``s3://bucket/prefix`` of the output.
        uid: the sink's stable id (keep it across restarts and upgrades).
        format: ``parquet`` (default), ``jsonl`` or ``csv``.
        compression: Parquet codec (default ``snappy``), or ``gzip`` for jsonl/csv.
        target_object_bytes: roll to a new object once an object holds about this many
            encoded bytes (default 128 MiB; checked after each batch).
        part_bytes: multipart part size, 5 MiB to 5 GiB (default 8 MiB, boto3's own); a
            task buffers up to one part per open object plus the parts in flight.
        upload_threads: parts a task uploads at once while it goes on encoding
            (default 4).
        partition_by: columns written as Hive folders ``col=value/`` (string, integer,
            boolean or date columns); dropped from the objects.
        max_open_objects: objects a task keeps open at once with ``partition_by`` (default
            8); the least recently used one is finished when another opens.
        client_options: keyword arguments for ``boto3.client("s3", ...)``, passed as given
            (``endpoint_url``, ``region_name``, keys, a botocore ``config``); default:
            boto3's chain. Never logged, never in handles, manifests or reprs.
        log: the txsink log, to use the sink alone as ``foreachBatch(sink)``.
    """

    connector: ClassVar[str] = "s3"
    handle_type: ClassVar[type[Handle]] = S3Handle

    def __init__(
        self,
        url: str,
        uid: str,
        *,
        format: Format = "parquet",
        compression: str | None = None,
        target_object_bytes: int = 128 * MiB,
        part_bytes: int = 8 * MiB,
        partition_by: Sequence[str] = (),
        max_open_objects: int = 8,
        upload_threads: int = 4,
        client_options: Mapping[str, Any] | None = None,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        location = parse_s3_url(url)
        # Plain strings: S3Location (a tuple subclass) does not survive pickling into tasks.
        self.bucket = location.bucket
        self.prefix = location.prefix
        if format not in _EXT:
            raise ValueError(f"S3Sink format must be one of {sorted(_EXT)}, got {format!r}")
        if format == "parquet":
            if compression is not None and compression.lower() not in _PARQUET_CODECS:
                raise ValueError(
                    f"S3Sink: parquet compression must be one of {sorted(_PARQUET_CODECS)}, "
                    f"got {compression!r}"
                )
        elif compression not in (None, "gzip"):
            raise ValueError(f"S3Sink: {format} supports compression='gzip' only")
        if not MIN_PART_BYTES <= part_bytes <= MAX_PART_BYTES:
            raise ValueError(
                f"S3Sink part_bytes must be between 5 MiB ({MIN_PART_BYTES}) and 5 GiB "
                f"({MAX_PART_BYTES}) (S3's part size limits), got {part_bytes}"
            )
        if target_object_bytes < 1:
            raise ValueError("S3Sink target_object_bytes must be >= 1")
        if target_object_bytes > part_bytes * (MAX_PARTS // 2):
            raise ValueError(
                f"S3Sink target_object_bytes={target_object_bytes} needs more than "
                f"{MAX_PARTS // 2} parts of part_bytes={part_bytes}: raise part_bytes "
                f"(an upload has at most {MAX_PARTS} parts)"
            )
        if max_open_objects < 1:
            raise ValueError("S3Sink max_open_objects must be >= 1")
        if upload_threads < 1:
            raise ValueError("S3Sink upload_threads must be >= 1")
        if isinstance(partition_by, str):
            partition_by = (partition_by,)
        if len(set(partition_by)) != len(partition_by):
            raise ValueError(f"S3Sink partition_by has a column twice: {list(partition_by)}")
        self.format: Format = format
        self.compression = compression.lower() if compression else None
        self.target_object_bytes = target_object_bytes
        self.part_bytes = part_bytes
        self.partition_by = tuple(partition_by)
        self.max_open_objects = max_open_objects
        self.upload_threads = upload_threads
        self.client_options = dict(client_options) if client_options is not None else None
        self._app_id: str | None = None
        self._partition_schema: tuple[tuple[str, str], ...] = ()

    @property
    def location(self) -> S3Location:
        return S3Location(self.bucket, self.prefix)

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def _ext(self) -> str:
        ext = _EXT[self.format]
        return ext + ".gz" if self.compression == "gzip" and self.format != "parquet" else ext

    @property
    def _client(self) -> S3Client:
        try:
            return _client_for(self.client_options)
        except Exception as err:  # bad options: botocore's messages name no secret values
            raise ConfigurationError(
                f"cannot build an S3 client for {self.url} with client_options="
                f"{safe_options(self.client_options)}: {type(err).__name__}: {err}",
                **self._ctx(),
            ) from err

    @property
    def _completing_client(self) -> S3Client:
        """The client for ``CompleteMultipartUpload``: a read timeout of at least 10 minutes.

        A complete can take minutes on S3, and a client that gives up mid-request makes
        the server cancel it: MinIO was seen to drop the upload's parts on such a
        cancelled complete without creating the object, so the decided rows were lost.
        Waiting long is the only safe answer; retries of the request stay as configured.
        """
        from botocore.config import Config

        options = dict(self.client_options or {})
        given = options.get("config")
        timeout = max(float(getattr(given, "read_timeout", None) or 60), COMPLETE_TIMEOUT_S)
        longer = Config(read_timeout=timeout)
        options["config"] = given.merge(longer) if given is not None else longer
        try:
            return _client_for(options)
        except Exception:
            return self._client

    def _ctx(self, **extra: Any) -> dict[str, Any]:
        return {"sink_uid": self.uid, "connector": "s3", **extra}

    @override
    def __repr__(self) -> str:
        return f"S3Sink(uid={self.uid!r}, url={self.url!r}, format={self.format!r})"

    # -- driver: start -------------------------------------------------------------------

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        ctx = self._ctx(phase="check")
        names = set(schema.names)
        for col in self.partition_by:
            if col not in names:
                raise ConfigurationError(
                    f"partition_by column {col!r} is not in the DataFrame (columns: "
                    f"{schema.names}): fix partition_by or add the column before the sink",
                    column=col,
                    **ctx,
                )
            typ = schema.field(col).type
            if str(typ) not in _partition_types():
                raise ConfigurationError(
                    f"partition_by column {col!r} has type {typ}; Hive folders take string, "
                    "integer, boolean or date columns: cast it (e.g. to a string or a date) "
                    "before the sink",
                    column=col,
                    **ctx,
                )
        if self.partition_by and len(self.partition_by) == len(schema):
            raise ConfigurationError(
                "every column is a partition_by column, so the objects would have no columns: "
                "keep at least one column out of partition_by",
                **ctx,
            )
        self._check_format(_file_schema(schema, self.partition_by), ctx)
        self._partition_schema = tuple((c, str(schema.field(c).type)) for c in self.partition_by)
        self._app_id = app_id
        self._check_bucket_and_owner(app_id, ctx)

    def _check_format(self, file_schema: pa.Schema, ctx: dict[str, Any]) -> None:
        if self.format == "csv":
            for f in file_schema:
                if (
                    pa.types.is_nested(f.type)
                    or pa.types.is_binary(f.type)
                    or (pa.types.is_large_binary(f.type))
                ):
                    raise ConfigurationError(
                        f"column {f.name!r} has type {f.type}, which CSV cannot hold: use "
                        "format='parquet' or 'jsonl', or convert the column (e.g. to_json) "
                        "before the sink",
                        column=f.name,
                        **ctx,
                    )
        if self.format == "parquet":
            for f in file_schema:
                try:
                    pq.write_table(
                        pa.table({f.name: pa.array([], f.type)}),
                        io.BytesIO(),
                        compression=self.compression or "snappy",
                    )
                except (pa.ArrowException, ValueError) as err:
                    raise ConfigurationError(
                        f"column {f.name!r} has type {f.type}, which Parquet cannot hold "
                        f"({err}): convert the column before the sink, or use format='jsonl'",
                        column=f.name,
                        **ctx,
                    ) from err

    def _check_bucket_and_owner(self, app_id: str, ctx: dict[str, Any]) -> None:
        """The bucket answers with our credentials; no other app wrote epochs of this uid here.

        A new query (new checkpoint and log) numbers its epochs from 0 again; its objects
        and manifests would collide with the old app's names.
        """
        prefix = f"{self.location.prefix}{MANIFESTS}{self.uid}-"
        try:
            keys = _list_keys(self._client, self.location.bucket, prefix)
            newest_first = sorted(keys, reverse=True)[:10]
            owner = None
            for key in newest_first:
                doc = _get_json(self._client, self.location.bucket, key)
                if doc is not None and doc.get("app_id") is not None:
                    owner = doc["app_id"]
                    break
        except Exception as err:
            raise self._error(err, "list the manifests", prefix, phase="check") from err
        if owner is not None and owner != app_id:
            raise ConfigurationError(
                f"{self.url} already holds epochs of sink uid {self.uid!r} written by app "
                f"{owner!r}, and this query runs as app {app_id!r}: a new query numbers its "
                "epochs from 0 again and its objects would collide. Use a new prefix or a new "
                "sink uid (or keep the old checkpoint and txsink log)",
                **ctx,
            )

    # -- executor: write and prepare --------------------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> _OpenUploads:
        return _OpenUploads(
            txn=txn,
            file_schema=_file_schema(schema, self.partition_by),
            partition_schema=tuple((c, str(schema.field(c).type)) for c in self.partition_by),
            marker=self._marker_key(txn),
        )

    @override
    def write(self, txn: _OpenUploads, batch: pa.RecordBatch) -> None:
        for group, rows, indices in self._groups(batch):
            obj = txn.open.pop(group, None)
            if obj is None:
                obj = self._open_object(txn, group, txn.rows + (indices[0] if indices else 0))
            txn.open[group] = obj  # most recently used last
            self._encode(txn, obj, rows, indices)
            if obj.size >= self.target_object_bytes:
                self._finish_object(txn, txn.open.pop(group))
            while len(txn.open) > self.max_open_objects:
                oldest = next(iter(txn.open))
                self._finish_object(txn, txn.open.pop(oldest))
        txn.rows += batch.num_rows

    @override
    def prepare(self, txn: _OpenUploads) -> S3Handle:
        while txn.open:
            group = next(iter(txn.open))
            self._finish_object(txn, txn.open.pop(group))
        if txn.uploader is not None:
            txn.uploader.shutdown(wait=True)
        objects = tuple(txn.done)
        return S3Handle(
            txn=txn.txn,
            rows=sum(o.rows for o in objects),
            nbytes=sum(o.nbytes for o in objects),
            bucket=self.location.bucket,
            marker=txn.marker,
            objects=objects,
            format=self.format,
            compression=self.compression,
            partition_schema=txn.partition_schema,
        )

    @override
    def discard(self, txn: _OpenUploads) -> None:
        # Best effort: recovery aborts whatever this leaves (the marker names it).
        if txn.uploader is not None:  # let part uploads end before their uploads are aborted
            txn.uploader.shutdown(wait=True, cancel_futures=True)
        try:
            client = self._client
        except TxsinkError:
            return
        for entry in txn.record:
            if entry["upload_id"] is not None:
                with contextlib.suppress(Exception):
                    client.abort_multipart_upload(
                        Bucket=self.location.bucket,
                        Key=str(entry["key"]),
                        UploadId=entry["upload_id"],
                    )
        if all(e["upload_id"] is not None for e in txn.record):
            with contextlib.suppress(Exception):
                client.delete_object(Bucket=self.location.bucket, Key=txn.marker)

    # -- driver: commit, abort, recover -------------------------------------------------------

    @override
    def commit(self, handle: S3Handle) -> None:
        client = self._client
        completing = self._completing_client
        for obj in handle.objects:
            self._complete(completing, client, handle, obj)
        try:
            client.delete_object(Bucket=handle.bucket, Key=handle.marker)
        except Exception as err:
            # Committed all the same; the next recovery meets the marker and re-verifies.
            self._log(handle.txn.epoch).warning(
                "committed %s but could not delete its marker: %s", handle.txn, _describe(err)
            )

    def _complete(
        self, completing: S3Client, client: S3Client, handle: S3Handle, obj: S3Object
    ) -> None:
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
            found = self._verify(client, handle, obj)
        except TxsinkError:
            raise
        except Exception as err:
            raise self._error(
                err, "verify the object", obj.key, phase="commit", handle=handle
            ) from err
        if found:
            self._log(handle.txn.epoch).info(
                "%s was already completed (verified in the bucket): %s", obj.key, _describe(failure)
            )
            return
        code, _ = _code(failure)
        if code in ("NoSuchUpload", "404"):
            raise CommitError(
                f"cannot commit {handle.txn}: its multipart upload of s3://{handle.bucket}/"
                f"{obj.key} is gone and the object was never completed, so its {obj.rows} rows "
                "are LOST. Was the upload aborted by hand, or expired by the server (a bucket "
                "lifecycle rule AbortIncompleteMultipartUpload, MinIO's api stale_uploads_expiry "
                "of 24h by default)? Those must allow more than the query's longest downtime",
                **self._ctx(phase="commit", epoch=handle.txn.epoch, partition=handle.txn.partition),
            )
        raise self._error(failure, "complete the upload", obj.key, phase="commit", handle=handle)

    def _verify(self, client: S3Client, handle: S3Handle, obj: S3Object) -> bool:
        """True if the object is the one this handle's upload completes to; False if absent."""
        try:
            head = client.head_object(Bucket=handle.bucket, Key=obj.key, ChecksumMode="ENABLED")
        except Exception as err:
            if _code(err)[0] in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        ctx = self._ctx(phase="commit", epoch=handle.txn.epoch, partition=handle.txn.partition)
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

    @override
    def finish_epoch(self, epoch: int, handles: Sequence[S3Handle]) -> None:
        objects = sorted(
            (
                {
                    "key": o.key[len(self.location.prefix) :]
                    if o.key.startswith(self.location.prefix)
                    else o.key,
                    "rows": o.rows,
                    "bytes": o.nbytes,
                    "etag": o.etag,
                    "checksum": o.checksum,
                    "partition": dict(o.partition),
                }
                for h in handles
                for o in h.objects
            ),
            key=lambda o: str(o["key"]),
        )
        first = handles[0] if handles else None
        partition_schema = first.partition_schema if first else self._partition_schema
        doc: dict[str, Any] = {
            "version": 1,
            "app_id": first.txn.app if first else self._app_id,
            "uid": self.uid,
            "epoch": epoch,
            "format": first.format if first else self.format,
            "compression": first.compression if first else self.compression,
            "partition_by": [c for c, _ in partition_schema],
            "partition_types": dict(partition_schema),
            "rows": sum(o.rows for h in handles for o in h.objects),
            "objects": objects,
            "committed_at": time.time(),
        }
        key = f"{self.location.prefix}{MANIFESTS}{self.uid}-{epoch:020d}.json"
        body = (json.dumps(doc, indent=1) + "\n").encode()
        client = self._client
        try:
            client.put_object(
                Bucket=self.location.bucket,
                Key=key,
                Body=body,
                ContentType="application/json",
                IfNoneMatch="*",
            )
            return
        except Exception as err:
            if _code(err)[0] not in ("PreconditionFailed", "412"):
                raise self._error(
                    err, "write the manifest", key, phase="commit", epoch=epoch
                ) from err
        # Written before (recovery after a crash, or a retried PUT): it must say the same.
        try:
            existing = _get_json(client, self.location.bucket, key)
        except Exception as err:
            raise self._error(err, "read the manifest", key, phase="commit", epoch=epoch) from err
        if existing is None or _comparable(existing) != _comparable(doc):
            raise CommitError(
                f"the manifest s3://{self.location.bucket}/{key} of epoch {epoch} already exists "
                "and lists other objects: another query wrote epoch "
                f"{epoch} of sink uid {self.uid!r} under this prefix. Give each query its own "
                "prefix or sink uid",
                **self._ctx(phase="commit", epoch=epoch),
            )

    @override
    def abort(self, handle: S3Handle) -> None:
        client = self._client
        for obj in handle.objects:
            try:
                client.abort_multipart_upload(
                    Bucket=handle.bucket, Key=obj.key, UploadId=obj.upload_id
                )
            except Exception as err:
                if _code(err)[0] not in ("NoSuchUpload", "404"):
                    raise self._error(
                        err, "abort the upload", obj.key, phase="abort", handle=handle
                    ) from err
        try:
            client.delete_object(Bucket=handle.bucket, Key=handle.marker)
        except Exception as err:
            raise self._error(err, "delete the marker", handle.marker, phase="abort") from err
        self._log(handle.txn.epoch).info(
            "aborted %s (%d upload(s))", handle.txn, len(handle.objects)
        )

    @override
    def list_prepared(self, app_id: str) -> Iterator[S3Handle]:
        client = self._client
        bucket = self.location.bucket
        folder = f"{self.location.prefix}{UPLOADS}{self.uid}/"
        try:
            records: list[tuple[TxnId, str, list[dict[str, Any]]]] = []
            for key in sorted(_list_keys(client, bucket, folder)):
                name = key[len(folder) :].removesuffix(".json")
                txn = TxnId.try_parse(name)
                if txn is None or not txn.belongs_to(app_id, self.uid):
                    continue
                doc = _get_json(client, bucket, key)
                if doc is not None:  # else committed or aborted meanwhile
                    records.append((txn, key, list(doc.get("uploads", []))))
            known = {str(u["upload_id"]) for _, _, ups in records for u in ups if u["upload_id"]}
            everything: list[tuple[str, str]] | None = None
            handles = []
            for txn, marker, uploads in records:
                objects = [
                    S3Object(key=str(u["key"]), upload_id=str(u["upload_id"]))
                    for u in uploads
                    if u["upload_id"]
                ]
                for u in uploads:
                    if not u["upload_id"]:
                        # The task died between recording the key and the upload id: every
                        # upload of that key that no marker names is its.
                        key = str(u["key"])
                        ids = _uploads_of_key(client, bucket, key)
                        if not ids:
                            # Rare (a task died right there); some servers filter prefixes
                            # oddly, so look at the whole list once before concluding.
                            if everything is None:
                                everything = _uploads_in(client, bucket)
                            ids = [i for k, i in everything if k == key]
                        objects += [
                            S3Object(key=key, upload_id=upload_id)
                            for upload_id in ids
                            if upload_id not in known
                        ]
                handles.append(
                    S3Handle(txn=txn, bucket=bucket, marker=marker, objects=tuple(objects))
                )
        except Exception as err:
            raise self._error(err, "list prepared uploads", folder, phase="recover") from err
        yield from handles

    # -- helpers: objects --------------------------------------------------------------------

    @override
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """As files: each manifest is PUT under the new uid (If-None-Match), then the old
        deleted."""
        client = self._client
        bucket, prefix = self.location.bucket, f"{self.location.prefix}{MANIFESTS}"
        moved = 0
        for key in _list_keys(client, bucket, f"{prefix}{old}-"):
            raw = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            if not key.endswith(".json") or json.loads(raw).get("uid") != old:
                continue
            moved += 1
            if dry_run:
                continue
            target = f"{prefix}{self.uid}-{key[len(prefix) + len(old) + 1 :]}"
            body = manifests.renamed(raw, old, self.uid)
            try:
                client.put_object(
                    Bucket=bucket,
                    Key=target,
                    Body=body,
                    ContentType="application/json",
                    IfNoneMatch="*",
                )
            except Exception as err:
                code = getattr(err, "response", {}).get("Error", {}).get("Code")
                if code not in ("PreconditionFailed", "412"):
                    raise
                existing = client.get_object(Bucket=bucket, Key=target)["Body"].read()
                manifests.check_renamed(existing, body, f"s3://{bucket}/{target}", self.uid)
            client.delete_object(Bucket=bucket, Key=key)
        verb = "would move" if dry_run else "moved"
        return [f"{self!r}: {verb} {moved} epoch manifest(s) from uid {old!r} to {self.uid!r}"]

    def _marker_key(self, txn: TxnId) -> str:
        return f"{self.location.prefix}{UPLOADS}{self.uid}/{txn}.json"

    def _key(self, txn: TxnId, group: tuple[str | None, ...], seq: int) -> str:
        hive = "".join(
            f"{_escape(col)}={HIVE_NULL if value is None else _escape(value)}/"
            for col, value in zip(self.partition_by, group, strict=True)
        )
        return (
            f"{self.location.prefix}{hive}epoch={txn.epoch}/"
            f"{self.uid}-p{txn.partition:05d}-{seq:04d}.{self._ext}"
        )

    def _groups(
        self, batch: pa.RecordBatch
    ) -> Iterator[tuple[tuple[str | None, ...], pa.RecordBatch, list[int] | None]]:
        """(Hive values, rows without the partition columns, their indices in ``batch``)."""
        if not self.partition_by:
            yield (), batch, None
            return
        values = zip(
            *([_hive_value(v) for v in batch.column(c).to_pylist()] for c in self.partition_by),
            strict=True,
        )
        rows: dict[tuple[str | None, ...], list[int]] = {}
        for i, group in enumerate(values):
            rows.setdefault(group, []).append(i)
        data = batch.drop_columns(list(self.partition_by))
        for group, indices in rows.items():
            yield group, data.take(pa.array(indices, pa.int64())), indices

    def _open_object(
        self, txn: _OpenUploads, group: tuple[str | None, ...], row: int
    ) -> _OpenObject:
        key = self._key(txn.txn, group, txn.seq)
        if len(key.encode()) > MAX_KEY_BYTES:
            longest = max(range(len(group)), key=lambda i: len(_escape(group[i] or "").encode()))
            raise WriteError(
                f"the object key for this row would be {len(key.encode())} bytes, over S3's "
                f"{MAX_KEY_BYTES}-byte limit, because of its partition_by value(s): shorten "
                "the value (e.g. substring or sha2 of it) before the sink, drop the column from "
                "partition_by, or use a shorter prefix",
                row=row,
                column=self.partition_by[longest] if group else None,
                phase="write",
                **self._ctx(epoch=txn.txn.epoch, partition=txn.txn.partition),
            )
        txn.seq += 1
        client = self._client
        bucket = self.location.bucket
        # Step 1: the key goes into the marker before the upload exists, so recovery can
        # find an upload whose id this task never got to record.
        txn.record.append({"key": key, "upload_id": None})
        self._put_marker(client, txn)
        try:
            upload = client.create_multipart_upload(
                Bucket=bucket,
                Key=key,
                Metadata={TXN_METADATA: str(txn.txn)},
                ContentType="application/gzip"
                if self.compression == "gzip" and self.format != "parquet"
                else _CONTENT_TYPE[self.format],
                ChecksumAlgorithm="CRC32",
            )
        except Exception as err:
            raise self._error(
                err, "start the multipart upload", key, phase="write", txn=txn.txn
            ) from err
        # Step 2: the upload id, so abort and commit name exactly this upload.
        txn.record[-1]["upload_id"] = upload["UploadId"]
        self._put_marker(client, txn)
        buffer = _Buffer()
        stream: Any = buffer
        if self.compression == "gzip" and self.format != "parquet":
            stream = gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0)
        writer: Any = None
        if self.format == "parquet":
            writer = pq.ParquetWriter(
                pa.PythonFile(stream, mode="w"),
                txn.file_schema,
                compression=self.compression or "snappy",
            )
        elif self.format == "csv":
            writer = pacsv.CSVWriter(pa.PythonFile(stream, mode="w"), txn.file_schema)
        return _OpenObject(
            key=key,
            upload_id=upload["UploadId"],
            partition=tuple(zip(self.partition_by, group, strict=True)),
            buffer=buffer,
            stream=stream,
            writer=writer,
        )

    def _put_marker(self, client: S3Client, txn: _OpenUploads) -> None:
        doc = {"version": 1, "txn": str(txn.txn), "uploads": txn.record}
        try:
            client.put_object(
                Bucket=self.location.bucket,
                Key=txn.marker,
                Body=json.dumps(doc).encode(),
                ContentType="application/json",
            )
        except Exception as err:
            raise self._error(
                err, "write the upload marker", txn.marker, phase="write", txn=txn.txn
            ) from err

    def _encode(
        self,
        txn: _OpenUploads,
        obj: _OpenObject,
        rows: pa.RecordBatch,
        indices: list[int] | None,
    ) -> None:
        """Encode ``rows`` (at ``indices`` of the current batch, or all of it) into ``obj``."""
        if rows.schema != txn.file_schema:
            rows = rows.cast(txn.file_schema)
        if obj.writer is not None:
            obj.writer.write_batch(rows)
        else:
            try:
                data = _jsonl(rows, self.uid, txn.txn.epoch, txn.txn.partition)
            except WriteError as err:
                # Rows are counted from the partition's first row, not the group's.
                local = err.row or 0
                err.row = txn.rows + (indices[local] if indices is not None else local)
                raise
            obj.stream.write(data)
        obj.rows += rows.num_rows
        self._send_full_parts(txn, obj)

    def _send_full_parts(self, txn: _OpenUploads, obj: _OpenObject) -> None:
        data = obj.buffer.data
        while len(data) >= self.part_bytes:
            self._upload_part(txn, obj, bytes(data[: self.part_bytes]))
            del data[: self.part_bytes]

    def _finish_object(self, txn: _OpenUploads, obj: _OpenObject) -> None:
        if obj.writer is not None:
            obj.writer.close()
        if obj.stream is not obj.buffer:
            obj.stream.close()  # the gzip trailer
        self._send_full_parts(txn, obj)
        if obj.buffer.data or obj.next_part == 1:
            # The last part may be smaller than 5 MiB; so may the only part.
            self._upload_part(txn, obj, bytes(obj.buffer.data))
            obj.buffer.data.clear()
        self._wait_parts(obj, keep=0)
        obj.parts.sort(key=lambda p: p.number)
        txn.done.append(
            S3Object(
                key=obj.key,
                upload_id=obj.upload_id,
                parts=tuple(obj.parts),
                rows=obj.rows,
                nbytes=obj.uploaded,
                etag=_multipart_etag(obj.parts),
                checksum=_composite_crc32(obj.parts),
                partition=obj.partition,
            )
        )

    def _upload_part(self, txn: _OpenUploads, obj: _OpenObject, data: bytes) -> None:
        """Hand one part to the task's upload threads; at most ``upload_threads`` wait.

        The encoder goes on while parts travel (memory: up to ``upload_threads``
        parts in flight per task). Numbers are assigned here, in order; a failed upload surfaces
        at the next wait, typed like a synchronous one.
        """
        number = obj.next_part
        if number > MAX_PARTS:
            raise ConfigurationError(
                f"object {obj.key} needs more than {MAX_PARTS} parts of part_bytes="
                f"{self.part_bytes}: raise part_bytes or lower target_object_bytes",
                **self._ctx(phase="write", epoch=txn.txn.epoch, partition=txn.txn.partition),
            )
        obj.next_part += 1
        obj.uploaded += len(data)
        if txn.uploader is None:
            txn.uploader = ThreadPoolExecutor(
                max_workers=self.upload_threads, thread_name_prefix="txsink-s3-part"
            )
        client = self._client
        obj.in_flight.append(
            txn.uploader.submit(
                self._send_part,
                client,
                txn.txn,
                key=obj.key,
                upload_id=obj.upload_id,
                number=number,
                data=data,
            )
        )
        self._wait_parts(obj, keep=self.upload_threads)

    def _wait_parts(self, obj: _OpenObject, keep: int) -> None:
        """Collect finished part uploads until at most ``keep`` are in flight."""
        while len(obj.in_flight) > keep:
            obj.parts.append(obj.in_flight.pop(0).result())

    def _send_part(
        self, client: S3Client, txn: TxnId, *, key: str, upload_id: str, number: int, data: bytes
    ) -> S3Part:
        try:
            answer = client.upload_part(
                Bucket=self.location.bucket,
                Key=key,
                UploadId=upload_id,
                PartNumber=number,
                Body=data,
                ChecksumAlgorithm="CRC32",
            )
        except Exception as err:
            raise self._error(err, f"upload part {number}", key, phase="write", txn=txn) from err
        return S3Part(number, answer["ETag"].strip('"'), answer.get("ChecksumCRC32", "") or "")

    # -- helpers: errors and logs -------------------------------------------------------------

    def _log(self, epoch: int | None = None) -> EpochLogger:
        return get_logger(__name__, uid=self.uid, epoch=epoch)

    def _error(
        self,
        err: Exception,
        doing: str,
        key: str,
        *,
        phase: str,
        txn: TxnId | None = None,
        handle: S3Handle | None = None,
        epoch: int | None = None,
    ) -> TxsinkError:
        """A typed, secret-free error for a failed S3 call, mapped by error code and status."""
        if isinstance(err, TxsinkError):
            return err
        if handle is not None:
            txn = handle.txn
        ctx = self._ctx(phase=phase)
        if txn is not None:
            ctx.update(epoch=txn.epoch, partition=txn.partition)
        elif epoch is not None:
            ctx["epoch"] = epoch
        try:
            endpoint = _redact_url(self._client.meta.endpoint_url)
        except Exception:
            endpoint = "<unknown endpoint>"
        where = f"s3://{self.location.bucket}/{key} at {endpoint}"
        what = f"cannot {doing} {where}: {_describe(err)}"
        code, status = _code(err)
        kind = _kind(err, code, status)
        if kind == "credentials":
            return ConfigurationError(
                f"{what}. No usable AWS credentials: pass aws_access_key_id and "
                "aws_secret_access_key in client_options, or set them up in boto3's chain "
                "(environment, profile, instance role) on the driver and every executor",
                **ctx,
            )
        if kind == "no-bucket":
            return ConfigurationError(
                f"{what}. The bucket {self.location.bucket!r} does not exist at this endpoint: "
                "create it, or fix the URL, endpoint_url or region_name",
                **ctx,
            )
        if kind == "denied":
            return ConfigurationError(
                f"{what}. Check the credentials and the policy: the sink needs s3:ListBucket, "
                "s3:ListBucketMultipartUploads, s3:GetObject, s3:PutObject, s3:DeleteObject, "
                "s3:AbortMultipartUpload and s3:ListMultipartUploadParts on the prefix",
                **ctx,
            )
        if kind == "unreachable":
            message = (
                f"{what}. The endpoint cannot be reached: check endpoint_url (or "
                "AWS_ENDPOINT_URL_S3), the network and the server"
            )
            if phase == "check":
                return ConfigurationError(message, **ctx)
            return RetryableError(message, **ctx)
        if kind == "transient":
            return RetryableError(f"{what}. A transient S3 failure: it is retried", **ctx)
        if phase == "commit":
            return CommitError(
                f"{what}. The decision stands: fix the cause and restart the query, "
                "its recovery retries the commit",
                **ctx,
            )
        return ConfigurationError(
            f"{what}. The server refused the request: check that it supports multipart uploads "
            "with CRC32 checksums and conditional writes (If-None-Match)",
            **ctx,
        )


# -- helpers -------------------------------------------------------------------------------


def _file_schema(schema: pa.Schema, partition_by: Sequence[str]) -> pa.Schema:
    if not partition_by:
        return schema
    return pa.schema([f for f in schema if f.name not in partition_by], metadata=schema.metadata)


def _hive_value(value: Any) -> str | None:
    """A partition value as Spark casts it to a string; None for null and ''."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date):
        return value.isoformat()
    text = str(value)
    return text or None


def _escape(text: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in text)


def _multipart_etag(parts: Sequence[S3Part]) -> str:
    """S3's ETag of a completed multipart upload, if every part ETag is an MD5."""
    if not parts or not all(_MD5_HEX.match(p.etag) for p in parts):
        return ""
    digest = hashlib.md5(b"".join(bytes.fromhex(p.etag) for p in parts))  # noqa: S324 - S3's ETag
    return f"{digest.hexdigest()}-{len(parts)}"


def _composite_crc32(parts: Sequence[S3Part]) -> str:
    """S3's composite CRC32 of a multipart upload: the CRC32 of the part CRC32s."""
    if not parts or not all(p.crc32 for p in parts):
        return ""
    raw = b"".join(base64.b64decode(p.crc32) for p in parts)
    return f"{base64.b64encode(zlib.crc32(raw).to_bytes(4, 'big')).decode()}-{len(parts)}"


def _jsonl(batch: pa.RecordBatch, uid: str, epoch: int, partition: int) -> bytes:
    rows = json_rows(
        batch,
        alternative=", or use format='parquet'",
        context={"sink_uid": uid, "epoch": epoch, "partition": partition, "connector": "s3"},
    )
    rows.append("")
    return "\n".join(rows).encode()


def _code(err: BaseException) -> tuple[str, int | None]:
    """(S3 error code, HTTP status) of a botocore error, or ("", None)."""
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status if isinstance(status, int) else None


def _kind(err: BaseException, code: str, status: int | None) -> str:
    from botocore import exceptions as bx

    if isinstance(err, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return "credentials"
    if isinstance(err, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
        return "unreachable"
    if isinstance(err, (bx.ConnectionError, bx.ReadTimeoutError, bx.HTTPClientError)):
        return "transient"
    if code == "NoSuchBucket":
        return "no-bucket"
    if code in _DENIED_CODES or status == 403:
        return "denied"
    if code in _TRANSIENT_CODES or (status is not None and status >= 500) or status == 429:
        return "transient"
    return "other"


def _describe(err: BaseException) -> str:
    """The S3 code and message, or the exception type: never request headers or options."""
    code, status = _code(err)
    if code or status:
        message = str(getattr(err, "response", {}).get("Error", {}).get("Message", ""))
        detail = f": {message.rstrip('.')}" if message else ""
        return f"{code or 'HTTP'} (HTTP {status}){detail}"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def _redact_url(url: str) -> str:
    """An endpoint URL without user info (botocore ignores it; it must not be shown)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _comparable(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "committed_at"}


def _list_keys(client: S3Client, bucket: str, prefix: str) -> list[str]:
    keys: list[str] = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.extend(o["Key"] for o in page.get("Contents", []) if "Key" in o)
    return keys


def _get_json(client: S3Client, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except Exception as err:
        if _code(err)[0] in ("NoSuchKey", "404"):
            return None
        raise
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError(f"s3://{bucket}/{key} is not a JSON object")
    return doc


def _uploads_in(client: S3Client, bucket: str, prefix: str = "") -> list[tuple[str, str]]:
    """(key, upload id) of the open multipart uploads whose key starts with ``prefix``.

    MinIO answers nothing for a folder ``Prefix`` ("dir/") but does answer an exact key.
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


def _uploads_of_key(client: S3Client, bucket: str, key: str) -> list[str]:
    """Upload ids of open multipart uploads of exactly ``key``."""
    return [upload_id for k, upload_id in _uploads_in(client, bucket, key) if k == key]


# -- readers -------------------------------------------------------------------------------


def read_manifests(
    url: str, uid: str | None = None, client_options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The epoch manifests of an S3 sink, by epoch (optionally of one sink uid)."""
    loc = parse_s3_url(url)
    client = make_client(client_options)
    prefix = f"{loc.prefix}{MANIFESTS}{uid + '-' if uid else ''}"
    docs = []
    for key in sorted(_list_keys(client, loc.bucket, prefix)):
        if not key.endswith(".json"):
            continue
        doc = _get_json(client, loc.bucket, key)
        if doc is not None and (uid is None or doc["uid"] == uid):
            docs.append(doc)
    return sorted(docs, key=lambda d: (d["epoch"], d["uid"]))


def read_committed(
    url: str, uid: str | None = None, client_options: Mapping[str, Any] | None = None
) -> pa.Table:
    """Read every row of whole committed epochs only, following the manifests.

    Adds the ``partition_by`` columns back (typed as written) and an ``_epoch`` column.
    JSON lines come back as JSON types (strings for timestamps, decimals and binary).
    """
    loc = parse_s3_url(url)
    client = make_client(client_options)
    types = _partition_types()
    tables = []
    for doc in read_manifests(url, uid, client_options):
        kinds = doc.get("partition_types", {})
        columns = [(str(c), types.get(str(kinds.get(c)), pa.string())) for c in doc["partition_by"]]
        for entry in doc["objects"]:
            body = client.get_object(Bucket=loc.bucket, Key=loc.prefix + entry["key"])
            table = _decode(body["Body"].read(), doc["format"], doc.get("compression"))
            for col, typ in columns:
                value = entry["partition"].get(col)
                array = pa.array([value] * len(table), pa.string())
                table = table.append_column(col, array.cast(typ))
            tables.append(
                table.append_column("_epoch", pa.array([doc["epoch"]] * len(table), pa.int64()))
            )
    if not tables:
        return pa.table({"_epoch": pa.array([], pa.int64())})
    return pa.concat_tables(tables, promote_options="permissive")


def _decode(data: bytes, fmt: str, compression: str | None) -> pa.Table:
    if fmt == "parquet":
        return pq.read_table(pa.BufferReader(data))
    if compression == "gzip":
        data = gzip.decompress(data)
    if fmt == "csv":
        return pacsv.read_csv(pa.BufferReader(data))
    rows = [json.loads(line) for line in data.decode().splitlines() if line]
    return pa.Table.from_pylist(rows)
