"""The optional epoch column (``epoch_column=``): a ``bigint`` column of the target that
the sink fills with the epoch number of every row it writes, so the target itself says
which epoch each row came from (what ``txsink audit`` counts and reads back per epoch:
:mod:`~txsink.connectors.postgres.audit`).

How it is filled: the column is one more column of every task's binary COPY (its plan's
``how`` is ``"epoch"``: :class:`~txsink.connectors.postgres.copy.OpenTxn` adds the
constant to each batch), so every path takes it with the other columns: straight into the
table (``2pc`` append), into the transaction's stage and its ``INSERT ... ON CONFLICT``
(``2pc`` upsert: the epoch that last wrote a key), into the staging table and the move
(``staging``, both modes). The DataFrame must not carry it.

The check at start refuses a table without the column, or with another type, naming the
``ALTER TABLE`` that fixes it; ``create_table=True`` creates the table with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.connectors.postgres.casts import ColumnPlan
from txsink.errors import ConfigurationError

if TYPE_CHECKING:
    from txsink.connectors.postgres.tables import Tables

__all__ = ["EPOCH", "check_epoch_column", "epoch_option", "epoch_plans", "not_carried"]

#: The ``how`` of the epoch column's plan: the value is the transaction's epoch.
EPOCH = "epoch"
_TYPE = "bigint"


def epoch_option(column: str | None, key: Sequence[str]) -> str | None:
    """The ``epoch_column`` option, checked at construction (``None``: no column)."""
    if column is None:
        return None
    if not isinstance(column, str) or not column:
        raise ValueError(f"PostgresSink epoch_column must be a column name, got {column!r}")
    if column in key:
        raise ValueError(
            f"PostgresSink epoch_column {column!r} cannot be an upsert key column: the sink "
            "fills it with each row's epoch"
        )
    return column


def epoch_plans(column: str | None) -> list[ColumnPlan]:
    """The epoch column's COPY plan, to append to the DataFrame's (none without a column)."""
    if column is None:
        return []
    return [ColumnPlan(column, pa.int64(), _TYPE, EPOCH, pa.int64())]


def not_carried(schema: pa.Schema, column: str, table: str, ctx: dict[str, Any]) -> None:
    """At start, before the table is looked at: the DataFrame does not carry ``column``."""
    if column in schema.names:
        raise ConfigurationError(
            f"the DataFrame has a column {column!r}, which is the sink's epoch_column: the "
            f"sink fills it in {table} with each row's epoch. Drop it from the DataFrame "
            f"(df.drop({column!r})), or name another epoch_column",
            column=column,
            **ctx,
        )


def check_epoch_column(
    columns: dict[str, tuple[str, bool]], tables: Tables, column: str, ctx: dict[str, Any]
) -> None:
    """At start: the table has ``column`` as ``bigint`` (``columns``:
    :func:`~txsink.connectors.postgres.checks.table_columns`)."""
    from psycopg import sql

    table = tables.qualified
    name = sql.Identifier(column).as_string(None)
    found = columns.get(column)
    ident = tables.ident().as_string(None)
    if found is None:
        raise ConfigurationError(
            f"table {table} has no column {column!r} (the sink's epoch_column): add it "
            f"(ALTER TABLE {ident} ADD COLUMN {name} bigint; rows written before stay NULL), "
            "or pass create_table=True for a table that does not exist yet",
            column=column,
            **ctx,
        )
    if found[0] != _TYPE:
        raise ConfigurationError(
            f"column {column!r} of {table} (the sink's epoch_column) is {found[0]}, not "
            f"bigint: change it (ALTER TABLE {ident} ALTER COLUMN {name} TYPE bigint), or "
            "name another epoch_column",
            column=column,
            **ctx,
        )
