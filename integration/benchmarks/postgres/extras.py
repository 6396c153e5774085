"""Where the time goes, beyond the throughput table: small epochs as a stream runs them,
the fixed cost of 2PC (PREPARE / COMMIT PREPARED), and one connection without Spark."""

from __future__ import annotations

import io
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Any, Literal

import pyarrow.csv as pacsv
from benchmarks import _bench

from txsink import Coordinator
from txsink.connectors.postgres.sink import PostgresSink

from .context import Bench
from .plain import write_copy
from .tables import COLUMNS, column_names, ddl


def epoch_overhead(
    bench: Bench, df: Any, rows: int, partitions: int, epochs: int = 9
) -> dict[str, float]:
    """Small epochs as a streaming query runs them: one Coordinator per commit (two-phase,
    ``txsink``; staging, ``staging``) writing epoch after epoch into its own table (start-up
    check and recovery only before the first), against plain COPY of the same rows into
    another table. Medians over ``epochs`` (the first one excluded); ``<commit>_phase_<p>``:
    the median seconds of each protocol phase (the staging commit's driver-side move is
    its ``commit`` phase)."""
    commits: dict[str, Literal["2pc", "staging"]] = {"txsink": "2pc", "staging": "staging"}
    tables = {name: f"epochs_{name}_p{partitions}" for name in (*commits, "copy")}
    with bench.connect() as conn:
        for table in tables.values():
            conn.execute(f"CREATE TABLE {bench.qualified(table)} ({ddl(COLUMNS)})")
    times: dict[str, list[float]] = {name: [] for name in tables}
    phases: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(dir=bench.workdir) as log:
            coordinators = {
                name: Coordinator(
                    [
                        PostgresSink(
                            bench.dsn,
                            bench.qualified(tables[name]),
                            tables[name].replace("_", "-"),
                            commit=commit,
                        )
                    ],
                    log=f"{log}/{name}",
                    app_id="bench",
                )
                for name, commit in commits.items()
            }
            for epoch in range(epochs + 1):
                took: dict[str, float] = {}
                for name, coordinator in coordinators.items():
                    with _bench.stopwatch() as t:
                        result = coordinator.write(df, epoch=epoch)
                    took[name] = t[0]
                    if epoch:
                        for phase, secs in result.seconds.items():
                            phases.setdefault(f"{name}_phase_{phase}", []).append(secs)
                with _bench.stopwatch() as c:
                    write_copy(bench, df, tables["copy"], column_names(COLUMNS))
                took["copy"] = c[0]
                if epoch == 0:
                    continue  # the first pays the start-up check and recovery
                for name, secs in took.items():
                    times[name].append(secs)
        with bench.connect() as conn:
            for table in tables.values():
                row = conn.execute(
                    f"SELECT count(*), count(DISTINCT id) FROM {bench.qualified(table)}"
                ).fetchone()
                if row is None or tuple(row) != ((epochs + 1) * rows, rows):
                    bench.void.append(f"VOID epoch overhead: {table} holds {row}")
    finally:
        with bench.connect() as conn:
            for table in tables.values():
                conn.execute(f"DROP TABLE IF EXISTS {bench.qualified(table)}")
    out: dict[str, float] = {"epochs": float(len(times["copy"]))}
    for name, spans in times.items():
        out.update(
            {name: _bench.median(spans), f"{name}_min": min(spans), f"{name}_max": max(spans)}
        )
    out.update({k: _bench.median(v) for k, v in phases.items()})
    _bench.log(
        f"epochs of {rows:,} rows, P={partitions}: 2PC {out['txsink'] * 1000:.0f} ms, staging "
        f"{out['staging'] * 1000:.0f} ms, plain COPY {out['copy'] * 1000:.0f} ms "
        f"(medians of {epochs})"
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
        conn.execute(f"CREATE TABLE {table} ({ddl(columns)})")
    try:
        import psycopg

        t0 = time.perf_counter()
        statement = f"COPY {table} ({column_names(columns)}) FROM STDIN (FORMAT CSV)"
        with psycopg.connect(bench.dsn) as conn, conn.cursor() as cur, cur.copy(statement) as cp:
            for chunk in chunks:
                cp.write(chunk)
        copy_secs = time.perf_counter() - t0
        with bench.connect() as conn:
            conn.execute(f"TRUNCATE {table}")
        t0 = time.perf_counter()
        statement = f"COPY {table} ({column_names(columns)}) FROM STDIN (FORMAT BINARY)"
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
