"""The two charts of the HTML report (:mod:`txsink.ops.report`): the epoch timeline and the
commit latency per epoch, as inline SVG.

Both show the newest :data:`CHART_EPOCHS` epochs at most, and say so above the chart: a
long-running query's log holds thousands of epochs, and a chart of all of them would be
neither readable nor small. Colors name epoch statuses the same way everywhere in the
report (:data:`STATUS_COLORS`); every bar and mark has a tooltip with its exact times.
"""

from __future__ import annotations

import math

import pandas as pd

from txsink.kit import text as fmt
from txsink.ops.html import WIDTH, escape, nice_ticks, note, svg, time_axis

__all__ = ["CHART_EPOCHS", "STATUS_COLORS", "VOID_COLOR", "latency_section", "timeline_section"]

#: The charts show at most this many epochs (the newest); tables say so too.
CHART_EPOCHS = 500
#: The color of each epoch status, in the charts, the summary cards and the badges.
STATUS_COLORS = {
    "committed": "#2e7d32",
    "decided": "#ef6c00",
    "blocked": "#ad1457",
    "aborted": "#c62828",
    "open": "#757575",
}
#: Voided rounds: the crosses on the timeline and their badges in the tables.
VOID_COLOR = "#c62828"
_SERIES = {"commit_latency_s": "#1565c0", "precommit_s": "#8e24aa"}


def timeline_section(epochs: pd.DataFrame, rows: pd.DataFrame) -> str:
    """Section ``timeline``: per epoch (a row of ``epochs``) a bar from its first claim to
    its commit, and a cross at each voided round of ``rows`` (the log table)."""
    shown, capped = _newest(epochs)
    head = '<section id="timeline">\n<h2>Epoch timeline</h2>\n'
    if shown.empty:
        return head + '<p class="empty">The log holds no epochs yet.</p>\n</section>'
    spans = []
    for rec in shown.to_dict("records"):
        start = fmt.first_number(rec["claimed_at"], rec["decided_at"], rec["committed_at"])
        end = fmt.first_number(rec["committed_at"], rec["decided_at"])
        voids = rows.loc[rows["epoch"] == rec["epoch"], "voided_at"].dropna()
        if end is None:  # never decided: the bar ends at its last void
            end = fmt.first_number(voids.max() if len(voids) else None, start)
        if start is None or end is None:
            continue
        spans.append((rec, start, max(start, end)))
    if not spans:
        return head + '<p class="empty">No epoch has timestamps.</p>\n</section>'
    void_rows = rows[(rows["round_status"] == "void") & rows["epoch"].isin(shown["epoch"])]
    t0 = min(s for _, s, _ in spans)
    t1 = max([e for _, _, e in spans] + [fmt.as_number(void_rows["voided_at"].max()) or t0])
    t1 = t1 if t1 > t0 else t0 + 1.0
    left, right, top, axis = 64, 16, 8, 44
    plot_w = WIDTH - left - right
    step = min(18.0, max(2.0, 480.0 / len(spans)))
    height = top + step * len(spans) + axis

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * plot_w

    index = {int(rec["epoch"]): i for i, (rec, _, _) in enumerate(spans)}
    every = max(1, math.ceil(12 / step))
    parts = [time_axis(t0, t1, x, top, top + step * len(spans))]
    for i, (rec, start, end) in enumerate(spans):
        y = top + i * step
        bar_h = max(1.0, step * 0.7)
        color = STATUS_COLORS.get(str(rec["status"]), "#757575")
        tip = (
            f"epoch {rec['epoch']}: {rec['status']}; claimed {fmt.when(start)}, "
            f"decided {fmt.when(fmt.as_number(rec['decided_at']))}, "
            f"committed {fmt.when(fmt.as_number(rec['committed_at']))}; "
            f"{rec['rounds']} round(s), {rec['voided_rounds']} voided"
        )
        parts.append(
            f'<rect x="{x(start):.1f}" y="{y + (step - bar_h) / 2:.1f}" '
            f'width="{max(2.0, x(end) - x(start)):.1f}" height="{bar_h:.1f}" fill="{color}" '
            f'rx="1"><title>{escape(tip)}</title></rect>'
        )
        if i % every == 0:
            parts.append(
                f'<text x="{left - 6}" y="{y + step / 2 + 4:.1f}" text-anchor="end" '
                f'class="tick">{escape(str(rec["epoch"]))}</text>'
            )
    for vrec in void_rows.to_dict("records"):
        at = fmt.as_number(vrec["voided_at"])
        if at is None or int(vrec["epoch"]) not in index:
            continue
        cy = top + index[int(vrec["epoch"])] * step + step / 2
        r = max(2.5, min(5.0, step * 0.35))
        cx = x(at)
        tip = f"epoch {vrec['epoch']} round {vrec['round']} voided: {vrec['void_reason'] or '-'}"
        cross = (
            f"M{cx - r:.1f},{cy - r:.1f}L{cx + r:.1f},{cy + r:.1f}"
            f"M{cx - r:.1f},{cy + r:.1f}L{cx + r:.1f},{cy - r:.1f}"
        )
        # A white halo keeps the mark readable on top of a bar of any color.
        parts.append(
            f'<g><path d="{cross}" stroke="#fff" stroke-width="4.5"/>'
            f'<path d="{cross}" stroke="{VOID_COLOR}" stroke-width="2"/>'
            f"<title>{escape(tip)}</title></g>"
        )
    parts.append(
        f'<text x="14" y="{top + step * len(spans) / 2:.1f}" class="label" '
        f'transform="rotate(-90 14 {top + step * len(spans) / 2:.1f})" '
        'text-anchor="middle">epoch</text>'
    )
    legend = "".join(
        f'<span><i style="background:{c}"></i>{escape(s)}</span>' for s, c in STATUS_COLORS.items()
    )
    legend += f'<span><b style="color:{VOID_COLOR}">&#215;</b>voided round</span>'
    return (
        head + '<p class="hint">Each bar runs from the epoch\'s first claim to its commit (or its '
        "decision, if not committed yet). Hover a bar or a mark for its times.</p>\n"
        + capped
        + svg(height, "Epoch timeline", "".join(parts))
        + f'<div class="legend">{legend}</div>\n</section>'
    )


