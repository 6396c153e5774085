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

Guarantee: exactly-once, provided ``path`` is on one filesystem shared by the
driver and every executor (local mode, NFS, a FUSE mount with POSIX rename
and hard links).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from typing_extensions import override

from txsink._fs import fsync_dir
from txsink._json import json_rows
from txsink._target import manifests
from txsink.errors import CommitError, ConfigurationError
from txsink.handles import Handle, register_handle
from txsink.log import FileStore, LogStore
from txsink.sink import TwoPhaseCommitSink
from txsink.txid import TxnId

__all__ = ["FileEntry", "FilesHandle", "FilesSink", "read_committed", "read_manifests"]

Format = Literal["parquet", "jsonl", "csv"]
_EXT = {"parquet": "parquet", "jsonl": "jsonl", "csv": "csv"}
STAGING = "_txsink/staging"
MANIFESTS = "_manifests"


@dataclass(frozen=True)
class FileEntry:
    """One staged file: where it is, where it goes, and how to recognise it there."""

    staged: str  # relative to the sink path
    final: str  # relative to the sink path
    rows: int
    nbytes: int
    sha256: str


@register_handle
@dataclass(frozen=True)
class FilesHandle(Handle):
    serializer: ClassVar[str] = "files.staged"
    version: ClassVar[int] = 1

    files: tuple[FileEntry, ...] = ()

    @override
    def encode(self) -> dict[str, Any]:
        data = super().encode()
        data["files"] = [vars(f).copy() for f in self.files]
        return data

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> FilesHandle:
        fields = dict(data)
        fields["files"] = tuple(FileEntry(**f) for f in fields.get("files", ()))
        return super().decode(version, fields)


@dataclass
class _OpenFiles:
    """A task's open transaction: the current writer and the files already closed."""

    txn: TxnId
    schema: pa.Schema
    stage: Path
    seq: int = 0
    rows_total: int = 0
    rows_in_file: int = 0
    bytes_in_file: int = 0
    writer: Any = None
    stream: Any = None
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
        log: the txsink log, to use the sink alone as ``foreachBatch(sink)``.
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
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        if format not in _EXT:
            raise ValueError(f"FilesSink format must be one of {sorted(_EXT)}, got {format!r}")
        if compression is not None and format != "parquet" and compression != "gzip":
            raise ValueError(f"FilesSink: {format} supports compression='gzip' only")
        if target_file_bytes < 1:
            raise ValueError("target_file_bytes must be >= 1")
        self.path = os.path.abspath(os.fspath(path))
        self.format: Format = format
        self.compression = compression
        self.target_file_bytes = target_file_bytes

    @property
    def _ext(self) -> str:
        ext = _EXT[self.format]
        return ext + ".gz" if self.compression == "gzip" and self.format != "parquet" else ext

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
                sink_uid=self.uid,
                connector="files",
            ) from err
        self._check_owner(app_id)
        if self.format == "csv":
            for f in schema:
                if pa.types.is_nested(f.type) or pa.types.is_binary(f.type):
                    raise ConfigurationError(
                        f"column {f.name!r} has type {f.type}, which CSV cannot hold: use "
                        "format='parquet' or 'jsonl', or convert the column (e.g. to_json) "
                        "before the sink",
                        sink_uid=self.uid,
                        connector="files",
                        column=f.name,
                    )

    def _check_owner(self, app_id: str) -> None:
        """Refuse a folder whose epochs under this uid were written by another app.

        A new query (new checkpoint and log) numbers its epochs from 0 again;
        its files would collide with the old app's names.
        """
        for doc in read_manifests(self.path, self.uid):
            owner = doc.get("app_id")
            if owner is not None and owner != app_id:
                raise ConfigurationError(
                    f"{self.path} already holds epochs of sink uid {self.uid!r} written by app "
                    f"{owner!r}, and this query runs as app {app_id!r}: a new query numbers its "
                    "epochs from 0 again and its files would collide. Use a new output folder "
                    "or a new sink uid (or keep the old checkpoint and txsink log)",
                    sink_uid=self.uid,
                    connector="files",
                )

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
        if txn.writer is None and txn.stream is None:
            self._open_file(txn)
        if self.format in ("parquet", "csv"):
            txn.writer.write_batch(batch)
        elif txn.stream is not None:
            txn.stream.write(_jsonl(batch, self.uid, txn.txn.partition, txn.rows_total))
        txn.rows_in_file += batch.num_rows
        txn.rows_total += batch.num_rows
        txn.bytes_in_file += batch.nbytes
        if txn.bytes_in_file >= self.target_file_bytes:
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
    def finish_epoch(self, epoch: int, handles: Sequence[FilesHandle]) -> None:
        files = sorted(
            (
                {"path": e.final, "rows": e.rows, "bytes": e.nbytes, "sha256": e.sha256}
                for h in handles
                for e in h.files
            ),
            key=lambda f: str(f["path"]),
        )
        doc = {
            "version": 1,
            "app_id": handles[0].txn.app if handles else None,
            "uid": self.uid,
            "epoch": epoch,
            "format": self.format,
            "rows": sum(e.rows for h in handles for e in h.files),
            "files": files,
            "committed_at": time.time(),
        }
        _create_if_absent(
            Path(self.path, MANIFESTS, f"{self.uid}-{epoch:020d}.json"),
            (json.dumps(doc, indent=1) + "\n").encode(),
        )

    @override
    def abort(self, handle: FilesHandle) -> None:
        shutil.rmtree(Path(self.path, STAGING, str(handle.txn)), ignore_errors=True)

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
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """Manifests ``<old>-<e>.json`` -> ``<new>-<e>.json`` (create first, then delete)."""
        folder = Path(self.path, MANIFESTS)
        store = FileStore(folder)
        moved = 0
        for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
            if not (name.startswith(f"{old}-") and name.endswith(".json")):
                continue
            raw = (folder / name).read_bytes()
            if json.loads(raw).get("uid") != old:
                continue
            target = f"{self.uid}-{name[len(old) + 1 :]}"
            moved += 1
            if dry_run:
                continue
            body = manifests.renamed(raw, old, self.uid)
            if not store.create(target, body):
                manifests.check_renamed(
                    (folder / target).read_bytes(), body, str(folder / target), self.uid
                )
            (folder / name).unlink()
        verb = "would move" if dry_run else "moved"
        return [f"{self!r}: {verb} {moved} epoch manifest(s) from uid {old!r} to {self.uid!r}"]

    # -- helpers -----------------------------------------------------------------------

    def _final_name(self, txn: TxnId, seq: int) -> str:
        return f"epoch={txn.epoch}/{self.uid}-p{txn.partition:05d}-{seq:04d}.{self._ext}"

    def _open_file(self, txn: _OpenFiles) -> None:
        name = f"part-{txn.seq:04d}.{self._ext}"
        path = txn.stage / name
        if self.format == "parquet":
            txn.writer = pq.ParquetWriter(
                path, txn.schema, compression=self.compression or "snappy"
            )
        elif self.format == "csv":
            sink = pa.CompressedOutputStream(str(path), "gzip") if self.compression else str(path)
            txn.writer = pacsv.CSVWriter(sink, txn.schema)
        else:
            txn.stream = (
                gzip.open(path, "wb") if self.compression else open(path, "wb")  # noqa: SIM115
            )
        txn.closed.append((name, 0))

    def _close_file(self, txn: _OpenFiles) -> None:
        if txn.writer is None and txn.stream is None:
            return
        if txn.writer is not None:
            txn.writer.close()
        if txn.stream is not None:
            txn.stream.close()
        name, _ = txn.closed[-1]
        txn.closed[-1] = (name, txn.rows_in_file)
        txn.writer = txn.stream = None
        txn.seq += 1
        txn.rows_in_file = txn.bytes_in_file = 0


