"""The tables a Postgres sink names, and their SQL identifiers.

Three tables: the target, the progress table next to it (same schema), and, in
upsert mode, one stage table per transaction. Every name reaches SQL through
psycopg's :class:`~psycopg.sql.Identifier`, never through string formatting, so a
table or schema called ``"Order Lines"`` or ``a"b`` is quoted right.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import TYPE_CHECKING, Any

from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

__all__ = ["Tables", "primary_key", "split_table"]


def split_table(table: str) -> tuple[str | None, str]:
    """``"name"`` or ``"schema.name"`` as (schema or None, name)."""
    parts = table.split(".")
    if len(parts) == 1:
        return None, parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"table must be 'name' or 'schema.name', got {table!r}")


@dataclasses.dataclass(frozen=True)
class Tables:
    """The target ``table`` in ``schema`` (None: the connection's search path), and the
    ``progress`` table beside it."""

    schema: str | None
    table: str
    progress: str

    def resolved(self, schema: str) -> Tables:
        """The same tables with ``schema`` filled in (the server's ``current_schema()``)."""
        return self if self.schema is not None else dataclasses.replace(self, schema=schema)

    @property
    def qualified(self) -> str:
        """The target as the user wrote it, unquoted (for messages)."""
        return f"{self.schema}.{self.table}" if self.schema else self.table

    def ident(self, name: str | None = None) -> sql.Identifier:
        """The quoted identifier of the target, or of the table ``name`` in its schema."""
        from psycopg import sql

        name = self.table if name is None else name
        return sql.Identifier(self.schema, name) if self.schema else sql.Identifier(name)

    def regclass(self, name: str | None = None) -> str:
        """:meth:`ident` as text for ``to_regclass()`` / ``has_table_privilege()``."""
        return self.ident(name).as_string(None)

    def stage(self, txn: TxnId) -> sql.Identifier:
        """The upsert stage table of ``txn``: named from the transaction id, so a retried
        attempt never meets another attempt's stage, and short enough for NAMEDATALEN."""
        return self.ident("txsink_stage_" + hashlib.sha256(str(txn).encode()).hexdigest()[:24])

    @property
    def progress_ident(self) -> sql.Identifier:
        """The quoted identifier of the progress table."""
        return self.ident(self.progress)


def primary_key(conn: psycopg.Connection[Any], tables: Tables) -> tuple[str, ...]:
    """The columns of the table's primary key, in key order (empty: none, or no table)."""
    found = conn.execute(
        "SELECT a.attname FROM pg_index i "
        "JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY k.n",
        (tables.regclass(),),
    ).fetchall()
    return tuple(str(row[0]) for row in found)
