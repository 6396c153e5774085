"""The Postgres sink's connections: a task's own, the driver's (kept between epochs), each
wait on the server bounded by :class:`~txsink.connectors.postgres.stall.Stall`, and every
failure mapped to a txsink error with the sink's context.

A base class of :class:`~txsink.connectors.postgres.sink.PostgresSink`, which sets the
attributes below in its constructor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from txsink.connectors.postgres.errors import connect_error, map_error, redact_dsn
from txsink.connectors.postgres.stall import Stall, Timeouts
from txsink.errors import TxsinkError
from txsink.rowref import RowNames
from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg

__all__ = ["Connections"]

#: The staging commit's move is one statement over the whole epoch: its stall bound grows
#: by a row count at this rate (well below what a healthy server moves, ~300k rows/s).
_MOVE_FLOOR_ROWS_PER_S = 20_000


class Connections:
    """Opens, keeps and bounds the sink's connections (see the module docstring)."""

    uid: str
    dsn: str
    timeouts: Timeouts
    connect_kwargs: dict[str, Any]
    _driver_conn: psycopg.Connection[Any] | None

    @property
    def qualified_table(self) -> str:
        """The target as the user wrote it (for messages)."""
        raise NotImplementedError

    def _connect(self, *, autocommit: bool, phase: str | None = None) -> psycopg.Connection[Any]:
        """A connection; a failure is a RetryableError (a ConfigurationError at the check)."""
        import psycopg

        try:
            options = {**self.timeouts.connect_options(), **self.connect_kwargs}
            conn = psycopg.connect(self.dsn, autocommit=autocommit, **options)
        except psycopg.OperationalError as err:
            ctx: dict[str, Any] = {"sink_uid": self.uid, "connector": "postgres"}
            if phase is not None:
                ctx["phase"] = phase
            raise connect_error(err, redact_dsn(self.dsn), ctx) from err
        return conn

    def _driver(self, phase: str | None = None) -> psycopg.Connection[Any]:
        if self._driver_conn is None or self._driver_conn.closed:
            self._driver_conn = self._connect(autocommit=True, phase=phase)
        return self._driver_conn

    def release(self) -> None:
        """Close the driver's connection (the next epoch opens it again)."""
        conn, self._driver_conn = self._driver_conn, None
        if conn is not None:
            conn.close()

    def _stall(self, conn: psycopg.Connection[Any]) -> Stall:
        return Stall(conn, self.timeouts.stall_s)

    def _map(
        self, err: BaseException, txn: TxnId | None, *, phase: str, names: RowNames | None = None
    ) -> TxsinkError:
        table = self.qualified_table
        return map_error(err, txn, sink_uid=self.uid, table=table, phase=phase, names=names)

    @contextlib.contextmanager
    def _on_driver(
        self, txn: TxnId | None, phase: str, *, rows: int = 0
    ) -> Iterator[psycopg.Connection[Any]]:
        """The driver's connection, each wait bounded (``rows``: a statement that moves that
        many rows gets longer); a failure drops the connection and raises a txsink error of
        ``phase``."""
        import psycopg

        try:
            conn = self._driver(phase)
            stall = self.timeouts.stall_s
            if stall is not None and rows:
                stall += rows / _MOVE_FLOOR_ROWS_PER_S
            with Stall(conn, stall).guard(phase):
                yield conn
        except (psycopg.errors.UndefinedObject, psycopg.errors.ObjectNotInPrerequisiteState):
            raise  # the caller's answers (no such gid, busy)
        except (psycopg.Error, TxsinkError) as err:
            self._driver_conn = None
            raise self._map(err, txn, phase=phase) from err
