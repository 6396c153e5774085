"""The Postgres connector's registry record (imports nothing heavy)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="postgres",
    summary="PostgreSQL tables: PREPARE TRANSACTION / COMMIT PREPARED, COPY, append or upsert",
    extra="postgres",
    sink="txsink.connectors.postgres.sink:PostgresSink",
    testing="txsink.connectors.postgres.testing:ADAPTER",
)
