"""The files connector's testing adapter: a verifier, an observer view, the pipeline factory.

Registered in :mod:`txsink.connectors.files.plugin`; the chaos toolkit, the soak, the
contract suite and the integration matrices reach it through the registry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from txsink.connectors.files.readers import read_committed, read_manifests
from txsink.connectors.files.sink import MANIFESTS, STAGING, FilesSink
from txsink.testing.adapter import ConnectorTesting
from txsink.testing.observer import Snapshot, Target, by_epoch
from txsink.testing.verifiers import SinkVerifier, Verdict, verify

__all__ = ["ADAPTER", "FilesManifestTarget", "FilesTesting", "FilesVerifier", "verify_files"]


@dataclass
class FilesVerifier:
    """A :class:`~txsink.connectors.files.FilesSink` folder, read through its manifests.

    ``lingering`` counts staged transactions left in ``_txsink/staging`` plus published
    data files that no manifest names (a reader listing the folder would see them).
    """

    path: str | os.PathLike[str]
    expected: Iterable[int]
    uid: str | None = None
    id_column: str = "id"

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        table = read_committed(self.path, self.uid)
        if self.id_column not in table.column_names:
            return []
        return [int(v) for v in table.column(self.id_column).to_pylist()]

    def epochs(self) -> int:
        return len(read_manifests(self.path, self.uid))

    def lingering(self) -> int:
        root = Path(self.path)
        staging = root / STAGING
        staged = [
            name
            for name in (os.listdir(staging) if staging.is_dir() else [])
            if self.uid is None or f".{self.uid}." in name
        ]
        named = {f["path"] for doc in read_manifests(root, self.uid) for f in doc["files"]}
        orphans = 0
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            if rel_dir.parts and rel_dir.parts[0] in (MANIFESTS, STAGING.split("/")[0]):
                dirnames.clear()
                continue
            for name in filenames:
                if self.uid is not None and not name.startswith(f"{self.uid}-"):
                    continue
                if not rel_dir.parts or name.startswith("."):
                    continue
                if str(rel_dir / name) not in named:
                    orphans += 1
        return len(staged) + orphans


def verify_files(
    path: str | os.PathLike[str],
    expected_ids: Iterable[int],
    *,
    id_column: str = "id",
    uid: str | None = None,
) -> Verdict:
    """The verdict for a files sink's folder: whole committed epochs, and leftovers."""
    return verify(FilesVerifier(path, expected_ids, uid=uid, id_column=id_column))


class FilesManifestTarget:
    """What a reader following the manifests sees, for the cross-system observer."""

    guaranteed = True
    counts_rows = True

    def __init__(
        self, path: str | os.PathLike[str], *, uid: str | None = None, name: str = "files"
    ) -> None:
        self.path, self.uid, self.name = path, uid, name

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        table = read_committed(self.path, self.uid)
        ids = table.column("id").to_pylist() if "id" in table.column_names else []
        return by_epoch((int(i) for i in ids), epoch_of)

    def close(self) -> None:
        """Nothing to release."""


class FilesTesting(ConnectorTesting):
    """Files need no server: a folder under the run's working directory."""

    name: ClassVar[str] = "files"
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {"parquet": {"format": "parquet"}}

    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        return {
            "kind": self.name,
            "path": str(Path(workdir, f"out-{tag}")),
            "uid": options.get("uid", "files"),
            "format": options.get("format", "parquet"),
        }

    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> FilesSink:
        return FilesSink(
            spec["path"], uid=spec.get("uid", "out"), format=spec.get("format", "parquet")
        )

    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        return FilesVerifier(spec["path"], expected, uid=spec.get("uid", "out"))

    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        return [FilesManifestTarget(spec["path"], uid=spec.get("uid", "out"))]


ADAPTER = FilesTesting()
