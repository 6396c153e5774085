"""Schema evolution for outputs made visible by epoch manifests (files, S3): which schema
each epoch's manifest records, the target's schema the core compares an epoch with, and
reading epochs of different schemas as one table.

Why the manifest: files of different epochs simply have different schemas, so an output
of data files takes every kind of change of :mod:`txsink.schema` with no rewrite. What
must change exactly when the epoch's rows become visible is the *recorded* schema, and the
manifest is the one record written last, once, create-if-absent: it carries its epoch's
schema (``"schema"``, :func:`txsink.schema.schema_to_json`), so the target's schema changes
exactly when the epoch does, and an aborted epoch (no manifest) leaves none behind.

What a manifest records is the *target's* schema after the epoch, not only what the
epoch's files hold: the previous epoch's schema, widened and extended by the epoch's
change (:attr:`SchemaChange.new <txsink.schema.SchemaChange.new>`). An epoch that writes a
column narrower than the target's, or lacks one, leaves the target's schema as it was, so
a later epoch with the wider type is no change (under ``strict`` it would otherwise stop
the query). The epoch's own schema (from its handles) counts only when there is nothing
before it. Every input of that rule is immutable once the epoch is decided (the change is
in the decision, the previous manifest never changes, the handles are in the log), so
recovery builds the same manifest again: idempotent as before.

Manifests written before this (no ``"schema"``) stay readable: their schema comes from
their files (a Parquet footer; JSON lines and CSV carry no types, so none).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from txsink.errors import ConfigurationError
from txsink.kit import formats, manifests
from txsink.schema import SchemaChange, SchemaEvolutionError, diff, schema_to_json
from txsink.store import LogStore

__all__ = [
    "FIELD",
    "Recorded",
    "check_change",
    "decode_schema",
    "encode_schema",
    "epoch_schema",
    "newest_schema",
    "recorded_schema",
    "widest",
    "widest_recorded",
]

#: The manifest's field for its schema.
FIELD = "schema"
#: How many manifests without a schema (empty epochs before the first one that had rows)
#: :func:`newest_schema` reads past before it answers "none".
_LOOKBACK = 10

#: A connector's reader of an old manifest's schema from its files (None: cannot tell).
Legacy = Callable[[Mapping[str, Any]], pa.Schema | None]


def encode_schema(schema: pa.Schema) -> str:
    """A schema as a handle stores it: Arrow's IPC bytes in base64 (exact, compact)."""
    return str(schema_to_json(schema)["arrow"])


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def recorded_schema(doc: Mapping[str, Any]) -> pa.Schema | None:
    """The schema a manifest records; None for a manifest written before schemas were."""
    raw = doc.get(FIELD)
    return decode_schema(str(raw["arrow"])) if isinstance(raw, Mapping) else None


def epoch_schema(
    before: pa.Schema | None, change: SchemaChange | None, written: Iterable[str]
) -> pa.Schema | None:
    """The target's schema after an epoch (what its manifest records).

    ``before``: the target's schema before the epoch (:func:`newest_schema` below it);
    ``change``: the epoch's planned change (its decision's); ``written``: the handles'
    encoded schemas (:func:`encode_schema`; the epoch's schema as its tasks wrote it).
    """
    if change is not None:
        return change.new
    schemas = [decode_schema(s) for s in sorted(set(written)) if s]
    if not schemas:
        return before
    epoch = schemas[0]
    if len(schemas) > 1:
        epoch = pa.unify_schemas(schemas, promote_options="permissive")
    # No change was planned: the epoch's columns are the target's (or narrower, or fewer).
    return epoch if before is None else diff(before, epoch).merged


class Recorded:
    """The schema the last manifest this process wrote records, so that the next epoch's
    commit need not read that manifest back (one object read per epoch on S3). A restarted
    driver, or recovery, has none and reads it (:func:`newest_schema`)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.schema: pa.Schema | None = None

    def before(self, epoch: int, read: Callable[[], pa.Schema | None]) -> pa.Schema | None:
        """The target's schema before ``epoch``: remembered, or ``read()`` (also when the
        last manifest recorded none: an older output's schema comes from its files)."""
        if self.schema is not None and self.epoch == epoch - 1:
            return self.schema
        return read()

    def wrote(self, epoch: int, schema: pa.Schema | None) -> None:
        self.epoch, self.schema = epoch, schema


