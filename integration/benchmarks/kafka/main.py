"""The Kafka benchmark's command line and run: every writer at every partition count, then
the extras (``integration/benchmarks/run kafka --help``)."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchmarks.kafka
import pyarrow as pa
from benchmarks import _bench

from txsink.connectors.kafka.readback import admin_client

from . import spark_sink
from .context import Bench
from .measure import measure, profile_run
from .reading import render
from .records import make_frame, spark_fingerprint
from .report import WRITERS, Results
from .single import single_process
from .topics import delete_topics


def broker_pid(bootstrap: str) -> dict[str, int]:
    """``{"kafka": pid}`` of the broker if it is integration/services' local one."""
    if not bootstrap.startswith(("127.0.0.1:", "localhost:")):
        return {}
    try:
        pid = int(_bench.REPO.joinpath("integration/.work/pids/kafka.pid").read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return {}
    return {"kafka": pid} if b"kafka" in cmdline else {}


def _versions(bench: Bench) -> dict[str, str]:
    import confluent_kafka
    import pyspark
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    broker = "?"
    if broker_pid(bench.bootstrap):
        try:
            from _services.kafka import KAFKA_VERSION

            broker = KAFKA_VERSION
        except ImportError:
            pass
    admin = admin_client(bench.bootstrap)
    meta = admin.list_topics(timeout=30)
    res = ConfigResource(ResourceType.BROKER, str(next(iter(meta.brokers))))
    configs = admin.describe_configs([res])[res].result(timeout=30)

    def conf(name: str) -> str:
        entry = configs.get(name)
        return str(entry.value) if entry is not None else "?"

    flush = conf("log.flush.interval.messages")
    settings = (
        "no fsync per write (page cache)" if flush == str(2**63 - 1) else f"flush every {flush}"
    ) + f", num.io.threads {conf('num.io.threads')}, data on the same disk"
    return {
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
        "confluent_kafka": str(confluent_kafka.__version__),
        "librdkafka": confluent_kafka.libversion()[0],
        "broker": broker,
        "broker_settings": settings,
    }


def parser() -> _bench.BenchParser:
    return _bench.BenchParser(
        Results,
        benchmarks.kafka.__doc__,
        writers=WRITERS,
        server=_bench.Server("--bootstrap", "TXSINK_KAFKA_BOOTSTRAP", "broker"),
        unit="records",
        partitions="Spark partition counts",
        extras="skip the profile runs and the single-process measurements",
        options=lambda p: p.add_count(
            "--topic-partitions", 8, "partitions of each topic (default 8)"
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    return _bench.main(argv, parser(), Results, run, render)


def session(args: argparse.Namespace, jars: Sequence[Path]) -> Any:
    """The one Spark session every writer of the run shares: its settings are here and in
    ``_bench.spark_session``, nowhere else."""
    _bench.pickle_by_value("benchmarks.kafka")  # the task code of this package
    # The direct writer runs an epoch's tasks all at once: a slot per partition, for every
    # writer alike (on 2 cores, more slots than cores only interleave the tasks).
    slots = max(2, *args.partitions) if "direct" in args.writers else 2
    return _bench.spark_session("txsink-bench-kafka", feed=args.feed, jars=jars, slots=slots)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every writer at every partition count, then the extras, into ``res``; the void runs."""
    writers = list(args.writers)
    spark = session(args, spark_sink.jars(res, writers))
    run_id = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="txsink-bench-kafka-"))
    bench = Bench(
        spark,
        args.bootstrap,
        args.topic_partitions,
        workdir,
        _bench.CpuMeter({"spark": os.getpid(), **broker_pid(args.bootstrap)}),
        run_id,
        marker_topic=f"txsink-bench-markers-{run_id}",
    )
    try:
        res.versions = _versions(bench)
        for p in args.partitions:
            _bench.log(f"generating {args.rows:,} records in {p} partitions")
            df = make_frame(spark, args.rows, p)
            expected = spark_fingerprint(df)
            res.data_bytes = expected[1] + expected[2]
            res.value_bytes = expected[2]
            common: dict[str, Any] = {"rows": args.rows, "partitions": p, "expected": expected}
            for i in range(args.warmup if p == args.partitions[0] else 0):
                _bench.log(f"warm-up {i + 1} (untimed): every writer once, full size")
                for writer in ("feed", *writers):
                    measure(bench, writer, df, tag=f"p{p}-warm{i}", **common)
            for rep in range(args.repeat):
                res.runs.append(measure(bench, "feed", df, tag=f"p{p}-r{rep}", **common))
                for writer in _bench.rotated(writers, rep):
                    res.runs.append(measure(bench, writer, df, tag=f"p{p}-r{rep}", **common))
            if not args.no_extras:
                for mode in ("wal", "replay"):
                    if mode in writers:
                        _bench.log(f"profile run {mode} P={p}")
                        res.profiles[(mode, p)] = profile_run(
                            bench, mode, df, tag=f"p{p}-profile", **common
                        )
                if p == args.partitions[0]:
                    _bench.log("single-process steps (no Spark)")
                    try:
                        res.single = single_process(bench, df, args.rows, expected)
                    except Exception as err:  # extras only: the tables above still stand
                        _bench.log(f"single-process steps failed: {_bench.first_line(err)}")
            df.unpersist(blocking=True)
    finally:
        delete_topics(bench.bootstrap, [*bench.topics, bench.marker_topic])
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return bench.void
