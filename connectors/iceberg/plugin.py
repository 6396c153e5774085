"""The Iceberg connector's registry record (imports nothing heavy)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="iceberg",
    summary="Apache Iceberg tables (pyiceberg): data files per task, one snapshot per epoch",
    extra="iceberg",
    sink="txsink.connectors.iceberg.sink:IcebergSink",
    testing="txsink.connectors.iceberg.testing:ADAPTER",
)
