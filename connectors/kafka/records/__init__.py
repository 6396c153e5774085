"""What the Kafka connector writes: Spark rows as Kafka records, checked before the decision.

``format`` (RECORD_SCHEMA, RecordFormat: topic, partition, key, value and headers per
row), ``avro`` (Avro keys and values with a Schema Registry), ``limits`` (a record's
size as the broker counts it), ``topics`` (what the brokers say about a topic, and the
records they would refuse), ``checksum`` (the replay checksum, every version, and the
Tally of records as they pass).

Imports only :mod:`~txsink.connectors.kafka.clients` of the connector (``topics`` asks the
brokers, ``checksum`` hashes the produce loop's columns); every mode builds on it.
"""
