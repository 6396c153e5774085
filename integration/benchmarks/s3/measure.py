"""Timing one writer of the S3 benchmark into a fresh prefix, verifying what a reader of
its output sees (txsink's through its manifests), voiding the run if it is wrong."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
from benchmarks import _bench

from .bucket import delete_prefix, list_objects, read_parquet_objects
from .context import Bench
from .data import arrow_fingerprint
from .writers import run_encode, run_feed, write_s3a, write_txsink, write_upload


def read_back(bench: Bench, writer: str, prefix: str, extra: dict[str, Any]) -> pa.Table:
    """The rows a reader of each writer's output sees, and the output's bytes (in extra)."""
    objects = list_objects(bench.client, bench.bucket, prefix)
    if writer == "txsink":
        from txsink.connectors.s3 import read_committed

        data = [k for k in objects if k.endswith(".parquet")]
        extra["objects"] = len(data)
        extra["bytes"] = sum(objects[k] for k in data)
        extra["leftover_uploads"] = sum(
            len(page.get("Uploads", ()))
            for page in bench.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=bench.bucket, Prefix=prefix
            )
        )
        table = read_committed(f"s3://{bench.bucket}/{prefix}", extra["uid"])
        return table.drop_columns(["_epoch"]) if "_epoch" in table.column_names else table
    if writer == "s3a" and f"{prefix}_SUCCESS" not in objects:
        extra["no_success_marker"] = True
    data = [k for k in objects if k.endswith(".parquet") and "/_temporary/" not in k]
    extra["objects"] = len(data)
    extra["bytes"] = sum(objects[k] for k in data)
    return read_parquet_objects(bench.client, bench.bucket, data)


def measure(
    bench: Bench,
    writer: str,
    df: Any,
    *,
    rows: int,
    partitions: int,
    expected: tuple[Any, ...],
    tag: str,
) -> _bench.Measurement:
    """Time one writer into a fresh prefix, verify its output, delete the prefix."""
    prefix = f"{writer}/{tag}/"
    writers: dict[str, Callable[[], dict[str, Any]]] = {
        "txsink": lambda: write_txsink(bench, df, prefix),
        "upload": lambda: write_upload(bench, df, prefix),
        "s3a": lambda: write_s3a(bench, df, prefix),
        "encode": lambda: run_encode(df),
        "feed": lambda: run_feed(df),
    }
    try:
        m = _bench.timed_run(bench.cpu, writer, partitions, rows, writers[writer])
        extra = m.extra
        if writer in ("encode", "feed"):
            found = expected
            extra["bytes"] = extra["task_bytes"]
        else:
            found = arrow_fingerprint(read_back(bench, writer, prefix, extra))
    finally:
        delete_prefix(bench.client, bench.bucket, prefix)
    problems = []
    if "task_rows" in extra and extra["task_rows"] != rows:
        problems.append(f"the tasks saw {extra['task_rows']} rows")
    problems += _bench.output_problems(found, expected, rows, "output holds")
    if extra.get("leftover_uploads"):
        problems.append(f"{extra['leftover_uploads']} multipart uploads left open")
    if extra.get("no_success_marker"):
        problems.append("no _SUCCESS marker")
    _bench.void_if(problems, m, tag, bench.void)
    mb = extra.get("bytes", 0) / 1e6
    objects = extra.get("objects", "-")
    middle = f"{mb:.1f} MB ({mb / m.seconds:.1f} MB/s, {objects} objects)  "
    _bench.log_run(m, tag, width=7, middle=middle)
    return m
