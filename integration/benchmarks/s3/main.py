"""The S3 benchmark's command line and run: every writer at every partition count
(``integration/benchmarks/run s3 --help``)."""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchmarks.s3
import pyarrow as pa
from benchmarks import _bench, _hadoop_aws

from txsink.connectors.s3.client import make_client

from .bucket import delete_prefix, export_credentials, server_pid
from .context import Bench
from .data import make_frame, spark_fingerprint
from .measure import measure
from .report import WRITERS, Results, render
from .writers import setup_s3a


def _versions(server: str, endpoint: str) -> dict[str, str]:
    import boto3
    import pyspark

    return {
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
        "boto3": boto3.__version__,
        "server": server,
        "endpoint": endpoint,
    }


def parser() -> _bench.BenchParser:
    out = _bench.BenchParser(
        Results,
        benchmarks.s3.__doc__,
        writers=WRITERS,
        server=_bench.Server("--endpoint", "TXSINK_S3_ENDPOINT", "endpoint"),
    )
    out.add_argument("--region", default=os.environ.get("TXSINK_S3_REGION", "us-east-1"))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def session(res: Results, args: argparse.Namespace, jars: Sequence[Path]) -> Any:
    """The one Spark session every writer of the run shares: its settings are here and in
    ``_bench.spark_session``, nowhere else (with s3a, the Hadoop settings for the server)."""
    _bench.pickle_by_value("benchmarks.s3")  # the task code of this package
    spark = _bench.spark_session("txsink-bench-s3", feed=args.feed, jars=jars)
    if jars:
        hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in _hadoop_aws.s3a_settings(args.endpoint, args.region).items():
            hadoop_conf.set(key, value)
        algorithm = hadoop_conf.get("mapreduce.fileoutputcommitter.algorithm.version")
        res.s3a += f" (FileOutputCommitter, algorithm version {algorithm})."
    return spark


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every writer at every partition count into ``res``; the void runs."""
    export_credentials(args)
    jars = setup_s3a(res, args)
    spark = session(res, args, jars)
    client = make_client()
    bucket = f"txsink-bench-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    workdir = Path(tempfile.mkdtemp(prefix="txsink-bench-"))
    bench = Bench(spark, client, bucket, _bench.CpuMeter({}), workdir)
    bench.cpu.roots = {"spark": os.getpid(), **server_pid(args.endpoint)}
    server = os.environ.get("TXSINK_S3_SERVER", "unknown")
    res.versions = _versions(server, args.endpoint)
    try:
        for p in args.partitions:
            _bench.log(f"generating {args.rows:,} rows in {p} partitions")
            df = make_frame(spark, args.rows, p)
            expected = spark_fingerprint(df)
            common: dict[str, Any] = {"rows": args.rows, "partitions": p, "expected": expected}
            for i in range(args.warmup if p == args.partitions[0] else 0):
                _bench.log(f"warm-up {i + 1} (untimed): every writer once, full size")
                for writer in ("feed", "encode", *args.writers):
                    measure(bench, writer, df, tag=f"p{p}_warm{i}", **common)
            for rep in range(args.repeat):
                tag = f"p{p}_r{rep}"
                res.runs.append(measure(bench, "feed", df, tag=tag, **common))
                res.runs.append(measure(bench, "encode", df, tag=tag, **common))
                for writer in _bench.swap_on_odd(args.writers, rep, "txsink", "upload"):
                    res.runs.append(measure(bench, writer, df, tag=tag, **common))
            df.unpersist(blocking=True)
    finally:
        delete_prefix(client, bucket, "")
        client.delete_bucket(Bucket=bucket)
        spark.stop()
    return bench.void
