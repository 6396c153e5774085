"""The Postgres benchmark's rows: an order line (and a wide variant with bytea, text[] and
jsonb), their tables' DDL, the cached frame every writer gets, the fingerprint its output
must match, and the feed-only job (Spark's own cost, no database)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from benchmarks import _bench

# The realistic row: an order line. Deterministic in ``id``; ``note`` is ~40 chars, NULL in
# one row of 10; ``created_at`` spreads over about a year.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (name, PostgreSQL type, Spark SQL expression over spark.range's ``id``)
    ("id", "bigint", "id"),
    ("customer_id", "bigint", "(id * 7919) % 250000 + 1"),
    ("sku", "text", "concat('SKU-', lpad(cast((id * 31) % 50000 AS string), 6, '0'))"),
    ("quantity", "integer", "cast(id % 12 + 1 AS int)"),
    ("price", "numeric(12,2)", "cast(((id * 7907) % 100000) / 100.0 + 0.99 AS decimal(12,2))"),
    ("currency", "text", "element_at(array('EUR', 'USD', 'GBP', 'CHF'), cast(id % 4 + 1 AS int))"),
    ("created_at", "timestamptz", "timestamp_micros(1704067200000000 + id * 31536000)"),
    (
        "note",
        "text",
        "CASE WHEN id % 10 = 0 THEN NULL ELSE concat('order ', lpad(cast(id AS string), 8, "
        "'0'), ', ref ', substr(sha2(cast(id AS string), 256), 1, 21)) END",
    ),
    ("flags", "boolean", "id % 3 = 0"),
)
# The wide table: COLUMNS plus a 32-byte bytea, a text[] of two and a small JSON object.
_ATTRS = "named_struct('q', id % 12, 'c', concat('c', cast(id % 4 AS string)), 'ok', id % 3 = 0)"
WIDE_EXTRA: tuple[tuple[str, str, str], ...] = (
    ("payload", "bytea", "unhex(sha2(cast(id AS string), 256))"),
    (
        "tags",
        "text[]",
        "array(concat('t', cast(id % 5 AS string)), concat('u', cast(id % 7 AS string)))",
    ),
    ("attrs", "jsonb", f"to_json({_ATTRS})"),
)
WIDE_COLUMNS = (*COLUMNS, *WIDE_EXTRA)
# The same, the nested column as a Spark struct (txsink writes it as JSON itself).
WIDE_STRUCT_COLUMNS = (*COLUMNS, *WIDE_EXTRA[:2], ("attrs", "jsonb", _ATTRS))

# What "the same rows" means: these aggregates must match the source's.
FINGERPRINT_PG = (
    "SELECT count(*), count(DISTINCT id), sum(customer_id), sum(quantity), sum(price), "
    "count(DISTINCT sku), count(note), coalesce(sum(length(note)), 0), "
    "count(*) FILTER (WHERE flags), "
    "(extract(epoch FROM min(created_at)) * 1000000)::bigint, "
    "(extract(epoch FROM max(created_at)) * 1000000)::bigint, "
    "count(DISTINCT currency) FROM {}"
)
FINGERPRINT_SPARK = (
    "count(*)",
    "count(DISTINCT id)",
    "sum(customer_id)",
    "sum(quantity)",
    "sum(price)",
    "count(DISTINCT sku)",
    "count(note)",
    "coalesce(sum(length(note)), 0)",
    "count_if(flags)",
    "unix_micros(min(created_at))",
    "unix_micros(max(created_at))",
    "count(DISTINCT currency)",
)


def ddl(columns: Sequence[tuple[str, str, str]]) -> str:
    return ", ".join(f"{name} {pg_type}" for name, pg_type, _ in columns)


def column_names(columns: Sequence[tuple[str, str, str]]) -> str:
    return ", ".join(name for name, _, _ in columns)


def make_frame(
    spark: Any, rows: int, partitions: int, columns: Sequence[tuple[str, str, str]]
) -> Any:
    """The input: ``columns`` generated in Spark, cached (see ``_bench.cached_frame``)."""
    exprs = [f"{expr} AS {name}" for name, _, expr in columns]
    return _bench.cached_frame(spark, rows, partitions, exprs)


def spark_fingerprint(df: Any) -> tuple[Any, ...]:
    row = df.selectExpr(*FINGERPRINT_SPARK).collect()[0]
    return tuple(row)


def wide_expected(rows: int) -> tuple[int, ...]:
    """What :func:`wide_fingerprint` must find for ids 0..rows-1."""
    return (32 * rows, 2 * rows, sum(i % 12 for i in range(rows)), (rows + 2) // 3)


# -- the feed-only job; its task runs in Spark's Python workers: keep it self-contained ------


def feed_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Only receive the batches: what Spark costs before any writer does anything."""
    # Warm the worker up (imports) so the first writer measured does not pay for it.
    import pgpq  # noqa: F401
    import psycopg  # noqa: F401

    import txsink.connectors.postgres  # noqa: F401

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def run_feed(df: Any) -> int:
    """Spark's own cost: tasks that only receive the batches; the rows they saw."""
    return _bench.task_rows(df.mapInArrow(feed_task, "rows long"))
