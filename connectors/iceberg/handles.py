"""The Iceberg connector's handle: the prepared data files of one task attempt."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

from typing_extensions import override

from txsink.handles import Handle, register_handle

__all__ = ["IcebergFile", "IcebergHandle"]

#: One prepared data file: (path, record count, partition spec id, partition values as
#: Iceberg single-value hex strings, None for a null; ``None`` for "read from the footer").
IcebergFile = tuple[str, int, int, tuple[str | None, ...] | None]


@register_handle
@dataclass(frozen=True)
class IcebergHandle(Handle):
    """A prepared task attempt: its Parquet files, written in the table's data location
    under transaction-named paths that no snapshot references yet."""

    serializer: ClassVar[str] = "iceberg.files"
    version: ClassVar[int] = 1

    files: tuple[IcebergFile, ...] = ()

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> Self:
        fields = dict(data)
        fields["files"] = tuple(
            (str(p), int(n), int(spec), None if part is None else tuple(part))
            for p, n, spec, part in fields.get("files", ())
        )
        return super().decode(version, fields)
