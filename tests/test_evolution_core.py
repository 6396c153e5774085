"""Schema evolution through the protocol, without Spark: a crash at every step of a run
whose epochs add a column and widen another, on two in-memory targets that apply a change
in the same step that makes the epoch's rows visible (as a real connector must).

After each crash, the run restarts the way Spark would (replaying from the first epoch not
in its commit log) and must end with: every row once; each target's schema changed once
per change, in order, and exactly when the epoch that brought it became visible; the log
recording each change (a version-2 decision only where a change is).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest
from typing_extensions import override

from tests.memsink import Crash, Crasher, MemHandle, MemSink, MemStore, MemTarget
from txsink import Coordinator
from txsink.cli import main as cli_main
from txsink.contract import EpochCommit
from txsink.errors import CommitError
from txsink.ops.inspect import epoch_table
from txsink.ops.report import render_report
from txsink.ops.savepoint import create_savepoint, restore_savepoint
from txsink.ops.schemas import schema_history
from txsink.ops.state import rename_uid
from txsink.protocol.log import TxLog, open_log
from txsink.protocol.task import Ack, TaskPlan, run_partition
from txsink.schema import ADD, WIDEN_INT, SchemaChange, SchemaEvolutionError
from txsink.spark.checks import check_sinks

APP = "app-evo"
UIDS = ("left", "right")
S0 = pa.schema([("id", pa.int64()), ("amount", pa.int32())])
S1 = S0.append(pa.field("note", pa.string()))  # epoch 1 adds a column
S2 = S1.set(1, pa.field("amount", pa.int64()))  # epoch 2 widens one
#: Each change is followed by an epoch of the same schema, which must not apply it again.
SCHEMAS = [S0, S1, S1, S2, S2]


@dataclass
class EvoTarget(MemTarget):
    """A target with a schema: per committed epoch, its rows and the schema they became
    visible under, and the changes applied (``prepared`` is :class:`MemTarget`'s)."""

    schema: pa.Schema = S0
    epochs: dict[int, tuple[list[int], pa.Schema]] = field(default_factory=dict)
    changes: list[str] = field(default_factory=list)


class EvoSink(MemSink):
    """:class:`MemSink` whose commit is one atomic step per epoch, schema change included."""

    def __init__(self, uid: str, target: EvoTarget, crasher: Crasher, **options: Any) -> None:
        super().__init__(uid, target, crasher)
        self.evo = target
        self.schema_evolution = options.get("schema_evolution", "strict")

    @override
    def target_schema(self, app_id: str) -> pa.Schema:
        return self.evo.schema

    @override
    def evolution_support(self) -> frozenset[str]:
        return frozenset({ADD, WIDEN_INT})

    @override
    def commit_epoch(self, request: EpochCommit[MemHandle]) -> None:
        """One atomic step: the change (if any) and every row of the epoch, like one
        target transaction; again after a crash, it finds the epoch there."""
        epoch, target = request.epoch, self.evo
        self.crasher.tick(f"{self.uid} commit {epoch} (before)")
        if epoch in target.epochs:
            return
        names = [str(h.txn) for h in request.handles]
        missing = [n for n in names if n not in target.prepared]
        if missing:
            raise CommitError(f"{missing} neither prepared nor committed", sink_uid=self.uid)
        change = request.schema_change
        if change is not None:
            if not change.old.equals(target.schema):
                raise CommitError(f"{change.describe()} planned against another schema")
            target.schema = change.new
            target.changes.append(change.describe())
        rows = [r for n in names for r in target.prepared.pop(n)]
        target.epochs[epoch] = (rows, target.schema)
        request.committed(request.handles)
        self.crasher.tick(f"{self.uid} commit {epoch} (after)")


def _batches(epoch: int) -> list[list[pa.RecordBatch]]:
    schema = SCHEMAS[epoch]
    out = []
    for p in range(2):
        ids = [epoch * 1000 + p * 100 + i for i in range(3)]
        cols = {"id": pa.array(ids, pa.int64()), "amount": pa.array(ids, schema.field(1).type)}
        if "note" in schema.names:
            cols["note"] = pa.array([f"n{i}" for i in ids])
        out.append([pa.RecordBatch.from_pydict(cols, schema=schema)])
    return out


def _precommit(epoch: int, base: int) -> Any:
    def run(plan: TaskPlan) -> list[Ack]:
        return [
            a for p, bs in enumerate(_batches(epoch)) for a in run_partition(plan, p, base + p, bs)
        ]

    return run


@dataclass
class World:
    store: MemStore = field(default_factory=MemStore)
    targets: dict[str, EvoTarget] = field(default_factory=lambda: {u: EvoTarget() for u in UIDS})
    spark_done: set[int] = field(default_factory=set)

    def run(self, crash_at: int = 0, then_crash_at: int = 0) -> Crasher:
        first = Crasher(at=crash_at)
        crashes = [first, Crasher(at=then_crash_at)]
        for attempt in range(20):
            try:
                self._attempt(crashes[attempt] if attempt < len(crashes) else Crasher(), attempt)
                return first
            except Crash:
                continue
        raise AssertionError("did not finish")

    def _attempt(self, crasher: Crasher, attempt: int) -> None:
        """One driver process: Spark's replay from the first epoch not in its commit log."""
        self.store.crasher = crasher
        sinks = [EvoSink(u, self.targets[u], crasher, schema_evolution="add-columns") for u in UIDS]
        coord = Coordinator(sinks, log=TxLog(self.store), app_id=APP, faults=None)
        checked: list[pa.Schema] = []  # as SparkEpochs: plan again only on a new schema

        def plan(epoch: int) -> None:  # SparkEpochs.check_schema's part
            coord.schema_plan = check_sinks(sinks, SCHEMAS[epoch], APP, None)
            checked[:] = [SCHEMAS[epoch]]

        for epoch in range(len(SCHEMAS)):
            if epoch in self.spark_done:
                continue
            if not checked or not checked[0].equals(SCHEMAS[epoch]):
                plan(epoch)
            replan = functools.partial(plan, epoch)
            coord.run_epoch(epoch, _precommit(epoch, attempt * 10), app_id=APP, replan=replan)
            crasher.tick(f"spark commit log {epoch}")
            self.spark_done.add(epoch)

    def check(self) -> None:
        for uid, target in self.targets.items():
            assert target.prepared == {}, f"{uid}: lingering {sorted(target.prepared)}"
            assert sorted(target.epochs) == list(range(len(SCHEMAS))), uid
            for epoch, (rows, schema) in target.epochs.items():
                want = [r for bs in _batches(epoch) for b in bs for r in b.column("id").to_pylist()]
                assert sorted(rows) == sorted(want), f"{uid} epoch {epoch}"
                assert schema.equals(SCHEMAS[epoch]), f"{uid} epoch {epoch}: {schema}"
            assert target.changes == [
                "adds note (string)",
                "widens amount int32 -> int64",
            ], f"{uid}: {target.changes}"
        history = schema_history(TxLog(self.store))
        assert [(h.epoch, h.sink) for h in history] == [
            (1, "left"),
            (1, "right"),
            (3, "left"),
            (3, "right"),
        ]


def test_a_clean_run_evolves_each_target_once_with_its_epoch() -> None:
    world = World()
    world.run()
    world.check()
    versions = {
        key: json.loads(raw)["version"]
        for key, raw in world.store.data.items()
        if "/decision-" in key
    }
    # Version 2 only for the decisions that carry a change: an older txsink reads the rest.
    assert sorted(versions.values()) == [1, 1, 1, 2, 2]


def _steps() -> int:
    return World().run().steps


def test_a_crash_at_every_step_applies_each_change_once_with_its_rows() -> None:
    total = _steps()
    assert total > 30
    for k in range(1, total + 1):
        world = World()
        crasher = world.run(crash_at=k)
        assert crasher.dead, f"step {k} was never reached"
        try:
            world.check()
        except AssertionError as err:
            raise AssertionError(f"crash at step {k} ({crasher.trace[-1]}): {err}") from err


def test_a_second_crash_during_recovery_changes_nothing_twice() -> None:
    total = _steps()
    for k in range(1, total + 1, 4):
        for k2 in range(1, 16, 2):
            world = World()
            crasher = world.run(crash_at=k, then_crash_at=k2)
            try:
                world.check()
            except AssertionError as err:
                raise AssertionError(
                    f"crash at {k} ({crasher.trace[-1]}) then {k2}: {err}"
                ) from err


def test_strict_stops_the_epoch_before_anything_is_written() -> None:
    target = EvoTarget()
    sink = EvoSink("left", target, Crasher())
    with pytest.raises(SchemaEvolutionError, match="schema_evolution='add-columns'"):
        check_sinks([sink], S1, APP, None)
    assert target.schema.equals(S0) and target.epochs == {} and target.prepared == {}


def test_the_change_is_recorded_with_old_and_new_schema() -> None:
    world = World()
    world.run()
    change = TxLog(world.store).decision(1)
    assert change is not None
    recorded = change.schema_change("left")
    assert isinstance(recorded, SchemaChange)
    assert recorded.old.equals(S0) and recorded.new.equals(S1)


def test_the_history_outlives_pruning_and_travels_in_a_savepoint(tmp_path: Any) -> None:
    world = World()
    world.run()
    log = TxLog(world.store)
    assert log.prune(1) == [0, 1, 2, 3]  # every evolved epoch's records are gone ...
    told = [(e.epoch, e.sink, e.change.describe()) for e in schema_history(log)]
    assert told[0] == (1, "left", "adds note (string)") and len(told) == 4  # ... not its history
    world.store.crasher = Crasher()
    create_savepoint(log, tmp_path / "sp")
    restore_savepoint(tmp_path / "sp", tmp_path / "restored")
    restored = [
        (e.epoch, e.sink, e.change.describe())
        for e in schema_history(open_log(tmp_path / "restored"))
    ]
    assert restored == told


def test_status_inspect_and_the_report_show_the_changes(tmp_path: Any, capsys: Any) -> None:
    world = World()
    world.run()
    world.store.crasher = Crasher()
    create_savepoint(TxLog(world.store), tmp_path / "sp")
    restore_savepoint(tmp_path / "sp", tmp_path / "log")
    location = str(tmp_path / "log")
    assert cli_main(["status", "--log", location]) == 0
    text = capsys.readouterr().out
    assert "epoch 3 sink right: widens amount int32 -> int64" in text
    assert cli_main(["status", "--log", location, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(c["epoch"], c["sink"]) for c in doc["schema_changes"]][:2] == [
        (1, "left"),
        (1, "right"),
    ]
    assert doc["schema_changes"][0]["new"]["note"] == "string"
    table = epoch_table(location).set_index("epoch")["schema_changes"]
    assert table[1] == "left: adds note (string); right: adds note (string)"
    assert table.isna().tolist() == [True, False, True, False, True]
    assert "<h2>Schema changes</h2>" in render_report(location)


def test_rename_uid_renames_the_schema_changes_too() -> None:
    world = World()
    world.run()
    world.store.crasher = Crasher()
    rename_uid(TxLog(world.store), "left", "leftie")
    sinks = {e.sink for e in schema_history(TxLog(world.store))}
    assert sinks == {"leftie", "right"}
