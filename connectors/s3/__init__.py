"""S3 connector: multipart upload two-phase commit, epoch manifests; the txsink log on S3.

See :mod:`txsink.connectors.s3.sink`, docs/connectors/s3.md and docs/log-on-s3.md.
"""

from txsink.connectors.s3.handles import S3Handle, S3Object, S3Part
from txsink.connectors.s3.log_store import S3Store
from txsink.connectors.s3.readers import committed_schema, read_committed, read_manifests
from txsink.connectors.s3.sink import S3Sink

__all__ = [
    "S3Handle",
    "S3Object",
    "S3Part",
    "S3Sink",
    "S3Store",
    "committed_schema",
    "read_committed",
    "read_manifests",
]
