"""Delta Lake benchmark: txsink's DeltaSink next to delta-rs's own ``write_deltalake`` appends
(from the driver and from the tasks) and Spark's Delta writer, on the same cached rows.

    integration/benchmarks/run delta [--rows N] [--partitions 2,8] [--repeat K]
                                     [--epochs K] [--epoch-rows N] [--s3]

Writers (each into its own fresh Delta table, read back with delta-rs, checked, deleted):

txsink   ``Coordinator([DeltaSink(path, uid, create_table=True)], log=...).write(df, epoch=0)``:
         tasks write Parquet files no log entry names; the driver records the decision in a
         local txsink log and makes one Delta commit with the epoch's ``txn`` action.
         The default ``max_tasks="auto"`` coalesces the epoch to the task slots (2 here: 8
         partitions run as 2 tasks and 2 files), as for every table sink.
perpart  the same with ``Coordinator(..., max_tasks=None)``: one task and file per partition.
driver   ``write_deltalake(path, df.toArrow(), mode="append")``: what a user without txsink
         writes. ``toArrow`` collects every row to the driver, which encodes and commits.
tasks    ``mapInArrow`` tasks that each ``write_deltalake(path, batches, mode="append")`` their
         partition: one Delta commit per task, concurrent (delta-rs retries conflicting
         appends); the driver creates the empty table first.
spark    ``df.write.format("delta").save(path)`` with Delta's own jar, when it runs on this
         PySpark (probed in a child process first; the reason is reported when it does not).
feed     not a writer: tasks that only receive the batches (Spark's own cost, with the Arrow
         byte cap lifted as txsink lifts it for its own job).

Small epochs: ``--epochs`` epochs of ``--epoch-rows`` rows through one coordinator (a
stream's steady state) next to as many ``write_deltalake`` appends from the driver; the
per-epoch wall time and txsink's commit latency (``EpochResult.seconds``).

With ``--s3`` every writer but Spark's also writes to the S3 server (MinIO) as
``s3://<fresh bucket>/...``; credentials reach delta-rs and pyarrow through ``AWS_*``
environment variables (set from ``TXSINK_S3_*`` before Spark starts), never in a closure.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

try:
    from benchmarks import _bench
    from benchmarks._delta_report import EPOCH_PHASES, S3, WRITERS, Results, render
    from benchmarks.s3 import bucket as s3_bucket
    from benchmarks.s3 import data as s3_data
except ImportError:  # run as a plain script: python integration/benchmarks/delta.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench
    from benchmarks._delta_report import EPOCH_PHASES, S3, WRITERS, Results, render
    from benchmarks.s3 import bucket as s3_bucket
    from benchmarks.s3 import data as s3_data

from txsink import Coordinator

DELTA_PACKAGE = os.environ.get("TXSINK_DELTA_SPARK_PACKAGE", "io.delta:delta-spark_2.13:4.4.0")
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


# -- task functions: these run in Spark's Python workers; keep them self-contained -----------


def _rows_result(rows: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def _append_task(
    uri: str, options: dict[str, str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``write_deltalake(..., mode="append")`` of this partition's batches, streamed."""
    from deltalake import write_deltalake

    first = next(batches, None)
    if first is None:
        yield from _rows_result(0)
        return
    count = [0]

    def counted() -> Iterator[pa.RecordBatch]:
        for batch in itertools.chain([first], batches):
            count[0] += batch.num_rows
            yield batch

    reader = pa.RecordBatchReader.from_batches(first.schema, counted())
    write_deltalake(uri, reader, mode="append", storage_options=options or None)
    yield from _rows_result(count[0])


