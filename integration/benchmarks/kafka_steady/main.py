"""The steady-state Kafka benchmark's command line, run, results and report
(``integration/benchmarks/run kafka_steady --help``)."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import benchmarks.kafka_steady
from benchmarks import _bench
from benchmarks.kafka import spark_sink
from benchmarks.kafka.main import broker_pid
from benchmarks.kafka.measure import readback_problems
from benchmarks.kafka.report import LABELS, TARGETS
from benchmarks.kafka.report import Results as OneShot
from benchmarks.kafka.topics import create_topic, delete_topics, read_back

from . import queries, source

#: ``--quick``: a smoke run in a minute or two.
QUICK = {"rows": 20_000, "epochs": 6, "skip": 2, "repeat": 1, "warmup": 0}


@dataclass
class Results(_bench.Results):
    """One measurement per query: ``rows`` the records of the measured epochs, ``seconds``
    from the end of epoch ``skip - 1`` to the end of the last; ``extra`` holds the CPU by
    role, every epoch's own seconds and the first epochs' seconds."""

    name: ClassVar[str] = "kafka_steady"
    title: ClassVar[str] = "Kafka, steady state"
    server: ClassVar[str] = "kafka"
    baseline: ClassVar[str] = "spark"
    after: ClassVar[str | None] = None  # the headline: at the end, then moved by hand
    from_args: ClassVar[tuple[str, ...]] = ("topic_partitions", "epochs", "skip")

    topic_partitions: int = 0
    epochs: int = 0
    skip: int = 0
    epoch_rows: int = 0

    def cpu_total(self, writer: str, partitions: int) -> float:
        """CPU-seconds per million records of Spark (driver, JVM, workers) and the broker
        (when it runs here and was measured)."""
        broker = self.cpu_per_row(writer, partitions, "kafka")
        return self.cpu_per_row(writer, partitions, "spark") + (broker if broker == broker else 0)


def _options(p: _bench.BenchParser) -> None:
    p.add_count("--epochs", 30, "epochs per query (default 30)")
    p.add_count("--skip", 5, "first epochs left out of the figures (default 5)")
    p.add_count("--topic-partitions", 8, "partitions of each topic (default 8)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke size: "
        + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
        + " (overrides them)",
    )


def parser() -> _bench.BenchParser:
    return _bench.BenchParser(
        Results,
        benchmarks.kafka_steady.__doc__,
        writers=queries.WRITERS,
        server=_bench.Server("--bootstrap", "TXSINK_KAFKA_BOOTSTRAP", "broker"),
        unit="records per epoch",
        rows=100_000,
        partitions="Spark partition counts",
        partitions_default="2",
        options=_options,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    argv = list(argv) if argv is not None else None
    return _bench.main(argv, p, Results, run, render)


def run(res: Results, args: argparse.Namespace) -> list[str]:
    """Every writer's query at every partition count, ``--repeat`` times, into ``res``."""
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
        res.repeat, res.epochs, res.skip = args.repeat, args.epochs, args.skip
    if args.skip >= args.epochs:
        raise SystemExit("--skip must be below --epochs")
    res.epoch_rows = args.rows
    res.rows = args.rows * (args.epochs - args.skip)
    writers = list(args.writers)
    jars = spark_sink.jars(OneShot(0, [], 0), writers)
    _bench.pickle_by_value("benchmarks.kafka")  # the producer's and the feed's tasks
    spark = _bench.spark_session(
        "txsink-bench-kafka-steady",
        feed=args.feed,
        jars=jars,
        slots=max(2, *args.partitions),  # direct: a slot per partition, for every writer
        conf=source.SESSION_CONF,
    )
    cpu = _bench.CpuMeter({"spark": os.getpid(), **broker_pid(args.bootstrap)})
    meters: dict[str, queries.Meter] = {}
    spark.streams.addListener(queries.listener(cpu, meters))
    run_id = uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="txsink-bench-steady-"))
    void: list[str] = []
    try:
        for p in args.partitions:
            folder = workdir / f"p{p}"
            data = source.write_epochs(spark, folder, args.epochs, args.rows, p)
            expected = source.fingerprint(spark, data)
            stream = source.stream(spark, data, p)
            # Untimed, full size, every writer alike: the JVM's JIT settles over the first
            # queries of a session, whichever writer runs them.
            for i in range(args.warmup if p == args.partitions[0] else 0):
                _bench.log(f"warm-up {i + 1} (untimed): every writer's query once")
                for writer in ["feed", *writers]:
                    m = _one(args, writer, p, f"p{p}-warm{i}", stream, folder, run_id, meters,
                             expected)  # fmt: skip
                    void += [m.extra["void"]] if "void" in m.extra else []
            for rep in range(args.repeat):
                for writer in _bench.rotated(["feed", *writers], rep):
                    m = _one(args, writer, p, f"p{p}-r{rep}", stream, folder, run_id, meters,
                             expected)  # fmt: skip
                    res.runs.append(m)
                    void += [m.extra["void"]] if "void" in m.extra else []
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return void


