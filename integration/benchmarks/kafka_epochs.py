"""Kafka per-epoch overhead: many small epochs of one query, txsink's modes next to a plain
idempotent producer, in one run.

    integration/benchmarks/run kafka_epochs [--rows 10000] [--epochs 12] [--partitions 2]

Each writer writes ``--epochs`` epochs of ``--rows`` records (the kafka benchmark's records:
a string key and a ~207-byte JSON value) into its own fresh topic, the way a streaming
query does: txsink through one ``Coordinator`` whose ``write(df, epoch=i)`` runs epoch after
epoch (its check, the first epoch's producers and Python workers are paid once, as in a
stream); the plain producer through ``mapInArrow`` tasks with a new producer in each task
(what a ``foreachBatch`` with confluent-kafka does). The first epoch of each writer is a
warm-up; the table shows the median and the range of the others, and the ratio of medians
against the plain producer (issue #15's target: direct within 1.3x). Every topic is read
back with ``read_committed``: the record count must be exact. CPU-seconds per million
records by role (Spark's JVM, its Python workers, the driver, the broker) cover the epochs
after the warm-up. ``--feed`` as in every benchmark (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    from benchmarks import _bench
    from benchmarks.kafka import producer, records
    from benchmarks.kafka.main import broker_pid
    from benchmarks.kafka.topics import create_topic, delete_topics
except ImportError:  # run as a plain script: python integration/benchmarks/kafka_epochs.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench
    from benchmarks.kafka import producer, records
    from benchmarks.kafka.main import broker_pid
    from benchmarks.kafka.topics import create_topic, delete_topics

from txsink import Coordinator
from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.readback import read_records

MODES = ("direct", "wal", "replay")


def _txsink_epoch(
    bootstrap: str, mode: str, topic: str, partitions: int, tmp: Path
) -> Callable[[Any, int], None]:
    """One txsink Coordinator, as a stream keeps it: its check, the first epoch's producers
    and Python workers are paid once."""
    options: dict[str, Any] = {"mode": mode, "key": "key", "value": "value"}
    if mode == "wal":
        options["wal"] = tmp / f"wal-{topic}"
    if mode == "replay":
        options["shards"] = partitions
    sink = KafkaSink(bootstrap, topic, topic, marker_topic=f"{topic}-markers", **options)
    coordinator = Coordinator([sink], log=tmp / f"log-{topic}", app_id=f"epochs-{topic}")

    def one(df: Any, epoch: int) -> None:
        coordinator.write(df, epoch=epoch)

    return one


def _producer_epoch(bootstrap: str, topic: str) -> Callable[[Any, int], None]:
    """What a ``foreachBatch`` with confluent-kafka does: a new producer in every task."""

    def one(df: Any, epoch: int) -> None:
        producer.write_producer(bootstrap, df, topic)

    return one


def _count(bootstrap: str, topic: str) -> int:
    return len(read_records(bootstrap, topic))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="integration/benchmarks/run kafka_epochs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--rows", type=int, default=10_000, help="records per epoch")
    parser.add_argument("--epochs", type=int, default=12, help="epochs per writer (first: warm-up)")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions per epoch")
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("TXSINK_KAFKA_BOOTSTRAP"),
        help="default: $TXSINK_KAFKA_BOOTSTRAP (integration/benchmarks/run starts the broker "
        "when it is not set)",
    )
    _bench.add_feed_option(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.bootstrap:
        parser.error(
            "no broker: set TXSINK_KAFKA_BOOTSTRAP or --bootstrap, or run it with "
            "integration/benchmarks/run kafka_epochs (which starts one)"
        )
    if args.epochs < 2 or args.rows < 1 or args.partitions < 1:
        parser.error("--epochs must be at least 2 (the first is a warm-up), --rows and "
                     "--partitions positive")  # fmt: skip
    bootstrap = args.bootstrap
    spark = _bench.spark_session(
        "txsink-bench-kafka-epochs", feed=args.feed, slots=max(2, args.partitions)
    )
    _bench.pickle_by_value("benchmarks.kafka")  # the plain producer's task
    cpu = _bench.CpuMeter({"spark": os.getpid(), **broker_pid(bootstrap)})
    run = uuid.uuid4().hex[:6]
    # By the key's hash, for every writer: direct mode refuses a round-robin repartition(n).
    df = _bench.cached_frame(spark, args.rows, args.partitions, records.EXPRS, key="key")
    topics: list[str] = []
    rows: list[tuple[str, list[float], int, dict[str, float]]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="txsink-epochs-") as tmp:
            for writer in ("producer", *MODES):
                topic = f"txsink-epochs-{writer}-{run}"
                topics += [topic] if writer == "producer" else [topic, f"{topic}-markers"]
                create_topic(bootstrap, topic, 8)
                if writer == "producer":
                    one = _producer_epoch(bootstrap, topic)
                else:
                    one = _txsink_epoch(bootstrap, writer, topic, args.partitions, Path(tmp))
                seconds, before = [], {}
                for epoch in range(args.epochs):
                    if epoch == 1:  # the CPU of the epochs after the warm-up
                        before = cpu.snapshot()
                    t0 = time.perf_counter()
                    one(df, epoch)
                    seconds.append(time.perf_counter() - t0)
                used = cpu.delta(before, cpu.snapshot())
                count = _count(bootstrap, topic)
                _bench.log(f"{writer}: {[round(s, 3) for s in seconds]} s, {count} records, "
                           f"cpu {_bench.rounded(used)}")  # fmt: skip
                rows.append((writer, seconds, count, used))
    finally:
        delete_topics(bootstrap, topics)
        spark.stop()
    base = _bench.median(next(s for w, s, _, _ in rows if w == "producer")[1:])
    want = args.rows * args.epochs
    per_m = 1e6 / (args.rows * (args.epochs - 1))
    roles = [("spark", "Spark (all)"), ("jvm", "JVM"), ("workers", "Python workers"),
             ("driver", "driver"), ("kafka", "broker")]  # fmt: skip
    table = [
        [
            w,
            _bench.ms(s[1:]),
            _bench.spread(s[1:]),
            f"{s[0] * 1000:.0f}",
            f"{_bench.median(s[1:]) / base:.2f}x",
            *(f"{u[r] * per_m:.2f}" if r in u else "-" for r, _ in roles),
            "ok" if c == want else f"WRONG: {c} of {want}",
        ]
        for w, s, c, u in rows
    ]
    print(
        f"\n{args.epochs} epochs of {args.rows:,} records, {args.partitions} partitions "
        f"(first epoch: warm-up); {_bench.feed_note(args.feed)}\n"
    )
    print(
        _bench.markdown_table(
            [
                "writer",
                "ms per epoch (median)",
                "range",
                "first epoch ms",
                "time vs plain producer",
                *(f"CPU-s per 1M: {h}" for _, h in roles),
                "read back",
            ],
            table,
            "lrrrr" + "r" * len(roles) + "l",
        )
    )
    return 0 if all(c == want for _, _, c, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
