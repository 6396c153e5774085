"""Client jobs of the Spark Connect tests, run in a child process (``connect_server.client_cmd``).

Each job opens ``SparkSession.builder.remote(remote)``: the coordinator is built here, in
the client, and pickled by PySpark to the server's ``foreachBatch`` process.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from txsink.runner import FAILED_LINE
from txsink.testing.pipelines import build_sink, failure_line, input_stream


def stream(
    remote: str,
    workdir: str,
    sinks: list[dict[str, Any]],
    app_id: str | None,
    partitions: int = 2,
    log: str | None = None,
    faults: str | None = None,
    drop_in: bool = False,
    hook: dict[str, Any] | None = None,
    follow: bool = False,
) -> None:
    """Stream ``workdir/input`` (one file per epoch) into the sinks through Connect until the
    input is done; a failed query prints one ``txsink: query failed:`` line and exits 1.

    ``follow``: await the query inside ``coordinator.follow(query)`` (the epoch lines
    printed by this client, read from the log).

    ``hook``: ``{"folder", "point", "epoch"}``, the one hook a test's
    :class:`~txsink.testing.hooks.PointHooks` serves (its action runs in the test's process
    while the pipeline waits at that point)."""
    from pyspark.sql import SparkSession

    from txsink import Coordinator
    from txsink.protocol.faults import FaultPlan

    spark = SparkSession.builder.remote(remote).getOrCreate()
    plan: FaultPlan | None = None
    if faults:
        plan = FaultPlan.parse(faults, str(Path(workdir, "faults")))
    if hook is not None:
        from txsink.protocol.faults import CrashPoint
        from txsink.testing.hooks import Hook, HookPlan

        plan = HookPlan(
            faults=(),
            state_dir=str(Path(workdir, "faults")),
            hooks=(Hook(CrashPoint(hook["point"]), epoch=hook.get("epoch")),),
            folder=hook["folder"],
        )
    location = log or str(Path(workdir, "txlog"))
    built = [build_sink(s) for s in sinks]
    target: Any
    if drop_in:  # foreachBatch(sink): the sink builds its coordinator over there
        (sink,) = built
        target = type(sink)(**_drop_in_args(sinks[0]), log=location, app_id=app_id)
    else:
        target = Coordinator(built, log=location, app_id=app_id, faults=plan)
    query = (
        input_stream(spark, workdir, partitions)
        .writeStream.foreachBatch(target)
        .option("checkpointLocation", str(Path(workdir, "checkpoint")))
        .trigger(availableNow=True)
        .start()
    )
    print(f"txsink-test: query {query.id} started", flush=True)
    try:
        with target.follow(query) if follow else contextlib.nullcontext():
            query.awaitTermination()
    except Exception as err:
        # Connect's error carries the foreachBatch process's traceback: kept whole for tests.
        Path(workdir, "failure.txt").write_text(str(err))
        print(f"{FAILED_LINE}{failure_line(err)}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        spark.stop()


def _drop_in_args(spec: dict[str, Any]) -> dict[str, Any]:
    """A files sink spec as ``FilesSink`` arguments (the drop-in job is files-only)."""
    if spec.get("kind") != "files":
        raise ValueError("the drop-in job takes one files sink")
    return {"path": spec["path"], "uid": spec.get("uid", "out"), "format": spec["format"]}


def start_modes(remote: str, workdir: str, out: str) -> None:
    """Start foreachBatch queries with a continuous trigger and with async progress
    tracking; write what Spark answered at ``start()`` to ``out`` (JSON)."""
    import json

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(remote).getOrCreate()
    answers: dict[str, str] = {}
    for name in ("continuous", "async"):
        writer = (
            spark.readStream.format("rate")
            .load()
            .writeStream.foreachBatch(lambda df, batch_id: None)
            .option("checkpointLocation", str(Path(workdir, f"checkpoint-{name}")))
        )
        if name == "continuous":
            writer = writer.trigger(continuous="1 second")
        else:
            writer = writer.option("asyncProgressTrackingEnabled", "true")
        try:
            writer.start().stop()
            answers[name] = "started"
        except Exception as err:
            answers[name] = str(err).splitlines()[0]
    Path(out).write_text(json.dumps(answers))
    spark.stop()