# -- JSON lines ---------------------------------------------------------------------------


def _jsonl(batch: pa.RecordBatch, uid: str, partition: int, first_row: int) -> bytes:
    rows = json_rows(
        batch,
        first_row=first_row,
        alternative=", or use format='parquet'",
        context={"sink_uid": uid, "partition": partition, "connector": "files"},
    )
    rows.append("")
    return "\n".join(rows).encode()


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


def _create_if_absent(path: Path, data: bytes) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


# -- readers ------------------------------------------------------------------------------


def read_manifests(path: str | os.PathLike[str], uid: str | None = None) -> list[dict[str, Any]]:
    """The epoch manifests of a files sink, by epoch (optionally of one sink uid)."""
    folder = Path(path, MANIFESTS)
    if not folder.is_dir():
        return []
    docs = []
    for name in sorted(os.listdir(folder)):
        if name.startswith(".tmp-") or not name.endswith(".json"):
            continue
        doc = json.loads((folder / name).read_text())
        if uid is None or doc["uid"] == uid:
            docs.append(doc)
    return sorted(docs, key=lambda d: (d["epoch"], d["uid"]))


def read_committed(path: str | os.PathLike[str], uid: str | None = None) -> pa.Table:
    """Read every row of whole committed epochs only, following the manifests.

    Adds an ``_epoch`` column. JSON lines come back as JSON types (strings
    for timestamps, decimals and binary).
    """
    tables = []
    for doc in read_manifests(path, uid):
        for f in doc["files"]:
            table = _read_file(Path(path, f["path"]), doc["format"])
            tables.append(
                table.append_column("_epoch", pa.array([doc["epoch"]] * len(table), pa.int64()))
            )
    if not tables:
        return pa.table({"_epoch": pa.array([], pa.int64())})
    return pa.concat_tables(tables, promote_options="permissive")


def _read_file(path: Path, fmt: str) -> pa.Table:
    if fmt == "parquet":
        return pq.read_table(path)
    if fmt == "csv":
        return pacsv.read_csv(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        rows = [json.loads(line) for line in f.read().decode().splitlines() if line]
    return pa.Table.from_pylist(rows)


def iter_final_files(path: str | os.PathLike[str]) -> Iterable[str]:
    """Every published data file under ``path`` (relative), manifests or not."""
    root = Path(path)
    for p in sorted(root.glob("epoch=*/*")):
        if p.is_file():
            yield str(p.relative_to(root))
