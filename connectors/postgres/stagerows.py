"""The staging table's rows: list them by transaction name, delete one transaction's (an
abort), move a decided epoch's into the target (the commit), drop an empty staging table.

The protocol and the table's layout are in :mod:`~txsink.connectors.postgres.staging`;
the commit's outcomes in :mod:`~txsink.connectors.postgres.stagecommit`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from txsink.connectors.postgres.staging import GID, ORD, Staging, exists
from txsink.connectors.postgres.upsert import upsert_rows

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from txsink.connectors.postgres.tables import Tables

__all__ = ["drop_if_empty", "drop_staged", "move_staged", "staged_counts"]


def staged_counts(conn: psycopg.Connection[Any], staging: Staging, prefix: str) -> dict[str, int]:
    """The transaction names with rows in staging that start with ``prefix``, and how many
    rows each (none when there is no staging table)."""
    from psycopg import sql

    if not exists(conn, staging.regclass):
        return {}
    rows = conn.execute(
        sql.SQL(
            "SELECT {0}, count(*) FROM {1} WHERE starts_with({0}, %s) GROUP BY 1 ORDER BY 1"
        ).format(sql.Identifier(GID), staging.ident),
        (prefix,),
    ).fetchall()
    return {str(gid): int(n) for gid, n in rows}


def drop_if_empty(
    conn: psycopg.Connection[Any], staging: Staging, *, dry_run: bool = False
) -> str | None:
    """Drop ``staging`` if it exists and holds no row: ``"dropped"`` (``"would drop"``),
    ``"kept (it holds rows)"``, or None when there is no such table."""
    from psycopg import sql

    if not exists(conn, staging.regclass):
        return None
    held = conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(staging.ident))
    row = held.fetchone()
    if row is not None and row[0]:
        return "kept (it holds rows of transactions to recover or abort first)"
    if dry_run:
        return "would drop"
    conn.execute(sql.SQL("DROP TABLE {}").format(staging.ident))
    return "dropped"


def drop_staged(conn: psycopg.Connection[Any], staging: Staging, gid: str) -> int:
    """Delete the rows of ``gid`` from staging (an abort); how many there were."""
    from psycopg import sql

    if not exists(conn, staging.regclass):
        return 0
    return conn.execute(
        sql.SQL("DELETE FROM {} WHERE {} = %s").format(staging.ident, sql.Identifier(GID)),
        (gid,),
    ).rowcount


def move_staged(
    conn: psycopg.Connection[Any],
    tables: Tables,
    staging: Staging,
    gids: Sequence[str],
    *,
    columns: Sequence[str],
    key: Sequence[str],
) -> dict[str, int]:
    """In the caller's transaction: move the rows of ``gids`` from staging into the target
    (``key``: upsert on it, the last arrived row of a key wins); returns the rows moved per
    name.

    Two ways, the same result. When the transaction can take the staging table alone
    (``LOCK ... NOWAIT``: no task of a zombie or speculative attempt is writing into it),
    the rows are inserted and the table emptied with ``TRUNCATE``, or, when it holds
    other names' rows too, those of ``gids`` deleted. Otherwise one statement deletes them
    and feeds the insert (``DELETE ... RETURNING``). ``TRUNCATE`` leaves no dead rows and
    measured about twice as fast a commit as the ``DELETE`` (docs/connectors/postgres.md).
    """
    from psycopg import sql

    gid = sql.Identifier(GID)
    if _take_alone(conn, staging):
        found = conn.execute(
            sql.SQL("SELECT {0}, count(*) FROM {1} GROUP BY {0}").format(gid, staging.ident)
        ).fetchall()
        counts = {str(g): int(n) for g, n in found}
        alone = set(counts) <= set(gids)
        where = sql.SQL("") if alone else sql.SQL(" WHERE {} = ANY(%s)").format(gid)
        source = sql.SQL("(SELECT * FROM {}{}) AS moved").format(staging.ident, where)
        params = () if alone else (list(gids),)
        conn.execute(_insert(tables, source, columns, key), params)
        if alone:
            conn.execute(sql.SQL("TRUNCATE {}").format(staging.ident))
        else:
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE {} = ANY(%s)").format(staging.ident, gid),
                (list(gids),),
            )
        return {g: counts[g] for g in gids if g in counts}
    returning = sql.SQL(", ").join(
        [gid, *([sql.Identifier(ORD)] if key else []), *(sql.Identifier(c) for c in columns)]
    )
    # Data-modifying WITH queries run once and to completion whether or not they are
    # read: the DELETE feeds the INSERT and the count in one scan of staging.
    stmt = sql.SQL(
        "WITH moved AS (DELETE FROM {staging} WHERE {gid} = ANY(%s) RETURNING {returning}), "
        "ins AS ({insert}) SELECT {gid}, count(*) FROM moved GROUP BY {gid}"
    ).format(
        staging=staging.ident,
        gid=gid,
        returning=returning,
        insert=_insert(tables, sql.SQL("moved"), columns, key),
    )
    rows = conn.execute(stmt, (list(gids),)).fetchall()
    return {str(g): int(n) for g, n in rows}


def _take_alone(conn: psycopg.Connection[Any], staging: Staging) -> bool:
    """Lock the staging table against every other session, without waiting; False when
    another holds any lock on it (a task still writing) or the role may not truncate it."""
    import psycopg

    row = conn.execute("SELECT has_table_privilege(%s, 'TRUNCATE')", (staging.regclass,))
    allowed = row.fetchone()
    if not (allowed and allowed[0]):
        return False
    from psycopg import sql

    try:
        with conn.transaction():  # a savepoint: a refused lock leaves the commit going
            conn.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE NOWAIT").format(staging.ident)
            )
    except psycopg.errors.LockNotAvailable:
        return False
    return True


def _insert(
    tables: Tables, source: sql.Composable, columns: Sequence[str], key: Sequence[str]
) -> sql.Composed:
    """``INSERT INTO target`` the rows of ``source`` (append), or upsert the last arrived
    row of each key of them (``key``: the upsert sink's own statement, :func:`upsert_rows`)."""
    from psycopg import sql

    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    if not key:
        return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
            tables.ident(), cols, cols, source
        )
    return upsert_rows(tables.ident(), source, columns, key)
