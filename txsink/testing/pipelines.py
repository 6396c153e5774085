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

import sys
from pathlib import Path
from typing import Any

from txsink.observe.logs import one_line
from txsink.runner import FAILED_LINE, exit_code
from txsink.testing.adapter import build_sink
from txsink.testing.inputs import INPUT_SCHEMA

__all__ = ["SCHEMA", "build_sink", "failure_line", "run_datasource", "run_stream"]

#: The schema of the input files (:func:`txsink.testing.inputs.make_input`).
SCHEMA = INPUT_SCHEMA


def input_stream(spark: Any, workdir: str | Path, partitions: int) -> Any:
    """The test input as a stream: one Parquet file of ``workdir/input`` per epoch
    (:func:`~txsink.testing.inputs.make_input`), in ``partitions`` partitions."""
    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(Path(workdir, "input")))
        .repartition(partitions, "id")
    )


def run_stream(
    workdir: str,
    sinks: list[dict[str, Any]],
    partitions: int = 2,
    log: str | None = None,
    master: str | None = None,
    *,
    lease_s: float | None = None,
    hooks: dict[str, Any] | None = None,
    factory: str | None = None,
    transform: str | None = None,
) -> None:
    """Stream ``workdir/input`` (one file per epoch) into the sinks until the input is done.

    ``transform``: ``module:function`` or ``file.py:function`` taking ``(df, batch_id)`` and
    returning the epoch's DataFrame: a stream whose schema changes between epochs, say
    (docs/schema-evolution.md).

    ``factory``: ``module:function`` or ``file.py:function`` returning more sinks, built in
    this process (after those of ``sinks``): for sinks whose settings no spec can carry,
    e.g. credentials read from files, so that no secret travels in the arguments.

    ``log``: the txsink log's location (default ``workdir/txlog``), e.g. an ``s3://`` URL.
    ``master``: a Spark master URL (default ``local[partitions]``), e.g. ``spark://host:port``;
    further settings for it can come from ``PYSPARK_SUBMIT_ARGS``.
    ``lease_s``: the coordinator's driver lease length. ``hooks``: pauses at crash points
    served by the test's process (:meth:`txsink.testing.hooks.PointHooks.spec`).
    It prints what txsink prints by default (one line per epoch; see docs/logging.md). A
    failed query prints one ``txsink: query failed: ...`` line, the txsink error's own
    message when the failure is one, and exits with code 1, or with
    :data:`~txsink.runner.FATAL_EXIT` when a restart would meet the same error (a
    configuration error, an internal error: the restarting runner stops there).

    The driver lease is taken before the Spark session starts
    (:meth:`~txsink.Coordinator.hold_lease`): a second driver of the same query is refused
    before its query touches Spark's checkpoint.
    """
    from txsink import Coordinator
    from txsink.protocol.faults import FaultPlan
    from txsink.spark.localspark import local_spark
    from txsink.testing.hooks import plan_from_spec

    faults = FaultPlan.from_env()
    built = [build_sink(s) for s in sinks]
    if factory is not None:
        from txsink.runner import load_callable

        built += list(load_callable(factory)())  # type: ignore[call-overload]
    coordinator = Coordinator(
        built,
        log=log or str(Path(workdir, "txlog")),
        lease_s=lease_s,
        faults=plan_from_spec(hooks, faults) if hooks else faults,
    )
    try:
        coordinator.hold_lease()
    except Exception as err:  # another driver runs this query: refused, nothing touched
        print(f"{FAILED_LINE}{failure_line(err)}", file=sys.stderr, flush=True)
        raise SystemExit(exit_code(err)) from None
    spark = local_spark(master or f"local[{partitions}]", "txsink-pipeline")
    failures: list[Exception] = []

    shape: Any = None
    if transform is not None:
        from txsink.runner import load_callable

        shape = load_callable(transform)

    def epoch(df: Any, batch_id: int) -> None:
        try:
            coordinator(df if shape is None else shape(df, batch_id), batch_id)
        except Exception as err:  # remembered for the failure line; Spark gets it as is
            failures.append(err)
            raise

    try:
        query = (
            input_stream(spark, workdir, partitions)
            .writeStream.foreachBatch(epoch)
            .option("checkpointLocation", str(Path(workdir, "checkpoint")))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    except Exception as err:
        cause = failures[-1] if failures else err
        print(f"{FAILED_LINE}{failure_line(cause)}", file=sys.stderr, flush=True)
        raise SystemExit(exit_code(cause)) from None
    finally:
        coordinator.close()
        spark.stop()


def run_datasource(
    workdir: str,
    options: dict[str, str],
    *,
    env_options: dict[str, str] | None = None,
    partitions: int = 2,
    static: bool = False,
    app_id: str = "static",
    master: str | None = None,
    remote: str | None = None,
) -> None:
    """The same stream into one sink through ``format("txsink")`` (the Data Source path).

    ``options`` are the format's (``connector``, the sink's parameters; ``log`` defaults to
    ``workdir/txlog``); ``env_options`` names options read from environment variables (a DSN:
    no secret on a command line). ``static``: write input file ``i`` as the static epoch
    ``i`` instead (``df.write.format("txsink")``, explicit epochs: a re-run after a crash
    writes nothing twice). ``TXSINK_DS_AUTOREGISTER=1``: rely on PySpark's automatic
    registration instead of :func:`txsink.datasource.register`. ``remote``: a Spark Connect
    URL (``sc://host:port``) to run the query through instead of a local classic session.
    """
    import os

    from txsink.datasource import error_text, format_not_found, register
    from txsink.spark.localspark import local_spark

    if remote is not None:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.remote(remote).getOrCreate()
    else:
        spark = local_spark(master or f"local[{partitions}]", "txsink-datasource")
    opts = {"log": str(Path(workdir, "txlog")), **options}
    opts |= {key: os.environ[var] for key, var in (env_options or {}).items()}
    try:
        if os.environ.get("TXSINK_DS_AUTOREGISTER") != "1":
            register(spark)  # on Spark 3.5: UnsupportedSparkError, the query not started
        if static:
            files = sorted(Path(workdir, "input").glob("*.parquet"))
            for i, path in enumerate(files):
                df = spark.read.schema(SCHEMA).parquet(str(path)).repartition(partitions, "id")
                writer = df.write.format("txsink").options(**opts).mode("append")
                writer.option("app_id", app_id).option("epoch", str(i)).save()
            return
        query = (
            input_stream(spark, workdir, partitions)
            .writeStream.format("txsink")
            .options(**opts)
            .option("checkpointLocation", str(Path(workdir, "checkpoint")))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    except Exception as err:
        fix = format_not_found(err)
        text = error_text(err) or str(fix or "") or failure_line(err)
        print(f"{FAILED_LINE}{text}", file=sys.stderr, flush=True)
        raise SystemExit(exit_code(fix or err)) from None
    finally:
        spark.stop()


def failure_line(err: BaseException) -> str:
    """``Type: message`` in one line, cut at a word (Spark's wrapping and JVM traces left
    out)."""
    return one_line(f"{type(err).__name__}: {err}", 400)
