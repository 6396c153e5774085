"""How the Kafka connector talks to Kafka: what every mode shares below the records.

``settings`` (KafkaSettings: one sink's brokers, identity and timeouts, and the
librdkafka logger), ``errors`` (``KafkaError`` codes -> txsink errors), ``producers``
(the per-shard transactional producers and the commit transaction), ``pool`` (producers
kept across tasks in one Python worker), ``markers`` (the compacted marker topic),
``offsets`` (last stable offsets and high watermarks), ``columns`` (a batch of records
as Python objects, converted once for the produce loop and the checksum).

Imports nothing of the rest of the connector: the records, the modes and the sink build
on it.
"""
