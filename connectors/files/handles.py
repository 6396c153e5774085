"""The files connector's handle: a transaction's staged files, as the txsink log stores it.

Serializer ``files.staged`` version 1 (golden files in tests/golden pin the JSON form).
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
    version: ClassVar[int] = 1

    files: tuple[FileEntry, ...] = ()

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
        return super().decode(version, fields)
