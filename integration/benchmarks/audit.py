"""The cost of the row digest (issue #42): every pre-commit digests the rows it hands the
sinks; ``TXSINK_ROW_DIGEST=off`` in the Python workers' environment turns it off.

    integration/benchmarks/run audit [--rows 500000] [--epochs 10] [--repeat 1]
                                     [--partitions 2] [--feed same|defaults]
                                     [--connector files|postgres] [--column-rows 1000000]

Epochs of a realistic mixed schema (bigint id, a 12-character string, a double, a
timestamp, a decimal(12,2), a short string category) into the files sink on local disk (the
cheapest target: the worst case for the digest's share), or with ``--connector postgres``
into PostgreSQL (``PostgresSink``, two-phase commit; a table per writer). Writers:
**digest** (the default), **off**, and **control**, a second *off*: what it differs from
*off* by is the method's own noise and bias (an A/A test), the scale to read the digest's
few per cent against. One ``Coordinator`` each, in one Spark session on one cached input
frame, taking turns epoch by epoch, each round's order rotated, after untimed warm-up
rounds.

The switch reaches the workers through ``SparkContext.environment``: PySpark sends it with
each Python function (``mapInArrow`` wraps txsink's task function anew for every epoch) and
the JVM keys its Python worker daemons by that environment; ``TXSINK_BENCH_WRITER`` set to
the writer's name gives each writer a daemon of its own. Every epoch's decision is read
back from the log: each handle of a *digest* epoch must carry ``evidence`` counting the
epoch's rows, no handle of an *off* or *control* epoch any (the benchmark fails otherwise).
The pre-commit's seconds come from that decision (``stats["seconds"]["precommit"]``); the
epoch's from the harness's stopwatch.

After Spark, one Python process digests one batch of ``--column-rows`` values per column
type (the same types as the Spark run's) and writes it with ``pyarrow.parquet`` (what the
files sink does): CPU-seconds per million values, to estimate a schema's cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from benchmarks import _audit_columns, _bench
    from benchmarks._audit_report import OFF, WRITERS, Results, render
except ImportError:  # run as a plain script: python integration/benchmarks/audit.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _audit_columns, _bench
    from benchmarks._audit_report import OFF, WRITERS, Results, render

from txsink import Coordinator
from txsink.connectors.files import FilesSink
from txsink.connectors.files.testing import verify_files
from txsink.protocol.log import open_log
from txsink.protocol.task import DIGEST_ENV

#: The input: Spark SQL over ``spark.range``'s id (``_audit_columns`` builds the same
#: values in Arrow, with the types Spark hands the workers).
COLUMNS = [
    "id",
    "concat('user-', lpad(cast(id % 10000000 AS string), 7, '0')) AS name",
    "cast(id AS double) * 0.37 AS amount",
    "timestamp_seconds(1700000000 + id) AS ts",
    "cast((id % 10000000) / 100 AS decimal(12,2)) AS price",
    "element_at(array('books', 'games', 'food', 'tools', 'toys'), "
    "cast(id % 5 AS int) + 1) AS category",
]
#: Set to the writer's name in its epochs' Python workers: each writer has a daemon (and
#: workers) of its own, as the JVM keys daemons by their environment.
WRITER_ENV = "TXSINK_BENCH_WRITER"
#: The PostgreSQL table of ``--connector postgres`` (in a schema of its own per writer).
PG_TABLE = (
    "CREATE TABLE {}.t (id bigint, name text, amount double precision, ts timestamptz, "
    "price numeric(12,2), category text)"
)


def parser() -> _bench.BenchParser:
    def options(p: _bench.BenchParser) -> None:
        p.add_count("--epochs", 10, "measured epochs per writer and series (default 10)")
        p.add_argument(
            "--connector",
            choices=("files", "postgres"),
            default="files",
            help="the sink: files on local disk (default), or PostgreSQL (TXSINK_PG_DSN or "
            "--dsn; integration/benchmarks/run starts it); each has its own section",
        )
        p.add_argument(
            "--column-rows",
            type=int,
            default=1_000_000,
            help="values per column type in the one-process table (default 1000000; 0: skip)",
        )

    return _bench.BenchParser(
        Results,
        __doc__,
        writers=WRITERS,
        server=_bench.Server("--dsn", "TXSINK_PG_DSN", "DSN", required=False),
        unit="rows per epoch",
        rows=500_000,
        partitions="Spark partitions per epoch (one run each)",
        partitions_default="2",
        options=options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """The rounds at every partition count, then the one-process table."""
    import pyarrow
    import pyspark

    if args.connector == "postgres" and not args.dsn:
        raise SystemExit("--connector postgres needs a DSN: set TXSINK_PG_DSN or --dsn")
    res.epoch_rows = args.rows
    res.rows = args.rows * args.epochs  # one measurement: a series of one writer
    res.versions = {"pyspark": pyspark.__version__, "pyarrow": pyarrow.__version__}
    if args.connector == "postgres":
        import psycopg

        res.versions["psycopg"] = psycopg.__version__
    spark = _bench.spark_session(
        "txsink-bench-audit", feed=args.feed, slots=max(2, *args.partitions)
    )
    servers = _bench.server_pids(["postgres"]) if args.connector == "postgres" else {}
    cpu = _bench.CpuMeter({"spark": os.getpid(), **servers})
    void: list[str] = []
    schema = None
    try:
        for p in args.partitions:
            df = _bench.cached_frame(spark, args.rows, p, COLUMNS)
            with tempfile.TemporaryDirectory(prefix="txsink-bench-audit-") as folder:
                void += _series(res, args, cpu, spark, df, p, Path(folder))
                schema = schema or _output_schema(Path(folder))
            df.unpersist(blocking=True)
    finally:
        spark.stop()
    if args.column_rows > 0:
        _bench.log(f"one process: {args.column_rows:,} values per column type")
        res.columns = _audit_columns.measure(args.column_rows, schema)
    return void


@dataclass
class _Series:
    """One writer's measured epochs of one series, as they come."""

    cpu: dict[str, float] = field(default_factory=dict)
    epochs_s: list[float] = field(default_factory=list)
    precommit_s: list[float] = field(default_factory=list)


