"""The driver's side of the staging commit: commit a decided epoch's staged transactions in
one local transaction, abort one, list them (the protocol is in
:mod:`~txsink.connectors.postgres.staging`).

The commit's outcomes, each with its name (Flink's committer's discipline):

1. *committed now*: no progress row of the decided names exists; their rows are moved,
   each name's count matches its handle, the progress rows are written: one transaction;
2. *already committed*: every decided name has its progress row (a crash after the
   commit, a second recovery): nothing is done, verified by the rows the commit wrote;
3. *lost*: a name has no progress row and fewer (or more) staged rows than its handle
   says: someone deleted them (by hand, a tool) or a second writer used the name. The
   transaction is rolled back and a :class:`~txsink.errors.CommitError` names the
   transaction, its epoch and partition: the rows cannot be made visible;
4. *transient*: a lost connection, a lock timeout: the transaction rolls back, nothing is
   half done, and the commit is retried (by the next run's recovery at last).

A transaction-level advisory lock on the staging table serializes two drivers committing
the same sink (a zombie driver and its successor): the second waits, then finds outcome 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self

from txsink.connectors.postgres.evolve import apply_change
from txsink.connectors.postgres.stagerows import drop_staged, move_staged, staged_counts
from txsink.connectors.postgres.staging import Staging, exists, stamp
from txsink.errors import CommitError
from txsink.handles import Handle, register_handle
from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg

    from txsink.connectors.postgres.tables import Tables
    from txsink.schema import SchemaChange

__all__ = ["StageCommit", "StagedHandle"]


@register_handle
@dataclass(frozen=True)
class StagedHandle(Handle):
    """A task's rows committed into the staging table ``staging`` (``[schema, name]``)
    under the transaction name ``str(txn)``; ``rows`` of them, with the DataFrame's
    ``columns``, to move into the target by ``key`` (upsert) or appended (no key).

    Everything the commit needs is here: a new driver commits it from the log alone.
    """

    serializer: ClassVar[str] = "postgres.staged"
    version: ClassVar[int] = 1

    staging: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()
    key: tuple[str, ...] = ()

    @classmethod
    def decode(cls, version: int, data: dict[str, Any]) -> Self:
        handle = super().decode(version, data)
        # JSON gives lists back; the handle is frozen and compared, so tuples.
        return cls(
            txn=handle.txn,
            rows=handle.rows,
            nbytes=handle.nbytes,
            staging=tuple(handle.staging),
            columns=tuple(handle.columns),
            key=tuple(handle.key),
        )


@dataclass(frozen=True)
class StageCommit:
    """Commit, abort and list the staged transactions of the sink ``uid`` writing
    ``tables``' target through ``staging`` (the sink's current staging table: where
    :meth:`listed` looks; a handle names its own)."""

    tables: Tables
    staging: Staging
    uid: str
    key: tuple[str, ...] = ()

    def commit(
        self,
        conn: psycopg.Connection[Any],
        handles: Sequence[StagedHandle],
        change: SchemaChange | None = None,
    ) -> CommitError | None:
        """Outcomes 1-3 of the module's list, in one transaction on ``conn`` (autocommit);
        a lost transaction is returned (the transaction rolled back), not raised, so that
        the caller's error mapping does not take it for a server error.

        ``change``: the epoch's schema change, applied in the same transaction before the
        move (:mod:`~txsink.connectors.postgres.evolve`), so the new columns appear with
        the rows; not again when every name has its progress row (outcome 2: they
        committed together). An epoch without rows applies it alone (idempotent: ``IF
        NOT EXISTS``). The staging table's fingerprint then names the new definition, so
        the next start keeps it (and its rows of later epochs)."""
        groups: dict[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]], list[Any]] = {}
        for handle in handles:
            where = handle.staging or (self.staging.schema, self.staging.name)
            groups.setdefault((where, handle.columns, handle.key), []).append(handle)
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"txsink.commit|{self.tables.regclass()}|{self.uid}",),
                )
                done = self._committed(conn, [str(h.txn) for h in handles])
                if change is not None and (not handles or len(done) < len(handles)):
                    apply_change(conn, self.tables, change)
                for (where, columns, key), group in groups.items():
                    todo = [h for h in group if str(h.txn) not in done]
                    if not todo:
                        continue  # outcome 2
                    staging = Staging(where[0], where[1])
                    if not exists(conn, staging.regclass):
                        raise _Rollback(_lost(todo, {}, staging) or _gone(staging))
                    moved = move_staged(
                        conn,
                        self.tables,
                        staging,
                        [str(h.txn) for h in todo],
                        columns=columns,
                        key=key,
                    )
                    lost = _lost(todo, moved, staging)
                    if lost is not None:
                        raise _Rollback(lost)  # outcome 3: nothing of the epoch moves
                    self._record(conn, todo)
                    if change is not None:
                        stamp(conn, self.tables, staging, columns, "upsert" if key else "append")
        except _Rollback as rollback:
            return rollback.lost
        return None

    def _committed(self, conn: psycopg.Connection[Any], gids: Sequence[str]) -> set[str]:
        from psycopg import sql

        rows = conn.execute(
            sql.SQL("SELECT gid FROM {} WHERE gid = ANY(%s)").format(self.tables.progress_ident),
            (list(gids),),
        ).fetchall()
        return {str(r[0]) for r in rows}

    def _record(self, conn: psycopg.Connection[Any], handles: Sequence[StagedHandle]) -> None:
        from psycopg import sql

        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} (app_id, uid, gid, epoch, partition, rows) "
                    "VALUES (%s, %s, %s, %s, %s, %s)"
                ).format(self.tables.progress_ident),
                [
                    (h.txn.app, h.txn.uid, str(h.txn), h.txn.epoch, h.txn.partition, h.rows)
                    for h in handles
                ],
            )

    def abort(self, conn: psycopg.Connection[Any], handle: StagedHandle) -> None:
        """Delete the handle's staged rows (none left: aborted before; idempotent)."""
        where = handle.staging or (self.staging.schema, self.staging.name)
        drop_staged(conn, Staging(where[0], where[1]), str(handle.txn))

    def listed(self, conn: psycopg.Connection[Any], prefix: str) -> dict[str, int]:
        """The names staged under ``prefix`` and their row counts."""
        return staged_counts(conn, self.staging, prefix)


class _Rollback(Exception):
    """Leaves ``conn.transaction()`` with a rollback, carrying the lost transaction."""

    def __init__(self, lost: CommitError) -> None:
        super().__init__(str(lost))
        self.lost = lost


def _lost(
    handles: Sequence[StagedHandle], moved: dict[str, int], staging: Staging
) -> CommitError | None:
    for handle in handles:
        found = moved.get(str(handle.txn), 0)
        if found != handle.rows:
            txn: TxnId = handle.txn
            return CommitError(
                f"cannot commit {txn}: it has no progress row, so it did not commit before, "
                f"and the staging table {staging.qualified} holds {found} of its "
                f"{handle.rows} rows: they were deleted (by hand, or by another tool) or "
                "the staging table was dropped, and the epoch cannot be made visible as "
                "decided. Nothing of the epoch was committed, and the query cannot pass it: "
                "see 'holds 0 of its rows' in docs/connectors/postgres.md#troubleshooting",
                sink_uid=txn.uid,
                epoch=txn.epoch,
                partition=txn.partition,
                connector="postgres",
                phase="commit",
            )
    return None


def _gone(staging: Staging) -> CommitError:
    return CommitError(
        f"the staging table {staging.qualified} is gone: the decided epoch's rows cannot be "
        "moved into the target",
        connector="postgres",
        phase="commit",
    )
