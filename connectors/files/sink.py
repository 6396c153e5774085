"""Files connector: exactly-once Parquet, JSON lines or CSV on a local or mounted filesystem.

How the two phases map to files::

    begin    open writer(s) under <path>/_txsink/staging/<txn>/
    prepare  close and fsync the staged files; the handle lists them with size and sha256
    commit   hard-link each staged file to its final name (never overwrites), then drop the stage
    finish   write <path>/_manifests/<uid>-<epoch>.json listing the epoch's files
    abort    delete the staging folder

Published names are deterministic:
``<path>/epoch=<e>/<uid>-p<partition:05d>-<seq:04d>.<ext>``, manifests
``<path>/_manifests/<uid>-<epoch:020d>.json``. A reader that follows the
manifests (:func:`read_committed`) sees whole epochs only; a reader that lists
the folder may see an epoch's files before its manifest exists: during the
commit step (milliseconds), or until the restart's recovery if the driver
died in the middle of it.

Schema evolution (``schema_evolution="add-columns"``): every kind of :mod:`txsink.schema`,
with no rewrite: files of different epochs have different schemas, and each epoch's
manifest records the target's schema after it (:mod:`txsink.kit.evolving`), so the schema
changes exactly when the epoch's files become visible; :func:`read_committed` reads every
epoch into the newest (widest) schema.

Guarantee: exactly-once, provided ``path`` is on one filesystem shared by the
driver and every executor (local mode, NFS, a FUSE mount with POSIX rename
and hard links).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
from typing_extensions import override

from txsink.audit import AuditRequest, TargetAudit
from txsink.connectors.files import audit as files_audit
from txsink.connectors.files.handles import FileEntry, FilesHandle
from txsink.contract import EpochCommit
from txsink.errors import CommitError, ConfigurationError
from txsink.handles import Handle
from txsink.kit import evolving, formats, manifests
from txsink.kit.formats import Format, FormatWriter
from txsink.rowref import RowNaming
from txsink.schema import KINDS, SchemaChange
from txsink.sink import TwoPhaseCommitSink
from txsink.store import FileStore, LogStore, fsync_dir
from txsink.txid import TxnId

__all__ = ["MANIFESTS", "STAGING", "FilesSink"]

STAGING = "_txsink/staging"
MANIFESTS = manifests.FOLDER


@dataclass
class _OpenFiles:
    """A task's open transaction: the current file and its writer, and the files closed."""

    txn: TxnId
    schema: pa.Schema
    stage: Path
    seq: int = 0
    rows_total: int = 0
    file: IO[bytes] | None = None
    writer: FormatWriter | None = None
    closed: list[tuple[str, int]] = field(default_factory=list)  # (staged name, rows)


