"""Shared helpers for the benchmarks in this folder.

Each benchmark is a module ``integration/benchmarks/<name>.py`` with a ``main(argv)``;
``integration/benchmarks/run <name> [args]`` brings up the service it needs and runs it as
``python -m benchmarks.<name>``. Modules whose name starts with ``_`` are helpers, not
benchmarks. A benchmark keeps only what it measures; this package holds the rest:

- ``measure``: timing one run (:func:`timed_run`), CPU per process tree, voiding a run
  whose output is wrong, the progress log;
- ``results``: :class:`Results`, every run with medians, rates and ratios against the
  natural alternative, saved as JSON for ``--render``;
- ``report``: markdown tables (throughput, phases, ratios), the section's shared lines,
  writing a section of docs/benchmarks.md;
- ``cli``: :class:`BenchParser` with the shared options and :func:`main`, the run from
  start to report;
- ``env``: the machine record, the Spark session and the cached input frame;
- ``maven``: jars for the JVM-side writers from Maven Central.

Code that runs inside Spark tasks must not import this package (the Python workers do not
have ``integration/`` on their path): keep task functions self-contained.
"""

from __future__ import annotations

from .cli import BenchParser, Server, main
from .env import REPO, cached_frame, machine, spark_session
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
    CpuMeter,
    Measurement,
    load1,
    log,
    log_run,
    median,
    rounded,
    stopwatch,
    swap_on_odd,
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
    fmt_rate,
    fmt_secs,
    header,
    markdown_table,
    phase_table,
    publish,
    ratio_cell,
    throughput_table,
    update_doc_section,
)
from .results import PHASES, SAVED, Results

__all__ = [
    "DOCS",
    "DOC_INTRO",
    "JAR_CACHE",
    "PHASES",
    "REPO",
    "SAVED",
    "BenchParser",
    "Column",
    "CpuMeter",
    "Measurement",
    "Results",
    "Server",
    "add_doc_options",
    "blocks",
    "bullets",
    "cached_frame",
    "cached_jars",
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
    "phase_table",
    "publish",
    "ratio_cell",
    "rounded",
    "save_jars",
    "spark_session",
    "stopwatch",
    "swap_on_odd",
    "throughput_table",
    "timed_run",
    "update_doc_section",
    "uptime",
    "void_if",
]
