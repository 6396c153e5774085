"""Verifiers: read a target back and count duplicates and missing rows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Verdict", "count_ids"]


@dataclass(frozen=True)
class Verdict:
    """The exactly-once verdict for one sink."""

    rows_expected: int
    rows_written: int
    duplicates: int
    missing: int
    unexpected: int
    lingering: int
    epochs: int

    @property
    def ok(self) -> bool:
        return (
            self.duplicates == 0
            and self.missing == 0
            and self.unexpected == 0
            and self.lingering == 0
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def count_ids(
    expected: Iterable[int], written: Iterable[int], *, lingering: int = 0, epochs: int = 0
) -> Verdict:
    """Compare written ids with the expected set (each expected exactly once)."""
    want = set(expected)
    seen = Counter(written)
    return Verdict(
        rows_expected=len(want),
        rows_written=sum(seen.values()),
        duplicates=sum(n - 1 for n in seen.values() if n > 1),
        missing=len(want - seen.keys()),
        unexpected=len(seen.keys() - want),
        lingering=lingering,
        epochs=epochs,
    )
