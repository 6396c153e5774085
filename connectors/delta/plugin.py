"""The Delta connector's registry record (imports nothing heavy)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="delta",
    summary="Delta Lake tables (delta-rs): Parquet files per task, one Delta commit per epoch",
    extra="delta",
    sink="txsink.connectors.delta.sink:DeltaSink",
    testing="txsink.connectors.delta.testing:ADAPTER",
)
