"""The Postgres connector's registry record (imports nothing heavy)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="postgres",
    summary="PostgreSQL tables: COPY, append or upsert; PREPARE TRANSACTION / COMMIT PREPARED, "
    "or a staging table where the server has no prepared transactions",
    extra="postgres",
    sink="txsink.connectors.postgres.sink:PostgresSink",
    testing="txsink.connectors.postgres.testing:ADAPTER",
)
