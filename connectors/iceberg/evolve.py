"""Schema evolution in the epoch's own table commit (issue #41; the rules are
:mod:`txsink.schema`'s).

Iceberg evolves a schema in table metadata only, without rewriting a data file: a new
column gets a new field id and reads as null in the files written before it; ``int`` ->
``long``, ``float`` -> ``double`` and a decimal's precision up are promotions its readers
apply to old files. So every kind of change the core plans (``add``, ``add-field``,
``widen-int``, ``widen-float``, ``widen-decimal``) is a schema update staged in the same
table transaction as the epoch's data files and its committed-epoch property: one new
metadata version makes the columns and the rows visible together, or neither.

Field ids. Readers (pyiceberg, Spark's Iceberg runtime) resolve a data file's columns by
field id, so the tasks must write the new columns with the ids the commit will give them.
:func:`stage` is the one function that turns a change into pyiceberg's ``UpdateSchema``
calls, in the change's own order; ``UpdateSchema`` numbers new fields from the table's
``last-column-id`` in call order. On the driver, before the epoch, it is staged in a
transaction that is never committed (:func:`plan`): the schema it yields is the one the
tasks write. At the commit (and at recovery's commit, in another process) it is staged
again on the table as it is then: the same base gives the same ids, and
:func:`check_file_ids` verifies every data file's footer against the committed schema. If
another writer changed the schema in between (the ids moved on: Iceberg never reuses one),
the commit writes that file again with the committed ids
(:func:`~txsink.connectors.iceberg.writer.rewrite`) rather than show one column's values
under another.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.schema import ADD, ADD_FIELD, WIDEN_DECIMAL, WIDEN_FLOAT, WIDEN_INT, SchemaChange

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction
    from pyiceberg.types import IcebergType, NestedField

__all__ = ["SUPPORTED", "Planned", "Refused", "check_file_ids", "plan", "stage"]

#: What an Iceberg table takes in one commit, without rewriting a data file.
SUPPORTED = frozenset({ADD, ADD_FIELD, WIDEN_INT, WIDEN_FLOAT, WIDEN_DECIMAL})
#: The largest decimal precision Iceberg holds.
MAX_PRECISION = 38


class Refused(Exception):
    """A column change Iceberg will not take: ``column`` (dotted), why, and the fix."""

    def __init__(self, column: str, why: str, fix: str) -> None:
        super().__init__(f"{column}: {why}")
        self.column, self.why, self.fix = column, why, fix


@dataclass(frozen=True)
class Planned:
    """The table's schema after an epoch's change, planned on the driver for the epoch's
    tasks, and the table state it was planned on (its ids hold only there)."""

    base_schema_id: int
    base_last_column_id: int
    schema: Schema

    def applies_to(self, table: Table) -> bool:
        """Whether ``table`` is still where the plan started (nobody changed its schema)."""
        meta = table.metadata
        return (
            meta.current_schema_id == self.base_schema_id
            and meta.last_column_id == self.base_last_column_id
        )


def plan(table: Table, change: SchemaChange) -> Planned:
    """``change`` staged in a transaction on ``table`` that is never committed: the schema
    (with its field ids) the epoch's commit will give the table. Writes nothing; raises
    :class:`Refused` for a change Iceberg will not take."""
    staged = stage(table.transaction(), change)
    meta = table.metadata
    return Planned(meta.current_schema_id, meta.last_column_id, staged)


def stage(tx: Transaction, change: SchemaChange) -> Schema:
    """Stage the parts of ``change`` the transaction's table lacks into ``tx`` (nothing is
    committed here) and return the schema the table has once ``tx`` commits.

    Idempotent by content: a column already there with the planned type, a type already
    widened, is left as is (recovery stages a recorded change again on a table that may
    hold it). Raises :class:`Refused` for a column Iceberg will not take."""
    from pyiceberg.exceptions import ResolveError, ValidationError

    meta = tx.table_metadata
    schema = meta.schema()
    update = tx.update_schema()
    for col in change.columns:
        path, name = col.path, col.column
        existing = _find(schema, path)
        if col.kind in (ADD, ADD_FIELD):
            want = _iceberg_type(name, _type_at(change.new, path), meta.format_version)
            if existing is not None:
                if _same(existing.field_type, want):
                    continue  # applied before (a recovered commit), or by hand alike
                raise Refused(
                    name,
                    f"the table already has a column {name!r} of type {existing.field_type}",
                    "rename the stream's column, or drop or evolve the table's by hand with "
                    "the query stopped",
                )
            _check_case(schema, path)
            try:
                update.add_column(path, want, required=False)
            except (ValueError, ValidationError) as exc:
                raise Refused(name, str(exc), _ADD_FIX) from None
            continue
        if existing is None:
            raise Refused(
                name,
                "the table has no such column any more (changed by another writer)",
                "restart the query: its check compares the schemas again",
            )
        want = _iceberg_type(name, col.new, meta.format_version)
        if _same(existing.field_type, want):
            continue  # already this type (an int16 -> int32 is one Iceberg int)
        try:
            update.update_column(path, field_type=want)
        except (ValueError, ValidationError, ResolveError) as exc:
            raise Refused(
                name,
                f"Iceberg cannot promote {existing.field_type} to {want} ({exc})",
                "cast the column back to the table's type before the sink",
            ) from None
    update.commit()  # stages into tx: a transaction commits only by commit_transaction()
    return tx.table_metadata.schema()


_ADD_FIX = "rename the column in the query, or add it to the table by hand with the query stopped"


def _iceberg_type(column: str, arrow: pa.DataType | None, format_version: int) -> IcebergType:
    """The Iceberg type of an Arrow type, as the sink's ``create=True`` converts it."""
    from pyiceberg.catalog import Catalog

    if arrow is None:  # pragma: no cover - the core's change always holds its types
        raise Refused(column, "the recorded change has no type for it", "restart the query")
    if pa.types.is_decimal(arrow) and arrow.precision > MAX_PRECISION:
        raise Refused(
            column,
            f"Iceberg decimals hold at most {MAX_PRECISION} digits, not {arrow.precision}",
            f"cast the column to a decimal of at most {MAX_PRECISION} digits before the sink",
        )
    try:
        found = Catalog._convert_schema_if_needed(
            pa.schema([pa.field("c", arrow)]),
            format_version=format_version,  # type: ignore[arg-type]
        )
    except Exception as exc:  # pyiceberg's UnsupportedPyArrowTypeException, TypeError...
        raise Refused(
            column,
            f"{arrow} has no Iceberg type ({type(exc).__name__})",
            "cast the column to a type Iceberg holds before the sink",
        ) from None
    return found.fields[0].field_type


