"""Timing one writer of the Postgres benchmark into a fresh table, verifying what psycopg
reads back there, voiding the run if it is wrong; and one untimed profile run of txsink."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import _bench

from .context import Bench
from .jdbc import write_jdbc
from .plain import write_binary, write_copy, write_executemany
from .tables import COLUMNS, FINGERPRINT_PG, column_names, ddl, run_feed, wide_expected
from .txsink_writer import write_txsink


def drop_staging_tables(conn: Any, schema: str) -> None:
    """Drop the staging tables (``txsink_staging_*``) in ``schema``: one per sink uid, and
    every run of the benchmark has its own uid."""
    from psycopg import sql

    found = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname LIKE 'txsink\\_staging\\_%%'",
        (schema,),
    ).fetchall()
    for (name,) in found:
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(schema, name)))


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
    names = column_names(columns)
    with bench.connect() as conn:
        key = ", PRIMARY KEY (id)" if writer == "upsert" else ""
        conn.execute(f"CREATE TABLE {bench.qualified(table)} ({ddl(columns)}{key})")
    wide = len(columns) > len(COLUMNS)
    writers: dict[str, Callable[[], dict[str, Any]]] = {
        "txsink": lambda: write_txsink(bench, df, table, profile_dir),
        "staging": lambda: write_txsink(bench, df, table, commit="staging"),
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
            if writer == "staging":  # its staging table, emptied by the commit
                drop_staging_tables(conn, bench.schema)
    extra = m.extra
    problems = []
    if writer == "feed" and extra["task_rows"] != rows:
        problems.append(f"the feed job saw {extra['task_rows']} rows")
    problems += _bench.output_problems(found, expected, rows)
    if wide and extra["wide_check"] != wide_expected(rows):
        problems.append(f"wide columns differ: {extra['wide_check']} != {wide_expected(rows)}")
    if extra.get("lingering", 0):
        problems.append(f"{extra['lingering']} prepared transactions or staged names left behind")
    _bench.void_if(problems, m, tag, bench.void)
    _bench.log_run(m, tag, width=12)
    return m


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
