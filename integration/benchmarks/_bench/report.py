"""The report: markdown tables, the parts every benchmark's section shares, and writing a
section of docs/benchmarks.md.

Each benchmark's section lives between ``<!-- bench:<name>:start -->`` and
``<!-- bench:<name>:end -->``; a rerun replaces only its own section, so the others (and
any prose around them) stay as they are.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .env import REPO
from .feed import feed_note
from .measure import Measurement, log, median
from .results import PHASES, Results, cpu_per_row

DOCS = REPO / "docs" / "benchmarks.md"

DOC_INTRO = """# Benchmarks

Throughput of txsink's sinks next to the usual ways of writing the same rows from Spark, on
one machine, with the same data for every writer. Every writer's output is checked (row
count, distinct ids, and column aggregates equal to the source's) before its time counts:
a writer that lost or duplicated rows would make its number void.

Rerun a section with `integration/benchmarks/run <name>` (e.g. `integration/benchmarks/run
postgres --repeat 3`); it starts the test server it needs (`integration/services up`) if the
`TXSINK_*` variables are not set, prints the tables, and rewrites its own section below.
Numbers from a 2-core machine that also ran other jobs at times are only indicative: each
section records the load average before and after.
"""

# A column of the throughput table beyond the shared ones: header, alignment (``l`` or
# ``r``) and the cell of (writer, partitions, that writer's runs at those partitions).
Column = tuple[str, str, Callable[[str, int, list[Measurement]], str]]


# -- cells and tables ----------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str = "") -> str:
    """A GitHub markdown table; ``align`` has one letter per column (``l`` or ``r``)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    align = align.ljust(len(headers), "l")

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if a == "r" else v.ljust(w)
            for v, w, a in zip(values, widths, align, strict=True)
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            "-" * (w + 1) + ":" if a == "r" else "-" * (w + 2)
            for w, a in zip(widths, align, strict=True)
        )
        + "|"
    )
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def fmt_rate(rows_per_s: float) -> str:
    return f"{rows_per_s:,.0f}"


def ms(values: Sequence[float], digits: int = 0) -> str:
    """The median of seconds in milliseconds: ``126`` (``-`` for none)."""
    return f"{median(values) * 1000:.{digits}f}" if values else "-"


def spread(values: Sequence[float], *, scale: float = 1000.0, digits: int = 0) -> str:
    """``min-max`` of seconds, in milliseconds unless ``scale`` says otherwise: ``117-215``."""
    return f"{min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f}"


def fmt_secs(values: Sequence[float]) -> str:
    """Seconds of single runs: ``3.06 / 3.24``."""
    return " / ".join(f"{v:.2f}" for v in values)


def ratio_cell(
    res: Results,
    writer: str,
    partitions: int,
    over: str | None = None,
    *,
    target: float | None = None,
    single_runs: bool = True,
) -> str:
    """``writer``'s rate over ``over``'s (default the baseline's) as ``1.03x``, with the
    verdict against ``target`` and the range of the run-by-run ratios when asked."""
    if not res.seconds(writer, partitions) or not res.seconds(over or res.baseline, partitions):
        return "not measured"
    ratio = res.ratio(writer, partitions, over)
    notes = []
    if target is not None:
        notes.append("met" if ratio >= target else "NOT met")
    if single_runs:
        runs = res.paired(writer, partitions, over)
        notes.append(f"single runs {min(runs):.2f}-{max(runs):.2f}x")
    return f"{ratio:.2f}x" + (f" ({'; '.join(notes)})" if notes else "")


def throughput_table(
    res: Results,
    labels: Mapping[str, str],
    shown: Sequence[str],
    compared: Sequence[str],
    *,
    rate_header: str,
    vs_header: str,
    server_header: str,
    columns: Sequence[Column] = (),
) -> str:
    """One row per partition count and writer in ``shown`` that ran: the median rate (VOID
    if any run was), ``columns``, the single runs' times, the rate over the baseline's (for
    the writers in ``compared``), the median CPU seconds and the load at each run's start."""
    rows: list[list[str]] = []
    for p in res.partitions:
        base = res.rate(res.baseline, p)
        for writer in shown:
            runs = res.of(writer, p)
            if not runs:
                continue
            cpu = res.cpu(writer, p)
            ratio = res.rate(writer, p) / base
            rows.append(
                [
                    str(p),
                    labels[writer],
                    fmt_rate(res.rate(writer, p)) + (" VOID" if res.is_void(writer, p) else ""),
                    *(cell(writer, p, runs) for _, _, cell in columns),
                    fmt_secs(res.seconds(writer, p)),
                    f"{ratio:.2f}x" if writer in compared and ratio == ratio else "",
                    f"{cpu['spark']:.1f} / {cpu[res.server]:.1f} / {cpu['others']:.1f}",
                    " / ".join(f"{m.load_before:.1f}" for m in runs),
                ]
            )
    headers = [
        "partitions",
        "writer",
        rate_header,
        *(header for header, _, _ in columns),
        "wall s per run",
        vs_header,
        f"CPU s: Spark / {server_header} / other",
        "load1 at start",
    ]
    return markdown_table(headers, rows, "rlr" + "".join(a for _, a, _ in columns) + "rrrr")


