"""hadoop-aws (Spark's ``s3a://`` filesystem) for the pip PySpark, fetched from Maven Central.

PySpark from PyPI ships Hadoop's client jars (``hadoop-client-api-<v>.jar``) but not
``hadoop-aws`` nor the AWS SDK it needs. :func:`hadoop_aws_jars` fetches
``org.apache.hadoop:hadoop-aws:<v>`` for exactly that Hadoop version, with its runtime
dependencies (the AWS SDK v2 ``bundle`` jar among them, several hundred MB), once, with
``mvn dependency:copy-dependencies`` on a generated POM, into
``<jar cache>/hadoop-aws-<v>/``; jars PySpark already has are dropped. Later calls read the
cached folder. Needs ``mvn`` (and network) only the first time.

:func:`s3a_settings` gives the Hadoop settings for an S3-compatible endpoint (set them on
the session's ``hadoopConfiguration()``, or prefix them with ``spark.hadoop.``): path-style
access, the endpoint and its region. Credentials are *not* in them: s3a's default provider
chain reads ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` from the environment the JVM
inherits, so no secret sits in Spark's or Hadoop's configuration (which may be logged or
shown).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from benchmarks import _bench

HADOOP_AWS = ("org.apache.hadoop", "hadoop-aws")


class HadoopAwsUnavailable(RuntimeError):
    """s3a cannot be set up here; the message says why."""


@dataclass
class HadoopAwsJars:
    hadoop: str
    jars: list[Path]

    def versions(self) -> dict[str, str]:
        return _bench.jar_versions(self.jars)


def pyspark_hadoop_version() -> str:
    """The Hadoop version of the pip PySpark's ``hadoop-client-api-<v>.jar``."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    for jar in sorted(jars.glob("hadoop-client-api-*.jar")):
        version = _bench.jar_version(jar.name)
        if version is not None:
            return version
    raise HadoopAwsUnavailable(f"no hadoop-client-api-*.jar in {jars}: cannot tell the version")


def hadoop_aws_jars(cache: Path = _bench.JAR_CACHE) -> HadoopAwsJars:
    """hadoop-aws for PySpark's Hadoop version and its runtime deps, cached (see module doc)."""

    version = pyspark_hadoop_version()
    folder = cache / f"hadoop-aws-{version}"
    cached = _bench.cached_jars(folder)
    if cached is not None:
        return HadoopAwsJars(version, cached[0])
    if shutil.which("mvn") is None:
        raise HadoopAwsUnavailable(
            f"mvn is not installed: cannot fetch {':'.join(HADOOP_AWS)}:{version} and the AWS "
            f"SDK bundle (install Maven, or put the jars into {folder} with a resolved.json)"
        )
    _bench.log(f"fetching {':'.join(HADOOP_AWS)}:{version} and its AWS SDK from Maven Central")
    failure = _bench.maven_copy_dependencies(
        folder, "hadoop-aws-deps", [(*HADOOP_AWS, version)], timeout=1800
    )
    if failure is not None:
        raise HadoopAwsUnavailable(f"mvn could not fetch hadoop-aws {version}: {failure}")
    jars = sorted(folder.glob("*.jar"))
    if not any(j.name.startswith("hadoop-aws-") for j in jars):
        raise HadoopAwsUnavailable(f"mvn ran but {folder} holds no hadoop-aws jar")
    _bench.save_jars(folder, jars)
    return HadoopAwsJars(version, jars)


def s3a_settings(endpoint: str, region: str) -> dict[str, str]:
    """Hadoop settings (``fs.s3a.*``) for an S3-compatible ``endpoint``."""
    parts = urlsplit(endpoint)
    return {
        "fs.s3a.endpoint": endpoint,
        "fs.s3a.endpoint.region": region,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": str(parts.scheme == "https").lower(),
        # No bucket-existence probe at filesystem start (the benchmark made the bucket).
        "fs.s3a.bucket.probe": "0",
    }
