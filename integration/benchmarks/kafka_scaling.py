"""Kafka scaling: does txsink's throughput grow with executors? 1 worker vs 2, one run.

    integration/benchmarks/run kafka_scaling [--rows 300000] [--epochs 3]

On the standalone cluster profile (``integration/cluster.py``: a master and N workers of
one core and 1 GiB each, on this machine), for N = 1 then 2: a driver on that cluster, the
kafka benchmark's records cached in N partitions (one task per executor core), and each
writer writing ``--epochs`` epochs into its own fresh topic. txsink runs through one
``Coordinator`` (``write(df, epoch=i)``; its check and first producers paid in the first
epoch, which is not timed): direct mode (one task per partition produces and commits) and
WAL mode with ``shards=N`` (the WAL commit runs one Spark task per shard). The plain
idempotent producer (a new producer per task) is the reference. Records/s use the median of
the timed epochs; the 2 / 1 column is the 2-worker rate over the 1-worker rate (issue #15's
target: >= 1.6x for direct and WAL). Every topic is read back with ``read_committed``.

CPU-seconds per million records by role over the timed epochs (:class:`_bench.CpuMeter`):
``driver`` (the driver's Python and JVM: the protocol's share), ``executors`` (the worker
daemons' trees: executor JVMs and their Python workers) and ``broker``. Unlike the rates,
these do not depend on what else the two cores run, so they show whether adding an executor
adds work per record (it should not) when the wall clock cannot.

On a 2-core machine the driver, the broker and the executors share the cores, so the
ceiling of this ratio is well under 2x; the point is the comparison between writers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from benchmarks import _bench
    from benchmarks.kafka import producer, records
    from benchmarks.kafka.topics import create_topic, delete_topics
except ImportError:  # run as a plain script: python integration/benchmarks/kafka_scaling.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench
    from benchmarks.kafka import producer, records
    from benchmarks.kafka.topics import create_topic, delete_topics

from cluster import driver_conf, running_cluster

from txsink import Coordinator
from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.readback import read_records

WRITERS = ("direct", "wal", "producer")


def _session(master: str, conf: dict[str, str], cores: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName("txsink-bench-kafka-scaling")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.driver.memory", "1g")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _epochs(
    writer: str, bootstrap: str, df: Any, topic: str, args: Any, tmp: Path, meter: Any
) -> tuple[list[float], dict[str, float]]:
    """The seconds of each epoch, and the CPU seconds by role of the timed ones (all but
    the first, which pays the check, the first producers and the JIT)."""
    if writer == "producer":
        first = producer.producer_epochs(bootstrap, df, topic, 1)
        start = meter.snapshot()
        rest = producer.producer_epochs(bootstrap, df, topic, args.epochs - 1)
        return first + rest, meter.delta(start, meter.snapshot())
    partitions = df.rdd.getNumPartitions()
    options: dict[str, Any] = {"mode": writer, "key": "key", "value": "value"}
    if writer == "wal":
        options.update(wal=tmp / f"wal-{topic}", shards=partitions)
    sink = KafkaSink(bootstrap, topic, topic, marker_topic=f"{topic}-markers", **options)
    coordinator = Coordinator([sink], log=tmp / f"log-{topic}", app_id=f"scaling-{topic}")
    seconds: list[float] = []
    before: dict[str, float] = {}
    for epoch in range(args.epochs):
        if epoch == 1:
            before = meter.snapshot()
        t0 = time.perf_counter()
        coordinator.write(df, epoch=epoch)
        seconds.append(time.perf_counter() - t0)
    return seconds, meter.delta(before, meter.snapshot())


def _cpu_roles(delta: dict[str, float]) -> dict[str, float]:
    """The meter's roles folded into the three this benchmark reports."""
    executors = sum(v for k, v in delta.items() if k.startswith("executors-"))
    return {
        "driver": delta.get("driver", 0.0) + delta.get("jvm", 0.0),
        "executors": executors,
        "broker": delta.get("kafka", 0.0),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000, help="records per epoch")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per writer (first: untimed)")
    parser.add_argument("--bootstrap", default=None, help="default: $TXSINK_KAFKA_BOOTSTRAP")
    _bench.add_feed_option(parser)
    args = parser.parse_args(argv)
    bootstrap = args.bootstrap or os.environ["TXSINK_KAFKA_BOOTSTRAP"]
    run = uuid.uuid4().hex[:6]
    rates: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], dict[str, float]] = {}
    ok = True
    for workers in (1, 2):
        with running_cluster(workers=workers) as cluster:
            conf = {**driver_conf(cluster), **_bench.feed_conf(args.feed)}
            spark = _session(cluster.master_url, conf, workers)
            # Executors run under the worker daemons (their own sessions), not the driver.
            roots = {
                "spark": os.getpid(),
                **{
                    f"executors-{name}": proc.pid
                    for name, proc in cluster.processes.items()
                    if name.startswith("worker")
                },
                **_bench.server_pids(["kafka"]),
            }
            meter = _bench.CpuMeter(roots)
            _bench.pickle_by_value("benchmarks.kafka")  # the plain producer's task
            topics: list[str] = []
            try:
                # By the key's hash (direct mode refuses round-robin), for every writer.
                df = spark.range(args.rows).selectExpr(*records.EXPRS)
                df = df.repartition(workers, "key").cache()
                df.count()
                with tempfile.TemporaryDirectory(prefix="txsink-scaling-") as tmp:
                    for writer in WRITERS:
                        topic = f"txsink-scaling-{writer}-{workers}-{run}"
                        topics += [topic, f"{topic}-markers"]
                        create_topic(bootstrap, topic, 8)
                        seconds, used = _epochs(
                            writer, bootstrap, df, topic, args, Path(tmp), meter
                        )
                        timed = args.rows * (args.epochs - 1)
                        cpu[(writer, workers)] = {
                            k: v / timed * 1e6 for k, v in _cpu_roles(used).items()
                        }
                        count = len(read_records(bootstrap, topic))
                        ok &= count == args.rows * args.epochs
                        rates[(writer, workers)] = args.rows / _bench.median(seconds[1:])
                        _bench.log(
                            f"{writer} workers={workers}: {[round(s, 2) for s in seconds]} s, "
                            f"{count} records read back, CPU-s per 1M records "
                            f"{ {k: round(v, 2) for k, v in cpu[(writer, workers)].items()} }"
                        )
            finally:
                delete_topics(bootstrap, topics)
                spark.stop()

    def cpu_cell(w: str, n: int) -> str:
        c = cpu[(w, n)]
        total = sum(c.values())
        return f"{total:.2f} ({c['driver']:.2f} / {c['executors']:.2f} / {c['broker']:.2f})"

    rows = [
        [
            w,
            _bench.fmt_rate(rates[(w, 1)]),
            _bench.fmt_rate(rates[(w, 2)]),
            f"{rates[(w, 2)] / rates[(w, 1)]:.2f}x",
            cpu_cell(w, 1),
            cpu_cell(w, 2),
        ]
        for w in WRITERS
    ]
    print(f"\n{args.rows:,} records per epoch, median of epochs 2..{args.epochs}\n")
    header = ["writer", "1 worker (records/s)", "2 workers (records/s)", "2 / 1"]
    header += [f"CPU-s/1M, {n} (driver / executors / broker)" for n in ("1 worker", "2 workers")]
    print(_bench.markdown_table(header, rows, "lrrrrr"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
