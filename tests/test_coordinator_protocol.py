"""The coordinator's protocol, driven without Spark through in-memory participants.

The exhaustive test kills the "driver" at every single step of a multi-epoch,
multi-sink run (and again at every step of the recovery run), restarts it the
way Spark would, and checks exactly-once and that nothing stays prepared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
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
from txsink.errors import (
    CheckpointMismatchError,
    EpochAbortedError,
    FencedError,
    NonRestoredStateError,
    WriteError,
)
from txsink.protocol.log import TxLog
from txsink.protocol.task import Ack, TaskPlan, collect_acks

EPOCHS = 3
PARTITIONS = 2
ROWS = 3
APP = "app-1"
UIDS = ("pg", "kafka")


@dataclass
class World:
    """Everything that survives a driver crash: the log, the targets, Spark's commit log."""

    store: MemStore = field(default_factory=MemStore)
    targets: dict[str, MemTarget] = field(default_factory=lambda: {u: MemTarget() for u in UIDS})
    spark_done: set[int] = field(default_factory=set)
    restarts: int = 0

    def coordinator(self, crasher: Crasher) -> Coordinator:
        self.store.crasher = crasher
        sinks = [MemSink(uid, self.targets[uid], crasher) for uid in UIDS]
        return Coordinator(sinks, log=TxLog(self.store), app_id=APP, faults=None)

    def run(self, crash_at: int = 0, max_runs: int = 20, then_crash_at: int = 0) -> Crasher:
        """Run all epochs like Spark: replay from the first epoch not in Spark's commit log."""
        first = Crasher(at=crash_at)
        crashes = [first, Crasher(at=then_crash_at)]
        for run in range(max_runs):
            crasher = crashes[run] if run < len(crashes) else Crasher()
            coord = self.coordinator(crasher)
            try:
                for epoch in range(EPOCHS):
                    if epoch in self.spark_done:
                        continue
                    coord.run_epoch(
                        epoch,
                        memory_precommit(
                            batches_for(epoch, PARTITIONS, ROWS), attempt_base=run * 10
                        ),
                        app_id=APP,
                    )
                    crasher.tick(f"spark commit log {epoch}")  # Spark can die right here too
                    self.spark_done.add(epoch)
                return first
            except Crash:
                self.restarts += 1
        raise AssertionError("did not finish")

    def assert_exactly_once(self) -> None:
        expected = sorted(
            b.column("id").to_pylist()[i]
            for e in range(EPOCHS)
            for bs in batches_for(e, PARTITIONS, ROWS)
            for b in bs
            for i in range(b.num_rows)
        )
        for uid, target in self.targets.items():
            assert sorted(target.visible()) == expected, f"{uid}: not exactly once"
            assert target.prepared == {}, f"{uid}: lingering prepared {sorted(target.prepared)}"
            assert target.manifests == set(range(EPOCHS))
        log = TxLog(self.store)
        assert log.pending() == []
        assert [log.committed(e) is not None for e in range(EPOCHS)] == [True] * EPOCHS


def test_clean_run_is_exactly_once() -> None:
    world = World()
    world.run()
    world.assert_exactly_once()
    assert world.restarts == 0


def _steps_of_clean_run() -> int:
    world = World()
    return world.run().steps


def test_crash_at_every_step() -> None:
    total = _steps_of_clean_run()
    assert total > 30  # the run has many steps; a tiny number means ticks are missing
    for k in range(1, total + 1):
        world = World()
        crasher = world.run(crash_at=k)
        assert crasher.dead, f"step {k} was never reached"
        try:
            world.assert_exactly_once()
        except AssertionError as err:
            raise AssertionError(f"crash at step {k} ({crasher.trace[-1]}): {err}") from err


def test_crash_again_during_every_step_of_recovery() -> None:
    total = _steps_of_clean_run()
    for k in range(1, total + 1, 3):
        for k2 in range(1, 25):
            world = World()
            crasher = world.run(crash_at=k, then_crash_at=k2)
            try:
                world.assert_exactly_once()
            except AssertionError as err:
                raise AssertionError(
                    f"crash at {k} ({crasher.trace[-1]}) then {k2}: {err}"
                ) from err