def _same(have: IcebergType, want: IcebergType) -> bool:
    """Equal types, field ids aside (``want`` is numbered -1 until it is added)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    a = schema_to_pyarrow(have, include_field_ids=False)
    b = schema_to_pyarrow(want, include_field_ids=False)
    return bool(a.equals(b))


def _find(schema: Schema, path: Sequence[str]) -> NestedField | None:
    """The field at ``path`` (column, then struct fields), exact names; None if absent."""
    from pyiceberg.types import StructType

    fields: Sequence[NestedField] = schema.fields
    found = None
    for name in path:
        found = next((f for f in fields if f.name == name), None)
        if found is None:
            return None
        kind = found.field_type
        fields = kind.fields if isinstance(kind, StructType) else ()
    return found


def _check_case(schema: Schema, path: Sequence[str]) -> None:
    """An added name that differs from a sibling's only by case: Spark resolves names
    case-insensitively, so its readers could not tell the two apart."""
    parent = _find(schema, path[:-1]) if len(path) > 1 else None
    siblings = schema.fields if parent is None else getattr(parent.field_type, "fields", ())
    name = path[-1]
    clash = next((f.name for f in siblings if f.name.lower() == name.lower()), None)
    if clash is not None:
        raise Refused(
            ".".join(path),
            f"its name differs from the table's column {clash!r} only by case, which Spark "
            "and other case-insensitive readers cannot tell apart",
            f"rename it in the query, or write it into {clash!r}",
        )


def _type_at(schema: pa.Schema, path: Sequence[str]) -> pa.DataType | None:
    fields: Sequence[pa.Field] = list(schema)
    found: pa.DataType | None = None
    for name in path:
        match = next((f for f in fields if f.name == name), None)
        if match is None:
            return None
        found = match.type
        fields = list(found) if pa.types.is_struct(found) else []
    return found


# -- the ids the data files carry ----------------------------------------------------------


def check_file_ids(schema: Schema, footer: Any) -> str | None:
    """The first column of a data file (its Parquet ``footer``) whose field id differs from
    the id ``schema`` gives that column, as ``"name: id N in the file, M in the table"``;
    None when they agree. Columns the schema lacks (dropped since) are not compared."""
    from pyiceberg.schema import sanitize_column_names

    table = dict(_table_ids(sanitize_column_names(schema).fields, ""))
    for name, fid in _file_ids(footer.schema.to_arrow_schema(), ""):
        want = table.get(name)
        if want is not None and want != fid:
            return f"{name}: id {fid} in the file, {want} in the table"
    return None


def _table_ids(fields: Sequence[NestedField], prefix: str) -> Iterator[tuple[str, int]]:
    from pyiceberg.types import StructType

    for f in fields:
        name = prefix + f.name
        yield name, f.field_id
        if isinstance(f.field_type, StructType):
            yield from _table_ids(f.field_type.fields, name + ".")


def _file_ids(fields: Any, prefix: str) -> Iterator[tuple[str, int]]:
    for f in fields:
        name = prefix + f.name
        raw = (f.metadata or {}).get(b"PARQUET:field_id")
        if raw is not None:
            yield name, int(raw)
        if pa.types.is_struct(f.type):
            yield from _file_ids(list(f.type), name + ".")
