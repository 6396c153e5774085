"""Pieces of a self-contained HTML page: escaping, tables, an SVG chart frame, and its CSS.

Nothing here knows about txsink logs; :mod:`txsink.ops.report` puts the pieces together.
Everything is inline (CSS in a ``<style>``, charts as ``<svg>``): no script, no font, no
image, nothing fetched. Every text that goes into the page passes :func:`escape`.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from txsink.kit.text import is_missing, when

__all__ = [
    "CSS",
    "WIDTH",
    "Badge",
    "Code",
    "cell",
    "escape",
    "nice_ticks",
    "note",
    "svg",
    "table",
    "time_axis",
]

#: Width of every chart in SVG user units; the SVG scales to its container (max 1200 px).
WIDTH = 1160


@dataclass(frozen=True)
class Code:
    """A table cell shown in monospace."""

    text: str


@dataclass(frozen=True)
class Badge:
    """A table cell shown as a badge: white ``text`` on ``color``."""

    text: str
    color: str


def escape(text: Any) -> str:
    """``text`` as HTML text or an attribute value (quotes escaped too)."""
    return html.escape(str(text), quote=True)


def note(text: str) -> str:
    """A highlighted paragraph, e.g. to say a chart shows only a part."""
    return f'<p class="note">{escape(text)}</p>\n'


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table that scrolls sideways on a narrow screen; each value becomes a :func:`cell`."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>\n" for row in rows)
    return (
        f'<div class="scroll"><table>\n<thead><tr>{head}</tr></thead>\n'
        f"<tbody>\n{body}</tbody></table></div>\n"
    )


def cell(value: Any) -> str:
    """A ``<td>``: numbers right for tabular figures, a missing value as ``-``."""
    if isinstance(value, Code):
        return f"<td><code>{escape(value.text)}</code></td>"
    if isinstance(value, Badge):
        return (
            f'<td><span class="badge" style="background:{value.color}">'
            f"{escape(value.text)}</span></td>"
        )
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td class="n">{escape(str(value))}</td>'
    return f"<td>{escape('-' if is_missing(value) else str(value))}</td>"


def svg(height: float, label: str, content: str) -> str:
    """The frame of a chart :data:`WIDTH` units wide; ``label`` is what a screen reader says."""
    return (
        f'<svg viewBox="0 0 {WIDTH} {height:.0f}" width="100%" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">{content}</svg>\n'
    )


def time_axis(t0: float, t1: float, x: Callable[[float], float], top: float, bottom: float) -> str:
    """A UTC time axis from ``t0`` to ``t1`` (seconds) at ``bottom``, with grid lines up to
    ``top``: about eight ticks on round steps, labelled to the precision the span needs."""
    span = t1 - t0
    steps = [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900]
    steps += [1800, 3600, 7200, 21600, 43200, 86400]
    step = next((s for s in steps if span / s <= 8), 86400 * math.ceil(span / 86400 / 8))
    parts = []
    k = math.ceil(t0 / step)
    while k * step <= t1:
        t = k * step
        stamp = dt.datetime.fromtimestamp(t, dt.UTC)
        if span >= 86400:
            text = stamp.strftime("%m-%d %H:%M")
        elif step < 1:
            text = stamp.strftime("%H:%M:%S.%f")[: -5 if step >= 0.1 else -4]
        else:
            text = stamp.strftime("%H:%M:%S")
        parts.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top}" y2="{bottom}" class="grid"/>'
            f'<text x="{x(t):.1f}" y="{bottom + 16}" text-anchor="middle" class="tick">'
            f"{escape(text)}</text>"
        )
        k += 1
    parts.append(
        f'<line x1="{x(t0):.1f}" x2="{x(t1):.1f}" y1="{bottom}" y2="{bottom}" class="axis"/>'
        f'<text x="{(x(t0) + x(t1)) / 2:.1f}" y="{bottom + 36}" text-anchor="middle" '
        f'class="label">time (UTC) from {escape(when(t0))}</text>'
    )
    return "".join(parts)


def nice_ticks(highest: float) -> list[float]:
    """0 and about five round steps up to at least ``highest``."""
    if highest <= 0 or math.isnan(highest):
        return [0.0, 1.0]
    raw = highest / 5
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    count = math.ceil(highest / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)] if count else [0.0, step]


#: The page's stylesheet: the classes the pieces above emit and those of the report's
#: sections (header facts and cards, hints, notes, legends).
CSS = """
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; background: #f5f6f8; color: #1f2328;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
main { max-width: 1200px; margin: 0 auto; padding: 20px; }
header, section { background: #fff; border: 1px solid #d8dde3; border-radius: 8px;
  padding: 16px 20px; margin-bottom: 16px; }
h1 { font-size: 22px; margin: 0 0 10px; }
h2 { font-size: 17px; margin: 0 0 8px; }
h3 { font-size: 14px; margin: 14px 0 6px; }
h3 small { color: #57606a; font-weight: normal; margin-left: 8px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px;
  margin: 0 0 12px; }
dl.facts dt { color: #57606a; }
dl.facts dd { margin: 0; word-break: break-all;
  font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { border: 1px solid #d8dde3; border-radius: 6px; padding: 8px 14px; min-width: 130px;
  display: flex; flex-direction: column; }
.card .num { font-size: 22px; font-weight: 600; }
.card span:last-child { color: #57606a; font-size: 12px; }
.hint { color: #57606a; margin: 0 0 8px; }
.note { background: #fff8e1; border-left: 3px solid #ef6c00; padding: 4px 8px; }
.empty { color: #57606a; font-style: italic; }
.ok { color: #2e7d32; }
.stats { color: #57606a; margin: 4px 0 0; }
.legend { display: flex; gap: 18px; color: #57606a; font-size: 12px; margin-top: 4px; }
.legend i { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
  margin-right: 5px; vertical-align: -1px; }
.legend b { margin-right: 5px; }
svg { display: block; }
svg .tick { font-size: 11px; fill: #57606a; }
svg .label { font-size: 12px; fill: #1f2328; }
svg .grid { stroke: #eaeef2; }
svg .axis { stroke: #8c959f; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eaeef2;
  vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
td.n { font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafbfc; }
code { font: 12px ui-monospace, "DejaVu Sans Mono", monospace; white-space: pre-wrap;
  word-break: break-all; }
.badge { color: #fff; border-radius: 10px; padding: 1px 8px; font-size: 12px; }
footer { color: #8c959f; font-size: 12px; text-align: center; }
"""
