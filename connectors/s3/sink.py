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

``partition_by`` columns become Hive folders (:mod:`~txsink.connectors.s3.hive`) and are
dropped from the objects, as Spark does. Which upload is whose is kept in upload markers
(:mod:`~txsink.connectors.s3.markers`); "already committed" is verified in the bucket, never
assumed from an error code (:mod:`~txsink.connectors.s3.multipart`); the manifest is written
last with the one epoch-manifest module (:mod:`txsink.kit.manifests`), through the
connector's one conditional PUT (:class:`~txsink.connectors.s3.store.S3Objects`).

Package map: ``sink`` (configuration and hooks), ``handles``, ``hive``, ``multipart``,
``markers``, ``readers``, ``target`` (client, typed errors and stores of one sink),
``client`` (URLs, client cache, safe options), ``errors`` (one S3 error classification),
``store`` (conditional PUT), ``log_store`` (the txsink log on S3), ``testing``, ``plugin``.

Schema evolution (``schema_evolution="add-columns"``): every kind of :mod:`txsink.schema`,
with no rewrite, as for files: each epoch's manifest records the target's schema after it
(partition columns included; :mod:`txsink.kit.evolving`).

Guarantee: exactly-once for readers that follow the manifests
(:func:`~txsink.connectors.s3.readers.read_committed`). A reader that lists the prefix may
see an epoch's objects before its manifest: during the commit step, or until the restart's
recovery if the driver died in the middle of it.
Prepared uploads must survive until they are committed: a bucket lifecycle rule
``AbortIncompleteMultipartUpload`` (AWS) or MinIO's ``api stale_uploads_expiry`` (24 hours by
default) must allow more than the query's longest downtime.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import pyarrow as pa
from typing_extensions import override

from txsink.audit import AuditRequest, TargetAudit
from txsink.connectors.s3 import access, hive, markers, multipart, readers
from txsink.connectors.s3.client import S3Location, parse_s3_url
from txsink.connectors.s3.handles import S3Handle
from txsink.connectors.s3.multipart import (
    MAX_OBJECT_BYTES,
    MAX_PART_BYTES,
    MAX_PARTS,
    MIN_PART_BYTES,
    MiB,
)
from txsink.connectors.s3.target import S3Target
from txsink.contract import EpochCommit
from txsink.errors import ConfigurationError, TxsinkError, WriteError
from txsink.handles import Handle
from txsink.kit import evolving, formats, manifests
from txsink.kit.formats import Format
from txsink.rowref import RowNaming, RowRef
from txsink.schema import KINDS, SchemaChange, SchemaEvolutionError
from txsink.sink import TwoPhaseCommitSink
from txsink.store import LogStore
from txsink.txid import TxnId

__all__ = ["S3Sink"]

MAX_KEY_BYTES = 1024


