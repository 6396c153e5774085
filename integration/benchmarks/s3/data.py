"""The S3 benchmark's rows (an order line, the Postgres benchmark's row), the cached frame
every writer gets, and their fingerprint: computed by Spark on the source, by pyarrow on the
objects read back. The Delta and Iceberg benchmarks write the same rows."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from benchmarks import _bench

# An order line, deterministic in ``id`` (the same row the Postgres benchmark writes).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("id", "id"),
    ("customer_id", "(id * 7919) % 250000 + 1"),
    ("sku", "concat('SKU-', lpad(cast((id * 31) % 50000 AS string), 6, '0'))"),
    ("quantity", "cast(id % 12 + 1 AS int)"),
    ("price", "cast(((id * 7907) % 100000) / 100.0 + 0.99 AS decimal(12,2))"),
    ("currency", "element_at(array('EUR', 'USD', 'GBP', 'CHF'), cast(id % 4 + 1 AS int))"),
    ("created_at", "timestamp_micros(1704067200000000 + id * 31536000)"),
    (
        "note",
        "CASE WHEN id % 10 = 0 THEN NULL ELSE concat('order ', lpad(cast(id AS string), 8, "
        "'0'), ', ref ', substr(sha2(cast(id AS string), 256), 1, 21)) END",
    ),
    ("flags", "id % 3 = 0"),
)
# What "the same rows" means: these aggregates of the objects read back must match the
# source's (computed by Spark from the cached frame).
FINGERPRINT_SPARK = (
    "count(*)",
    "count(DISTINCT id)",
    "sum(customer_id)",
    "sum(quantity)",
    "cast(sum(price) AS string)",
    "count(DISTINCT sku)",
    "count(note)",
    "coalesce(sum(length(note)), 0)",
    "count_if(flags)",
    "unix_micros(min(created_at))",
    "unix_micros(max(created_at))",
    "count(DISTINCT currency)",
)


def make_frame(spark: Any, rows: int, partitions: int) -> Any:
    """The input: COLUMNS generated in Spark, cached (see ``_bench.cached_frame``)."""
    exprs = [f"{expr} AS {name}" for name, expr in COLUMNS]
    return _bench.cached_frame(spark, rows, partitions, exprs)


def spark_fingerprint(df: Any) -> tuple[Any, ...]:
    return tuple(df.selectExpr(*FINGERPRINT_SPARK).collect()[0])


def arrow_fingerprint(table: pa.Table) -> tuple[Any, ...]:
    """FINGERPRINT_SPARK computed with pyarrow on the objects read back."""
    if table.num_rows == 0:
        return (0, 0)
    micros = pc.cast(pc.cast(table["created_at"], pa.timestamp("us")), pa.int64())
    price = pc.sum(table["price"]).as_py()
    return (
        table.num_rows,
        pc.count_distinct(table["id"]).as_py(),
        pc.sum(table["customer_id"]).as_py(),
        pc.sum(table["quantity"]).as_py(),
        str(price) if isinstance(price, Decimal) else price,
        pc.count_distinct(table["sku"]).as_py(),
        pc.count(table["note"]).as_py(),
        pc.sum(pc.utf8_length(table["note"])).as_py() or 0,
        pc.sum(pc.cast(table["flags"], pa.int64())).as_py(),
        pc.min(micros).as_py(),
        pc.max(micros).as_py(),
        pc.count_distinct(table["currency"]).as_py(),
    )
