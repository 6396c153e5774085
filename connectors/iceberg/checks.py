"""Stream schema vs table schema: what the sink refuses at start, and the casts it does.

Refused (each a :class:`~txsink.errors.ConfigurationError` naming the column and the fix):
a stream column the table lacks, a required table column the stream lacks, a type the
table's column cannot take, nullable data for a required column. Allowed and cast in
Arrow, as Iceberg's own type promotion allows: int8/16/32 -> int/long, float -> double,
string/binary of any offset width, timestamps of any unit (truncated to microseconds),
structs field by field (by name: a field the stream lacks is written as nulls), lists and
maps by their elements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from txsink.errors import ConfigurationError, WriteError
from txsink.rowref import RowNaming

if TYPE_CHECKING:
    from pyiceberg.schema import Schema

__all__ = ["check_schema", "conform", "target_arrow_schema"]


def target_arrow_schema(schema: Schema) -> pa.Schema:
    """The table's schema as Arrow (no field-id metadata)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(schema, include_field_ids=False)


def _allowed(source: pa.DataType, target: pa.DataType) -> bool:
    if source.equals(target) or pa.types.is_null(source):
        return True
    if pa.types.is_integer(source) and pa.types.is_integer(target):
        return bool(pa.types.is_signed_integer(source) and source.bit_width <= target.bit_width)
    if pa.types.is_floating(source) and pa.types.is_floating(target):
        return bool(source.bit_width <= target.bit_width)
    strings = (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
    binaries = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    for family in (strings, binaries):
        if any(f(source) for f in family) and any(f(target) for f in family):
            return True
    if pa.types.is_timestamp(source) and pa.types.is_timestamp(target):
        return (source.tz is None) == (target.tz is None)
    if pa.types.is_date(source) and pa.types.is_date(target):
        return True
    if pa.types.is_decimal(source) and pa.types.is_decimal(target):
        return bool(source.scale == target.scale and source.precision <= target.precision)
    if pa.types.is_struct(source) and pa.types.is_struct(target):
        # By name, as Arrow casts structs: a field the stream lacks is written as nulls.
        have = {f.name: f for f in source}
        return all(
            (f.name in have and _allowed(have[f.name].type, f.type))
            or (f.name not in have and f.nullable)
            for f in target
        ) and all(target.get_field_index(name) >= 0 for name in have)
    lists = (pa.types.is_list, pa.types.is_large_list)
    if any(f(source) for f in lists) and any(f(target) for f in lists):
        return _allowed(source.value_type, target.value_type)
    if pa.types.is_map(source) and pa.types.is_map(target):
        return _allowed(source.key_type, target.key_type) and _allowed(
            source.item_type, target.item_type
        )
    return False


def check_schema(
    stream: pa.Schema, table: pa.Schema, *, uid: str, connector: str, name: str
) -> None:
    """Raise :class:`ConfigurationError` for a stream the table cannot take (module doc)."""

    def refuse(message: str, column: str) -> ConfigurationError:
        return ConfigurationError(
            f"Iceberg table {name!r}: {message}", sink_uid=uid, connector=connector, column=column
        )

    for field in stream:
        if table.get_field_index(field.name) < 0:
            raise refuse(
                f"has no column {field.name!r} (its columns: {table.names}): add it to the "
                "table (ALTER TABLE ... ADD COLUMN, or update_schema() in pyiceberg), or "
                "drop it from the stream before the sink",
                field.name,
            )
        target = table.field(field.name)
        if not _allowed(field.type, target.type):
            raise refuse(
                f"column {field.name!r} is {target.type} in the table but {field.type} in the "
                "stream, which Iceberg does not promote: cast it in the query, or evolve the "
                "table's column to a type that takes it",
                field.name,
            )
        if not target.nullable and field.nullable:
            raise refuse(
                f"column {field.name!r} is required (NOT NULL) in the table but nullable in "
                "the stream: filter out nulls and mark it non-nullable in the query (e.g. "
                "coalesce()), or make the table's column optional",
                field.name,
            )
    for target in table:
        if not target.nullable and stream.get_field_index(target.name) < 0:
            raise refuse(
                f"required column {target.name!r} is missing from the stream: add it to the "
                "query, or make the table's column optional",
                target.name,
            )


def conform(
    data: pa.Table,
    table: pa.Schema,
    *,
    uid: str,
    connector: str,
    naming: RowNaming | None = None,
    first_row: int = 0,
) -> pa.Table:
    """``data`` in the table's column order and types; absent optional columns as nulls.

    A value the table's type cannot hold is a WriteError naming its column and its row,
    as ``naming`` names rows (the table's identifier fields, else the first columns; the
    row's offset is ``first_row`` + its index in ``data``)."""
    columns = []
    for target in table:
        if data.schema.get_field_index(target.name) < 0:
            columns.append(pa.nulls(data.num_rows, target.type))
            continue
        column = data.column(target.name)
        # Timestamps truncate to the table's microseconds, as Iceberg writers do.
        safe = not pa.types.is_timestamp(target.type)
        try:
            columns.append(column.cast(target.type, safe=safe))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            row = None
            if naming is not None and isinstance(exc, pa.ArrowInvalid):  # a value, not a type
                at = _first_failing(column, target.type, safe)
                one = data.slice(at, 1).combine_chunks().to_batches()[0]
                row = naming.ref(one, 0, offset=first_row + at)
            raise WriteError(
                f"column {target.name!r} cannot be written as {target.type}: {type(exc).__name__}; "
                "cast or filter it in the query",
                sink_uid=uid,
                connector=connector,
                column=target.name,
                row=row,
                phase="prepare",
            ) from None
    return pa.Table.from_arrays(columns, schema=table)


def _first_failing(column: pa.ChunkedArray, to: pa.DataType, safe: bool) -> int:
    """The index of the first value of ``column`` the cast to ``to`` refuses (the whole
    column's cast failed), found by halving: an error path, O(n log n) at worst."""
    lo, hi = 0, len(column)  # the first refused value lies in [lo, hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            column.slice(lo, mid - lo).cast(to, safe=safe)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            hi = mid
        else:
            lo = mid
    return lo
