"""Postgres benchmark: txsink's PostgresSink next to plain CSV COPY, plain binary COPY,
Spark's JDBC writer and psycopg ``executemany``, writing the same cached rows into fresh
tables; then a wide table (the same columns plus bytea, text[] and jsonb).

    integration/benchmarks/run postgres [--rows N] [--partitions 2,8] [--repeat K]
                                        [--wide-rows N]

Writers (each into its own fresh table, dropped after its output is verified):

txsink       ``Coordinator([PostgresSink(mode="append")]).write(df, epoch=0)``: every task
             casts its Arrow batches to the table's types, encodes them with pgpq into
             binary COPY and PREPAREs; the driver records the decision and runs COMMIT
             PREPARED per partition. The full protocol.
copy         plain CSV COPY: ``mapInArrow`` tasks COPY pyarrow's CSV in an ordinary
             transaction and COMMIT (what txsink did before binary COPY). No 2PC, no log.
binary       the ceiling: ``mapInArrow`` tasks COPY pgpq's binary encoding of the batches as
             they are (the tables' types are pgpq's own) in an ordinary transaction.
upsert       txsink with ``mode="upsert", key=["id"]`` into a table with that primary key:
             the epoch repartitioned by the key, binary COPY into each task's stage table,
             then ``INSERT ... ON CONFLICT`` at prepare.
jdbc         ``df.write.jdbc(..., mode="append")``, PostgreSQL JDBC driver, ``batchsize``
             10000 and ``reWriteBatchedInserts=true``.
executemany  ``mapInArrow`` tasks run ``cursor.executemany("INSERT ...")`` in one transaction
             (psycopg 3 pipelines it: no round trip per row).
feed         no database: ``mapInArrow`` tasks only receive the batches (Spark's own cost).

Plus, unless ``--no-extras``: txsink's phases (EpochResult.seconds) and a per-task profile,
PREPARE / COMMIT PREPARED latency, single-connection COPY and encoding rates; and, at
``--wide-rows`` (0 skips it), the wide table: txsink (the nested column as JSON text from
Spark, and as a struct that txsink turns into JSON), plain binary COPY and Spark's JDBC
writer (``stringtype=unspecified`` for the jsonb column). Server CPU per row for each.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.csv as pacsv
from typing_extensions import override

try:
    from benchmarks import _bench
except ImportError:  # run as a plain script: python integration/benchmarks/postgres.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench

from txsink import Coordinator
from txsink.connectors.postgres.copy import OpenTxn
from txsink.connectors.postgres.sink import PgHandle, PostgresSink
from txsink.txid import TxnId

JDBC_DRIVER = ("org.postgresql", "postgresql", "42.7.8")
JDBC_BATCHSIZE = 10_000

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
WIDE_WRITERS = ("txsink", "txsink_struct", "binary", "jdbc")

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

WRITERS = ("txsink", "upsert", "copy", "binary", "jdbc", "executemany")
LABELS = {
    "txsink": "txsink PostgresSink",
    "txsink_struct": "txsink, attrs a struct",
    "upsert": "txsink upsert (key id)",
    "copy": "plain CSV COPY (no 2PC)",
    "binary": "plain binary COPY (no 2PC)",
    "jdbc": "Spark JDBC writer",
    "executemany": "psycopg executemany",
    "feed": "(Spark feed only, no DB)",
}
# txsink over each: CSV COPY stands in for txsink's CSV path of before (it ran at 0.94-1.03x
# plain CSV COPY), so ">= 1.25x today's txsink" reads ">= 1.25x plain CSV COPY" here.
TARGETS = {"copy": 1.25, "binary": 0.9, "jdbc": 1.5}
# Where the last CSV-path run left txsink (docs/benchmarks.md, 2026-11-22, median of 5).
CSV_TXSINK_RATE = {2: 327_312, 8: 266_959}


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


def _feed_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Only receive the batches: what Spark costs before any writer does anything."""
    # Warm the worker up (imports) so the first writer measured does not pay for it.
    import pgpq  # noqa: F401
    import psycopg  # noqa: F401

    import txsink.connectors.postgres  # noqa: F401

    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


class ProfiledPostgresSink(PostgresSink):
    """PostgresSink that writes, per task, the seconds spent in begin / write / prepare.

    Used only for the profile run (its numbers are not in the throughput table). ``feed``
    in the profile is the task's time between its first ``begin`` and the end of
    ``prepare`` not spent in the sink: Spark producing and shipping the batches.
    """

    def __init__(self, *args: Any, profile_dir: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile_dir = profile_dir
        self._profile: dict[str, float] = {}

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> OpenTxn:
        t0 = time.perf_counter()
        opened = super().begin(txn, schema)
        self._profile = {"start": t0, "begin": time.perf_counter() - t0, "write": 0.0}
        return opened

    @override
    def write(self, txn: OpenTxn, batch: pa.RecordBatch) -> None:
        t0 = time.perf_counter()
        super().write(txn, batch)
        self._profile["write"] += time.perf_counter() - t0

    @override
    def prepare(self, txn: OpenTxn) -> PgHandle:
        t0 = time.perf_counter()
        handle = super().prepare(txn)
        end = time.perf_counter()
        p = self._profile
        record = {
            "partition": txn.txn.partition,
            "rows": handle.rows,
            "begin": p["begin"],
            "write": p["write"],
            "prepare": end - t0,
            "span": end - p["start"],
        }
        Path(self.profile_dir, f"{txn.txn}.json").write_text(json.dumps(record))
        return handle


# -- the benchmark ----------------------------------------------------------------------------


@dataclass
class Bench:
    spark: Any
    dsn: str
    schema: str
    jdbc_url: str
    jdbc_properties: dict[str, str]
    workdir: Path
    cpu: _bench.CpuMeter
    void: list[str] = field(default_factory=list)

    def connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def qualified(self, table: str) -> str:
        return f"{self.schema}.{table}"


def _ddl(columns: Sequence[tuple[str, str, str]]) -> str:
    return ", ".join(f"{name} {pg_type}" for name, pg_type, _ in columns)


def _names(columns: Sequence[tuple[str, str, str]]) -> str:
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


def pg_fingerprint(bench: Bench, table: str) -> tuple[Any, ...]:
    with bench.connect() as conn:
        row = conn.execute(FINGERPRINT_PG.format(bench.qualified(table))).fetchone()
    return tuple(row) if row is not None else ()


def wide_fingerprint(bench: Bench, table: str) -> tuple[Any, ...]:
    """The wide columns, read back: bytes, array elements, and one JSON field summed."""
    with bench.connect() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(length(payload)), 0), coalesce(sum(cardinality(tags)), 0), "
            "coalesce(sum((attrs->>'q')::int), 0), count(*) FILTER (WHERE (attrs->>'ok')::bool) "
            f"FROM {bench.qualified(table)}"
        ).fetchone()
    return tuple(int(v) for v in row) if row is not None else ()


