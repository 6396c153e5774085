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
back with ``read_committed``: the record count must be exact.
"""

from __future__ import annotations

import argparse
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
except ImportError:  # run as a plain script: python integration/benchmarks/kafka_epochs.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import _bench
    from benchmarks.kafka import producer, records
    from benchmarks.kafka.topics import create_topic, delete_topics

from txsink import Coordinator
from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.readback import read_records

MODES = ("direct", "wal", "replay")


def _txsink_epochs(
    bootstrap: str, mode: str, df: Any, topic: str, epochs: int, partitions: int, tmp: Path
) -> list[float]:
    options: dict[str, Any] = {"mode": mode, "key": "key", "value": "value"}
    if mode == "wal":
        options["wal"] = tmp / f"wal-{topic}"
    if mode == "replay":
        options["shards"] = partitions
    sink = KafkaSink(bootstrap, topic, topic, marker_topic=f"{topic}-markers", **options)
    coordinator = Coordinator([sink], log=tmp / f"log-{topic}", app_id=f"epochs-{topic}")
    seconds = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        coordinator.write(df, epoch=epoch)
        seconds.append(time.perf_counter() - t0)
    return seconds


def _count(bootstrap: str, topic: str) -> int:
    return len(read_records(bootstrap, topic))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000, help="records per epoch")
    parser.add_argument("--epochs", type=int, default=12, help="epochs per writer (first: warm-up)")
    parser.add_argument("--partitions", type=int, default=2, help="Spark partitions per epoch")
    parser.add_argument("--bootstrap", default=None, help="default: $TXSINK_KAFKA_BOOTSTRAP")
    args = parser.parse_args(argv)
    import os

    bootstrap = args.bootstrap or os.environ["TXSINK_KAFKA_BOOTSTRAP"]
    spark = _bench.spark_session("txsink-bench-kafka-epochs", slots=max(2, args.partitions))
    _bench.pickle_by_value("benchmarks.kafka")  # the plain producer's task
    run = uuid.uuid4().hex[:6]
    df = spark.range(args.rows).selectExpr(*records.EXPRS).repartition(args.partitions).cache()
    df.count()
    topics: list[str] = []
    rows: list[tuple[str, list[float], int]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="txsink-epochs-") as tmp:
            for writer in ("producer", *MODES):
                topic = f"txsink-epochs-{writer}-{run}"
                topics += [topic, f"{topic}-markers"]
                create_topic(bootstrap, topic, 8)
                if writer == "producer":
                    seconds = producer.producer_epochs(bootstrap, df, topic, args.epochs)
                else:
                    seconds = _txsink_epochs(
                        bootstrap, writer, df, topic, args.epochs, args.partitions, Path(tmp)
                    )
                count = _count(bootstrap, topic)
                _bench.log(f"{writer}: {[round(s, 3) for s in seconds]} s, {count} records")
                rows.append((writer, seconds, count))
    finally:
        delete_topics(bootstrap, topics)
        spark.stop()
    base = _bench.median(next(s for w, s, _ in rows if w == "producer")[1:])
    want = args.rows * args.epochs
    table = [
        [
            w,
            _bench.ms(s[1:]),
            _bench.spread(s[1:]),
            f"{s[0] * 1000:.0f}",
            f"{_bench.median(s[1:]) / base:.2f}x",
            "ok" if c == want else f"WRONG: {c} of {want}",
        ]
        for w, s, c in rows
    ]
    print(
        f"\n{args.epochs} epochs of {args.rows:,} records, {args.partitions} partitions "
        f"(first epoch: warm-up)\n"
    )
    print(
        _bench.markdown_table(
            [
                "writer",
                "ms per epoch (median)",
                "range",
                "first epoch ms",
                "vs plain producer",
                "read back",
            ],
            table,
            "lrrrrl",
        )
    )
    return 0 if all(c == want for _, _, c in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
