"""Blocked epochs in the txsink log: a decided epoch its target refuses for good.

One ``epochs/<epoch>/blocked-<n:06d>.json`` record per refused commit attempt
(:class:`~txsink.errors.EpochBlockedError`), created once like every log record; the
first says since when, their count how often, the last why and what to fix. The
committed mark ends the block. Older txsinks ignore these records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

__all__ = ["BLOCK", "EpochBlock", "block_doc", "summarize"]

#: The name prefix of a blocked record in an epoch's folder.
BLOCK = "blocked-"


@dataclass(frozen=True)
class EpochBlock:
    """Why a decided epoch cannot be committed until an operator acts (its last refusal),
    since when, and how many commit attempts were refused."""

    epoch: int
    sink_uid: str
    shard: int | None
    reason: str
    fix: str
    first_seen: float
    last_seen: float
    attempts: int

    def to_doc(self) -> dict[str, Any]:
        return {
            "sink_uid": self.sink_uid,
            "shard": self.shard,
            "reason": self.reason,
            "fix": self.fix,
            "first_seen": self.first_seen,
            "last_seen": self.last_seen,
            "attempts": self.attempts,
        }


def block_doc(
    epoch: int,
    *,
    round_: int,
    attempt: int,
    sink_uid: str,
    shard: int | None,
    reason: str,
    fix: str,
) -> dict[str, Any]:
    """One refused attempt's record (the log adds its version)."""
    return {
        "epoch": epoch,
        "round": round_,
        "attempt": attempt,
        "sink_uid": sink_uid,
        "shard": shard,
        "reason": reason,
        "fix": fix,
        "at": time.time(),
    }


def summarize(epoch: int, docs: list[dict[str, Any]]) -> EpochBlock | None:
    """The block of ``epoch`` from its records, oldest first (``None``: none)."""
    if not docs:
        return None
    last = docs[-1]
    shard = last.get("shard")
    return EpochBlock(
        epoch=epoch,
        sink_uid=str(last.get("sink_uid", "")),
        shard=None if shard is None else int(shard),
        reason=str(last.get("reason", "")),
        fix=str(last.get("fix", "")),
        first_seen=float(docs[0].get("at", 0.0)),
        last_seen=float(last.get("at", 0.0)),
        attempts=len(docs),
    )
