"""delta-rs errors, classified by their type (delta-rs raises typed exceptions; their
messages are never parsed), and described without secrets."""

from __future__ import annotations

import re

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


#: Terminal colour codes and the arrows delta-rs draws between an error and its causes.
_DECORATION = re.compile(r"\x1b\[[0-9;]*m|↳")


def describe(err: BaseException) -> str:
    """The error's type, first line and innermost cause (delta-rs messages name paths,
    never option values).

    delta-rs chains an object-store failure as one line per cause, the first generic
    ("Generic S3 error") and the last the one to act on ("invalid peer certificate",
    "UnknownIssuer", "403 Forbidden"): both are shown, for people to read (never matched)."""
    lines = [_DECORATION.sub("", line).strip() for line in str(err).splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return type(err).__name__
    text = lines[0][:300]
    if len(lines) > 1:
        text += " ... " + ": ".join(lines[-2:])[:300]
    return f"{type(err).__name__}: {text}"
