"""What the :class:`~txsink.testing.observer.Observer` reports: per epoch, when each target
showed it (first rows, complete), the skew between targets, and the violations.

Kept apart from the sampling so each module has one job: this one only judges and prints.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from txsink.testing.history import HistoryViolation
from txsink.testing.tables import format_table

__all__ = ["EpochVisibility", "ObserverReport"]


@dataclass(frozen=True)
class EpochVisibility:
    """One epoch: when each target first showed it, when it was complete there, and the end."""

    epoch: int
    expected_rows: int
    first_seen: Mapping[str, float]
    complete_at: Mapping[str, float]
    final_rows: Mapping[str, int]
    guaranteed: tuple[str, ...]

    @property
    def skew(self) -> float | None:
        """Seconds from the first guaranteed target showing the epoch to the last one
        (None unless every guaranteed target showed it)."""
        times = [self.first_seen[t] for t in self.guaranteed if t in self.first_seen]
        if not times or len(times) != len(self.guaranteed):
            return None
        return max(times) - min(times)

    @property
    def complete_skew(self) -> float | None:
        """The same for the time each target showed the epoch *complete*."""
        times = [self.complete_at[t] for t in self.guaranteed if t in self.complete_at]
        if not times or len(times) != len(self.guaranteed):
            return None
        return max(times) - min(times)

    def partial_seconds(self, target: str) -> float | None:
        """How long ``target`` showed only part of the epoch (0.0 if never seen partial)."""
        if target not in self.first_seen or target not in self.complete_at:
            return None
        return self.complete_at[target] - self.first_seen[target]

    def lead(self, view: str) -> float | None:
        """How long before the first guaranteed target a boundary ``view`` showed the epoch."""
        times = [self.first_seen[t] for t in self.guaranteed if t in self.first_seen]
        if view not in self.first_seen or not times:
            return None
        return min(times) - self.first_seen[view]


def _stats(values: Sequence[float]) -> tuple[float | None, float | None]:
    return (statistics.median(values), max(values)) if values else (None, None)


@dataclass(frozen=True)
class ObserverReport:
    """What the observer saw: per epoch, per target, and the violations."""

    targets: tuple[str, ...]
    guaranteed: tuple[str, ...]
    epochs: Mapping[int, EpochVisibility]
    violations: tuple[str, ...]
    samples: Mapping[str, int]
    sample_errors: Mapping[str, int]
    interval: float
    #: The history checker's findings (also among :attr:`violations`).
    history: tuple[HistoryViolation, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def skews(self) -> list[float]:
        """The skew of every epoch all guaranteed targets showed."""
        return [s for e in self.epochs.values() if (s := e.skew) is not None]

    @property
    def complete_skews(self) -> list[float]:
        return [s for e in self.epochs.values() if (s := e.complete_skew) is not None]

    @property
    def skew_median(self) -> float | None:
        return _stats(self.skews)[0]

    @property
    def skew_max(self) -> float | None:
        return _stats(self.skews)[1]

    def partial_max(self, target: str) -> float | None:
        """The longest time ``target`` showed an epoch only partly."""
        values = [p for e in self.epochs.values() if (p := e.partial_seconds(target)) is not None]
        return max(values) if values else None

    def as_dict(self) -> dict[str, Any]:
        def r(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        return {
            "ok": self.ok,
            "targets": list(self.targets),
            "guaranteed": list(self.guaranteed),
            "violations": list(self.violations),
            "samples": dict(self.samples),
            "sample_errors": dict(self.sample_errors),
            "interval": self.interval,
            "skew_median": r(self.skew_median),
            "skew_max": r(self.skew_max),
            "complete_skew_median": r(_stats(self.complete_skews)[0]),
            "complete_skew_max": r(_stats(self.complete_skews)[1]),
            "partial_max": {t: r(self.partial_max(t)) for t in self.targets},
        }

    def table(self) -> str:
        """One row per epoch: first visibility per target (seconds after the earliest), skew."""

        starts = [t for e in self.epochs.values() for t in e.first_seen.values()]
        t0 = min(starts) if starts else 0.0

        def cell(e: EpochVisibility, target: str) -> str:
            if target not in e.first_seen:
                return "-"
            text = f"{e.first_seen[target] - t0:.2f}"
            part = e.partial_seconds(target)
            if part:
                text += f" (+{part:.2f} partial)"
            return text + f" [{e.final_rows.get(target, 0)}]"

        rows = [
            (
                e.epoch,
                e.expected_rows,
                *(cell(e, t) for t in self.targets),
                "-" if e.skew is None else f"{e.skew:.3f}",
            )
            for e in sorted(self.epochs.values(), key=lambda v: v.epoch)
        ]
        med, top = self.skew_median, self.skew_max
        head = (
            f"observer: {'ok' if self.ok else f'{len(self.violations)} VIOLATION(S)'}; skew "
            f"median {'-' if med is None else f'{med:.3f}s'}, max "
            f"{'-' if top is None else f'{top:.3f}s'} over {len(self.skews)} epoch(s); samples "
            f"{dict(self.samples)}, errors {dict(self.sample_errors)}"
        )
        cols = ("epoch", "rows", *self.targets, "skew s")
        body = format_table(cols, rows)
        return "\n".join([head, body, *(f"  violation: {v}" for v in self.violations)])

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError("the cross-system observer saw violations\n" + self.table())
