"""PostgreSQL errors as txsink errors, and DSNs fit to show.

psycopg errors are mapped by SQLSTATE class, never by message text::

    22, 23                    data exception, integrity violation -> WriteError (fatal: bad rows),
                              with the row and column COPY reports
    08P01, 42804 in a COPY    a value in another binary form than its column's (the table
                              changed after the check) -> WriteError naming row and column
    08, 53, 57, 40001, 40P01,
    55P03, none (connection   connection, resources, operator (57P: shutdown), serialization,
    lost: no session)         deadlock, lock timeout -> RetryableError (Spark retries the
                              task; recovery the driver's steps)
    42501, 28000, 28P01       at commit (a decided epoch): a privilege or login revoked
                              after the decision -> EpochBlockedError (grant it back, then
                              ``txsink recover``)
    28, 42501                 elsewhere: authorization, insufficient privilege ->
                              ConfigurationError (an operator's grant fixes it; nothing
                              retries it)
    anything else             TxsinkError

At the start-up check (:func:`check_error`) every failure is a ConfigurationError with
its fix: nothing retries a check, and nothing was written. A failed connection
(:func:`connect_error`) carries no SQLSTATE (libpq reports none before a session
exists), but libpq does say whether the server asked for a password
(``PQconnectionNeedsPassword``, ``PQconnectionUsedPassword``)::

    the server asked for a password,   credentials refused: a password changed, expired
    then refused the connection        (VALID UNTIL), not in the passfile, LOGIN or CONNECT
                                       revoked -> EpochBlockedError at commit (the decision
                                       stands: give the credential back, then ``txsink
                                       recover``), ConfigurationError elsewhere (a restart
                                       meets it again: the query stops, no restart loop)
    anything else                      at the check an UnreachableError (a ConfigurationError
                                       a restart may pass: the server may be down for a
                                       moment) naming the server and what to verify,
                                       elsewhere a RetryableError

A server refusing a role for its per-role connection limit (``ALTER ROLE ... CONNECTION
LIMIT``) also answers after the password: it is told as refused credentials too, with
that cause named in the fix.

A DSN may carry a password: it is shown only through :func:`redact_dsn`.
"""

from __future__ import annotations

import re
from typing import Any

from txsink.errors import (
    ConfigurationError,
    EpochBlockedError,
    RetryableError,
    TxsinkError,
    UnreachableError,
    WriteError,
)
from txsink.rowref import RowNames
from txsink.txid import TxnId

__all__ = [
    "check_error",
    "connect_error",
    "copy_position",
    "credentials_refused",
    "map_error",
    "redact_dsn",
]

# In a binary COPY: protocol violation (a value of the wrong length), datatype mismatch
# (an array's element type): the data, not the connection.
_WIRE_MISMATCH = ("08P01", "42804")
# Refused for good at commit until an operator grants it back: insufficient privilege,
# invalid authorization, invalid password.
_REVOKED = ("42501", "28000", "28P01")
# COPY's context line (the last one: a value's own parser may add lines before it, e.g.
# "JSON data, line 1: ..."): "COPY t, line 3, column key: "value"" or, binary, no value.
_COPY_AT = re.compile(r"^COPY .*, line (\d+)(?:, column ([^:\n]+?))?(?::.*)?$", re.MULTILINE)


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for logs, errors and reprs)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return "<unparseable dsn>"
    if "password" in params:
        params["password"] = "***"  # noqa: S105 - a redaction marker, not a password
    return make_conninfo("", **params)


def copy_position(context: str) -> tuple[int | None, str | None]:
    """The 0-based row and the column a COPY error's context names (``COPY t, line 3,
    column key: "..."``), each None when it names none."""
    found = _COPY_AT.findall(context)
    if not found:
        return None, None
    line, column = found[-1]
    return int(line) - 1, column or None  # COPY counts from 1


def _sqlstate(state: str) -> str:
    """`` (SQLSTATE 23502)``, or nothing when the server gave none (a lost connection)."""
    return f" (SQLSTATE {state})" if state else ""


