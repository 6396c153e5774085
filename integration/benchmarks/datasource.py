"""The Data Source path next to ``foreachBatch(Coordinator)``: start-up and per-epoch cost on
small epochs, side by side in one Spark session.

    integration/benchmarks/run datasource [--epochs 12] [--rows 200] [--connector files|postgres]

Each path streams the same input (``--epochs`` Parquet files of ``--rows`` rows, one file
per epoch) into its own fresh target and log, with ``trigger(availableNow=True)``, twice,
alternating which path goes first. "start" is the wall time from ``start()`` to the end of
the first epoch (the query's start, the first planning, the first Python workers); "epoch"
is the median and range of Spark's ``triggerExecution`` of the other epochs (Spark's own
per-batch time, planning and commit included). Each target is read back: rows must be exact.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from benchmarks import _bench
except ImportError:  # run as a plain script: python integration/benchmarks/datasource.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench

from txsink import Coordinator
from txsink.datasource import register
from txsink.spark.localspark import local_spark
from txsink.testing.inputs import INPUT_SCHEMA, make_input


def _target(connector: str, tmp: Path, tag: str) -> tuple[dict[str, str], Any]:
    """``format("txsink")`` options for a fresh target, and a row counter for it (which
    drops a Postgres target once counted)."""
    if connector == "files":
        from txsink.connectors.files import read_committed

        path = str(tmp / f"out-{tag}")
        return {
            "connector": "files",
            "path": path,
            "uid": tag,
        }, lambda: read_committed(path).num_rows
    import psycopg

    dsn = os.environ["TXSINK_PG_DSN"]
    schema = f"bench_{tag}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(
            f"CREATE TABLE {schema}.t (id bigint, key text, amount double precision, payload text)"
        )

    def count() -> int:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT count(*) FROM {schema}.t").fetchone()
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
            return int(row[0]) if row else 0

    return {"connector": "postgres", "dsn": dsn, "table": f"{schema}.t", "uid": tag}, count


def _sink(options: dict[str, str]) -> Any:
    from txsink.datasource.options import parse_options

    return parse_options({**options, "log": "unused"}).sink


def _run(spark: Any, path: str, inputs: Path, options: dict[str, str], tmp: Path) -> dict[str, Any]:
    tag = options["uid"]
    stream = (
        spark.readStream.schema(INPUT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(inputs))
        .repartition(2)
    )
    log, checkpoint = str(tmp / f"log-{tag}"), str(tmp / f"ckpt-{tag}")
    if path == "foreachBatch":
        writer = stream.writeStream.foreachBatch(Coordinator([_sink(options)], log=log))
    else:
        writer = stream.writeStream.format("txsink").options(**options).option("log", log)
    t0 = time.perf_counter()
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    start = None
    while query.isActive:
        if start is None and query.lastProgress is not None:
            start = time.perf_counter() - t0
        time.sleep(0.05)
    query.awaitTermination()
    wall = time.perf_counter() - t0
    epochs = [p["durationMs"]["triggerExecution"] / 1000 for p in query.recentProgress]
    return {"start": start or wall, "epochs": epochs[1:], "wall": wall}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="datasource", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--rows", type=int, default=200, help="rows per epoch")
    parser.add_argument("--connector", choices=("files", "postgres"), default="files")
    args = parser.parse_args(argv)

    spark = local_spark("local[2]", "txsink-bench-datasource")
    register(spark)
    results: dict[str, list[dict[str, Any]]] = {"foreachBatch": [], "format(txsink)": []}
    with tempfile.TemporaryDirectory(prefix="txsink-bench-ds-") as folder:
        tmp = Path(folder)
        inputs = tmp / "input"
        make_input(inputs, args.rows * args.epochs, args.epochs)
        orders = [("foreachBatch", "format(txsink)"), ("format(txsink)", "foreachBatch")]
        for order in orders:
            for path in order:
                tag = f"{'fb' if path == 'foreachBatch' else 'ds'}_{uuid.uuid4().hex[:6]}"
                options, count = _target(args.connector, tmp, tag)
                result = _run(spark, path, inputs, options, tmp)
                rows = count()
                if rows != args.rows * args.epochs:
                    print(f"{path}: read back {rows} rows, expected {args.rows * args.epochs}")
                    return 1
                results[path].append(result)
    spark.stop()

    print(
        f"\n{args.connector}, {args.epochs} epochs of {args.rows} rows, local[2], "
        f"2 runs per path (alternating order)\n"
    )
    rows = []
    for path, runs in results.items():
        starts = [r["start"] for r in runs]
        epochs = [e for r in runs for e in r["epochs"]]
        walls = [r["wall"] for r in runs]
        rows.append(
            [
                path,
                f"{_bench.median(starts):.2f}",
                f"{_bench.median(epochs):.3f}",
                _bench.spread(epochs, scale=1.0, digits=3),
                f"{_bench.median(walls):.1f}",
            ]
        )
    headers = ["path", "start (s)", "epoch median (s)", "epoch range (s)", "wall (s)"]
    print(_bench.markdown_table(headers, rows, "lrrrr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
