"""The S3 connector's registry record (imports nothing heavy)."""

from txsink.registry import Connector

CONNECTOR = Connector(
    name="s3",
    summary="S3 and S3-compatible object stores: multipart uploads, epoch manifests",
    extra="s3",
    sink="txsink.connectors.s3.sink:S3Sink",
    testing="txsink.connectors.s3.testing:ADAPTER",
    log_stores={
        "s3": "txsink.connectors.s3.log_store:S3Store",
        "s3a": "txsink.connectors.s3.log_store:S3Store",
    },
)
