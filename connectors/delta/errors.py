"""delta-rs errors, classified by their type (delta-rs raises typed exceptions; their
messages are never parsed), and described without secrets."""

from __future__ import annotations

__all__ = ["describe", "is_conflict", "is_not_found"]


def is_not_found(err: BaseException) -> bool:
    """No table at the location (no ``_delta_log``)."""
    from deltalake.exceptions import TableNotFoundError

    return isinstance(err, TableNotFoundError)


def is_conflict(err: BaseException) -> bool:
    """The commit lost to a concurrent one it conflicts with (delta-rs already retried the
    commits it could reconcile, e.g. plain appends)."""
    from deltalake.exceptions import CommitFailedError

    return isinstance(err, CommitFailedError)


def describe(err: BaseException) -> str:
    """The error's type and first line (delta-rs messages name paths, never option values)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else ""
    return f"{type(err).__name__}: {first[:300]}" if first else type(err).__name__
