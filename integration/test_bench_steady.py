"""The steady-state Kafka benchmark's pure parts (``benchmarks.kafka_steady``): the measured
window of a query's epochs, the ``--quick`` size and ``--help``. No Spark, no broker."""

from __future__ import annotations

import argparse

import pytest
from benchmarks.kafka_steady import main as steady
from benchmarks.kafka_steady import queries


def _meter(cpu_at: dict[int, float], rows: int = 100) -> queries.Meter:
    meter = queries.Meter("q")
    for batch, spark_s in cpu_at.items():
        snap = {"machine": 10.0 * batch, "driver": 0.0, "jvm": spark_s, "workers": 0.0}
        meter.epochs[batch] = queries.Epoch(batch, rows, 0.5 + batch, float(batch), snap)
    return meter


def _args(epochs: int = 5, skip: int = 2, rows: int = 100) -> argparse.Namespace:
    return argparse.Namespace(epochs=epochs, skip=skip, rows=rows)


def test_the_window_runs_from_the_end_of_the_skipped_epochs_to_the_last() -> None:
    problems: list[str] = []
    # epochs 0..4, skip 2: the window is the end of epoch 1 to the end of epoch 4
    m = steady._measurement("direct", 2, _args(), _meter({0: 9, 1: 10, 2: 11, 3: 13, 4: 16}),
                            0.5, problems)  # fmt: skip
    assert problems == []
    assert (m.rows, m.seconds) == (300, 3.0)
    assert m.extra["cpu"]["jvm"] == 6.0  # 16 - 10: the skipped epochs' CPU is left out
    assert m.extra["epochs_s"] == [2.5, 3.5, 4.5]
    assert m.extra["first_epochs_s"] == [0.5, 1.5]


def test_a_window_with_a_missing_or_short_epoch_is_void() -> None:
    problems: list[str] = []
    m = steady._measurement("wal", 2, _args(), _meter({0: 1, 1: 2, 2: 3, 4: 5}), 0.5, problems)
    assert m.rows == 0 and m.extra == {"cpu": {}}
    assert problems == ["epochs missing from the listener: saw [0, 1, 2, 4]"]
    short: list[str] = []
    steady._measurement("wal", 2, _args(rows=200), _meter({1: 1, 2: 2, 3: 3, 4: 4}), 0.5, short)
    assert short == ["the measured epochs held 300 records, not 200 each"]


def test_help_and_the_quick_size(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        steady.parser().parse(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--quick" in out and "--feed" in out and "--skip" in out
    args = steady.parser().parse(["--quick", "--bootstrap", "x:1"])
    assert (args.rows, args.epochs, args.skip, args.partitions) == (100_000, 30, 5, [2])
    assert steady.QUICK["skip"] < steady.QUICK["epochs"]