def newest_schema(
    store: LogStore, uid: str, legacy: Legacy, *, below: int | None = None
) -> pa.Schema | None:
    """The target's schema: the one the newest manifest of ``uid`` records (below epoch
    ``below``, when given), or its files' (``legacy``) for a manifest older than schemas;
    None when no epoch is committed (or none says).

    Cheap: the manifest of epoch ``below - 1`` is read directly; otherwise the manifests
    are listed and the newest read (older ones only past empty epochs without a schema).
    """
    for doc in _newest_first(store, uid, below):
        schema = recorded_schema(doc)
        if schema is not None:
            return schema
        if doc.get("rows"):  # an epoch with rows: its files tell
            return legacy(doc)
    return None


def _newest_first(store: LogStore, uid: str, below: int | None) -> Iterator[Mapping[str, Any]]:
    if below is not None and below > 0:
        raw = store.read(manifests.key(uid, below - 1))
        doc = json.loads(raw) if raw is not None else {}
        if doc.get("uid") == uid and (_says(doc) or doc.get("rows")):
            yield doc
            return
    prefix = f"{manifests.FOLDER}/{uid}-"
    # Only this uid's keys (a uid "out" lists "out-2-..." of uid "out-2" too).
    names = [n for n in store.list(prefix) if _epoch_of(n[len(prefix) :]) >= 0]
    if below is not None:
        names = [n for n in names if _epoch_of(n[len(prefix) :]) < below]
    for name in sorted(names, reverse=True)[:_LOOKBACK]:
        raw = store.read(name)
        doc = json.loads(raw) if raw is not None else {}
        if doc.get("uid") == uid:
            yield doc


def _says(doc: Mapping[str, Any]) -> bool:
    return isinstance(doc.get(FIELD), Mapping)


def _epoch_of(rest: str) -> int:
    """The epoch of a manifest key's part after ``<uid>-`` (``<epoch:020d>.json``); -1 for
    a key of another shape."""
    digits = rest.removesuffix(".json")
    return int(digits) if len(digits) == 20 and digits.isdigit() and rest.endswith(".json") else -1


def check_change(
    change: SchemaChange,
    format: str,
    compression: str | None,
    context: Mapping[str, Any],
    *,
    drop: Sequence[str] = (),
) -> None:
    """Refuse, before the epoch, a change the output format cannot carry: each changed
    column at its new type goes through the format's own start-up check
    (:func:`txsink.kit.formats.check_schema`); ``drop``: columns not in the files (Hive
    partition columns). Writes nothing.

    Raises:
        SchemaEvolutionError: naming the column, the format and the fix.
    """
    names = {c.path[0] for c in change.columns} - set(drop)
    columns = pa.schema([f for f in change.new if f.name in names])
    try:
        formats.check_schema(columns, format, compression, context)
    except ConfigurationError as err:
        raise SchemaEvolutionError(
            f"the epoch's schema change ({change.describe()}) cannot be written as {format}: "
            f"{err.message}. Nothing of the epoch was written",
            **{**dict(context), "column": err.column},
        ) from err


def widest_recorded(docs: Sequence[Mapping[str, Any]]) -> pa.Schema | None:
    """The schemas the manifests ``docs`` (by epoch) record, joined (the newest's column
    order first; for one sink uid, the newest's schema itself); None when none records
    one."""
    recorded = [s for d in reversed(docs) for s in [recorded_schema(d)] if s is not None]
    if len(recorded) < 2:
        return recorded[0] if recorded else None
    return pa.unify_schemas(recorded, promote_options="permissive")


def widest(tables: pa.Table, docs: Sequence[Mapping[str, Any]]) -> pa.Table:
    """``tables`` (every epoch's rows, concatenated) in the widest schema the Parquet
    manifests of ``docs`` record: the newest's column order, older rows null in columns
    and struct fields added since, widened columns cast up. Columns no manifest records
    (``_epoch``, an old epoch's own) stay, after them."""
    recorded = [s for d in reversed(docs) if d.get("format") == "parquet"
                for s in [recorded_schema(d)] if s is not None]  # fmt: skip
    if not recorded:
        return tables
    try:
        target = pa.unify_schemas([*recorded, tables.schema], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return tables  # old files of types no promotion joins: as they were read
    columns, fields = [], []
    for field in target:
        if field.name in tables.column_names:
            column = tables.column(field.name)
            columns.append(column if column.type == field.type else column.cast(field.type))
        else:
            columns.append(pa.nulls(len(tables), field.type))
        fields.append(field.with_nullable(True))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))
