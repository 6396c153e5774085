"""Spark's built-in Kafka sink (``df.write.format("kafka")``): a Java KafkaProducer with
the plain producer's acks, idempotence, linger.ms and compression; its jars (the connector
for this PySpark, or the nearest release) from Maven Central."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from benchmarks import _bench, _spark_kafka

from .report import Results

SPARK_KAFKA_OPTIONS = {
    "kafka.acks": "all",
    "kafka.enable.idempotence": "true",
    "kafka.linger.ms": "20",
    "kafka.compression.type": "lz4",
}


def jars(res: Results, writers: list[str]) -> list[Path]:
    """The connector's jars for the session, or [] when ``spark`` is not among ``writers``
    or cannot be set up (then it is removed from ``writers``, the reason in ``res``)."""
    import pyspark

    if "spark" not in writers:
        return []
    try:
        res.spark_kafka = _spark_kafka.spark_kafka_jars(pyspark.__version__)
        for note in res.spark_kafka.notes:
            _bench.log(note)
        return res.spark_kafka.jars
    except (_spark_kafka.SparkKafkaUnavailable, subprocess.SubprocessError, OSError) as err:
        res.spark_kafka_error = str(err)
        _bench.log(f"Spark's Kafka sink skipped: {err}")
        writers.remove("spark")
        return []


def write_spark(bootstrap: str, df: Any, topic: str) -> dict[str, Any]:
    """One epoch of ``df`` into ``topic`` through Spark's Kafka sink."""
    writer = (
        df.selectExpr("key", "value")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
    )
    for key, value in SPARK_KAFKA_OPTIONS.items():
        writer = writer.option(key, value)
    writer.save()
    return {}
