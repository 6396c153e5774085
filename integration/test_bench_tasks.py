"""The benchmark packages' task code reaches Spark's Python workers without ``integration/``
on their path, and each benchmark's one Spark session is made in one place. Without Spark
or servers: the session is recorded, not started; the workers are a child process in
isolated mode (``python -I``, started from another folder)."""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from benchmarks import _bench
from benchmarks.kafka import main as kafka_main
from benchmarks.kafka import producer, profiled, records
from benchmarks.postgres import main as postgres_main
from benchmarks.postgres import plain, tables, txsink_writer
from benchmarks.s3 import main as s3_main
from benchmarks.s3 import writers
from benchmarks.s3.report import Results as S3Results

_LOAD = "import pickle, sys; print(type(pickle.loads(sys.stdin.buffer.read())).__name__)"


class _Sessions:
    """Stands in for ``_bench.spark_session`` and ``_bench.pickle_by_value``."""

    def __init__(self) -> None:
        self.shipped: list[str] = []
        self.sessions: list[tuple[str, dict[str, Any]]] = []

    def session(self, app_name: str, **settings: Any) -> str:
        self.sessions.append((app_name, settings))
        return "spark"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> _Sessions:
    rec = _Sessions()
    monkeypatch.setattr(_bench, "spark_session", rec.session)
    monkeypatch.setattr(_bench, "pickle_by_value", rec.shipped.append)
    return rec


def test_each_session_ships_its_package_by_value(recorded: _Sessions) -> None:
    args = argparse.Namespace(partitions=[2, 8], writers=["direct", "wal"], feed="same")
    assert kafka_main.session(args, [Path("k.jar")]) == "spark"
    postgres_main.session(argparse.Namespace(writers=["txsink", "copy"], feed="defaults"))
    s3_main.session(S3Results(10, [2], 1), argparse.Namespace(feed="same"), [])
    assert recorded.shipped == ["benchmarks.kafka", "benchmarks.postgres", "benchmarks.s3"]
    assert recorded.sessions == [
        # the direct writer needs a slot per partition: every writer of the run gets them
        ("txsink-bench-kafka", {"feed": "same", "jars": [Path("k.jar")], "slots": 8}),
        ("txsink-bench-postgres", {"feed": "defaults", "jars": []}),
        ("txsink-bench-s3", {"feed": "same", "jars": []}),
    ]


def _tasks(tmp: Path) -> dict[str, Any]:
    """What the benchmarks hand to Spark's tasks: task functions, profiled sinks."""
    wal = str(tmp / "wal")
    return {
        "kafka plain producer": functools.partial(
            producer.produce_task, "127.0.0.1:1", "t", producer.PRODUCER_SETTINGS
        ),
        "kafka feed": records.feed_task,
        "kafka profiled sink": profiled.ProfiledKafkaSink(
            "127.0.0.1:1", "t", "u", profile_dir=str(tmp), mode="wal", wal=wal, key="key"
        ),
        "postgres profiled sink": txsink_writer.ProfiledPostgresSink(
            "dbname=x", "s.t", "u", profile_dir=str(tmp)
        ),
        "postgres copy": functools.partial(plain._copy_task, "dbname=x", "COPY t FROM STDIN"),
        "postgres feed": tables.feed_task,
        "s3 upload": functools.partial(writers._upload_task, "b", "p/", "snappy"),
        "s3 feed": writers._feed_task,
    }


def test_task_code_unpickles_without_integration_on_the_path(tmp_path: Path) -> None:
    from pyspark import cloudpickle

    for package in ("benchmarks.kafka", "benchmarks.postgres", "benchmarks.s3"):
        _bench.pickle_by_value(package)
    for what, task in _tasks(tmp_path).items():
        worker = subprocess.run(
            [sys.executable, "-I", "-c", _LOAD],
            input=cloudpickle.dumps(task),  # type: ignore[no-untyped-call]
            capture_output=True,
            cwd=tmp_path,
            timeout=120,
            check=False,
        )
        assert worker.returncode == 0, f"{what}: {worker.stderr.decode()[-500:]}"
        assert worker.stdout.decode().strip() == type(task).__name__, what
