"""The Spark-native view: a StreamingQueryListener joins each batch's progress with the
epoch's txsink record."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.streaming import files_coordinator, prepare_input, start_query
from txsink.spark.sparkview import EpochProgress, progress_listener

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
]  # docs/observability.md runs the same view by default


def test_progress_joined_with_the_txsink_log(spark: Any, tmp_path: Path) -> None:
    prepare_input(tmp_path, rows=900, files=3)
    coordinator = files_coordinator(tmp_path)
    seen: list[EpochProgress] = []
    listener = progress_listener(coordinator, on_epoch=seen.append)
    spark.streams.addListener(listener)
    try:
        query = start_query(spark, tmp_path, coordinator)
        query.awaitTermination()
        deadline = time.monotonic() + 20
        while len(listener.epochs) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # the listener bus delivers after the batch
    finally:
        spark.streams.removeListener(listener)
    assert seen == listener.epochs
    assert [e.epoch for e in listener.epochs] == [0, 1, 2]
    for e in listener.epochs:
        assert e.query_id == str(query.id)
        assert e.status == "committed"
        assert e.rows == {"out": e.input_rows} and e.input_rows > 0
        assert "precommit" in e.txsink_seconds and "addBatch" in e.spark_ms
    assert sum(e.input_rows for e in listener.epochs) == 900
