"""The Delta benchmark's options and report, without Spark or servers: the S3 server is
optional for it (required for the S3 benchmark), the S3 tables take their ratios against the
S3 driver append, the reading's verdicts and per-epoch overhead come from the numbers, and
Spark's error is shortened to its JVM line."""

from __future__ import annotations

import pytest
from benchmarks import _bench, delta
from benchmarks._delta_report import Results, render
from benchmarks.s3 import main as s3_main

MACHINE = {"cpu": "cpu", "cores": "2", "memory": "1 GiB", "os": "os", "python": "3", "java": "17"}


def test_server_is_optional_for_delta_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TXSINK_S3_ENDPOINT", raising=False)
    args = delta.parser().parse(["--rows", "10", "--epochs", "3"])
    assert (args.endpoint, args.s3, args.epochs, args.partitions) == (None, False, 3, [2, 8])
    with pytest.raises(SystemExit):
        s3_main.parser().parse([])  # the S3 benchmark still needs its server


def _run(writer: str, partitions: int, seconds: float) -> _bench.Measurement:
    return _bench.Measurement(writer, partitions, 1000, seconds, 0.5, 0.5, {"cpu": {}})


def test_report_ratios_verdicts_and_epoch_overhead() -> None:
    res = Results(1000, [2, 8], 1, machine=MACHINE, spark="not asked for (--writers).")
    for writer, p, secs in [
        ("txsink", 2, 1.0),
        ("driver", 2, 1.0),
        ("tasks", 2, 2.0),
        ("txsink", 8, 2.0),
        ("driver", 8, 1.0),
        ("txsink@s3", 2, 1.0),
        ("driver@s3", 2, 0.5),
    ]:
        res.runs.append(_run(writer, p, secs))
    res.epochs = {
        "txsink": {"wall": [0.9, 0.3, 0.3], "precommit": [0.5, 0.2, 0.2], "commit": [0.2, 0.05]},
        "driver": {"wall": [0.2, 0.1, 0.1]},
    }
    text = render(res)
    reading = text.split("### Reading")[1]
    assert "txsink vs the driver append on local disk**: 1.00x at 2 partitions; 0.50x at 8" in (
        reading
    )
    assert "Target >= 0.9x: NOT met." in reading
    assert "txsink vs the task appends on local disk**: 2.00x at 2 partitions. Target" in reading
    # S3 rows are compared with the driver append on S3 (1.0 s vs 0.5 s), not the local one.
    s3_table = text.split("### Throughput on the S3 server")[1].split("###")[0]
    assert "0.50x (NOT met" in s3_table
    assert "txsink's overhead per epoch is +200 ms" in reading
    assert "takes 50 ms" in reading
    assert "**Spark's Delta writer** was not measured: not asked for" in reading
    assert "**Noise**" not in reading
    for m in res.runs:
        m.load_before = 4.0  # twice the cores
    assert "**Noise**: the machine was busy (median load 4.0" in render(res)


def test_spark_error_is_the_jvm_line_shortened() -> None:
    stderr = (
        "Traceback...\npy4j.protocol.Py4JJavaError: An error occurred while calling o43.count.\n"
        ": java.lang.NoSuchMethodError: 'void org.apache.spark.sql.execution.LogicalRDD.<init>"
        "(scala.collection.immutable.Seq, org.apache.spark.rdd.RDD, scala.Option)'\n\tat x\n"
    )
    assert delta._java_error(stderr) == (
        "java.lang.NoSuchMethodError: 'void org.apache.spark.sql.execution.LogicalRDD.<init>(...)'"
    )
    assert delta._java_error("boom\nlast line") == "last line"
