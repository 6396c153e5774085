"""The Delta connector's handle: a transaction's data files, as the txsink log stores it.

Serializer ``delta.files`` version 1. A file carries what its ``add`` action needs (path,
size, partition values, statistics), so a new driver commits from the handle alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from typing_extensions import override

from txsink.handles import Handle, register_handle

__all__ = ["DeltaFile", "DeltaHandle"]


@dataclass(frozen=True)
class DeltaFile:
    """One Parquet data file of a transaction.

    ``path`` is relative to the table's root, as stored (Hive folders escaped, not
    URI-encoded); ``stats`` is the ``add`` action's statistics JSON (``numRecords``,
    ``nullCount``, ``minValues``, ``maxValues``).
    """

    path: str
    size: int
    rows: int = 0
    partition: tuple[tuple[str, str | None], ...] = ()
    stats: str = ""
    modified_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "rows": self.rows,
            "partition": [[c, v] for c, v in self.partition],
            "stats": self.stats,
            "modified_ms": self.modified_ms,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DeltaFile:
        return cls(
            path=str(doc["path"]),
            size=int(doc["size"]),
            rows=int(doc.get("rows", 0)),
            partition=tuple((str(c), None if v is None else str(v)) for c, v in doc["partition"]),
            stats=str(doc.get("stats", "")),
            modified_ms=int(doc.get("modified_ms", 0)),
        )


@register_handle
@dataclass(frozen=True)
class DeltaHandle(Handle):
    """A transaction's data files in the table's folder, not (yet) in its log.

    Handles listed by :meth:`DeltaSink.list_prepared` carry paths and sizes only (enough to
    abort); decided handles carry the partition values and statistics too.
    """

    serializer: ClassVar[str] = "delta.files"
    version: ClassVar[int] = 1

    table: str = ""  # the table's URI (no secret: storage options are never in handles)
    files: tuple[DeltaFile, ...] = ()

    @override
    def encode(self) -> dict[str, Any]:
        data = super().encode()
        data["files"] = [f.to_json() for f in self.files]
        return data

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> DeltaHandle:
        fields = dict(data)
        fields["files"] = tuple(DeltaFile.from_json(f) for f in fields.get("files", ()))
        return super().decode(version, fields)