def test_replayed_epoch_writes_nothing() -> None:
    world = World()
    world.run()
    before = {u: dict(t.committed) for u, t in world.targets.items()}
    coord = world.coordinator(Crasher())
    result = coord.run_epoch(
        EPOCHS - 1, memory_precommit(batches_for(EPOCHS - 1, 2, 3)), app_id=APP
    )
    assert result.status == "skipped"
    assert {u: dict(t.committed) for u, t in world.targets.items()} == before


def test_checkpoint_reset_is_refused() -> None:
    world = World()
    world.run()
    coord = world.coordinator(Crasher())
    with pytest.raises(CheckpointMismatchError, match="checkpoint was reset"):
        coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)


def test_log_of_another_app_is_refused() -> None:
    world = World()
    world.run()
    sinks = [MemSink(u, world.targets[u], Crasher()) for u in UIDS]
    coord = Coordinator(sinks, log=TxLog(world.store), app_id="other-app")
    with pytest.raises(CheckpointMismatchError, match="belongs to app 'app-1'"):
        coord.run_epoch(EPOCHS, memory_precommit(batches_for(EPOCHS, 2, 3)), app_id="other-app")


def test_racing_driver_loses_and_aborts_its_own_handles() -> None:
    """B takes over epoch 0 while A is pre-committing; only one decision can exist."""
    world = World()
    a = world.coordinator(Crasher())
    b = world.coordinator(Crasher())
    inner = memory_precommit(batches_for(0, 2, 3), attempt_base=0)

    def a_precommit(plan: TaskPlan) -> list[Ack]:
        acks = inner(plan)  # A prepared round 0 ...
        # ... then B (a new driver replaying epoch 0) runs the whole epoch.
        b.run_epoch(0, memory_precommit(batches_for(0, 2, 3), attempt_base=50), app_id=APP)
        return acks

    with pytest.raises(FencedError, match="lost epoch 0"):
        a.run_epoch(0, a_precommit, app_id=APP)
    for target in world.targets.values():
        assert sorted(target.visible()) == sorted(range(0, 3)) + sorted(range(100, 103))
        assert target.prepared == {}


def test_first_decider_wins_and_late_driver_is_fenced() -> None:
    world = World()
    a = world.coordinator(Crasher())
    b = world.coordinator(Crasher())
    inner_b = memory_precommit(batches_for(0, 2, 3), attempt_base=50)

    def b_precommit(plan: TaskPlan) -> list[Ack]:
        acks = inner_b(plan)  # B prepared round 1; meanwhile A decides round 0 and commits
        return acks

    a.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    # B claimed a round of the same epoch without seeing A's commit (a zombie replay):
    log = TxLog(world.store)
    round_b = log.claim_round(0)
    plan = TaskPlan(APP, 0, round_b, b.sinks, None, 0)
    _, handles, rows = b._precommit(0, round_b, lambda p: b_precommit(plan), APP, again=False)
    with pytest.raises(FencedError):
        b._decide(0, round_b, handles, rows)
    for target in world.targets.values():
        assert len(target.visible()) == 6
        assert target.prepared == {}


def test_bad_row_aborts_the_epoch_with_context() -> None:
    world = World()

    class Picky(MemSink):
        def write(self, txn: Any, batch: pa.RecordBatch) -> None:
            ids = batch.column("id").to_pylist()
            if 101 in ids:
                raise WriteError("id 101 is not allowed", row=ids.index(101), column="id")
            super().write(txn, batch)

    sinks = [
        Picky("pg", world.targets["pg"], Crasher()),
        MemSink("kafka", world.targets["kafka"], Crasher()),
    ]
    coord = Coordinator(sinks, log=TxLog(world.store), app_id=APP)
    with pytest.raises(EpochAbortedError) as info:
        coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    err = info.value
    assert (err.sink_uid, err.partition, err.row, err.column) == ("pg", 1, 1, "id")
    assert "nothing of it is visible" in str(err)
    for target in world.targets.values():
        assert target.visible() == [] and target.prepared == {}
    # The cause fixed (a sink that accepts the row), the epoch runs again and commits.
    fixed = world.coordinator(Crasher())
    fixed.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    assert len(world.targets["pg"].visible()) == 6


