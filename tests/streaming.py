"""Helpers to run a real streaming query (file source, availableNow) in the shared session."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txsink import Coordinator
from txsink.testing.inputs import INPUT_SCHEMA as SCHEMA
from txsink.testing.inputs import append_input, make_input

__all__ = [
    "CRASH_MATRIX",
    "EVERY_POINT_ONCE",
    "SCHEMA",
    "SINGLE_PASS_MATRIX",
    "append_input",
    "fault_spec",
    "files_coordinator",
    "is_task_point",
    "kill_driver_at_every_point",
    "prepare_input",
    "run_until_done",
    "start_query",
]


def prepare_input(workdir: Path, rows: int = 1000, files: int = 4) -> Path:
    make_input(workdir / "input", rows, files)
    return workdir / "input"


def start_query(
    spark: Any,
    workdir: Path,
    sink: Any,
    *,
    transform: Callable[[Any], Any] | None = None,
    checkpoint: str = "checkpoint",
) -> Any:
    df = (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .parquet(str(workdir / "input"))
        .repartition(2, "id")  # by key: a replay deals each partition its rows
    )
    if transform is not None:
        df = transform(df)
    return (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(workdir / checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def run_until_done(
    spark: Any,
    workdir: Path,
    make_sink: Callable[[], Any],
    *,
    max_runs: int = 6,
    transform: Callable[[Any], Any] | None = None,
) -> tuple[int, list[BaseException]]:
    """Run the query, restarting it after each failure, as a supervisor would.

    Returns (restarts, the errors that stopped each failed run).
    """
    from pyspark.errors import StreamingQueryException

    errors: list[BaseException] = []
    for run in range(max_runs):
        sink = make_sink()
        query = start_query(spark, workdir, sink, transform=transform)
        try:
            query.awaitTermination()
            return run, errors
        except StreamingQueryException as err:
            errors.append(err)
        finally:
            release(sink)
    raise AssertionError(f"query did not finish in {max_runs} runs: {errors[-1]}")


def release(sink: Any) -> None:
    """Close what a stopped query's coordinator (or drop-in sink) holds in this driver, as
    a user does once a query is over; the leak checks count on it."""
    close = getattr(sink, "close", None) or getattr(sink, "release", None)
    if callable(close):
        close()


def files_coordinator(workdir: Path, **options: Any) -> Coordinator:
    from txsink.connectors.files import FilesSink

    fmt = options.pop("format", "parquet")
    return Coordinator(
        [FilesSink(workdir / "output", uid="out", format=fmt)],
        log=str(workdir / "txlog"),
        **options,
    )


# -- the crash matrix every connector is tested with ------------------------------------

#: (point, mode, times): driver points raise; task points raise or kill the worker, once
#: (Spark's task retry absorbs it) or twice (the query fails and restarts).
#: The single-pass points, for variants whose sink commits in its tasks.
SINGLE_PASS_MATRIX = [("before_task_commit", mode, 1) for mode in ("raise", "kill-worker")]
CRASH_MATRIX = [
    ("before_decision", "raise", 1),
    ("after_decision", "raise", 1),
    ("during_commit", "raise", 1),
    ("after_commit_before_mark", "raise", 1),
    ("during_recovery", "raise", 1),
] + [
    (point, mode, times)
    for point in ("before_precommit", "after_precommit")
    for mode in ("raise", "kill-worker")
    for times in (1, 2)
]

#: kill-driver once at every crash point, one epoch after the other (a 6-epoch input).
EVERY_POINT_ONCE = ",".join(
    [
        "before_precommit:kill-driver@0",
        "after_precommit:kill-driver@1",
        "before_decision:kill-driver@2",
        "after_decision:kill-driver@3",
        "during_commit:kill-driver@4",
        "during_recovery:kill-driver@4",
        "after_commit_before_mark:kill-driver@5",
    ]
)
#: The points of EVERY_POINT_ONCE where recovery has the most to do (decided, none
#: committed; part committed, and recovery itself crashing), for default runs that can
#: afford three restarts but not eight.
SOME_POINTS = ",".join(
    [
        "after_decision:kill-driver@1",
        "during_commit:kill-driver@3",
        "during_recovery:kill-driver@3",
    ]
)


def is_task_point(point: str) -> bool:
    from txsink.protocol.faults import TASK_POINTS

    return point in TASK_POINTS


def fault_spec(point: str, mode: str, times: int, epoch: int = 1) -> str:
    """The plan for one matrix cell: task faults hit partition 1 (so "twice" is one task)."""
    if is_task_point(point):
        return f"{point}:{mode}@{epoch}#1*{times}"
    spec = f"{point}:{mode}@{epoch}"
    if point == "during_recovery":  # recovery needs something to recover
        spec = f"during_commit:raise@{epoch},{spec}"
    return spec


def kill_driver_at_every_point(
    workdir: Path,
    sinks: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    *,
    rows: int = 3000,
    log: str | None = None,
    on_line: Callable[[str], None] | None = None,
    single_pass: bool = False,
    points: str = EVERY_POINT_ONCE,
    transform: str | None = None,
) -> Any:
    """Run ``txsink.testing.pipelines:run_stream`` in child processes under ``points``
    (EVERY_POINT_ONCE; ``single_pass``: and a kill-driver at ``before_task_commit`` of
    epoch 2, for sinks that commit in their tasks).

    The restarting runner restarts the child after each SIGKILL until the input
    (``rows`` in 6 files, one per epoch) is done; returns its report. ``env``
    adds to the environment (server addresses for the pipelines' sinks); ``log``
    is the txsink log's location (default ``workdir/txlog``); ``on_line`` sees
    every line the children print; ``transform`` reshapes each epoch
    (:func:`txsink.testing.pipelines.run_stream`).
    """
    from txsink.runner import run_until_done as run_child
    from txsink.testing.inputs import make_input

    make_input(workdir / "input", rows, 6)
    child_env = dict(
        os.environ,
        TXSINK_FAULT=points + (",before_task_commit:kill-driver@2" if single_pass else ""),
        TXSINK_FAULT_STATE=str(workdir / "faults"),
        **(env or {}),
    )
    args: dict[str, Any] = {"workdir": str(workdir), "sinks": sinks}
    if log is not None:
        args["log"] = log
    if transform is not None:
        args["transform"] = transform
    command = [
        sys.executable,
        "-m",
        "txsink.runner",
        "txsink.testing.pipelines:run_stream",
        json.dumps(args),
    ]
    report = run_child(command, env=child_env, max_runs=12, on_line=on_line)
    kills = len(points.split(",")) + (1 if single_pass else 0)
    assert report.finished and report.restarts == kills, report
    assert len(os.listdir(workdir / "faults")) == kills, "a fault never fired"
    return report