def wide_expected(rows: int) -> tuple[int, ...]:
    """What :func:`wide_fingerprint` must find for ids 0..rows-1."""
    return (32 * rows, 2 * rows, sum(i % 12 for i in range(rows)), (rows + 2) // 3)


def _rows_from(job: Any) -> int:
    return int(sum(r["rows"] for r in job.collect()))


def write_txsink(
    bench: Bench, df: Any, table: str, profile_dir: str | None = None, *, upsert: bool = False
) -> dict[str, Any]:
    uid = table.replace("_", "-")
    kwargs: dict[str, Any] = {"mode": "upsert", "key": ["id"]} if upsert else {"mode": "append"}
    sink: PostgresSink = (
        ProfiledPostgresSink(
            bench.dsn, bench.qualified(table), uid, profile_dir=profile_dir, **kwargs
        )
        if profile_dir is not None
        else PostgresSink(bench.dsn, bench.qualified(table), uid, **kwargs)
    )
    with tempfile.TemporaryDirectory(dir=bench.workdir) as log:
        result = Coordinator([sink], log=log, app_id="bench").write(df, epoch=0)
    if result.status != "committed":
        raise RuntimeError(f"txsink epoch not committed: {result}")
    with bench.connect() as conn:
        lingering = conn.execute(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE %s", (f"%.{uid}.%",)
        ).fetchone()
    return {
        "phases": dict(result.seconds),
        "handles": result.handles,
        "lingering": int(lingering[0]) if lingering else -1,
    }


def write_copy(bench: Bench, df: Any, table: str, names: str) -> dict[str, Any]:
    statement = f"COPY {bench.qualified(table)} ({names}) FROM STDIN (FORMAT CSV)"
    job = df.mapInArrow(functools.partial(_copy_task, bench.dsn, statement), "rows long")
    return {"task_rows": _rows_from(job)}


def write_binary(
    bench: Bench, df: Any, table: str, columns: Sequence[tuple[str, str, str]]
) -> dict[str, Any]:
    statement = f"COPY {bench.qualified(table)} ({_names(columns)}) FROM STDIN (FORMAT BINARY)"
    jsonb = [name for name, pg_type, _ in columns if pg_type == "jsonb"]
    task = functools.partial(_binary_task, bench.dsn, statement, jsonb)
    return {"task_rows": _rows_from(df.mapInArrow(task, "rows long"))}


def write_executemany(bench: Bench, df: Any, table: str, names: str) -> dict[str, Any]:
    marks = ", ".join(["%s"] * len(names.split(", ")))
    statement = f"INSERT INTO {bench.qualified(table)} ({names}) VALUES ({marks})"
    job = df.mapInArrow(functools.partial(_insert_task, bench.dsn, statement), "rows long")
    return {"task_rows": _rows_from(job)}


def write_jdbc(bench: Bench, df: Any, table: str, *, json_text: bool = False) -> dict[str, Any]:
    props = dict(bench.jdbc_properties)
    if json_text:  # let the server type the JSON strings as jsonb
        props["stringtype"] = "unspecified"
    df.write.jdbc(bench.jdbc_url, bench.qualified(table), mode="append", properties=props)
    return {}


def run_feed(df: Any) -> int:
    return _rows_from(df.mapInArrow(_feed_task, "rows long"))


def measure(
    bench: Bench,
    writer: str,
    df: Any,
    *,
    rows: int,
    partitions: int,
    columns: Sequence[tuple[str, str, str]],
    expected: tuple[Any, ...],
    tag: str,
    profile_dir: str | None = None,
) -> _bench.Measurement:
    """Time one writer into a fresh table, verify its output, drop the table."""
    table = f"{writer}_{tag}"
    names = _names(columns)
    with bench.connect() as conn:
        key = ", PRIMARY KEY (id)" if writer == "upsert" else ""
        conn.execute(f"CREATE TABLE {bench.qualified(table)} ({_ddl(columns)}{key})")
    wide = len(columns) > len(COLUMNS)
    writers: dict[str, Callable[[], dict[str, Any]]] = {
        "txsink": lambda: write_txsink(bench, df, table, profile_dir),
        "txsink_struct": lambda: write_txsink(bench, df, table, profile_dir),
        "upsert": lambda: write_txsink(bench, df, table, profile_dir, upsert=True),
        "copy": lambda: write_copy(bench, df, table, names),
        "binary": lambda: write_binary(bench, df, table, columns),
        "jdbc": lambda: write_jdbc(bench, df, table, json_text=wide),
        "executemany": lambda: write_executemany(bench, df, table, names),
        "feed": lambda: {"task_rows": run_feed(df)},
    }
    try:
        m = _bench.timed_run(bench.cpu, writer, partitions, rows, writers[writer])
        found = pg_fingerprint(bench, table) if writer != "feed" else expected
        if wide:
            m.extra["wide_check"] = wide_fingerprint(bench, table)
        if writer != "feed":
            with bench.connect() as conn:
                size = conn.execute("SELECT pg_table_size(%s)", (bench.qualified(table),))
                m.extra["table_bytes"] = int(size.fetchone()[0])
    finally:
        with bench.connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {bench.qualified(table)}")
    extra = m.extra
    problems = []
    if writer == "feed" and extra["task_rows"] != rows:
        problems.append(f"the feed job saw {extra['task_rows']} rows")
    if found[:2] != (rows, rows):
        problems.append(f"table holds {found[0]} rows, {found[1]} distinct ids (want {rows})")
    elif found != expected:
        problems.append(f"column aggregates differ: {found} != {expected}")
    if wide and extra["wide_check"] != wide_expected(rows):
        problems.append(f"wide columns differ: {extra['wide_check']} != {wide_expected(rows)}")
    if extra.get("lingering", 0):
        problems.append(f"{extra['lingering']} prepared transactions left behind")
    _bench.void_if(problems, m, tag, bench.void)
    _bench.log_run(m, tag, width=12)
    return m


# -- extras: where the time goes ----------------------------------------------------------


def profile_tasks(bench: Bench, df: Any, **kw: Any) -> dict[str, float]:
    """One untimed txsink run with ProfiledPostgresSink: task seconds by step (summed)."""
    profile_dir = tempfile.mkdtemp(dir=bench.workdir, prefix="profile-")
    m = measure(bench, "txsink", df, profile_dir=profile_dir, **kw)
    records = [json.loads(p.read_text()) for p in Path(profile_dir).glob("*.json")]
    out = {
        key: sum(float(r[key]) for r in records) for key in ("begin", "write", "prepare", "span")
    }
    out["feed"] = out["span"] - out["begin"] - out["write"] - out["prepare"]
    out["tasks"] = float(len(records))
    out["prepare_max"] = max((float(r["prepare"]) for r in records), default=0.0)
    out["wall"] = m.seconds
    for phase, secs in m.extra.get("phases", {}).items():
        out[f"phase_{phase}"] = float(secs)
    return out


def epoch_overhead(
    bench: Bench, df: Any, rows: int, partitions: int, epochs: int = 9
) -> dict[str, float]:
    """Small epochs as a streaming query runs them: one Coordinator writing epoch after epoch
    into one table (start-up check and recovery only before the first), against plain COPY
    of the same rows into another table. Medians over ``epochs`` (the first one excluded)."""
    tx_table, cp_table = f"epochs_txsink_p{partitions}", f"epochs_copy_p{partitions}"
    with bench.connect() as conn:
        for table in (tx_table, cp_table):
            conn.execute(f"CREATE TABLE {bench.qualified(table)} ({_ddl(COLUMNS)})")
    tx: list[float] = []
    cp: list[float] = []
    phases: dict[str, list[float]] = {}
    try:
        sink = PostgresSink(bench.dsn, bench.qualified(tx_table), tx_table.replace("_", "-"))
        with tempfile.TemporaryDirectory(dir=bench.workdir) as log:
            coordinator = Coordinator([sink], log=log, app_id="bench")
            for epoch in range(epochs + 1):
                with _bench.stopwatch() as t:
                    result = coordinator.write(df, epoch=epoch)
                with _bench.stopwatch() as c:
                    write_copy(bench, df, cp_table, _names(COLUMNS))
                if epoch == 0:
                    continue  # the first pays the start-up check and recovery
                tx.append(t[0])
                cp.append(c[0])
                for phase, secs in result.seconds.items():
                    phases.setdefault(phase, []).append(secs)
        with bench.connect() as conn:
            for table in (tx_table, cp_table):
                row = conn.execute(
                    f"SELECT count(*), count(DISTINCT id) FROM {bench.qualified(table)}"
                ).fetchone()
                if row is None or tuple(row) != ((epochs + 1) * rows, rows):
                    bench.void.append(f"VOID epoch overhead: {table} holds {row}")
    finally:
        with bench.connect() as conn:
            for table in (tx_table, cp_table):
                conn.execute(f"DROP TABLE IF EXISTS {bench.qualified(table)}")
    out = {"txsink": _bench.median(tx), "copy": _bench.median(cp), "epochs": float(len(tx))}
    out.update({"txsink_min": min(tx), "txsink_max": max(tx), "copy_min": min(cp)})
    out["copy_max"] = max(cp)
    out.update({f"phase_{k}": _bench.median(v) for k, v in phases.items()})
    _bench.log(
        f"epochs of {rows:,} rows, P={partitions}: txsink {out['txsink'] * 1000:.0f} ms, "
        f"plain COPY {out['copy'] * 1000:.0f} ms (medians of {epochs})"
    )
    return out


def tpc_latency(bench: Bench, n: int = 30) -> dict[str, float]:
    """Median ms of COMMIT, PREPARE TRANSACTION and COMMIT PREPARED for a one-row insert."""
    import psycopg

    table = bench.qualified("tpc_probe")
    commit: list[float] = []
    prepare: list[float] = []
    commit_prepared: list[float] = []
    with bench.connect() as driver:
        driver.execute(f"CREATE TABLE {table} (id bigint)")
        try:
            for i in range(n):
                with psycopg.connect(bench.dsn) as conn:
                    conn.execute(f"INSERT INTO {table} VALUES (%s)", (i,))
                    t0 = time.perf_counter()
                    conn.commit()
                    commit.append(time.perf_counter() - t0)
                # Not ``with conn``: its exit would commit(), which a prepared
                # transaction refuses.
                conn = psycopg.connect(bench.dsn)
                try:
                    gid = f"bench-probe-{uuid.uuid4().hex}"
                    conn.tpc_begin(gid)
                    conn.execute(f"INSERT INTO {table} VALUES (%s)", (i,))
                    t0 = time.perf_counter()
                    conn.tpc_prepare()
                    prepare.append(time.perf_counter() - t0)
                finally:
                    conn.close()
                t0 = time.perf_counter()
                driver.execute(f"COMMIT PREPARED '{gid}'")
                commit_prepared.append(time.perf_counter() - t0)
        finally:
            for (gid,) in driver.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'bench-probe-%'"
            ).fetchall():
                driver.execute(f"ROLLBACK PREPARED '{gid}'")
            driver.execute(f"DROP TABLE IF EXISTS {table}")
    return {
        "commit_ms": _bench.median(commit) * 1000,
        "prepare_ms": _bench.median(prepare) * 1000,
        "commit_prepared_ms": _bench.median(commit_prepared) * 1000,
    }


