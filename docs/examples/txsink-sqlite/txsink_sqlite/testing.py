"""The SQLite connector's testing adapter: what txsink's chaos toolkit, contract suite and
integration matrices need to drive it, registered in :mod:`txsink_sqlite.plugin`."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from txsink.testing.adapter import ConnectorTesting
from txsink.testing.observer import Snapshot, Target, by_epoch
from txsink.testing.verifiers import SinkVerifier
from txsink_sqlite.sink import SqliteSink

__all__ = ["ADAPTER", "SqliteTesting", "SqliteVerifier"]

DDL = "CREATE TABLE events (id INTEGER, key TEXT, amount REAL, payload TEXT)"


def _read_ids(path: str, table: str) -> list[int]:
    # Plain sqlite3, as any reader of the database would: not the sink's code.
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as conn:
        quoted = '"' + table.replace('"', '""') + '"'
        return [int(r[0]) for r in conn.execute(f"SELECT id FROM {quoted}")]  # noqa: S608


@dataclass
class SqliteVerifier:
    """The table's ids; lingering = prepared transactions and staging tables left over."""

    path: str
    table: str
    expected: Iterable[int]

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        return _read_ids(self.path, self.table)

    def lingering(self) -> int:
        with contextlib.closing(sqlite3.connect(self.path, timeout=60)) as conn:
            stages = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name LIKE '\\_txsink\\_stage\\_%' "
                "ESCAPE '\\'"
            ).fetchone()
            prepared = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE name = '_txsink_prepared'"
            ).fetchone()
            rows = (
                conn.execute("SELECT count(*) FROM _txsink_prepared").fetchone()
                if (prepared and prepared[0])
                else (0,)
            )
        return int(stages[0] if stages else 0) + int(rows[0] if rows else 0)


class SqliteTarget:
    """The table as a reader sees it, for the cross-system observer."""

    guaranteed = True
    counts_rows = True

    def __init__(self, path: str, table: str, name: str = "sqlite") -> None:
        self.path, self.table, self.name = path, table, name

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        return by_epoch(_read_ids(self.path, self.table), epoch_of)

    def close(self) -> None:
        """Nothing held open between samples."""


class SqliteTesting(ConnectorTesting):
    """A new database file per target, under the run's folder (no server)."""

    name: ClassVar[str] = "sqlite"
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {"table": {}}

    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        path = Path(workdir, f"{tag}.db")
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute(DDL)
            conn.commit()
        return {"kind": self.name, "path": str(path), "table": "events", "uid": "sqlite"}

    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> SqliteSink:
        return SqliteSink(spec["path"], spec["table"], uid=spec["uid"])

    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        return SqliteVerifier(spec["path"], spec["table"], expected)

    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        return [SqliteTarget(spec["path"], spec["table"])]


ADAPTER = SqliteTesting()
