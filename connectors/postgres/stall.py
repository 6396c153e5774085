"""Bounds on every wait for the server, so that a stalled server or network ends a task
(or a commit) instead of hanging it.

Each stall has its own bound (:class:`Timeouts`, from the sink's options)::

    connecting            libpq connect_timeout
    a dead network path   TCP keepalives (an idle connection) and tcp_user_timeout (data
                          the peer never acknowledges): the kernel drops the connection
    a peer that takes     Stall.guard: when one wait for the server (a statement, a COPY
    bytes, never answers  write, COMMIT PREPARED) outlasts stall_timeout_s, the watchdog
    (a frozen server,     thread shuts the socket down, and the blocked call fails at once.
    a hung proxy)         It writes nothing: it only ends the connection
    the server's side     statement_timeout, lock_timeout, idle_in_transaction_session_timeout
                          (SET LOCAL in each task's transaction)

A stall in a task (before PREPARE TRANSACTION returned) fails the task: its transaction
rolls back when the server sees the connection go, or stays prepared for recovery to
roll back; nothing of the epoch is visible. A stall in the driver's commit fails the
commit: the decision stands, and the next run (or ``txsink recover``) finishes it.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.errors import RetryableError

if TYPE_CHECKING:
    import psycopg

__all__ = ["Stall", "Timeouts"]


@dataclass(frozen=True)
class Timeouts:
    """The sink's timeout options (see docs/connectors/postgres.md, "Timeouts")."""

    connect_s: float = 10.0
    stall_s: float | None = 60.0
    tcp_user_timeout_ms: int | None = 30_000
    keepalives_idle_s: int | None = 30
    statement_ms: int | None = None
    lock_ms: int | None = 30_000
    idle_in_transaction_ms: int | None = 300_000

    def connect_options(self) -> dict[str, Any]:
        """libpq connection parameters (the sink's ``connect_kwargs`` override them)."""
        options: dict[str, Any] = {"connect_timeout": max(2, math.ceil(self.connect_s))}
        if self.keepalives_idle_s is not None:
            idle = max(1, int(self.keepalives_idle_s))
            options.update(
                keepalives=1,
                keepalives_idle=idle,
                keepalives_interval=max(1, idle // 3),
                keepalives_count=3,
            )
        if self.tcp_user_timeout_ms is not None:
            options["tcp_user_timeout"] = int(self.tcp_user_timeout_ms)
        return options

    def set_local(self, conn: psycopg.Connection[Any]) -> None:
        """The server-side timeouts for the open transaction on ``conn``."""
        settings = [
            (name, f"{int(value)}ms")
            for name, value in (
                ("statement_timeout", self.statement_ms),
                ("lock_timeout", self.lock_ms),
                ("idle_in_transaction_session_timeout", self.idle_in_transaction_ms),
            )
            if value is not None
        ]
        if settings:  # one round trip: set_config(..., true) is SET LOCAL
            from psycopg import sql

            call = sql.SQL("set_config(%s, %s, true)")
            query = sql.SQL("SELECT {}").format(sql.SQL(", ").join([call] * len(settings)))
            conn.execute(query, [v for pair in settings for v in pair])


class Stall:
    """The client-side bound on each wait for the server on one connection."""

    def __init__(self, conn: psycopg.Connection[Any], seconds: float | None) -> None:
        self.conn = conn
        self.seconds = seconds

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run the block; if it waits on the server longer than the bound, the connection
        is shut down and the block raises :class:`~txsink.errors.RetryableError`."""
        if not self.seconds or self.conn.closed:
            yield
            return
        watch = _Watch(self.conn.fileno(), time.monotonic() + self.seconds)
        _WATCHDOG.add(watch)
        try:
            yield
        except Exception as err:
            if watch.done():
                raise self._stalled(what) from err
            raise
        finally:
            _WATCHDOG.remove(watch)
        if watch.done():  # it returned as the timer fired: the connection is gone anyway
            raise self._stalled(what)

    def _stalled(self, what: str) -> RetryableError:
        with contextlib.suppress(Exception):
            self.conn.close()
        return RetryableError(
            f"PostgreSQL did not answer for {self.seconds:g} s during {what}: the server or "
            "the network to it stalled, and txsink dropped the connection "
            "(stall_timeout_s). If the server is only slow (a long upsert merge, a busy "
            "disk), raise stall_timeout_s"
        )


class _Watch:
    """One guarded wait: :meth:`fire` (the watchdog) and :meth:`done` (the waiter) are
    exclusive, so the socket is never shut down after the wait was seen to end in time."""

    def __init__(self, fd: int, deadline: float) -> None:
        self.fd = fd
        self.deadline = deadline
        self.fired = False
        self.ended = False
        self.lock = threading.Lock()

    def fire(self) -> None:
        with self.lock:
            if self.ended:
                return
            self.fired = True
            # On a duplicate of the descriptor, so the connection still owns and closes
            # its own; shutdown() acts on the socket, so the blocked call fails at once.
            with contextlib.suppress(OSError):
                dup = socket.socket(fileno=os.dup(self.fd))
                with contextlib.suppress(OSError):
                    dup.shutdown(socket.SHUT_RDWR)
                dup.close()

    def done(self) -> bool:
        """End the watch; whether the watchdog had fired it."""
        with self.lock:
            self.ended = True
            return self.fired


class _Watchdog:
    """One daemon thread per process fires the watches past their deadline, every
    :data:`TICK_S`. A guard only adds and removes its watch: a COPY writes a guarded
    batch every ~10,000 rows, and a timer thread per wait cost ~0.1 ms each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: set[_Watch] = set()
        self._pid = 0  # the process whose thread runs (a forked child starts its own)

    def add(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.add(watch)
            if self._pid != os.getpid():
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="txsink-pg-stall", daemon=True).start()

    def remove(self, watch: _Watch) -> None:
        with self._lock:
            self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            time.sleep(TICK_S)
            now = time.monotonic()
            with self._lock:
                due = [w for w in self._watches if w.deadline <= now]
            for watch in due:
                watch.fire()


#: How often the watchdog looks: a stall ends within this much after its bound.
TICK_S = 0.25
_WATCHDOG = _Watchdog()
