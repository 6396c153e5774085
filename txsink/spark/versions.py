"""What differs between the Spark lines txsink runs on (PySpark 3.5 LTS through 4.x), once.

Nothing else in txsink asks which Spark it runs on: each API that differs has one function
here, and the rest of the code calls it. Tests pin each line's behaviour
(``tests/test_spark_versions.py``); the side venv of a line is made by ``./dev spark-line
X.Y`` (docs/testing.md).

The differences, by the line that changed them:

- **Arrow schema of a DataFrame** (:func:`arrow_schema`): ``to_arrow_schema(schema)``
  converts timestamps to UTC and takes no option on 3.5; 4.0 and 4.1 take
  ``timestamp_utc=``; 4.2+ convert in a given time zone (``timezone=``).
- **The Arrow batch byte cap** (:func:`arrow_byte_cap_setting`):
  ``spark.sql.execution.arrow.maxBytesPerBatch`` exists from 4.0 (3.5's SQLConf has only
  ``maxRecordsPerBatch``, which cuts batches by rows alone, as txsink wants them).
- **The Python Data Source API** (:func:`require_data_source`): ``pyspark.sql.datasource``
  (``writeStream.format("txsink")``) is new in 4.0; on 3.5 txsink refuses the format with
  :class:`~txsink.errors.UnsupportedSparkError`, naming ``foreachBatch``.
- **The streaming Arrow writer of a Data Source** (:func:`require_stream_data_source`,
  :func:`stream_writer_base`): ``DataSourceStreamArrowWriter``, which hands a streaming
  writer's tasks Arrow batches as txsink's writer takes them, is new in 4.1; on 4.0
  ``writeStream.format("txsink")`` is refused (static ``df.write.format("txsink")``, through
  ``DataSourceArrowWriter``, runs on 4.0). Found by the compatibility matrix on 4.0.5.
- **Spark Connect's server** (:func:`connect_server_packages`): PySpark 4.x's pip package
  ships the server's jar; 3.5's does not (``--packages
  org.apache.spark:spark-connect_2.12:<version>``).
- **Scala binary version of the jars** (:func:`scala_binary`): 2.12 on 3.5, 2.13 on 4.x
  (``spark-sql-kafka-0-10_2.12``, ``iceberg-spark-runtime-3.5_2.12``...).
- **A Spark error's condition**: ``getCondition()`` on 4.x, ``getErrorClass()`` on 3.5.
  Read by :func:`txsink.errors.spark_condition`, in the base API, because the protocol room
  (which may not import this one) reads it too; it asks the exception, not the version.

The same on every supported line, so nothing branches on them: ``mapInArrow(...,
barrier=True)`` (3.5.0+, classic and Connect), ``DataFrame.sparkSession`` (Connect too),
``foreachBatch`` under Connect, ``StreamingQueryListener`` (``onQueryIdle`` has a default),
the JVM's ``SharedState.activeStreamingQueries`` and ``StreamExecution`` classes that the
lease and the query-mode guard read through py4j.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import TYPE_CHECKING, Any

from txsink.errors import UnsupportedSparkError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "DATA_SOURCE_LINE",
    "STREAM_DATA_SOURCE_LINE",
    "arrow_byte_cap_setting",
    "arrow_schema",
    "connect_server_packages",
    "data_source_refusal",
    "has_data_source",
    "require_data_source",
    "require_stream_data_source",
    "scala_binary",
    "spark_line",
    "spark_version",
    "stream_writer_base",
]

#: The first Spark line with the Python Data Source API (``format("txsink")``).
DATA_SOURCE_LINE = (4, 0)
#: The first Spark line whose streaming Data Source writer takes Arrow batches.
STREAM_DATA_SOURCE_LINE = (4, 1)


@functools.cache
def spark_version() -> tuple[int, int, int]:
    """The installed PySpark's version as numbers (``3.5.9`` -> ``(3, 5, 9)``; a
    pre-release's suffix dropped)."""
    import pyspark

    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", pyspark.__version__)
    if found is None:  # pragma: no cover - PySpark always has a numeric version
        raise RuntimeError(f"cannot read PySpark's version {pyspark.__version__!r}")
    return int(found[1]), int(found[2]), int(found[3] or 0)


def spark_line() -> str:
    """The installed Spark line, ``"3.5"`` or ``"4.3"``."""
    major, minor, _ = spark_version()
    return f"{major}.{minor}"


def _at_least(major: int, minor: int) -> bool:
    return spark_version()[:2] >= (major, minor)


