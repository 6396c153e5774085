"""The Data Source path without Spark: its options, and its protocol steps driven by hand.

The steps are the ones Spark runs (:mod:`txsink.datasource.epoch`): planning, the tasks
(:func:`txsink.datasource.source._write_task`'s core,
:func:`txsink.protocol.task.run_partition`), then
``commit`` or ``abort``, against a real files sink read back through its manifests.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

# The Python Data Source API is Spark 4.0's (on 3.5: tests/test_spark_versions.py).
pytest.importorskip("pyspark.sql.datasource", reason="the Python Data Source needs Spark 4.0")

from txsink.connectors.files.testing import FilesVerifier
from txsink.datasource import epoch as _dsepoch
from txsink.datasource.options import DsConfig, parse_options, redacted
from txsink.datasource.source import (
    TxsinkCommitMessage,
    TxsinkDataSource,
    _write_task,
)
from txsink.errors import ConfigurationError, FencedError, InjectedFault
from txsink.protocol.log import open_log
from txsink.protocol.task import TaskPlan, run_partition
from txsink.testing.verifiers import verify

SCHEMA = pa.schema([("id", pa.int64())])
APP = "ds-app"


def _config(tmp_path: Path, **extra: str) -> DsConfig:
    options = {"connector": "files", "path": str(tmp_path / "out"), "uid": "out"}
    options["log"] = str(tmp_path / "log")
    return parse_options({**options, "app_id": APP, **extra})


def _task(
    config: DsConfig, setup: _dsepoch.TaskSetup, epoch: int, partition: int, ids: range
) -> TxsinkCommitMessage:
    """What one Spark task of the Data Source returns (attempt id = partition + 100 * epoch)."""
    app = setup.app_id or APP
    plan = TaskPlan(app, epoch, setup.round, (config.sink,), None, 0)
    batch = pa.record_batch([pa.array(list(ids), pa.int64())], schema=SCHEMA)
    acks = run_partition(plan, partition, partition + 100 * epoch, [batch])
    return TxsinkCommitMessage(app, setup.round, acks)


def _epoch(config: DsConfig, epoch: int, ids: range) -> list[Any]:
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=True)
    half = ids.start + len(ids) // 2
    return [
        _task(config, setup, epoch, 0, range(ids.start, half)),
        _task(config, setup, epoch, 1, range(half, ids.stop)),
    ]


def _verdict(tmp_path: Path, expected: range) -> Any:
    return verify(FilesVerifier(tmp_path / "out", expected, uid="out"))


# -- options ------------------------------------------------------------------------------


def test_options_are_the_sink_constructor_parameters_converted_by_type(tmp_path: Path) -> None:
    config = _config(tmp_path, target_file_bytes="4096", format="jsonl", retain_epochs="7")
    sink: Any = config.sink
    assert (sink.target_file_bytes, sink.format, config.retain_epochs) == (4096, "jsonl", 7)
    assert config.app_id == APP and config.epoch is None


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"uid": "out", "colour": "red"}, "'colour'"),
        ({"path": "/tmp/x"}, "'uid'"),
        ({"uid": "out", "target_file_bytes": "lots"}, "'target_file_bytes'"),
        ({"uid": "out", "target_file_bytes": "0"}, "target_file_bytes must be >= 1"),
        ({"uid": "out", "retain_epochs": "0"}, "'retain_epochs'"),
        ({"uid": "out", "max_tasks": "2"}, r"stream.coalesce\(n\)"),
    ],
)
def test_a_wrong_option_is_refused_naming_it(
    tmp_path: Path, options: dict[str, str], names: str
) -> None:
    base = {"connector": "files", "path": str(tmp_path), "log": str(tmp_path / "log")}
    with pytest.raises(ConfigurationError, match=names):
        parse_options({**base, **options})


def test_missing_connector_or_log_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="'connector'"):
        parse_options({"uid": "x"})
    with pytest.raises(ConfigurationError, match="'log'"):
        parse_options({"connector": "files", "path": "/tmp/x", "uid": "x"})
    with pytest.raises(ConfigurationError, match="no txsink connector 'nope'"):
        parse_options({"connector": "nope"})


def test_secret_values_never_appear_in_errors_or_repr() -> None:
    secret = "hunter2-password"
    options = {
        "connector": "postgres",
        "dsn": f"postgresql://u:{secret}@h/db",
        "table": "t",
        "uid": "pg",
        "log": "/tmp/log",
        "connect_kwargs": "{'password': '" + secret + "'",  # not JSON
    }
    with pytest.raises(ConfigurationError) as caught:
        parse_options(options)
    assert "'connect_kwargs'" in str(caught.value) and secret not in str(caught.value)
    assert secret not in repr(TxsinkDataSource(options)) and secret not in redacted(options)


def test_modes_the_data_source_cannot_run_are_refused_before_a_row() -> None:
    upsert = {"connector": "postgres", "dsn": "postgresql://h/db", "table": "t", "uid": "pg"}
    upsert |= {"log": "/tmp/log", "mode": "upsert", "key": "id"}
    with pytest.raises(ConfigurationError, match="partitioned by key"):
        parse_options(upsert)


def test_overwrite_is_refused(tmp_path: Path) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    options = {"connector": "files", "path": str(tmp_path), "uid": "o", "log": str(tmp_path)}
    with pytest.raises(ConfigurationError, match="cannot overwrite"):
        TxsinkDataSource(options).streamWriter(StructType([StructField("id", LongType())]), True)


def test_the_planning_workers_stream_writer_plans_and_raises_txsinks_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Planning happens in ``streamWriter`` of a source built in the worker (Spark's
    planning worker), so a refusal is raised there as itself; raised while PySpark pickles
    the writer instead, it became a ``PicklingError`` and a traceback printed by the
    worker. The commit worker's source is unpickled: no planning there."""
    import pickle

    from pyspark.sql.types import LongType, StructField, StructType

    schema = StructType([StructField("id", LongType())])
    options = {"connector": "files", "path": str(tmp_path / "out"), "uid": "out"}
    options |= {"log": str(tmp_path / "log"), "app_id": APP}
    planned: list[str] = []
    real = _dsepoch.plan_tasks

    def plan_tasks(config: DsConfig, arrow: pa.Schema, *, streaming: bool) -> Any:
        planned.append(config.sink.uid)
        return real(config, arrow, streaming=streaming)

    monkeypatch.setattr(_dsepoch, "plan_tasks", plan_tasks)
    source = TxsinkDataSource(options)
    writer = source.streamWriter(schema, False)
    assert planned == ["out"] and writer.setup is not None
    pickle.loads(pickle.dumps(writer))  # shipped to the tasks: planned once, not again
    assert planned == ["out"]
    unpickled = pickle.loads(pickle.dumps(source))
    assert unpickled.streamWriter(schema, False).setup is None and planned == ["out"]

    def refuse(config: DsConfig, arrow: pa.Schema, *, streaming: bool) -> Any:
        raise ConfigurationError("table t does not exist", sink_uid="out", phase="check")

    monkeypatch.setattr(_dsepoch, "plan_tasks", refuse)
    with pytest.raises(ConfigurationError, match="does not exist"):
        TxsinkDataSource(options).streamWriter(schema, False)


