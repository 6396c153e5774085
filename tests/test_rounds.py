"""Riding out a target outage in the two-phase path (txsink.protocol.rounds): the scenarios of its
docstring, driven through the coordinator with in-memory sinks and a scripted clock (no
Spark, no server). The single pass's rounds are in tests/test_stability.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from tests.memsink import Crasher, MemSink, MemStore, MemTarget, batches_for, memory_precommit
from txsink import Coordinator
from txsink.errors import (
    ConfigurationError,
    EpochAbortedError,
    FencedError,
    InjectedFault,
    RetryableError,
    WriteError,
)
from txsink.handles import Handle
from txsink.protocol import rounds as _rounds
from txsink.protocol.log import TxLog
from txsink.protocol.task import Ack, TaskPlan

APP = "app-1"


class _Clock:
    """The rounds' clock and sleep: a sleep moves the clock; nothing waits."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    found = _Clock()
    monkeypatch.setattr(_rounds, "_clock", lambda: found.now)
    monkeypatch.setattr(_rounds, "_sleep", found.sleep)
    return found


def _world(outage_s: float = 30.0) -> tuple[Coordinator, MemTarget, MemStore]:
    store, target = MemStore(), MemTarget()
    sink = MemSink("pg", target, Crasher())
    return Coordinator([sink], log=TxLog(store), app_id=APP, outage_s=outage_s), target, store


def _flaky(fails: int, error: Callable[[], Exception], clock: _Clock) -> Any:
    """A pre-commit whose first ``fails`` runs prepare partition 0, then fail (the other
    partition unreachable), each taking 1 s."""
    good = memory_precommit(batches_for(0, 2, 3))
    rounds: list[int] = []

    def run(plan: TaskPlan) -> list[Ack]:
        rounds.append(plan.round)
        clock.now += 1.0
        if len(rounds) <= fails:
            memory_precommit(batches_for(0, 1, 3))(plan)  # partition 0 prepared, then:
            raise error()
        return good(plan)

    run.rounds = rounds  # type: ignore[attr-defined]
    return run


def _unreachable() -> Exception:
    return RetryableError("connection refused", sink_uid="pg", phase="begin")


def test_a_transient_precommit_failure_runs_new_rounds_until_decided(clock: _Clock) -> None:
    """(1): each failed round is voided and its transactions aborted before the pause."""
    coord, target, store = _world()
    run = _flaky(3, _unreachable, clock)
    result = coord.run_epoch(0, run, app_id=APP)
    assert result.status == "committed" and result.round == 3
    assert run.rounds == [0, 1, 2, 3]
    assert clock.slept == [0.5, 1.0, 2.0]
    assert sorted(target.visible()) == [p * 100 + i for p in range(2) for i in range(3)]
    assert target.prepared == {}  # the voided rounds' partition 0 was aborted
    # Rounds 0-2 voided (a void takes the round's decision record), round 3 decided.
    records = [k.rsplit("/", 1)[1] for k in store.data if "/decision-" in k]
    assert sorted(records) == [f"decision-00000{r}.json" for r in range(4)]


def test_an_outage_longer_than_the_bound_aborts_the_epoch(clock: _Clock) -> None:
    """(2): the last round's failure ends the epoch; nothing visible or prepared."""
    coord, target, _ = _world(outage_s=10.0)
    run = _flaky(1000, _unreachable, clock)
    with pytest.raises(EpochAbortedError, match="connection refused"):
        coord.run_epoch(0, run, app_id=APP)
    assert 3 <= len(run.rounds) < 10 and clock.now < 20
    assert target.visible() == [] and target.prepared == {}


@pytest.mark.parametrize(
    "error",
    [
        lambda: WriteError("id 7 is too long", row=7, column="id"),
        lambda: ConfigurationError("table is missing"),
        lambda: InjectedFault("before_precommit:raise"),
        lambda: RuntimeError("a connector's gap"),
    ],
)
def test_a_deterministic_failure_is_never_run_again(
    clock: _Clock, error: Callable[[], Exception]
) -> None:
    """(3): a refusal, a test's crash or anything unknown aborts the epoch at once."""
    coord, target, _ = _world()
    run = _flaky(1, error, clock)
    with pytest.raises(EpochAbortedError):
        coord.run_epoch(0, run, app_id=APP)
    assert run.rounds == [0] and clock.slept == []
    assert target.prepared == {}


def test_a_refusal_in_the_acks_is_never_run_again(clock: _Clock) -> None:
    coord, target, _ = _world()

    class Picky(MemSink):
        def write(self, txn: Any, batch: pa.RecordBatch) -> None:
            raise WriteError("id 101 is not allowed", column="id")

    coord.sinks = (Picky("pg", target, Crasher()),)
    with pytest.raises(EpochAbortedError, match="not allowed"):
        coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    assert clock.slept == []


def test_without_a_bound_a_transient_failure_fails_at_once(clock: _Clock) -> None:
    coord, _, _ = _world(outage_s=0.0)
    run = _flaky(1, _unreachable, clock)
    with pytest.raises(EpochAbortedError):
        coord.run_epoch(0, run, app_id=APP)
    assert run.rounds == [0] and clock.slept == []


