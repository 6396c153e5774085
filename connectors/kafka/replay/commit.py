"""Replay mode's commit: the decided shards, from Spark's replay of the epoch, verified.

The driver checks the decision's number of shards against the sink's, then commits
every shard by content (:func:`~txsink.connectors.kafka.fromreplay.commit_by_content`).
"""

from __future__ import annotations

from typing import Any

from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.fromreplay import Decided, commit_by_content
from txsink.connectors.kafka.records.format import RecordFormat
from txsink.contract import EpochCommit
from txsink.errors import CommitError, ConfigurationError

__all__ = ["commit_epoch"]


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
    decided: dict[int, Decided] = {}
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
    commit_by_content(data, settings, fmt, app=app, epoch=epoch, decided=decided)
    request.committed(handles)
