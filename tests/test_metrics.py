"""The metrics hook (txsink.metrics), driven without Spark through in-memory participants:
the counters agree with what the targets hold, through crashes and recoveries."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.memsink import (
    Crash,
    Crasher,
    MemSink,
    MemStore,
    MemTarget,
    batches_for,
    memory_precommit,
)
from txsink import Coordinator
from txsink.contract import EpochCommit
from txsink.errors import EpochAbortedError, WriteError
from txsink.metrics import Metrics, RecordingMetrics
from txsink.protocol.log import TxLog

EPOCHS, PARTITIONS, ROWS, APP = 3, 2, 3, "app-m"
UIDS = ("a", "b")


@dataclass
class World:
    store: MemStore = field(default_factory=MemStore)
    targets: dict[str, MemTarget] = field(default_factory=lambda: {u: MemTarget() for u in UIDS})
    spark_done: set[int] = field(default_factory=set)
    metrics: Any = field(default_factory=RecordingMetrics)  # RecordingMetrics, or an exporter

    def coordinator(self, crasher: Crasher, metrics: Any = None) -> Coordinator:
        self.store.crasher = crasher
        sinks = [MemSink(uid, self.targets[uid], crasher) for uid in UIDS]
        return Coordinator(
            sinks, log=TxLog(self.store), app_id=APP, faults=None, metrics=metrics or self.metrics
        )

    def run(self, crash_at: int = 0) -> Crasher:
        first = Crasher(at=crash_at)
        for run in range(5):
            crasher = first if run == 0 else Crasher()
            coord = self.coordinator(crasher)
            try:
                for epoch in range(EPOCHS):
                    if epoch in self.spark_done:
                        continue
                    batches = batches_for(epoch, PARTITIONS, ROWS)
                    coord.run_epoch(
                        epoch, memory_precommit(batches, attempt_base=run * 10), app_id=APP
                    )
                    crasher.tick(f"spark commit log {epoch}")
                    self.spark_done.add(epoch)
                return first
            except Crash:
                continue
        raise AssertionError("did not finish")


def _step(label: str) -> int:
    """The step of a clean run whose trace label starts with ``label``."""
    crasher = World().run()
    return next(i for i, t in enumerate(crasher.trace, 1) if t.startswith(label))


def test_clean_run_counts_every_epoch_row_and_handle() -> None:
    world = World()
    world.run()
    m = world.metrics
    assert m.epochs == {(APP, "committed"): EPOCHS}
    for uid in UIDS:
        visible = len(world.targets[uid].visible())
        assert m.rows_written[(APP, uid, "memory")] == visible == EPOCHS * PARTITIONS * ROWS
        assert m.handle_count("committed", uid) == EPOCHS * PARTITIONS
        assert m.gauges[(APP, "oldest_prepared_timestamp", uid, "memory")] == 0
        assert m.gauges[(APP, "lingering_prepared", uid, "memory")] == 0
    assert m.handle_count("already_committed") == m.handle_count("retried") == 0
    assert m.gauges[(APP, "last_committed_epoch", "", "")] == EPOCHS - 1
    assert m.gauges[(APP, "decided_uncommitted_epochs", "", "")] == 0
    # recover: observed only when recovery had work (as in the epoch's log line)
    assert {p for (_a, p) in m.phases} == {"precommit", "decide", "commit"}
    assert len(m.phases[(APP, "commit")]) == EPOCHS


def test_crash_after_decision_recovery_commits_and_counts() -> None:
    """The driver dies right after epoch 1's decision: the next run's recovery commits it
    (committed, retried), the epoch counts once, and the rows equal the targets'."""
    world = World()
    world.run(crash_at=_step("log.create epochs/00000000000000000001/decision") + 1)
    m = world.metrics
    assert m.epoch_count("committed") == EPOCHS
    for uid in UIDS:
        assert m.rows_written[(APP, uid, "memory")] == len(world.targets[uid].visible())
        assert m.handle_count("retried", uid) == PARTITIONS  # epoch 1's share, again
        assert m.handle_count("committed", uid) == EPOCHS * PARTITIONS
        # what the last recovery found: epoch 1's two transactions, still prepared
        assert m.gauges[(APP, "lingering_prepared", uid, "memory")] == PARTITIONS
        assert m.gauges[(APP, "oldest_prepared_timestamp", uid, "memory")] == 0  # all done
    assert m.gauges[(APP, "decided_uncommitted_epochs", "", "")] == 0
    assert (APP, "recover") in m.phases