class _CommitCut(MemSink):
    """A sink whose commits fail ``fails`` times with a transient error (each 1 s)."""

    def __init__(self, target: MemTarget, clock: _Clock, fails: int) -> None:
        super().__init__("pg", target, Crasher())
        self.clock, self.fails, self.tries = clock, fails, 0

    def commit(self, handle: Handle) -> None:
        self.tries += 1
        self.clock.now += 1.0
        if self.tries <= self.fails:
            raise RetryableError("server closed the connection", phase="commit")
        super().commit(handle)  # type: ignore[arg-type]


def test_a_transient_commit_failure_is_committed_again(clock: _Clock) -> None:
    """(4): the decided share is committed again after pauses, in the same run."""
    coord, target, _ = _world()
    coord.sinks = (_CommitCut(target, clock, fails=3),)
    result = coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    assert result.status == "committed" and result.round == 0
    assert clock.slept == [0.5, 1.0, 2.0]
    assert len(target.visible()) == 6 and target.prepared == {}


def test_a_commit_outage_past_the_bound_leaves_the_decision_to_recovery(clock: _Clock) -> None:
    coord, target, store = _world(outage_s=5.0)
    coord.sinks = (_CommitCut(target, clock, fails=1000),)
    with pytest.raises(RetryableError):
        coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    assert target.visible() == [] and len(target.prepared) == 2  # decided, not committed
    # The next run (the target back) commits the decided epoch in its recovery.
    fresh = Coordinator([MemSink("pg", target, Crasher())], log=TxLog(store), app_id=APP)
    assert fresh.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP).status == (
        "skipped"
    )
    assert len(target.visible()) == 6 and target.prepared == {}


class _PythonTaskFailure(Exception):
    """What PySpark raises for a failed plain job: condition and traceback parameter."""

    def __init__(self, last_line: str) -> None:
        super().__init__("[PYTHON_EXCEPTION] An exception was thrown from the Python worker")
        self.traceback = f"Traceback (most recent call last):\n  File 'x.py'\n{last_line}\n"

    def getCondition(self) -> str:
        return "PYTHON_EXCEPTION"

    def getMessageParameters(self) -> dict[str, str]:
        return {"traceback": self.traceback}


class _Java:
    def __init__(self, name: str, message: str, cause: _Java | None = None) -> None:
        self.name, self.message, self.cause = name, message, cause

    def getClass(self) -> Any:
        return type("C", (), {"getName": lambda _self: self.name})()

    def getMessage(self) -> str:
        return self.message

    def getCause(self) -> _Java | None:
        return self.cause


class _BarrierFailure(Exception):
    """What PySpark raises for a failed barrier job: a Py4JJavaError and its JVM causes."""

    def __init__(self, last_line: str) -> None:
        super().__init__("An error occurred while calling o73.collectToPython")
        python = _Java("org.apache.spark.api.python.PythonException", f"Traceback\n{last_line}")
        self.java_exception = _Java("org.apache.spark.SparkException", "Job aborted", python)


@pytest.mark.parametrize(
    ("err", "expected"),
    [
        (RetryableError("refused"), True),
        (WriteError("bad row"), False),
        (ConfigurationError("no table"), False),
        (FencedError("decided elsewhere"), False),
        (InjectedFault("raise"), False),
        (RuntimeError("boom"), False),
        (_PythonTaskFailure("txsink.errors.RetryableError: [phase=begin] refused"), True),
        (_PythonTaskFailure("txsink.errors.WriteError: [row=3] too long"), False),
        (_PythonTaskFailure("txsink.errors.InjectedFault: after_precommit"), False),
        (_PythonTaskFailure("ConnectionResetError: reset by peer"), False),
        (_BarrierFailure("txsink.errors.RetryableError: refused"), True),
        (_BarrierFailure("ValueError: nope"), False),
    ],
)
def test_what_is_transient(err: BaseException, expected: bool) -> None:
    assert _rounds.transient(err) is expected


def test_a_task_failure_is_described_by_its_own_error() -> None:
    err = _PythonTaskFailure("txsink.errors.RetryableError: [phase=begin] refused")
    assert _rounds.describe(err) == "txsink.errors.RetryableError: [phase=begin] refused"


def test_the_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXSINK_OUTAGE_S", "7.5")
    assert _world.__defaults__ is not None  # the helper passes outage_s itself
    assert (
        Coordinator([MemSink("a", MemTarget(), Crasher())], log=TxLog(MemStore())).outage_s == 7.5
    )
    assert _rounds.outage_bound_s(3.0) == 3.0
    monkeypatch.setenv("TXSINK_OUTAGE_S", "soon")
    with pytest.raises(ConfigurationError, match="TXSINK_OUTAGE_S='soon'"):
        _rounds.outage_bound_s(None)
    monkeypatch.delenv("TXSINK_OUTAGE_S")
    assert _rounds.outage_bound_s(None) == 60.0