def _feed_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Only receive the batches. Also warms the worker up (imports)."""
    import deltalake  # noqa: F401

    import txsink.connectors.delta  # noqa: F401

    yield from _rows_result(sum(batch.num_rows for batch in batches))


# -- the benchmark ----------------------------------------------------------------------------


@dataclass
class Where:
    """Where tables go: a local folder, or a bucket on the S3 server."""

    root: str
    options: dict[str, str]  # delta-rs storage options, no secret (keys come from AWS_*)
    suffix: str = ""  # "" local, S3 on the S3 server
    client: Any = None
    bucket: str = ""

    def delete(self, uri: str) -> None:
        if self.client is None:
            shutil.rmtree(uri, ignore_errors=True)
        else:
            s3_bucket.delete_prefix(self.client, self.bucket, uri.split("/", 3)[3] + "/")

    def file_bytes(self, uris: Sequence[str]) -> int:
        if self.client is None:
            return sum(os.path.getsize(u.removeprefix("file://")) for u in uris)
        prefix = self.root.split("/", 3)[3]
        sizes = s3_bucket.list_objects(self.client, self.bucket, prefix)
        return sum(sizes.get(u.split("/", 3)[3], 0) for u in uris)


@dataclass
class Bench:
    spark: Any
    cpu: _bench.CpuMeter
    workdir: Path
    void: list[str] = field(default_factory=list)


def write_txsink(
    bench: Bench, where: Where, df: Any, uri: str, tag: str, max_tasks: Any = "auto"
) -> dict[str, Any]:
    from txsink.connectors.delta import DeltaSink

    sink = DeltaSink(uri, f"bench-{tag}", create_table=True, storage_options=where.options)
    log = str(bench.workdir / f"txlog-{tag}{where.suffix}")
    coordinator = Coordinator([sink], log=log, app_id="bench", max_tasks=max_tasks)
    result = coordinator.write(df, epoch=0)
    if result.status != "committed":
        raise RuntimeError(f"txsink epoch not committed: {result}")
    return {"phases": dict(result.seconds), "handles": result.handles}


def write_driver(where: Where, df: Any, uri: str) -> dict[str, Any]:
    from deltalake import write_deltalake

    write_deltalake(uri, df.toArrow(), mode="append", storage_options=where.options or None)
    return {}


def write_tasks(where: Where, df: Any, uri: str) -> dict[str, Any]:
    from deltalake import DeltaTable

    schema = df.limit(0).toArrow().schema
    DeltaTable.create(uri, schema, storage_options=where.options or None)
    task = functools.partial(_append_task, uri, where.options)
    return {"task_rows": sum(r["rows"] for r in df.mapInArrow(task, "rows long").collect())}


def write_spark(df: Any, uri: str) -> dict[str, Any]:
    df.write.format("delta").mode("errorifexists").save(uri)
    return {}


def _feed(df: Any) -> dict[str, Any]:
    """Spark's own cost: tasks that only receive the batches, with the Arrow byte cap lifted
    as txsink lifts it for its own job."""
    from txsink.spark.jobs import arrow_batches_cut_by_rows

    with arrow_batches_cut_by_rows(df.sparkSession):
        return {
            "task_rows": sum(r["rows"] for r in df.mapInArrow(_feed_task, "rows long").collect())
        }


def read_back(where: Where, uri: str, extra: dict[str, Any]) -> pa.Table:
    from deltalake import DeltaTable

    table = DeltaTable(uri, storage_options=where.options or None)
    files = table.file_uris()
    extra.update(files=len(files), bytes=where.file_bytes(files), version=table.version())
    return table.to_pyarrow_table()


def measure(
    bench: Bench,
    where: Where,
    writer: str,
    df: Any,
    *,
    rows: int,
    partitions: int,
    expected: tuple[Any, ...],
    tag: str,
) -> _bench.Measurement:
    """Time one writer into a fresh table, verify what delta-rs reads back, delete it."""
    uri = f"{where.root}/{writer}-{tag}"
    writers: dict[str, Callable[[], dict[str, Any]]] = {
        "txsink": lambda: write_txsink(bench, where, df, uri, f"{writer}-{tag}"),
        "perpart": lambda: write_txsink(bench, where, df, uri, f"{writer}-{tag}", None),
        "driver": lambda: write_driver(where, df, uri),
        "tasks": lambda: write_tasks(where, df, uri),
        "spark": lambda: write_spark(df, uri),
        "feed": lambda: _feed(df),
    }
    try:
        m = _bench.timed_run(bench.cpu, writer + where.suffix, partitions, rows, writers[writer])
        found = (
            expected
            if writer == "feed"
            else s3_data.arrow_fingerprint(read_back(where, uri, m.extra))
        )
    finally:
        where.delete(uri)
    extra, problems = m.extra, []
    if "task_rows" in extra and extra["task_rows"] != rows:
        problems.append(f"the tasks saw {extra['task_rows']} rows")
    problems += _bench.output_problems(found, expected, rows)
    _bench.void_if(problems, m, tag, bench.void)
    mb = extra.get("bytes", 0) / 1e6
    middle = f"{mb:.1f} MB ({extra.get('files')} files, version {extra.get('version')})  "
    middle = "" if writer == "feed" else middle
    _bench.log_run(m, tag, width=10, middle=middle)
    return m


def _epoch_step(
    bench: Bench, where: Where, writer: str, df: Any, uri: str
) -> Callable[[int], dict[str, float]]:
    """One small epoch of ``writer`` into ``uri``; returns txsink's phases (the append: {})."""
    from deltalake import write_deltalake

    from txsink.connectors.delta import DeltaSink

    if writer == "driver":

        def append(epoch: int) -> dict[str, float]:
            write_deltalake(uri, df.toArrow(), mode="append", storage_options=where.options or None)
            return {}

        return append
    coordinator = Coordinator(
        [DeltaSink(uri, "epochs", create_table=True, storage_options=where.options)],
        log=str(bench.workdir / f"txlog-epochs{where.suffix}"),
        app_id="bench-epochs",
    )
    return lambda epoch: dict(coordinator.write(df, epoch=epoch).seconds)


