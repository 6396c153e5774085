"""The plain writers, without txsink's protocol (no 2PC, no log): ``mapInArrow`` tasks that
COPY pyarrow's CSV (what txsink did before binary COPY), COPY pgpq's binary encoding of the
batches as they are (the ceiling), or ``executemany`` INSERTs, each task in one ordinary
transaction."""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
from benchmarks import _bench

from .context import Bench
from .tables import column_names

# -- task functions: these run in Spark's Python workers; keep them self-contained -----------


def _copy_task(
    dsn: str, statement: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Plain COPY: the partition's batches as CSV into one ordinary transaction."""
    import psycopg

    rows = 0
    options = pacsv.WriteOptions(include_header=False)
    # The connection's context commits on a clean exit.
    with psycopg.connect(dsn) as conn, conn.cursor() as cur, cur.copy(statement) as copy:
        for batch in batches:
            buf = io.BytesIO()
            pacsv.write_csv(batch, buf, options)
            copy.write(buf.getvalue())
            rows += batch.num_rows
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def _binary_task(
    dsn: str, statement: str, jsonb: Sequence[str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Plain binary COPY: pgpq's encoding of the batches as they are, one transaction."""
    import psycopg
    from pgpq import ArrowToPostgresBinaryEncoder
    from pgpq.encoders import StringEncoderBuilder
    from pgpq.schema import Jsonb

    rows = 0
    encoder: Any = None
    with psycopg.connect(dsn) as conn, conn.cursor() as cur, cur.copy(statement) as copy:
        for batch in batches:
            if encoder is None:
                encoders = {
                    f.name: StringEncoderBuilder.new_with_output(f, Jsonb())
                    if f.name in jsonb
                    else ArrowToPostgresBinaryEncoder.infer_encoder(f)
                    for f in batch.schema
                }
                encoder = ArrowToPostgresBinaryEncoder.new_with_encoders(batch.schema, encoders)
                copy.write(encoder.write_header())
            copy.write(encoder.write_batch(batch))
            rows += batch.num_rows
        if encoder is not None:
            copy.write(encoder.finish())
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def _insert_task(
    dsn: str, statement: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``executemany`` INSERT of the partition's rows in one transaction."""
    import psycopg

    rows = 0
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        for batch in batches:
            columns = [column.to_pylist() for column in batch.columns]
            cur.executemany(statement, list(zip(*columns, strict=True)))
            rows += batch.num_rows
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def write_copy(bench: Bench, df: Any, table: str, names: str) -> dict[str, Any]:
    statement = f"COPY {bench.qualified(table)} ({names}) FROM STDIN (FORMAT CSV)"
    job = df.mapInArrow(functools.partial(_copy_task, bench.dsn, statement), "rows long")
    return {"task_rows": _bench.task_rows(job)}


def write_binary(
    bench: Bench, df: Any, table: str, columns: Sequence[tuple[str, str, str]]
) -> dict[str, Any]:
    statement = (
        f"COPY {bench.qualified(table)} ({column_names(columns)}) FROM STDIN (FORMAT BINARY)"
    )
    jsonb = [name for name, pg_type, _ in columns if pg_type == "jsonb"]
    task = functools.partial(_binary_task, bench.dsn, statement, jsonb)
    return {"task_rows": _bench.task_rows(df.mapInArrow(task, "rows long"))}


def write_executemany(bench: Bench, df: Any, table: str, names: str) -> dict[str, Any]:
    marks = ", ".join(["%s"] * len(names.split(", ")))
    statement = f"INSERT INTO {bench.qualified(table)} ({names}) VALUES ({marks})"
    job = df.mapInArrow(functools.partial(_insert_task, bench.dsn, statement), "rows long")
    return {"task_rows": _bench.task_rows(job)}
