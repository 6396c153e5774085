"""Schema evolution, the rules every target shares: what changed between a target's schema
and an epoch's, whether it is a change a target can take in one commit, and how a change
is written into the log.

The core plans a change once per sink, on the driver, before the epoch's pre-commit
(:func:`txsink.spark.checks.plan_changes`): an epoch that needs one evolves every sink of
its coordinator in its decision, or none of them. A connector says which kinds it takes
(:meth:`~txsink.contract.SinkContract.evolution_support`) and applies the change inside
the commit that makes the epoch's rows visible (:attr:`EpochCommit.schema_change
<txsink.contract.EpochCommit.schema_change>`).

The kinds (Arrow types; a target maps them to its own):

- ``add``: a column the target lacks; added nullable, because rows already written have
  no value for it.
- ``add-field``: a field a struct column lacks; also nullable.
- ``widen-int``: a signed integer to a wider one (int8 < int16 < int32 < int64).
- ``widen-float``: float16 < float32 < float64.
- ``widen-decimal``: a decimal's precision up, its scale the same.

What is not a change: a column narrower than the target's (its values fit and are written
as the target's type), a column the epoch lacks (the sink decides, as without evolution),
two Arrow spellings of the same values (``string``/``large_string``, a timestamp's time
zone). What is refused whatever the policy: a type change without a promotion
(``int64`` to ``string``, a decimal's scale) - the epoch stops before anything is written,
naming the column, the sink and the fix.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import pyarrow as pa

from txsink.errors import ConfigurationError

__all__ = [
    "ADD",
    "ADD_FIELD",
    "KINDS",
    "POLICIES",
    "TARGET_TYPE",
    "WIDEN_DECIMAL",
    "WIDEN_FLOAT",
    "WIDEN_INT",
    "ColumnChange",
    "Difference",
    "Policy",
    "SchemaChange",
    "SchemaEvolutionError",
    "check_policy",
    "diff",
    "same_values",
    "schema_from_json",
    "schema_to_json",
]

Policy = Literal["strict", "add-columns"]
#: ``strict``: a changed schema stops the query (the default); ``add-columns``: new
#: nullable columns and fields, and the widenings a target supports, evolve every target.
POLICIES: Final = ("strict", "add-columns")

ADD: Final = "add"
ADD_FIELD: Final = "add-field"
WIDEN_INT: Final = "widen-int"
WIDEN_FLOAT: Final = "widen-float"
WIDEN_DECIMAL: Final = "widen-decimal"
KINDS: Final = (ADD, ADD_FIELD, WIDEN_INT, WIDEN_FLOAT, WIDEN_DECIMAL)

#: A field's metadata key for the target's own name of its type: what ``txsink status`` and
#: ``inspect`` show for a column whose Arrow type is ``null`` (a target type that takes
#: values of several Arrow types, e.g. a text column the sink casts numbers into, which the
#: comparison leaves to the sink's own check).
TARGET_TYPE: Final = "txsink.target_type"

_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())
_FLOATS = (pa.float16(), pa.float32(), pa.float64())


class SchemaEvolutionError(ConfigurationError):
    """An epoch's schema differs from a target's in a way this sink will not take: the
    policy is ``strict``, the target cannot take that kind of change in one commit, or
    the change has no promotion. Raised before anything of the epoch is written; the
    message names the column, the sink and the fix."""


def check_policy(value: object) -> Policy:
    """``value`` as a policy, or a :class:`ValueError` naming the choices."""
    if value not in POLICIES:
        raise ValueError(f"schema_evolution must be one of {list(POLICIES)}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class ColumnChange:
    """One column's (or struct field's) change. ``path``: the column, then the field
    names down to the changed one. ``old`` is ``None`` for an added column or field."""

    path: tuple[str, ...]
    kind: str
    old: pa.DataType | None
    new: pa.DataType

    @property
    def column(self) -> str:
        """The dotted name (``payload.note``)."""
        return ".".join(self.path)

    def describe(self) -> str:
        if self.old is None:
            return f"adds {self.column} ({self.new})"
        return f"widens {self.column} {self.old} -> {self.new}"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": list(self.path),
            "kind": self.kind,
            "old": None if self.old is None else str(self.old),
            "new": str(self.new),
        }


@dataclasses.dataclass(frozen=True)
class SchemaChange:
    """One sink's schema change in one epoch: its target's schema before (``old``) and
    after (``new``: the old columns with the widened types, then the added ones), and the
    column changes between them. Recorded in the epoch's decision; the connector applies
    it in the commit that makes the epoch visible, once."""

    sink: str
    old: pa.Schema
    new: pa.Schema
    columns: tuple[ColumnChange, ...]

    @property
    def kinds(self) -> frozenset[str]:
        return frozenset(c.kind for c in self.columns)

    def added(self) -> list[ColumnChange]:
        """The added top-level columns, in the new schema's order."""
        return [c for c in self.columns if c.kind == ADD]

    def describe(self) -> str:
        """One line: ``adds note (string); widens amount int32 -> int64``."""
        return "; ".join(c.describe() for c in self.columns)

    def to_json(self) -> dict[str, Any]:
        return {
            "old": schema_to_json(self.old),
            "new": schema_to_json(self.new),
            "columns": [c.to_json() for c in self.columns],
        }

    @classmethod
    def from_json(cls, sink: str, doc: Mapping[str, Any]) -> SchemaChange:
        old, new = schema_from_json(doc["old"]), schema_from_json(doc["new"])
        columns = tuple(_column_from_json(c, old, new) for c in doc["columns"])
        return cls(sink=sink, old=old, new=new, columns=columns)


