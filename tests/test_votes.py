"""The vote service of single-pass epochs: who gets which answer, and strangers get none."""

from __future__ import annotations

import functools
import json
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest

from txsink.errors import ConfigurationError
from txsink.observe.logs import get_logger
from txsink.protocol.singlepass import probe_vote_service
from txsink.protocol.votes import (
    ABORT,
    COMMIT,
    DECIDED,
    NO_ANSWER,
    Vote,
    VoteService,
    cast_vote,
    ping,
)

LOG = get_logger(__name__, uid="votes")
T = TypeVar("T")
R = TypeVar("R")


def _vote_async(service: VoteService, vote: Vote, out: dict[int, Any]) -> threading.Thread:
    def run() -> None:
        out[vote.partition] = cast_vote(service.address, service.token, vote, timeout_s=10)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _votes(service: VoteService, votes: list[Vote]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for thread in [_vote_async(service, v, out) for v in votes]:
        thread.join(15)
    return out


def test_every_task_gets_commit_once_all_voted_and_the_decision_is_made() -> None:
    seen: list[list[Vote]] = []
    with VoteService("127.0.0.1", seen.append, log=LOG) as service:
        out = _votes(service, [Vote(p, 10 + p, 3, acks=[{"p": p}]) for p in range(3)])
    assert {p: a for p, (a, _) in out.items()} == {0: COMMIT, 1: COMMIT, 2: COMMIT}
    assert [v.partition for v in seen[0]] == [0, 1, 2]  # decided once, with every vote


def test_a_failed_vote_aborts_everyone_and_nothing_is_decided() -> None:
    seen: list[list[Vote]] = []
    with VoteService("127.0.0.1", seen.append, log=LOG) as service:
        out = _votes(service, [Vote(0, 10, 2), Vote(1, 11, 2, error="WriteError: bad row")])
    assert {a for a, _ in out.values()} == {ABORT}
    assert seen == []


def test_a_failed_decision_aborts_everyone_and_is_kept_for_the_driver() -> None:
    def refuse(_votes: list[Vote]) -> None:
        raise RuntimeError("the log is gone")

    with VoteService("127.0.0.1", refuse, log=LOG) as service:
        out = _votes(service, [Vote(0, 10, 2), Vote(1, 11, 2)])
    assert {a for a, _ in out.values()} == {ABORT}
    assert isinstance(service.failure, RuntimeError)


def test_a_retried_stage_starts_over_and_votes_after_the_decision_are_told_decided() -> None:
    seen: list[list[Vote]] = []
    with VoteService("127.0.0.1", seen.append, log=LOG) as service:
        first = _votes(service, [Vote(0, 10, 2, error="InjectedFault")])
        assert first[0][0] == ABORT
        retried = _votes(service, [Vote(0, 20, 2), Vote(1, 21, 2)])  # newer attempts
        late = _votes(service, [Vote(1, 30, 2)])
    assert {a for a, _ in retried.values()} == {COMMIT}
    assert late[1][0] == DECIDED
    assert len(seen) == 1


def test_a_connection_without_the_token_is_dropped_unanswered() -> None:
    with VoteService("127.0.0.1", lambda _v: None, log=LOG) as service:
        with socket.create_connection(service.address, timeout=5) as conn:
            message = {"token": "0" * 32, "vote": Vote(0, 1, 1).__dict__}
            conn.sendall(json.dumps(message).encode() + b"\n")
            assert conn.recv(100) == b""  # closed, no answer
        answer, why = cast_vote(service.address, "wrong", Vote(0, 1, 1), timeout_s=5)
    assert answer == NO_ANSWER and "no answer" in why


def test_no_answer_is_told_apart() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()
    answer, why = cast_vote(address, "t", Vote(0, 1, 1), timeout_s=2)
    assert answer == NO_ANSWER
    assert f"no answer from the driver's vote service at {address[0]}:{address[1]}" in why


def test_closing_answers_tasks_still_waiting() -> None:
    out: dict[int, Any] = {}
    service = VoteService("127.0.0.1", lambda _v: None, log=LOG)
    thread = _vote_async(service, Vote(0, 1, 2), out)
    for _ in range(100):
        if service._waiting:
            break
        threading.Event().wait(0.02)
    service.close()
    thread.join(10)
    assert out[0][0] == ABORT


@pytest.mark.parametrize("size", [1, 200_000])
def test_votes_of_any_size_arrive_whole(size: int) -> None:
    seen: list[list[Vote]] = []
    with VoteService("127.0.0.1", seen.append, log=LOG) as service:
        _votes(service, [Vote(0, 1, 1, acks=[{"blob": "x" * size}])])
    assert len(seen[0][0].acks[0]["blob"]) == size


# -- the start-up check: do the executors reach the driver? ------------------------------


class _Runner:
    """A TaskRunner in this process; ``unreachable``: its tasks are pointed at a closed
    port instead of the service (an executor that cannot reach the driver)."""

    def __init__(self, *, unreachable: bool) -> None:
        self.unreachable = unreachable
        self.items: list[int] = []

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        self.items = [int(i) for i in items]  # type: ignore[call-overload]
        if self.unreachable:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                closed = ("127.0.0.1", s.getsockname()[1])
            fn = functools.partial(fn.func, closed, *fn.args[1:])  # type: ignore[attr-defined]
        return [fn(item) for item in items]


def test_the_probe_passes_when_every_task_reaches_the_service() -> None:
    runner = _Runner(unreachable=False)
    probe_vote_service(runner, "127.0.0.1", 3, sink_uid="k")
    assert runner.items == [0, 1, 2]


def test_the_probe_refuses_executors_that_cannot_reach_the_driver() -> None:
    with pytest.raises(ConfigurationError, match="could not reach the driver's vote service") as e:
        probe_vote_service(_Runner(unreachable=True), "127.0.0.1", 2, sink_uid="k")
    assert "2 of 2 tasks" in str(e.value) and "spark.driver.host" in str(e.value)
    assert (e.value.sink_uid, e.value.phase) == ("k", "check")


def test_a_ping_without_the_token_gets_no_answer() -> None:
    with VoteService("127.0.0.1", lambda votes: None, log=LOG) as service:
        assert ping(service.address, service.token, timeout_s=5) is None
        assert ping(service.address, "not-the-token", timeout_s=5) is not None
