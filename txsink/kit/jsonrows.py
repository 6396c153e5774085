"""Rows of an Arrow batch as JSON, the same way for every connector.

Timestamps, dates and times become ISO strings, decimals strings, binary
base64, maps objects. NaN and Infinity are refused: they are not JSON, and a
reader would choke on them far from here.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from txsink.errors import WriteError
from txsink.rowref import RowNaming

__all__ = ["dumps_record", "json_default", "json_rows"]


def json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def json_rows(
    batch: pa.RecordBatch,
    columns: Sequence[str] | None = None,
    *,
    first_row: int = 0,
    context: dict[str, Any] | None = None,
    alternative: str = "",
    naming: RowNaming | None = None,
) -> list[str]:
    """One compact JSON object per row, of ``columns`` (default: all).

    Raises :class:`~txsink.errors.WriteError` naming the row (by ``naming``'s key
    columns or its first columns, at offset ``first_row`` + index) and column of a value
    JSON cannot hold; ``alternative`` is appended to the fix (e.g. "or use
    format='parquet'").
    """
    whole = batch
    if columns is not None:
        batch = batch.select(list(columns))
    maps = [f.name for f in batch.schema if pa.types.is_map(f.type)]
    out = []
    for i, row in enumerate(batch.to_pylist()):
        for name in maps:  # Arrow gives maps as [(key, value), ...]; JSON wants an object
            if row[name] is not None:
                row[name] = {str(k): v for k, v in row[name]}
        try:
            out.append(
                json.dumps(row, default=json_default, allow_nan=False, separators=(",", ":"))
            )
        except (TypeError, ValueError) as err:
            fix = (
                "JSON has no NaN or Infinity: replace them (e.g. with null via nanvl/when) "
                "before the sink"
                if isinstance(err, ValueError)
                else "convert the column to a string or a JSON-friendly type before the sink"
            )
            raise WriteError(
                f"row cannot be written as JSON ({err}); {fix}{alternative}",
                row=(naming or RowNaming()).ref(whole, i, first_row + i),
                column=_bad_column(row),
                phase="write",
                **(context or {}),
            ) from err
    return out


def _bad_column(row: dict[str, Any]) -> str | None:
    for name, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            return name
        try:
            json.dumps(value, default=json_default, allow_nan=False)
        except (TypeError, ValueError):
            return name
    return None


def dumps_record(doc: dict[str, Any]) -> bytes:
    """A JSON record as txsink stores it (log records, savepoint manifests): indented,
    keys sorted, one trailing newline, so equal documents are equal bytes."""
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
