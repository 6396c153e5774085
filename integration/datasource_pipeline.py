"""A file stream (one input file per epoch) into one sink through ``format("txsink")``.

Run by the restarting runner in a child process, one query run per process::

    python -m txsink.runner integration/datasource_pipeline.py:run_stream \\
        '{"workdir": "/tmp/w", "options": {"connector": "files", "path": "/tmp/w/out",
          "uid": "out"}}'

``env_options`` names options whose values come from environment variables (a DSN: no
secret on a command line). ``static``: write each input file as one static
``df.write.format("txsink")`` epoch instead, in order, from the log's next epoch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from txsink.runner import FAILED_LINE
from txsink.testing.inputs import INPUT_SCHEMA
from txsink.testing.pipelines import failure_line


def run_stream(
    workdir: str,
    options: dict[str, str],
    env_options: dict[str, str] | None = None,
    partitions: int = 2,
    static: bool = False,
    app_id: str = "ds-static",
    master: str | None = None,
) -> None:
    from txsink.datasource import error_text, register
    from txsink.localspark import local_spark

    spark = local_spark(master or f"local[{partitions}]", "txsink-datasource")
    if os.environ.get("TXSINK_DS_AUTOREGISTER") != "1":
        register(spark)
    opts = {"log": str(Path(workdir, "txlog")), **options}
    for key, var in (env_options or {}).items():
        opts[key] = os.environ[var]
    try:
        if static:
            _static(spark, workdir, opts, partitions, app_id)
            return
        query = (
            spark.readStream.schema(INPUT_SCHEMA)
            .option("maxFilesPerTrigger", 1)
            .parquet(str(Path(workdir, "input")))
            .repartition(partitions)
            .writeStream.format("txsink")
            .options(**opts)
            .option("checkpointLocation", str(Path(workdir, "checkpoint")))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    except Exception as err:
        text = error_text(err) or failure_line(err)
        print(f"{FAILED_LINE}{text}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        spark.stop()


def _static(spark: Any, workdir: str, opts: dict[str, str], partitions: int, app_id: str) -> None:
    """Input file ``i`` as epoch ``i`` (explicit, so a re-run after a crash writes nothing
    twice)."""
    files = sorted(Path(workdir, "input").glob("*.parquet"))
    for i, path in enumerate(files):
        df = spark.read.schema(INPUT_SCHEMA).parquet(str(path)).repartition(partitions)
        df.write.format("txsink").options(**opts).option("app_id", app_id).option(
            "epoch", str(i)
        ).mode("append").save()
