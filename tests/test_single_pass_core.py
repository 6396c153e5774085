"""The coordinator's single-pass epoch driven without Spark: the tasks are threads of this
process, the sink commits in its tasks in memory, the vote service is the real one; and the
slot check before it, against a stand-in for Spark's scheduler."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from typing_extensions import override

from tests.memsink import Crasher, MemHandle, MemSink, MemStore, MemTarget, _Open, batches_for
from txsink import Coordinator
from txsink.contract import TaskInfo
from txsink.errors import ConfigurationError, EpochAbortedError, FencedError, RetryableError
from txsink.protocol.faults import CrashPoint, FaultPlan
from txsink.protocol.log import TxLog
from txsink.protocol.singlepass import SinglePassJob
from txsink.protocol.votes import cast_vote
from txsink.spark.layout import check_single_pass

APP = "app-sp"


class InTaskSink(MemSink):
    """A MemSink whose tasks commit what they prepared, once the driver answers."""

    @property
    @override
    def commits_in_task(self) -> bool:
        return True

    @override
    def commit_in_task(self, txn: _Open) -> None:
        self.commit(MemHandle(txn=txn.txn, rows=len(txn.rows)))

    @override
    def discard(self, txn: _Open) -> None:
        self.target.prepared.pop(str(txn.txn), None)


class ThreadData:
    """An epoch's partitions as threads that run at once, like a barrier stage."""

    def __init__(self, batches: list[list[pa.RecordBatch]]) -> None:
        self.batches = batches

    def map_partitions(
        self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], Any], *, barrier: bool = False
    ) -> list[Any]:
        n = len(self.batches)
        results: list[Any] = [None] * n
        errors: list[BaseException] = []

        def run(p: int) -> None:
            try:
                info = TaskInfo(p, 100 + p, tasks=n if barrier else None)
                results[p] = task(info, iter(self.batches[p]))
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=run, args=(p,)) for p in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        if errors:
            raise errors[0]
        return results


@dataclass(frozen=True)
class AnotherDriverVoids(FaultPlan):
    """At ``before_decision``, another driver's recovery voids this driver's round 0 (a
    zombie driver paused there while a new one took over)."""

    log: TxLog | None = None

    @override
    def fire(
        self,
        point: CrashPoint,
        *,
        epoch: int,
        partition: int | None = None,
        driver_pid: int | None = None,
        driver_host: str | None = None,
    ) -> None:
        if point is CrashPoint.BEFORE_DECISION and self.log is not None:
            self.log.void(epoch, 0, "another driver's recovery")


def _run(tmp_path: Path, faults: Callable[[TxLog], FaultPlan | None]) -> tuple[MemTarget, Any]:
    target = MemTarget()
    log = TxLog(MemStore())
    sink = InTaskSink("k", target, Crasher())
    coordinator = Coordinator([sink], log=log, app_id=APP, faults=faults(log))
    job = SinglePassJob(ThreadData(batches_for(0, 2, 3)), "127.0.0.1")
    return target, lambda: coordinator.run_epoch(0, job, app_id=APP)


def test_the_tasks_commit_what_they_hold_once_decided(tmp_path: Path) -> None:
    target, run = _run(tmp_path, lambda _log: None)
    result = run()
    assert result.status == "committed"
    assert sorted(target.visible()) == [0, 1, 2, 100, 101, 102]
    assert target.prepared == {}


def test_a_driver_fenced_before_its_decision_raises_fenced_error(tmp_path: Path) -> None:
    """Not an EpochAbortedError ("fix the cause and restart"): the other driver's decision
    stands, and restarting this one would only compete with it."""
    target, run = _run(tmp_path, lambda log: AnotherDriverVoids((), str(tmp_path / "f"), log))
    with pytest.raises(FencedError, match="voided by another driver"):
        run()
    assert target.visible() == []
    assert target.prepared == {}  # the tasks were answered "abort" and discarded


class LosesConnection(InTaskSink):
    """Partition 1's write fails with a transient error, raised (Spark would retry it)."""

    @override
    def write(self, txn: _Open, batch: pa.RecordBatch) -> None:
        if txn.txn.partition == 1:
            raise RetryableError("connection to the target lost", connector="mem")
        super().write(txn, batch)


class OpaqueJobFailure(ThreadData):
    """A barrier job whose failure tells only that a task failed, not the task's error
    (as a Spark failure without the task's traceback does)."""

    @override
    def map_partitions(
        self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], Any], *, barrier: bool = False
    ) -> list[Any]:
        try:
            return super().map_partitions(task, barrier=barrier)
        except Exception:
            raise RuntimeError("Could not recover from a failed barrier ResultStage") from None