def _one(
    args: argparse.Namespace,
    writer: str,
    p: int,
    tag: str,
    stream: Any,
    folder: Path,
    run_id: str,
    meters: dict[str, queries.Meter],
    expected: tuple[int, ...],
) -> _bench.Measurement:
    """One query of ``writer``: run, meter, read back, verify; its measurement."""
    topic = f"txsink-bench-steady-{writer}-{tag}-{run_id}"
    # Its own marker topic: a topic deleted after one query and created again by the next
    # is refused (UNKNOWN_TOPIC_OR_PART) while the brokers still delete the old one.
    marker_topic = f"txsink-bench-steady-markers-{writer}-{tag}-{run_id}"
    qdir = folder / f"{writer}-{tag}"
    target = queries.Target(args.bootstrap, topic, marker_topic, qdir, p)
    if writer != "feed":
        create_topic(args.bootstrap, topic, args.topic_partitions)
    total = args.rows * args.epochs
    problems: list[str] = []
    load_before = _bench.load1()
    try:
        meter = queries.run_query(writer, stream, target, meters, args.epochs)
        if writer != "feed":
            problems += readback_problems(read_back(args.bootstrap, topic, total), total, expected)
    except Exception as err:  # a writer that fails is void; the others still run
        meter = queries.Meter("failed")
        problems.append(f"failed: {_bench.first_line(err)}")
    finally:
        if writer != "feed":
            mine = [marker_topic] if writer in queries.TXSINK_MODES else []
            delete_topics(args.bootstrap, [topic, *mine])
        shutil.rmtree(qdir, ignore_errors=True)
    m = _measurement(writer, p, args, meter, load_before, problems)
    _bench.void_if(problems, m, tag, [])
    _bench.log_run(m, tag, width=8, unit="rec/s")
    return m


def _measurement(
    writer: str,
    p: int,
    args: argparse.Namespace,
    meter: queries.Meter,
    load_before: float,
    problems: list[str],
) -> _bench.Measurement:
    """The measured window of ``meter``'s epochs as a measurement (or an empty, void one)."""
    start, last = args.skip - 1, args.epochs - 1
    window = [meter.epochs.get(b) for b in range(start + 1, last + 1)]
    first, end = meter.epochs.get(start), meter.epochs.get(last)
    if first is None or end is None or any(e is None for e in window):
        if not problems:
            problems.append(f"epochs missing from the listener: saw {sorted(meter.epochs)}")
        return _bench.Measurement(
            writer, p, 0, float("nan"), load_before, _bench.load1(), {"cpu": {}}
        )
    epochs = [e for e in window if e is not None]
    rows = sum(e.rows for e in epochs)
    if rows != args.rows * len(epochs):
        problems.append(f"the measured epochs held {rows} records, not {args.rows} each")
    extra: dict[str, Any] = {
        "cpu": _bench.CpuMeter.delta(first.cpu, end.cpu),
        "epochs_s": [e.trigger_s for e in epochs],
        "first_epochs_s": [
            meter.epochs[b].trigger_s for b in range(start + 1) if b in meter.epochs
        ],
    }
    return _bench.Measurement(
        writer, p, rows, end.at - first.at, load_before, _bench.load1(), extra
    )


