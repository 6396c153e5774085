"""Files sinks with one contract broken each: the contract suite must catch every one.

They live in a module of their own because the contract suite pickles sinks into fresh
processes (as Spark does), which must import their class.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from typing_extensions import override

from txsink.connectors.files import FilesHandle, FilesSink
from txsink.connectors.files.sink import STAGING
from txsink.connectors.files.testing import FilesTesting
from txsink.contract import EpochCommit


class VisibleEarly(FilesSink):
    """Publishes at prepare (under a manifest of its own): readers see rows no decision
    named."""

    @override
    def prepare(self, txn: Any) -> FilesHandle:
        handle = super().prepare(txn)
        super().commit(handle)
        super().finish_epoch(10_000 + handle.txn.partition, [handle])
        return handle


class DuplicatingCommit(FilesSink):
    """Each commit publishes another copy: committing twice leaves duplicates behind."""

    @override
    def commit(self, handle: FilesHandle) -> None:
        for entry in handle.files:
            staged = Path(self.path, entry.staged)
            folder = Path(self.path, f"epoch={handle.txn.epoch}")
            folder.mkdir(exist_ok=True)
            source = staged if staged.exists() else Path(self.path, entry.final)
            if source.exists():
                copy = folder / f"{self.uid}-copy{len(os.listdir(folder))}.parquet"
                shutil.copy(source, copy)
        super().commit(handle)


class AssumesCommitted(FilesSink):
    """Treats a missing staged file as "already committed" without looking."""

    @override
    def commit(self, handle: FilesHandle) -> None:
        if all(not Path(self.path, e.staged).exists() for e in handle.files):
            return
        super().commit(handle)


class ListsNothing(FilesSink):
    """Recovery cannot find what crashed tasks prepared."""

    @override
    def list_prepared(self, app_id: str) -> Iterator[FilesHandle]:
        return iter(())


class AbortKeeps(FilesSink):
    """Abort does nothing: prepared leftovers stay forever."""

    @override
    def abort(self, handle: FilesHandle) -> None:
        return None


class Silent(FilesSink):
    """Commits, but never reports a committed unit (the crash points cannot fire)."""

    @override
    def commit_epoch(self, request: EpochCommit[FilesHandle]) -> None:
        for handle in request.handles:
            self.commit(handle)
        self.finish_epoch(request.epoch, request.handles)


class RecordsAnyApp(FilesSink):
    """Reports the newest manifest's epoch whatever app wrote it (a new app would be refused
    by a target it never wrote to)."""

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        names = sorted(Path(self.path, "_manifests").glob("*.json"))
        return int(names[-1].stem.rsplit("-", 1)[1]) if names else None


class MutantTesting(FilesTesting):
    """The files adapter, building one of the mutants instead of a FilesSink."""

    def __init__(self, sink_class: type[FilesSink]) -> None:
        self.sink_class = sink_class

    @override
    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> FilesSink:
        return self.sink_class(spec["path"], uid=spec.get("uid", "out"))


__all__ = [
    "STAGING",
    "AbortKeeps",
    "AssumesCommitted",
    "DuplicatingCommit",
    "ListsNothing",
    "MutantTesting",
    "RecordsAnyApp",
    "Silent",
    "VisibleEarly",
]
