"""A replayable Kafka streaming source for tests, whose partition listing order is chosen.

Spark's own Kafka source needs a jar from Maven Central; this Python data source
(``spark.readStream.format("kafka_partitions")``) reads a topic with confluent-kafka
(``read_committed``), one input partition per Kafka partition, offsets per partition in
the checkpoint like Spark's. Option ``order``: ``forward`` lists the Kafka partitions
0, 1, ... and ``reverse`` the other way round, which is what a restart of a real source
may do (the order it lists its partitions in is not part of its offsets). ``step``: at
most this many records per Kafka partition per batch.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

SCHEMA = "id long, key string, kafka_partition int, kafka_offset long"


class KafkaPartitionsSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kafka_partitions"

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Reader(dict(self.options))


class _Range(InputPartition):
    def __init__(self, partition: int, start: int, end: int) -> None:
        self.partition, self.start, self.end = partition, start, end


class _Reader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.bootstrap = options["bootstrap"]
        self.topic = options["topic"]
        self.order = options.get("order", "forward")
        self.step = int(options.get("step", "1000000"))

    def _ends(self) -> dict[str, int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "kps",
                "isolation.level": "read_committed",
            }
        )
        try:
            parts = consumer.list_topics(self.topic, timeout=30).topics[self.topic].partitions
            ends = {}
            for p in parts:
                _, high = consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=30)
                ends[str(p)] = int(high)
            return ends
        finally:
            consumer.close()

    def initialOffset(self) -> dict[str, int]:
        return dict.fromkeys(self._ends(), 0)

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        return ReadMaxRows(self.step)

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        ends = self._ends()
        if isinstance(limit, ReadAllAvailable):  # availableNow's end of input
            return ends
        return {p: min(end, int(start.get(p, 0)) + self.step) for p, end in ends.items()}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        numbers = sorted(int(p) for p in end)
        if self.order == "reverse":
            numbers.reverse()
        return [_Range(p, int(start.get(str(p), 0)), int(end[str(p)])) for p in numbers]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        from confluent_kafka import Consumer, TopicPartition

        assert isinstance(partition, _Range)
        if partition.start >= partition.end:
            return
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "kps",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.assign([TopicPartition(self.topic, partition.partition, partition.start)])
            at = partition.start
            while at < partition.end:
                msg = consumer.poll(10.0)
                if msg is None:
                    raise RuntimeError(f"timed out at offset {at} of {partition.partition}")
                if msg.error() is not None:
                    continue
                offset = int(msg.offset() or 0)
                at = offset + 1
                if offset >= partition.end:
                    break
                row = json.loads(msg.value() or b"{}")
                yield (row["id"], row["key"], partition.partition, offset)
        finally:
            consumer.close()

    def commit(self, end: dict[str, int]) -> None:
        pass