def run_epochs(bench: Bench, where: Where, res: Results, epochs: int, rows: int) -> None:
    """``epochs`` small epochs through one coordinator vs as many driver appends."""
    from deltalake import DeltaTable

    df = s3_data.make_frame(bench.spark, rows, 2)
    for writer in ("txsink", "driver"):
        uri = f"{where.root}/epochs-{writer}"
        walls: list[float] = []
        phases: list[dict[str, float]] = []
        step = _epoch_step(bench, where, writer, df, uri)
        try:
            for epoch in range(epochs):
                t0 = time.perf_counter()
                done = step(epoch)
                walls.append(time.perf_counter() - t0)
                if done:
                    phases.append(done)
            table = DeltaTable(uri, storage_options=where.options or None).to_pyarrow_table()
            found = (table.num_rows, pc.count_distinct(table["id"]).as_py())
        finally:
            where.delete(uri)
        name = writer + where.suffix
        res.epochs[name] = {
            "wall": walls,
            **{k: [p.get(k, 0.0) for p in phases] for k in EPOCH_PHASES},
        }
        if found != (rows * epochs, rows):
            message = f"VOID epochs {name}: table holds {found[0]} rows, {found[1]} distinct ids"
            bench.void.append(message)
            res.epochs[name]["void"] = [1.0]
            _bench.log(message)
        _bench.log(f"epochs {name}: {[round(s, 3) for s in walls]} s")
    df.unpersist(blocking=True)


# -- Spark's Delta writer ---------------------------------------------------------------------

_PROBE = """
import sys, tempfile
from deltalake import DeltaTable
from pyspark.sql import SparkSession
b = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
for k, v in [("spark.jars.packages", sys.argv[1]), *zip(sys.argv[2::2], sys.argv[3::2])]:
    b = b.config(k, v)
spark = b.getOrCreate()
tmp = tempfile.TemporaryDirectory()
path = tmp.name + "/t"
spark.range(10).write.format("delta").save(path)
assert DeltaTable(path).to_pyarrow_table().num_rows == 10, "delta-rs reads back the wrong rows"
print("WRITE-OK", flush=True)
spark.read.format("delta").load(path).count()
"""


def _java_error(stderr: str) -> str:
    """The JVM's error line (a method signature's parameters shortened to ``(...)``)."""
    lines = [ln.strip().removeprefix(": ") for ln in stderr.splitlines()]
    why = [ln for ln in lines if ln.startswith(("java.", "AssertionError"))]
    why = why or [ln for ln in lines if ln.startswith("py4j.protocol.")] or lines[-1:] or ["?"]
    return re.sub(r"\(([\w.$]+(, )?)+\)", "(...)", why[0])[:400]


def probe_spark_delta() -> tuple[bool, str]:
    """Whether Spark writes a Delta table with Delta's jar here (10 rows, read back with
    delta-rs), and what failed: the write, or Spark's own read of the table ("" if none)."""
    conf = [x for kv in DELTA_CONF.items() for x in kv]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, DELTA_PACKAGE, *conf],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, "the probe (a 10-row write) did not finish in 300 s"
    wrote = "WRITE-OK" in proc.stdout
    return wrote, "" if proc.returncode == 0 else _java_error(proc.stderr)


# -- main -------------------------------------------------------------------------------------


