"""Errors from the write hooks read clean: a library's exception a connector let through
still names the sink, the phase and the connector, and a failed Spark task is told by its
own error, not by Spark's "An exception was thrown from the Python worker"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from typing_extensions import override

from tests.memsink import Crasher, MemSink, MemTarget, _Open
from txsink import Coordinator
from txsink.errors import EpochAbortedError, RetryableError, WriteError
from txsink.protocol.task import TaskPlan, run_partition


class RawSink(MemSink):
    """A sink whose ``phase`` hook raises ``error`` as a client library would."""

    def __init__(self, uid: str, phase: str, error: Exception) -> None:
        super().__init__(uid, MemTarget(), Crasher())
        self.phase = phase
        self.error = error

    @override
    def begin(self, txn: Any, schema: pa.Schema) -> _Open:
        if self.phase == "begin":
            raise self.error
        return super().begin(txn, schema)

    @override
    def write(self, txn: _Open, batch: pa.RecordBatch) -> None:
        if self.phase == "write":
            raise self.error
        super().write(txn, batch)

    @override
    def prepare(self, txn: _Open) -> Any:
        if self.phase == "prepare":
            raise self.error
        return super().prepare(txn)


def _run(sink: MemSink) -> Any:
    plan = TaskPlan("app", 4, 0, (sink,), None, 0)
    batch = pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64())})
    return run_partition(plan, 3, 9, [batch])


@pytest.mark.parametrize("phase", ["begin", "write", "prepare"])
def test_a_raw_library_error_in_a_hook_names_sink_and_phase(phase: str) -> None:
    sink = RawSink("s", phase, OSError(28, "No space left on device"))
    with pytest.raises(RetryableError) as caught:  # retried by Spark, as a raw error was
        _run(sink)
    assert str(caught.value) == (
        f"[sink_uid=s, epoch=4, partition=3, phase={phase}, connector=memory] {phase} failed "
        "with OSError: [Errno 28] No space left on device. Fix the cause it names; Spark "
        "retries the task"
    )


def test_a_txsink_error_in_begin_gets_the_sinks_context() -> None:
    acks = _run(RawSink("s", "begin", WriteError("bad input: fix it")))
    error = acks[0].error
    assert error is not None
    assert error.context == {
        "sink_uid": "s",
        "epoch": 4,
        "partition": 3,
        "phase": "begin",
        "connector": "memory",
    }


class _PythonTaskFailure(Exception):
    """What PySpark raises for a failed Python task (condition ``PYTHON_EXCEPTION``)."""

    def getCondition(self) -> str:
        return "PYTHON_EXCEPTION"

    def getMessageParameters(self) -> dict[str, str]:
        return {
            "msg": "An exception was thrown from the Python worker",
            "traceback": 'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
            "txsink.errors.RetryableError: [sink_uid=s, phase=write] write failed: fix it\n",
        }


def test_a_failed_python_task_is_told_by_its_own_error() -> None:
    err = EpochAbortedError.wrapping(2, _PythonTaskFailure("An exception was thrown from the"))
    assert str(err) == (
        "[epoch=2, phase=precommit] epoch 2 aborted, nothing of it is visible: a task failed: "
        "txsink.errors.RetryableError: [sink_uid=s, phase=write] write failed: fix it"
    )
    other = EpochAbortedError.wrapping(2, RuntimeError("first line\nsecond line"))
    assert (
        str(other) == "[epoch=2, phase=precommit] epoch 2 aborted, nothing of it is visible: "
        "RuntimeError: first line"
    )


def test_a_raw_error_in_a_spark_task_reaches_the_driver_clean(spark: Any, tmp_path: Path) -> None:
    sink = RawSink("s", "write", OSError(28, "No space left on device"))
    # The error the driver raises, not 60 s of new rounds first (outage_s: test_rounds).
    coordinator = Coordinator([sink], log=tmp_path / "log", app_id="app", outage_s=0)
    with pytest.raises(EpochAbortedError) as caught:
        coordinator.write(spark.range(4).toDF("id"), epoch=0)
    assert "An exception was thrown from the Python worker" not in str(caught.value)
    assert "a task failed: txsink.errors.RetryableError: [sink_uid=s, epoch=0, partition=" in str(
        caught.value
    )
    assert "phase=write, connector=memory] write failed with OSError: [Errno 28] No space" in str(
        caught.value
    )