# -- the protocol steps -------------------------------------------------------------------


def test_commit_decides_and_commits_the_tasks_round(tmp_path: Path) -> None:
    config = _config(tmp_path)
    for epoch in range(2):
        _dsepoch.commit_epoch(
            config, epoch, 0, _epoch(config, epoch, range(epoch * 10, epoch * 10 + 10))
        )
    verdict = _verdict(tmp_path, range(20))
    assert (verdict.duplicates, verdict.missing, verdict.lingering, verdict.epochs) == (0, 0, 0, 2)
    assert open_log(config.log).last_committed() == 1


def test_the_committed_line_shows_the_tasks_precommit_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 35: the Data Source path logged ``precommit 0 ms`` (the time to collect acks
    that tasks in other processes had made); the tasks' own span is shown, or nothing."""
    caplog.set_level(logging.INFO, logger="txsink")
    config = _config(tmp_path)
    first, second = _epoch(config, 0, range(10))
    timed = [
        replace(first, started=100.0, finished=101.5),
        replace(second, started=100.5, finished=102.25),
    ]
    _dsepoch.commit_epoch(config, 0, first.round, timed)
    untimed = _epoch(config, 1, range(10, 20))
    _dsepoch.commit_epoch(config, 1, untimed[0].round, [replace(m, started=None) for m in untimed])
    lines = [r.getMessage() for r in caplog.records if "] committed: " in r.getMessage()]
    assert len(lines) == 2, lines
    assert "(precommit 2.2 s, decide " in lines[0], lines
    assert "precommit" not in lines[1] and "(decide " in lines[1], lines
    assert open_log(config.log).decision(0).stats["seconds"] == {"precommit": 2.25}  # type: ignore[union-attr]


def test_a_task_times_its_precommit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    class Task:  # what a Data Source task sees of Spark: its partition and properties
        def partitionId(self) -> int:
            return 0

        def taskAttemptId(self) -> int:
            return 7

        def getLocalProperty(self, key: str) -> str | None:
            return None

    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(Task))
    config = _config(tmp_path)
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=False)
    batch = pa.record_batch([pa.array([1, 2], pa.int64())], schema=SCHEMA)
    before = time.time()
    message = _write_task(config, setup, iter([batch]))
    assert message.started is not None and message.finished is not None
    assert before <= message.started <= message.finished <= time.time()


def test_a_replayed_batch_writes_nothing_twice(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _dsepoch.commit_epoch(config, 0, 0, _epoch(config, 0, range(10)))
    # Spark lost its commit log entry: the batch runs again, planned after the commit.
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=True)
    assert setup.committed_through == 0  # the tasks of epoch 0 write nothing
    messages = _epoch(config, 0, range(10))  # even tasks that did write: skipped at commit
    _dsepoch.commit_epoch(config, 0, setup.round, messages)
    verdict = _verdict(tmp_path, range(10))
    assert (verdict.duplicates, verdict.missing, verdict.lingering) == (0, 0, 0)


