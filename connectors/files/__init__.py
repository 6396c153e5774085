"""Files connector: exactly-once Parquet, JSON lines or CSV on a local or mounted filesystem.

See :mod:`txsink.connectors.files.sink` for how the two phases map to files, and
docs/connectors/files.md.
"""

from txsink.connectors.files.handles import FileEntry, FilesHandle
from txsink.connectors.files.readers import (
    committed_schema,
    iter_final_files,
    read_committed,
    read_manifests,
)
from txsink.connectors.files.sink import MANIFESTS, STAGING, FilesSink

__all__ = [
    "MANIFESTS",
    "STAGING",
    "FileEntry",
    "FilesHandle",
    "FilesSink",
    "committed_schema",
    "iter_final_files",
    "read_committed",
    "read_manifests",
]
