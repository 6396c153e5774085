"""Iceberg benchmark: txsink's IcebergSink next to pyiceberg's own ``append``, on the same
cached rows, in one run; then small epochs with txsink's commit latency.

    integration/benchmarks/run iceberg [--rows 1000000] [--partitions 2,8] [--repeat 3]
                                       [--epochs 12] [--epoch-rows 10000]

Each writer appends to its own fresh table of a local SQL catalog (SQLite, a warehouse
folder), read back with a fresh pyiceberg scan and checked (count, distinct ids, column
aggregates equal to the source's: the S3 benchmark's order-line rows), then dropped:

txsink   ``Coordinator([IcebergSink(catalog, table, uid)], log=...).write(df, epoch=0)``:
         tasks write Parquet data files no snapshot references; the driver records the
         decision in a local txsink log and commits one table transaction (append + the
         committed-epoch property). The default ``max_tasks="auto"`` coalesces the epoch
         to the task slots (a table sink prefers fewer, larger files).
txsink-per-part  the same with ``max_tasks=None``: one task (and file) per partition.
append   ``table.append(df.toArrow())``: what a user without txsink writes (pyiceberg
         writes and commits from the driver; ``toArrow`` collects every row there).
feed     not a writer: tasks that only receive the batches (Spark's own cost), with the
         Arrow byte cap lifted as txsink lifts it for its own job (``txsink.spark.jobs``).

Spark's own Iceberg writer is not measured: no Iceberg Spark runtime runs on PySpark 4.3
(``iceberg-spark-runtime-4.1_2.13:1.12.0`` fails with ``IncompatibleClassChangeError``;
none is published for 4.2 or 4.3). Writers swap order every other run; the first run of
each is a warm-up on 50,000 rows. Small epochs: ``--epochs`` epochs of ``--epoch-rows``
rows through one coordinator (a stream's steady state) next to as many driver appends.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

try:
    from benchmarks import _bench
    from benchmarks.s3 import data as s3_data
except ImportError:  # run as a plain script: python integration/benchmarks/iceberg.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench
    from benchmarks.s3 import data as s3_data

from txsink import Coordinator


def _feed_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    import pyiceberg  # noqa: F401 - warms the worker up

    n = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"rows": [n]}, schema=pa.schema([("rows", pa.int64())]))


class Catalog:
    """A local SQL catalog; each writer's table is fresh and dropped after its check."""

    def __init__(self, root: Path) -> None:
        from pyiceberg.catalog import load_catalog

        self.props = {
            "type": "sql",
            "uri": f"sqlite:///{root / 'catalog.db'}",
            "warehouse": (root / "warehouse").resolve().as_uri(),
        }
        self.catalog = load_catalog("bench", **self.props)
        self.catalog.create_namespace_if_not_exists("bench")

    def read(self, name: str) -> pa.Table:
        from pyiceberg.catalog import load_catalog

        return load_catalog("bench", **self.props).load_table(name).scan().to_arrow()

    def footprint(self, name: str) -> tuple[float, int]:
        """The table's data files: MB and count."""
        from pyiceberg.catalog import load_catalog

        tasks = list(load_catalog("bench", **self.props).load_table(name).scan().plan_files())
        return sum(t.file.file_size_in_bytes for t in tasks) / 1e6, len(tasks)

    def drop(self, name: str) -> None:
        self.catalog.purge_table(name)


#: txsink's writers: the coordinator's ``max_tasks`` for each (the default, ``"auto"``,
#: coalesces a table sink's epoch to the task slots; None keeps one task per partition).
TXSINK: dict[str, Any] = {"txsink": "auto", "txsink-per-part": None}
WRITERS: tuple[str, ...] = ("feed", *TXSINK, "append")
#: Spark's own Iceberg writer (``--spark-iceberg``: a PySpark an Iceberg runtime supports).
SPARK_RUNTIME = "org.apache.iceberg:iceberg-spark-runtime-{spark}_2.13:{version}"


