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

__all__ = ["create_stage", "merge_stage"]

# The stage's arrival-order column (a name kept out of users' way, like the stage's own).
_ORD = "__txsink_ord"


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
    conn.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint GENERATED ALWAYS AS IDENTITY").format(
            stage, sql.Identifier(_ORD)
        )
    )
    return stage


def merge_stage(
    conn: psycopg.Connection[Any],
    tables: Tables,
    txn: TxnId,
    columns: Sequence[str],
    key: Sequence[str],
) -> None:
    """Upsert the last row of each key of ``txn``'s stage into the target; drop the stage."""
    from psycopg import sql

    cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    keys = sql.SQL(", ").join(sql.Identifier(k) for k in key)
    updates = [c for c in columns if c not in key]
    action = (
        sql.SQL("DO UPDATE SET {}").format(
            sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                for c in updates
            )
        )
        if updates
        else sql.SQL("DO NOTHING")
    )
    stage = tables.stage(txn)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} "
            "ORDER BY {}, {} DESC ON CONFLICT ({}) {}"
        ).format(tables.ident(), cols, keys, cols, stage, keys, sql.Identifier(_ORD), keys, action)
    )
    conn.execute(sql.SQL("DROP TABLE {}").format(stage))
