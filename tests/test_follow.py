"""The log follower (:mod:`txsink.ops.follow`) on a real txsink log, without Spark.

The records are written through :class:`~txsink.protocol.log.TxLog` as a coordinator writes them;
the lines are read as txsink's console prints them. The whole path (a Connect client
printing the server's epochs) runs in integration/test_connect.py.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from txsink.observe.logs import _ConsoleFormatter
from txsink.ops.follow import LogFollower, follow
from txsink.protocol.log import TxLog, open_log


def _decide_and_commit(log: TxLog, epoch: int, rows: int, *, commit: bool = True) -> None:
    round_ = log.claim_round(epoch)
    handles = {"events": [{"data": {"txn": f"t{epoch}"}}]}
    log.decide(epoch, round_, handles, {"rows": {"events": rows}, "seconds": {"precommit": 1.5}})
    if commit:
        log.mark_committed(epoch, round_)


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    formatter = _ConsoleFormatter()
    return [formatter.format(r) for r in caplog.records if r.name == "txsink.ops.follow"]


@pytest.fixture
def log(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> TxLog:
    caplog.set_level(logging.INFO, logger="txsink")
    found = open_log(tmp_path / "txlog")
    found.bind_app("app")
    return found


def test_new_epochs_are_printed_once_as_the_server_prints_them(
    log: TxLog, caplog: pytest.LogCaptureFixture
) -> None:
    _decide_and_commit(log, 0, 5)  # history: committed before the follower started
    _decide_and_commit(log, 1, 7, commit=False)  # decided: printed once committed
    follower = LogFollower(log)
    assert follower.poll(history=True) is True
    assert follower.poll() is False  # nothing new: the caller backs off
    log.mark_committed(1, 0)
    _decide_and_commit(log, 2, 1_200)
    assert follower.poll() is True
    assert follower.poll() is False
    lines = _lines(caplog)
    assert [line.split(" (")[0] for line in lines] == [
        "txsink: [events epoch 1] committed: events 7 rows",
        "txsink: [events epoch 2] committed: events 1,200 rows",
    ], lines
    assert "(precommit 1.5 s, commit " in lines[0], lines
    log.record_block(3, 0, sink_uid="events", shard=2, reason="a column is gone", fix="add it")
    assert follower.poll() is True
    assert _lines(caplog)[-1].startswith(
        "txsink: WARNING [events epoch 3] BLOCKED (refused attempt 1): a column is gone. "
        "Fix: add it."
    )
    assert follower.printed == [(1, "committed"), (2, "committed"), (3, "blocked")]


class _Query:
    """What the follower asks of a streaming query: whether it is still active."""

    __module__ = "pyspark.sql.connect.streaming.query"  # as a Connect client's query

    def __init__(self) -> None:
        self.isActive = True


def test_it_stops_with_the_query_after_a_last_look(
    log: TxLog, caplog: pytest.LogCaptureFixture
) -> None:
    query = _Query()
    with follow(log, query, label="events") as follower:
        assert isinstance(follower, LogFollower)
        _decide_and_commit(log, 0, 3)
        query.isActive = False
        follower._thread.join(60)  # ends by itself: the query is over
        assert not follower._thread.is_alive()
    assert follower.printed == [(0, "committed")]
    assert _lines(caplog)[0].startswith("txsink: [events epoch 0] committed: events 3 rows")


def test_a_failing_log_is_one_warning_and_never_raised(
    log: TxLog, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def unreachable(prefix: str) -> list[str]:
        calls.append(prefix)
        raise OSError("connection refused")

    monkeypatch.setattr(log.store, "list", unreachable)
    follower = LogFollower(log)
    follower.start()
    for _ in range(2):
        follower._guarded(follower.poll)
    follower.stop()
    warnings = [line for line in _lines(caplog) if "WARNING" in line]
    assert len(calls) >= 3 and len(warnings) == 1, (calls, warnings)
    assert "cannot follow the txsink log" in warnings[0] and "connection refused" in warnings[0]


class _Progress:
    numInputRows = 20


def test_a_log_never_found_is_told_once_the_query_wrote_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="txsink")
    query = _Query()
    query.recentProgress = [_Progress()]  # type: ignore[attr-defined]
    query.isActive = False
    with follow(tmp_path / "only-on-the-server", query):
        pass
    (line,) = _lines(caplog)
    assert line.startswith("txsink: WARNING the query wrote rows, but the txsink log at "), line
    assert "only-on-the-server was never found from this process" in line, line


def test_a_classic_query_needs_no_follower(log: TxLog) -> None:
    classic: Any = object()  # not a Connect client's query: its lines print here already
    with follow(log, classic) as follower:
        assert follower is None
