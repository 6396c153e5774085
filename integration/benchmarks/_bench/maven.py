"""Jars for the JVM-side writers, from Maven Central with ``mvn``, cached between runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>txsink.bench</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <dependencies>
{deps}
  </dependencies>
</project>
"""
_DEP = """    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>{exclusions}
    </dependency>"""
_EXCLUDE = """
      <exclusions><exclusion><groupId>{group}</groupId><artifactId>*</artifactId>
      </exclusion></exclusions>"""
_RESOLVED = "resolved.json"


def maven_copy_dependencies(
    folder: Path,
    name: str,
    deps: Sequence[tuple[str, str, str]],
    timeout: float,
    *,
    exclude: str | None = None,
) -> str | None:
    """Resolve ``deps`` (group, artifact, version) with their runtime dependencies from
    Maven Central into a fresh ``folder`` (a POM named ``name`` lists them; ``exclude``
    drops every transitive dependency of that group), then drop the jars PySpark ships
    itself. None on success, else mvn's last words."""
    import pyspark

    exclusions = _EXCLUDE.format(group=exclude) if exclude else ""
    pom = _POM.format(
        name=name,
        deps="\n".join(
            _DEP.format(group=g, artifact=a, version=v, exclusions=exclusions) for g, a, v in deps
        ),
    )

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


def cached_jars(folder: Path) -> tuple[list[Path], dict[str, Any]] | None:
    """The jars an earlier :func:`save_jars` recorded in ``folder`` with the rest of its
    record, or None if there is none or a jar is missing (then resolve again)."""
    done = folder / _RESOLVED
    if not done.exists():
        return None
    record: dict[str, Any] = json.loads(done.read_text())
    jars = [folder / name for name in record["jars"]]
    return (jars, record) if all(j.exists() for j in jars) else None


def save_jars(folder: Path, jars: Sequence[Path], **record: Any) -> None:
    """Record the resolved ``jars`` (and ``record``) so later runs skip Maven."""
    (folder / _RESOLVED).write_text(json.dumps({"jars": [j.name for j in jars], **record}))
