"""WAL mode: the pre-commit is a write-ahead log file, the commit produces it.

::

    task     begin: a new file <wal>/<txn>/records.arrow (store.py); write: Arrow IPC
             records; prepare: publish the file whole (local: temp name, fsync, rename,
             fsync the folders; object store: the upload completes), its CRC32 taken as
             it was written -> KafkaWalHandle(path, crc32)
    commit   one Spark task per shard (partition % shards, fixed in the decision), through
             EpochCommit.tasks: init_transactions on the shard's transactional id (fences
             zombies), read its marker; if it already says the epoch: delete the files;
             else in one Kafka transaction: verify each file's CRC32, produce its records,
             then the marker; commit; delete the files. The driver reports the shards
             committed once every task returned.
             Without a cluster (``txsink recover``, local_tasks): the driver commits
             shard after shard with its own producers, reporting each one as it goes.
    driver   abort: delete the txn's folder; list_prepared: the folders of this app and sink

The modules: ``task.py`` the task's file and its handle; ``log.py`` the sink's WAL on the
driver (check, list, delete) and the commit per shard; ``store.py`` where the files live.

The location is any place the driver and every executor reach: a shared folder, or an
object store (``s3://bucket/prefix``) through ``pyarrow.fs``.
"""

from txsink.connectors.kafka.wal.log import ShardCommit, ShardResult, WriteAheadLog
from txsink.connectors.kafka.wal.task import KafkaWalHandle, OpenWal

__all__ = ["KafkaWalHandle", "OpenWal", "ShardCommit", "ShardResult", "WriteAheadLog"]
