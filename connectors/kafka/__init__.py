"""Kafka connector: exactly-once for ``read_committed`` consumers, with transactions and a
compacted commit marker per shard (WAL, replay and direct modes).

The sink (:mod:`~txsink.connectors.kafka.sink`, and docs/connectors/kafka.md) picks one of
three modes, each a sub-package that says how the pre-commit is made durable and how the
commit finds the records again; the rooms beside them hold what every mode shares::

    sink         KafkaSink: configuration and the hooks; picks the mode
    checks       the checks at start, every mode
    fromreplay   the commit from Spark's replay of an epoch, verified by count and checksum
                 (replay mode's commit, and direct mode's shards no task committed)
    readback     read a topic back as a read_committed consumer (tests, benchmarks)
    testing      the testing adapter;  plugin: the registry record

    wal/         WAL mode: the records in a write-ahead log file; the commit produces it
                 task (the file, its handle), log (check, list, commit per shard), store
    replay/      replay mode: a count and a checksum; the commit re-reads the epoch
                 task (the tally, its handle), commit
    direct/      direct mode: the task's producer holds the transaction and commits it
                 task (the worker's producers, the open transaction), commit (leftovers)

    records/     what is written: rows -> Kafka records
                 format (RECORD_SCHEMA, RecordFormat), avro (Schema Registry), limits (a
                 record's size as the broker counts it), topics (what the brokers would
                 refuse), checksum (the replay checksum, every version, and the Tally)
    clients/     how the connector talks to Kafka
                 settings (KafkaSettings, the librdkafka logger), errors (error codes ->
                 txsink errors), producers (per-shard transactional producers, the commit
                 transaction), pool (producers kept in a Python worker), markers (the
                 compacted marker topic), offsets (last stable offsets), columns (a batch
                 of records as Python objects, for the produce loop and the checksum)

Why this cut: the modes differ only in where the pre-commit lives (a WAL file, nothing
but a count, an open transaction) and so in how their commit gets the records back; the
rest (encoding and refusing records, producers, markers, error codes) is one piece of
code for all three, so it is written once, in ``records/`` and ``clients/``. Imports run
one way: ``sink`` -> a mode -> ``fromreplay`` -> ``records/`` -> ``clients/`` (``checks``
and ``readback`` sit on the shared rooms too); a mode never imports another (what two
modes share is shared, like ``fromreplay``), nothing but the sink, this face and the
testing adapter imports a mode, and ``clients/`` imports nothing else of the connector
(``tests/test_structure.py`` checks it).
"""

from txsink.connectors.kafka.records.format import RECORD_SCHEMA
from txsink.connectors.kafka.replay import KafkaReplayHandle
from txsink.connectors.kafka.sink import KafkaSink
from txsink.connectors.kafka.wal import KafkaWalHandle

__all__ = ["RECORD_SCHEMA", "KafkaReplayHandle", "KafkaSink", "KafkaWalHandle"]
