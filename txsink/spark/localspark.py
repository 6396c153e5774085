"""A local SparkSession set up for txsink: the demo, tests, chaos runs and notebooks.

Run as a module (``python -m txsink.spark.localspark WORKDIR``) it is the workload that trains
the JVM class-data-sharing archive of :mod:`txsink.spark.jvmcds`: a tiny streaming query over
a file source into ``foreachBatch`` with one partition job, then a clean JVM exit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["local_spark"]


def local_spark(
    master: str = "local[2]",
    app_name: str = "txsink",
    *,
    fast_start: bool = True,
    quiet: bool = True,
) -> Any:
    """A local SparkSession set up for txsink (workers run this interpreter).

    ``fast_start`` trades peak JIT throughput for a ~30% faster JVM start
    (C1 only, serial GC), and maps Spark's classes from a class-data-sharing archive
    when one was built (:mod:`txsink.spark.jvmcds`, about half the start again): right for
    the demo, tests and chaos runs, not for long jobs.

    Spark's console stays quiet: no progress bar (``spark.ui.showConsoleProgress``: its
    ``\r`` updates would share a line with txsink's epoch lines in a log file), and with
    ``quiet`` (the default) the JVM starts with a log4j2 configuration at ERROR, so Spark's
    start-up banner and WARN lines (default profile, loopback hostname, native Hadoop,
    adaptive execution in streaming) stay out of the output of the demo, chaos runs and
    ``txsink check``. ``quiet=False`` keeps Spark's own log4j2 profile for the start-up
    lines; either way the session logs at ERROR once started (``setLogLevel``). The JVM's
    own ``WARNING: Using incubator modules`` line is not Spark's logging: Spark's launcher
    always adds that module, and the JVM says so before any configuration applies.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
    )
    options: list[str] = []
    if fast_start:
        from txsink.spark.jvmcds import java_options

        options += ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", java_options()]
    if quiet:
        options.append(f"-Dlog4j2.configurationFile={_quiet_log4j2()}")
    if any(options):
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(filter(None, options)))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_QUIET_LOG4J2 = """\
# txsink: a local session's Spark console, errors only (txsink prints what happens)
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
# Spark takes a shell's level from the logger of the class that starts its logging (PySpark's
# gateway, Spark's shell) and prints a "Setting default log level" banner when it differs
# from the root's: the same level, no banner
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def _quiet_log4j2() -> Path:
    """The ERROR-only log4j2 configuration, written once to the user's cache folder (the
    JVM reads it by path)."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "txsink"
    path = folder / "log4j2-quiet.properties"
    if not path.is_file() or path.read_text() != _QUIET_LOG4J2:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_QUIET_LOG4J2)
        tmp.replace(path)
    return path


def _train(workdir: Path) -> None:
    """The archive's training run: the classes a txsink query loads (file stream source,
    foreachBatch, a partition job with Arrow), then a clean JVM exit, which is when
    ``-XX:ArchiveClassesAtExit`` writes the archive."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from txsink.spark.jobs import SparkEpochData

    (workdir / "input").mkdir(parents=True, exist_ok=True)
    for i in range(2):
        ids = range(i * 20, i * 20 + 20)
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int64()), "key": [f"k{n}" for n in ids]}),
            workdir / "input" / f"input-{i}.parquet",
        )

    def epoch(df: Any, _batch_id: int) -> None:
        SparkEpochData(df.repartition(2)).map_partitions(_count)

    spark = local_spark("local[2]", "txsink-cds")
    query = (
        spark.readStream.schema("id long, key string")
        .option("maxFilesPerTrigger", 1)
        .parquet(str(workdir / "input"))
        .writeStream.foreachBatch(epoch)
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    proc = spark.sparkContext._gateway.proc
    spark.stop()
    # The gateway JVM exits when its stdin closes; wait for it so the archive is complete.
    proc.stdin.close()
    raise SystemExit(proc.wait(timeout=120))


def _count(_task: Any, batches: Any) -> int:
    return sum(batch.num_rows for batch in batches)


if __name__ == "__main__":
    from txsink.spark.cdsbuild import die_with_builder

    die_with_builder()  # a killed builder must not leave this run (and its JVM) behind
    _train(Path(sys.argv[1]))
