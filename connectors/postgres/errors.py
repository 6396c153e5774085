"""PostgreSQL errors as txsink errors, and DSNs fit to show.

psycopg errors are mapped by SQLSTATE class, never by message text::

    22, 23                    data exception, integrity violation -> WriteError (fatal: bad rows),
                              with the row and column COPY reports
    08, 53, 57, 40001, 40P01,
    55P03                     connection, resources, operator, serialization, deadlock,
                              lock timeout -> RetryableError (Spark may retry the task)
    anything else             TxsinkError

A DSN may carry a password: it is shown only through :func:`redact_dsn`.
"""

from __future__ import annotations

import re
from typing import Any

from txsink.errors import RetryableError, TxsinkError, WriteError
from txsink.txid import TxnId

__all__ = ["copy_position", "map_error", "redact_dsn"]

_COPY_LINE = re.compile(r"\bline (\d+)")
_COPY_COLUMN = re.compile(r"column (\S+?):")


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
    line = _COPY_LINE.search(context)
    if line is None:
        return None, None
    column = _COPY_COLUMN.search(context)
    return int(line.group(1)) - 1, column.group(1) if column else None  # COPY counts from 1


def map_error(
    err: BaseException, txn: TxnId, *, sink_uid: str, table: str, phase: str
) -> TxsinkError:
    """``err``, raised in ``phase`` of transaction ``txn`` writing ``table``, as a txsink
    error naming the sink, epoch, partition and phase (a txsink error gets what it lacks)."""
    import psycopg

    if isinstance(err, TxsinkError):
        return err.with_context(
            sink_uid=sink_uid,
            partition=txn.partition,
            epoch=txn.epoch,
            phase=phase,
            connector="postgres",
        )
    ctx: dict[str, Any] = {
        "sink_uid": sink_uid,
        "epoch": txn.epoch,
        "partition": txn.partition,
        "phase": phase,
        "connector": "postgres",
    }
    if not isinstance(err, psycopg.Error):
        return WriteError(f"{type(err).__name__}: {err}", **ctx)
    state = err.sqlstate or ""
    diag = err.diag
    summary = (diag.message_primary or str(err)).strip()
    if state[:2] in ("22", "23"):  # data exception, integrity constraint violation
        row, copy_column = copy_position(diag.context or "")
        return WriteError(
            f"{table} rejected a row (SQLSTATE {state}): {summary}. "
            "Fix or filter the offending rows (or the table's constraint) and restart "
            "the query; nothing of this epoch was committed",
            row=row,
            column=diag.column_name or copy_column,
            **ctx,
        )
    if state[:2] in ("08", "53", "57") or state in ("40001", "40P01", "55P03"):
        return RetryableError(f"transient PostgreSQL error (SQLSTATE {state}): {summary}", **ctx)
    return TxsinkError(f"PostgreSQL error (SQLSTATE {state}): {summary}", **ctx)
