"""Shared helpers for the benchmarks in this folder: the one measure and report module
every benchmark uses.

A benchmark is a module ``integration/benchmarks/<name>.py``, or a package
``integration/benchmarks/<name>/`` (one module per writer, its data, its report, with a
``__main__``), with a ``main(argv)``; ``integration/benchmarks/run <name> [args]`` brings
up the service it needs and runs it as ``python -m benchmarks.<name>``. Names starting
with ``_`` are helpers, not benchmarks. A benchmark keeps only what it measures; this
package holds the rest:

- ``cpu``: :class:`CpuMeter`, CPU seconds by role (driver, JVM, Python workers and their
  threads, each server, everything else) from ``/proc``;
- ``epochs``: a streaming query metered epoch by epoch (a listener's CPU snapshot at each
  epoch's end), for benchmarks that run streams;
- ``feed``: the session settings every writer of a run gets (``--feed same|defaults``);
- ``measure``: timing one run (:func:`timed_run`), the order of the repeats (:func:`rotated`,
  :func:`swap_on_odd`), checking an output (:func:`output_problems`) and voiding a run
  whose output is wrong, the progress log;
- ``results``: :class:`Results`, every run with medians, rates, ratios and paired
  (run-by-run) ratios against the natural alternative, CPU per row by role, saved as JSON
  for ``--render``;
- ``report``: the markdown table writer and the tables (throughput, phases, ratios),
  medians and ranges in ms, the section's shared lines, writing a section of
  docs/benchmarks.md;
- ``cli``: :class:`BenchParser` with the shared options and :func:`main`, the run from
  start to report;
- ``env``: the machine record, the Spark session every writer of a run shares, the cached
  input frame, shipping a benchmark's package into Spark's tasks;
- ``maven``: jars for the JVM-side writers from Maven Central.

Code that runs inside Spark tasks must not import this package (the Python workers do not
have ``integration/`` on their path): keep task functions self-contained, and ship a
benchmark package's task code by value (:func:`pickle_by_value`).
"""

from __future__ import annotations

from .cli import BenchParser, Server, main
from .cpu import CpuMeter, ProcStat, server_pids
from .env import REPO, cached_frame, machine, pickle_by_value, spark_session
from .feed import FEEDS, add_feed_option, feed_conf, feed_note
from .maven import (
    JAR_CACHE,
    cached_jars,
    jar_artifact,
    jar_version,
    jar_versions,
    maven_copy_dependencies,
    maven_jar,
    save_jars,
)
from .measure import (
    Measurement,
    first_line,
    load1,
    log,
    log_run,
    median,
    output_problems,
    rotated,
    rounded,
    stopwatch,
    swap_on_odd,
    task_rows,
    timed_run,
    uptime,
    void_if,
)
from .report import (
    DOC_INTRO,
    DOCS,
    Column,
    add_doc_options,
    blocks,
    bullets,
    cpu_blocks,
    cpu_table,
    fmt_rate,
    fmt_secs,
    header,
    markdown_table,
    min_median_max,
    ms,
    paired_cell,
    phase_table,
    publish,
    ratio_cell,
    ratio_range_cell,
    spread,
    throughput_table,
    update_doc_section,
)
from .results import PHASES, SAVED, Results, cpu_per_row

__all__ = [
    "DOCS",
    "DOC_INTRO",
    "FEEDS",
    "JAR_CACHE",
    "PHASES",
    "REPO",
    "SAVED",
    "BenchParser",
    "Column",
    "CpuMeter",
    "Measurement",
    "ProcStat",
    "Results",
    "Server",
    "add_doc_options",
    "add_feed_option",
    "blocks",
    "bullets",
    "cached_frame",
    "cached_jars",
    "cpu_blocks",
    "cpu_per_row",
    "cpu_table",
    "feed_conf",
    "feed_note",
    "first_line",
    "fmt_rate",
    "fmt_secs",
    "header",
    "jar_artifact",
    "jar_version",
    "jar_versions",
    "load1",
    "log",
    "log_run",
    "machine",
    "main",
    "markdown_table",
    "maven_copy_dependencies",
    "maven_jar",
    "median",
    "min_median_max",
    "ms",
    "output_problems",
    "paired_cell",
    "phase_table",
    "pickle_by_value",
    "publish",
    "ratio_cell",
    "ratio_range_cell",
    "rotated",
    "rounded",
    "save_jars",
    "server_pids",
    "spark_session",
    "spread",
    "stopwatch",
    "swap_on_odd",
    "task_rows",
    "throughput_table",
    "timed_run",
    "update_doc_section",
    "uptime",
    "void_if",
]
