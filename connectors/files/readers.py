"""Reading a files sink's output the safe way: through its epoch manifests."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from txsink.kit import evolving, formats, manifests
from txsink.store import FileStore

__all__ = ["committed_schema", "iter_final_files", "read_committed", "read_manifests"]


def read_manifests(path: str | os.PathLike[str], uid: str | None = None) -> list[dict[str, Any]]:
    """The epoch manifests of a files sink, by epoch (optionally of one sink uid)."""
    return manifests.read_manifests(FileStore(path), uid)


def read_committed(path: str | os.PathLike[str], uid: str | None = None) -> pa.Table:
    """Read every row of whole committed epochs only, following the manifests.

    Adds an ``_epoch`` column. JSON lines come back as JSON types (strings
    for timestamps, decimals and binary). Parquet epochs of different schemas come back
    in the widest one, the newest manifest's (:func:`txsink.kit.evolving.widest`): rows
    of older epochs null in columns added since, widened columns cast up.
    """

    def read(doc: Mapping[str, Any], entry: Mapping[str, Any]) -> pa.Table:
        name = str(entry["path"])
        # A files manifest names no codec: gzip'd text files end in .gz.
        compression = "gzip" if name.endswith(".gz") else None
        return formats.read_table(Path(path, name).read_bytes(), doc["format"], compression)

    docs = read_manifests(path, uid)
    return evolving.widest(manifests.read_committed(docs, read, "files"), docs)


def committed_schema(path: str | os.PathLike[str], uid: str | None = None) -> pa.Schema | None:
    """The widest schema the manifests record (the newest epoch's, for one sink uid): what
    to give another reader of the Parquet files, e.g. Spark's
    ``spark.read.schema(from_arrow_schema(...))`` (docs/connectors/files.md). None when no
    manifest records one (nothing committed, or only by an older txsink)."""
    return evolving.widest_recorded(read_manifests(path, uid))


def iter_final_files(path: str | os.PathLike[str]) -> Iterable[str]:
    """Every published data file under ``path`` (relative), manifests or not."""
    root = Path(path)
    for p in sorted(root.glob("epoch=*/*")):
        if p.is_file():
            yield str(p.relative_to(root))
