"""The driver lease (txsink.protocol.lease) on the file store with a fake clock, and the blocked
epoch (EpochBlockedError) end to end through the coordinator, status and recover, with
in-memory sinks. The same on real servers: integration/test_lease.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.memsink import Crasher, MemHandle, MemSink, MemTarget, batches_for, memory_precommit
from txsink import Coordinator
from txsink.cli import main as cli_main
from txsink.errors import DriverLeaseError, EpochBlockedError, FencedError
from txsink.metrics import RecordingMetrics
from txsink.protocol.lease import LeaseKeeper, current_lease, live_holder, process_identity
from txsink.protocol.log import TxLog, open_log
from txsink.txid import TxnId

APP = "app-1"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _keeper(log: TxLog, clock: Clock, host: str, lease_s: float = 60.0) -> LeaseKeeper:
    return LeaseKeeper(log, lease_s, clock=clock, host=host)


def test_a_second_driver_refuses_while_the_first_lease_is_fresh(tmp_path: Path) -> None:
    log, clock = open_log(tmp_path), Clock()
    first = _keeper(log, clock, "host-a")
    first.hold()
    clock.now += 59
    with pytest.raises(DriverLeaseError) as err:
        _keeper(log, clock, "host-b").hold()
    text = str(err.value)
    assert "another driver (host host-a, pid" in text
    assert "is running this query: stop it or wait until its lease expires (lease_s=60" in text
    assert "Nothing was voided or aborted" in text
    first.hold()  # still the holder: not disturbed


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(tmp_path: Path) -> None:
    log, clock = open_log(tmp_path), Clock()
    first = _keeper(log, clock, "host-a", lease_s=10)
    first.hold()
    clock.now += 10
    second = _keeper(log, clock, "host-b", lease_s=10)
    taken = second.hold()
    assert taken.host == "host-b" and taken.generation == 1
    with pytest.raises(FencedError, match="taken over by another driver"):
        first.hold()
    with pytest.raises(FencedError):  # and stays fenced
        first.hold()
    second.hold()


def test_renewal_keeps_the_lease_and_only_two_generations(tmp_path: Path) -> None:
    log, clock = open_log(tmp_path), Clock()
    first = _keeper(log, clock, "host-a", lease_s=8)
    first.hold()
    for _ in range(5):
        clock.now += 3  # past lease_s / 4: each hold renews
        first.hold()
    clock.now += 7  # 7 s after the last renewal, 22 s after the start: still fresh
    with pytest.raises(DriverLeaseError):
        _keeper(log, clock, "host-b", lease_s=8).hold()
    assert sorted(p.name for p in (tmp_path / "lease").iterdir()) == [
        "000000000004.json",
        "000000000005.json",
    ]


def test_a_released_lease_is_taken_over_at_once(tmp_path: Path) -> None:
    log, clock = open_log(tmp_path), Clock()
    first = _keeper(log, clock, "host-a")
    first.hold()
    first.release()
    lease = current_lease(log)
    assert lease is not None and lease.released
    assert _keeper(log, clock, "host-b").hold().host == "host-b"


def test_a_dead_holder_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    """A SIGKILLed driver restarted on the same host waits for nothing."""
    log, clock = open_log(tmp_path), Clock()
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(done.stdout)
    _write_lease(tmp_path, pid=dead_pid, started=f"boot:{dead_pid}", renewed_at=clock.now)
    assert _keeper(log, clock, socket.gethostname()).hold().pid == os.getpid()


def test_a_reused_pid_is_taken_for_dead(tmp_path: Path) -> None:
    """The pid lives, but it is another process: its start time differs."""
    if not process_identity():
        pytest.skip("no /proc: process start times unknown")
    log, clock = open_log(tmp_path), Clock()
    _write_lease(tmp_path, pid=os.getppid(), started="another-boot:1", renewed_at=clock.now)
    assert _keeper(log, clock, socket.gethostname()).hold().pid == os.getpid()


def test_a_live_holder_on_this_host_is_refused(tmp_path: Path) -> None:
    log, clock = open_log(tmp_path), Clock()
    parent = os.getppid()
    _write_lease(tmp_path, pid=parent, started=process_identity(parent), renewed_at=clock.now)
    with pytest.raises(DriverLeaseError):
        _keeper(log, clock, socket.gethostname()).hold()
    assert live_holder(log, clock=clock) is not None


def test_two_drivers_racing_for_a_free_lease_get_one_holder(tmp_path: Path) -> None:
    log, clock = open_log(tmp_path), Clock()
    a, b = _keeper(log, clock, "host-a"), _keeper(log, clock, "host-b")
    a.hold()
    clock.now += 100
    # b and a's renewal race for generation 1: a renews first, b then finds it fresh.
    a.hold()
    with pytest.raises(DriverLeaseError):
        b.hold()


def _write_lease(root: Path, *, pid: int, started: str, renewed_at: float) -> None:
    doc = {
        "version": 1,
        "generation": 0,
        "host": socket.gethostname(),
        "pid": pid,
        "started": started,
        "run_id": "x" * 32,
        "acquired_at": renewed_at,
        "renewed_at": renewed_at,
        "lease_s": 60.0,
        "released": False,
        "by": "driver",
    }
    (root / "lease").mkdir(parents=True, exist_ok=True)
    (root / "lease" / "000000000000.json").write_text(json.dumps(doc))


# -- the coordinator, recover and the blocked epoch, with in-memory sinks ----------------


class RefusingSink(MemSink):
    """Commits like MemSink unless ``refuse``: then its target refuses for good."""

    refuse = False

    def commit(self, handle: MemHandle) -> None:
        if self.refuse:
            raise EpochBlockedError(
                "the target refuses record key b'k7' (too large for the topic)",
                fix="raise the topic's max.message.bytes to at least 4096",
                shard=handle.txn.partition,
                partition=handle.txn.partition,
            )
        super().commit(handle)


def _coordinator(tmp_path: Path, sink: MemSink, **kw: Any) -> Coordinator:
    return Coordinator([sink], log=tmp_path / "log", app_id=APP, faults=None, **kw)


def test_a_second_coordinator_is_refused_before_recovery_voids_anything(tmp_path: Path) -> None:
    target = MemTarget()
    LeaseKeeper(open_log(tmp_path / "log"), 60.0, host="another-host").hold()
    coord = _coordinator(tmp_path, MemSink("s", target, Crasher()))
    leftover = str(TxnId(APP, "s", 0, 0, 0, 0))
    target.prepared[leftover] = [1]  # what a recovery would void and abort
    with pytest.raises(DriverLeaseError, match=r"another driver \(host another-host"):
        coord.run_epoch(0, memory_precommit(batches_for(0, 2, 2)), app_id=APP)
    log = open_log(tmp_path / "log")
    assert log.epochs() == [], "the refused driver wrote nothing"
    assert target.prepared == {leftover: [1]}
    with pytest.raises(DriverLeaseError):
        coord.recover()
    coord.recover(break_lease=True)  # the operator knows the holder is dead
    assert target.prepared == {}


def test_a_blocked_epoch_is_recorded_shown_and_finished_by_recover(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, metrics = MemTarget(), RecordingMetrics()
    sink = RefusingSink("kafka", target, Crasher())
    coord = _coordinator(tmp_path, sink, metrics=metrics)
    coord.run_epoch(0, memory_precommit(batches_for(0, 2, 2)), app_id=APP)
    sink.refuse = True
    for _attempt in range(2):
        with pytest.raises(EpochBlockedError) as err:
            coord.run_epoch(1, memory_precommit(batches_for(1, 2, 2)), app_id=APP)
        coord.close()
    text = str(err.value)
    assert "epoch 1 is BLOCKED (refused attempt 2)" in text
    assert "b'k7'" in text and "max.message.bytes" in text
    assert "recovery retries" not in text
    assert err.value.sink_uid == "kafka" and err.value.epoch == 1
    state = open_log(tmp_path / "log").state(1)
    assert state.status == "blocked" and state.blocked is not None
    assert state.blocked.attempts == 2 and state.blocked.fix.startswith("raise the topic")
    assert metrics.gauges[(APP, "blocked_epochs", "kafka", "memory")] == 1

    assert cli_main(["status", "--log", str(tmp_path / "log")]) == 0
    out = capsys.readouterr().out
    assert "blocked" in out and "BLOCKED since" in out and "fix: raise the topic" in out
    assert cli_main(["status", "--log", str(tmp_path / "log"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["epochs"][1]["status"] == "blocked"
    assert doc["epochs"][1]["blocked"]["attempts"] == 2

    from txsink.ops.inspect import epoch_table

    table = epoch_table(tmp_path / "log")
    assert list(table["status"]) == ["committed", "blocked"]
    assert "max.message.bytes" in table["blocked_reason"][1]

    sink.refuse = False  # the operator fixed the cause
    coord.recover()
    state = open_log(tmp_path / "log").state(1)
    assert state.status == "committed"
    assert metrics.gauges[(APP, "blocked_epochs", "kafka", "memory")] == 0
    assert sorted(target.visible()) == sorted(
        b.column("id").to_pylist()[i]
        for e in (0, 1)
        for bs in batches_for(e, 2, 2)
        for b in bs
        for i in range(b.num_rows)
    )


def test_a_lease_held_before_the_query_starts_refuses_a_second_driver_first(
    tmp_path: Path,
) -> None:
    """``hold_lease()`` before ``writeStream...start()``: the second coordinator is refused
    before any epoch (so before its Spark query reads or writes the checkpoint), the first
    runs its epochs under the same lease, and ``close()`` frees it."""
    target = MemTarget()
    first = _coordinator(tmp_path, MemSink("s", target, Crasher()))
    held = first.hold_lease()
    assert held.pid == os.getpid() and not held.released
    other_host = LeaseKeeper(open_log(tmp_path / "log"), 60.0, host="another-host")
    with pytest.raises(DriverLeaseError, match="Nothing was voided or aborted"):
        other_host.hold()
    first.run_epoch(0, memory_precommit(batches_for(0, 2, 2)), app_id=APP)
    lease = current_lease(open_log(tmp_path / "log"))
    assert lease is not None and lease.run_id == held.run_id, "one lease, from before the start"
    assert first.hold_lease().run_id == held.run_id  # held again: renewed, not re-acquired
    first.close()
    lease = current_lease(open_log(tmp_path / "log"))
    assert lease is not None and lease.released
    assert other_host.hold().host == "another-host"


def test_lengthen_takes_effect_at_the_next_renewal(tmp_path: Path) -> None:
    """A lease held before the trigger interval was known grows to the query's default."""
    log, clock = open_log(tmp_path), Clock()
    keeper = _keeper(log, clock, "host-a", lease_s=60)
    keeper.hold()
    keeper.lengthen(300)
    keeper.lengthen(10)  # never shortened
    renewed = keeper.hold()  # due at once: the record says 60, the keeper 300
    assert renewed.lease_s == 300 and renewed.generation == 1
    clock.now += 200  # past the old 60 s, inside the new 300 s
    with pytest.raises(DriverLeaseError, match="lease_s=300"):
        _keeper(log, clock, "host-b").hold()