def parser() -> _bench.BenchParser:
    def options(p: _bench.BenchParser) -> None:
        p.add_count("--epochs", 12, "small epochs per writer, the first a warm-up (default 12)")
        p.add_count("--epoch-rows", 10_000, "rows per small epoch (default 10000)")
        p.add_argument("--s3", action="store_true", help="also write to the S3 server")
        p.add_argument("--region", default=os.environ.get("TXSINK_S3_REGION", "us-east-1"))

    return _bench.BenchParser(
        Results,
        __doc__,
        writers=WRITERS,
        server=_bench.Server("--endpoint", "TXSINK_S3_ENDPOINT", "S3 endpoint", required=False),
        warmup=2,  # the JVM's JIT takes a few full-size runs to settle for Spark's Delta writer
        options=options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def _s3_where(args: argparse.Namespace) -> Where:
    from txsink.connectors.s3.client import make_client

    if not args.endpoint:
        raise SystemExit("--s3 needs the S3 server: set TXSINK_S3_ENDPOINT or --endpoint")
    client = make_client()
    bucket = f"txsink-bench-delta-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    options = {"AWS_ENDPOINT_URL": args.endpoint, "AWS_REGION": args.region}
    if args.endpoint.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    return Where(f"s3://{bucket}/t", options, S3, client, bucket)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every writer at every partition count, then the small epochs, into ``res``."""
    import deltalake
    import pyspark

    if args.s3:
        s3_bucket.export_credentials(args)
    conf: dict[str, str] = {}
    if "spark" in args.writers:
        _bench.log(f"probing Spark's Delta writer ({DELTA_PACKAGE}) in a child process")
        wrote, why = probe_spark_delta()
        jar = f"{DELTA_PACKAGE} (the newest Delta release, built on Spark 4.2)"
        if wrote:
            res.spark, res.spark_ok = f"{jar} through `spark.jars.packages`.", True
            conf = {"spark.jars.packages": DELTA_PACKAGE, **DELTA_CONF}
            if why:
                res.spark += (
                    f" On PySpark {pyspark.__version__} it writes tables (read back here with "
                    f"delta-rs) but Spark cannot read them back with it: `{why}`."
                )
        else:
            res.spark = (
                f"{jar} does not run on PySpark {pyspark.__version__}: a 10-row write with it "
                f"failed: `{why}`."
            )
            args.writers.remove("spark")
        _bench.log(f"Spark's Delta writer: {res.spark}")
    else:
        res.spark = "not asked for (--writers)."
    spark = _bench.spark_session("txsink-bench-delta", feed=args.feed, conf=conf)
    res.versions = {
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
        "deltalake": deltalake.__version__,
    }
    workdir = Path(tempfile.mkdtemp(prefix="txsink-bench-delta-"))
    places = [Where(str(workdir / "tables"), {})]
    if args.s3:
        places.append(_s3_where(args))
    bench = Bench(spark, _bench.CpuMeter({"spark": os.getpid()}), workdir)
    if args.s3:
        bench.cpu.roots.update(s3_bucket.server_pid(args.endpoint))
    try:
        warm = min(args.rows, 50_000)
        _bench.log(f"warm-up (untimed): each writer once on {warm:,} rows")
        df = s3_data.make_frame(spark, warm, 2)
        expected = s3_data.spark_fingerprint(df)
        for where in places:
            for writer in ("feed", *args.writers):
                if writer != "spark" or not where.suffix:
                    measure(bench, where, writer, df, rows=warm, partitions=2,
                            expected=expected, tag="warmup")  # fmt: skip
        df.unpersist(blocking=True)
        for p in args.partitions:
            _bench.log(f"generating {args.rows:,} rows in {p} partitions")
            df = s3_data.make_frame(spark, args.rows, p)
            expected = s3_data.spark_fingerprint(df)
            common: dict[str, Any] = {"rows": args.rows, "partitions": p, "expected": expected}
            for i in range(args.warmup):  # the JVM's JIT takes a few full-size runs to settle
                for where in places:
                    for writer in ("feed", *args.writers):
                        if writer != "spark" or not where.suffix:
                            measure(bench, where, writer, df, **common, tag=f"warm-p{p}-{i}")
            for rep in range(args.repeat):
                tag = f"p{p}-r{rep}"
                for where in places:
                    res.runs.append(measure(bench, where, "feed", df, tag=tag, **common))
                    for writer in _bench.swap_on_odd(args.writers, rep, "txsink", "driver"):
                        if writer != "spark" or not where.suffix:
                            res.runs.append(measure(bench, where, writer, df, tag=tag, **common))
            df.unpersist(blocking=True)
        for where in places:
            _bench.log(f"small epochs: {args.epochs} x {args.epoch_rows:,} rows{where.suffix}")
            run_epochs(bench, where, res, args.epochs, args.epoch_rows)
    finally:
        for where in places[1:]:
            s3_bucket.delete_prefix(where.client, where.bucket, "")
            where.client.delete_bucket(Bucket=where.bucket)
        shutil.rmtree(workdir, ignore_errors=True)
        spark.stop()
    return bench.void


if __name__ == "__main__":
    sys.exit(main())
