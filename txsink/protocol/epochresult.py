"""What one epoch call returned (:meth:`~txsink.Coordinator.write`, ``run_epoch``)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["EpochResult"]


@dataclass(frozen=True)
class EpochResult:
    """What one call did: ``committed``, or ``skipped`` (already committed: a replay)."""

    epoch: int
    status: str
    round: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    handles: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
