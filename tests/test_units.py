"""Unit tests of the small modules: ids, errors, handles, faults, the log on files."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from txsink.errors import EpochAbortedError, HandleFormatError, LogError, WriteError
from txsink.handles import dump_handle, load_handle
from txsink.protocol.faults import CrashPoint, Fault, FaultMode, FaultPlan
from txsink.protocol.log import FileStore, TxLog, open_log
from txsink.txid import TxnId


def test_txnid_round_trips_and_rejects_bad_names() -> None:
    txn = TxnId("f64e0144-3282-429c", "orders_pg", 12, 1, 3, 77)
    assert str(txn) == "txsink.f64e0144-3282-429c.orders_pg.e12.r1.p3.a77"
    assert TxnId.parse(str(txn)) == txn
    assert TxnId.try_parse("someone-elses-gid") is None
    with pytest.raises(ValueError, match="sink uid"):
        TxnId("app", "bad.uid", 0, 0, 0, 0)
    with pytest.raises(ValueError, match="epoch"):
        TxnId("app", "uid", -1, 0, 0, 0)


def test_errors_pickle_with_their_context() -> None:
    err = WriteError("bad value", sink_uid="s", epoch=3, partition=1, row=7, column="c")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is WriteError
    assert back.context == err.context
    assert str(back) == "[sink_uid=s, epoch=3, partition=1, row=7, column=c] bad value"
    agg = EpochAbortedError("aborted", causes=[err], epoch=3)
    back2 = pickle.loads(pickle.dumps(agg))
    assert back2.causes[0].column == "c"


def test_handle_versions_are_checked() -> None:
    from tests.memsink import MemHandle

    h = MemHandle(txn=TxnId("a", "u", 1, 0, 0, 0), rows=5)
    doc = dump_handle(h)
    assert json.loads(json.dumps(doc)) == doc
    assert load_handle(doc) == h
    with pytest.raises(HandleFormatError, match="version 9"):
        load_handle({**doc, "version": 9}, sink_uid="u")
    with pytest.raises(HandleFormatError, match="unknown handle serializer"):
        load_handle({**doc, "serializer": "nope"})


def test_fault_specs_parse_and_validate() -> None:
    f = Fault.parse("after_precommit:kill-worker@2#1*3")
    assert (f.point, f.mode, f.epoch, f.partition, f.times) == (
        CrashPoint.AFTER_PRECOMMIT,
        FaultMode.KILL_WORKER,
        2,
        1,
        3,
    )
    assert str(f) == "after_precommit:kill-worker@2#1*3"
    assert Fault.parse("after_decision").mode is FaultMode.RAISE
    with pytest.raises(ValueError, match="no Python worker"):
        Fault.parse("after_decision:kill-worker")
    with pytest.raises(ValueError, match="unknown crash point"):
        Fault.parse("whenever")


def test_faults_fire_the_given_number_of_times_across_plans(tmp_path: Path) -> None:
    from txsink.errors import InjectedFault

    plan = FaultPlan.parse("before_decision*2", str(tmp_path))
    for _ in range(2):
        with pytest.raises(InjectedFault):
            plan.fire(CrashPoint.BEFORE_DECISION, epoch=0)
    # A new plan over the same state folder (a restarted process) does not fire again.
    FaultPlan.parse("before_decision*2", str(tmp_path)).fire(CrashPoint.BEFORE_DECISION, epoch=0)
    assert len(plan.fired()) == 2


def test_fault_plan_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TXSINK_FAULT", "during_commit:kill-driver@4, during_recovery")
    monkeypatch.setenv("TXSINK_FAULT_STATE", str(tmp_path))
    plan = FaultPlan.from_env()
    assert plan is not None and plan.state_dir == str(tmp_path)
    assert [str(f) for f in plan.faults] == ["during_commit:kill-driver@4", "during_recovery:raise"]


def test_file_store_create_is_exclusive(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    assert store.create("epochs/1/a.json", b"1")
    assert not store.create("epochs/1/a.json", b"2")
    assert store.read("epochs/1/a.json") == b"1"
    assert store.list("epochs/") == ["epochs/1/a.json"]
    assert not [n for n in os.listdir(tmp_path / "epochs/1") if n.startswith(".tmp")]


def test_log_rounds_voids_and_decisions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.bind_app("app")
    assert log.claim_round(5) == 0
    assert log.claim_round(5) == 1
    assert log.void(5, 0, "test") is None
    assert not log.decide(5, 0, {"s": []})  # a void round can never be decided
    assert log.decide(5, 1, {"s": []})
    assert log.void(5, 1, "late") is not None  # a decided round cannot be voided
    assert log.decision(5) is not None and log.decision(5).round == 1  # type: ignore[union-attr]
    assert [d.epoch for d in log.pending()] == [5]
    log.mark_committed(5, 1)
    assert log.pending() == [] and log.last_committed() == 5
    state = log.state(5)
    assert (state.status, state.rounds, state.voided) == ("committed", (0, 1), (0,))


def test_log_prunes_old_committed_epochs(tmp_path: Path) -> None:
    log = TxLog(FileStore(tmp_path))
    log.bind_app("app")
    for e in range(10):
        r = log.claim_round(e)
        log.decide(e, r, {})
        log.mark_committed(e, r)
    removed = log.prune(3)
    assert removed == list(range(7))
    assert log.epochs() == [7, 8, 9]


def test_log_refuses_unknown_format(tmp_path: Path) -> None:
    (tmp_path / "meta.json").write_text(json.dumps({"format": "txsink-log", "version": 99}))
    with pytest.raises(LogError, match="version 99"):
        open_log(tmp_path).meta()
    with pytest.raises(LogError, match="scheme"):
        open_log("hdfs://nn/x")


def test_fault_state_without_env_folder_is_shared_by_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TXSINK_FAULT", "after_decision:raise@7")
    monkeypatch.delenv("TXSINK_FAULT_STATE", raising=False)
    first, second = FaultPlan.from_env(), FaultPlan.from_env()
    assert first is not None and second is not None and first.state_dir == second.state_dir


def test_kill_driver_from_a_task_on_another_host_is_refused(tmp_path: Path) -> None:
    from txsink.errors import InjectedFault

    plan = FaultPlan.parse("after_precommit:kill-driver", str(tmp_path))
    with pytest.raises(InjectedFault, match="only kill a driver on its own host"):
        plan.fire(
            CrashPoint.AFTER_PRECOMMIT,
            epoch=0,
            partition=0,
            driver_pid=1,
            driver_host="some-other-host",
        )


def test_runner_ends_a_silent_hang() -> None:
    import sys
    import time

    from txsink.runner import run_until_done

    t0 = time.monotonic()
    report = run_until_done(
        [sys.executable, "-c", "import time; time.sleep(60)"], max_runs=1, timeout=1.0
    )
    assert not report.finished and time.monotonic() - t0 < 30


def test_runner_interrupted_ends_its_child() -> None:
    """An interrupt that reaches the runner alone (``pkill -INT`` of a soak) must not
    leave the query it runs going on unwatched."""
    import os
    import sys

    from txsink.runner import run_until_done

    pids: list[int] = []

    def on_line(line: str) -> None:
        pids.append(int(line))
        raise KeyboardInterrupt

    child = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    with pytest.raises(KeyboardInterrupt):
        run_until_done([sys.executable, "-c", child], max_runs=1, on_line=on_line)
    assert len(pids) == 1
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


def test_kafka_replay_checksum_covers_every_field_and_reads_v1_handles() -> None:
    import pyarrow as pa

    from txsink.connectors.kafka import RECORD_SCHEMA, KafkaReplayHandle
    from txsink.connectors.kafka.records.checksum import checksum as _checksum

    def records(partition: int | None, headers: Any, key: bytes | None) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist(
            [{"topic": "t", "partition": partition, "key": key, "value": b"v", "headers": headers}],
            schema=RECORD_SCHEMA,
        )

    base = _checksum(records(None, None, b"k"), 2)
    assert _checksum(records(1, None, b"k"), 2) != base
    assert _checksum(records(None, [{"key": "h", "value": b"x"}], b"k"), 2) != base
    assert _checksum(records(None, None, None), 2) != _checksum(records(None, None, b""), 2)
    assert _checksum(records(1, None, b"k"), 1) == _checksum(records(None, None, b"k"), 1)
    old = load_handle(
        {
            "serializer": "kafka.replay",
            "version": 1,
            "data": {"txn": "txsink.a.u.e1.r0.p0.a0", "rows": 1, "shards": 2, "checksum": 7},
        }
    )
    assert isinstance(old, KafkaReplayHandle) and old.checksum_version == 1
    assert KafkaReplayHandle.version == 3


def test_a_pipeline_file_may_define_dataclasses(tmp_path: Path) -> None:
    """``txsink chaos run FILE.py:FUNCTION`` loads the file as a module that is in
    ``sys.modules`` while it runs: a dataclass in it needs that."""
    from txsink.runner import load_callable

    path = tmp_path / "pipeline.py"
    path.write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
        "@dataclass\nclass Options:\n    rows: int = 3\n\n"
        "def main() -> int:\n    return Options().rows\n"
    )
    assert load_callable(f"{path}:main")() == 3