def write(writer: str, catalog: Catalog, df: Any, name: str, log: Path) -> dict[str, float]:
    """One writer's whole write of ``df`` into table ``name``; txsink's phases."""
    if writer in TXSINK:
        from txsink.connectors.iceberg import IcebergSink

        sink = IcebergSink(catalog.props, name, name.replace(".", "-"), catalog_name="bench",
                           create=True)  # fmt: skip
        coordinator = Coordinator(
            [sink], log=str(log), app_id=f"bench-{uuid.uuid4().hex[:6]}", max_tasks=TXSINK[writer]
        )
        return dict(coordinator.write(df, epoch=0).seconds)
    if writer == "spark":
        # Spark's Iceberg writer (CTAS: create and write in one commit), a Hadoop catalog in
        # a warehouse folder of its own; read back through the same catalog.
        df.writeTo(f"sparkcat.{name}").using("iceberg").create()
        return {}
    if writer == "append":
        data = df.toArrow()
        table = catalog.catalog.create_table(name, schema=data.schema)
        table.append(data)
        return {}
    from txsink.spark.jobs import arrow_batches_cut_by_rows

    with arrow_batches_cut_by_rows(df.sparkSession):  # as txsink's own job runs
        df.mapInArrow(_feed_task, "rows long").collect()
    return {}


#: (partitions, writer) -> the tables' (MB, files), per run.
FOOTPRINT: dict[tuple[int, str], list[tuple[float, int]]] = {}
#: (partitions, writer) -> CPU seconds by role (``_bench.CpuMeter``), per run.
CPU: dict[tuple[int, str], list[dict[str, float]]] = {}
METER = _bench.CpuMeter({"spark": os.getpid()})
#: The CPU columns: (role, header).
ROLES = (("spark", "all"), ("jvm", "JVM"), ("workers", "Python workers"), ("driver", "driver"))


def measure(
    catalog: Catalog,
    writer: str,
    df: Any,
    rows: int,
    expected: tuple[Any, ...],
    tmp: Path,
    partitions: int = 0,
) -> tuple[float, dict[str, float], str]:
    name = f"bench.{writer}_{uuid.uuid4().hex[:8]}"
    before = METER.snapshot()
    t0 = time.perf_counter()
    phases = write(writer, catalog, df, name, tmp / f"log-{name}")
    seconds = time.perf_counter() - t0
    if partitions:
        CPU.setdefault((partitions, writer), []).append(METER.delta(before, METER.snapshot()))
    verdict = "ok"
    if writer == "spark":
        table = df.sparkSession.table(f"sparkcat.{name}")
        found = s3_data.spark_fingerprint(table)
        df.sparkSession.sql(f"DROP TABLE sparkcat.{name} PURGE")
        if found != expected:
            verdict = f"WRONG: {found[:2]} rows/ids, want {rows}"
    elif writer != "feed":
        try:
            found = s3_data.arrow_fingerprint(catalog.read(name))
            FOOTPRINT.setdefault((partitions, writer), []).append(catalog.footprint(name))
        finally:
            catalog.drop(name)
        if found != expected:
            verdict = f"WRONG: {found[:2]} rows/ids, want {rows}"
    _bench.log(f"{writer:7s} {rows:>9,} rows {seconds:6.2f} s {verdict}")
    return seconds, phases, verdict