def phase_table(
    res: Results, modes: Sequence[str] = (), *, digits: int = 3, other: str = "check + schema"
) -> str:
    """The epoch's phases (median seconds) per partition count, for ``txsink`` or, with a
    column of their own, for each writer in ``modes``."""
    rows = []
    for p in res.partitions:
        for writer in modes or ("txsink",):
            if not res.seconds(writer, p):
                continue
            ph = res.phases(p, writer)
            rows.append(
                [str(p), *([writer] if modes else [])]
                + [f"{ph[k]:.{digits}f}" for k in ("other", *PHASES)]
                + [f"{median(res.seconds(writer, p)):.{digits}f}"]
            )
    headers = ["partitions", *(["mode"] if modes else []), other, *PHASES, "total"]
    return markdown_table(headers, rows, "r" + ("l" if modes else "") + "r" * 6)


#: The CPU columns: (role, header). ``spark`` = driver + JVM + workers; the JVM's JIT and GC
#: and the workers' main thread / other threads are parts of their role (see ``.cpu``).
CPU_ROLES = (
    ("jvm", "JVM"),
    ("jvm_jit", "of which JIT"),
    ("workers", "Python workers"),
    ("workers_main", "of which main thread"),
    ("workers_threads", "of which other threads"),
    ("driver", "driver Python"),
)


def ratio_range_cell(res: Results, writer: str, partitions: int, over: str | None = None) -> str:
    """``0.85x (0.79-1.01)``: the median of the paired run-by-run ratios, their range."""
    return _ratios_text(res.paired(writer, partitions, over)) or ""


def _ratios_text(ratios: Sequence[float], digits: int = 2) -> str | None:
    """``1.05x (0.97-1.12)``: the median of ``ratios`` and their min-max (``1.05x`` for one;
    ``None`` for none)."""
    if not ratios:
        return None
    mid = f"{median(ratios):.{digits}f}x"
    return mid if len(ratios) == 1 else f"{mid} ({min(ratios):.{digits}f}-{max(ratios):.{digits}f})"


def paired_cell(mine: Sequence[float], theirs: Sequence[float], digits: int = 2) -> str:
    """``1.05x (0.97-1.12)``: the median of ``mine[i] / theirs[i]`` (values of runs that ran
    back to back, e.g. one repeat of each of two writers), with their min-max; ``-`` for
    no pair (pairs with a zero or nan denominator are left out)."""
    ratios = [m / t for m, t in zip(mine, theirs, strict=False) if t and t == t and m == m]
    return _ratios_text(ratios, digits) or "-"


def min_median_max(values: Sequence[float], *, scale: float = 1.0, digits: int = 2) -> str:
    """``0.31 (0.29-0.36)``: the median of ``values`` (times ``scale``) with their min-max;
    ``-`` for none."""
    if not values:
        return "-"
    mid = f"{median(values) * scale:.{digits}f}"
    low, high = min(values) * scale, max(values) * scale
    return mid if len(values) == 1 else f"{mid} ({low:.{digits}f}-{high:.{digits}f})"


def cpu_table(
    res: Results,
    labels: Mapping[str, str],
    shown: Sequence[str],
    *,
    over: str | None = None,
    servers: Sequence[tuple[str, str]] = (),
    rate_header: str = "records/s (median)",
    roles: Sequence[tuple[str, str]] = CPU_ROLES,
    per: tuple[str, float] = ("per 1M", 1.0),
) -> str:
    """Per partition count and writer: the median rate, the rate over ``over``'s (default
    the baseline's: median of the paired ratios, min-max), and CPU-seconds per million
    records by role (median over the runs): the total of the measured roles, each role of
    ``roles`` (default :data:`CPU_ROLES`), each server of ``servers`` (role, header), then
    ``others`` (the rest of the machine: noise from other jobs, not in the total). A role the
    meter did not see (a server elsewhere) shows ``-``. ``per``: the unit's name and its
    size in millions of records, e.g. ``("per epoch", 200 / 1e6)`` for epochs of 200."""
    base = over or res.baseline
    unit, millions = per
    roles = [*roles, *servers]
    rows: list[list[str]] = []
    for p in res.partitions:
        for writer in shown:
            runs = res.of(writer, p)
            if not runs:
                continue
            per_m = {
                role: cpu_per_row(runs, role) * millions
                for role in ("spark", "others", *dict(roles))
            }
            total = per_m["spark"] + sum(v for role, _ in servers if (v := per_m[role]) == v)
            rows.append(
                [
                    str(p),
                    feed_label(res, labels.get(writer, writer)),
                    fmt_rate(res.rate(writer, p)) + (" VOID" if res.is_void(writer, p) else ""),
                    "" if writer == base else ratio_range_cell(res, writer, p, base),
                    _cpu_cell(total),
                    *(_cpu_cell(per_m[role]) for role, _ in roles),
                    _cpu_cell(per_m["others"]),
                ]
            )
    headers = [
        "partitions",
        "writer",
        rate_header,
        f"rate vs {labels.get(base, base)}: median (min-max)",
        f"CPU-s {unit}: total",
        *(h for _, h in roles),
        "others (not ours)",
    ]
    return markdown_table(headers, rows, "rlrr" + "r" * (len(roles) + 2))