def test_a_failed_single_pass_task_is_told_by_the_error_its_vote_carried(
    tmp_path: Path,
) -> None:
    """The failed task's vote carries its error (type, message, context), not only its
    text: the driver's error names the type, the sink and the partition even when the
    job's failure does not (issue 34, point 4)."""
    target = MemTarget()
    sink = LosesConnection("k", target, Crasher())
    # About the error the driver raises, not about riding it out (outage_s: test_rounds).
    coordinator = Coordinator([sink], log=TxLog(MemStore()), app_id=APP, outage_s=0)
    job = SinglePassJob(OpaqueJobFailure(batches_for(0, 2, 3)), "127.0.0.1")
    with pytest.raises(EpochAbortedError) as caught:
        coordinator.run_epoch(0, job, app_id=APP)
    assert str(caught.value) == (
        "[sink_uid=k, epoch=0, partition=1, phase=precommit] epoch 0 aborted, nothing of it "
        "is visible: a task failed: txsink.errors.RetryableError: [sink_uid=k, epoch=0, "
        "partition=1, phase=write, connector=mem] connection to the target lost"
    )
    assert isinstance(caught.value.__cause__, RetryableError)
    assert target.visible() == [] and target.prepared == {}


def test_tasks_that_cannot_reach_the_vote_service_fail_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task without an answer fails (Spark then stops the stage's other tasks, which
    would wait for their answer until the vote timeout) and says what to fix."""
    with socket.create_server(("127.0.0.1", 0)) as closed:
        nowhere = closed.getsockname()

    def unreachable(_address: Any, token: str, vote: Any, *, timeout_s: float) -> Any:
        return cast_vote(nowhere, token, vote, timeout_s=2)

    monkeypatch.setattr("txsink.protocol.singlepass.cast_vote", unreachable)
    monkeypatch.setenv("TXSINK_OUTAGE_S", "0")  # the error, not 60 s of new rounds first
    target, run = _run(tmp_path, lambda _log: None)
    with pytest.raises(EpochAbortedError, match=r"spark\.driver\.host") as failed:
        run()
    (cause,) = failed.value.causes
    assert isinstance(cause, RetryableError) and cause.phase == "vote", cause
    assert f"vote service at 127.0.0.1:{nowhere[1]}" in str(cause)
    assert target.visible() == [] and target.prepared == {}


class _Slots:
    """A SparkContext's JVM side that reports the task slots of a cluster, one per call."""

    def __init__(self, slots: list[int]) -> None:
        self.slots = slots

    def sc(self) -> _Slots:
        return self

    def resourceProfileManager(self) -> _Slots:
        return self

    def defaultResourceProfile(self) -> None:
        return None

    def maxNumConcurrentTasks(self, _profile: None) -> int:
        return self.slots.pop(0) if len(self.slots) > 1 else self.slots[0]


def _frame(master: str, slots: list[int], partitions: int = 2) -> Any:
    conf = {"spark.master": master}
    session = SimpleNamespace(
        conf=SimpleNamespace(get=lambda key, default=None: conf.get(key, default)),
        sparkContext=SimpleNamespace(_jsc=_Slots(slots)),
    )
    return SimpleNamespace(
        sparkSession=session, rdd=SimpleNamespace(getNumPartitions=lambda: partitions)
    )


def test_a_cluster_short_of_slots_after_an_executor_loss_is_waited_for() -> None:
    """The epoch right after an executor was lost: its worker starts it again."""
    slept: list[float] = []
    check_single_pass(_frame("spark://m:7077", [1, 1, 1, 2]), "k", False, sleep=slept.append)
    assert len(slept) == 3


def test_too_few_slots_are_refused_after_the_wait_or_at_once_in_local_mode() -> None:
    slept: list[float] = []
    with pytest.raises(ConfigurationError, match="2 partitions, but the cluster runs 1 tasks"):
        check_single_pass(_frame("spark://m:7077", [1]), "k", False, wait_s=5, sleep=slept.append)
    assert sum(slept) == pytest.approx(5)
    slept.clear()
    with pytest.raises(ConfigurationError, match="2 partitions"):
        check_single_pass(_frame("local[1]", [1, 2]), "k", False, sleep=slept.append)
    assert slept == []  # local mode's slots never change