def _series(res: Results, args: argparse.Namespace, cpu: _bench.CpuMeter, spark: Any, df: Any,
            p: int, folder: Path) -> list[str]:  # fmt: skip
    """The warm-up rounds, then ``--repeat`` series of ``--epochs`` rounds into ``res``;
    the void runs' messages (an output that is not exact voids its writer)."""
    names = [w for w in WRITERS if w in args.writers]
    targets = {w: _target(args, w, folder) for w in names}
    coordinators = {w: t[0] for w, t in targets.items()}
    try:
        epoch = _rounds(res, args, cpu, spark, df, p, folder, coordinators)
    finally:
        written = {w: t[1]() for w, t in targets.items()}  # read back (and dropped)
    void: list[str] = []
    for name in names:
        if written[name] != args.rows * epoch:
            message = (
                f"VOID {name} partitions={p}: read back {written[name]} rows, "
                f"not {args.rows * epoch}"
            )
            void.append(message)
            for m in res.of(name, p):
                m.extra["void"] = message
    return void


def _rounds(res: Results, args: argparse.Namespace, cpu: _bench.CpuMeter, spark: Any, df: Any,
            p: int, folder: Path, coordinators: dict[str, Coordinator]) -> int:  # fmt: skip
    """The warm-up and measured rounds; the number of epochs each writer wrote."""
    names = list(coordinators)
    write = functools.partial(_write, spark.sparkContext, df, args.rows)
    epoch = 0
    for _ in range(args.warmup):
        for name in names:
            write(coordinators[name], name, epoch, folder)
        epoch += 1
    for rep in range(args.repeat):
        runs = {w: _Series() for w in names}
        load_before = _bench.load1()
        for _ in range(args.epochs):
            for name in _bench.rotated(names, epoch):  # each writer takes each place in turn
                one = functools.partial(write, coordinators[name], name, epoch, folder)
                m = _bench.timed_run(cpu, name, p, args.rows, one)
                run = runs[name]
                for role, seconds in m.extra["cpu"].items():
                    run.cpu[role] = run.cpu.get(role, 0.0) + seconds
                run.epochs_s.append(m.seconds)
                run.precommit_s.append(m.extra["precommit_s"])
            epoch += 1
        for name, run in runs.items():
            rows, extra = args.rows * args.epochs, dataclasses.asdict(run)
            m = _bench.Measurement(
                name, p, rows, sum(run.epochs_s), load_before, _bench.load1(), extra
            )
            res.runs.append(m)
            _bench.log_run(
                m, f"p{p} series {rep}", width=6, tail=f"  precommit {sum(run.precommit_s):.2f} s"
            )
    return epoch


