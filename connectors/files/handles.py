"""The files connector's handle: a transaction's staged files, as the txsink log stores it.

Serializer ``files.staged`` version 2 (golden files in tests/golden pin the JSON form of
version 1, which is still read: its handles carry no schema).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from typing_extensions import override

from txsink.handles import Handle, register_handle

__all__ = ["FileEntry", "FilesHandle"]


@dataclass(frozen=True)
class FileEntry:
    """One staged file: where it is, where it goes, and how to recognise it there."""

    staged: str  # relative to the sink path
    final: str  # relative to the sink path
    rows: int
    nbytes: int
    sha256: str


@register_handle
@dataclass(frozen=True)
class FilesHandle(Handle):
    serializer: ClassVar[str] = "files.staged"
    #: 2: ``schema``, the epoch's schema as the task wrote it, so the manifest can record
    #: it on any driver (:mod:`txsink.kit.evolving`); an older txsink refuses such a
    #: handle by its version rather than meet a field it does not know.
    version: ClassVar[int] = 2

    files: tuple[FileEntry, ...] = ()
    schema: str = ""  # txsink.kit.evolving.encode_schema; "" in a version-1 handle

    @override
    def encode(self) -> dict[str, Any]:
        data = super().encode()
        data["files"] = [vars(f).copy() for f in self.files]
        return data

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> FilesHandle:
        fields = dict(data)
        fields["files"] = tuple(FileEntry(**f) for f in fields.get("files", ()))
        if version == 1:  # decided by an older txsink: no schema
            return super().decode(cls.version, fields)
        return super().decode(version, fields)
