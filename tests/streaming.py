"""Helpers to run a real streaming query (file source, availableNow) in the shared session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from txsink import Coordinator
from txsink.demo import make_input

SCHEMA = "id long, key string, amount double, payload string"


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
        .repartition(2)
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
        query = start_query(spark, workdir, make_sink(), transform=transform)
        try:
            query.awaitTermination()
            return run, errors
        except StreamingQueryException as err:
            errors.append(err)
    raise AssertionError(f"query did not finish in {max_runs} runs: {errors[-1]}")


def files_coordinator(workdir: Path, **options: Any) -> Coordinator:
    from txsink.connectors.files import FilesSink

    fmt = options.pop("format", "parquet")
    return Coordinator(
        [FilesSink(workdir / "output", uid="out", format=fmt)],
        log=str(workdir / "txlog"),
        **options,
    )