class FilesSink(TwoPhaseCommitSink[_OpenFiles, FilesHandle]):
    """Exactly-once files on a shared filesystem.

    Args:
        path: the output folder (created if missing).
        uid: the sink's stable id (keep it across restarts and upgrades).
        format: ``parquet`` (default), ``jsonl`` or ``csv``.
        compression: Parquet codec (default ``snappy``), or ``gzip`` for jsonl/csv.
        target_file_bytes: roll to a new file after about this many bytes of
            Arrow data (default 128 MiB).
        redact_rows: name a rejected row in errors by its column names and a hash of its
            values only (for sensitive data; default: the first columns' values).
        log: the txsink log, to use the sink alone as ``foreachBatch(sink)``.
        schema_evolution: ``strict`` (default: an epoch whose schema differs from the
            output's stops the query before writing) or ``add-columns``.
    """

    connector: ClassVar[str] = "files"
    handle_type: ClassVar[type[Handle]] = FilesHandle

    def __init__(
        self,
        path: str | os.PathLike[str],
        uid: str,
        *,
        format: Format = "parquet",
        compression: str | None = None,
        target_file_bytes: int = 128 * 1024 * 1024,
        redact_rows: bool = False,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        #: The schema this process's last manifest recorded (the next commit's "before").
        self._recorded = evolving.Recorded()
        self.redact_rows = redact_rows
        self.compression = formats.check_options("FilesSink", format, compression)
        if target_file_bytes < 1:
            raise ValueError("target_file_bytes must be >= 1")
        self.path = os.path.abspath(os.fspath(path))
        self.format: Format = format
        self.target_file_bytes = target_file_bytes

    @property
    def _ext(self) -> str:
        return formats.extension(self.format, self.compression)

    @property
    def _store(self) -> FileStore:
        """The output folder as a store: the manifests' one create-if-absent (hard link)."""
        return FileStore(self.path)

    def _ctx(self, **extra: Any) -> dict[str, Any]:
        return {"sink_uid": self.uid, "connector": "files", **extra}

    # -- driver: start -------------------------------------------------------------

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        try:
            os.makedirs(os.path.join(self.path, STAGING), exist_ok=True)
            os.makedirs(os.path.join(self.path, MANIFESTS), exist_ok=True)
        except OSError as err:
            raise ConfigurationError(
                f"cannot create the output folder {self.path}: {err.strerror}; "
                "check the path and its permissions",
                **self._ctx(),
            ) from err
        self._check_owner(app_id)
        formats.check_schema(schema, self.format, self.compression, self._ctx(phase="check"))

    def _check_owner(self, app_id: str) -> None:
        """Refuse a folder whose epochs under this uid were written by another app.

        A new query (new checkpoint and log) numbers its epochs from 0 again;
        its files would collide with the old app's names.
        """
        owner = manifests.owner(self._store, self.uid)
        if owner is not None and owner != app_id:
            raise ConfigurationError(
                f"{self.path} already holds epochs of sink uid {self.uid!r} written by app "
                f"{owner!r}, and this query runs as app {app_id!r}: a new query numbers its "
                "epochs from 0 again and its files would collide. Use a new output folder "
                "or a new sink uid (or keep the old checkpoint and txsink log)",
                **self._ctx(),
            )

    # -- driver: schema evolution (txsink.kit.evolving) -----------------------------------

    @override
    def target_schema(self, app_id: str) -> pa.Schema | None:
        """The schema the newest epoch's manifest records (its files' for an older
        manifest); None when no epoch is committed here."""
        return evolving.newest_schema(self._store, self.uid, self._legacy_schema)

    @override
    def evolution_support(self) -> frozenset[str]:
        return frozenset(KINDS)

    @override
    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        """Only the format can refuse (CSV holds no struct or binary column). Writes
        nothing: the epoch's manifest carries the new schema."""
        evolving.check_change(change, self.format, self.compression, self._ctx(phase="check"))

    def _legacy_schema(self, doc: Mapping[str, Any]) -> pa.Schema | None:
        """An old manifest's schema, from the footer of its first Parquet file."""
        files = doc.get("files") or []
        if doc.get("format") != "parquet" or not files:
            return None
        return pq.read_schema(Path(self.path, str(files[0]["path"])))

    # -- executor: write and prepare ------------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> _OpenFiles:
        stage = Path(self.path, STAGING, str(txn))
        # A leftover of a dead attempt with the same name cannot exist (names are
        # unique per round and attempt), but a half-made folder must not leak in.
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        return _OpenFiles(txn=txn, schema=schema, stage=stage)

    @override
    def write(self, txn: _OpenFiles, batch: pa.RecordBatch) -> None:
        writer = txn.writer if txn.writer is not None else self._open_file(txn)
        naming = RowNaming(partition=txn.txn.partition, redact=self.redact_rows)
        writer.write(batch, first_row=txn.rows_total, naming=naming)
        txn.rows_total += batch.num_rows
        if writer.full():
            self._close_file(txn)

    @override
    def prepare(self, txn: _OpenFiles) -> FilesHandle:
        self._close_file(txn)
        entries = []
        for name, rows in txn.closed:
            staged = txn.stage / name
            size, digest = _fsync_and_hash(staged)
            entries.append(
                FileEntry(
                    staged=f"{STAGING}/{txn.txn}/{name}",
                    final=self._final_name(txn.txn, int(name.split("-")[1].split(".")[0])),
                    rows=rows,
                    nbytes=size,
                    sha256=digest,
                )
            )
        fsync_dir(txn.stage)
        fsync_dir(txn.stage.parent)
        return FilesHandle(
            txn=txn.txn,
            rows=sum(e.rows for e in entries),
            nbytes=sum(e.nbytes for e in entries),
            files=tuple(entries),
            schema=evolving.encode_schema(txn.schema),
        )

    @override
    def discard(self, txn: _OpenFiles) -> None:
        with contextlib.suppress(Exception):
            self._close_file(txn)
        shutil.rmtree(txn.stage, ignore_errors=True)

    # -- driver: commit, abort, recover ------------------------------------------------

    @override
    def commit(self, handle: FilesHandle) -> None:
        for entry in handle.files:
            staged = Path(self.path, entry.staged)
            final = Path(self.path, entry.final)
            final.parent.mkdir(parents=True, exist_ok=True)
            if staged.exists():
                try:
                    os.link(staged, final)  # fails if the name exists: never overwrite
                except FileExistsError:
                    self._verify(handle, entry, final)
                fsync_dir(final.parent)
            else:
                self._verify(handle, entry, final)
        shutil.rmtree(Path(self.path, STAGING, str(handle.txn)), ignore_errors=True)

    def _verify(self, handle: FilesHandle, entry: FileEntry, final: Path) -> None:
        """'Already committed' only if the published file is byte-for-byte the staged one."""
        if not final.exists():
            raise CommitError(
                f"cannot commit {handle.txn}: staged file {entry.staged} is gone and "
                f"{entry.final} was never published, so its {entry.rows} rows are lost. "
                "Was the _txsink/staging folder cleaned by hand?",
                sink_uid=self.uid,
                epoch=handle.txn.epoch,
                partition=handle.txn.partition,
                connector="files",
                phase="commit",
            )
        size, digest = _hash(final)
        if (size, digest) != (entry.nbytes, entry.sha256):
            raise CommitError(
                f"cannot commit {handle.txn}: {entry.final} exists but is not the staged file "
                f"(size {size} vs {entry.nbytes}); another writer uses this folder with the "
                "same sink uid",
                sink_uid=self.uid,
                epoch=handle.txn.epoch,
                partition=handle.txn.partition,
                connector="files",
                phase="commit",
            )

    @override
    def commit_epoch(self, request: EpochCommit[FilesHandle]) -> None:
        """As the default (each handle, then the manifest), with the epoch's schema change
        in the manifest: nothing else of the output changes with the schema."""
        for handle in request.handles:
            self.commit(handle)
            request.committed([handle])
        self._write_manifest(request.epoch, request.handles, request.schema_change)

    @override
    def finish_epoch(self, epoch: int, handles: Sequence[FilesHandle]) -> None:
        """Write the epoch's manifest last; refuse another writer's manifest of this epoch."""
        self._write_manifest(epoch, handles, None)

    def _write_manifest(
        self, epoch: int, handles: Sequence[FilesHandle], change: SchemaChange | None
    ) -> None:
        before = None
        if change is None:
            before = self._recorded.before(
                epoch,
                lambda: evolving.newest_schema(
                    self._store, self.uid, self._legacy_schema, below=epoch
                ),
            )
        schema = evolving.epoch_schema(before, change, (h.schema for h in handles))
        doc = manifests.document(
            uid=self.uid,
            epoch=epoch,
            app_id=handles[0].txn.app if handles else None,
            format=self.format,
            listing="files",
            entries=(
                {"path": e.final, "rows": e.rows, "bytes": e.nbytes, "sha256": e.sha256}
                for h in handles
                for e in h.files
            ),
            sort_by="path",
            schema=schema,
            committed_at=time.time(),
        )
        manifests.write(
            self._store,
            doc,
            where=str(Path(self.path, manifests.key(self.uid, epoch))),
            place="output folder",
            context=self._ctx(),
        )
        self._recorded.wrote(epoch, schema)

    @override
    def abort(self, handle: FilesHandle) -> None:
        shutil.rmtree(Path(self.path, STAGING, str(handle.txn)), ignore_errors=True)

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        return manifests.recorded_epoch(self._store, self.uid, app_id)

    @override
    def list_prepared(self, app_id: str) -> Iterator[FilesHandle]:
        try:
            names = os.listdir(os.path.join(self.path, STAGING))
        except FileNotFoundError:
            return
        for name in sorted(names):
            txn = TxnId.try_parse(name)
            if txn is not None and txn.belongs_to(app_id, self.uid):
                yield FilesHandle(txn=txn)

    @override
    def audit(self, request: AuditRequest) -> TargetAudit:
        """The output folder read back for ``request``'s epochs (:mod:`.audit`): each
        epoch's manifest, its files' sizes and Parquet footers; deep, their rows and sha256;
        unnamed data files of those epochs' folders as extras. Read-only."""
        return files_audit.audit(self.path, self.uid, request)

    @override
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """Manifests ``<old>-<e>.json`` -> ``<new>-<e>.json`` (create first, then delete)."""
        moved = manifests.migrate(
            self._store, old, self.uid, dry_run=dry_run, where=lambda k: str(Path(self.path, k))
        )
        verb = "would move" if dry_run else "moved"
        return [f"{self!r}: {verb} {moved} epoch manifest(s) from uid {old!r} to {self.uid!r}"]

    # -- helpers -----------------------------------------------------------------------

    def _final_name(self, txn: TxnId, seq: int) -> str:
        return f"epoch={txn.epoch}/{self.uid}-p{txn.partition:05d}-{seq:04d}.{self._ext}"

    def _open_file(self, txn: _OpenFiles) -> FormatWriter:
        name = f"part-{txn.seq:04d}.{self._ext}"
        txn.file = open(txn.stage / name, "wb")  # noqa: SIM115 - closed by _close_file
        txn.writer = FormatWriter(
            txn.file,
            self.format,
            txn.schema,
            compression=self.compression,
            context=self._ctx(partition=txn.txn.partition),
            target_bytes=self.target_file_bytes,
            measure="arrow",  # documented: Arrow bytes of the batches (docs/connectors/files.md)
        )
        txn.closed.append((name, 0))
        return txn.writer

    def _close_file(self, txn: _OpenFiles) -> None:
        if txn.writer is None or txn.file is None:
            return
        writer, file = txn.writer, txn.file
        txn.writer = txn.file = None
        try:
            writer.close()
        finally:
            file.close()
        name, _ = txn.closed[-1]
        txn.closed[-1] = (name, writer.rows)
        txn.seq += 1


# -- filesystem helpers -------------------------------------------------------------------


def _hash(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _fsync_and_hash(path: Path) -> tuple[int, str]:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return _hash(path)
