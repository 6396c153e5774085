"""Direct mode (single pass): the task's producer holds the epoch's transaction and commits it.

Flink's Kafka sink on Spark: no write-ahead log, no second pass. The coordinator runs the
epoch as one barrier job (:mod:`txsink.protocol.singlepass`); in each task::

    begin    the task's shard is its Spark partition; its producer, transactional id
             <prefix>-<uid>-<partition>, is taken from this Python worker's pool (made
             and init_transactions-ed once per query run: that fences any zombie with
             the id and aborts what it left open); begin_transaction
    write    encode, count and checksum the records (the replay's verification), produce
    prepare  produce the shard's marker (epoch) into the same transaction; flush; any
             failed delivery fails the task -> KafkaDirectHandle(rows, checksum, shards)
    vote     the driver decides while the transaction is open; on "commit":
    commit   commit_transaction (commit_in_task)
    abort    abort_transaction (discard), or, if the task died, the next init_transactions
             on the id (a retry, the next run's check) aborts it

After the decision, a shard whose task could not commit (killed, lost its executor, the
driver died before answering) is committed from the epoch's replay (Spark re-runs the
batch): the same verified path as replay mode (:func:`~txsink.connectors.kafka.fromreplay.
commit_by_content`): the shard's marker says whether it is committed, and the replayed
rows must match the decided count and checksum. The shard is the partition, so the replay
must deal each partition the rows it had: plans that do not (a round-robin repartition,
``rand()``...) are refused at the start (:mod:`txsink.spark.stability`); a replay that only
numbers the partitions otherwise is matched by content; one whose rows differ is refused
with NonDeterministicReplayError, nothing of that shard written.

No marker is read in the single pass: the coordinator skips committed epochs and
recovery finishes decided ones before a new round begins, so a new round's shards are
never committed yet. (Reading markers there would wait on the other tasks' open
transactions, which sit in the same marker partition.)

The modules: ``task.py`` the task's transaction on this worker's pooled producer, and its
handle; ``commit.py`` the driver's commit of the shards no task committed.
"""

from txsink.connectors.kafka.direct.commit import commit_leftovers
from txsink.connectors.kafka.direct.task import KafkaDirectHandle, OpenDirect, clear, open_direct

__all__ = ["KafkaDirectHandle", "OpenDirect", "clear", "commit_leftovers", "open_direct"]