def single_connection(
    bench: Bench, df: Any, columns: Sequence[tuple[str, str, str]]
) -> dict[str, float]:
    """Without Spark: CSV encoding rate, and one connection COPYing pre-encoded CSV."""
    data = df.toArrow()
    batches = data.to_batches(max_chunksize=10_000)
    options = pacsv.WriteOptions(include_header=False)
    t0 = time.perf_counter()
    chunks = []
    for batch in batches:
        buf = io.BytesIO()
        pacsv.write_csv(batch, buf, options)
        chunks.append(buf.getvalue())
    encode = time.perf_counter() - t0
    from pgpq import ArrowToPostgresBinaryEncoder

    t0 = time.perf_counter()
    encoder = ArrowToPostgresBinaryEncoder(batches[0].schema)
    binary = [encoder.write_header(), *(encoder.write_batch(b) for b in batches), encoder.finish()]
    binary_encode = time.perf_counter() - t0
    table = bench.qualified("copy_probe")
    with bench.connect() as conn:
        conn.execute(f"CREATE TABLE {table} ({_ddl(columns)})")
    try:
        import psycopg

        t0 = time.perf_counter()
        statement = f"COPY {table} ({_names(columns)}) FROM STDIN (FORMAT CSV)"
        with psycopg.connect(bench.dsn) as conn, conn.cursor() as cur, cur.copy(statement) as cp:
            for chunk in chunks:
                cp.write(chunk)
        copy_secs = time.perf_counter() - t0
        with bench.connect() as conn:
            conn.execute(f"TRUNCATE {table}")
        t0 = time.perf_counter()
        statement = f"COPY {table} ({_names(columns)}) FROM STDIN (FORMAT BINARY)"
        with psycopg.connect(bench.dsn) as conn, conn.cursor() as cur, cur.copy(statement) as cp:
            for chunk in binary:
                cp.write(chunk)
        binary_copy_secs = time.perf_counter() - t0
    finally:
        with bench.connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    return {
        "rows": float(data.num_rows),
        "csv_mb": sum(len(c) for c in chunks) / 1e6,
        "encode_rows_per_s": data.num_rows / encode,
        "copy_rows_per_s": data.num_rows / copy_secs,
        "binary_mb": sum(len(c) for c in binary) / 1e6,
        "binary_encode_rows_per_s": data.num_rows / binary_encode,
        "binary_copy_rows_per_s": data.num_rows / binary_copy_secs,
    }