def map_error(
    err: BaseException,
    txn: TxnId | None,
    *,
    sink_uid: str,
    table: str,
    phase: str,
    names: RowNames | None = None,
) -> TxsinkError:
    """``err``, raised in ``phase`` of transaction ``txn`` (None: of no one transaction)
    writing ``table``, as a txsink error naming the sink, epoch, partition and phase (a
    txsink error gets what it lacks). ``names``: what the transaction sent, to name a
    rejected row by its key rather than its offset."""
    import psycopg

    ctx: dict[str, Any] = {"sink_uid": sink_uid, "phase": phase, "connector": "postgres"}
    if txn is not None:
        ctx.update(epoch=txn.epoch, partition=txn.partition)
    if isinstance(err, TxsinkError):
        if isinstance(err.row, int) and names is not None:
            err.row = names.at(err.row)
        return err.with_context(**ctx)
    if not isinstance(err, psycopg.Error):
        return WriteError(f"{type(err).__name__}: {err}", **ctx)
    state = err.sqlstate or ""
    diag = err.diag
    summary = (diag.message_primary or str(err)).strip()
    if state[:2] in ("22", "23"):  # data exception, integrity constraint violation
        row, copy_column = copy_position(diag.context or "")
        return WriteError(
            f"{table} rejected a row{_sqlstate(state)}: {summary}. "
            "Fix or filter the offending rows (or the table's constraint) and restart "
            "the query; nothing of this epoch was committed",
            row=names.at(row) if names is not None else row,
            column=diag.column_name or copy_column,
            **ctx,
        )
    if state in _WIRE_MISMATCH and (diag.context or "").startswith("COPY "):
        # A value in another binary form than the column's: its type changed after the check.
        row, copy_column = copy_position(diag.context or "")
        return WriteError(
            f"{table} could not read a value of column {copy_column}{_sqlstate(state)}: "
            f"{summary}. The column's type changed after the sink's check at start: restart "
            "the query, so that the check reads the table again; nothing of this epoch was "
            "committed",
            row=names.at(row) if names is not None else row,
            column=copy_column,
            **ctx,
        )
    if phase in ("commit", "recover") and state in _REVOKED:
        fix = (
            f"grant the sink's PostgreSQL role back what it had at the start (LOGIN, and "
            f"the privileges on {table} and its progress table; COMMIT PREPARED needs the "
            "role that prepared the transaction, or a superuser)"
        )
        return EpochBlockedError(
            f"PostgreSQL refuses to commit the decided transaction {txn} (SQLSTATE {state}): "
            f"{summary}; a retry fails the same way until an operator acts. Fix: {fix}",
            fix=fix,
            **ctx,
        )
    if state[:2] == "28" or state == "42501":  # authorization, insufficient privilege
        return ConfigurationError(
            f"PostgreSQL refused the sink's role{_sqlstate(state)}: {summary}. Grant it what "
            f"the sink needs on {table}, its progress table and pg_prepared_xacts "
            "(docs/security.md lists them by mode), then restart: nothing retries this by itself",
            **ctx,
        )
    lost = isinstance(err, psycopg.OperationalError) and not state  # no session: no SQLSTATE
    if lost or state[:2] in ("08", "53", "57") or state in ("40001", "40P01", "55P03"):
        return RetryableError(
            f"transient PostgreSQL error{_sqlstate(state)}: {summary}. {_retried(phase)}; "
            "if it keeps failing, check that the server runs and is reachable",
            **ctx,
        )
    return TxsinkError(
        f"PostgreSQL error{_sqlstate(state)}: {type(err).__name__}: {summary}", **ctx
    )


#: The phases that run in a Spark task (the rest run on the driver).
_TASK_PHASES = ("begin", "write", "prepare")


def _retried(phase: str) -> str:
    """Who retries a transient failure of ``phase``."""
    if phase in _TASK_PHASES:
        return "Spark retries the task"
    if phase == "commit":
        return "The decision stands: the commit is retried, by the next run's recovery at last"
    return "The next run's recovery does it again"


