"""``txsink check``: a pipeline's checks before it starts, against its real targets.

``--pipeline FILE.py:FUNC`` names the function that builds what the query passes to
``foreachBatch`` (a Coordinator, or a sink with ``log=``), as for ``txsink recover``. The
schema of the DataFrame the query writes comes from ``--schema`` (Spark DDL, what
``spark.readStream.schema(...)`` takes; parsed by a local Spark session; the query is
taken to be a streaming one) or, without it, from the function returning
``(coordinator, df)``. ``--checkpoint`` is the query's
``checkpointLocation``: its ``metadata`` names the query (the txsink app id).

Prints one ``ok`` line per passed check and a summary on stdout, one line per failed
check on stderr (``txsink check: [sink_uid=…, phase=check, connector=…] message``), and
exits 0 when every check passed, else 1.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from txsink.cli import log_location_help
from txsink.cli.pipeline import load_checked
from txsink.errors import ConfigurationError, TxsinkError
from txsink.ops.precheck import one_line, run_checks

__all__ = ["add_arguments", "check_command"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pipeline",
        required=True,
        metavar="FILE.py:FUNC",
        help="function returning the query's Coordinator (or a sink with log=), or that and "
        "the DataFrame the query writes: (coordinator, df)",
    )
    parser.add_argument(
        "--schema",
        metavar="DDL",
        help="the schema of the DataFrame the query writes, as Spark DDL "
        "('id long, name string'); default: the DataFrame FUNC returns",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="the query's checkpointLocation (a local path): the query id it keeps is the "
        "app id the log and the sinks are checked for",
    )
    parser.add_argument(
        "--log", default=None, help=log_location_help("the txsink log (default: the pipeline's)")
    )


def check_command(args: argparse.Namespace) -> int:
    spark = None  # a session this command started (and stops)
    try:
        coordinator, df = load_checked(args.pipeline, args.log)
        if args.schema is not None:
            spark, df = _empty_frame(args.schema)
        elif df is None:
            raise ConfigurationError(
                f"--pipeline {args.pipeline!r} returned no DataFrame: pass --schema "
                "'<Spark DDL of the DataFrame the query writes>', or return (coordinator, df)"
            )
        results = run_checks(
            df,
            log=coordinator.log,
            sinks=coordinator.sinks,
            app_id=coordinator.app_id,
            checkpoint=args.checkpoint,
            from_savepoint=coordinator.from_savepoint,
            streaming=True if args.schema is not None else None,
        )
    except TxsinkError as err:
        print(f"txsink check: {one_line(err)}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()
    failed = [r for r in results if not r.ok]
    for result in results:
        if result.error is None:
            print(result.line())
        else:
            print(f"txsink check: {one_line(result.error)}", file=sys.stderr)
    if failed:
        print(f"txsink check: {len(failed)} of {len(results)} checks failed")
        return 1
    print(f"txsink check: all {len(results)} checks passed")
    return 0


def _empty_frame(ddl: str) -> tuple[Any, Any]:
    """An empty DataFrame of the schema ``ddl``, in the active Spark session (the pipeline
    may have made one) or a local one; that local session is returned (to be stopped)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from txsink.spark.localspark import local_spark

    if SparkContext._active_spark_context is not None:  # the pipeline's own session
        spark, started = SparkSession.builder.getOrCreate(), None
    else:
        spark = started = local_spark("local[1]", "txsink-check")
    try:
        return started, spark.createDataFrame([], schema=ddl)
    except Exception as err:  # Spark's ParseException, with its own long message
        if started is not None:
            started.stop()
        first = str(err).strip().splitlines()
        raise ConfigurationError(
            f"--schema {ddl!r} is not a Spark DDL schema ({first[0] if first else err}): "
            "write it as for spark.readStream.schema(...), e.g. 'id long, name string'"
        ) from err
