"""txsink connectors, importable as ``txsink.connectors.<name>``.

Each connector is a module with one sink class built on
:class:`txsink.sink.TwoPhaseCommitSink`; optional dependencies (psycopg,
confluent-kafka, boto3) are imported only by the connector that needs them.
"""
