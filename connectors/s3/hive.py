"""``partition_by`` as Hive folders, the way Spark writes them.

A row's partition values become ``<col>=<value>/`` folders in its object's key: values cast
to strings as Spark casts them, escaped with Spark's ``escapePathName`` set (plus NUL, which
S3 listings in XML 1.0 cannot carry), null and the empty string as
``__HIVE_DEFAULT_PARTITION__``. The partition columns are dropped from the objects, as Spark
does, and put back by the readers from the manifest (typed as written).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from txsink.errors import ConfigurationError

__all__ = [
    "HIVE_NULL",
    "Group",
    "check_partition_by",
    "escape",
    "file_schema",
    "folders",
    "groups",
    "hive_value",
    "partition_types",
]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
# Spark's ExternalCatalogUtils.escapePathName set, plus NUL (S3 listings are XML 1.0).
_ESCAPE = frozenset([chr(c) for c in range(0x00, 0x20)] + list("\"#%'*/:=?\\\x7f{[]^"))

#: One Hive partition: its values in ``partition_by`` order (None: null or '').
Group = tuple[str | None, ...]


def partition_types() -> dict[str, pa.DataType]:
    """The Arrow types a ``partition_by`` column may have, by their name."""
    types = [
        pa.string(),
        pa.large_string(),
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.bool_(),
        pa.date32(),
    ]
    return {str(t): t for t in types}


def check_partition_by(
    schema: pa.Schema, partition_by: Sequence[str], context: Mapping[str, Any]
) -> None:
    """Refuse, at the start, partition columns that are missing, of a type Hive folders
    cannot hold, or all the columns there are."""
    names = set(schema.names)
    for col in partition_by:
        if col not in names:
            raise ConfigurationError(
                f"partition_by column {col!r} is not in the DataFrame (columns: "
                f"{schema.names}): fix partition_by or add the column before the sink",
                column=col,
                **context,
            )
        typ = schema.field(col).type
        if str(typ) not in partition_types():
            raise ConfigurationError(
                f"partition_by column {col!r} has type {typ}; Hive folders take string, "
                "integer, boolean or date columns: cast it (e.g. to a string or a date) "
                "before the sink",
                column=col,
                **context,
            )
    if partition_by and len(partition_by) == len(schema):
        raise ConfigurationError(
            "every column is a partition_by column, so the objects would have no columns: "
            "keep at least one column out of partition_by",
            **context,
        )


def file_schema(schema: pa.Schema, partition_by: Sequence[str]) -> pa.Schema:
    """The objects' columns: ``schema`` without the partition columns."""
    if not partition_by:
        return schema
    return pa.schema([f for f in schema if f.name not in partition_by], metadata=schema.metadata)


def hive_value(value: Any) -> str | None:
    """A partition value as Spark casts it to a string; None for null and ''."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date):
        return value.isoformat()
    text = str(value)
    return text or None


def escape(text: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPE else c for c in text)


def folders(partition_by: Sequence[str], group: Group) -> str:
    """``<col>=<value>/...`` of one partition (empty without ``partition_by``)."""
    return "".join(
        f"{escape(col)}={HIVE_NULL if value is None else escape(value)}/"
        for col, value in zip(partition_by, group, strict=True)
    )


def groups(
    batch: pa.RecordBatch, partition_by: Sequence[str]
) -> Iterator[tuple[Group, pa.RecordBatch, list[int] | None]]:
    """(Hive values, rows without the partition columns, their indices in ``batch``).

    Without ``partition_by``: the whole batch once, indices None.
    """
    if not partition_by:
        yield (), batch, None
        return
    values = zip(
        *([hive_value(v) for v in batch.column(c).to_pylist()] for c in partition_by),
        strict=True,
    )
    rows: dict[Group, list[int]] = {}
    for i, group in enumerate(values):
        rows.setdefault(group, []).append(i)
    data = batch.drop_columns(list(partition_by))
    for group, indices in rows.items():
        yield group, data.take(pa.array(indices, pa.int64())), indices
