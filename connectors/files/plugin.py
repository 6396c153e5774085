"""The files connector's registry record (imports nothing heavy)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="files",
    summary="Parquet, JSON lines or CSV on a local or mounted filesystem (no server)",
    sink="txsink.connectors.files.sink:FilesSink",
    testing="txsink.connectors.files.testing:ADAPTER",
    commands={"demo": "txsink.connectors.files.demo:COMMAND"},
)