def schema_to_json(schema: pa.Schema) -> dict[str, Any]:
    """A schema for a JSON record: exact (Arrow's IPC bytes) and readable (each column's
    type as text, for ``txsink inspect`` and a human reading the log)."""
    return {
        "arrow": base64.b64encode(schema.serialize().to_pybytes()).decode("ascii"),
        "columns": type_names(schema),
    }


def type_names(schema: pa.Schema) -> dict[str, str]:
    """Each column's type as text: the target's own name (:data:`TARGET_TYPE`) for a
    column whose Arrow type is ``null``."""
    return {f.name: _type_name(f) for f in schema}


def _type_name(field: pa.Field) -> str:
    meta = field.metadata or {}
    own = meta.get(TARGET_TYPE.encode())
    return own.decode() if pa.types.is_null(field.type) and own else str(field.type)


def schema_from_json(doc: Mapping[str, Any]) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(doc["arrow"])))


def _column_from_json(doc: Mapping[str, Any], old: pa.Schema, new: pa.Schema) -> ColumnChange:
    path = tuple(doc["path"])
    before = _type_at(old, path) if doc.get("old") is not None else None
    after = _type_at(new, path)
    if after is None:
        raise ValueError(f"the recorded change names {'.'.join(path)!r}, absent from its schema")
    return ColumnChange(path=path, kind=str(doc["kind"]), old=before, new=after)


def _type_at(schema: pa.Schema, path: Sequence[str]) -> pa.DataType | None:
    fields: Sequence[pa.Field] = list(schema)
    found: pa.DataType | None = None
    for name in path:
        match = [f for f in fields if f.name == name]
        if not match:
            return None
        found = match[0].type
        fields = list(found) if pa.types.is_struct(found) else []
    return found


# -- the difference ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Difference:
    """What :func:`diff` found: the changes, the merged schema, and the refusals (a
    column path and why it has no promotion)."""

    changes: tuple[ColumnChange, ...]
    merged: pa.Schema
    refusals: tuple[tuple[str, str], ...]


def diff(target: pa.Schema, incoming: pa.Schema) -> Difference:
    """Compare an epoch's schema (``incoming``) with a target's (``target``).

    ``merged`` is the target's schema after taking every change (widened types in place,
    added columns after the target's own, in the epoch's order).
    """
    changes: list[ColumnChange] = []
    refusals: list[tuple[str, str]] = []
    fields = {f.name: f for f in target}
    merged = [_merge(f, incoming.field(f.name), (f.name,), changes, refusals)
              if f.name in incoming.names else f for f in target]  # fmt: skip
    for field in incoming:
        if field.name not in fields:
            changes.append(ColumnChange((field.name,), ADD, None, field.type))
            merged.append(_nullable(field))
    return Difference(tuple(changes), pa.schema(merged, metadata=target.metadata),
                      tuple(refusals))  # fmt: skip


def _merge(
    have: pa.Field,
    want: pa.Field,
    path: tuple[str, ...],
    changes: list[ColumnChange],
    refusals: list[tuple[str, str]],
) -> pa.Field:
    old, new = have.type, want.type
    if same_values(old, new):
        return have
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        inner = {f.name: f for f in old}
        fields = [_merge(f, new.field(f.name), (*path, f.name), changes, refusals)
                  if new.get_field_index(f.name) >= 0 else f for f in old]  # fmt: skip
        for f in new:
            if f.name not in inner:
                changes.append(ColumnChange((*path, f.name), ADD_FIELD, None, f.type))
                fields.append(_nullable(f))
        return have.with_type(pa.struct(fields))
    kind, wider = _widening(old, new)
    if kind is None:
        refusals.append((".".join(path), f"{old} cannot be promoted to {new}"))
    elif kind and wider:
        changes.append(ColumnChange(path, kind, old, new))
        return have.with_type(new)
    return have  # narrower than the target's (its values fit), or the sink's to judge


def _widening(old: pa.DataType, new: pa.DataType) -> tuple[str | None, bool]:
    """(kind, whether ``new`` is wider) for two types of one family; (None, False) for a
    change without promotion; ("", False) for types the core has no rule for (the sink's
    own check decides, as before evolution existed)."""
    for kind, ladder in ((WIDEN_INT, _INTS), (WIDEN_FLOAT, _FLOATS)):
        if old in ladder and new in ladder:
            return kind, ladder.index(new) > ladder.index(old)
    if pa.types.is_decimal(old) and pa.types.is_decimal(new):
        if old.scale != new.scale:
            return None, False
        return WIDEN_DECIMAL, new.precision > old.precision
    fo, fn = _family(old), _family(new)
    if fo is not None and fn is not None and fo != fn:
        return None, False
    return "", False


def _family(t: pa.DataType) -> str | None:
    checks = (
        ("int", pa.types.is_signed_integer),
        ("float", pa.types.is_floating),
        ("decimal", pa.types.is_decimal),
        ("string", _is_text),
        ("binary", _is_bytes),
        ("bool", pa.types.is_boolean),
    )
    return next((name for name, test in checks if test(t)), None)


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _is_bytes(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t))


def same_values(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether two Arrow types hold the same values (``string``/``large_string``, a list
    and a large list of such, two time zones of one timestamp unit)."""
    if a == b:
        return True
    if (_is_text(a) and _is_text(b)) or (_is_bytes(a) and _is_bytes(b)):
        return True
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        return bool(a.unit == b.unit)
    lists = (pa.types.is_list, pa.types.is_large_list)
    if any(f(a) for f in lists) and any(f(b) for f in lists):
        return same_values(a.value_type, b.value_type)
    return False


def _nullable(field: pa.Field) -> pa.Field:
    if not pa.types.is_struct(field.type):
        return field.with_nullable(True)
    return field.with_nullable(True).with_type(pa.struct([_nullable(f) for f in field.type]))
