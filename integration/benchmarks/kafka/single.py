"""Without Spark, in this one Python process: the steps KafkaSink's commit is made of, and
the fixed costs each commit task pays (a new producer, ``init_transactions``, the marker
read)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
from _services.common import quiet_logger
from benchmarks import _bench

from txsink.connectors.kafka.clients.markers import Markers
from txsink.connectors.kafka.clients.producers import produce_records
from txsink.connectors.kafka.records.checksum import CHECKSUM_VERSION, checksum
from txsink.connectors.kafka.sink import KafkaSink

from .context import Bench
from .producer import PRODUCER_SETTINGS
from .topics import create_topic, delete_topics, read_back
from .txsink_writer import TXN_PREFIX


def _producer_conf(bench: Bench, **extra: Any) -> dict[str, Any]:
    return {
        **PRODUCER_SETTINGS,
        "bootstrap.servers": bench.bootstrap,
        "logger": quiet_logger(),
        **extra,
    }


def single_process(bench: Bench, df: Any, rows: int, expected: tuple[int, ...]) -> dict[str, Any]:
    """Without Spark, in this one Python process: the steps KafkaSink's commit is made of.

    ``records`` RecordFormat.encode (Arrow casts); ``checksum`` the replay checksum;
    ``pylist`` to_pylist of the 5 record columns; then producing all records to a fresh
    topic: ``txn_sink`` producers.produce_records in one transaction (what the WAL commit
    does per shard, minus reading the WAL); ``txn_lean`` the same transaction with the
    leanest loop (positional produce() of key and value only); ``plain`` a
    non-transactional idempotent producer. All report failed deliveries only.
    """
    from confluent_kafka import Producer

    data = df.select("key", "value").toArrow()
    batches = data.to_batches(max_chunksize=10_000)
    sink = KafkaSink(
        bench.bootstrap, "probe", "probe", mode="replay", key="key", value="value", shards=1
    )
    out: dict[str, Any] = {"rows": data.num_rows}
    t0 = time.perf_counter()
    records = [sink.records.encode(b, 0, 0) for b in batches]
    out["records_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in records:
        checksum(r, CHECKSUM_VERSION)
    out["checksum_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for r in records:
        for c in range(r.num_columns):
            r.column(c).to_pylist()
    out["pylist_s"] = time.perf_counter() - t0

    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    def txn_sink(producer: Any, topic: str) -> None:
        producer.begin_transaction()
        for r in records:
            produce_records(producer, _retopic(r, topic))
        producer.commit_transaction(120)

    def txn_lean(producer: Any, topic: str) -> None:
        producer.begin_transaction()
        for r in records:
            keys = r.column(2).to_pylist()
            values = r.column(3).to_pylist()
            for key, value in zip(keys, values, strict=True):
                while True:
                    try:
                        producer.produce(topic, value, key)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
        producer.commit_transaction(120)

    def plain(producer: Any, topic: str) -> None:
        for r in records:
            keys = r.column(2).to_pylist()
            values = r.column(3).to_pylist()
            for key, value in zip(keys, values, strict=True):
                while True:
                    try:
                        producer.produce(topic, value, key, on_delivery=on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
        if producer.flush(120):
            errors.append("flush left records undelivered")

    variants: dict[str, tuple[Callable[[Any, str], None], bool]] = {
        "txn_sink": (txn_sink, True),
        "txn_lean": (txn_lean, True),
        "plain": (plain, False),
    }
    # The plain producer's start-up (its producer id) is not timed: one record elsewhere first.
    warm = f"txsink-bench-single-warm-{bench.run_id}"
    create_topic(bench.bootstrap, warm, 1)
    bench.topics.append(warm)
    for name, (run, transactional) in variants.items():
        topic = f"txsink-bench-single-{name}-{bench.run_id}".replace("_", "-")
        create_topic(bench.bootstrap, topic, bench.topic_partitions)
        bench.topics.append(topic)
        try:
            conf = _producer_conf(bench)
            if transactional:
                conf["transactional.id"] = f"{TXN_PREFIX}-single-{name}-{bench.run_id}"
            producer = Producer(conf)
            if transactional:
                producer.init_transactions(30)
            else:
                producer.produce(warm, b"warm-up")
                producer.flush(30)
            errors.clear()
            t0 = time.perf_counter()
            run(producer, topic)
            out[f"{name}_s"] = time.perf_counter() - t0
            found = read_back(bench.bootstrap, topic, rows)
            ok = found.fingerprint() == expected and found.distinct == rows and not errors
            out[f"{name}_ok"] = ok
            if not ok:
                _bench.log(f"single-process {name}: output differs ({found}, errors {errors[:1]})")
        finally:
            delete_topics(bench.bootstrap, [topic])
            bench.topics.remove(topic)
        _bench.log(f"single-process {name}: {out[f'{name}_s']:.2f} s for {data.num_rows:,}")
    delete_topics(bench.bootstrap, [warm])
    bench.topics.remove(warm)
    out.update(startup_costs(bench))
    return out


def startup_costs(bench: Bench, n: int = 3, markers: int = 20) -> dict[str, float]:
    """Median ms of the fixed costs each replay commit task (and the WAL driver) pays:
    a new idempotent producer's first delivery, a new transactional producer's
    init_transactions (``n`` times each), and the marker read, Markers.last (list_offsets
    + a consumer on the marker topic; ``markers`` times, with its max and slow calls).
    """
    from confluent_kafka import Producer

    topic = f"txsink-bench-startup-{bench.run_id}"
    create_topic(bench.bootstrap, topic, bench.topic_partitions)
    bench.topics.append(topic)
    first: list[float] = []
    init: list[float] = []
    marker: list[float] = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            producer = Producer(_producer_conf(bench))
            producer.produce(topic, b"v", b"k")
            producer.flush(30)
            first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            txn = Producer(
                _producer_conf(bench, **{"transactional.id": f"{TXN_PREFIX}-startup-{i}"})
            )
            txn.init_transactions(30)
            init.append(time.perf_counter() - t0)
        sink = KafkaSink(
            bench.bootstrap,
            topic,
            f"startup-{bench.run_id}",
            mode="replay",
            key="key",
            marker_topic=bench.marker_topic,
        )
        shard_markers = Markers(sink.settings)  # what each commit reads its marker with
        for _ in range(markers):
            shard_markers.clear()
            t0 = time.perf_counter()
            shard_markers.last(f"bench-{bench.run_id}", 0)
            marker.append(time.perf_counter() - t0)
    finally:
        delete_topics(bench.bootstrap, [topic])
        bench.topics.remove(topic)
    return {
        "first_delivery_ms": _bench.median(first) * 1000,
        "init_transactions_ms": _bench.median(init) * 1000,
        "marker_ms": _bench.median(marker) * 1000,
        "marker_max_ms": max(marker, default=float("nan")) * 1000,
        "marker_slow": float(sum(1 for m in marker if m > 1.0)),
        "marker_n": float(len(marker)),
    }


def _retopic(records: pa.RecordBatch, topic: str) -> pa.RecordBatch:
    """The same records, for another topic (column 0)."""
    arrays = [pa.array([topic] * records.num_rows, pa.string()), *records.columns[1:]]
    return pa.RecordBatch.from_arrays(arrays, schema=records.schema)
