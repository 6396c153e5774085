"""Recover and abort by hand (txsink.ops.operate, ``txsink recover`` / ``txsink abort``).

Protocol logic runs on the in-memory participants of tests/memsink.py; the end-to-end
case leaves a real files sink's query crashed in the shared Spark session, repairs it by
hand through the CLI functions, and lets the query finish exactly once.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.memsink import Crasher, MemSink, MemStore, MemTarget, batches_for, memory_precommit
from txsink import Coordinator
from txsink.cli.operate import (
    abort_command,
    add_abort_arguments,
    add_recover_arguments,
    recover_command,
)
from txsink.errors import InjectedFault, NonRestoredStateError, StateError
from txsink.handles import dump_handle
from txsink.ops import operate
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import TxLog
from txsink.protocol.recovery import RecoveryAction
from txsink.protocol.task import TaskPlan, collect_acks
from txsink.txid import TxnId

APP = "app-1"


def kinds(actions: list[RecoveryAction]) -> list[tuple[str, str | None, int]]:
    return [(str(a.kind), a.sink_uid, a.epoch) for a in actions]


class World:
    """A log and two in-memory targets; epoch 0 committed, epoch 1 decided and not committed,
    and one prepared transaction of each sink in an undecided epoch 2."""

    def __init__(self, uids: tuple[str, ...] = ("pg", "kafka")) -> None:
        self.store = MemStore()
        self.targets = {u: MemTarget() for u in uids}
        coord = self.coordinator(uids)
        coord.run_epoch(0, memory_precommit(batches_for(0, 2, 3)), app_id=APP)
        coord.faults = FaultPlan.parse("after_decision:raise@1")
        with pytest.raises(InjectedFault):
            coord.run_epoch(1, memory_precommit(batches_for(1, 2, 3)), app_id=APP)
        log = TxLog(self.store)
        round_ = log.claim_round(2)
        for sink in coord.sinks:  # a driver died after this pre-commit, before deciding
            open_ = sink.begin(TxnId(APP, sink.uid, 2, round_, 0, 0), pa.schema([]))
            sink.write(open_, batches_for(2, 1, 3)[0][0])
            sink.prepare(open_)

    def coordinator(
        self, uids: tuple[str, ...], retired: tuple[str, ...] = (), **options: Any
    ) -> Coordinator:
        return Coordinator(
            [MemSink(u, self.targets[u], Crasher()) for u in uids],
            retired=[MemSink(u, self.targets[u], Crasher()) for u in retired],
            log=TxLog(self.store),
            app_id=APP,
            faults=None,
            **options,
        )

    def snapshot(self) -> Any:
        return copy.deepcopy((self.store.data, self.targets))


def test_dry_run_lists_the_plan_and_changes_nothing() -> None:
    world = World()
    before = world.snapshot()
    plan = operate.recover(TxLog(world.store), world.coordinator(("pg", "kafka")), dry_run=True)
    assert kinds(plan) == [
        ("commit", "pg", 1),
        ("commit", "kafka", 1),
        ("mark_committed", None, 1),
        ("void", None, 2),
        ("abort", "pg", 2),
        ("abort", "kafka", 2),
    ]
    assert (
        plan[0]
        .describe(done=False)
        .startswith("would commit pg epoch 1 (2 handle(s): txsink.app-1.pg.e1.r0.p0")
    )
    assert plan[3].describe(done=False) == (
        "would void round 0 of epoch 2: undecided: no driver can decide it afterwards"
    )
    assert operate.abort(TxLog(world.store), world.coordinator(("pg",)), dry_run=True)
    assert world.snapshot() == before


def test_recover_commits_the_decided_epoch_and_voids_then_aborts_the_rest() -> None:
    world = World()
    done = operate.recover(TxLog(world.store), world.coordinator(("pg", "kafka")))
    assert [str(a.kind) for a in done].count("commit") == 2
    log = TxLog(world.store)
    assert log.pending() == [] and log.committed(1) is not None
    assert log.state(2).status == "aborted"
    for target in world.targets.values():
        assert len(target.visible()) == 12 and target.prepared == {}
    assert operate.recover(TxLog(world.store), world.coordinator(("pg", "kafka"))) == []


def test_abort_refuses_a_decided_epoch_and_aborts_only_undecided_ones() -> None:
    world = World()
    coord = world.coordinator(("pg", "kafka"))
    with pytest.raises(StateError) as info:
        coord.abort(epoch=1)
    text = str(info.value)
    assert "epoch 1 is decided" in text and "decision stands" in text
    assert "txsink recover" in text and "['kafka', 'pg']" in text
    done = coord.abort()
    assert kinds(done) == [("void", None, 2), ("abort", "pg", 2), ("abort", "kafka", 2)]
    for target in world.targets.values():  # the decided epoch's handles stay prepared
        assert len(target.prepared) == 2 and all(".e1." in n for n in target.prepared)
    assert coord.abort(epoch=2) == []
    assert TxLog(world.store).pending()[0].epoch == 1


def test_void_lost_to_a_zombie_commits_instead_of_aborting() -> None:
    """A zombie decides the round between the plan and the void: its decision is finished."""
    world = World()
    operate.recover(TxLog(world.store), world.coordinator(("pg", "kafka")))
    zombie = world.coordinator(("pg", "kafka"))
    log = TxLog(world.store)
    round_ = log.claim_round(3)
    acks = memory_precommit(batches_for(3, 2, 3))(TaskPlan(APP, 3, round_, zombie.sinks, None, 0))
    handles, _ = collect_acks(zombie.sinks, 3, acks)
    operator = world.coordinator(("pg", "kafka"))
    plan = operator.recovery_plan()
    assert ("void", None, 3) in kinds(plan)
    real_void = operator.log.void

    def zombie_decides_first(epoch: int, r: int, reason: str) -> Any:
        docs = {u: [dump_handle(h) for h in hs] for u, hs in handles.items()}
        operator.log.decide(epoch, round_, docs)
        return real_void(epoch, r, reason)

    operator.log.void = zombie_decides_first  # type: ignore[method-assign,assignment]
    done = operator.recover()
    assert "abort" not in [str(a.kind) for a in done]
    assert TxLog(world.store).committed(3) is not None
    for target in world.targets.values():
        assert len(target.visible()) == 18 and target.prepared == {}


def test_retired_sink_is_cleaned_up_only_with_allow_non_restored_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    world = World()
    with pytest.raises(NonRestoredStateError, match=r"\['kafka'\].*retired: \['kafka'\]"):
        world.coordinator(("pg",), retired=("kafka",)).recover()
    coord = world.coordinator(("pg",), retired=("kafka",), allow_non_restored_state=True)
    with caplog.at_level(logging.WARNING, logger="txsink"):
        done = coord.recover()
    assert ("abort_not_restored", "kafka", 1) in kinds(done)
    assert ("abort", "kafka", 2) in kinds(done)  # a retired sink's lingering one too
    record = TxLog(world.store).committed(1)
    assert record is not None and record.not_restored == ("kafka",)
    assert "WITHOUT sink uid(s) ['kafka']" in caplog.text
    assert world.targets["kafka"].prepared == {} and len(world.targets["kafka"].visible()) == 6
    assert len(world.targets["pg"].visible()) == 12 and world.targets["pg"].prepared == {}


def test_abort_gives_up_a_decided_epoch_held_only_by_a_retired_sink() -> None:
    world = World(uids=("kafka",))
    world.targets["pg"] = MemTarget()
    with pytest.raises(StateError, match="retired"):
        world.coordinator(("kafka",)).abort(epoch=1)  # kafka is live: the decision stands
    done = world.coordinator(("pg",), retired=("kafka",)).abort(epoch=1)
    assert kinds(done) == [
        ("commit", "pg", 1),
        ("abort_not_restored", "kafka", 1),
        ("abort_not_restored", "kafka", 1),
        ("mark_committed", None, 1),
    ]
    record = TxLog(world.store).committed(1)
    assert record is not None and record.not_restored == ("kafka",)
    assert all(".e2." in n for n in world.targets["kafka"].prepared)


# -- end to end: a files sink's crashed query, repaired through the CLI functions ----------


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath, name)
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _args(add: Any, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)
    return parser.parse_args(list(argv))


@pytest.mark.spark
def test_cli_recover_and_abort_a_crashed_files_query(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark.errors import StreamingQueryException

    from tests.streaming import files_coordinator, prepare_input, run_until_done, start_query
    from tests.test_files_spark import _assert_exactly_once
    from txsink.connectors.files import FilesSink

    prepare_input(tmp_path, 1000)
    # Epoch 1: partition 1's first attempt prepares and fails (Spark retries it: a leftover
    # attempt), then the driver fails after the decision: decided, not committed.
    faults = FaultPlan.parse(
        "after_precommit:raise@1#1,after_decision:raise@1", str(tmp_path / "faults")
    )
    query = start_query(spark, tmp_path, files_coordinator(tmp_path, faults=faults))
    with pytest.raises(StreamingQueryException):
        query.awaitTermination()
    assert len(faults.fired()) == 2
    # A driver that died after pre-committing epoch 2, before its decision.
    log = TxLog(files_coordinator(tmp_path).log.store)
    meta = log.meta()
    assert meta is not None
    sink = FilesSink(tmp_path / "output", uid="out")
    open_ = sink.begin(TxnId(meta["app_id"], "out", 2, log.claim_round(2), 0, 0), pa.schema([]))
    sink.prepare(open_)

    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        "from txsink.connectors.files import FilesSink\n\n\n"
        "def sinks():\n"
        f"    return [FilesSink({str(tmp_path / 'output')!r}, uid='out', format='parquet')]\n"
    )
    common = ("--log", str(tmp_path / "txlog"), "--pipeline", f"{pipeline}:sinks")
    before = _tree(tmp_path / "output"), _tree(tmp_path / "txlog")
    capsys.readouterr()
    assert recover_command(_args(add_recover_arguments, *common, "--dry-run")) == 0
    out = capsys.readouterr().out.splitlines()
    assert (_tree(tmp_path / "output"), _tree(tmp_path / "txlog")) == before
    assert [line.split(" ")[1] for line in out[:-1]] == [
        "commit",
        "mark",
        "abort",
        "void",
        "abort",
    ]
    assert out[-1] == (
        "txsink recover (dry run: nothing changed): would commit 2 transaction(s), would "
        "abort 2, would void 1 round(s), would finish 1 decided epoch(s)"
    )
    assert abort_command(_args(add_abort_arguments, *common, "--epoch", "1")) == 1
    assert "epoch 1 is decided" in capsys.readouterr().err
    assert abort_command(_args(add_abort_arguments, *common)) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" ")[0] for line in out[:-1]] == ["aborted", "voided", "aborted"]
    assert recover_command(_args(add_recover_arguments, *common)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("txsink recover: committed 2 transaction(s), aborted 0")
    assert os.listdir(tmp_path / "output" / "_txsink" / "staging") == []
    assert recover_command(_args(add_recover_arguments, *common)) == 0
    assert capsys.readouterr().out.strip() == "txsink recover: nothing to do"

    restarts, _ = run_until_done(spark, tmp_path, lambda: files_coordinator(tmp_path))
    assert restarts == 0
    _assert_exactly_once(tmp_path)
