"""Jars for the JVM-side writers, from Maven Central with ``mvn``, cached between runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .measure import log

JAR_CACHE = Path(os.environ.get("TXSINK_BENCH_JARS", Path.home() / ".cache/txsink-bench/jars"))


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


# Only Maven Central: a mirror named in some parent POM (Spark's names a GCS one) may not
# resolve from here.
_MAVEN_SETTINGS = """<settings><mirrors><mirror><id>central-only</id><mirrorOf>*</mirrorOf>
<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>
"""
_JAR_NAME = re.compile(r"(.+?)-(\d+(?:\.\d+)+(?:[-.][\w.]+)?)\.jar")


def jar_artifact(jar: str) -> str:
    """``hadoop-aws-3.5.0.jar`` -> ``hadoop-aws`` (the name without its version)."""
    m = _JAR_NAME.fullmatch(jar)
    return m.group(1) if m else jar


def jar_version(jar: str) -> str | None:
    """``hadoop-aws-3.5.0.jar`` -> ``3.5.0``; None for a name without a version."""
    m = _JAR_NAME.fullmatch(jar)
    return m.group(2) if m else None


def jar_versions(jars: Sequence[Path]) -> dict[str, str]:
    """Artifact -> version of each jar whose file name carries a version."""
    return {
        jar_artifact(j.name): version for j in jars if (version := jar_version(j.name)) is not None
    }


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
