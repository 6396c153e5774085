"""Data file names: deterministic, from the transaction's id, and parsed back by recovery.

A transaction's files are ``[<col>=<value>/...]<txn>-<seq:04d>.parquet`` in the table's
folder, ``<txn>`` being ``str(TxnId)``
(``txsink.<app>.<uid>.e<epoch>.r<round>.p<part>.a<attempt>``): two attempts never share a
name, and :func:`parse` finds whose a file is from its name alone. Partition values are
escaped as delta-rs does (every byte outside ``[A-Za-z0-9._-]`` as ``%XX``), null and ``''``
as ``__HIVE_DEFAULT_PARTITION__``. The log holds that path URI-encoded once more, as the
Delta protocol says (delta-rs encodes an ``AddAction``'s path itself).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from txsink.txid import TxnId

__all__ = ["HIVE_NULL", "file_path", "folders", "parse", "partition_value"]

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_FILE = re.compile(r"^(?P<txn>txsink\.[^/]+)-(?P<seq>\d{4,})\.parquet$")
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def partition_value(value: Any) -> str | None:
    """A partition value as Delta's ``partitionValues`` holds it; None for null and ''."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.date):
        return value.isoformat()
    text = str(value)
    return text or None


def _escape(text: str) -> str:
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def folders(columns: Sequence[str], values: Sequence[str | None]) -> str:
    """``<col>=<value>/...`` of one partition (empty for an unpartitioned table)."""
    return "".join(
        f"{_escape(col)}={HIVE_NULL if value is None else _escape(value)}/"
        for col, value in zip(columns, values, strict=True)
    )


def file_path(txn: TxnId, seq: int, columns: Sequence[str], values: Sequence[str | None]) -> str:
    """The path of a transaction's ``seq``-th file, relative to the table's root."""
    return f"{folders(columns, values)}{txn}-{seq:04d}.parquet"


def parse(path: str) -> TxnId | None:
    """The transaction a stored path belongs to; None for a file txsink did not name."""
    match = _FILE.match(path.rsplit("/", 1)[-1])
    if match is None:
        return None
    try:
        return TxnId.parse(match["txn"])
    except ValueError:
        return None
