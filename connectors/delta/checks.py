"""At start: the table is there (or made, when asked), reachable, writable by delta-rs, and
the DataFrame's columns fit it. Each refusal names the sink, the column and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.connectors.delta.errors import describe, is_not_found
from txsink.connectors.delta.storage import Storage
from txsink.errors import ConfigurationError, UnreachableError

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["check_schema", "open_or_create", "table_schema"]


def table_schema(table: DeltaTable) -> pa.Schema:
    """The table's schema as Arrow (delta-rs hands an Arrow C-interface schema)."""
    return pa.schema(table.schema().to_arrow())


def open_or_create(
    storage: Storage,
    schema: pa.Schema,
    *,
    create: bool,
    partition_by: Sequence[str],
    ctx: Mapping[str, Any],
) -> DeltaTable:
    """The table at ``storage``; with ``create``, made from ``schema`` if there is none."""
    from deltalake import DeltaTable

    try:
        return DeltaTable(storage.uri, storage_options=storage.delta_options())
    except Exception as err:
        if not is_not_found(err):
            # The storage down or a wrong URI or credentials (deltalake does not tell them
            # apart by type): refused now, and a restart may pass it.
            raise UnreachableError(
                f"cannot read the Delta table at {storage.uri}: {describe(err)}. Check the "
                "URI, that the storage is reachable and the credentials in storage_options",
                **ctx,
            ) from None
    if not create:
        raise ConfigurationError(
            f"there is no Delta table at {storage.uri}: create it first (e.g. "
            "deltalake.DeltaTable.create), or pass create_table=True to let the sink create "
            "it from the DataFrame's schema",
            **ctx,
        )
    missing = [c for c in partition_by if c not in schema.names]
    if missing:
        raise ConfigurationError(
            f"partition_by column(s) {missing} are not in the DataFrame (columns: "
            f"{schema.names}): fix partition_by",
            column=missing[0],
            **ctx,
        )
    try:
        return DeltaTable.create(
            storage.uri,
            _plain(schema),
            mode="ignore",
            partition_by=list(partition_by) or None,
            storage_options=storage.delta_options(),
        )
    except Exception as err:
        raise ConfigurationError(
            f"cannot create the Delta table at {storage.uri}: {describe(err)}. Check that "
            "the location is writable (bucket, credentials) and the column types are ones "
            "Delta stores",
            **ctx,
        ) from None


def _plain(schema: pa.Schema) -> pa.Schema:
    """``schema`` without Spark's metadata and with large types narrowed, for a new table."""
    fields = [pa.field(f.name, _narrow(f.type), f.nullable) for f in schema]
    return pa.schema(fields)


def _narrow(typ: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(typ) or pa.types.is_string_view(typ):
        return pa.string()
    if pa.types.is_large_binary(typ):
        return pa.binary()
    if pa.types.is_timestamp(typ):
        return pa.timestamp("us", tz="UTC" if typ.tz else None)
    return typ


def _fits(given: pa.DataType, table: pa.DataType) -> bool:
    """Whether values of ``given`` cast to ``table`` without loss or change of meaning."""
    given = _narrow(given)
    if given == table:
        return True
    if pa.types.is_integer(given) and pa.types.is_integer(table):
        return bool(pa.types.is_signed_integer(table) and given.bit_width <= table.bit_width)
    if pa.types.is_floating(given) and pa.types.is_floating(table):
        return bool(given.bit_width <= table.bit_width)
    return False


def nullable_into_required(schema: pa.Schema, table: pa.Schema) -> list[str]:
    """The DataFrame's nullable columns that the table declares non-nullable: warned of at
    start, not refused (Spark marks most columns nullable even when they hold no null)."""
    required = {f.name for f in table if not f.nullable}
    return [f.name for f in schema if f.nullable and f.name in required]


def check_schema(schema: pa.Schema, table: pa.Schema, ctx: Mapping[str, Any]) -> None:
    """The DataFrame's columns against the table's: none extra, none missing, types fit.

    Nulls in a non-nullable column are refused row by row when written (Spark marks most
    columns nullable even when they hold no null).
    """
    extra = [n for n in schema.names if n not in table.names]
    if extra:
        raise ConfigurationError(
            f"column {extra[0]!r} is not in the Delta table (its columns: {table.names}): "
            "drop it before the sink, add it to the table first (ALTER TABLE ... ADD "
            "COLUMNS), or pass schema_evolution='add-columns' to the sink to add it in the "
            "epoch's commit",
            column=extra[0],
            **ctx,
        )
    for f in table:
        if f.name not in schema.names:
            how = "it is NOT NULL" if not f.nullable else "txsink writes every column"
            raise ConfigurationError(
                f"the Delta table's column {f.name!r} ({f.type}) is missing from the "
                f"DataFrame and {how}: add it before the sink (e.g. "
                f"lit(None).cast(...).alias({f.name!r}), or a value)",
                column=f.name,
                **ctx,
            )
        given = schema.field(f.name).type
        if not _fits(given, f.type):
            raise ConfigurationError(
                f"column {f.name!r} is {given} in the DataFrame but {f.type} in the Delta "
                "table, and does not convert without loss: cast it to the table's type "
                "before the sink",
                column=f.name,
                **ctx,
            )