def _target(args: argparse.Namespace, name: str, folder: Path) -> tuple[Coordinator, Any]:
    """``name``'s coordinator (its log in ``folder``) and what reads its output back: the
    rows there (a PostgreSQL schema is dropped after)."""
    log, app_id = folder / f"{name}-log", f"audit-{name}-{os.getpid()}"
    if args.connector == "files":
        sink: Any = FilesSink(folder / name, uid=name)
        return Coordinator(
            [sink], log=log, app_id=app_id
        ), lambda: verify_files(folder / name, [], uid=name).rows_written
    import psycopg
    from psycopg import sql

    from txsink.connectors.postgres import PostgresSink

    schema = f"bench_audit_{name}_{os.getpid()}"
    ident = sql.Identifier(schema)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(sql.SQL(PG_TABLE).format(ident))

    def read_back() -> int:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            found = conn.execute(sql.SQL("SELECT count(*) FROM {}.t").format(ident)).fetchone()
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(ident))
        return int(found[0]) if found else -1

    sink = PostgresSink(args.dsn, f"{schema}.t", name)
    return Coordinator([sink], log=log, app_id=app_id), read_back


def _write(sc: Any, df: Any, rows: int, coordinator: Coordinator, name: str, epoch: int,
           folder: Path) -> dict[str, Any]:  # fmt: skip
    """One epoch of ``name``, the switch set for its tasks only; then its decision read
    back: the proof the switch took effect, and the pre-commit's seconds."""
    sc.environment[WRITER_ENV] = name  # a daemon per writer, the digest's own included
    if name in OFF:
        sc.environment[DIGEST_ENV] = "off"
    try:
        result = coordinator.write(df, epoch=epoch)
    finally:
        sc.environment.pop(DIGEST_ENV, None)
        sc.environment.pop(WRITER_ENV, None)
    if result.status != "committed":
        raise RuntimeError(f"{name} epoch {epoch} not committed: {result}")
    return {"precommit_s": _check_decision(folder / f"{name}-log", name, epoch, rows)}


def _check_decision(log: Path, name: str, epoch: int, rows: int) -> float:
    """Fail unless every handle of a *digest* epoch carries evidence counting the epoch's
    rows and no handle of an *off* or *control* epoch carries any; the decision's pre-commit
    seconds."""
    decision = open_log(log).decision(epoch)
    if decision is None:
        raise RuntimeError(f"{name} epoch {epoch}: no decision in {log}")
    docs = [doc for handles in decision.handles.values() for doc in handles]
    with_evidence = [doc["evidence"] for doc in docs if doc.get("evidence") is not None]
    if not docs:
        raise RuntimeError(f"{name} epoch {epoch}: the decision has no handle")
    if name in OFF and with_evidence:
        raise RuntimeError(
            f"{name} epoch {epoch}: {len(with_evidence)} of {len(docs)} handles carry evidence: "
            f"{DIGEST_ENV}=off did not reach the Python workers"
        )
    if name not in OFF:
        counted = sum(int(e["rows"]) for e in with_evidence)
        if len(with_evidence) != len(docs) or counted != rows:
            raise RuntimeError(
                f"digest epoch {epoch}: {len(with_evidence)} of {len(docs)} handles carry "
                f"evidence, counting {counted} rows of {rows}"
            )
    return float(decision.stats["seconds"]["precommit"])


def _output_schema(folder: Path) -> Any:
    """The Arrow schema the tasks handed the files sink (its Parquet files keep it), so the
    one-process table digests the types the Spark run did; None if no file is there."""
    import pyarrow.parquet as pq

    files = sorted(folder.rglob("*.parquet"))
    return pq.read_schema(files[0]) if files else None


if __name__ == "__main__":
    sys.exit(main())
