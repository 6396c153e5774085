"""WAL mode: the pre-commit is a write-ahead log file, the commit produces it.

::

    task     begin: a folder <wal>/<txn>/; write: Arrow IPC records.arrow; prepare: close,
             fsync file and folders, CRC32 of the file -> KafkaWalHandle(path, crc32)
    driver   commit_epoch: per shard (partition % shards, fixed in the decision), in one
             Kafka transaction with the shard's marker: verify each file's CRC32, produce
             its records; then delete the files. A shard whose marker already says the
             epoch is done: delete the files only.
    driver   abort: delete the folder; list_prepared: the folders of this app and sink

The folder must be shared by the driver and every executor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import zlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from txsink._fs import fsync_dir
from txsink._logging import get_logger
from txsink.connectors.kafka.producers import ShardProducers, produce_records
from txsink.connectors.kafka.records import RECORD_SCHEMA
from txsink.contract import EpochCommit
from txsink.errors import CommitError, ConfigurationError
from txsink.handles import Handle, register_handle
from txsink.txid import TxnId

__all__ = ["KafkaWalHandle", "OpenWal", "WalFolder"]

_FILE = "records.arrow"


@register_handle
@dataclass(frozen=True)
class KafkaWalHandle(Handle):
    """Records of one task, durable in the write-ahead log; ``path`` is relative to ``wal``."""

    serializer: ClassVar[str] = "kafka.wal"
    version: ClassVar[int] = 1

    path: str = ""
    crc32: int = 0


@dataclass
class OpenWal:
    """One task's open WAL file (the sink's open transaction in WAL mode)."""

    txn: TxnId
    folder: Path
    writer: Any = None
    rows: int = 0
    nbytes: int = 0

    def write(self, records: pa.RecordBatch) -> None:
        if self.writer is None:
            self.writer = pa.ipc.new_file(str(self.folder / _FILE), RECORD_SCHEMA)
        self.writer.write_batch(records)
        self.rows += records.num_rows
        self.nbytes += records.nbytes

    def prepare(self) -> KafkaWalHandle:
        """Close, fsync the file and its folders, and record the file's CRC32."""
        path = self.folder / _FILE
        if self.writer is not None:
            self.writer.close()
        with open(path, "rb") as f:
            crc = _crc32(f)
            os.fsync(f.fileno())
        fsync_dir(self.folder)
        fsync_dir(self.folder.parent)
        return KafkaWalHandle(
            txn=self.txn, rows=self.rows, nbytes=self.nbytes, path=f"{self.txn}/{_FILE}", crc32=crc
        )

    def discard(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):  # the folder goes anyway
                self.writer.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass(frozen=True)
class WalFolder:
    """The write-ahead log folder ``root`` (absolute) of one sink."""

    root: str

    def create(self, ctx: dict[str, Any]) -> None:
        """At start: the folder exists (or is created), else a ConfigurationError."""
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as err:
            raise ConfigurationError(
                f"cannot create the WAL folder {self.root}: {err.strerror}", **ctx
            ) from err

    def open(self, txn: TxnId) -> OpenWal:
        folder = Path(self.root, str(txn))
        shutil.rmtree(folder, ignore_errors=True)  # a retried attempt of the same name
        folder.mkdir(parents=True)
        return OpenWal(txn, folder)

    def delete(self, handles: Sequence[Handle]) -> None:
        for h in handles:
            shutil.rmtree(Path(self.root, str(h.txn)), ignore_errors=True)

    def list_prepared(self, app_id: str, uid: str) -> Iterator[KafkaWalHandle]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return
        for name in sorted(names):
            txn = TxnId.try_parse(name)
            if txn is not None and txn.belongs_to(app_id, uid):
                yield KafkaWalHandle(txn=txn, path=f"{name}/{_FILE}")

    # -- commit ----------------------------------------------------------------------

    def commit_epoch(self, request: EpochCommit[Any], producers: ShardProducers) -> None:
        """One Kafka transaction per shard (its records and marker); a shard is the unit
        reported to ``request.committed``, after its transaction committed."""
        handles: Sequence[KafkaWalHandle] = request.handles
        if not handles:
            return
        by_shard: dict[int, list[KafkaWalHandle]] = defaultdict(list)
        for h in handles:
            by_shard[h.txn.partition % producers.settings.shards].append(h)
        for shard in by_shard:
            producers.get(shard)  # init_transactions before reading markers: fences zombies
        producers.markers.load(handles[0].txn.app, sorted(by_shard))
        for shard in sorted(by_shard):
            mine = sorted(by_shard[shard], key=lambda h: h.txn)
            self._commit_shard(producers, shard, request.epoch, mine)
            request.committed(mine)

    def _commit_shard(
        self, producers: ShardProducers, shard: int, epoch: int, handles: list[KafkaWalHandle]
    ) -> None:
        app, uid = handles[0].txn.app, producers.settings.uid
        producers.get(shard)
        marker = producers.markers.last(app, shard)
        if marker is not None and marker >= epoch:
            self.delete(handles)  # committed before a crash: verified by the marker
            return
        missing = [h.path for h in handles if not Path(self.root, h.path).exists()]
        if missing:
            # The cached marker may be stale: another driver (this one's successor, if
            # this driver was frozen and is a zombie now) may have committed the epoch
            # and deleted its WAL files since. Read the marker again before calling
            # them lost.
            marker = producers.markers.reread(app, shard)
            if marker is not None and marker >= epoch:
                get_logger(__name__, uid=uid, epoch=epoch).info(
                    "Kafka shard %s: epoch already committed by another driver (marker: "
                    "epoch %s); nothing to do",
                    shard,
                    marker,
                )
                return
            raise CommitError(
                f"cannot commit epoch {epoch} shard {shard}: WAL files {missing} are gone and the "
                f"shard's marker says epoch {marker}, so their records are lost. Was the WAL "
                f"folder {self.root} cleaned by hand?",
                sink_uid=uid,
                epoch=epoch,
                connector="kafka",
                phase="commit",
            )
        self._verify(uid, epoch, handles)

        def body(producer: Any) -> None:
            for h in handles:
                with pa.memory_map(str(Path(self.root, h.path))) as source:
                    reader = pa.ipc.open_file(source)
                    for i in range(reader.num_record_batches):
                        produce_records(producer, reader.get_batch(i))

        producers.transaction(shard, app, epoch, body)
        self.delete(handles)

    def _verify(self, uid: str, epoch: int, handles: Sequence[KafkaWalHandle]) -> None:
        """Refuse to commit WAL files that differ from what the pre-commit wrote.

        A torn or corrupted file could otherwise commit fewer or other records than
        were decided; the CRC was taken after the fsync, before the decision.
        """
        for h in handles:
            if not h.crc32:
                continue  # a listed (not decided) handle: never committed
            path = Path(self.root, h.path)
            with open(path, "rb") as f:
                crc = _crc32(f)
            if crc != h.crc32:
                raise CommitError(
                    f"WAL file {path} is corrupted (crc32 {crc:#010x}, the "
                    f"pre-commit recorded {h.crc32:#010x}): its records cannot be committed as "
                    "decided. Restore the file from a backup of the WAL folder if you have one; "
                    "otherwise the epoch's records of this task are lost",
                    sink_uid=uid,
                    epoch=epoch,
                    partition=h.txn.partition,
                    connector="kafka",
                    phase="commit",
                )


def _crc32(f: Any) -> int:
    crc = 0
    while chunk := f.read(1 << 20):
        crc = zlib.crc32(chunk, crc)
    return crc
