"""The Kafka connector's registry record (imports nothing heavy)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="kafka",
    summary="Kafka topics: a transaction and a compacted commit marker per shard",
    extra="kafka",
    sink="txsink.connectors.kafka.sink:KafkaSink",
    testing="txsink.connectors.kafka.testing:ADAPTER",
)