def small_epochs(catalog: Catalog, df: Any, epochs: int, tmp: Path) -> dict[str, Any]:
    """txsink's coordinator epoch after epoch vs as many driver appends into one table."""
    from txsink.connectors.iceberg import IcebergSink

    out: dict[str, Any] = {}
    name = "bench.epochs_txsink"
    sink = IcebergSink(catalog.props, name, "epochs", catalog_name="bench", create=True)
    coordinator = Coordinator([sink], log=str(tmp / "log-epochs"), app_id="bench-epochs")
    walls, commits = [], []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        commits.append(coordinator.write(df, epoch=epoch).seconds.get("commit", 0.0))
        walls.append(time.perf_counter() - t0)
    out["txsink"] = (walls, commits, catalog.read(name).num_rows)
    catalog.drop(name)
    name = "bench.epochs_append"
    data = df.toArrow()
    table = catalog.catalog.create_table(name, schema=data.schema)
    walls = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        table.append(df.toArrow())
        walls.append(time.perf_counter() - t0)
    out["append"] = (walls, [], catalog.read(name).num_rows)
    catalog.drop(name)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", default="2,8")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2, help="untimed full-size runs each")
    parser.add_argument("--epochs", type=int, default=12, help="small epochs (first: warm-up)")
    parser.add_argument("--epoch-rows", type=int, default=10_000)
    parser.add_argument(
        "--spark-iceberg",
        metavar="VERSION",
        help="also Spark's own Iceberg writer, with iceberg-spark-runtime VERSION for this "
        "PySpark's minor version (none runs on PySpark 4.3: use .venv-iceberg-spark)",
    )
    _bench.add_feed_option(parser)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="txsink-bench-iceberg-"))
    conf: dict[str, str] = {}
    writers = WRITERS
    if args.spark_iceberg:
        import pyspark

        minor = ".".join(pyspark.__version__.split(".")[:2])
        conf = {
            "spark.jars.packages": SPARK_RUNTIME.format(spark=minor, version=args.spark_iceberg),
            "spark.sql.catalog.sparkcat": "org.apache.iceberg.spark.SparkCatalog",
            "spark.sql.catalog.sparkcat.type": "hadoop",
            "spark.sql.catalog.sparkcat.warehouse": (tmp / "spark-warehouse").as_uri(),
        }
        writers = (*WRITERS, "spark")
    spark = _bench.spark_session("txsink-bench-iceberg", feed=args.feed, conf=conf)
    catalog = Catalog(tmp)
    results: dict[tuple[int, str], list[float]] = {}
    phases: dict[tuple[int, str], list[dict[str, float]]] = {}
    ok = True
    try:
        warm = s3_data.make_frame(spark, 50_000, 2)
        for writer in writers:
            measure(catalog, writer, warm, 50_000, s3_data.spark_fingerprint(warm), tmp)
        warm.unpersist(blocking=True)
        for p in [int(x) for x in args.partitions.split(",")]:
            df = s3_data.make_frame(spark, args.rows, p)
            expected = s3_data.spark_fingerprint(df)
            # The JVM's JIT takes several full-size runs to settle (a stream's steady
            # state): untimed, every writer alike.
            for _ in range(args.warmup):
                for writer in writers:
                    measure(catalog, writer, df, args.rows, expected, tmp)
            for rep in range(args.repeat):
                for writer in _bench.rotated(writers, rep):
                    secs, ph, verdict = measure(catalog, writer, df, args.rows, expected, tmp, p)
                    ok = ok and verdict == "ok"
                    results.setdefault((p, writer), []).append(secs)
                    if writer in TXSINK:
                        phases.setdefault((p, writer), []).append(ph)
            df.unpersist(blocking=True)
        small = s3_data.make_frame(spark, args.epoch_rows, 2)
        epochs = small_epochs(catalog, small, args.epochs, tmp)
    finally:
        spark.stop()
    rows = []
    for (p, writer), walls in sorted(results.items()):
        med = _bench.median(walls)
        base = _bench.median(results[(p, "append")])
        ratio = f"{base / med:.2f}x" if writer != "feed" else ""
        sizes = FOOTPRINT.get((p, writer))
        size = f"{_bench.median([m for m, _ in sizes]):.1f} / {sizes[0][1]}" if sizes else ""
        cpu = CPU.get((p, writer), [])
        rows.append(
            [
                str(p),
                writer,
                _bench.fmt_rate(args.rows / med),
                size,
                _bench.fmt_secs(walls),
                ratio,
                *(f"{_bench.median([c.get(r, float('nan')) for c in cpu]) / args.rows * 1e6:.2f}"
                  for r, _ in ROLES),
            ]
        )  # fmt: skip
    print(f"\n{args.rows:,} rows, {args.repeat} runs each (txsink / append: ratio of rates)\n")
    print(_bench.markdown_table(
        ["partitions", "writer", "rows/s (median)", "MB / files", "wall s per run",
         "vs pyiceberg append", *(f"CPU-s per 1M: {h}" for _, h in ROLES)], rows,
        "llrrrr" + "r" * len(ROLES)))  # fmt: skip
    print(f"\n{_bench.feed_note(args.feed)}")
    for (p, writer), runs in phases.items():
        keys = ("recover", "precommit", "decide", "commit")
        print(f"\n{writer} phases at {p} partitions (median s): " + ", ".join(
            f"{k} {_bench.median([x.get(k, 0.0) for x in runs]):.3f}" for k in keys))  # fmt: skip
    print(f"\n{args.epochs} small epochs of {args.epoch_rows:,} rows (first left out)\n")
    ep_rows = []
    for writer, (ep_walls, commits, count) in epochs.items():
        want = args.epochs * args.epoch_rows
        ep_rows.append([
            writer,
            _bench.ms(ep_walls[1:]),
            _bench.spread(ep_walls[1:]),
            _bench.ms(commits[1:]) if commits else "",
            "ok" if count == want else f"WRONG: {count} of {want}",
        ])  # fmt: skip
        ok = ok and count == want
    print(_bench.markdown_table(
        ["writer", "ms per epoch (median)", "range", "commit ms (median)", "read back"],
        ep_rows, "lrrrl"))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