@pytest.mark.spark
def test_a_running_query_keeps_its_lease_between_epochs_and_frees_it_when_stopped(
    spark: Any, tmp_path: Path
) -> None:
    """The renewal thread watches the query through the registry every clone of the
    session shares: inside ``foreachBatch`` ``df.sparkSession`` is the stream's clone, whose
    ``streams`` knows no query, and a watch through it took the running query for stopped
    and *released* the lease after its first epoch (a second driver then took over)."""
    from txsink.connectors.files import FilesSink

    log_path = tmp_path / "log"
    coord = Coordinator(
        [FilesSink(str(tmp_path / "out"), uid="rate", format="jsonl")],
        log=log_path,
        lease_s=0.8,  # renewed every 0.2 s
        faults=None,
    )
    coord.hold_lease()
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .load()
        .writeStream.foreachBatch(coord)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="2 seconds")  # idle between epochs, longer than the lease
        .start()
    )
    try:
        log = open_log(log_path)
        while (log.last_committed() or 0) < 1:  # two epochs, the idle time between them
            assert query.isActive, query.exception()
            query.awaitTermination(0.2)
        seen = []
        for _ in range(10):
            lease = current_lease(log)
            assert lease is not None and not lease.released, lease
            seen.append(lease.generation)
            query.awaitTermination(0.3)
        assert seen == sorted(seen) and seen[-1] > seen[0], "renewed while the query runs"
        with pytest.raises(DriverLeaseError):
            LeaseKeeper(log, 60.0, host="another-host").hold()
    finally:
        query.stop()
    for _ in range(50):  # the thread sees the query stopped within a tick or two
        lease = current_lease(open_log(log_path))
        if lease is not None and lease.released:
            break
        time.sleep(0.2)  # (a stopped query's awaitTermination returns at once)
    assert lease is not None and lease.released, lease
    coord.close()


