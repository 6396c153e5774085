"""Direct mode's commit on the driver: the decided shards no task committed.

A task that could not commit after the decision (killed, lost its executor, the driver
died before answering) leaves its shard to this step, which commits it from the epoch's
replay, verified by count and checksum (:mod:`~txsink.connectors.kafka.fromreplay`, the
path replay mode commits by).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from txsink.connectors.kafka.clients.producers import fence
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.kafka.fromreplay import commit_by_content
from txsink.connectors.kafka.records.format import RecordFormat
from txsink.contract import EpochCommit
from txsink.errors import CommitError

__all__ = ["commit_leftovers"]


def commit_leftovers(request: EpochCommit[Any], settings: KafkaSettings, fmt: RecordFormat) -> None:
    """Commit the decided shards no task committed, from the epoch's replay, verified.

    One task per partition of the replay: the shard's marker says whether it committed; if
    not, the replayed records must match the decided count and checksum. A replay that
    numbers the partitions otherwise (a source listing its partitions in another order
    after a restart) is matched by content (:func:`~txsink.connectors.kafka.fromreplay.
    commit_by_content`); one whose rows differ is refused.
    """
    epoch, handles, data = request.epoch, request.handles, request.data
    if not handles:
        return
    if data is None:  # pragma: no cover - the core refuses before calling
        raise CommitError("direct mode commits leftovers from the epoch's rows", epoch=epoch)
    decided = {h.shard: (h.rows, h.checksum, h.checksum_version) for h in handles}
    app = handles[0].txn.app
    # Abort whatever this sink's tasks left open first (this epoch's, or a dead task's of
    # any partition): each commit task reads its marker, and a read_committed read waits
    # on every transaction open on the marker topic.
    ids = [settings.transactional_id(shard) for shard in range(settings.shards)]
    with ThreadPoolExecutor(max_workers=min(8, len(ids))) as pool:  # each waits on a broker
        list(pool.map(lambda tid: fence(settings, [tid], phase="commit"), ids))
    commit_by_content(data, settings, fmt, app=app, epoch=epoch, decided=decided)
    request.committed(handles)
