"""Iceberg connector: Parquet data files prepared under transaction-named paths, one table
transaction per epoch recording the epoch in the table's properties.

See :mod:`txsink.connectors.iceberg.sink` and docs/connectors/iceberg.md.
"""

from txsink.connectors.iceberg.handles import IcebergHandle
from txsink.connectors.iceberg.sink import IcebergSink

__all__ = ["IcebergHandle", "IcebergSink"]
