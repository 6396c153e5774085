"""The SQLite connector's registry record: light (imports nothing but txsink.registry)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="sqlite",
    summary="A SQLite table (one machine): rows staged per transaction, moved in one commit",
    testing="txsink_sqlite.testing:ADAPTER",
    sink="txsink_sqlite.sink:SqliteSink",  # format("txsink").option("connector", "sqlite")
)