def test_pending_state_of_removed_sink_is_refused_unless_allowed() -> None:
    world = World()
    crasher = Crasher()
    coord = world.coordinator(crasher)
    # Decide epoch 0, then die before committing anything.
    with pytest.raises(Crash):
        coord.faults = None
        original = coord._commit

        def die(*args: Any, **kwargs: Any) -> None:
            raise Crash("after decision")

        coord._commit = die  # type: ignore[method-assign]
        coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    del original
    only_pg = Coordinator(
        [MemSink("pg", world.targets["pg"], Crasher())], log=TxLog(world.store), app_id=APP
    )
    with pytest.raises(NonRestoredStateError, match="kafka"):
        only_pg.run_epoch(1, memory_precommit(batches_for(1, 2, 3)), app_id=APP)
    allowed = Coordinator(
        [MemSink("pg", world.targets["pg"], Crasher())],
        log=TxLog(world.store),
        app_id=APP,
        allow_non_restored_state=True,
    )
    allowed.run_epoch(1, memory_precommit(batches_for(1, 2, 3)), app_id=APP)
    log = TxLog(world.store)
    record = log.committed(0)
    assert record is not None and record.not_restored == ("kafka",)
    assert len(world.targets["pg"].visible()) == 12


def test_zombie_deciding_during_recovery_is_finished_from_its_record() -> None:
    """The zombie decides between recovery's scan of the log and its void."""
    from txsink.handles import dump_handle

    world = World()
    zombie = world.coordinator(Crasher())
    log = TxLog(world.store)
    log.bind_app(APP)
    round_ = log.claim_round(0)
    plan = TaskPlan(APP, 0, round_, zombie.sinks, None, 0)
    acks = memory_precommit(batches_for(0, 2, 3))(plan)
    handles, _rows = collect_acks(zombie.sinks, 0, acks)
    fresh = world.coordinator(Crasher())
    real_void = fresh.log.void

    def void_after_zombie_decides(epoch: int, r: int, reason: str) -> Any:
        fresh.log.decide(
            epoch, round_, {u: [dump_handle(h) for h in hs] for u, hs in handles.items()}
        )
        return real_void(epoch, r, reason)

    fresh.log.void = void_after_zombie_decides  # type: ignore[method-assign,assignment]
    fresh.run_epoch(0, memory_precommit(batches_for(0, 2, 3), attempt_base=50), app_id=APP)
    for target in world.targets.values():
        assert sorted(target.visible()) == [0, 1, 2, 100, 101, 102]
        assert target.prepared == {}
    assert TxLog(world.store).committed(0) is not None


def test_same_coordinator_recovers_after_a_failure_after_the_decision() -> None:
    from txsink.errors import InjectedFault
    from txsink.protocol.faults import FaultPlan

    world = World()
    coord = world.coordinator(Crasher())
    coord.faults = FaultPlan.parse("after_decision:raise@1")
    coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    with pytest.raises(InjectedFault):
        coord.run_epoch(1, memory_precommit(batches_for(1, 2, 3)), app_id=APP)
    # Spark replays epoch 1 on the same coordinator object: recovery commits it, then skips.
    result = coord.run_epoch(1, memory_precommit(batches_for(1, 2, 3), attempt_base=10), app_id=APP)
    assert result.status == "skipped"
    for target in world.targets.values():
        assert len(target.visible()) == 12 and target.prepared == {}


def test_close_and_a_failed_foreach_batch_release_every_sink() -> None:
    """What the sinks hold in the driver is closed when an epoch fails out of
    ``foreachBatch`` (Spark ends the query) and by ``close()``; the coordinator still
    works after it (the sinks open what they need again)."""
    world = World()
    coord = world.coordinator(Crasher())
    released: list[str] = []

    def releaser(uid: str) -> Any:
        return lambda: released.append(uid)

    for sink in coord.sinks:
        sink.release = releaser(sink.uid)  # type: ignore[method-assign]
    with pytest.raises(Exception):  # noqa: B017 - not a DataFrame: fails before any epoch
        coord(object(), 0)  # type: ignore[arg-type]
    assert sorted(released) == sorted(UIDS)
    coord.close()
    assert sorted(released) == sorted(UIDS * 2)
    coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
    for target in world.targets.values():
        assert len(target.visible()) == 6
