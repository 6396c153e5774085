"""Spark's Kafka sink (``spark-sql-kafka-0-10``) for the pip PySpark, fetched from Maven Central.

PySpark from PyPI ships no Kafka connector. :func:`spark_kafka_jars` resolves
``org.apache.spark:spark-sql-kafka-0-10_<Scala>`` (2.13 on Spark 4, 2.12 on 3.5:
:func:`txsink.spark.versions.scala_binary`) for PySpark's own version with its runtime
dependencies that PySpark does not ship (kafka-clients, commons-pool2,
spark-token-provider-kafka-0-10), once, with ``mvn dependency:copy-dependencies`` on a
generated POM, into ``<jar cache>/spark-kafka-for-<version>/``. If Central has no jar of
that exact version, the newest release below it that it has is used, and the results say
so. Needs ``mvn`` (and network) only the first time.
"""

from __future__ import annotations

import re
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from benchmarks import _bench

from txsink.spark.versions import scala_binary

CENTRAL = "https://repo.maven.apache.org/maven2"
SPARK_KAFKA = ("org.apache.spark", f"spark-sql-kafka-0-10_{scala_binary()}")
TOKEN_PROVIDER = ("org.apache.spark", f"spark-token-provider-kafka-0-10_{scala_binary()}")


class SparkKafkaUnavailable(RuntimeError):
    """Spark's Kafka sink cannot be set up here; the message says why."""


def _release_key(version: str) -> tuple[int, ...] | None:
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(x) for x in m.groups()) if m else None


def _central_url(group: str, artifact: str, version: str | None = None) -> str:
    base = f"{CENTRAL}/{group.replace('.', '/')}/{artifact}"
    return (
        f"{base}/maven-metadata.xml"
        if version is None
        else (f"{base}/{version}/{artifact}-{version}.jar")
    )


def _jar_on_central(group: str, artifact: str, version: str) -> bool:
    request = urllib.request.Request(_central_url(group, artifact, version), method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, TimeoutError, OSError):
        return False


def _pick_version(group: str, artifact: str, wanted: str, notes: list[str]) -> str:
    """``wanted`` if Maven Central has its jar, else the newest release of the same major
    version below it that it has (a handful of HEAD requests at most)."""
    if _jar_on_central(group, artifact, wanted):
        return wanted
    try:
        with urllib.request.urlopen(_central_url(group, artifact), timeout=30) as response:
            listed = re.findall(r"<version>([^<]+)</version>", response.read().decode())
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        raise SparkKafkaUnavailable(
            f"{group}:{artifact}:{wanted} is not on Maven Central and its version list cannot "
            f"be read ({err})"
        ) from err
    want = _release_key(wanted)
    candidates = sorted(
        (v for v in listed if (k := _release_key(v)) and want and k[0] == want[0] and k < want),
        key=lambda v: _release_key(v) or (),
        reverse=True,
    )
    for version in candidates[:6]:
        if _jar_on_central(group, artifact, version):
            notes.append(
                f"{artifact}:{wanted} is not on Maven Central (newest there with a jar: "
                f"{version}); used {version}"
            )
            return str(version)
    raise SparkKafkaUnavailable(
        f"{group}:{artifact}:{wanted} is not on Maven Central, nor any {wanted.split('.', 1)[0]}.x "
        f"release below it with a jar (listed: {', '.join(listed[-8:])})"
    )


@dataclass
class SparkKafkaJars:
    jars: list[Path]
    versions: dict[str, str]
    notes: list[str]


def spark_kafka_jars(spark_version: str, cache: Path = _bench.JAR_CACHE) -> SparkKafkaJars:
    """spark-sql-kafka-0-10 for ``spark_version`` and its runtime deps that PySpark does not
    ship (kafka-clients, commons-pool2, spark-token-provider-kafka-0-10), cached.

    Fetched once with ``mvn dependency:copy-dependencies`` on a generated POM. If Central has
    no jar of that exact version, the newest release below it that it has is used (and said).
    """

    folder = cache / f"spark-kafka-for-{spark_version}"
    cached = _bench.cached_jars(folder)
    if cached is not None:
        jars, record = cached
        return SparkKafkaJars(jars, _bench.jar_versions(jars), list(record["notes"]))
    if shutil.which("mvn") is None:
        raise SparkKafkaUnavailable(
            f"mvn is not installed: cannot fetch {SPARK_KAFKA[1]}:{spark_version} (put it and "
            f"its deps into {folder} with a resolved.json, or install Maven)"
        )
    notes: list[str] = []
    _bench.log(f"resolving {SPARK_KAFKA[1]} for Spark {spark_version} on Maven Central")
    sql_kafka = _pick_version(*SPARK_KAFKA, spark_version, notes)
    token = _pick_version(*TOKEN_PROVIDER, sql_kafka, notes)
    # Spark's own jars come with PySpark: none of its group from Maven.
    failure = _bench.maven_copy_dependencies(
        folder,
        "spark-kafka-deps",
        [(*SPARK_KAFKA, sql_kafka), (*TOKEN_PROVIDER, token)],
        timeout=900,
        exclude="org.apache.spark",
    )
    if failure is not None:
        raise SparkKafkaUnavailable(f"mvn could not fetch the Kafka connector: {failure}")
    jars = sorted(folder.glob("*.jar"))
    _bench.save_jars(folder, jars, notes=notes)
    return SparkKafkaJars(jars, _bench.jar_versions(jars), notes)
