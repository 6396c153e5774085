"""Schema evolution of a Delta table, in the epoch's own commit.

What the table takes (:data:`SUPPORTED`): new nullable columns (``add``) and new nullable
fields of a struct column (``add-field``). A Delta reader sees a new column as null in the
files written before it: no file is rewritten, and the protocol does not change. Type
widening (int -> long, float -> double, decimal precision up) needs the ``typeWidening``
table feature, a protocol upgrade that delta-rs 1.x cannot write in a commit with data:
those changes are refused before the epoch (the core names the column).

Why txsink writes this one log entry itself: ``DeltaTable.create_write_transaction`` (the
epoch's commit without a change) drops a new schema in an append without a word, and every
delta-rs call that does write a ``metaData`` action either rewrites the rows
(``write_deltalake(schema_mode="merge")``), commits apart from them (``alter.add_columns``)
or removes the table's files (``mode="overwrite"``). The entry holds ``commitInfo``, the
``metaData`` with the new ``schemaString`` (the table's own schema JSON, every existing
field as it was, the new fields appended), the epoch's ``add`` actions and the ``txn``
record: readers see the new schema exactly with the epoch's rows, and recovery finds both
or neither. It is created only if absent (a hard link locally, a conditional PUT on S3,
the same guards delta-rs uses), so a concurrent commit of that version wins and the epoch's
commit starts again from the log.

Before the epoch (:func:`plan`, no write): the table's protocol must be one txsink writes
correctly by hand (no column mapping, row tracking, in-commit timestamps, identity
columns...), the new names must not collide with the table's in another case (Delta names
are case-insensitive) nor hold a character Delta refuses without column mapping, and every
new type must map to a Delta type the table's protocol has.
"""

from __future__ import annotations

import copy
import json
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.connectors.delta.handles import DeltaHandle
from txsink.schema import ADD, ADD_FIELD, SchemaChange, SchemaEvolutionError

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from txsink.connectors.delta.storage import Storage

__all__ = [
    "SUPPORTED",
    "LogEntryExists",
    "commit_with_schema",
    "merged_json",
    "plan",
    "unwritable",
]

#: The kinds of :mod:`txsink.schema` a Delta table takes in one commit.
SUPPORTED = frozenset({ADD, ADD_FIELD})
#: Writer features a hand-written append with a new schema honours: none of them asks the
#: writer for more than ``add`` actions with the table's schema.
_SAFE_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "timestampNtz",
        "deletionVectors",
        "domainMetadata",
        "vacuumProtocolCheck",
        "typeWidening",
        "typeWidening-preview",
    }
)
#: The features a legacy writer version (below 7) implies, cumulatively.
_LEGACY = {
    2: ("appendOnly", "invariants"),
    3: ("checkConstraints",),
    4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",),
    6: ("identityColumns",),
}
#: Characters Delta refuses in a column name without column mapping.
_BAD_CHARS = " ,;{}()\n\t="
_FIX = (
    "Add the column to the table by hand with the query stopped (ALTER TABLE ... ADD "
    "COLUMNS), then start it again; or drop the column before the sink"
)


class LogEntryExists(Exception):
    """Another commit took the log version first: the epoch's commit starts again."""


def _refuse(column: str, message: str, ctx: Mapping[str, Any]) -> SchemaEvolutionError:
    return SchemaEvolutionError(message, column=column, **{**ctx, "phase": "check"})


def writer_features(table: DeltaTable) -> set[str]:
    """The writer features of the table's protocol, legacy versions spelled out."""
    protocol = table.protocol()
    if protocol.min_writer_version >= 7:
        return set(protocol.writer_features or ())
    found: set[str] = set()
    for version, features in _LEGACY.items():
        if protocol.min_writer_version >= version:
            found.update(features)
    return found


