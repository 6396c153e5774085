"""The Data Source path next to ``foreachBatch(Coordinator)``: start-up, per-epoch time and
CPU per epoch by role on small epochs, both paths in one Spark session.

    integration/benchmarks/run datasource [--epochs 12] [--rows 200] [--repeat 5]
                                          [--connector files|postgres] [--feed same|defaults]

Each query streams the same input (``--epochs`` Parquet files of ``--rows`` rows, one file
per epoch, ``trigger(availableNow=True)``) into its own fresh target and txsink log: through
``foreachBatch(Coordinator([sink]))`` and through ``writeStream.format("txsink")`` with the
same sink options. Every repeat runs both paths, the order alternating, after untimed
queries of both (``--warmup``). A ``StreamingQueryListener`` (``_bench.epochs``) takes the
time and a CPU snapshot at each epoch's end: "start-up" is from ``start()`` to the end of
the first epoch; the per-epoch figures (Spark's ``triggerExecution``, CPU by role) cover
the later epochs. The Data Source path's planning and commit run in Python workers the JVM
starts on the driver: the CPU tables show them as their own role. Each target is read
back: the rows must be exact (and, on PostgreSQL, no prepared transaction left).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    from benchmarks import _bench
    from benchmarks._bench import epochs as metered
    from benchmarks._datasource_report import WRITERS, Results, render
except ImportError:  # run as a plain script: python integration/benchmarks/datasource.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench
    from benchmarks._bench import epochs as metered
    from benchmarks._datasource_report import WRITERS, Results, render

from txsink import Coordinator
from txsink.datasource import register
from txsink.testing.inputs import INPUT_SCHEMA, make_input

#: A target: the ``format("txsink")`` options, and what reading it back found wrong ([]:
#: nothing), which also removes it.
Target = tuple[dict[str, str], Callable[[int], list[str]]]


def _files_target(folder: Path, uid: str) -> Target:
    import pyarrow.compute as pc

    from txsink.connectors.files import read_committed

    path = folder / f"out-{uid}"

    def check(rows: int) -> list[str]:
        table = read_committed(path)
        found = (table.num_rows, pc.count_distinct(table["id"]).as_py())
        shutil.rmtree(path, ignore_errors=True)
        return [] if found == (rows, rows) else [f"read back {found[0]} rows, {found[1]} ids"]

    return {"connector": "files", "path": str(path), "uid": uid}, check


def _postgres_target(dsn: str, uid: str) -> Target:
    import psycopg
    from psycopg import sql

    schema = sql.Identifier(f"bench_{uid}")
    table = sql.SQL("{}.t").format(schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (id bigint, key text, amount double precision, payload text)"
            ).format(table)
        )

    def check(rows: int) -> list[str]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            got = conn.execute(sql.SQL("SELECT count(*), count(DISTINCT id) FROM {}").format(table))
            count, ids = got.fetchone() or (0, 0)
            prepared = conn.execute(
                "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()"
            ).fetchone()
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(schema))
        problems = [] if (count, ids) == (rows, rows) else [f"read back {count} rows, {ids} ids"]
        lingering = prepared[0] if prepared else 0
        return problems + ([f"{lingering} prepared transaction(s) left"] if lingering else [])

    qualified = f"bench_{uid}.t"  # the option's value: uid is [a-z0-9_] only
    return {"connector": "postgres", "dsn": dsn, "table": qualified, "uid": uid}, check


def _sink(options: dict[str, str]) -> Any:
    """The sink ``format("txsink")`` builds from these options, for the foreachBatch path."""
    from txsink.datasource.options import parse_options

    return parse_options({**options, "log": "unused"}).sink


def _start(spark: Any, writer: str, inputs: Path, options: dict[str, str], p: int,
           folder: Path, name: str) -> Any:  # fmt: skip
    stream = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inputs))
        .repartition(p)
    )
    log = str(folder / f"log-{name}")  # name: the query's, the listener's key
    out = stream.writeStream.queryName(name).trigger(availableNow=True)
    out = out.option("checkpointLocation", str(folder / f"ckpt-{name}"))
    if writer == "foreachBatch":
        return out.foreachBatch(Coordinator([_sink(options)], log=log)).start()
    return out.format("txsink").options(**options).option("log", log).start()


class Bench:
    """What every query of a run shares: the session, the meter, the listener's meters."""

    def __init__(self, spark: Any, args: argparse.Namespace, folder: Path) -> None:
        servers = _bench.server_pids(["postgres"]) if args.connector == "postgres" else {}
        self.spark, self.args, self.folder = spark, args, folder
        self.cpu = _bench.CpuMeter({"spark": os.getpid(), **servers})
        self.meters: dict[str, metered.Meter] = {}
        spark.streams.addListener(metered.listener(self.cpu, self.meters))
        self.inputs = folder / "input"
        make_input(self.inputs, args.rows * args.epochs, args.epochs)

    def target(self, uid: str) -> Target:
        if self.args.connector == "postgres":
            return _postgres_target(self.args.dsn, uid)
        return _files_target(self.folder, uid)

    def query(self, writer: str, p: int, tag: str) -> _bench.Measurement:
        """One query of ``writer``: run it to its end, read its target back; its
        measurement (void, with the reason, if anything was wrong)."""
        args = self.args
        uid = f"{'fb' if writer == 'foreachBatch' else 'ds'}_{tag}_{uuid.uuid4().hex[:6]}"
        options, check = self.target(uid)
        meter = metered.Meter(f"bench-ds-{uid}")
        self.meters[meter.name] = meter
        problems: list[str] = []
        load_before = _bench.load1()
        before = self.cpu.snapshot()
        t0 = time.perf_counter()
        try:
            query = _start(self.spark, writer, self.inputs, options, p, self.folder, meter.name)
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            if not meter.wait_for(args.epochs - 1):
                problems.append(f"epochs missing from the listener: saw {sorted(meter.epochs)}")
            problems += check(args.rows * args.epochs)
        except Exception as err:  # a path that fails is void; the other still runs
            problems.append(f"failed: {_bench.first_line(err)}")
        m = measurement(writer, p, args.rows, args.epochs, meter, (t0, before, load_before))
        if m.rows != args.rows * (args.epochs - 1) and not problems:
            problems.append(f"the epochs after the first held {m.rows} rows")
        _bench.void_if(problems, m, tag, [])
        _bench.log_run(m, tag, width=12, tail=f"  start {m.extra.get('start_s', 0):.2f} s")
        return m


