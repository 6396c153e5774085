"""Replay mode's pre-commit task: count and checksum the shard's records; nothing is stored.

The handle is all the decision keeps of a shard: its count and checksum, which the
commit's replay must match (:mod:`~txsink.connectors.kafka.replay.commit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from typing_extensions import override

from txsink.connectors.kafka.records.checksum import CHECKSUM_VERSION, Tally
from txsink.handles import Handle, register_handle
from txsink.txid import TxnId

__all__ = ["KafkaReplayHandle", "OpenReplay"]


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
    #: The :mod:`~txsink.connectors.kafka.records.checksum` version: 1 topic, key, value (txsink
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
