"""``df.writeStream.format("txsink")``: txsink as a PySpark Python Data Source.

One format for every connector, chosen by the ``connector`` option, so the core never
names one and a third-party connector works as soon as it is installed::

    spark.dataSource.register(TxsinkDataSource)       # or automatic: see pyspark_txsink
    (df.writeStream.format("txsink")
       .option("connector", "files").option("path", "/data/out").option("uid", "out")
       .option("log", "/data/txsink-log").option("checkpointLocation", "/data/ckpt")
       .start())

The other options are the sink's constructor parameters (:mod:`txsink.datasource.options`). The
protocol is the coordinator's (:mod:`txsink.datasource.epoch`): planning recovers and picks the
round, the tasks prepare (:func:`txsink.protocol.task.run_partition`), ``commit`` decides and
commits, ``abort`` voids. One sink per query; cross-system atomicity stays with
``foreachBatch(Coordinator([...]))``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigurationError, spark_condition
from txsink.observe.failure import install_excepthook
from txsink.observe.logs import install_console
from txsink.spark import versions as _versions
from txsink.spark.jvmlog import deny_told_records

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from txsink.datasource.source import TxsinkCommitMessage, TxsinkDataSource

__all__ = [
    "FORMAT",
    "TxsinkCommitMessage",
    "TxsinkDataSource",
    "error_text",
    "format_not_found",
    "register",
]

#: The format name: ``df.writeStream.format("txsink")``.
FORMAT = "txsink"

#: The names :mod:`txsink.datasource.source` defines, imported on first use: that module
#: subclasses ``pyspark.sql.datasource`` (Spark 4.0+), and this package must import on
#: Spark 3.5 too (the runner and the CLI read :func:`format_not_found` there).
_SOURCE_NAMES = ("TxsinkCommitMessage", "TxsinkDataSource")


def __getattr__(name: str) -> Any:
    """``TxsinkDataSource`` and the other classes of the format, from
    :mod:`txsink.datasource.source`; on a Spark without the Python Data Source API (3.5),
    :class:`~txsink.errors.UnsupportedSparkError` naming the version and ``foreachBatch``."""
    if name not in _SOURCE_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _versions.require_data_source()
    from txsink.datasource import source

    return getattr(source, name)


_ERROR_LINE = re.compile(r"^txsink\.errors\.(\w+): (.*)$", re.MULTILINE)


def error_text(err: BaseException) -> str | None:
    """The txsink error inside a failed query's exception, as ``Type: message``.

    A Data Source's failures reach the user's process as the Python traceback's text inside
    Spark's exception (``PYTHON_DATA_SOURCE_ERROR``, a task failure); this finds its txsink
    error line. ``None`` if there is none."""
    found = _ERROR_LINE.findall(str(err))
    return f"{found[-1][0]}: {found[-1][1]}" if found else None


#: Spark's error condition for a format no installed or registered source provides.
_NOT_FOUND = "DATA_SOURCE_NOT_FOUND"


def format_not_found(err: BaseException) -> ConfigurationError | None:
    """The fix, as a :class:`ConfigurationError`, when ``err`` (or an exception it came
    from) is Spark's ``DATA_SOURCE_NOT_FOUND`` for the ``txsink`` format; else ``None``.

    Read from Spark's structured error (condition and ``provider`` parameter: PySpark's
    own exceptions, and the Java ``SparkThrowable`` inside a ``Py4JJavaError``), never
    from the message text."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for source in (current, getattr(current, "java_exception", None)):
            condition, provider = _spark_condition(source)
            if condition == _NOT_FOUND and provider.lower() == FORMAT:
                if not _versions.has_data_source():  # Spark 3.5: no such format at all
                    return _versions.data_source_refusal()
                return ConfigurationError(
                    "Spark found no data source named 'txsink' (DATA_SOURCE_NOT_FOUND): "
                    "PySpark registers it by itself only where txsink is pip-installed in "
                    "the Python that Spark's Python workers run (PYSPARK_PYTHON); call "
                    "txsink.datasource.register(spark) once after creating the session "
                    "(docs/datasource.md#registration)",
                    phase="check",
                )
        current = current.__cause__ or current.__context__
    return None


def _spark_condition(source: object) -> tuple[str | None, str]:
    """(error condition, ``provider`` parameter) of a Spark error, Python or Java side."""
    if source is None:
        return None, ""
    try:
        params = source.getMessageParameters()  # type: ignore[attr-defined]
        return spark_condition(source), str(dict(params or {}).get("provider", ""))
    except Exception:  # not a Spark error (py4j answers any name, then fails the call)
        return None, ""


def register(spark: SparkSession) -> None:
    """Register the ``txsink`` format with ``spark`` (needed only where the automatic
    registration of installed ``pyspark_*`` modules is off or not supported). A query of
    this process that a txsink error stops ends with one paragraph, not Spark's traceback
    (:mod:`txsink.observe.failure`), and without Spark's log4j record of its end repeating the
    error (:mod:`txsink.spark.jvmlog`). On Spark 3.5, which has no Python Data Source,
    :class:`~txsink.errors.UnsupportedSparkError` at once."""
    _versions.require_data_source()
    from txsink.datasource.source import TxsinkDataSource

    spark.dataSource.register(TxsinkDataSource)
    install_console()  # a task's retry, told in one line here (txsink.spark.jvmlog)
    install_excepthook()
    deny_told_records(spark)
