"""The files sink's audit (``txsink audit``): its output folder read back, epoch by epoch.

What each level reads is :mod:`txsink.kit.manifest_audit`'s; here the filesystem's means:
a stat per listed file, the Parquet footer (``pyarrow.parquet.ParquetFile(...).metadata``),
``os.scandir`` of the audited epochs' folders and of the output's top level; deep, each
listed file read whole, its rows digested and its sha256 compared with the manifest's.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from txsink.audit import AuditRequest, TargetAudit
from txsink.connectors.files.handles import FilesHandle
from txsink.handles import Handle
from txsink.kit import formats, manifests
from txsink.kit.manifest_audit import Stored, audit_manifests

__all__ = ["FilesOutput", "audit"]


class FilesOutput:
    """A files sink's output folder, as :func:`~txsink.kit.manifest_audit.audit_manifests`
    reads it."""

    listing = "files"
    name_field = "path"

    def __init__(self, path: str, uid: str) -> None:
        self.path = path
        self.uid = uid

    def where(self, name: str) -> str:
        return str(Path(self.path, name))

    def manifest(self, epoch: int) -> dict[str, Any] | None:
        try:
            raw = Path(self.path, manifests.key(self.uid, epoch)).read_bytes()
        except FileNotFoundError:
            return None
        return dict(json.loads(raw))

    def decided(self, handle: Handle) -> list[str]:
        return [e.final for e in handle.files] if isinstance(handle, FilesHandle) else []

    def stat(self, name: str) -> Stored | None:
        try:
            return Stored(os.stat(Path(self.path, name)).st_size)
        except FileNotFoundError:
            return None

    def check(self, entry: Mapping[str, Any], stored: Stored) -> str | None:
        return None  # a file keeps no content tag: the sha256 is deep work

    def footer_rows(self, name: str, stored: Stored) -> int:
        with pq.ParquetFile(Path(self.path, name)) as file:
            return int(file.metadata.num_rows)

    def list_data(self, epochs: Sequence[int]) -> list[str]:
        names = []
        for folder in ["", *(f"epoch={e}" for e in epochs)]:
            try:
                with os.scandir(Path(self.path, folder)) as found:
                    names += [
                        f"{folder}/{d.name}" if folder else d.name
                        for d in found
                        if d.is_file(follow_symlinks=False)
                    ]
            except (FileNotFoundError, NotADirectoryError):
                continue
        return sorted(names)

    def read(self, doc: Mapping[str, Any], entry: Mapping[str, Any]) -> pa.Table:
        name = str(entry["path"])
        compression = "gzip" if name.endswith(".gz") else None
        return formats.read_table(Path(self.path, name).read_bytes(), doc["format"], compression)

    def verify(self, entry: Mapping[str, Any]) -> str | None:
        h, size = hashlib.sha256(), 0
        with open(Path(self.path, str(entry["path"])), "rb") as file:
            while chunk := file.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
        sha256 = h.hexdigest()
        if sha256 != entry.get("sha256"):
            return (
                f"data file {self.where(str(entry['path']))} ({size} bytes) has sha256 "
                f"{sha256[:16]}…, the manifest recorded {str(entry.get('sha256'))[:16]}…"
            )
        return None

    def notes(self) -> list[str]:
        return [
            "metadata: a file rewritten with the same size and row count is seen only by a "
            "deep audit (its sha256 and rows)",
        ]


def audit(path: str, uid: str, request: AuditRequest) -> TargetAudit:
    """The files sink's answer to ``request`` (see the module)."""
    return audit_manifests(request, FilesOutput(path, uid))
