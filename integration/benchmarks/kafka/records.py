"""The feed: what every writer of the Kafka benchmark writes, and Spark's own cost.

Records: a string key (``user-NNNNNNN``) and a ~207-byte JSON value (a web-shop event built
in Spark with ``to_json(named_struct(...))``, its first field the unique ``id``), generated
from ``spark.range`` and cached before any timing; their fingerprint (count, key/value bytes
and CRC32 sums) is what a writer's output must match.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from benchmarks import _bench

KEY_EXPR = "concat('user-', lpad(cast((id * 7919) % 250000 AS string), 7, '0'))"
# A web-shop event; ``id`` first, so the verifier parses it from the value's prefix.
VALUE_FIELDS: tuple[tuple[str, str], ...] = (
    ("id", "id"),
    (
        "type",
        "element_at(array('page_view', 'click', 'add_to_cart', 'search', 'purchase'), "
        "cast(id % 5 + 1 AS int))",
    ),
    ("user", KEY_EXPR),
    ("session", "substr(sha2(cast(id DIV 20 AS string), 256), 1, 16)"),
    (
        "ts",
        "date_format(timestamp_micros(1704067200000000 + id * 31536000), "
        "\"yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'\")",
    ),
    ("page", "concat('/products/', lpad(cast((id * 31) % 50000 AS string), 6, '0'))"),
    ("device", "element_at(array('ios', 'android', 'web'), cast(id % 3 + 1 AS int))"),
    (
        "country",
        "element_at(array('DE', 'US', 'FR', 'GB', 'CH', 'NL'), cast(id % 6 + 1 AS int))",
    ),
    ("amount", "cast(((id * 7907) % 100000) / 100.0 AS decimal(10,2))"),
    ("currency", "'EUR'"),
)
VALUE_EXPR = (
    "to_json(named_struct(" + ", ".join(f"'{name}', {expr}" for name, expr in VALUE_FIELDS) + "))"
)
ID_PREFIX = b'{"id":'
# What "the same records" means: count, key/value bytes and CRC32 sums equal the source's.
FINGERPRINT_SPARK = (
    "count(*)",
    "sum(octet_length(key))",
    "sum(octet_length(value))",
    "sum(crc32(cast(key AS binary)))",
    "sum(crc32(cast(value AS binary)))",
)

#: The frame's columns, as Spark SQL over ``spark.range``'s ``id``.
EXPRS = (f"{KEY_EXPR} AS key", f"{VALUE_EXPR} AS value")


def make_frame(spark: Any, rows: int, partitions: int) -> Any:
    """The input: key and value generated in Spark, cached (see ``_bench.cached_frame``)."""
    # By the key's hash, for every writer: txsink's direct mode refuses a round-robin
    # repartition(n) (a replay would deal the rows differently), and the feed must be the same.
    return _bench.cached_frame(spark, rows, partitions, EXPRS, key="key")


def spark_fingerprint(df: Any) -> tuple[int, ...]:
    row = df.selectExpr(*FINGERPRINT_SPARK).collect()[0]
    return tuple(int(x) for x in row)


# -- the feed-only job; its task runs in Spark's Python workers: keep it self-contained ------


def feed_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Only receive the batches: what Spark costs before any writer does anything."""
    # Warm the worker up (imports) so the first writer measured does not pay for it.
    import confluent_kafka  # noqa: F401

    import txsink.connectors.kafka  # noqa: F401

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def run_feed(df: Any) -> int:
    """Spark's own cost: tasks that only receive the batches; the rows they saw."""
    return _bench.task_rows(df.mapInArrow(feed_task, "rows long"))