def measurement(
    writer: str,
    p: int,
    rows: int,
    epochs: int,
    meter: metered.Meter,
    started: tuple[float, dict[str, float], float],
) -> _bench.Measurement:
    """The query's measurement: the window from the end of the first epoch to the end of
    the last (rows, seconds, CPU by role, each epoch's ``triggerExecution``) and the
    start-up (``started``: the clock, CPU snapshot and load just before ``start()``) to
    the end of the first epoch. Epochs the listener missed leave an empty measurement."""
    t0, cpu0, load_before = started
    first, last = meter.epochs.get(0), meter.epochs.get(epochs - 1)
    window = [meter.epochs.get(b) for b in range(1, epochs)]
    if first is None or last is None or any(e is None for e in window):
        return _bench.Measurement(writer, p, 0, float("nan"), load_before, _bench.load1(),
                                  {"cpu": {}})  # fmt: skip
    done = [e for e in window if e is not None]
    extra: dict[str, Any] = {
        "cpu": _bench.CpuMeter.delta(first.cpu, last.cpu),
        "start_cpu": _bench.CpuMeter.delta(cpu0, first.cpu),
        "start_s": first.at - t0,
        "first_epoch_s": first.trigger_s,
        "epochs_s": [e.trigger_s for e in done],
    }
    seconds = last.at - first.at
    return _bench.Measurement(writer, p, sum(e.rows for e in done), seconds, load_before,
                              _bench.load1(), extra)  # fmt: skip


def parser() -> _bench.BenchParser:
    def options(p: _bench.BenchParser) -> None:
        p.add_count("--epochs", 12, "epochs per query, the first one the start-up (default 12)")
        p.add_argument(
            "--connector",
            choices=("files", "postgres"),
            default="files",
            help="the sink: files on local disk (default), or PostgreSQL (TXSINK_PG_DSN or "
            "--dsn; integration/benchmarks/run starts it); each has its own section",
        )

    return _bench.BenchParser(
        Results,
        __doc__,
        writers=WRITERS,
        server=_bench.Server("--dsn", "TXSINK_PG_DSN", "DSN", required=False),
        unit="rows per epoch",
        rows=200,
        partitions="Spark partitions of the stream",
        partitions_default="2",
        options=options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every repeat runs both paths at every partition count (the order alternating)."""
    import pyspark

    if args.epochs < 2:
        raise SystemExit("--epochs must be at least 2: the first epoch is the start-up")
    if args.connector == "postgres" and not args.dsn:
        raise SystemExit("--connector postgres needs a DSN: set TXSINK_PG_DSN or --dsn")
    res.epoch_rows, res.rows = args.rows, args.rows * (args.epochs - 1)
    res.versions = {"pyspark": pyspark.__version__}
    if args.connector == "postgres":
        import psycopg

        res.versions["psycopg"] = psycopg.__version__
    spark = _bench.spark_session(
        "txsink-bench-datasource", feed=args.feed, slots=max(2, *args.partitions)
    )
    register(spark)
    folder = Path(tempfile.mkdtemp(prefix="txsink-bench-ds-"))
    void: list[str] = []
    try:
        bench = Bench(spark, args, folder)
        for p in args.partitions:
            for i in range(args.warmup):
                for writer in args.writers:
                    m = bench.query(writer, p, f"p{p}w{i}")
                    void += [m.extra["void"]] if "void" in m.extra else []
            for rep in range(args.repeat):
                for writer in _bench.swap_on_odd(args.writers, rep, *WRITERS):
                    m = bench.query(writer, p, f"p{p}r{rep}")
                    res.runs.append(m)
                    void += [m.extra["void"]] if "void" in m.extra else []
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return void


if __name__ == "__main__":
    sys.exit(main())
