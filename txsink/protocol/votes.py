"""The vote service: how single-pass tasks reach the driver while they hold transactions open.

A small TCP server in the driver process, one per epoch run, that every task of a
single-pass job connects to once: it sends its vote (its acks: handles, rows, or the
error that fails the epoch) and waits for the answer. When every task of the stage
attempt has voted, the service calls the coordinator's ``on_votes`` (which writes the
decision, :mod:`txsink.protocol.decide`) in its own thread and answers every task: ``commit``,
or ``abort`` (a failed vote, a failed or lost decision). Spark's own
``BarrierTaskContext.barrier()``/``allGather()`` would do the same exchange but cost up
to a second per call; this costs one round trip.

Why it is safe: a task that gets no answer (the driver died, the connection dropped, the
wait timed out) aborts its transaction. The decision, if it was written, stands, and the
epoch's leftovers are committed from the decided handles (the sink's
:meth:`~txsink.contract.SinkContract.commit_epoch`), never from a task's open
transaction.

Security: the service binds to the driver's address only; each epoch run has its own
random token, pickled into the job's tasks, and a connection whose first message lacks
it is dropped unanswered. Messages are JSON lines (no pickle over the network).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txsink.observe.logs import EpochLogger

__all__ = ["NO_ANSWER", "Vote", "VoteService", "cast_vote", "ping"]

#: The longest line a vote may be (its handles): 64 MiB.
_MAX_LINE = 64 << 20
COMMIT, ABORT, DECIDED, PONG = "commit", "abort", "decided", "pong"
#: What :func:`cast_vote` returns when the service gave no answer (the task aborts too).
NO_ANSWER = "no-answer"


@dataclass(frozen=True)
class Vote:
    """One task's vote: who it is (partition, task attempt id, the stage's task count) and
    what it prepared (JSON-able acks), or why it failed: ``error`` in one line, and
    ``carried``, the task's error as :func:`txsink.protocol.taskerror.document` describes it (type,
    message, context), so that the driver can raise it as it was."""

    partition: int
    attempt: int
    tasks: int
    acks: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    carried: dict[str, Any] | None = None


class VoteService:
    """Collects one vote per task of a single-pass stage attempt, then answers them all.

    ``on_votes(votes)`` runs once, in the service's thread, when every task of the
    latest stage attempt voted and none failed; returning means ``commit``, raising means
    ``abort`` (its exception is kept in :attr:`failure` for the caller to re-raise).
    A retried barrier stage restarts every task with new (larger) task attempt ids: a
    vote from a newer attempt for a partition that already voted, or after an ``abort``,
    starts the collection over (the older votes are answered ``abort``); votes of older
    attempts are answered ``abort``. Votes arriving after the decision are answered
    ``decided``: those tasks commit nothing, the driver finishes the epoch from the
    decided handles. The first failed vote's error is kept in :attr:`task_error`: the
    driver tells it when the job's own failure does not carry it.
    """

    def __init__(
        self,
        host: str,
        on_votes: Callable[[list[Vote]], None],
        *,
        log: EpochLogger,
        timeout_s: float = 600.0,
    ) -> None:
        self.token = secrets.token_hex(16)
        self.failure: BaseException | None = None
        #: The error the first failed vote carried (:attr:`Vote.carried`), if any.
        self.task_error: dict[str, Any] | None = None
        self.answered: str | None = None
        self._on_votes = on_votes
        self._log = log
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._newest = -1  # the newest task attempt id that voted
        self._waiting: dict[int, tuple[socket.socket, Vote]] = {}
        self._closed = False
        self._server = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._server.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="txsink-votes", daemon=True)
        self._thread.start()

    # -- the server ----------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self._timeout_s)
        try:
            message = json.loads(_read_line(conn))
            if not hmac.compare_digest(str(message.get("token", "")), self.token):
                conn.close()  # not one of this epoch's tasks: no answer
                return
            if message.get("ping"):  # the start-up check: an executor reaches the driver
                _answer(conn, PONG, "")
                return
            vote = Vote(**message["vote"])
        except (OSError, ValueError, TypeError, KeyError):
            conn.close()
            return
        self._receive(conn, vote)

    def _receive(self, conn: socket.socket, vote: Vote) -> None:
        with self._lock:
            if self._closed:
                _answer(conn, ABORT, "the job ended")
                return
            if self.answered == COMMIT:
                _answer(conn, DECIDED, "the epoch was decided by an earlier attempt")
                return
            retried = vote.partition in self._waiting or self.answered == ABORT
            if retried and vote.attempt > self._newest:  # a retried stage: start over
                self._answer_all(ABORT, "the stage was retried")
                self.answered = None
            elif retried:
                _answer(conn, ABORT, "an older attempt, or another task of it failed")
                return
            self._newest = max(self._newest, vote.attempt)
            self._waiting[vote.partition] = (conn, vote)
            if vote.error is not None:
                if self.task_error is None and isinstance(vote.carried, dict):
                    self.task_error = vote.carried  # the first task that failed
                self._answer_all(ABORT, f"partition {vote.partition} failed: {vote.error}")
                self.answered = ABORT
                return
            if len(self._waiting) < vote.tasks:
                return
            votes = [v for _, v in sorted(self._waiting.values(), key=lambda cv: cv[1].partition)]
            try:
                self._on_votes(votes)
            except BaseException as err:
                self.failure = err
                self._answer_all(ABORT, "the driver could not decide")
                self.answered = ABORT
                return
            self._answer_all(COMMIT, "decided")
            self.answered = COMMIT

    def _answer_all(self, answer: str, why: str) -> None:
        for conn, _ in self._waiting.values():
            _answer(conn, answer, why)
        self._waiting.clear()

    def close(self) -> None:
        """Stop: answer ``abort`` to any task still waiting (the job failed), free the port."""
        with self._lock:
            self._closed = True
            self._answer_all(ABORT, "the job ended before every task voted")
        # close() alone does not wake a thread blocked in accept() on Linux: the thread
        # (and the listening socket it holds) would outlive the service, one per epoch.
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._server.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def __enter__(self) -> VoteService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _answer(conn: socket.socket, answer: str, why: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps({"answer": answer, "why": why}).encode() + b"\n")
    with contextlib.suppress(OSError):
        conn.close()


def _read_line(conn: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the connection closed before a full line")
        newline = chunk.find(b"\n")
        if newline >= 0:
            chunks.append(chunk[:newline])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > _MAX_LINE:
            raise ValueError("vote line too long")


# -- the task's side -------------------------------------------------------------------


def cast_vote(
    address: tuple[str, int], token: str, vote: Vote, *, timeout_s: float
) -> tuple[str, str]:
    """Send ``vote`` and wait for the answer: ``(answer, why)``. No answer (the driver is
    gone, unreachable, the connection dropped, ``timeout_s`` passed) is :data:`NO_ANSWER`:
    the task must not commit what it cannot know was decided."""
    message = {"token": token, "vote": vote.__dict__}
    try:
        with socket.create_connection(address, timeout=min(timeout_s, 30.0)) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(_read_line(conn))
        return str(reply["answer"]), str(reply.get("why", ""))
    except (OSError, ValueError, KeyError) as err:
        host, port = address
        return NO_ANSWER, f"no answer from the driver's vote service at {host}:{port}: {err}"


def ping(address: tuple[str, int], token: str, *, timeout_s: float) -> str | None:
    """Whether this process reaches the vote service at ``address``: ``None``, or why not
    (the start-up check, from each executor, before any row is read)."""
    try:
        with socket.create_connection(address, timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            conn.sendall(json.dumps({"token": token, "ping": True}).encode() + b"\n")
            reply = json.loads(_read_line(conn))
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return None if reply.get("answer") == PONG else f"unexpected answer {reply!r}"
