"""Verifiers: read a target back and count duplicates and missing rows."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Verdict", "count_ids", "verify_files"]


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


def verify_files(
    path: str | os.PathLike[str],
    expected_ids: Iterable[int],
    *,
    id_column: str = "id",
    uid: str | None = None,
) -> Verdict:
    """Verify a files sink: rows from whole committed epochs (manifests), staged leftovers."""
    from txsink.connectors.files import STAGING, read_committed, read_manifests

    table = read_committed(path, uid)
    ids = table.column(id_column).to_pylist() if id_column in table.column_names else []
    staging = os.path.join(os.fspath(path), STAGING)
    lingering = len(os.listdir(staging)) if os.path.isdir(staging) else 0
    return count_ids(expected_ids, ids, lingering=lingering, epochs=len(read_manifests(path, uid)))
