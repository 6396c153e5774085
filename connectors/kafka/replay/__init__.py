"""Replay mode: no WAL; the commit re-reads the epoch's rows and checks them first.

::

    task     the epoch is resharded into ``shards`` tasks by Spark's stable hash of
             ``shard_by``; each counts its records and sums an order-independent checksum
             -> KafkaReplayHandle(rows, checksum)                               (task.py)
    commit   a second job over the same (persisted) rows through EpochData.map_partitions,
             one task per shard: encode, checksum, produce, and the shard's marker in one
             transaction, committed only if count and checksum match the decided ones;
             else the transaction is aborted and the shard is committed from the replayed
             partition with its count and checksum (a replay that numbers the partitions
             otherwise), or, if none has them, NonDeterministicReplayError   (commit.py,
             on the commit shared with direct mode: ../fromreplay.py)

After a crash only the replay of the same epoch (Spark re-running the batch) can commit
it: the rows exist nowhere else.
"""

from txsink.connectors.kafka.replay.commit import commit_epoch
from txsink.connectors.kafka.replay.task import KafkaReplayHandle, OpenReplay

__all__ = ["KafkaReplayHandle", "OpenReplay", "commit_epoch"]