# -- report ---------------------------------------------------------------------------------


@dataclass
class Results(_bench.Results):
    """The runs, plus the extras: task profiles, small epochs, 2PC latency, single
    connection, and the wide table's runs."""

    name: ClassVar[str] = "postgres"
    title: ClassVar[str] = "Postgres"
    server: ClassVar[str] = "postgres"
    baseline: ClassVar[str] = "copy"

    profiles: dict[int, dict[str, float]] = field(default_factory=dict)
    epochs: dict[int, dict[str, float]] = field(default_factory=dict)
    epoch_rows: int = 0
    tpc: dict[str, float] = field(default_factory=dict)
    single: dict[str, float] = field(default_factory=dict)
    wide_rows: int = 0
    wide: list[_bench.Measurement] = field(default_factory=list)
    wide_partitions: int = 0

    @classmethod
    @override
    def decode(cls, doc: dict[str, Any]) -> dict[str, Any]:
        doc = super().decode(doc)
        doc["wide"] = [_bench.Measurement(**m) for m in doc.get("wide", [])]
        doc.pop("binary", None)
        doc.pop("binary_rows", None)
        doc.pop("binary_partitions", None)
        doc["profiles"] = {int(k): v for k, v in doc["profiles"].items()}
        doc["epochs"] = {int(k): v for k, v in doc["epochs"].items()}
        return doc


def _pg_us_per_row(runs: Sequence[_bench.Measurement]) -> float:
    """The server's CPU per row written, in microseconds (median over the runs)."""
    return _bench.median(
        [m.extra.get("cpu", {}).get("postgres", float("nan")) / m.rows * 1e6 for m in runs]
    )


def throughput_table(res: Results) -> str:
    return _bench.throughput_table(
        res,
        LABELS,
        (*WRITERS, "feed"),
        WRITERS,
        rate_header="rows/s (median)",
        vs_header="vs plain CSV COPY",
        server_header="PG",
        columns=[("PG CPU µs/row", "r", lambda w, p, runs: f"{_pg_us_per_row(runs):.2f}")],
    )


def target_table(res: Results) -> str:
    rows = []
    for p in res.partitions:
        before = CSV_TXSINK_RATE.get(p)
        now = res.rate("txsink", p) if res.seconds("txsink", p) else float("nan")
        rows.append(
            [str(p)]
            + [
                _bench.ratio_cell(res, "txsink", p, writer, target=target)
                if res.seconds(writer, p)
                else "not run"
                for writer, target in TARGETS.items()
            ]
            + [f"{now / before:.2f}x" if before else "n/a"]
        )
    return _bench.markdown_table(
        [
            "partitions",
            "txsink / plain CSV COPY (target >= 1.25x)",
            "txsink / plain binary COPY (target >= 0.9x)",
            "txsink / Spark JDBC (target >= 1.5x)",
            "txsink / its CSV path's rate of 2026-11-22 (other load)",
        ],
        rows,
        "rrrrr",
    )


def profile_table(res: Results) -> str:
    rows = []
    for p, pr in sorted(res.profiles.items()):
        rows.append(
            [
                str(p),
                f"{pr['tasks']:.0f}",
                f"{pr['span']:.2f}",
                f"{pr['feed']:.2f} ({pr['feed'] / pr['span']:.0%})",
                f"{pr['write']:.2f} ({pr['write'] / pr['span']:.0%})",
                f"{pr['begin']:.3f}",
                f"{pr['prepare']:.3f} (max {pr['prepare_max'] * 1000:.0f} ms)",
            ]
        )
    return _bench.markdown_table(
        [
            "partitions",
            "tasks",
            "task s (sum)",
            "waiting for batches s",
            "cast + encode + COPY s",
            "begin s",
            "prepare s",
        ],
        rows,
        "rrrrrrr",
    )


def _wide_rate(res: Results, writer: str) -> float:
    secs = [m.seconds for m in res.wide if m.writer == writer]
    return res.wide_rows / _bench.median(secs) if secs else float("nan")


