"""Values of a log table as short text for a person: times, durations, counts, sizes.

The report's cells come from pandas frames, so a value may be ``None``, ``NaN``,
``pd.NA``, ``NaT``, a ``Timestamp`` or a plain number: every function here takes any of
them and answers ``"-"`` (or ``None``) for a missing one instead of raising. Times are
UTC, always: the report is read far from the cluster that wrote the log.

pandas is imported on the first :func:`is_missing` only: this module is imported by every
process that imports txsink (the lease names times with :func:`when`), among them each
Spark Python worker and child driver, and pandas costs about half a second to import.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

__all__ = [
    "ago",
    "as_number",
    "byte_size",
    "count",
    "duration",
    "first_number",
    "is_missing",
    "pid",
    "when",
]


def is_missing(value: Any) -> bool:
    """True for ``None`` and for what pandas counts as missing (NaN, NA, NaT)."""
    if value is None:
        return True
    import pandas as pd

    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def as_number(value: Any) -> float | None:
    """Seconds since the epoch for a timestamp, the number for a number, else None."""
    if is_missing(value):
        return None
    if isinstance(value, dt.datetime):  # pandas' Timestamp is a datetime too
        return float(value.timestamp())
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def first_number(*values: Any) -> float | None:
    """The first of ``values`` that :func:`as_number` reads, else None."""
    return next((n for v in values if (n := as_number(v)) is not None), None)


def when(seconds: float | None) -> str:
    """A UTC date and time to the second."""
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def ago(seconds: float | None, now: float) -> str:
    """How long before ``now`` (the time the log was read) ``seconds`` was."""
    if seconds is None:
        return "-"
    return f"{duration(max(0.0, now - seconds))} before the read"


def duration(value: float) -> str:
    """Seconds in the unit a person reads best: s, min or h."""
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    if value >= 10:
        return f"{value:.0f} s"
    return f"{value:.3g} s"


def pid(value: Any) -> str:
    """A process id (a float in a frame with missing values) as an integer."""
    num = as_number(value)
    return "-" if num is None else str(int(num))


def count(value: Any) -> str:
    """An integer with thousands separators."""
    num = as_number(value)
    return "-" if num is None else f"{int(num):,}"


def byte_size(value: float | None) -> str:
    """A size in bytes, KiB, MiB or GiB."""
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return "-"  # pragma: no cover - the loop always returns
