"""Shared helpers for the benchmarks in this folder.

Each benchmark is a module ``integration/benchmarks/<name>.py`` with a ``main(argv)``;
``integration/benchmarks/run <name> [args]`` brings up the service it needs and runs it as
``python -m benchmarks.<name>``. Modules whose name starts with ``_`` are helpers, not
benchmarks. Code that runs inside Spark tasks must not import this module (the Python
workers do not have ``integration/`` on their path): keep task functions self-contained.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks.md"
JAR_CACHE = Path(os.environ.get("TXSINK_BENCH_JARS", Path.home() / ".cache/txsink-bench/jars"))

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


# -- timing --------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One timed run of one writer."""

    writer: str
    partitions: int
    rows: int
    seconds: float
    load_before: float
    load_after: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def load1() -> float:
    """The 1-minute load average."""
    return os.getloadavg()[0]


def uptime() -> str:
    """``uptime``'s line (falls back to the load averages)."""
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_table() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and its reaped children)."""
    out: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        # fields[1] = ppid; [11..14] = utime, stime, cutime, cstime (clock ticks)
        ticks = sum(int(x) for x in fields[11:15])
        out[int(entry.name)] = (int(fields[1]), ticks / _TICK)
    return out


def _tree_cpu(table: dict[int, tuple[int, float]], root: int) -> float:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            total += table[pid][1]
        todo.extend(children.get(pid, []))
    return total


def _machine_busy() -> float:
    """CPU seconds all processes used since boot (user, nice, system, irq, softirq, steal)."""
    first = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in first[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


class CpuMeter:
    """CPU seconds used by process trees (e.g. this driver with its JVM and Python workers,
    the database server) and by everything else on the machine, between two snapshots.

    A tree's count includes children that exited (reaped into their parent's cutime);
    a server's tree also holds other clients' backends, so it is an upper bound.
    """

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots

    def snapshot(self) -> dict[str, float]:
        if not Path("/proc/stat").exists():
            return {}
        table = _proc_table()
        snap = {name: _tree_cpu(table, pid) for name, pid in self.roots.items()}
        snap["machine"] = _machine_busy()
        return snap

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        """Seconds per root, plus ``others``: the machine's busy time not in any root."""
        if not before or not after:
            return {}
        out = {k: after[k] - before[k] for k in before if k != "machine"}
        out["others"] = max(0.0, after["machine"] - before["machine"] - sum(out.values()))
        return out


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """``with stopwatch() as t: ...``; afterwards ``t[0]`` holds the wall-clock seconds."""
    out: list[float] = []
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out.append(time.perf_counter() - t0)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def log(message: str) -> None:
    """Progress on stderr (stdout carries the result tables)."""
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


# -- output --------------------------------------------------------------------------------


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


def update_doc_section(name: str, body: str, path: Path = DOCS) -> None:
    """Replace (or append) the section between this benchmark's markers in ``path``."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{body.strip()}\n{end}\n"
    text = path.read_text() if path.exists() else DOC_INTRO
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- environment ---------------------------------------------------------------------------


def machine() -> dict[str, str]:
    """CPU, cores, memory, OS and Java/Python versions, for the record."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
                break
    except OSError:
        pass
    java = "unknown"
    if shutil.which("java"):
        proc = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, check=False, timeout=30
        )
        first = (proc.stderr or proc.stdout).strip().splitlines()
        java = first[0] if first else java
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "java": java,
    }


def maven_jar(group: str, artifact: str, version: str, cache: Path = JAR_CACHE) -> Path:
    """A jar from Maven Central, cached in ``cache`` (fetched once with ``mvn dependency:copy``)."""
    jar = cache / f"{artifact}-{version}.jar"
    if jar.exists():
        return jar
    cache.mkdir(parents=True, exist_ok=True)
    local = Path.home() / ".m2/repository" / group.replace(".", "/") / artifact / version / jar.name
    if not local.exists():
        if shutil.which("mvn") is None:
            raise SystemExit(
                f"need {group}:{artifact}:{version} but mvn is not installed: put {jar.name} "
                f"into {cache} (or set TXSINK_BENCH_JARS to a folder holding it)"
            )
        log(f"fetching {group}:{artifact}:{version} from Maven Central")
        subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "dependency:copy",
                f"-Dartifact={group}:{artifact}:{version}:jar",
                f"-DoutputDirectory={cache}",
            ],
            cwd=cache,
            check=True,
            timeout=600,
        )
    if not jar.exists():
        shutil.copyfile(local, jar)
    return jar


def spark_session(app_name: str, *, jars: Sequence[Path] = (), driver_memory: str = "2g") -> Any:
    """A local SparkSession for benchmarks.

    The settings of :func:`txsink.localspark.local_spark` (``local[2]``, UI off, 2 shuffle
    partitions, workers run this interpreter) except: full JIT (no ``fast_start``: C1-only
    would handicap the JVM-side writers), ``driver_memory`` for the cached input, the given
    jars, and the session time zone pinned to UTC.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
    )
    if jars:
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_MAVEN_SETTINGS = """<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>
<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>
"""
_JAR_NAME = re.compile(r"(.+?)-(\d+(?:\.\d+)+(?:[-.][\w.]+)?)\.jar")


def jar_artifact(jar: str) -> str:
    """``hadoop-aws-3.5.0.jar`` -> ``hadoop-aws`` (the name without its version)."""
    m = _JAR_NAME.fullmatch(jar)
    return m.group(1) if m else jar


def maven_copy_dependencies(pom: str, folder: Path, timeout: float) -> str | None:
    """Resolve ``pom``'s runtime dependencies from Maven Central into a fresh ``folder``,
    then drop the jars PySpark ships itself. None on success, else mvn's last words."""
    import pyspark

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="txsink-bench-mvn-") as work:
        Path(work, "pom.xml").write_text(pom)
        Path(work, "settings.xml").write_text(_MAVEN_SETTINGS)
        proc = subprocess.run(
            [
                "mvn",
                "-q",
                "-B",
                "-s",
                "settings.xml",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={folder}",
            ],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    if proc.returncode != 0:
        return " ".join((proc.stdout + proc.stderr).split()[-60:])
    shipped = {jar_artifact(j.name) for j in (Path(pyspark.__file__).parent / "jars").iterdir()}
    for jar in list(folder.glob("*.jar")):
        if jar_artifact(jar.name) in shipped:
            jar.unlink()  # PySpark has its own (Scala, Hadoop client, codecs, ...)
    return None


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
