"""Which Arrow column goes into which PostgreSQL column over binary COPY, and how.

Binary COPY carries no type names for scalars: the server reads each value with its
column's own ``recv`` function, so every value must arrive in exactly the column's wire
form. At the check, each DataFrame column is planned against the table's column type
(:func:`plan_column`): an Arrow cast to the column's wire type (``smallint -> bigint``,
``date -> timestamptz``, ``int -> numeric``...), JSON text (nested values into
``jsonb`` / ``json`` / ``text``), or a parse on the client (text into ``uuid``, ``inet``,
``cidr``). A combination binary COPY cannot carry is refused there, before data flows,
with the reason and the fix (:class:`Unsendable`). The table is in
docs/connectors/postgres.md ("Type mapping"); keep the two in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from txsink.connectors.postgres.types import arrow_to_pg_type, compatible

__all__ = ["ColumnPlan", "Unsendable", "plan_column"]

_TYPMOD = re.compile(r"\((\d+)(?:,(\d+))?\)")

# The wire form of a column type, as the Arrow type pgpq encodes into it.
_WIRE: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "real": pa.float32(),
    "double precision": pa.float64(),
    "bytea": pa.binary(),
    "date": pa.date32(),
    "timestamp without time zone": pa.timestamp("us"),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
}
# Column types whose binary form is the text itself.
_TEXT = {"text", "character varying", "character", "bpchar", "citext", "xml", "name", "json"}
# Array element types pgpq labels with the column's own element type: array_recv checks
# the element type in the data, so e.g. text into varchar[] is refused by the server.
_ARRAY_ELEMENTS = {
    "boolean",
    "smallint",
    "integer",
    "bigint",
    "real",
    "double precision",
    "numeric",
    "text",
    "bytea",
    "date",
    "timestamp without time zone",
}
# float into numeric: decimal digits kept after the point (float64 has ~16 significant).
FLOAT_NUMERIC_SCALE = 16


class Unsendable(Exception):
    """A DataFrame column binary COPY cannot put into its table column: ``reason`` and
    ``fix`` (the check turns it into a ConfigurationError naming the column)."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(f"{reason}: {fix}")
        self.reason = reason
        self.fix = fix


@dataclass(frozen=True)
class ColumnPlan:
    """How the DataFrame column ``name`` (of Arrow type ``source``) reaches the table
    column of type ``target`` (as ``format_type()`` spells it).

    ``how``: ``cast`` (an Arrow cast to ``wire``, a no-op when equal), ``json`` (each
    value as JSON text), ``uuid`` / ``inet`` / ``cidr`` (text parsed on the client into
    the type's binary form, sent as bytes). ``jsonb``: the text is sent in jsonb's wire
    form (a version byte before it).
    """

    name: str
    source: pa.DataType
    target: str
    how: str
    wire: pa.DataType
    jsonb: bool = False


def base_type(pg_type: str) -> str:
    """``format_type()`` text without type modifiers or a schema: ``numeric(12,3)`` ->
    ``numeric``, ``timestamp(3) with time zone`` -> ``timestamp with time zone``."""
    base = _TYPMOD.sub("", pg_type).strip()
    if "." in base and not base.startswith('"'):
        base = base.rsplit(".", 1)[1]  # public.citext -> citext
    return base


def plan_column(name: str, source: pa.DataType, target: str) -> ColumnPlan:
    """The plan for DataFrame column ``name`` into a column of type ``target``; raises
    :class:`Unsendable` for a combination binary COPY cannot carry."""
    base = base_type(target)
    if pa.types.is_null(source):  # every value NULL: a NULL has no type on the wire
        return ColumnPlan(name, source, target, "cast", _null_wire(base))
    nested = pa.types.is_nested(source)
    if nested and base in ("jsonb", "json", "text"):
        return ColumnPlan(name, source, target, "json", pa.string(), jsonb=base == "jsonb")
    if not compatible(source, target):
        raise Unsendable(
            f"it is {target}, which cannot take the DataFrame's {source} "
            f"(maps to {arrow_to_pg_type(source)})",
            "cast the column in Spark or change the table",
        )
    if nested:
        return _plan_array(name, source, target, base)
    wire = _scalar_wire(source, target, base)
    how = base if base in ("uuid", "inet", "cidr") else "cast"
    return ColumnPlan(name, source, target, how, wire, jsonb=base == "jsonb")


def _scalar_wire(source: pa.DataType, target: str, base: str) -> pa.DataType:
    if base in _TEXT or base == "jsonb":
        return pa.string()
    if base in ("uuid", "inet", "cidr"):
        return pa.binary()
    if base == "numeric":
        if pa.types.is_decimal(source):
            return source  # the server rounds to the column's scale, as from text
        if pa.types.is_floating(source):
            return pa.decimal128(38, FLOAT_NUMERIC_SCALE)  # the server rounds to the scale
        return pa.decimal128(38, 0)
    return _WIRE[base]


def _plan_array(name: str, source: pa.DataType, target: str, base: str) -> ColumnPlan:
    element = base[:-2].strip()
    if element not in _ARRAY_ELEMENTS:
        raise Unsendable(
            f"it is {target}: binary COPY writes arrays with the element type of the "
            f"Arrow values, which {element}[] does not take",
            f"make the column one of {', '.join(sorted(e + '[]' for e in _ARRAY_ELEMENTS))}, "
            "or jsonb; or write the column as JSON (to_json in Spark) into a text column",
        )
    value_type = source.value_type
    if not compatible(value_type, element):
        raise Unsendable(
            f"it is {target}, whose elements cannot take the DataFrame's {value_type}",
            "cast the array's elements in Spark or change the table",
        )
    if element == "timestamp without time zone" and pa.types.is_timestamp(value_type):
        wire_element: pa.DataType = pa.timestamp("us", tz=value_type.tz)
    else:
        wire_element = _scalar_wire(value_type, element, element)
    return ColumnPlan(name, source, target, "cast", pa.list_(wire_element))


def _null_wire(base: str) -> pa.DataType:
    if base.endswith("[]"):
        element = _WIRE.get(base[:-2].strip(), pa.string())
        return pa.list_(element)
    return _WIRE.get(base, pa.string())