def _bytes_per_row(runs: Sequence[_bench.Measurement]) -> float:
    return _bench.median([m.extra.get("table_bytes", 0) / m.rows for m in runs])


def wide_table(res: Results) -> str:
    rows = []
    base = _wide_rate(res, "binary")
    for writer in WIDE_WRITERS:
        runs = [m for m in res.wide if m.writer == writer]
        if not runs:
            continue
        rate = _wide_rate(res, writer)
        rows.append(
            [
                LABELS[writer],
                _bench.fmt_rate(rate) + (" VOID" if any(m.extra.get("void") for m in runs) else ""),
                _bench.fmt_secs([m.seconds for m in runs]),
                f"{rate / base:.2f}x",
                f"{_bytes_per_row(runs):.0f}",
                f"{_pg_us_per_row(runs):.2f}",
            ]
        )
    return _bench.markdown_table(
        [
            "writer",
            "rows/s (median)",
            "wall s per run",
            "vs plain binary COPY",
            "table bytes/row",
            "PG CPU µs/row",
        ],
        rows,
        "lrrrrr",
    )


def reading(res: Results) -> list[str]:
    """The numbers, read: generated from the results so a rerun cannot contradict them."""
    out: list[str] = []
    first = res.partitions[0]

    def cpu_total(writer: str, p: int) -> float:
        c = res.cpu(writer, p)
        return c["spark"] + c["postgres"]

    ps = [p for p in res.partitions if res.seconds("txsink", p) and res.seconds("copy", p)]
    if ps:
        ratios = "; ".join(
            f"{res.ratio('txsink', p):.2f}x at {p} partitions (single runs "
            f"{min(res.paired('txsink', p)):.2f}-{max(res.paired('txsink', p)):.2f}x)"
            for p in ps
        )
        met = [res.ratio("txsink", p) >= TARGETS["copy"] for p in ps]
        binary = [
            f"{res.ratio('txsink', p, 'binary'):.2f}x at {p} partitions (single runs "
            f"{min(res.paired('txsink', p, 'binary')):.2f}-"
            f"{max(res.paired('txsink', p, 'binary')):.2f}x)"
            for p in ps
            if res.seconds("binary", p)
        ]
        verdict = (
            "met"
            if all(met)
            else "NOT met"
            if not any(met)
            else "met at "
            + ", ".join(str(p) for p, ok in zip(ps, met, strict=True) if ok)
            + " partitions, NOT met at "
            + ", ".join(str(p) for p, ok in zip(ps, met, strict=True) if not ok)
        )
        tx, cp = cpu_total("txsink", first), cpu_total("copy", first)
        same = abs(tx - cp) <= 0.1 * cp
        straddle = [
            p for p in ps if min(res.paired("txsink", p)) <= 1.0 <= max(res.paired("txsink", p))
        ]
        out.append(
            f"**txsink vs plain CSV COPY** (what txsink's own CSV path ran at, 0.94-1.03x, "
            f"before binary COPY): {ratios}. Target >= {TARGETS['copy']}x: {verdict}. "
            + (
                f"**vs plain binary COPY** (the same pgpq encoding without casts, checks or "
                f"2PC): {'; '.join(binary)}; target >= {TARGETS['binary']}x. "
                if binary
                else ""
            )
            + "All run the same Spark job (one `mapInArrow` task per partition); "
            "what txsink adds to plain binary COPY is the Arrow casts to the table's types "
            "(none needed for this table) and the protocol: the start-up check (catalog "
            "queries, progress table), a progress-row INSERT and PREPARE TRANSACTION per task, "
            "three fsynced log records, one COMMIT PREPARED per partition from the driver, and "
            "two scans of `pg_prepared_xacts` (timed below). CPU per run at "
            f"{first} partitions: {tx:.1f} s for txsink, {cp:.1f} s for plain CSV COPY ("
            + ("the same within 10%" if same else f"{tx / cp - 1:+.0%} for txsink")
            + ")."
            + (
                " At "
                + " and ".join(str(p) for p in straddle)
                + " partitions txsink was faster than plain CSV COPY in some runs and slower in "
                "others: the gap between the medians is within the run-to-run noise, and the "
                "protocol's own steps take well under 0.1 s per epoch (timed below)."
                if straddle
                else ""
            )
        )
    ps = [p for p in res.partitions if res.seconds("txsink", p) and res.seconds("jdbc", p)]
    if ps:
        ratios = ", ".join(f"{res.ratio('txsink', p, 'jdbc'):.2f}x at {p} partitions" for p in ps)
        jdbc_met = all(res.ratio("txsink", p, "jdbc") >= TARGETS["jdbc"] for p in ps)
        us = {w: _pg_us_per_row(res.of(w, first)) for w in WRITERS if res.seconds(w, first)}
        txc, jd = res.cpu("txsink", first), res.cpu("jdbc", first)
        cap = cpu_total("jdbc", first) / cpu_total("txsink", first)
        feed = res.cpu("feed", first)["spark"] if res.seconds("feed", first) else float("nan")
        python_side = txc["spark"] - feed
        out.append(
            f"**txsink vs Spark's JDBC writer**: {ratios}. Target >= {TARGETS['jdbc']}x: "
            f"{'met' if jdbc_met else 'NOT met'}. The JDBC writer sends batched multi-row INSERTs "
            f"(`batchsize={JDBC_BATCHSIZE}`, `reWriteBatchedInserts=true`), which the server "
            "parses and plans where COPY streams rows, but it skips the Python side entirely. "
            f"CPU per run at {first} partitions (Spark side / PostgreSQL): JDBC "
            f"{jd['spark']:.1f} / {jd['postgres']:.1f} s, txsink {txc['spark']:.1f} / "
            f"{txc['postgres']:.1f} s, of which {feed:.1f} s is Spark handing the rows to "
            f"Python as Arrow (the feed row) and {python_side:.1f} s the Python side (casts, "
            "pgpq encoding, psycopg). With Spark and PostgreSQL sharing 2 "
            "cores, both writers are CPU-bound, so the wall-time ratio is capped near the "
            f"ratio of total CPU, {cap:.1f}x here"
            + (f", below the {TARGETS['jdbc']}x target" if cap < TARGETS["jdbc"] else "")
            + ". PostgreSQL's own CPU per row is "
            f"{jd['postgres'] / txc['postgres']:.1f}x lower for txsink's binary COPY than for "
            "the JDBC writer's INSERTs, which bounds txsink's lead where the database has cores "
            "of its own and is the bottleneck (a setup not measured here)."
        )
        out.append(
            f"**Server CPU per row** at {first} partitions (the limit on a real, single "
            "database node): "
            + ", ".join(f"{LABELS[w]} {v:.2f} µs" for w, v in us.items())
            + ". Binary COPY spares the server the text parsing of every value (numbers, "
            "timestamps, numerics) that CSV COPY and INSERTs need."
        )
    for p in res.partitions:
        if not res.seconds("txsink", p):
            continue
        ph = res.phases(p)
        total = _bench.median(res.seconds("txsink", p))
        fixed = total - ph["precommit"]
        out.append(
            f"**Where txsink's time goes at {p} partitions**: {total:.2f} s in all, "
            f"{ph['precommit']:.2f} s ({ph['precommit'] / total:.0%}) in the pre-commit job "
            f"(COPY + PREPARE in the tasks), {fixed:.2f} s outside it (check + schema "
            f"{ph['other']:.3f} s, recover {ph['recover']:.3f} s, decide {ph['decide']:.3f} s, "
            f"commit {ph['commit']:.3f} s for {p} COMMIT PREPARED + the leftover scan)."
        )
        pr = res.profiles.get(p)
        if pr:
            out.append(
                f"Inside the tasks at {p} partitions (profile run, {pr['tasks']:.0f} tasks): "
                f"{pr['write'] / pr['span']:.0%} of task time is casting, encoding + COPY, "
                f"{pr['prepare'] / pr['span']:.1%} finishing the COPY + progress row + PREPARE "
                f"(at most {pr['prepare_max'] * 1000:.0f} ms in one task), "
                f"{pr['begin'] / pr['span']:.1%} connecting, {pr['feed'] / pr['span']:.0%} "
                "waiting for the next batch (the JVM produces batches concurrently, on the "
                "same 2 cores)."
            )
    if res.tpc:
        t = res.tpc
        out.append(
            f"**2PC's fixed cost** (one-row transaction, median of 30): COMMIT "
            f"{t['commit_ms']:.1f} ms, against PREPARE TRANSACTION {t['prepare_ms']:.1f} ms "
            f"in the task + COMMIT PREPARED {t['commit_prepared_ms']:.1f} ms on the driver "
            f"(serial, one per partition). At {res.rows // max(res.partitions):,} rows per "
            "partition that is noise next to the COPY; it matters for small micro-batches "
            "split into many partitions."
        )
    for p, e in sorted(res.epochs.items()):
        driver = e.get("phase_decide", 0) + e.get("phase_commit", 0)
        overlap = e["txsink_min"] <= e["copy_max"] and e["copy_min"] <= e["txsink_max"]
        out.append(
            f"**Small epochs** ({res.epoch_rows:,} rows in {p} partitions; one Coordinator "
            "writing epoch after epoch as a streaming query does; median of "
            f"{e['epochs']:.0f}): txsink {e['txsink'] * 1000:.0f} ms per epoch (single epochs "
            f"{e['txsink_min'] * 1000:.0f}-{e['txsink_max'] * 1000:.0f}), plain CSV COPY "
            f"{e['copy'] * 1000:.0f} ms ({e['copy_min'] * 1000:.0f}-"
            f"{e['copy_max'] * 1000:.0f}). The protocol's driver steps after the Spark job "
            f"(decision record, {p} COMMIT PREPARED, committed mark, leftover scan) take "
            f"{driver * 1000:.0f} ms per epoch; the rest of the difference is the round claim "
            "and PREPARE + progress row in the tasks"
            + (", and within the epoch-to-epoch noise here." if overlap else ".")
        )
    if res.single:
        s = res.single
        out.append(
            f"**Without Spark**, one connection COPYs pre-encoded CSV at "
            f"{_bench.fmt_rate(s['copy_rows_per_s'])} rows/s ({s['csv_mb']:.0f} MB of CSV) and "
            f"pre-encoded binary at {_bench.fmt_rate(s['binary_copy_rows_per_s'])} rows/s "
            f"({s['binary_mb']:.0f} MB); pyarrow encodes CSV at "
            f"{_bench.fmt_rate(s['encode_rows_per_s'])} rows/s and pgpq binary at "
            f"{_bench.fmt_rate(s['binary_encode_rows_per_s'])} rows/s on one core. On 2 cores "
            "the Spark JVM (reading the cache, converting to Arrow), the Python workers "
            "(encoding) and the PostgreSQL backends (reading COPY) share the CPU."
        )
    if res.wide:
        narrow = [
            p for p in res.partitions if p == res.wide_partitions and res.seconds("txsink", p)
        ]
        wide_rate = _wide_rate(res, "txsink")
        wide_bytes = _bytes_per_row([m for m in res.wide if m.writer == "txsink"])
        text = (
            f"**The wide table** ({res.wide_rows:,} rows, {res.wide_partitions} partitions; the "
            "order line plus a 32-byte `bytea`, a `text[]` of two and a `jsonb` object): "
            f"txsink at {wide_rate / _wide_rate(res, 'binary'):.2f}x plain binary COPY and "
            f"{wide_rate / _wide_rate(res, 'jdbc'):.2f}x Spark's JDBC writer; with the nested "
            "column as a Spark struct that txsink turns into JSON itself (value by value in "
            f"Python), {_wide_rate(res, 'txsink_struct') / wide_rate:.2f}x the rate with JSON "
            "text from Spark."
        )
        if narrow:
            p = narrow[0]
            narrow_bytes = _bytes_per_row(res.of("txsink", p))
            per_byte = (wide_rate * wide_bytes) / (res.rate("txsink", p) * narrow_bytes)
            text += (
                f" Per byte of table written ({wide_bytes:.0f} vs {narrow_bytes:.0f} bytes a "
                f"row) the wide table runs at {per_byte:.2f}x the narrow one's rate "
                "(target >= 0.9x)"
                + (
                    f"; rows of {res.wide_rows:,} and {res.rows:,} differ in fixed costs"
                    if res.wide_rows != res.rows
                    else ""
                )
                + "."
            )
        out.append(text)
    lo, hi = min(res.partitions), max(res.partitions)
    if hi > lo and res.seconds("txsink", lo) and res.seconds("txsink", hi):
        cpu_lo, cpu_hi = cpu_total("txsink", lo), cpu_total("txsink", hi)
        others_lo, others_hi = res.cpu("txsink", lo)["others"], res.cpu("txsink", hi)["others"]
        same = abs(cpu_hi - cpu_lo) <= 0.1 * cpu_lo
        speed = res.rate("txsink", hi) / res.rate("txsink", lo)
        if 0.9 <= speed <= 1.1:
            tail = "; the rates here are the same within 10%."
        elif same:
            tail = "; with the same CPU per run, the difference in wall time is the other jobs'."
        else:
            tail = f"; here they cost {cpu_hi / cpu_lo - 1:+.0%} CPU."
        out.append(
            f"**Partitions**: txsink's rate at {hi} partitions was {speed:.2f}x its rate at "
            f"{lo}, with {cpu_hi:.1f} vs {cpu_lo:.1f} CPU-s per run, while other jobs on the "
            f"machine used {others_hi:.1f} vs {others_lo:.1f} CPU-s (the *other* column). "
            "`local[2]` runs 2 tasks at a time whatever the partition count, so more "
            "partitions add waves of the same work (and connections, PREPAREs, COMMIT "
            "PREPAREDs), not parallelism" + tail
        )
    return out


