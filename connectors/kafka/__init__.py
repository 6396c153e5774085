"""Kafka connector: exactly-once for ``read_committed`` consumers, with transactions and a
compacted commit marker per shard (WAL and replay modes).

See :mod:`txsink.connectors.kafka.sink` and docs/connectors/kafka.md.
"""

from txsink.connectors.kafka.sink import (
    RECORD_SCHEMA,
    KafkaReplayHandle,
    KafkaSink,
    KafkaWalHandle,
)

__all__ = ["RECORD_SCHEMA", "KafkaReplayHandle", "KafkaSink", "KafkaWalHandle"]