def unwritable(table: DeltaTable, change: SchemaChange, where: str) -> str | None:
    """Why txsink cannot write the log entry of ``change`` into ``table`` itself (None: it
    can): column mapping, or a writer feature whose commits need more than ``add`` actions.
    Asked before the epoch, and again at the commit (the table may have changed since)."""
    mode = table.metadata().configuration.get("delta.columnMapping.mode") or "none"
    if mode != "none":
        return (
            f"{where} uses column mapping (delta.columnMapping.mode={mode}): txsink does not "
            "assign the physical names and ids a new column needs there"
        )
    unsafe = sorted(writer_features(table) - _SAFE_FEATURES - {"columnMapping"})
    if unsafe:
        return (
            f"{where} has the writer feature(s) {unsafe}, which txsink does not honour in the "
            f"commit that adds a column ({change.describe()})"
        )
    return None


def plan(table: DeltaTable, change: SchemaChange, uri: str, ctx: Mapping[str, Any]) -> pa.Schema:
    """Check that ``table`` takes ``change`` in a commit with the epoch's rows, and return
    the table's schema after it (Arrow, as delta-rs will read it): the schema the epoch's
    data files are written in. Raises :class:`SchemaEvolutionError` naming the column and
    the fix. Reads only."""
    from deltalake import Schema

    first = change.columns[0].column
    where = f"the Delta table at {uri}"
    features = writer_features(table)
    blocked = unwritable(table, change, where)
    if blocked is not None:
        raise _refuse(first, f"{blocked}. {_FIX}", ctx)
    current = json.loads(table.schema().to_json())
    for col in change.columns:
        if col.kind not in SUPPORTED:
            raise _refuse(col.column, f"{where} cannot take this change: it {col.describe()}", ctx)
        name = col.path[-1]
        siblings = _fields_at(current, col.path[:-1])
        clash = [f["name"] for f in siblings if f["name"].lower() == name.lower()]
        if clash:
            raise _refuse(
                col.column,
                f"the epoch's column {col.column!r} differs from {where}'s {clash[0]!r} only "
                f"in case, and Delta column names are case-insensitive: rename it to "
                f"{clash[0]!r} before the sink (or alias it to a new name)",
                ctx,
            )
        bad = sorted({c for c in name if c in _BAD_CHARS})
        if bad:
            raise _refuse(
                col.column,
                f"the epoch's new column {col.column!r} holds {bad}, which Delta refuses in "
                "a column name without column mapping: rename it before the sink (e.g. "
                "withColumnRenamed)",
                ctx,
            )
        try:
            typ = json.loads(Schema.from_arrow(pa.schema([_field(change, col.path)])).to_json())
        except Exception as err:
            raise _refuse(
                col.column,
                f"the epoch's new column {col.column!r} is {col.new}, which has no Delta type "
                f"({type(err).__name__}): cast it to a type Delta stores before the sink",
                ctx,
            ) from None
        if "timestamp_ntz" in json.dumps(typ) and "timestampNtz" not in features:
            raise _refuse(
                col.column,
                f"the epoch's new column {col.column!r} is a timestamp without time zone "
                f"(Delta's timestamp_ntz), and {where} lacks the timestampNtz feature (a "
                "protocol upgrade txsink does not make): cast it to a timestamp with a "
                "time zone before the sink, or enable the feature by hand",
                ctx,
            )
    return pa.schema(Schema.from_json(json.dumps(merged_json(current, change))).to_arrow())


def _field(change: SchemaChange, path: Sequence[str]) -> pa.Field:
    """The field at ``path`` of the change's new schema (nullable, as added)."""
    found = change.new.field(path[0])
    for name in path[1:]:
        found = found.type.field(name)
    return pa.field(found.name, _narrow(found.type), True)


