"""The Postgres benchmark's command line and run: every writer at every partition count,
then the extras and the wide table (``integration/benchmarks/run postgres --help``)."""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchmarks.postgres
import pyarrow as pa
from benchmarks import _bench

from .context import Bench
from .extras import epoch_overhead, single_connection, tpc_latency
from .jdbc import JDBC_DRIVER, jdbc_url
from .measure import measure, profile_tasks
from .reading import render
from .report import WIDE_WRITERS, WRITERS, Results
from .tables import COLUMNS, WIDE_COLUMNS, WIDE_STRUCT_COLUMNS, make_frame, spark_fingerprint


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
        benchmarks.postgres.__doc__,
        writers=WRITERS,
        server=_bench.Server("--dsn", "TXSINK_PG_DSN", "DSN"),
        extras="skip the profile run, the 2PC latency probe and the single-connection COPY",
        options=options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def session(args: argparse.Namespace) -> Any:
    """The one Spark session every writer of the run shares: its settings are here and in
    ``_bench.spark_session``, nowhere else."""
    _bench.pickle_by_value("benchmarks.postgres")  # the task code of this package
    jars = [_bench.maven_jar(*JDBC_DRIVER)] if "jdbc" in args.writers else []
    return _bench.spark_session("txsink-bench-postgres", feed=args.feed, jars=jars)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every writer at every partition count, then the extras, into ``res``; the void runs."""
    spark = session(args)
    url, props = jdbc_url(args.dsn)
    schema = f"txsink_bench_{uuid.uuid4().hex[:8]}"
    workdir = Path(tempfile.mkdtemp(prefix="txsink-bench-"))
    bench = Bench(spark, args.dsn, schema, url, props, workdir, _bench.CpuMeter({}))
    with bench.connect() as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        bench.cpu.roots = {"spark": os.getpid(), **_postmaster(conn)}
    try:
        res.versions = _versions(bench)
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
            for i in range(args.warmup if p == args.partitions[0] else 0):
                _bench.log(f"warm-up {i + 1} (untimed): every writer once, full size")
                for writer in ("feed", *args.writers):
                    measure(bench, writer, df, tag=f"p{p}_warm{i}", **common)
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
            # Untimed, full size: the Python workers meet the wide schema, the JIT its code.
            warm = args.wide_rows
            for writer in writers if args.warmup else ():
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
