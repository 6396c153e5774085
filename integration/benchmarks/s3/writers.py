"""The S3 benchmark's writers: txsink's S3Sink through the whole protocol, the plain boto3
upload of the same Parquet (the ceiling), Spark's ``df.write.parquet("s3a://...")`` (with
hadoop-aws from Maven Central); and two jobs that are not writers: encode-only, feed-only."""

from __future__ import annotations

import argparse
import functools
import io
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from benchmarks import _bench, _hadoop_aws

from txsink import Coordinator

from .context import Bench
from .report import Results

COMPRESSION = "snappy"


# -- task functions: these run in Spark's Python workers; keep them self-contained -----------


def _encode_partition(
    batches: Iterator[pa.RecordBatch], compression: str
) -> tuple[pa.Buffer | None, int]:
    """The partition as one Parquet file in memory, encoded the way S3Sink encodes it."""
    sink = pa.BufferOutputStream()
    writer = None
    rows = 0
    for batch in batches:
        if writer is None:
            writer = pq.ParquetWriter(sink, batch.schema, compression=compression)
        writer.write_batch(batch)
        rows += batch.num_rows
    if writer is None:
        return None, 0
    writer.close()
    return sink.getvalue(), rows


def _result(rows: int, nbytes: int) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict(
        {"rows": [rows], "bytes": [nbytes]},
        schema=pa.schema([("rows", pa.int64()), ("bytes", pa.int64())]),
    )


def _upload_task(
    bucket: str, prefix: str, compression: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Encode the partition to Parquet, then ``upload_fileobj`` it as boto3 does by default."""
    import boto3
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    data, rows = _encode_partition(batches, compression)
    if data is None:
        yield from _result(0, 0)
        return
    # A fresh session: boto3's default session is not thread-safe; credentials and endpoint
    # come from the environment (AWS_*), never from the closure.
    client = boto3.session.Session().client("s3")
    client.upload_fileobj(
        io.BytesIO(data.to_pybytes()), bucket, f"{prefix}part-{partition:05d}.parquet"
    )
    yield from _result(rows, data.size)


def _encode_task(compression: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    data, rows = _encode_partition(batches, compression)
    yield from _result(rows, 0 if data is None else data.size)


def _feed_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Only receive the batches. Also warms the worker up (imports)."""
    import boto3  # noqa: F401

    import txsink.connectors.s3  # noqa: F401

    yield from _result(sum(batch.num_rows for batch in batches), 0)


def _task_totals(job: Any) -> dict[str, int]:
    rows = job.collect()
    return {"task_rows": sum(r["rows"] for r in rows), "task_bytes": sum(r["bytes"] for r in rows)}


def write_txsink(bench: Bench, df: Any, prefix: str) -> dict[str, Any]:
    from txsink.connectors.s3 import S3Sink

    uid = "bench-" + prefix.strip("/").replace("/", "-").replace("_", "-")
    sink = S3Sink(f"s3://{bench.bucket}/{prefix}", uid, format="parquet", compression=COMPRESSION)
    log = f"s3://{bench.bucket}/{prefix}_txlog/"
    result = Coordinator([sink], log=log, app_id="bench").write(df, epoch=0)
    if result.status != "committed":
        raise RuntimeError(f"txsink epoch not committed: {result}")
    return {"phases": dict(result.seconds), "handles": result.handles, "uid": uid}


def write_upload(bench: Bench, df: Any, prefix: str) -> dict[str, Any]:
    task = functools.partial(_upload_task, bench.bucket, prefix, COMPRESSION)
    return _task_totals(df.mapInArrow(task, "rows long, bytes long"))


def write_s3a(bench: Bench, df: Any, prefix: str) -> dict[str, Any]:
    df.write.mode("errorifexists").parquet(f"s3a://{bench.bucket}/{prefix}")
    return {}


def run_encode(df: Any) -> dict[str, Any]:
    """Tasks that encode the Parquet and drop it (where the upload's time goes)."""
    task = functools.partial(_encode_task, COMPRESSION)
    return _task_totals(df.mapInArrow(task, "rows long, bytes long"))


def run_feed(df: Any) -> dict[str, Any]:
    """Tasks that only receive the batches (Spark's own cost)."""
    return _task_totals(df.mapInArrow(_feed_task, "rows long, bytes long"))


def setup_s3a(res: Results, args: argparse.Namespace) -> list[Path]:
    """hadoop-aws jars for the session, or [] with the reason in ``res.s3a``."""
    if "s3a" not in args.writers:
        res.s3a = "Spark s3a: not asked for (--writers)."
        return []
    try:
        found = _hadoop_aws.hadoop_aws_jars()
    except (_hadoop_aws.HadoopAwsUnavailable, OSError, subprocess.SubprocessError) as err:
        res.s3a = f"Spark s3a could not be set up: {err}"
        _bench.log(res.s3a)
        args.writers.remove("s3a")
        return []
    versions = found.versions()
    res.s3a = (
        f"Spark s3a: hadoop-aws {versions.get('hadoop-aws', found.hadoop)} (matching PySpark's "
        f"hadoop-client {found.hadoop}) with AWS SDK bundle {versions.get('bundle', '?')} from "
        "Maven Central; path-style access, credentials from the environment, Spark's default "
        "commit protocol"
    )
    res.s3a_ok = True
    return found.jars
