"""A broker outage is told as one WARNING, and its end as one line, not as a flood of
librdkafka's refused connections (issue: ~200 ERROR lines while a broker was down 15 s).
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.kafka import KafkaSink
from txsink.contract import EpochCommit
from txsink.txid import TxnId

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])


def _epoch(sink: KafkaSink, epoch: int) -> None:
    open_ = sink.begin(TxnId("app", sink.uid, epoch, 0, 0, epoch), SCHEMA)
    sink.write(open_, pa.RecordBatch.from_pydict({"id": [epoch], "key": ["k"]}, schema=SCHEMA))
    handle = sink.prepare(open_)
    sink.commit_epoch(EpochCommit(epoch, (handle,), on_committed=lambda _h: None))


@pytest.mark.kafka
def test_a_broker_outage_is_one_warning_and_one_line_when_it_ends(
    kafka: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy, address = kafka.with_proxy()
    topic = kafka.new_topic(1)
    uid = f"outage-{uuid.uuid4().hex[:8]}"
    sink = KafkaSink(address, topic, uid=uid, wal=tmp_path / "wal", shards=1)
    sink.check(SCHEMA, "app")
    _epoch(sink, 0)  # the shard's producer is connected through the proxy
    caplog.set_level(logging.INFO, logger="txsink")
    proxy.cut()
    producer = sink._producers.get(0)
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:  # librdkafka reconnects and reports each refusal
        producer.poll(0.2)
    proxy.heal()
    _epoch(sink, 1)  # succeeds: the outage is over
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name.startswith("txsink")]
    ours = [line for line in lines if "Kafka broker" in line[1]]
    assert [level for level, _ in ours] == ["WARNING", "INFO"], lines
    assert ours[0][1].startswith(f"[uid={uid} epoch=None] Kafka broker {address} unreachable: ")
    assert ours[0][1].endswith("; retrying")
    assert f"Kafka broker {address} reachable again after " in ours[1][1], ours
    assert not [line for line in lines if line[0] == "ERROR"], lines