def _narrow(typ: pa.DataType) -> pa.DataType:
    """Arrow spellings Delta has one type for: large and view strings and binaries."""
    if pa.types.is_large_string(typ) or pa.types.is_string_view(typ):
        return pa.string()
    if pa.types.is_large_binary(typ) or pa.types.is_binary_view(typ):
        return pa.binary()
    if pa.types.is_struct(typ):
        return pa.struct([f.with_type(_narrow(f.type)) for f in typ])
    if pa.types.is_large_list(typ) or pa.types.is_list_view(typ):
        return pa.list_(typ.value_field.with_type(_narrow(typ.value_type)))
    if pa.types.is_list(typ):
        return pa.list_(typ.value_field.with_type(_narrow(typ.value_type)))
    return typ


def _fields_at(doc: Mapping[str, Any], path: Sequence[str]) -> list[dict[str, Any]]:
    """The fields list of the struct at ``path`` in a Delta schema JSON (the top level for
    an empty path); empty when there is none."""
    fields: list[dict[str, Any]] = doc["fields"]
    for name in path:
        match = [f for f in fields if f["name"] == name]
        typ = match[0]["type"] if match else None
        if not isinstance(typ, dict) or typ.get("type") != "struct":
            return []
        fields = typ["fields"]
    return fields


def merged_json(current: Mapping[str, Any], change: SchemaChange) -> dict[str, Any]:
    """The table's schema JSON ``current`` with the change's new columns and fields
    appended (each existing field kept as it is, with its metadata); a column or field the
    table already has is left alone, so applying a change twice is applying it once."""
    from deltalake import Schema

    doc = copy.deepcopy(dict(current))
    for col in change.columns:
        if not _is_struct_at(doc, col.path[:-1]):
            continue  # the struct is gone from the table: nothing to add the field to
        siblings = _fields_at(doc, col.path[:-1])
        if any(f["name"] == col.path[-1] for f in siblings):
            continue
        added = json.loads(Schema.from_arrow(pa.schema([_field(change, col.path)])).to_json())
        siblings.append(added["fields"][0])
    return doc


def _is_struct_at(doc: Mapping[str, Any], path: Sequence[str]) -> bool:
    fields: list[dict[str, Any]] = doc["fields"]
    for name in path:
        match = [f for f in fields if f["name"] == name]
        typ = match[0]["type"] if match else None
        if not isinstance(typ, dict) or typ.get("type") != "struct":
            return False
        fields = typ["fields"]
    return True


def commit_with_schema(
    table: DeltaTable,
    storage: Storage,
    schema: Mapping[str, Any],
    handles: Sequence[DeltaHandle],
    *,
    app_id: str,
    epoch: int,
    info: Mapping[str, Any],
) -> int:
    """Write the next version of the table's log: ``metaData`` (``schema``), the handles'
    ``add`` actions and the ``txn`` record, in one entry created only if absent. Returns the
    version; raises :class:`LogEntryExists` when another commit took it."""
    version = table.version() + 1
    meta = table.metadata()
    now = int(time.time() * 1000)
    partitions = list(meta.partition_columns)
    actions: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "WRITE",
                "operationParameters": {"mode": "Append", "partitionBy": json.dumps(partitions)},
                "readVersion": version - 1,
                "isBlindAppend": False,
                "engineInfo": "txsink",
                **info,
            }
        },
        {
            "metaData": {
                "id": meta.id,
                "name": meta.name,
                "description": meta.description,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema, separators=(",", ":")),
                "partitionColumns": partitions,
                "createdTime": meta.created_time,
                "configuration": dict(meta.configuration),
            }
        },
    ]
    actions += [
        {
            "add": {
                "path": urllib.parse.quote(f.path, safe="/="),  # as delta-rs encodes it
                "partitionValues": dict(f.partition),
                "size": f.size,
                "modificationTime": f.modified_ms,
                "dataChange": True,
                "stats": f.stats,
            }
        }
        for h in handles
        for f in h.files
    ]
    actions.append({"txn": {"appId": app_id, "version": epoch, "lastUpdated": now}})
    body = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions)
    if not storage.create_log_entry(f"{version:020d}.json", body.encode()):
        raise LogEntryExists(f"version {version} of the Delta log was written by another commit")
    return version
