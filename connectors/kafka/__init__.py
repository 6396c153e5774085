"""Kafka connector: exactly-once for ``read_committed`` consumers, with transactions and a
compacted commit marker per shard (WAL and replay modes).

The modules, one job each (see :mod:`txsink.connectors.kafka.sink` for the protocol and
docs/connectors/kafka.md)::

    sink       KafkaSink: configuration and the hooks
    records    Arrow rows -> Kafka records (RECORD_SCHEMA), size checks
    avro       Avro keys and values with a Schema Registry
    wal        WAL mode: the write-ahead log files, and their commit per shard
    replay     replay mode: counts and checksums, the per-shard commit task
    checksum   the replay checksum, every version (3: vectorised)
    columns    a batch of records as Python objects, converted once per batch
    producers  the per-shard transactional producers and the commit transaction
    pool       producers kept across tasks in a Python worker (fenced correctly)
    markers    the compacted marker topic: keys, reads, creation
    offsets    last stable offsets and high watermarks
    errors     Kafka error codes -> txsink errors
    checks     the checks at start
    clients    the settings every client of a sink is built with
    readback   read a topic back as a read_committed consumer (tests, benchmarks)
    testing    the testing adapter; plugin: the registry record
"""

from txsink.connectors.kafka.records import RECORD_SCHEMA
from txsink.connectors.kafka.replay import KafkaReplayHandle
from txsink.connectors.kafka.sink import KafkaSink
from txsink.connectors.kafka.wal import KafkaWalHandle

__all__ = ["RECORD_SCHEMA", "KafkaReplayHandle", "KafkaSink", "KafkaWalHandle"]
