"""The S3 connector's handle: a transaction's multipart uploads, as the txsink log stores it.

Serializer ``s3.multipart`` version 2 (golden files in tests/golden pin the JSON form of
version 1, which is still read: its handles carry no schema).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from typing_extensions import override

from txsink.handles import Handle, register_handle

__all__ = ["S3Handle", "S3Object", "S3Part"]


@dataclass(frozen=True)
class S3Part:
    """One uploaded part: its number, ETag (without quotes) and base64 CRC32."""

    number: int
    etag: str
    crc32: str = ""


@dataclass(frozen=True)
class S3Object:
    """One object of a transaction: its multipart upload and how to recognise it completed."""

    key: str  # the full key in the bucket
    upload_id: str
    parts: tuple[S3Part, ...] = ()
    rows: int = 0
    nbytes: int = 0
    etag: str = ""  # expected multipart ETag, "<md5 of the part md5s>-<parts>", or ""
    checksum: str = ""  # expected composite CRC32, "<base64>-<parts>", or ""
    partition: tuple[tuple[str, str | None], ...] = ()  # Hive values (None: null)

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "upload_id": self.upload_id,
            "parts": [[p.number, p.etag, p.crc32] for p in self.parts],
            "rows": self.rows,
            "nbytes": self.nbytes,
            "etag": self.etag,
            "checksum": self.checksum,
            "partition": [[c, v] for c, v in self.partition],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> S3Object:
        return cls(
            key=str(doc["key"]),
            upload_id=str(doc["upload_id"]),
            parts=tuple(S3Part(int(n), str(e), str(c)) for n, e, c in doc.get("parts", ())),
            rows=int(doc.get("rows", 0)),
            nbytes=int(doc.get("nbytes", 0)),
            etag=str(doc.get("etag", "")),
            checksum=str(doc.get("checksum", "")),
            partition=tuple((str(c), v) for c, v in doc.get("partition", ())),
        )


@register_handle
@dataclass(frozen=True)
class S3Handle(Handle):
    """A transaction's multipart uploads; ``marker`` is its marker object's key.

    Handles listed by :meth:`S3Sink.list_prepared` carry keys and upload ids only
    (enough to abort); decided handles carry the parts too.
    """

    serializer: ClassVar[str] = "s3.multipart"
    #: 2: ``schema``, the epoch's schema as the task wrote it (partition columns included),
    #: so the manifest can record it on any driver (:mod:`txsink.kit.evolving`).
    version: ClassVar[int] = 2

    bucket: str = ""
    marker: str = ""
    objects: tuple[S3Object, ...] = ()
    format: str = ""  # how the objects are encoded (the manifest says so, not today's options)
    compression: str | None = None
    partition_schema: tuple[tuple[str, str], ...] = ()  # (column, Arrow type) of partition_by
    schema: str = ""  # txsink.kit.evolving.encode_schema; "" in a version-1 handle

    @override
    def encode(self) -> dict[str, Any]:
        data = super().encode()
        data["objects"] = [o.to_json() for o in self.objects]
        data["partition_schema"] = [[c, t] for c, t in self.partition_schema]
        return data

    @classmethod
    @override
    def decode(cls, version: int, data: dict[str, Any]) -> S3Handle:
        fields = dict(data)
        fields["objects"] = tuple(S3Object.from_json(o) for o in fields.get("objects", ()))
        fields["partition_schema"] = tuple(
            (str(c), str(t)) for c, t in fields.get("partition_schema", ())
        )
        if version == 1:  # decided by an older txsink: no schema
            return super().decode(cls.version, fields)
        return super().decode(version, fields)