CPU_NOTE = (
    "CPU-seconds per million records by role (median over the runs), read from `/proc` per "
    "process and thread: *JVM* is Spark's JVM (its JIT compiler threads as a part), *Python "
    "workers* Spark's Python worker processes (their main thread, which runs the task's "
    "Python code, and their other threads: librdkafka's, Arrow's; a worker that exited "
    "counts in the total only), *driver Python* the benchmark's own process, then each "
    "server's process tree; *total* adds them up. *others* is the rest of the machine's busy "
    "time during the run (other jobs: noise, not cost). The kernel counts in clock ticks "
    "(10 ms) per process and per thread, so a part can differ from its whole by a tick or "
    "two per run. On a shared machine these figures move far less than the rates. The rate "
    "ratio is the median of the run-by-run ratios (each pair ran back to back) with their "
    "min-max."
)


def cpu_blocks(
    res: Results,
    labels: Mapping[str, str],
    shown: Sequence[str],
    *,
    over: str | None = None,
    servers: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """The ``### CPU per record by role`` subsection: :data:`CPU_NOTE` and :func:`cpu_table`."""
    table = cpu_table(res, labels, shown, over=over, servers=servers)
    texts = [CPU_NOTE, table] + ([OWN_CAP] if res.feed == "defaults" else [])
    return blocks(*texts, title="CPU per record by role")


#: With ``--feed defaults``, txsink's rows are marked: they run with the cap lifted.
OWN_CAP = (
    "† txsink lifts Spark's Arrow batch byte cap for its own jobs (as every txsink user gets "
    "it); the other writers run with Spark's default."
)


def feed_label(res: Results, label: str) -> str:
    """``label``, marked † for txsink's writers in a ``--feed defaults`` report."""
    return label + " †" if res.feed == "defaults" and label.startswith("txsink") else label


def _cpu_cell(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"


# -- the section ---------------------------------------------------------------------------


def header(res: Results, heading: str, load_note: str = "") -> list[str]:
    """The section's first lines: heading, when and how it was measured, machine, load."""
    mach = res.machine
    if res.feed == "defaults":  # its own section, beside the same-feed one
        heading += ", with Spark's defaults"
    return [
        f"## {heading}",
        "",
        f"Measured {res.started} with `{res.command}` ({res.minutes:.1f} min in all).",
        "",
        f"- Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory']} RAM, {mach['os']}.",
        f"- Load: before `{res.uptime_before}`; after `{res.uptime_after}`."
        + (f" {load_note}" if load_note else ""),
        f"- {feed_note(res.feed)}",
    ]


def blocks(*texts: str, title: str = "") -> list[str]:
    """Paragraphs or tables, each after a blank line, under a ``###`` title if given."""
    out = ["", f"### {title}"] if title else []
    for text in texts:
        out += ["", text]
    return out


def bullets(title: str, lines: Sequence[str]) -> list[str]:
    """A ``###`` subsection of bullet points."""
    return [*blocks(title=title), ""] + [f"- {line}" for line in lines]


def update_doc_section(name: str, body: str, path: Path = DOCS, after: str | None = None) -> None:
    """Replace (or add) the section between this benchmark's markers in ``path``.

    A new section goes right after the section ``after`` if that one is there, else at the
    end (a missing file starts with the introduction).
    """
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}\n"
    text = path.read_text() if path.exists() else DOC_INTRO
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    anchor = f"<!-- bench:{after}:end -->" if after else ""
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    elif anchor and anchor in text:
        cut = text.index(anchor) + len(anchor)
        if text.startswith("\n", cut):
            cut += 1
        text = text[:cut].rstrip("\n") + "\n\n" + block + text[cut:]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def add_doc_options(parser: argparse.ArgumentParser, section: str) -> None:
    """The ``--docs``, ``--no-docs`` and ``--render`` options every benchmark has."""
    parser.add_argument(
        "--docs",
        type=Path,
        default=DOCS,
        help=f"markdown file whose {section} section is rewritten (default docs/benchmarks.md)",
    )
    parser.add_argument("--no-docs", action="store_true", help="do not touch the docs")
    parser.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="measure nothing: print (and write to the docs) the results saved in JSON by an "
        "earlier run (every run saves them under integration/.work/benchmarks/)",
    )


def publish(res: Results, text: str, args: argparse.Namespace) -> None:
    """Print the section and, unless ``--no-docs``, write it into ``--docs``."""
    print(text)
    if not args.no_docs:
        update_doc_section(res.section, text, args.docs, after=res.section_after)
        log(f"wrote the {res.title} section of {args.docs}")
