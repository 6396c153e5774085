"""Where a benchmark runs: the machine it records, the Spark session and the cached input."""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from txsink.spark.versions import arrow_byte_cap_setting

from .feed import feed_conf

REPO = Path(__file__).resolve().parents[3]


def machine() -> dict[str, str]:
    """CPU, cores, memory, OS and Java/Python versions, for the record."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
                break
    except OSError:
        pass
    java = "unknown"
    if shutil.which("java"):
        proc = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, check=False, timeout=30
        )
        first = (proc.stderr or proc.stdout).strip().splitlines()
        java = first[0] if first else java
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": java,
    }


def spark_session(
    app_name: str,
    *,
    feed: str,
    jars: Sequence[Path] = (),
    driver_memory: str = "2g",
    slots: int = 2,
    conf: Mapping[str, str] | None = None,
) -> Any:
    """A local SparkSession for benchmarks.

    The settings of :func:`txsink.spark.localspark.local_spark` (``local[2]``, UI off, 2 shuffle
    partitions, workers run this interpreter) except: full JIT (no ``fast_start``: C1-only
    would handicap the JVM-side writers), ``driver_memory`` for the cached input, the given
    jars, and the session time zone pinned to UTC. ``slots``: ``local[slots]`` (a
    single-pass writer runs all of an epoch's tasks at once, so it needs a slot per
    partition; every writer of a run shares the one session). ``conf``: more settings
    (e.g. ``spark.jars.packages`` and SQL extensions), set before the session starts.
    ``feed``: :mod:`.feed`'s settings (``same`` or ``defaults``), for every writer of the
    run alike; checked on the running session (a session left over from an earlier
    ``getOrCreate`` would keep its own).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(f"local[{slots}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    settings = {**(conf or {}), **feed_conf(feed)}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    cap = arrow_byte_cap_setting()
    chosen = spark.conf.get(cap, None) if cap is not None else None
    if cap is not None and chosen != settings.get(cap):
        raise RuntimeError(f"feed {feed!r}: the session has {cap}={chosen}")
    return spark


def pickle_by_value(package: str) -> None:
    """Ship ``package`` (a benchmark's own package, e.g. ``benchmarks.kafka``) into Spark's
    tasks by value: its task functions, and the sink subclasses of its profile runs, are
    pickled with their code (as they were when each benchmark was one module run as
    ``__main__``), so the Python workers never import ``integration/``, which a plain-script
    run does not put on their path. Code shipped this way must not use this package."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(importlib.import_module(package))  # type: ignore[no-untyped-call]


def cached_frame(
    spark: Any, rows: int, partitions: int, columns: Sequence[str], key: str | None = None
) -> Any:
    """The input: ``columns`` (Spark SQL ``expr AS name`` over ``spark.range``'s ``id``)
    for ``rows`` rows, in ``partitions`` partitions, cached and materialised, so no writer
    pays for generating it. ``key``: partitioned by that column's hash (stable across
    re-runs, which txsink's replaying modes require) rather than round-robin."""
    data = spark.range(0, rows, 1, 2).selectExpr(*columns)
    data = data.repartition(partitions, key) if key else data.repartition(partitions)
    df = data.cache()
    if df.count() != rows:
        raise RuntimeError("generated frame has the wrong row count")
    return df