def test_crash_during_commit_counts_already_committed() -> None:
    """The driver dies after the first handle of epoch 0 committed: recovery finds that
    one committed already and the other three prepared."""
    world = World()
    crash = _step("a commit") + 1  # after sink a's first handle became visible
    world.run(crash_at=crash)
    m = world.metrics
    assert m.epoch_count("committed") == EPOCHS
    assert m.handle_count("already_committed") == 1
    # live: epochs 1 and 2 (8 handles; a's first of epoch 0 died before its report);
    # recovery: the 3 of epoch 0 still prepared
    assert m.handle_count("committed") == 8 + 3
    assert m.handle_count("retried") == 2 * PARTITIONS
    for uid in UIDS:
        assert m.rows_written[(APP, uid, "memory")] == len(world.targets[uid].visible())


@pytest.mark.parametrize("k", range(1, 60, 4))
def test_counters_agree_with_targets_at_any_crash(k: int) -> None:
    world = World()
    world.run(crash_at=k)
    m = world.metrics
    committed = m.epoch_count("committed")
    # A crash between the committed mark and the counter loses one epoch's count (as a
    # dead process loses its counters); never more, never one twice.
    assert EPOCHS - 1 <= committed <= EPOCHS
    for uid in UIDS:
        assert m.rows_written.get((APP, uid, "memory"), 0) == committed * PARTITIONS * ROWS


def test_failed_precommit_counts_aborted_and_voided() -> None:
    world = World()

    def failing(plan: Any) -> Any:
        raise WriteError("boom")

    coord = world.coordinator(Crasher())
    with pytest.raises(EpochAbortedError):
        coord.run_epoch(0, failing, app_id=APP)
    m = world.metrics
    assert m.epochs == {(APP, "aborted"): 1, (APP, "voided"): 1}
    coord.run_epoch(0, memory_precommit(batches_for(0, PARTITIONS, ROWS)), app_id=APP)
    coord.run_epoch(0, memory_precommit(batches_for(0, PARTITIONS, ROWS)), app_id=APP)
    assert m.epoch_count("committed") == 1 and m.epoch_count("skipped") == 1


def test_lingering_prepared_found_at_recovery_are_counted_and_aborted() -> None:
    world = World()
    world.run(crash_at=_step("b prepare") + 1)  # epoch 0's attempts left prepared
    m = world.metrics
    found = [v for (_a, name, _u, _c), v in m.gauges.items() if name == "lingering_prepared"]
    assert found  # set at each recovery; the last recovery found none left
    assert m.handle_count("aborted") >= 1
    assert m.epoch_count("voided") >= 1


class _Broken(Metrics):
    def epoch(self, app_id: str, outcome: str) -> None:
        raise RuntimeError("exporter down")


def test_failing_exporter_never_fails_an_epoch(caplog: pytest.LogCaptureFixture) -> None:
    world = World()
    good = RecordingMetrics()
    coord = world.coordinator(Crasher(), metrics=[_Broken(), good])
    for epoch in range(2):
        coord.run_epoch(epoch, memory_precommit(batches_for(epoch, 1, 1)), app_id=APP)
    assert good.epoch_count("committed") == 2
    assert sum("exporter down" in r.getMessage() for r in caplog.records) == 1


def test_metrics_must_be_metrics_objects() -> None:
    with pytest.raises(TypeError, match=r"txsink\.metrics\.Metrics"):
        World().coordinator(Crasher(), metrics=[object()])


def test_coordinator_with_metrics_pickles() -> None:
    world = World()
    coord = world.coordinator(Crasher())
    coord.run_epoch(0, memory_precommit(batches_for(0, 1, 1)), app_id=APP)
    again = pickle.loads(pickle.dumps(coord))
    assert isinstance(again._meter.metrics[0], RecordingMetrics)
    assert again._meter.metrics[0].epoch_count("committed") == 1


def test_timeout_ratio_reported_by_a_connector() -> None:
    world = World()

    class Timed(MemSink):
        def commit_epoch(self, request: EpochCommit[Any]) -> None:
            super().commit_epoch(request)
            request.report_timeout_ratio(0.25)

    sinks = [Timed("a", world.targets["a"], Crasher())]
    coord = Coordinator(sinks, log=TxLog(world.store), app_id=APP, metrics=world.metrics)
    coord.run_epoch(0, memory_precommit(batches_for(0, 1, 1)), app_id=APP)
    assert world.metrics.gauges[(APP, "commit_timeout_ratio", "a", "memory")] == 0.25