def _first_line(err: BaseException) -> str:
    """The first line of a psycopg error (libpq's own text: host and port, never the
    password; the later lines are hints like "Is the server running...")."""
    diag = getattr(err, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    text = (primary or str(err)).strip().splitlines()
    return text[0] if text else type(err).__name__


def credentials_refused(err: BaseException) -> bool:
    """Whether the failed connection ``err`` reached the server's authentication: the server
    asked for a password (libpq's ``PQconnectionNeedsPassword``: none was found, e.g. no
    passfile line; ``PQconnectionUsedPassword``: one was sent) and then refused the
    connection. The server is up; it refuses this role's credentials or its login."""
    pgconn = getattr(err, "pgconn", None)
    if pgconn is None:
        return False
    return bool(getattr(pgconn, "needs_password", False)) or bool(
        getattr(pgconn, "used_password", False)
    )


def _refused_fix(user: str) -> str:
    return (
        f"give the sink the role {user}'s current password (the passfile= or PGPASSFILE "
        "file its dsn reads, on the driver and every executor), or renew it on the server: "
        f"ALTER ROLE \"{user}\" PASSWORD '...' (and VALID UNTIL a later date if it "
        f'expired); if the role\'s login was revoked: ALTER ROLE "{user}" LOGIN and '
        f'GRANT CONNECT ON DATABASE ... TO "{user}" (or raise its CONNECTION LIMIT)'
    )


def connect_error(err: BaseException, server: str, ctx: dict[str, Any]) -> TxsinkError:
    """A failed ``psycopg.connect`` to ``server`` (a redacted DSN).

    Refused credentials (:func:`credentials_refused`): at commit an EpochBlockedError (the
    decided epoch waits, prepared, until the credential is given back), elsewhere a
    ConfigurationError (a restart meets it again). Otherwise: at the check (``ctx``'s
    phase) an UnreachableError with the fix (a ConfigurationError that a restart may pass:
    the server may be down for a moment), elsewhere a RetryableError."""
    what = f"cannot connect to PostgreSQL at {server}: {_first_line(err)}"
    if credentials_refused(err):
        user = getattr(getattr(err, "pgconn", None), "user", b"") or b""
        role = user.decode(errors="replace") if isinstance(user, bytes) else str(user)
        fix = _refused_fix(role or "<the dsn's user>")
        if ctx.get("phase") == "commit":
            return EpochBlockedError(
                f"{what}. The server refuses the role {role}'s credentials after the "
                "decision: the decided transactions stay prepared, nothing of the epoch is "
                f"visible, and a retry fails the same way until an operator acts. Fix: {fix}; "
                "then run `txsink recover` (or restart the query): it commits the epoch",
                fix=fix,
                **ctx,
            )
        return ConfigurationError(
            f"{what}. The server refuses the role {role}'s credentials (a password changed "
            "or expired, or the login revoked): a restart meets the same refusal. Fix: "
            f"{fix}; then start again (a decided epoch waits, prepared, and the next run "
            "or `txsink recover` commits it)",
            **ctx,
        )
    if ctx.get("phase") == "check":
        return UnreachableError(
            f"{what}. Check that the server is running and reachable at that host and port "
            "(firewall, network), and that the dsn's user, password and dbname are right",
            **ctx,
        )
    return RetryableError(what, **ctx)


def check_error(err: BaseException, *, server: str, table: str, ctx: dict[str, Any]) -> TxsinkError:
    """A psycopg error of the start-up check as a ConfigurationError, by SQLSTATE."""
    if isinstance(err, TxsinkError):
        return err.with_context(**ctx)
    state = getattr(err, "sqlstate", None) or ""
    summary = _first_line(err)
    if state == "3F000":  # invalid_schema_name
        fix = "create the schema (CREATE SCHEMA ...), or name an existing one in table="
    elif state == "42501":  # insufficient_privilege
        fix = (
            f"grant the connecting role INSERT (and UPDATE for upsert) on {table}, and CREATE "
            "on its schema for the progress table (or create that table beforehand); "
            "docs/security.md lists every mode's rights"
        )
    elif state[:2] in ("08", "57") or not state:  # connection lost, server shutting down
        return connect_error(err, server, ctx)
    elif state[:2] == "53":  # insufficient resources: too many connections, disk full
        fix = "the server is out of a resource (connections, disk, memory): free it, then start"
    else:
        fix = "fix what the server says, then start again"
    return ConfigurationError(
        f"PostgreSQL at {server} refused the start-up check of {table}{_sqlstate(state)}: "
        f"{summary}. {fix[0].upper()}{fix[1:]}",
        **ctx,
    )
