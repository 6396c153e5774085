"""WAL mode's pre-commit task: the records go to a write-ahead log file, published whole.

The open transaction is one file, ``<wal>/<txn>/records.arrow`` (Arrow IPC); prepare
publishes it (:meth:`~txsink.connectors.kafka.wal.store.WalWriter.publish`) and the
handle names it with the CRC32 of its bytes, which the commit verifies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from txsink.connectors.kafka.records.format import RECORD_SCHEMA
from txsink.connectors.kafka.wal.store import WalWriter
from txsink.handles import Handle, register_handle
from txsink.txid import TxnId

__all__ = ["FILE", "KafkaWalHandle", "OpenWal"]

#: The one file of a transaction's folder in the WAL.
FILE = "records.arrow"


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
    file: WalWriter
    writer: Any = None
    rows: int = 0
    nbytes: int = 0

    def write(self, records: pa.RecordBatch) -> None:
        if self.writer is None:
            self.writer = pa.ipc.new_file(self.file, RECORD_SCHEMA)
        self.writer.write_batch(records)
        self.rows += records.num_rows
        self.nbytes += records.nbytes

    def prepare(self) -> KafkaWalHandle:
        """Publish the file whole and durably, with the CRC32 of its bytes."""
        if self.writer is None:
            self.writer = pa.ipc.new_file(self.file, RECORD_SCHEMA)
        self.writer.close()
        published = self.file.publish()
        return KafkaWalHandle(
            txn=self.txn,
            rows=self.rows,
            nbytes=self.nbytes,
            path=self.file.rel,
            crc32=published.crc32,
        )

    def discard(self) -> None:
        self.file.discard()