def render(res: Results) -> str:
    v, mach = res.versions, res.machine
    load_note = (
        "The load average counts the benchmark itself (it keeps both cores busy); the *other* "
        "CPU column below is what other jobs took during each run."
    )
    parts = [
        *_bench.header(res, "PostgreSQL", load_note),
        f"- Versions: PySpark {v['pyspark']} (`local[2]`, {mach['java']}), Python "
        f"{mach['python']}, pyarrow {v['pyarrow']}, psycopg {v['psycopg']} (libpq "
        f"{v['libpq']}), PostgreSQL {v['postgres']} (local, {v['settings']}), PostgreSQL "
        f"JDBC driver {v['jdbc']}.",
        f"- Data: {res.rows:,} rows of an order line (`{_ddl(COLUMNS)}`), generated in Spark "
        "from `spark.range`, repartitioned and cached before any timing. Each writer writes "
        "into its own fresh table (no indexes) that is dropped after its output is verified "
        "(count, distinct ids, column aggregates equal to the source's).",
        '- Writers: **txsink** `Coordinator([PostgresSink(mode="append")]).write(df, '
        "epoch=0)`, the full protocol (Arrow casts to the table's types, pgpq binary COPY + "
        "PREPARE in each task, decision in the log, COMMIT PREPARED from the driver); **txsink "
        'upsert** the same with `mode="upsert", key=["id"]` into a table with that primary key '
        "(the epoch repartitioned by the key, binary COPY into a stage table per task, "
        "`INSERT ... ON CONFLICT` at prepare); **plain "
        "CSV COPY** pyarrow's CSV into COPY from `mapInArrow` tasks in ordinary transactions "
        "(the path txsink took before); **plain binary COPY** pgpq's encoding of the batches "
        'as they are, the same way; **Spark JDBC** `df.write.jdbc(mode="append")` with '
        f"`batchsize={JDBC_BATCHSIZE}` and `reWriteBatchedInserts=true` in the URL (the "
        "strongest common setting); **psycopg executemany** `INSERT` per Arrow batch in one "
        "transaction per task (psycopg 3 pipelines `executemany`). The feed row is Spark "
        "alone: tasks that receive the batches and write nothing.",
        f"- Times are wall-clock per run, {res.repeat} run(s) each, after an untimed warm-up "
        "run of every writer; rows/s uses the median. txsink and plain CSV COPY swap order every "
        "other run. *CPU s* are CPU seconds used during the run (median) by this benchmark's "
        "process tree (driver, Spark JVM, Python workers), by the PostgreSQL server's process "
        "tree, and by everything else on the machine (other jobs).",
        *_bench.blocks(throughput_table(res), target_table(res), title="Throughput"),
    ]
    if any(res.seconds("txsink", p) for p in res.partitions):
        parts += _bench.blocks(
            "Driver phases (`EpochResult.seconds`, median; *check + schema* is the rest of "
            "the wall time: the sink's start-up checks and the Arrow schema):",
            _bench.phase_table(res),
            title="Where txsink's time goes",
        )
    if res.profiles:
        parts += _bench.blocks(
            "Inside the tasks (one extra, untimed run with a subclass of PostgresSink that "
            "times its hooks; seconds summed over tasks, 2 run at a time; *waiting for "
            "batches* is the task's time between its first batch and the end of PREPARE spent "
            "outside the sink):",
            profile_table(res),
        )
    if res.wide:
        parts += _bench.blocks(
            "Each writer into a fresh table of the wide columns (verified: counts, column "
            "aggregates, bytea bytes, array elements, a JSON field summed):",
            wide_table(res),
            title="The wide table (bytea, text[], jsonb)",
        )
    parts += _bench.bullets("Reading", reading(res))
    return "\n".join(parts) + "\n"


