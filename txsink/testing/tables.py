"""Plain-text tables for the chaos toolkit's reports (one place, so reports line up)."""

from __future__ import annotations

from typing import Any

__all__ = ["format_table"]


def format_table(cols: tuple[str, ...], rows: list[tuple[Any, ...]]) -> str:
    """A plain-text table, columns padded to their widest cell."""
    cells = [list(map(str, cols))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
