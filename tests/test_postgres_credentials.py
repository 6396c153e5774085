"""A PostgreSQL connection refused for its credentials is not a passing failure.

libpq gives no SQLSTATE before a session exists, but says whether the server asked for a
password; :func:`~txsink.connectors.postgres.errors.connect_error` tells refused credentials
from an unreachable server by that (integration/test_secret_rotation.py meets both on a
real server).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from txsink.connectors.postgres.errors import connect_error, credentials_refused
from txsink.errors import (
    ConfigurationError,
    EpochBlockedError,
    RetryableError,
    UnreachableError,
    restart_cannot_help,
)


@dataclass
class _PGconn:
    """What psycopg's failed connection carries (``err.pgconn``)."""

    user: bytes = b"app"
    needs_password: bool = False
    used_password: bool = False


class _Failed(Exception):
    def __init__(self, pgconn: _PGconn | None) -> None:
        super().__init__("connection failed: FATAL: ...")
        self.pgconn = pgconn


SERVER = "host=db port=5432 user=app"


@pytest.mark.parametrize(
    "pgconn", [_PGconn(used_password=True), _PGconn(needs_password=True)], ids=["sent", "none"]
)
def test_refused_credentials_block_a_commit_and_stop_elsewhere(pgconn: _PGconn) -> None:
    err = _Failed(pgconn)
    assert credentials_refused(err)
    blocked = connect_error(err, SERVER, {"sink_uid": "s", "phase": "commit"})
    assert isinstance(blocked, EpochBlockedError)
    assert 'ALTER ROLE "app"' in blocked.fix and "passfile" in blocked.fix
    for phase in ("check", "recover", "begin"):
        stop = connect_error(err, SERVER, {"sink_uid": "s", "phase": phase})
        assert type(stop) is ConfigurationError, phase
        assert restart_cannot_help(stop)


def test_a_server_that_never_asked_for_a_password_may_come_back() -> None:
    for err in (_Failed(_PGconn()), _Failed(None)):
        assert not credentials_refused(err)
        check = connect_error(err, SERVER, {"sink_uid": "s", "phase": "check"})
        assert isinstance(check, UnreachableError) and not restart_cannot_help(check)
        commit = connect_error(err, SERVER, {"sink_uid": "s", "phase": "commit"})
        assert type(commit) is RetryableError