def test_abort_after_the_decision_leaves_it_to_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path)
    monkeypatch.setenv("TXSINK_FAULT", "after_decision:raise")
    monkeypatch.setenv("TXSINK_FAULT_STATE", str(tmp_path / "faults"))
    messages = _epoch(config, 0, range(10))
    with pytest.raises(InjectedFault):
        _dsepoch.commit_epoch(config, 0, 0, messages)
    _dsepoch.abort_epoch(config, 0, 0, messages)  # Spark's abort after the failed commit
    assert open_log(config.log).decision(0) is not None
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=True)  # the next batch's planning
    assert setup.committed_through == 0
    verdict = _verdict(tmp_path, range(10))
    assert (verdict.duplicates, verdict.missing, verdict.lingering) == (0, 0, 0)


def test_abort_before_the_decision_voids_and_aborts_every_attempt(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=True)
    messages = [_task(config, setup, 0, 0, range(5)), _task(config, setup, 0, 1, range(5, 10))]
    _task(config, setup, 0, 2, range(90, 95))  # a failed attempt: prepared, never reported
    _dsepoch.abort_epoch(config, 0, 0, [messages[0], None])
    assert _verdict(tmp_path, range(0)).lingering == 0
    state = open_log(config.log).state(0)
    assert state.voided == (0,) and state.decision is None
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=True)
    assert setup.round == 1  # the rerun's transactions get new names
    _dsepoch.commit_epoch(config, 0, setup.round, _epoch(config, 0, range(10)))
    verdict = _verdict(tmp_path, range(10))
    assert (verdict.duplicates, verdict.missing, verdict.lingering) == (0, 0, 0)


def test_unused_attempts_are_aborted_after_the_commit(tmp_path: Path) -> None:
    config = _config(tmp_path)
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=True)
    used = [_task(config, setup, 0, 0, range(5)), _task(config, setup, 0, 1, range(5, 10))]
    _task(config, setup, 0, 7, range(5, 10))  # a speculative attempt Spark did not use
    _dsepoch.commit_epoch(config, 0, setup.round, used)
    verdict = _verdict(tmp_path, range(10))
    assert (verdict.duplicates, verdict.missing, verdict.lingering) == (0, 0, 0)


def test_a_round_claimed_by_another_driver_is_fenced(tmp_path: Path) -> None:
    config = _config(tmp_path)
    messages = _epoch(config, 0, range(10))
    assert open_log(config.log).claim(0, 0)  # a zombie run claimed the same round
    with pytest.raises(FencedError):
        _dsepoch.commit_epoch(config, 0, 0, messages)
    _dsepoch.abort_epoch(config, 0, 0, messages)
    verdict = _verdict(tmp_path, range(0))
    assert (verdict.rows_written, verdict.lingering) == (0, 0)


def test_a_static_write_needs_an_app_id_on_a_fresh_log(tmp_path: Path) -> None:
    options = {"connector": "files", "path": str(tmp_path / "o"), "uid": "o"}
    config = parse_options({**options, "log": str(tmp_path / "log")})
    with pytest.raises(ConfigurationError, match="no app_id"):
        _dsepoch.plan_tasks(config, SCHEMA, streaming=False)
    config = _config(tmp_path, epoch="3")
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=False)
    assert (setup.epoch, setup.app_id, setup.round) == (3, APP, 0)


def test_the_query_id_comes_from_a_local_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text('{"id":"0f3c-q"}\n')
    assert _dsepoch.checkpoint_query_id(str(tmp_path)) == "0f3c-q"
    assert _dsepoch.checkpoint_query_id(f"file://{tmp_path}") == "0f3c-q"
    assert _dsepoch.checkpoint_query_id("s3a://bucket/ckpt") is None
    assert _dsepoch.checkpoint_query_id(str(tmp_path / "missing")) is None


def test_a_static_write_rerun_below_the_last_epoch_writes_nothing(tmp_path: Path) -> None:
    for epoch in range(2):
        config = _config(tmp_path, epoch=str(epoch))
        _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=False)
        messages = [_task(config, setup, epoch, 0, range(epoch * 10, epoch * 10 + 10))]
        _dsepoch.commit_epoch(config, epoch, setup.round, messages, static=True)
    config = _config(tmp_path, epoch="0")
    _, setup = _dsepoch.plan_tasks(config, SCHEMA, streaming=False)  # epoch 0 again
    assert setup.committed_through == 1
    messages = [_task(config, setup, 0, 0, range(10))]  # tasks that wrote anyway
    _dsepoch.commit_epoch(config, 0, setup.round, messages, static=True)
    verdict = _verdict(tmp_path, range(20))
    assert (verdict.duplicates, verdict.missing, verdict.lingering) == (0, 0, 0)


def test_a_third_party_connector_is_found_through_the_registry(tmp_path: Path) -> None:
    """The SQLite example registers sink=; the core names no connector to build it."""
    options = {"connector": "sqlite", "path": str(tmp_path / "db"), "table": "t", "uid": "sq"}
    config = parse_options({**options, "log": str(tmp_path / "log")})
    assert type(config.sink).__name__ == "SqliteSink" and config.sink.uid == "sq"
