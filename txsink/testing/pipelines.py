"""A generic pipeline for chaos runs: a file stream (one input file per epoch) into sinks.

Run by the restarting runner in a child process, one query run per process::

    python -m txsink.runner txsink.testing.pipelines:run_stream \\
        '{"workdir": "/tmp/w", "sinks": [{"kind": "files", "path": "/tmp/w/out"}]}'

Each sink is a JSON *spec* whose ``"kind"`` names a registered connector; that
connector's testing adapter builds the sink
(:meth:`~txsink.testing.adapter.ConnectorTesting.build_sink`), and its
``new_target`` makes specs for fresh targets. Specs name no secret: servers come
from environment variables (``TXSINK_PG_DSN``, ``TXSINK_KAFKA_BOOTSTRAP``,
``TXSINK_S3_ENDPOINT`` and so on, as each adapter documents).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from txsink.testing.adapter import build_sink
from txsink.testing.inputs import INPUT_SCHEMA

__all__ = ["SCHEMA", "build_sink", "run_stream"]

#: The schema of the input files (:func:`txsink.testing.inputs.make_input`).
SCHEMA = INPUT_SCHEMA


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
    from txsink.localspark import local_spark

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