# -- main -------------------------------------------------------------------------------------


def _versions(bench: Bench) -> dict[str, str]:
    import psycopg
    import pyspark

    with bench.connect() as conn:
        server = conn.execute("SHOW server_version").fetchone()
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()
            for name in ("fsync", "synchronous_commit", "shared_buffers", "max_wal_size")
        }
    pq = psycopg.pq.version()
    return {
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
        "psycopg": psycopg.__version__,
        "libpq": f"{pq // 10000}.{pq % 10000}",
        "postgres": str(server[0]).split()[0] if server else "?",
        "settings": ", ".join(f"{k} {v[0] if v else '?'}" for k, v in settings.items()),
        "jdbc": JDBC_DRIVER[2],
    }


def _postmaster(conn: Any) -> dict[str, int]:
    """``{"postgres": pid}`` of the server's postmaster if it runs on this machine."""
    row = conn.execute("SELECT pg_backend_pid(), host(inet_server_addr())").fetchone()
    if row is None or row[1] not in (None, "127.0.0.1", "::1"):
        return {}  # a remote server: its CPU is not ours to see
    try:
        backend = Path(f"/proc/{int(row[0])}")
        if backend.joinpath("comm").read_text().strip() != "postgres":
            return {}
        stat = backend.joinpath("stat").read_text()
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
    except (OSError, TypeError, ValueError, IndexError):
        return {}
    return {"postgres": ppid}


