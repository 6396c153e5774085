"""A generic pipeline for chaos runs: a file stream (one input file per epoch) into sinks.

Run by the restarting runner in a child process, one query run per process::

    python -m txsink.runner txsink.testing.pipelines:run_stream \\
        '{"workdir": "/tmp/w", "sinks": [{"kind": "files", "path": "/tmp/w/out"}]}'

Sink specs (JSON objects) name no secret; servers come from environment variables:

- ``{"kind": "files", "path": ..., "uid": "out", "format": "parquet"}``
- ``{"kind": "postgres", "table": ..., "uid": "pg", "mode": "append", "key": [...],
  "create_table": false, "dsn_env": "TXSINK_TEST_PG_DSN"}`` (falls back to ``TXSINK_PG_DSN``)
- ``{"kind": "kafka", "topic": ..., "wal": ..., "uid": "kafka", "key": "key", "shards": 2,
  "mode": "wal", "bootstrap_env": "TXSINK_TEST_KAFKA", "transactional_id_prefix": "txsink"}``
  (falls back to ``TXSINK_KAFKA_BOOTSTRAP``)
- ``{"kind": "s3", "url": "s3://bucket/prefix", "uid": "s3", "format": "parquet",
  "partition_by": []}`` (credentials and endpoint from boto3's chain: ``AWS_*``)
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["SCHEMA", "build_sink", "run_stream"]

#: The schema of :func:`txsink.demo.make_input`'s files.
SCHEMA = "id long, key string, amount double, payload string"


def _env(spec: dict[str, Any], key: str, default: str, fallback: str) -> str:
    name = spec.get(key, default)
    value = os.environ.get(name) or (os.environ.get(fallback) if key not in spec else None)
    if not value:
        raise KeyError(f"sink {spec.get('kind')!r}: environment variable {name} is not set")
    return value


def build_sink(spec: dict[str, Any]) -> Any:
    """A sink from a JSON spec (see the module docstring)."""
    kind = spec["kind"]
    if kind == "files":
        from txsink.connectors.files import FilesSink

        return FilesSink(
            spec["path"], uid=spec.get("uid", "out"), format=spec.get("format", "parquet")
        )
    if kind == "postgres":
        from txsink.connectors.postgres import PostgresSink

        return PostgresSink(
            _env(spec, "dsn_env", "TXSINK_TEST_PG_DSN", "TXSINK_PG_DSN"),
            spec["table"],
            uid=spec.get("uid", "pg"),
            mode=spec.get("mode", "append"),
            key=spec.get("key", ()),
            create_table=bool(spec.get("create_table", False)),
        )
    if kind == "kafka":
        from txsink.connectors.kafka import KafkaSink

        return KafkaSink(
            _env(spec, "bootstrap_env", "TXSINK_TEST_KAFKA", "TXSINK_KAFKA_BOOTSTRAP"),
            spec["topic"],
            uid=spec.get("uid", "kafka"),
            wal=spec["wal"],
            key=spec.get("key", "key"),
            shards=spec.get("shards", 2),
            mode=spec.get("mode", "wal"),
            transactional_id_prefix=spec.get("transactional_id_prefix", "txsink"),
        )
    if kind == "s3":
        from txsink.connectors.s3 import S3Sink

        return S3Sink(
            spec["url"],
            uid=spec.get("uid", "s3"),
            format=spec.get("format", "parquet"),
            partition_by=spec.get("partition_by", ()),
        )
    raise ValueError(f"unknown sink kind {kind!r} (known: files, postgres, kafka, s3)")


def run_stream(
    workdir: str,
    sinks: list[dict[str, Any]],
    partitions: int = 2,
    log: str | None = None,
    master: str | None = None,
) -> None:
    """Stream ``workdir/input`` (one file per epoch) into the sinks until the input is done.

    ``log``: the txsink log's location (default ``workdir/txlog``), e.g. an ``s3://`` URL.
    ``master``: a Spark master URL (default ``local[partitions]``), e.g. ``spark://host:port``;
    further settings for it can come from ``PYSPARK_SUBMIT_ARGS``.
    A failed query prints one ``txsink: query failed: ...`` line and exits with code 1.
    """
    from txsink import Coordinator
    from txsink.demo import local_spark

    logging.basicConfig(
        level=logging.WARNING, stream=sys.stdout, format="txsink: %(levelname)s %(message)s"
    )
    logging.getLogger("txsink").setLevel(logging.INFO)
    spark = local_spark(master or f"local[{partitions}]", "txsink-pipeline")
    coordinator = Coordinator(
        [build_sink(s) for s in sinks], log=log or str(Path(workdir, "txlog"))
    )
    query = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(Path(workdir, "input")))
        .repartition(partitions)
        .writeStream.foreachBatch(coordinator)
        .option("checkpointLocation", str(Path(workdir, "checkpoint")))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"txsink: query failed: {type(err).__name__}: {first[:300]}", flush=True)
        raise SystemExit(1) from None
    finally:
        spark.stop()