# -- the report ----------------------------------------------------------------------------


def render(res: Results) -> str:
    """The section: setup, the table (rate, ratio to Spark's sink, CPU per record by role),
    the epochs' own times, and the targets against Spark's sink in CPU per record."""
    labels = {**LABELS, "producer": "plain idempotent producer (foreachBatch)"}
    shown = [w for w in (*queries.WRITERS, "feed") if any(res.of(w, p) for p in res.partitions)]
    parts = [
        *_bench.header(res, "Kafka, steady state (one streaming query per writer)"),
        f"- Each writer runs one streaming query over {res.epochs} epochs of "
        f"{res.epoch_rows:,} records (`trigger(availableNow=True)`, one epoch of pre-generated "
        f"Parquet files per micro-batch); the first {res.skip} epochs are left out; figures "
        f"cover the other {res.epochs - res.skip} ({res.rows:,} records), "
        f"{res.repeat} query run(s) per writer after an untimed one of every writer "
        "(`--warmup`), writers and the feed rotated between runs. Topics of "
        f"{res.topic_partitions} partitions, read back with `read_committed`: exactly every "
        "record of every epoch.",
        *_bench.cpu_blocks(res, labels, shown, over="spark", servers=[("kafka", "Kafka broker")]),
        *_bench.blocks(_epoch_table(res, labels, shown), title="Epochs"),
        *_bench.blocks(_target_table(res), title="Targets (CPU per record vs Spark's sink)"),
    ]
    return "\n".join(parts) + "\n"


def _epoch_table(res: Results, labels: dict[str, str], shown: Sequence[str]) -> str:
    rows = []
    for p in res.partitions:
        for w in shown:
            runs = res.of(w, p)
            epochs = [s for m in runs for s in m.extra.get("epochs_s", [])]
            firsts = [s for m in runs for s in m.extra.get("first_epochs_s", [])[:1]]
            if epochs:
                rows.append(
                    [
                        str(p),
                        labels.get(w, w),
                        _bench.ms(epochs),
                        _bench.spread(epochs),
                        _bench.ms(firsts),
                    ]
                )
    return _bench.markdown_table(
        ["partitions", "writer", "ms per epoch (median)", "range", "first epoch ms"],
        rows,
        "rlrrr",
    )


#: Issue #37's targets: CPU per record against Spark's own Kafka sink in steady state.
CPU_TARGETS = {"direct": 1.1, "wal": 1.25, "replay": 1.6}


def _target_table(res: Results) -> str:
    rows = []
    for p in res.partitions:
        spark = res.cpu_total("spark", p)
        for w, target in CPU_TARGETS.items():
            if not res.of(w, p) or spark != spark:
                continue
            ratio = res.cpu_total(w, p) / spark
            if ratio != ratio:  # its runs were void
                rows.append([str(p), w, "not measured", f"<= {target}x", "", "", ""])
                continue
            rows.append(
                [
                    str(p),
                    w,
                    f"{ratio:.2f}x",
                    f"<= {target}x",
                    "met" if ratio <= target else "NOT met",
                    _bench.ratio_range_cell(res, w, p, "spark"),
                    f">= {TARGETS[w]}x",
                ]
            )
    return _bench.markdown_table(
        [
            "partitions",
            "mode",
            "CPU per record / Spark's sink",
            "target",
            "",
            "rate / Spark's",
            "one-shot rate target",
        ],
        rows,
        "rlrrlrr",
    )