def latency_section(epochs: pd.DataFrame) -> str:
    """Section ``latency``: commit latency and pre-commit time of each decided epoch."""
    shown, capped = _newest(epochs)
    head = '<section id="latency">\n<h2>Commit latency</h2>\n'
    data = shown[shown["decided_round"].notna()]
    if data.empty:
        return head + '<p class="empty">No epoch has been decided yet.</p>\n</section>'
    left, right, top, bottom = 64, 16, 28, 44
    height = 300
    plot_w, plot_h = WIDTH - left - right, height - top - bottom
    highest = max(
        fmt.as_number(data["commit_latency_s"].max()) or 0.0,
        fmt.as_number(data["precommit_s"].max()) or 0.0,
    )
    ticks = nice_ticks(highest)
    ymax = ticks[-1]
    m = len(data)

    def x(i: int) -> float:
        return left + (i + 0.5) * plot_w / m

    def y(v: float) -> float:
        return top + plot_h - v / ymax * plot_h

    parts = []
    for tick in ticks:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
            'class="grid"/>'
            f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" class="tick">'
            f"{escape(fmt.duration(tick))}</text>"
        )
    every = max(1, math.ceil(m / 20))
    records = data.to_dict("records")
    for i, rec in enumerate(records):
        if i % every == 0:
            parts.append(
                f'<text x="{x(i):.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
                f'class="tick">{escape(str(rec["epoch"]))}</text>'
            )
    for column, color in _SERIES.items():
        points = [
            (i, val)
            for i, rec in enumerate(records)
            if (val := fmt.as_number(rec[column])) is not None
        ]
        if not points:
            continue
        dash = ' stroke-dasharray="5 3"' if column == "precommit_s" else ""
        path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in points)
        parts.append(
            f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        )
        r = 3.0 if m <= 120 else 1.5
        for i, v in points:
            tip = f"epoch {records[i]['epoch']}: {_label(column)} {fmt.duration(v)}"
            parts.append(
                f'<circle cx="{x(i):.1f}" cy="{y(v):.1f}" r="{r}" fill="{color}">'
                f"<title>{escape(tip)}</title></circle>"
            )
    parts.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}" '
        'class="axis"/>'
        f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}" class="axis"/>'
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 6}" text-anchor="middle" '
        'class="label">epoch</text>'
        f'<text x="14" y="{top + plot_h / 2:.1f}" text-anchor="middle" class="label" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.1f})">seconds</text>'
    )
    legend_x = left + plot_w - 330
    for k, (column, color) in enumerate(_SERIES.items()):
        lx = legend_x + k * 170
        dash = ' stroke-dasharray="5 3"' if column == "precommit_s" else ""
        parts.append(
            f'<line x1="{lx}" x2="{lx + 22}" y1="12" y2="12" stroke="{color}" '
            f'stroke-width="2"{dash}/><text x="{lx + 28}" y="16" class="tick">'
            f"{escape(_label(column))}</text>"
        )
    stats = []
    for column in _SERIES:
        values = data[column].dropna()
        if len(values):
            stats.append(
                f"{_label(column)}: median {fmt.duration(float(values.median()))}, "
                f"max {fmt.duration(float(values.max()))}"
            )
    return (
        head + '<p class="hint">Commit latency is the time from an epoch\'s decision to its '
        "committed mark (the commit phase; after a crash, also the wait for recovery). "
        "Pre-commit is the time the partition tasks took to write and prepare.</p>\n"
        + capped
        + svg(height, "Commit latency per epoch", "".join(parts))
        + f'<p class="stats">{escape("; ".join(stats))}</p>\n</section>'
    )


def _newest(epochs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    if len(epochs) <= CHART_EPOCHS:
        return epochs, ""
    return epochs.iloc[-CHART_EPOCHS:], note(
        f"Showing the newest {CHART_EPOCHS} of {len(epochs)} epochs."
    )


def _label(column: str) -> str:
    return {"commit_latency_s": "commit latency", "precommit_s": "pre-commit"}[column]
