"""Replay mode: no WAL; the commit re-reads the epoch's rows and checks them first.

::

    task     the epoch is resharded into ``shards`` tasks by Spark's stable hash of
             ``shard_by``; each counts its records and sums an order-independent checksum
             -> KafkaReplayHandle(rows, checksum)
    commit   a second job over the same (persisted) rows through EpochData.map_partitions,
             one task per shard: encode, checksum, produce, and the shard's marker in one
             transaction, committed only if count and checksum match the decided ones;
             else NonDeterministicReplayError and the transaction is aborted

After a crash only the replay of the same epoch (Spark re-running the batch) can commit
it: the rows exist nowhere else.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from typing_extensions import override

from txsink.connectors.kafka import pool
from txsink.connectors.kafka.checksum import CHECKSUM_VERSION, checksum
from txsink.connectors.kafka.clients import KafkaSettings
from txsink.connectors.kafka.columns import PyColumns, py_columns
from txsink.connectors.kafka.producers import produce_records
from txsink.connectors.kafka.records import RecordFormat
from txsink.contract import EpochCommit, TaskInfo
from txsink.errors import CommitError, ConfigurationError, NonDeterministicReplayError
from txsink.handles import Handle, register_handle
from txsink.txid import TxnId

__all__ = [
    "CHECKSUM_VERSION",
    "KafkaReplayHandle",
    "OpenReplay",
    "ShardCommit",
    "Tally",
    "checksum",
    "commit_epoch",
]

_MOD = 1 << 64


@register_handle
@dataclass(frozen=True)
class KafkaReplayHandle(Handle):
    """A shard's count and checksum at pre-commit (replay mode: no data stored)."""

    serializer: ClassVar[str] = "kafka.replay"
    #: 3: written with checksum version 3, so that a txsink that does not know that
    #: checksum refuses the handle (HandleFormatError: upgrade) instead of calling a
    #: deterministic replay non-deterministic.
    version: ClassVar[int] = 3

    shards: int = 1
    checksum: int = 0
    #: The :mod:`~txsink.connectors.kafka.checksum` version: 1 topic, key, value (txsink
    #: <= 0.1); 2 also partition, headers and nulls; 3 the same, vectorised.
    checksum_version: int = CHECKSUM_VERSION

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> KafkaReplayHandle:
        if version == 1:  # decided by an older txsink: verify its replay the old way
            return super().decode(cls.version, {**data, "checksum_version": 1})
        if version == 2:  # checksum version 1 or 2, as recorded
            return super().decode(cls.version, data)
        return super().decode(version, data)


@dataclass
class Tally:
    """A count and an order-independent checksum of records, as they pass."""

    version: int = CHECKSUM_VERSION
    rows: int = 0
    nbytes: int = 0
    checksum: int = 0

    def reset(self) -> None:
        self.rows = self.nbytes = self.checksum = 0

    def add(self, records: pa.RecordBatch, columns: PyColumns | None = None) -> None:
        """Count ``records`` in (``columns``: as Python objects, if converted already)."""
        self.checksum = (self.checksum + checksum(records, self.version, columns)) % _MOD
        self.rows += records.num_rows
        self.nbytes += records.nbytes


@dataclass
class OpenReplay:
    """One pre-commit task's tally (the sink's open transaction in replay mode)."""

    txn: TxnId
    tally: Tally = field(default_factory=Tally)

    @property
    def rows(self) -> int:
        return self.tally.rows

    def write(self, records: pa.RecordBatch) -> None:
        self.tally.add(records)

    def prepare(self, shards: int) -> KafkaReplayHandle:
        t = self.tally
        return KafkaReplayHandle(
            txn=self.txn, rows=t.rows, nbytes=t.nbytes, shards=shards, checksum=t.checksum
        )


def commit_epoch(request: EpochCommit[Any], settings: KafkaSettings, fmt: RecordFormat) -> None:
    """Commit a replay-mode epoch: one task per shard, run through ``request.data``.

    Refuses an epoch decided with another number of shards (the rows would go to other
    tasks than the ones that counted them).
    """
    epoch, handles, data = request.epoch, request.handles, request.data
    if not handles:
        return
    if data is None:  # pragma: no cover - the coordinator refuses before calling
        raise CommitError("replay mode commits from the epoch's rows", epoch=epoch)
    decided: dict[int, tuple[int, int, int]] = {}
    for h in handles:
        if h.shards != settings.shards:
            raise ConfigurationError(
                f"epoch {epoch} was decided with shards={h.shards}, this sink has "
                f"shards={settings.shards}: set shards={h.shards} until that epoch is committed",
                sink_uid=settings.uid,
                epoch=epoch,
                connector="kafka",
            )
        decided[h.txn.partition] = (h.rows, h.checksum, h.checksum_version)
    app = handles[0].txn.app
    data.map_partitions(ShardCommit(settings, fmt, app, epoch, decided))
    request.committed(handles)


@dataclass(frozen=True)
class ShardCommit:
    """The replay commit task (pickled into each task): the shard is the task's partition,
    the epoch having been resharded into one partition per shard."""

    settings: KafkaSettings
    fmt: RecordFormat
    app: str
    epoch: int
    #: shard -> (rows, checksum, checksum version) decided at pre-commit
    decided: dict[int, tuple[int, int, int]]

    def __call__(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> tuple[str, int]:
        """Commit the task's shard with the worker's pooled producer
        (:func:`~txsink.connectors.kafka.pool.commit_shard`): each batch encoded, converted
        to Python objects once for the checksum and the produce loop."""
        shard = task.partition
        rows, sum_, version = self.decided.get(shard, (0, 0, CHECKSUM_VERSION))
        tally = Tally(version)

        def produce(producer: Any, batch: pa.RecordBatch) -> int:
            records = self.fmt.encode(batch, shard, tally.rows)
            columns = py_columns(records)
            tally.add(records, columns)
            produce_records(producer, records, columns)
            return int(records.num_rows)

        def verify() -> None:
            if (tally.rows, tally.checksum) != (rows, sum_):
                raise NonDeterministicReplayError(
                    f"the replay of epoch {self.epoch} gives shard {shard} {tally.rows} records "
                    f"(checksum {tally.checksum}), but its pre-commit recorded {rows} (checksum "
                    f"{sum_}): the source or a transformation is not deterministic. Nothing "
                    "was written. Use mode='wal' for this query (the WAL keeps the decided "
                    "records), or make the input deterministic",
                    sink_uid=self.settings.uid,
                    epoch=self.epoch,
                    partition=shard,
                    connector="kafka",
                    phase="commit",
                )

        done = pool.commit_shard(
            self.settings,
            shard,
            self.app,
            self.epoch,
            items=batches,
            produce=produce,
            start=tally.reset,
            finish=verify,
        )
        return ("committed", tally.rows) if done else ("already-committed", 0)