def _jdbc(dsn: str) -> tuple[str, dict[str, str]]:
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "localhost")
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or params.get("user") or "postgres")
    url = f"jdbc:postgresql://{host}:{port}/{dbname}?reWriteBatchedInserts=true"
    props = {"driver": "org.postgresql.Driver", "batchsize": str(JDBC_BATCHSIZE)}
    for key in ("user", "password"):
        if params.get(key):
            props[key] = str(params[key])
    return url, props


def parser() -> _bench.BenchParser:
    def options(parser: _bench.BenchParser) -> None:
        parser.add_argument(
            "--wide-rows",
            type=int,
            default=1_000_000,
            help="rows for the wide table (bytea, text[], jsonb; 0 skips it; default 1000000)",
        )

    return _bench.BenchParser(
        Results,
        __doc__,
        writers=WRITERS,
        server=_bench.Server("--dsn", "TXSINK_PG_DSN", "DSN"),
        extras="skip the profile run, the 2PC latency probe and the single-connection COPY",
        options=options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every writer at every partition count, then the extras, into ``res``; the void runs."""
    jars = [_bench.maven_jar(*JDBC_DRIVER)] if "jdbc" in args.writers else []
    spark = _bench.spark_session("txsink-bench-postgres", jars=jars)
    url, props = _jdbc(args.dsn)
    schema = f"txsink_bench_{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="txsink-bench-"))
    bench = Bench(spark, args.dsn, schema, url, props, workdir, _bench.CpuMeter({}))
    with bench.connect() as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        bench.cpu.roots = {"spark": os.getpid(), **_postmaster(conn)}
    try:
        res.versions = _versions(bench)
        warm = min(args.rows, 50_000)
        _bench.log(f"warm-up (untimed): each writer once on {warm:,} rows")
        df = make_frame(spark, warm, 2, COLUMNS)
        expected = spark_fingerprint(df)
        for writer in ("feed", *args.writers):
            measure(
                bench,
                writer,
                df,
                rows=warm,
                partitions=2,
                columns=COLUMNS,
                expected=expected,
                tag="warmup",
            )
        df.unpersist(blocking=True)
        for p in args.partitions:
            _bench.log(f"generating {args.rows:,} rows in {p} partitions")
            df = make_frame(spark, args.rows, p, COLUMNS)
            expected = spark_fingerprint(df)
            common: dict[str, Any] = {
                "rows": args.rows,
                "partitions": p,
                "columns": COLUMNS,
                "expected": expected,
            }
            for rep in range(args.repeat):
                res.runs.append(measure(bench, "feed", df, tag=f"p{p}_r{rep}", **common))
                for writer in _bench.swap_on_odd(args.writers, rep, "txsink", "copy"):
                    res.runs.append(measure(bench, writer, df, tag=f"p{p}_r{rep}", **common))
            if not args.no_extras and "txsink" in args.writers:
                _bench.log(f"profile run P={p}")
                res.profiles[p] = profile_tasks(bench, df, tag=f"p{p}_profile", **common)
            if not args.no_extras and p == args.partitions[0]:
                _bench.log("single-connection COPY and CSV encoding (no Spark)")
                res.single = single_connection(bench, df, COLUMNS)
            df.unpersist(blocking=True)
        if not args.no_extras:
            _bench.log("PREPARE / COMMIT PREPARED latency")
            res.tpc = tpc_latency(bench)
            res.epoch_rows = min(args.rows, 10_000)
            for p in sorted({args.partitions[0], max(args.partitions)}):
                df = make_frame(spark, res.epoch_rows, p, COLUMNS)
                res.epochs[p] = epoch_overhead(bench, df, res.epoch_rows, p)
                df.unpersist(blocking=True)
        if args.wide_rows > 0:
            res.wide_rows = args.wide_rows
            res.wide_partitions = p = args.partitions[0]
            _bench.log(f"the wide table: {args.wide_rows:,} rows in {p} partitions")
            frames = {
                "json": make_frame(spark, args.wide_rows, p, WIDE_COLUMNS),
                "struct": make_frame(spark, args.wide_rows, p, WIDE_STRUCT_COLUMNS),
            }
            expected = spark_fingerprint(frames["json"])
            writers = [w for w in WIDE_WRITERS if w.startswith("txsink") or w in args.writers]
            # Untimed, on the first rows: the Python workers meet the wide schema once.
            warm = min(args.wide_rows, 50_000)
            for writer in writers:
                columns = WIDE_STRUCT_COLUMNS if writer == "txsink_struct" else WIDE_COLUMNS
                df = make_frame(spark, warm, p, columns)
                measure(
                    bench,
                    writer,
                    df,
                    rows=warm,
                    partitions=p,
                    columns=columns,
                    expected=spark_fingerprint(df),
                    tag="wide_warmup",
                )
                df.unpersist(blocking=True)
            for rep in range(args.repeat):
                for writer in _bench.swap_on_odd(writers, rep, "txsink", "binary"):
                    struct = writer == "txsink_struct"
                    m = measure(
                        bench,
                        writer,
                        frames["struct" if struct else "json"],
                        rows=args.wide_rows,
                        partitions=p,
                        columns=WIDE_STRUCT_COLUMNS if struct else WIDE_COLUMNS,
                        expected=expected,
                        tag=f"wide_r{rep}",
                    )
                    res.wide.append(m)
            for df in frames.values():
                df.unpersist(blocking=True)
    finally:
        with bench.connect() as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        spark.stop()
    return bench.void


if __name__ == "__main__":
    sys.exit(main())