@functools.cache
def _arrow_schema_options() -> frozenset[str]:
    """The keyword arguments this PySpark's ``to_arrow_schema`` takes (read from its
    signature, so a patch release that backports one is seen as it is)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return frozenset(inspect.signature(to_arrow_schema).parameters)


def arrow_schema(schema: Any, timezone: str | None) -> pa.Schema:
    """A Spark ``StructType`` as the Arrow schema txsink's tasks see: timestamps in
    ``timezone`` (the session's) where this PySpark converts in a given zone (4.2+), in
    UTC before it (``timestamp_utc=True`` on 4.0 and 4.1, the only way on 3.5).

    Raises what PySpark raises for a type Arrow cannot carry (a ``TypeError`` or
    ``ValueError`` of its own, PySpark's error classes on 4.x)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    options = _arrow_schema_options()
    if "timezone" in options:
        return to_arrow_schema(schema, timezone=timezone)  # type: ignore[call-arg, unused-ignore]
    if "timestamp_utc" in options:
        return to_arrow_schema(schema, timestamp_utc=True)  # type: ignore[call-arg, unused-ignore]
    return to_arrow_schema(schema)


def arrow_byte_cap_setting() -> str | None:
    """The setting of Spark's cap on the bytes of one Arrow batch handed to a Python task
    (``spark.sql.execution.arrow.maxBytesPerBatch``, from 4.0); ``None`` on a Spark
    without one (3.5: batches are cut by ``maxRecordsPerBatch`` only)."""
    return "spark.sql.execution.arrow.maxBytesPerBatch" if _at_least(4, 0) else None


def has_data_source() -> bool:
    """Whether this PySpark has the Python Data Source API (4.0+)."""
    return _at_least(*DATA_SOURCE_LINE)


def require_data_source() -> None:
    """Refuse ``format("txsink")`` on a Spark without the Python Data Source API (before
    4.0): :func:`data_source_refusal`."""
    if not has_data_source():
        raise data_source_refusal()


def data_source_refusal() -> UnsupportedSparkError:
    """The error that refuses ``format("txsink")`` here, with the way that works instead."""
    import pyspark

    return UnsupportedSparkError(
        f"writeStream.format('txsink') (the Python Data Source) needs Spark 4.0 or newer; "
        f"this is PySpark {pyspark.__version__}. On Spark 3.5 write through foreachBatch: "
        "df.writeStream.foreachBatch(txsink.Coordinator([sink], log=...)) "
        "(docs/quickstart.md), or coordinator.write(df) for a static DataFrame",
        phase="check",
    )


def require_stream_data_source() -> None:
    """Refuse ``writeStream.format("txsink")`` on a Spark without the Data Source API
    (3.5: :func:`data_source_refusal`) or without its streaming Arrow writer (4.0)."""
    require_data_source()
    if not _at_least(*STREAM_DATA_SOURCE_LINE):
        import pyspark

        raise UnsupportedSparkError(
            f"writeStream.format('txsink') needs Spark 4.1 or newer (its streaming Data "
            f"Source writer takes Arrow batches from 4.1); this is PySpark "
            f"{pyspark.__version__}. On Spark 4.0 write the stream through foreachBatch: "
            "df.writeStream.foreachBatch(txsink.Coordinator([sink], log=...)) "
            "(docs/quickstart.md); static df.write.format('txsink') runs on 4.0",
            phase="check",
        )


def stream_writer_base() -> type:
    """The base class of txsink's streaming Data Source writer: PySpark's
    ``DataSourceStreamArrowWriter`` (4.1+). On 4.0, which has none, its
    ``DataSourceStreamWriter`` stands in, so that the format's module imports there (static
    writes run on 4.0); :func:`require_stream_data_source` refuses a stream before any
    writer is made."""
    from pyspark.sql import datasource

    if _at_least(*STREAM_DATA_SOURCE_LINE):
        return datasource.DataSourceStreamArrowWriter  # type: ignore[attr-defined, no-any-return, unused-ignore]
    return datasource.DataSourceStreamWriter


def scala_binary(line: tuple[int, int] | None = None) -> str:
    """The Scala binary version of this Spark's jars (or of Spark ``line``, e.g. ``(3, 5)``,
    for a second reader in another venv): ``"2.12"`` (3.5) or ``"2.13"`` (4.x); the suffix
    of the Maven artifacts that must match it."""
    if line is None:
        return "2.13" if _at_least(4, 0) else "2.12"
    return "2.13" if line >= (4, 0) else "2.12"


def connect_server_packages() -> list[str]:
    """Maven coordinates a Spark Connect server needs besides PySpark's own jars: none on
    4.x (the pip package ships ``spark-connect``), the server's jar on 3.5."""
    if _at_least(4, 0):
        return []
    major, minor, patch = spark_version()
    return [f"org.apache.spark:spark-connect_{scala_binary()}:{major}.{minor}.{patch}"]
