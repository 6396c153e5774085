"""The second readers' jars and interpreters, by Spark line: which Delta Lake and Iceberg
release reads the connectors' tables on each line, and which Python runs the reader.

The tests that read the Delta and Iceberg connectors' tables back with the projects' own
Spark code (``test_delta_second_reader.py``, ``test_iceberg_second_reader.py``) run the
reader (``delta_spark_reader.py``, ``iceberg_spark_reader.py``) in a child process:

1. with ``TXSINK_DELTA_SPARK_PYTHON`` / ``TXSINK_ICEBERG_SPARK_PYTHON`` if set;
2. else with this interpreter, when a release of the project exists for its Spark line
   (3.5 to 4.2 for Delta, 3.5 to 4.1 for Iceberg): each line's venv of the compatibility
   matrix reads with its own Spark (``./dev matrix``);
3. else (txsink's newest line, which no release supports yet) with the dedicated venv
   (``./dev delta-reader`` / ``./dev iceberg-reader``) or, failing that, the newest matrix
   venv (``.venv-spark-X.Y``) of a line that has one.

The jar's Scala suffix follows :func:`txsink.spark.versions.scala_binary` for the reader's
line (2.12 on 3.5: ``delta-spark_2.12``, ``iceberg-spark-runtime-3.5_2.12``). The release
of each line is the newest on Maven Central whose POM names that Spark line (checked
2026-11-28): Delta 3.3.3 (Spark 3.5.6), 4.0.1 (4.0.1), 4.3.1 (4.1.0), 4.4.0 (4.2.0);
Iceberg's runtime is built per Spark line (``iceberg-spark-runtime-4.0_2.13`` stops at
1.11.0). ``TXSINK_DELTA_SPARK_PACKAGE`` / ``TXSINK_ICEBERG_SPARK_VERSION`` still choose
another release.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from txsink.spark.versions import scala_binary, spark_version

__all__ = ["DELTA", "ICEBERG", "Reader", "delta_reader", "iceberg_reader"]

ROOT = Path(__file__).resolve().parent.parent

Line = tuple[int, int]

#: Delta Lake's release for each Spark line.
DELTA: dict[Line, str] = {(3, 5): "3.3.3", (4, 0): "4.0.1", (4, 1): "4.3.1", (4, 2): "4.4.0"}
#: Apache Iceberg's Spark runtime release for each Spark line.
ICEBERG: dict[Line, str] = {(3, 5): "1.12.0", (4, 0): "1.11.0", (4, 1): "1.12.0"}
#: The PostgreSQL JDBC driver of Iceberg's JDBC catalog (any line).
POSTGRES_JDBC = "org.postgresql:postgresql:42.7.14"
#: Maven Central alone for the readers' jars (``spark.jars.ivySettings``; the file says why).
IVY_SETTINGS = ROOT / "integration" / "ivysettings.xml"


@dataclass(frozen=True)
class Reader:
    """A second reader: the Python that runs it, its Spark line, and the environment that
    names its jars (``PYSPARK_PYTHON`` and the package variable the reader reads)."""

    python: str
    line: Line
    env: dict[str, str] = field(default_factory=dict)

    @property
    def elsewhere(self) -> str | None:
        """What the page says when this reader runs another Spark line than the writer's
        (None when it is the same line)."""
        if self.line == spark_version()[:2]:
            return None
        where = Path(self.python)
        shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
        return (
            f"read with Spark {self.line[0]}.{self.line[1]} ({shown}): no release for "
            f"Spark {'.'.join(map(str, spark_version()[:2]))} yet"
        )


def delta_package(line: Line) -> str:
    """``io.delta:delta-spark_<scala>:<release>`` for Spark ``line``."""
    return f"io.delta:delta-spark_{scala_binary(line)}:{DELTA[line]}"


def iceberg_packages(line: Line) -> str:
    """Iceberg's Spark runtime for ``line``, its AWS bundle (S3FileIO) and the JDBC driver,
    as ``spark.jars.packages`` takes them."""
    version = os.environ.get("TXSINK_ICEBERG_SPARK_VERSION") or ICEBERG[line]
    runtime = f"iceberg-spark-runtime-{line[0]}.{line[1]}_{scala_binary(line)}"
    return ",".join(
        [
            f"org.apache.iceberg:{runtime}:{version}",
            f"org.apache.iceberg:iceberg-aws-bundle:{version}",
            POSTGRES_JDBC,
        ]
    )


def delta_reader() -> Reader | str:
    """The Delta reader for this run, or why there is none."""
    found = _reader("TXSINK_DELTA_SPARK_PYTHON", DELTA, ".venv-delta-spark", "./dev delta-reader")
    if isinstance(found, str):
        return found
    package = os.environ.get("TXSINK_DELTA_SPARK_PACKAGE") or delta_package(found.line)
    return Reader(found.python, found.line, {**found.env, "TXSINK_DELTA_SPARK_PACKAGE": package})


def iceberg_reader() -> Reader | str:
    """The Iceberg reader for this run, or why there is none."""
    found = _reader(
        "TXSINK_ICEBERG_SPARK_PYTHON", ICEBERG, ".venv-iceberg-spark", "./dev iceberg-reader"
    )
    if isinstance(found, str):
        return found
    packages = iceberg_packages(found.line)
    return Reader(
        found.python, found.line, {**found.env, "TXSINK_ICEBERG_SPARK_PACKAGES": packages}
    )


def _reader(variable: str, releases: dict[Line, str], venv: str, make: str) -> Reader | str:
    chosen = os.environ.get(variable)
    if not chosen:
        if spark_version()[:2] in releases:
            chosen = sys.executable
        else:
            candidates = [ROOT / venv / "bin" / "python"] + [
                ROOT / f".venv-spark-{a}.{b}" / "bin" / "python"
                for a, b in sorted(releases, reverse=True)
            ]
            chosen = next((str(p) for p in candidates if p.exists()), "")
    if not chosen:
        lines = ", ".join(f"{a}.{b}" for a, b in sorted(releases))
        return f"no Python with a Spark line of {lines}: make one with {make} or ./dev matrix"
    line = _line_of(chosen)
    if line not in releases:
        return f"{chosen} has Spark {line[0]}.{line[1]}: no release for it (spark_jars.py)"
    env = {
        "PYSPARK_PYTHON": chosen,
        "PYSPARK_DRIVER_PYTHON": chosen,
        "TXSINK_SPARK_IVY_SETTINGS": str(IVY_SETTINGS),
    }
    return Reader(chosen, line, env)


def _line_of(python: str) -> Line:
    if python == sys.executable:
        major, minor, _ = spark_version()
        return major, minor
    done = subprocess.run(
        [python, "-c", "import pyspark; print(pyspark.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    found = re.match(r"(\d+)\.(\d+)", done.stdout.strip())
    if found is None:
        raise RuntimeError(f"{python}: cannot read PySpark's version from {done.stdout!r}")
    return int(found[1]), int(found[2])
