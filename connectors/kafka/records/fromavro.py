"""Avro schemas back to Arrow, and the shape a derived Avro schema is built from.

Why the inverse: the schema-evolution hooks compare an epoch's columns with the subject's
latest registered version (:mod:`~txsink.connectors.kafka.evolve`), and the core compares
Arrow schemas. :func:`arrow_type` reads back what
:func:`~txsink.connectors.kafka.records.avro.avro_schema` writes (records, ``int``/``long``,
``float``/``double``, ``boolean``, ``string``, ``bytes``, the ``date``, ``timestamp-*`` and
``decimal`` logical types, arrays, maps, and ``["null", T]`` unions as nullable ``T``), so
that deriving a schema from the Arrow it gives derives the same schema again. Anything else
(enums, fixed, unions of two types, named references) is a schema txsink did not derive:
:class:`Unsupported`, and the sink compares nothing (as before evolution existed).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from txsink.schema import same_values

__all__ = ["Unsupported", "arrow_type", "planned", "record_fields", "same_shape"]

_PRIMITIVES = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "bytes": pa.binary(),
}
_TIMESTAMPS = {
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "local-timestamp-millis": pa.timestamp("ms"),
    "local-timestamp-micros": pa.timestamp("us"),
}
_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_FLOATS = (pa.float16(), pa.float32(), pa.float64())


class Unsupported(ValueError):
    """An Avro construct txsink does not derive (so it does not compare it either)."""


def record_fields(text: str) -> pa.Schema | None:
    """The fields of the Avro record ``text`` as an Arrow schema (a field is nullable when
    its type is a union with ``null``); None when ``text`` is not a record txsink could have
    derived."""
    try:
        doc = json.loads(text)
        if not (isinstance(doc, dict) and doc.get("type") == "record"):
            return None
        return pa.schema([_field(f) for f in doc["fields"]])
    except (Unsupported, ValueError, KeyError, TypeError):
        return None


def arrow_type(avro: Any) -> tuple[pa.DataType, bool]:
    """The Arrow type of the Avro type ``avro`` and whether it is nullable."""
    if isinstance(avro, list):
        rest = [t for t in avro if t != "null"]
        if len(rest) != 1 or len(rest) == len(avro):
            raise Unsupported(f'union {avro!r}: only ["null", T] is read back')
        return arrow_type(rest[0])[0], True
    if isinstance(avro, str):
        if avro not in _PRIMITIVES:
            raise Unsupported(f"type {avro!r}")
        return _PRIMITIVES[avro], False
    if not isinstance(avro, dict):
        raise Unsupported(f"type {avro!r}")
    kind, logical = avro.get("type"), avro.get("logicalType")
    if logical == "date" and kind == "int":
        return pa.date32(), False
    if logical in _TIMESTAMPS and kind == "long":
        return _TIMESTAMPS[logical], False
    if logical == "decimal" and kind == "bytes":
        precision, scale = int(avro["precision"]), int(avro.get("scale", 0))
        make = pa.decimal128 if precision <= 38 else pa.decimal256
        return make(precision, scale), False
    if kind == "array":
        item, nullable = arrow_type(avro["items"])
        return pa.list_(pa.field("item", item, nullable)), False
    if kind == "map":
        value, nullable = arrow_type(avro["values"])
        return pa.map_(pa.string(), pa.field("value", value, nullable)), False
    if kind == "record":
        return pa.struct([_field(f) for f in avro["fields"]]), False
    if isinstance(kind, str) and kind in _PRIMITIVES and logical is None:
        return _PRIMITIVES[kind], False
    raise Unsupported(f"type {avro!r}")


def _field(doc: dict[str, Any]) -> pa.Field:
    t, nullable = arrow_type(doc["type"])
    return pa.field(str(doc["name"]), t, nullable)


def planned(latest: pa.Schema | None, columns: pa.DataType) -> pa.DataType:
    """The Arrow type a derived Avro schema is built from, for records of ``columns``
    when the subject's latest version has the fields ``latest``.

    The latest version's fields come first, in its order; each keeps its type where the
    column holds the same values or narrower ones (an ``int`` column into a ``long``
    field), and takes the column's where it is wider or of another kind; a field the
    columns lack stays (its value null). New columns follow, in the columns' order.
    Why: an epoch whose columns the latest version already holds derives that version
    again, whatever the columns' order, so a replay of an epoch that evolved the schema
    (after the tasks registered the new version) writes the same bytes with the same id;
    and dropping a column never makes a version. Without a latest version (or for a
    type that is not a record): ``columns`` as they are.
    """
    if latest is None or not pa.types.is_struct(columns):
        return columns
    return pa.struct(_take(list(latest), list(columns)))


def _take(have: list[pa.Field], want: list[pa.Field]) -> list[pa.Field]:
    wanted = {f.name: f for f in want}
    out = [_one(f, wanted[f.name]) if f.name in wanted else f for f in have]
    names = {f.name for f in have}
    return out + [f for f in want if f.name not in names]


def _one(have: pa.Field, want: pa.Field) -> pa.Field:
    old, new = have.type, want.type
    if same_values(old, new):
        return have
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        return have.with_type(pa.struct(_take(list(old), list(new))))
    for ladder in (_INTS, _FLOATS):
        if old in ladder and new in ladder:
            return want if ladder.index(new) > ladder.index(old) else have
    if pa.types.is_decimal(old) and pa.types.is_decimal(new) and old.scale == new.scale:
        return want if new.precision > old.precision else have
    return want  # another kind: the column's own; the registry judges the version


def same_shape(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether records of ``a`` and ``b`` derive one Avro schema for sure: the same fields
    in the same order, each holding the same values (:func:`~txsink.schema.same_values`:
    a time zone or a string's width may differ)."""
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(
            same_shape(x.type, y.type) for x, y in zip(a, b, strict=True)
        )
    return same_values(a, b)
