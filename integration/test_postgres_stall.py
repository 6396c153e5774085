"""A stalled PostgreSQL (through the network-fault proxy, against the real server) ends a
task or a commit within the sink's timeouts instead of hanging it: in a task nothing of
the epoch is visible, in the driver's commit the prepared transaction waits for the next
run to finish the decision."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from txsink.connectors.postgres import PostgresSink
from txsink.errors import RetryableError
from txsink.txid import TxnId

pytestmark = pytest.mark.postgres

SCHEMA = pa.schema([("id", pa.int64()), ("payload", pa.string())])
STALL_S = 2.0
#: A bound on each stalled call: the stall timeout (or libpq's 2 s minimum connect
#: timeout) and a margin for a loaded machine.
BOUND_S = STALL_S + 6.0


def _batch(ids: range) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"id": list(ids), "payload": ["x" * 200] * len(ids)}, schema=SCHEMA
    )


def _rows(postgres: Any, query: str) -> list[tuple[Any, ...]]:
    with postgres.connect() as conn:
        return conn.execute(query).fetchall()  # type: ignore[no-any-return]


def _prepared(postgres: Any, uid: str) -> list[str]:
    return [g for (g,) in _rows(postgres, "SELECT gid FROM pg_prepared_xacts") if f".{uid}." in g]


@pytest.fixture
def target(postgres: Any) -> tuple[str, str]:
    schema = postgres.new_schema("stall")
    with postgres.connect() as conn:
        conn.execute(f"CREATE TABLE {schema}.t (id bigint, payload text)")
    return f"{schema}.t", schema


def _sink(dsn: str, name: str, uid: str) -> PostgresSink:
    return PostgresSink(dsn, name, uid=uid, stall_timeout_s=STALL_S, connect_timeout_s=2)


def _timed(call: Any) -> tuple[RetryableError, float]:
    start = time.monotonic()
    with pytest.raises(RetryableError) as info:
        call()
    return info.value, time.monotonic() - start


@pytest.mark.parametrize("when", ["write", "prepare"])
def test_stall_in_a_task_fails_it_and_leaves_nothing(
    postgres: Any, target: tuple[str, str], when: str
) -> None:
    name, uid = target
    proxy, dsn = postgres.with_proxy()
    sink = _sink(dsn, name, uid)
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", uid, 1, 0, 1, 0), SCHEMA)
    sink.write(open_, _batch(range(1000)))
    proxy.stall()

    def step() -> None:
        if when == "write":  # enough to fill the socket buffers of both hops
            for start in range(0, 200_000, 20_000):
                sink.write(open_, _batch(range(start, start + 20_000)))
        sink.prepare(open_)

    err, took = _timed(step)
    proxy.heal()
    assert took < BOUND_S, f"the stalled {when} took {took:.1f} s"
    assert err.phase in ("write", "prepare") and err.partition == 1 and err.sink_uid == uid
    assert "did not answer" in str(err) and "stall_timeout_s" in str(err)
    assert _rows(postgres, f"SELECT count(*) FROM {name}") == [(0,)]
    assert _prepared(postgres, uid) == []


def test_stall_while_connecting_fails_the_task(postgres: Any, target: tuple[str, str]) -> None:
    name, uid = target
    proxy, dsn = postgres.with_proxy()
    sink = _sink(dsn, name, uid)
    proxy.stall()
    err, took = _timed(lambda: sink.begin(TxnId("app", uid, 1, 0, 0, 0), SCHEMA))
    proxy.heal()
    assert took < BOUND_S and err.phase == "begin" and err.partition == 0


def test_stall_in_commit_leaves_the_decision_to_the_next_run(
    postgres: Any, target: tuple[str, str], tmp_path: Path
) -> None:
    name, uid = target
    proxy, dsn = postgres.with_proxy()
    direct = _sink(postgres.dsn, name, uid)
    direct.check(SCHEMA, "app")
    open_ = direct.begin(TxnId("app", uid, 1, 0, 0, 0), SCHEMA)
    direct.write(open_, _batch(range(10)))
    handle = direct.prepare(open_)
    driver = _sink(dsn, name, uid)
    driver.check(SCHEMA, "app")  # the driver's connection is open, through the proxy
    proxy.stall()
    err, took = _timed(lambda: driver.commit(handle))
    assert took < BOUND_S and err.phase == "commit" and err.epoch == 1
    assert _prepared(postgres, uid) == [str(handle.txn)]  # the server never got the COMMIT
    assert _rows(postgres, f"SELECT count(*) FROM {name}") == [(0,)]
    # The proxy may deliver the held COMMIT PREPARED once healed (a commit whose answer was
    # lost): the next run's commit finds it committed by its progress row, or commits it.
    proxy.heal()
    driver.commit(handle)
    assert _rows(postgres, f"SELECT count(*) FROM {name}") == [(10,)]
    assert _prepared(postgres, uid) == []


def test_timeouts_reach_the_connection_and_the_transaction(
    postgres: Any, target: tuple[str, str]
) -> None:
    name, uid = target
    sink = PostgresSink(
        postgres.dsn,
        name,
        uid=uid,
        statement_timeout_ms=45_000,
        lock_timeout_ms=7_000,
        idle_in_transaction_timeout_ms=90_000,
        tcp_user_timeout_ms=12_000,
        keepalives_idle_s=9,
    )
    sink.check(SCHEMA, "app")
    open_ = sink.begin(TxnId("app", uid, 1, 0, 0, 0), SCHEMA)
    params = open_.conn.info.get_parameters()
    assert (params["tcp_user_timeout"], params["keepalives_idle"]) == ("12000", "9")
    sink.discard(open_)
    open_ = sink.begin(TxnId("app", uid, 1, 0, 0, 1), SCHEMA)
    sink.write(open_, _batch(range(3)))
    open_.end_copy()
    got = [
        open_.conn.execute(f"SHOW {setting}").fetchone()[0]  # type: ignore[index]
        for setting in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
    ]
    assert got == ["45s", "7s", "90s"]
    sink.discard(open_)
