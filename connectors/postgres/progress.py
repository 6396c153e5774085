"""The progress table: which txsink transactions committed, recorded inside each of them.

``COMMIT PREPARED`` of a gid the server does not know fails the same way whether the
transaction committed before (a driver crashed after committing it) or was rolled back
(by hand, by another tool). A row written inside the transaction tells the two apart: it
is visible exactly when the transaction committed. One row per transaction::

    app_id, uid, gid (primary key), epoch, partition, rows, prepared_at

The table sits in the target's schema (default name ``txsink_progress``). It is created
at start when missing; a role without CREATE on the schema can use one created
beforehand with the DDL below. Rows older than :data:`KEEP_EPOCHS` epochs are deleted:
they only need to outlive the recovery of the latest epochs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigurationError
from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg

    from txsink.connectors.postgres.tables import Tables

__all__ = [
    "DDL",
    "KEEP_EPOCHS",
    "ensure_progress_table",
    "prune_progress",
    "record_progress",
    "recorded_epoch",
    "relabel_progress",
    "was_committed",
]

#: The progress table's columns (``{}`` is its quoted name); docs/connectors/postgres.md
#: gives it to operators who create the table beforehand.
DDL = (
    "CREATE TABLE IF NOT EXISTS {} (app_id text NOT NULL, uid text NOT NULL, "
    "gid text PRIMARY KEY, epoch bigint NOT NULL, partition integer NOT NULL, "
    "rows bigint NOT NULL, prepared_at timestamptz NOT NULL DEFAULT now())"
)
#: How many epochs back the progress rows of a sink are kept.
KEEP_EPOCHS = 1000


def ensure_progress_table(
    conn: psycopg.Connection[Any], tables: Tables, ctx: dict[str, Any]
) -> None:
    """At start: create the progress table if missing, and check the role may use it.

    Raises :class:`~txsink.errors.ConfigurationError` (with ``ctx``) naming the grant.
    """
    from psycopg import sql

    # Look first: PostgreSQL checks the CREATE privilege even for IF NOT EXISTS,
    # so a role without it must be able to use a table created beforehand.
    found = conn.execute("SELECT to_regclass(%s)", (tables.regclass(tables.progress),)).fetchone()
    if found is None or found[0] is None:
        conn.execute(sql.SQL(DDL).format(tables.progress_ident))
    for privilege in ("INSERT", "SELECT", "DELETE"):
        ok = conn.execute(
            "SELECT has_table_privilege(%s, %s)", (tables.regclass(tables.progress), privilege)
        ).fetchone()[0]  # type: ignore[index]
        if not ok:
            raise ConfigurationError(
                f"the connecting role lacks {privilege} on the progress table "
                f"{tables.schema}.{tables.progress}: GRANT INSERT, SELECT, DELETE ON it",
                **ctx,
            )


def record_progress(
    conn: psycopg.Connection[Any], tables: Tables, txn: TxnId, rows: int, *, sink_uid: str
) -> None:
    """Record ``txn`` inside itself (on its own connection, before PREPARE TRANSACTION)."""
    import psycopg
    from psycopg import sql

    try:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (app_id, uid, gid, epoch, partition, rows) "
                "VALUES (%s, %s, %s, %s, %s, %s)"
            ).format(tables.progress_ident),
            (txn.app, txn.uid, str(txn), txn.epoch, txn.partition, rows),
        )
    except psycopg.errors.UniqueViolation as err:
        # Not a bad row: the same transaction name committed before, so this
        # target has history the txsink log does not know about.
        raise ConfigurationError(
            f"{tables.schema}.{tables.progress} already records a committed transaction named "
            f"{txn}: this table was written by an earlier pipeline with the same app id and "
            "sink uid, whose txsink log is not this one (a new log with an old app_id?). "
            "Keep the old txsink log, or use a new sink uid",
            sink_uid=sink_uid,
            epoch=txn.epoch,
            partition=txn.partition,
            connector="postgres",
            phase="prepare",
        ) from err


def was_committed(conn: psycopg.Connection[Any], tables: Tables, gid: str) -> bool:
    """Whether the transaction ``gid`` committed (its progress row is visible)."""
    from psycopg import sql

    row = conn.execute(
        sql.SQL("SELECT 1 FROM {} WHERE gid = %s").format(tables.progress_ident), (gid,)
    ).fetchone()
    return row is not None


def recorded_epoch(
    conn: psycopg.Connection[Any], tables: Tables, app_id: str, uid: str
) -> int | None:
    """The newest epoch of ``app_id``/``uid`` with a progress row (a committed one)."""
    from psycopg import sql

    row = conn.execute(
        sql.SQL("SELECT max(epoch) FROM {} WHERE app_id = %s AND uid = %s").format(
            tables.progress_ident
        ),
        (app_id, uid),
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def prune_progress(
    conn: psycopg.Connection[Any], tables: Tables, app_id: str, uid: str, epoch: int
) -> None:
    """Delete the rows of ``app_id``/``uid`` more than :data:`KEEP_EPOCHS` before ``epoch``."""
    from psycopg import sql

    conn.execute(
        sql.SQL("DELETE FROM {} WHERE app_id = %s AND uid = %s AND epoch < %s").format(
            tables.progress_ident
        ),
        (app_id, uid, epoch - KEEP_EPOCHS),
    )


def relabel_progress(
    conn: psycopg.Connection[Any],
    tables: Tables,
    *,
    app_id: str,
    old: str,
    new: str,
    dry_run: bool,
) -> int | None:
    """Move the rows of ``app_id`` from uid ``old`` to ``new``; how many (with ``dry_run``,
    how many would move). None when there is no progress table."""
    from psycopg import sql

    table = tables.progress_ident
    found = conn.execute("SELECT to_regclass(%s)", (table.as_string(conn),)).fetchone()
    if found is None or found[0] is None:
        return None
    if dry_run:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE app_id = %s AND uid = %s").format(table),
            (app_id, old),
        ).fetchone()
        return int(row[0]) if row else 0
    return conn.execute(
        sql.SQL("UPDATE {} SET uid = %s WHERE app_id = %s AND uid = %s").format(table),
        (new, app_id, old),
    ).rowcount
