"""Exactly-once into a SQLite table.

SQLite has no ``PREPARE TRANSACTION``, so the two phases are built from what it has,
the way many databases without XA are used (Flink's JDBC sink does it with a staging
table too):

    begin    keep the task's rows in memory (Arrow batches)
    prepare  one SQLite transaction: a staging table named after the txsink transaction,
             filled with the rows, and a row in ``_txsink_prepared``: durable, and
             invisible to readers of the target table
    commit   one SQLite transaction: move the staged rows into the table, drop the stage,
             record the name in ``_txsink_committed``; "already committed" is that record,
             looked up, never assumed
    abort    drop the stage and its ``_txsink_prepared`` row
    recover  ``list_prepared`` reads ``_txsink_prepared``

Guarantee: exactly-once, for a database file that the driver and every executor open on
one machine (Spark's local mode): SQLite serialises the writers.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from typing_extensions import override

from txsink import Handle, TwoPhaseCommitSink, TxnId, register_handle
from txsink.errors import CommitError, ConfigurationError

__all__ = ["SqliteHandle", "SqliteSink"]

_TABLES = """
CREATE TABLE IF NOT EXISTS _txsink_prepared (name TEXT PRIMARY KEY, app TEXT, uid TEXT);
CREATE TABLE IF NOT EXISTS _txsink_committed (name TEXT PRIMARY KEY);
"""


@register_handle
@dataclass(frozen=True)
class SqliteHandle(Handle):
    """A prepared transaction: its rows wait in the staging table named by ``stage``."""

    serializer: ClassVar[str] = "sqlite.staged"
    version: ClassVar[int] = 1

    stage: str = ""


@dataclass
class _Open:
    txn: TxnId
    batches: list[pa.RecordBatch] = field(default_factory=list)


def _stage(txn: TxnId) -> str:
    # Deterministic from the transaction name: a retry or recovery finds the same table.
    return "_txsink_stage_" + hashlib.sha256(str(txn).encode()).hexdigest()[:24]


def _quote(name: str) -> str:
    """A quoted SQLite identifier (sqlite3 has no composition module: every identifier in
    the SQL below goes through here, every value is a bound parameter)."""
    return '"' + name.replace('"', '""') + '"'


class SqliteSink(TwoPhaseCommitSink[_Open, SqliteHandle]):
    """Exactly-once into ``table`` of the SQLite database at ``path`` (see the module doc)."""

    connector: ClassVar[str] = "sqlite"
    handle_type: ClassVar[type[Handle]] = SqliteHandle

    def __init__(self, path: str | os.PathLike[str], table: str, uid: str, **options: Any) -> None:
        super().__init__(uid, **options)
        self.path = os.path.abspath(os.fspath(path))
        self.table = table

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.execute("PRAGMA synchronous = FULL")  # a COMMIT is on disk when it returns
        return conn

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.executescript(_TABLES)
            columns = {row[1] for row in conn.execute(f"PRAGMA table_info({_quote(self.table)})")}
        if not columns:
            raise ConfigurationError(
                f"SQLite table {self.table!r} does not exist in {self.path}: create it first",
                sink_uid=self.uid,
                connector=self.connector,
            )
        missing = [name for name in schema.names if name not in columns]
        if missing:
            raise ConfigurationError(
                f"SQLite table {self.table!r} has no column(s) {missing}: add them, or select "
                "only the table's columns before the sink",
                sink_uid=self.uid,
                connector=self.connector,
                column=missing[0],
            )

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> _Open:
        return _Open(txn)

    @override
    def write(self, txn: _Open, batch: pa.RecordBatch) -> None:
        txn.batches.append(batch)

    @override
    def prepare(self, txn: _Open) -> SqliteHandle:
        table = pa.Table.from_batches(txn.batches)
        stage = _stage(txn.txn)
        names = ", ".join(_quote(n) for n in table.column_names)
        marks = ", ".join("?" for _ in table.column_names)
        with contextlib.closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"DROP TABLE IF EXISTS {_quote(stage)}")
            conn.execute(
                f"CREATE TABLE {_quote(stage)} AS SELECT {names} FROM {_quote(self.table)} WHERE 0"  # noqa: S608
            )
            conn.executemany(
                f"INSERT INTO {_quote(stage)} ({names}) VALUES ({marks})",  # noqa: S608
                zip(*(c.to_pylist() for c in table.columns), strict=True),
            )
            conn.execute(
                "INSERT OR REPLACE INTO _txsink_prepared VALUES (?, ?, ?)",
                (str(txn.txn), txn.txn.app, self.uid),
            )
            conn.execute("COMMIT")
        return SqliteHandle(txn=txn.txn, rows=table.num_rows, nbytes=table.nbytes, stage=stage)

    @override
    def commit(self, handle: SqliteHandle) -> None:
        name = str(handle.txn)
        with contextlib.closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute(
                    "SELECT 1 FROM _txsink_committed WHERE name = ?", (name,)
                ).fetchone():
                    conn.execute("ROLLBACK")
                    return  # committed before: the record says so
                staged = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                    (handle.stage,),
                ).fetchone()
                if not staged:
                    raise CommitError(
                        f"cannot commit {name}: its staging table {handle.stage} is gone and "
                        "it was never committed, so its rows are lost. Was it dropped by hand?",
                        sink_uid=self.uid,
                        epoch=handle.txn.epoch,
                        partition=handle.txn.partition,
                        connector=self.connector,
                        phase="commit",
                    )
                stage = _quote(handle.stage)
                cols = ", ".join(
                    _quote(row[1]) for row in conn.execute(f"PRAGMA table_info({stage})")
                )
                conn.execute(
                    f"INSERT INTO {_quote(self.table)} ({cols}) SELECT {cols} FROM {stage}"  # noqa: S608
                )
                conn.execute(f"DROP TABLE {_quote(handle.stage)}")
                conn.execute("DELETE FROM _txsink_prepared WHERE name = ?", (name,))
                conn.execute("INSERT INTO _txsink_committed VALUES (?)", (name,))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    @override
    def abort(self, handle: SqliteHandle) -> None:
        with contextlib.closing(self._connect()) as conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"DROP TABLE IF EXISTS {_quote(_stage(handle.txn))}")
            conn.execute("DELETE FROM _txsink_prepared WHERE name = ?", (str(handle.txn),))
            conn.execute("COMMIT")

    @override
    def list_prepared(self, app_id: str) -> Iterator[SqliteHandle]:
        with contextlib.closing(self._connect()) as conn:
            conn.executescript(_TABLES)
            names = conn.execute(
                "SELECT name FROM _txsink_prepared WHERE app = ? AND uid = ? ORDER BY name",
                (app_id, self.uid),
            ).fetchall()
        for (name,) in names:
            txn = TxnId.parse(name)
            yield SqliteHandle(txn=txn, stage=_stage(txn))
