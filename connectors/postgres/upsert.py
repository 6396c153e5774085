"""Upsert: COPY into a stage table, then merge it into the target at prepare.

``ON CONFLICT`` cannot take COPY's rows directly, and one statement may not touch a
row twice, so each transaction::

    begin    CREATE UNLOGGED TABLE stage AS SELECT <columns> FROM target WITH NO DATA,
             plus an identity column numbering the rows in arrival order
    write    COPY into the stage
    prepare  INSERT INTO target SELECT DISTINCT ON (key) ... ORDER BY key, order DESC
             ON CONFLICT (key) DO UPDATE SET <other columns>   (the last row of a key wins)
             DROP TABLE stage

The stage is created and dropped inside the transaction, so nothing of it is seen or
left behind: a transaction that never prepares takes its stage with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from txsink.connectors.postgres.tables import Tables

__all__ = ["ORD", "add_order_column", "create_stage", "merge_stage", "upsert_rows"]

#: The arrival-order column of a stage (and of the staging commit's staging table): a name
#: kept out of users' way, like the stage's own.
ORD = "__txsink_ord"


def create_stage(
    conn: psycopg.Connection[Any], tables: Tables, txn: TxnId, columns: Sequence[str]
) -> sql.Identifier:
    """Create ``txn``'s stage table with ``columns`` of the target and the order column;
    returns its identifier (what the COPY feeds)."""
    from psycopg import sql

    stage = tables.stage(txn)
    conn.execute(
        sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            stage, sql.SQL(", ").join(sql.Identifier(c) for c in columns), tables.ident()
        )
    )
    add_order_column(conn, stage)
    return stage


def add_order_column(conn: psycopg.Connection[Any], table: sql.Composable) -> None:
    """Add :data:`ORD` to ``table``: an identity column numbering the rows in arrival order,
    which :func:`upsert_rows` reads to let the last row of a key win."""
    from psycopg import sql

    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint GENERATED ALWAYS AS IDENTITY").format(
            table, sql.Identifier(ORD)
        )
    )


def merge_stage(
    conn: psycopg.Connection[Any],
    tables: Tables,
    txn: TxnId,
    columns: Sequence[str],
    key: Sequence[str],
) -> None:
    """Upsert the last row of each key of ``txn``'s stage into the target; drop the stage."""
    from psycopg import sql

    stage = tables.stage(txn)
    conn.execute(upsert_rows(tables.ident(), stage, columns, key))
    conn.execute(sql.SQL("DROP TABLE {}").format(stage))


def upsert_rows(
    target: sql.Composable,
    source: sql.Composable,
    columns: Sequence[str],
    key: Sequence[str],
) -> sql.Composed:
    """``INSERT INTO target`` the last arrived row of each ``key`` of ``source`` (the
    highest :data:`ORD` wins), ``ON CONFLICT (key) DO UPDATE`` the other ``columns`` (``DO
    NOTHING`` when the key is all of them). ``source`` is anything a ``FROM`` takes that
    has ``columns`` and :data:`ORD`: a stage table, or the staging commit's subquery or
    ``WITH`` name. Every name is quoted with :class:`psycopg.sql.Identifier`."""
    from psycopg import sql

    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    updates = [c for c in columns if c not in key]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(
                sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in updates
            )
        )
        if updates
        else sql.SQL("DO NOTHING")
    )
    return sql.SQL(
        "INSERT INTO {target} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {source} "
        "ORDER BY {keys}, {ord} DESC ON CONFLICT ({keys}) {action}"
    ).format(
        target=target,
        cols=cols,
        keys=keys,
        source=source,
        ord=sql.Identifier(ORD),
        action=action,
    )