class S3Sink(TwoPhaseCommitSink[multipart.OpenUploads, S3Handle]):
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
        redact_rows: name a rejected row in errors by its column names and a hash of its
            values only (for sensitive data; default: the first columns' values).
        log: the txsink log, to use the sink alone as ``foreachBatch(sink)``.
        schema_evolution: ``strict`` (default: an epoch whose schema differs from the
            output's stops the query before writing) or ``add-columns``.
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
        redact_rows: bool = False,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        #: The schema this process's last manifest recorded (the next commit's "before").
        self._recorded = evolving.Recorded()
        self.redact_rows = redact_rows
        location = parse_s3_url(url)
        # Plain strings: S3Location (a tuple subclass) does not survive pickling into tasks.
        self.bucket = location.bucket
        self.prefix = location.prefix
        self.compression = formats.check_options("S3Sink", format, compression)
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
        if target_object_bytes > MAX_OBJECT_BYTES // 2:
            raise ValueError(
                f"S3Sink target_object_bytes={target_object_bytes} is above half of S3's "
                "largest object (5 TiB): an object rolls over only after a batch that reaches "
                "it, and CompleteMultipartUpload would refuse an object over 5 TiB after the "
                "decision"
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
    def _target(self) -> S3Target:
        return S3Target(self.bucket, self.prefix, self.uid, self.client_options)

    @property
    def _ext(self) -> str:
        return formats.extension(self.format, self.compression)

    @override
    def __repr__(self) -> str:
        return f"S3Sink(uid={self.uid!r}, url={self.url!r}, format={self.format!r})"

    # -- driver: start -------------------------------------------------------------------

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        target = self._target
        ctx = target.ctx(phase="check")
        hive.check_partition_by(schema, self.partition_by, ctx)
        file_schema = hive.file_schema(schema, self.partition_by)
        formats.check_schema(file_schema, self.format, self.compression, ctx)
        self._partition_schema = tuple((c, str(schema.field(c).type)) for c in self.partition_by)
        self._app_id = app_id
        self._check_access(target, ctx)
        self._check_bucket_and_owner(target, app_id, ctx)

    def _check_access(self, target: S3Target, ctx: dict[str, Any]) -> None:
        """Every IAM action the sink will use is allowed (:mod:`~txsink.connectors.s3.access`):
        a prefix-scoped policy that lacks one fails here, before any data flows, not at a
        commit or a recovery later."""
        try:
            access.check_sink_access(target.client, target.bucket, target.prefix, ctx, self.url)
        except TxsinkError:
            raise
        except Exception as err:
            raise target.error(
                err, "check the sink's rights on", target.prefix, phase="check"
            ) from err

    def _check_bucket_and_owner(self, target: S3Target, app_id: str, ctx: dict[str, Any]) -> None:
        """The bucket answers with our credentials; no other app wrote epochs of this uid here.

        A new query (new checkpoint and log) numbers its epochs from 0 again; its objects
        and manifests would collide with the old app's names.
        """
        owner = manifests.owner(target.objects("the manifests", phase="check"), self.uid)
        if owner is not None and owner != app_id:
            raise ConfigurationError(
                f"{self.url} already holds epochs of sink uid {self.uid!r} written by app "
                f"{owner!r}, and this query runs as app {app_id!r}: a new query numbers its "
                "epochs from 0 again and its objects would collide. Use a new prefix or a new "
                "sink uid (or keep the old checkpoint and txsink log)",
                **ctx,
            )

    # -- driver: schema evolution (txsink.kit.evolving) -------------------------------------

    @override
    def target_schema(self, app_id: str) -> pa.Schema | None:
        """The schema the newest epoch's manifest records (its first object's Parquet
        footer for an older manifest); None when no epoch is committed here."""
        store = self._target.objects("the manifests", phase="check")
        return evolving.newest_schema(store, self.uid, self._legacy_schema)

    @override
    def evolution_support(self) -> frozenset[str]:
        return frozenset(KINDS)

    @override
    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        """Only the format (CSV holds no struct or binary column) and Hive folders (a
        partition column's new type) can refuse. Writes nothing: the epoch's manifest
        carries the new schema."""
        ctx = self._target.ctx(phase="check")
        try:
            hive.check_partition_by(change.new, self.partition_by, ctx)
        except ConfigurationError as err:
            raise SchemaEvolutionError(err.message, **{**ctx, "column": err.column}) from err
        evolving.check_change(change, self.format, self.compression, ctx, drop=self.partition_by)

    def _legacy_schema(self, doc: Mapping[str, Any]) -> pa.Schema | None:
        target = self._target
        try:
            return readers.legacy_schema(target.client, self.bucket, self.prefix, doc)
        except Exception as err:
            where = f"{self.prefix}{manifests.key(self.uid, int(doc['epoch']))}"
            raise target.error(
                err, "read the schema of the epoch of", where, phase="check"
            ) from err

    # -- executor: write and prepare --------------------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> multipart.OpenUploads:
        return multipart.OpenUploads(
            txn=txn,
            file_schema=hive.file_schema(schema, self.partition_by),
            partition_schema=tuple((c, str(schema.field(c).type)) for c in self.partition_by),
            marker=markers.key(self._target, txn),
            part_bytes=self.part_bytes,
            upload_threads=self.upload_threads,
            schema=evolving.encode_schema(schema),
        )

    @override
    def write(self, txn: multipart.OpenUploads, batch: pa.RecordBatch) -> None:
        target = self._target
        for group, rows, indices in hive.groups(batch, self.partition_by):
            obj = txn.open.pop(group, None)
            if obj is None:
                obj = self._open_object(
                    target, txn, group, txn.rows + (indices[0] if indices else 0)
                )
            txn.open[group] = obj  # most recently used last
            naming = RowNaming(partition=txn.txn.partition, redact=self.redact_rows)
            try:
                multipart.write_rows(target, txn, obj, rows, first_row=0, naming=naming)
            except WriteError as err:
                # Rows are counted from the partition's first row, not the group's.
                if isinstance(err.row, RowRef) and err.row.offset is not None:
                    local = err.row.offset
                    at = txn.rows + (indices[local] if indices is not None else local)
                    err.row = dataclasses.replace(err.row, offset=at)
                raise
            if multipart.size(obj) >= self.target_object_bytes:
                multipart.finish_object(target, txn, txn.open.pop(group))
            while len(txn.open) > self.max_open_objects:
                oldest = next(iter(txn.open))
                multipart.finish_object(target, txn, txn.open.pop(oldest))
        txn.rows += batch.num_rows

    @override
    def prepare(self, txn: multipart.OpenUploads) -> S3Handle:
        target = self._target
        while txn.open:
            group = next(iter(txn.open))
            multipart.finish_object(target, txn, txn.open.pop(group))
        if txn.uploader is not None:
            txn.uploader.shutdown(wait=True)
        objects = tuple(txn.done)
        return S3Handle(
            txn=txn.txn,
            rows=sum(o.rows for o in objects),
            nbytes=sum(o.nbytes for o in objects),
            bucket=self.bucket,
            marker=txn.marker,
            objects=objects,
            format=self.format,
            compression=self.compression,
            partition_schema=txn.partition_schema,
            schema=txn.schema,
        )

    @override
    def discard(self, txn: multipart.OpenUploads) -> None:
        multipart.discard(self._target, txn)

    # -- driver: commit, abort, recover -------------------------------------------------------

    @override
    def commit(self, handle: S3Handle) -> None:
        target = self._target
        completing = target.completing_client
        for obj in handle.objects:
            multipart.complete(target, completing, handle, obj)
        try:
            markers.delete(target, handle, phase="commit")
        except TxsinkError as err:
            # Committed all the same; the next recovery meets the marker and re-verifies.
            target.log(handle.txn.epoch).warning(
                "committed %s but could not delete its marker: %s", handle.txn, err
            )

    @override
    def commit_epoch(self, request: EpochCommit[S3Handle]) -> None:
        """As the default (each handle, then the manifest), with the epoch's schema change
        in the manifest: nothing else of the output changes with the schema."""
        for handle in request.handles:
            self.commit(handle)
            request.committed([handle])
        self._write_manifest(request.epoch, request.handles, request.schema_change)

    @override
    def finish_epoch(self, epoch: int, handles: Sequence[S3Handle]) -> None:
        """Write the epoch's manifest last (If-None-Match); refuse another writer's."""
        self._write_manifest(epoch, handles, None)

    def _write_manifest(
        self, epoch: int, handles: Sequence[S3Handle], change: SchemaChange | None
    ) -> None:
        target = self._target
        store = target.objects("the manifest", phase="commit", epoch=epoch)
        before = None
        if change is None:
            before = self._recorded.before(
                epoch,
                lambda: evolving.newest_schema(store, self.uid, self._legacy_schema, below=epoch),
            )
        schema = evolving.epoch_schema(before, change, (h.schema for h in handles))
        first = handles[0] if handles else None
        partition_schema = first.partition_schema if first else self._partition_schema
        doc = manifests.document(
            uid=self.uid,
            epoch=epoch,
            app_id=first.txn.app if first else self._app_id,
            format=first.format if first else self.format,
            extra={
                "compression": first.compression if first else self.compression,
                "partition_by": [c for c, _ in partition_schema],
                "partition_types": dict(partition_schema),
            },
            listing="objects",
            entries=(
                {
                    "key": o.key.removeprefix(self.prefix),
                    "rows": o.rows,
                    "bytes": o.nbytes,
                    "etag": o.etag,
                    "checksum": o.checksum,
                    "partition": dict(o.partition),
                }
                for h in handles
                for o in h.objects
            ),
            sort_by="key",
            schema=schema,
            committed_at=time.time(),
        )
        manifests.write(
            store,
            doc,
            where=f"{self.url}{manifests.key(self.uid, epoch)}",
            place="prefix",
            context=target.ctx(),
        )
        self._recorded.wrote(epoch, schema)

    @override
    def abort(self, handle: S3Handle) -> None:
        # Not logged here: the core tells every abort, once, the same way for every sink.
        multipart.abort(self._target, handle)

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        store = self._target.objects("the manifests", phase="check")
        return manifests.recorded_epoch(store, self.uid, app_id)

    @override
    def list_prepared(self, app_id: str) -> Iterator[S3Handle]:
        yield from markers.list_prepared(self._target, app_id)

    @override
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """As files: each manifest is created under the new uid (If-None-Match), then the
        old one deleted."""
        moved = manifests.migrate(
            self._target.objects("the manifests", phase="migrate"),
            old,
            self.uid,
            dry_run=dry_run,
            where=lambda k: f"{self.url}{k}",
        )
        verb = "would move" if dry_run else "moved"
        return [f"{self!r}: {verb} {moved} epoch manifest(s) from uid {old!r} to {self.uid!r}"]

    @override
    def audit(self, request: AuditRequest) -> TargetAudit:
        """The prefix read back for ``request``'s epochs (:class:`.readers.S3Output`)."""
        return readers.audit(self._target, self.partition_by, request)

    # -- helpers -----------------------------------------------------------------------------

    def _open_object(
        self, target: S3Target, txn: multipart.OpenUploads, group: hive.Group, row: int
    ) -> multipart.OpenObject:
        key = (
            f"{self.prefix}{hive.folders(self.partition_by, group)}epoch={txn.txn.epoch}/"
            f"{self.uid}-p{txn.txn.partition:05d}-{txn.seq:04d}.{self._ext}"
        )
        if len(key.encode()) > MAX_KEY_BYTES:
            longest = max(
                range(len(group)), key=lambda i: len(hive.escape(group[i] or "").encode())
            )
            raise WriteError(
                f"the object key for this row would be {len(key.encode())} bytes, over S3's "
                f"{MAX_KEY_BYTES}-byte limit, because of its partition_by value(s): shorten "
                "the value (e.g. substring or sha2 of it) before the sink, drop the column from "
                "partition_by, or use a shorter prefix",
                row=RowRef.from_values(
                    self.partition_by,
                    list(group),
                    keyed=False,
                    partition=txn.txn.partition,
                    offset=row,
                    redact=self.redact_rows,
                ),
                column=self.partition_by[longest] if group else None,
                phase="write",
                **target.ctx(epoch=txn.txn.epoch, partition=txn.txn.partition),
            )
        txn.seq += 1
        return multipart.open_object(
            target,
            txn,
            key,
            tuple(zip(self.partition_by, group, strict=True)),
            format=self.format,
            compression=self.compression,
        )
