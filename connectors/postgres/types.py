"""Arrow (Spark) types and PostgreSQL column types: what ``create_table`` creates, what
the check at start accepts (how each goes over binary COPY: ``casts.py``).

The table is in docs/connectors/postgres.md ("Type mapping"); keep the two in step.
"""

from __future__ import annotations

import re

import pyarrow as pa

from txsink.errors import ConfigurationError

__all__ = ["arrow_to_pg_type", "compatible"]

_TYPMOD = re.compile(r"\(.*\)")


def arrow_to_pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type ``create_table`` uses for an Arrow (Spark) type."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t):
        return "smallint"
    if pa.types.is_int32(t):
        return "integer"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = t.value_type
        if pa.types.is_nested(inner):
            return "jsonb"
        return arrow_to_pg_type(inner) + "[]"
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "jsonb"
    raise ConfigurationError(f"no PostgreSQL type for Arrow type {t}")


# The column types (without type modifiers) that can take what arrow_to_pg_type names.
_COMPATIBLE: dict[str, set[str]] = {
    "boolean": {"boolean", "text"},
    "smallint": {"smallint", "integer", "bigint", "numeric", "real", "double precision", "text"},
    "integer": {"integer", "bigint", "numeric", "double precision", "text"},
    "bigint": {"bigint", "numeric", "text"},
    "real": {"real", "double precision", "numeric", "text"},
    "double precision": {"double precision", "numeric", "text"},
    "numeric": {"numeric", "text"},
    "text": {
        "text",
        "character varying",
        "character",
        "json",
        "jsonb",
        "uuid",
        "citext",
        "inet",
        "cidr",
        "xml",
        "name",
        "bpchar",
    },
    "bytea": {"bytea"},
    "date": {"date", "timestamp without time zone", "timestamp with time zone", "text"},
    "timestamp with time zone": {"timestamp with time zone", "timestamp without time zone", "text"},
    "timestamp without time zone": {
        "timestamp without time zone",
        "timestamp with time zone",
        "text",
    },
    "jsonb": {"jsonb", "json", "text"},
}


def compatible(arrow_type: pa.DataType, pg_type: str) -> bool:
    """Whether a column of ``pg_type`` (as ``format_type()`` spells it) takes values of
    ``arrow_type`` (binary COPY casts them: see ``casts.py``)."""
    want = arrow_to_pg_type(arrow_type)
    base_pg = _TYPMOD.sub("", pg_type).strip()
    if want.endswith("[]"):
        return base_pg.endswith("[]") or base_pg in ("jsonb", "json", "text")
    base_want = _TYPMOD.sub("", want).strip()
    if base_pg.endswith("[]"):
        return False
    return base_pg in _COMPATIBLE.get(base_want, {base_want})
