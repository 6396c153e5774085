"""The audit's table as text: one line per epoch x sink, then the extras and the notes, then
one summary line (what ``txsink audit`` prints and the continuous audit logs)."""

from __future__ import annotations

from txsink.ops.audit.run import OK, AuditReport

__all__ = ["render_text", "summary_line"]

_HEAD = ("epoch", "sink", "expected", "found", "checksum", "status")


def render_text(report: AuditReport, *, all_rows: bool = True) -> str:
    """The report as an aligned table (``all_rows=False``: only the rows that are not ok)."""
    rows = report.rows if all_rows else report.mismatches
    cells = [
        (str(r.epoch), r.sink, str(r.expected), "-" if r.found is None else str(r.found),
         r.checksum, r.status)
        for r in rows
    ]  # fmt: skip
    widths = [max(len(c[i]) for c in [_HEAD, *cells]) for i in range(len(_HEAD))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(_HEAD, widths, strict=True)).rstrip()]
    for row, cell in zip(rows, cells, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)).rstrip())
        lines += [f"    {d}" for d in row.differences]
    for uid, extras in sorted(report.extras.items()):
        for x in extras:
            at = f"epoch {x.epoch}: " if x.epoch is not None else ""
            rows_ = f" ({x.rows} rows)" if x.rows is not None else ""
            lines.append(f"extra in {uid}: {at}{x.what}{rows_}")
    for uid, notes in sorted(report.notes.items()):
        lines += [f"note on {uid}: {n}" for n in notes]
    if report.skipped:
        lines.append(
            "decided, not committed yet (not audited): " + ", ".join(str(e) for e in report.skipped)
        )
    lines.append(summary_line(report))
    return "\n".join(lines)


def summary_line(report: AuditReport) -> str:
    """One line: how much was audited, at what level, and the verdict."""
    sinks = sorted({r.sink for r in report.rows})
    level = "deep (rows read)" if report.deep else "metadata"
    span = (
        f"epochs {report.epochs[0]}-{report.epochs[-1]}" if len(report.epochs) > 1
        else f"epoch {report.epochs[0]}" if report.epochs else "no committed epoch"
    )  # fmt: skip
    head = f"audit ({level}) of {span} x {len(sinks)} sink(s) in {report.seconds:.1f} s: "
    if report.ok:
        return head + "every epoch matches"
    bad = [r for r in report.rows if r.status != OK]
    extras = sum(len(x) for x in report.extras.values())
    parts = []
    if bad:
        parts.append(f"{len(bad)} epoch x sink do not match")
    if extras:
        parts.append(f"{extras} extra(s) of ours no decision names")
    return head + "; ".join(parts)
