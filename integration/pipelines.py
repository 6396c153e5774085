"""Pipelines the restarting runner executes in a child process (one query run each).

``python -m txsink.runner integration/pipelines.py:run_stream '{"workdir": ..., "sink": {...}}'``
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

SCHEMA = "id long, key string, amount double, payload string"


def build_sink(spec: dict[str, Any]) -> Any:
    kind = spec["kind"]
    if kind == "files":
        from txsink.connectors.files import FilesSink

        return FilesSink(spec["path"], uid=spec.get("uid", "out"))
    if kind == "postgres":
        from txsink.connectors.postgres import PostgresSink

        return PostgresSink(
            os.environ[spec.get("dsn_env", "TXSINK_TEST_PG_DSN")],
            spec["table"],
            uid=spec.get("uid", "pg"),
            mode=spec.get("mode", "append"),
            key=spec.get("key", ()),
        )
    if kind == "kafka":
        from txsink.connectors.kafka import KafkaSink

        return KafkaSink(
            os.environ[spec.get("bootstrap_env", "TXSINK_TEST_KAFKA")],
            spec["topic"],
            uid=spec.get("uid", "kafka"),
            wal=spec["wal"],
            key=spec.get("key", "key"),
            shards=spec.get("shards", 2),
            mode=spec.get("mode", "wal"),
        )
    if kind == "s3":
        from txsink.connectors.s3 import S3Sink

        # No secrets in the spec: credentials and endpoint come from boto3's chain, i.e.
        # the child's AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL_S3.
        return S3Sink(
            spec["url"],
            uid=spec.get("uid", "s3"),
            format=spec.get("format", "parquet"),
            partition_by=spec.get("partition_by", ()),
        )
    raise ValueError(f"unknown sink kind {kind!r}")


def run_stream(
    workdir: str, sinks: list[dict[str, Any]], partitions: int = 2, log: str | None = None
) -> None:
    """Stream ``workdir/input`` (one file per epoch) into the sinks until the input is done.

    ``log``: the txsink log's location (default ``workdir/txlog``), e.g. an ``s3://`` URL.
    """
    from txsink import Coordinator
    from txsink.demo import local_spark

    logging.basicConfig(
        level=logging.WARNING, stream=sys.stdout, format="txsink: %(levelname)s %(message)s"
    )
    logging.getLogger("txsink").setLevel(logging.INFO)
    spark = local_spark(f"local[{partitions}]", "txsink-pipeline")
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