class _Msg:
    """What a delivery callback gets for a refused record (confluent-kafka's Message)."""

    def key(self) -> bytes:
        return b"k150"

    def value(self) -> bytes:
        return b"x" * 60_000

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def topic(self) -> str:
        return "orders"

    def partition(self) -> int:
        return 1


def test_direct_mode_keeps_the_refused_record_so_a_refusal_blocks_naming_it() -> None:
    """Direct mode's delivery callback keeps the record's code and key (as WAL and replay
    mode do): a commit that fails after the decision with an unclassified code is still
    recognised as blocked by the refused record's own code, and names the record."""
    from confluent_kafka import KafkaError

    from txsink.connectors.kafka.clients.errors import FailedDelivery, commit_error
    from txsink.connectors.kafka.clients.producers import on_failed_delivery
    from txsink.connectors.kafka.clients.settings import KafkaSettings

    errors: list[Any] = []
    on_failed_delivery(errors, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Msg())
    on_failed_delivery(errors, KafkaError(KafkaError._MSG_TIMED_OUT), _Msg())
    assert len(errors) == 1 and isinstance(errors[0], FailedDelivery)
    assert errors[0].key == b"k150" and errors[0].name == "MSG_SIZE_TOO_LARGE"
    settings = KafkaSettings("b:9092", "orders", "txsink", "markers", 2, 30.0)
    err = commit_error(
        KafkaError(KafkaError._INVALID_ARG), settings, epoch=9, shard=1, delivery=errors
    )
    assert isinstance(err, EpochBlockedError), err
    assert "key b'k150'" in str(err) and "max.message.bytes" in err.fix


def test_a_coordinator_rebuilt_in_the_same_process_shares_the_lease_without_fencing(
    tmp_path: Path,
) -> None:
    """Two keepers of one driver process (a pipeline built again in the driver): the later
    takes the lease over at once, and the earlier, used again, takes it back; neither is a
    zombie. A keeper of another process stays refused, and fenced once it is taken over."""
    log, clock = open_log(tmp_path), Clock()
    first, again = LeaseKeeper(log, 60.0, clock=clock), LeaseKeeper(log, 60.0, clock=clock)
    first.hold()
    assert again.hold().run_id == again.run_id
    assert first.hold().run_id == first.run_id  # back, no FencedError
    assert again.hold().run_id == again.run_id
    with pytest.raises(DriverLeaseError):
        _keeper(log, clock, "host-b").hold()
    clock.now += 61
    _keeper(log, clock, "host-b").hold()
    with pytest.raises(FencedError):
        first.hold()
