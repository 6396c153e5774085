"""What differs between Spark lines (:mod:`txsink.spark.versions`), on the PySpark installed.

Run in every line's venv (``./dev spark-line 3.5`` makes ``.venv-spark-3.5``; docs/testing.md):
the tests without a ``spark_line`` mark hold on every line, those with one pin that line's
behaviour and are skipped on the others. ``TXSINK_SPARK_LINE=3.5`` (or ``--spark-line 3.5``)
makes the run refuse a venv of another line.

The regression of issue #38: on PySpark 3.5, ``to_arrow_schema`` takes no keyword argument,
and the first batch's check called it with ``timestamp_utc=True``, then told the user to cast
a column. :func:`test_the_first_batch_check_reads_a_real_schema` reads a real DataFrame's
schema with timestamps on the installed line; the stand-ins below pin each signature.
"""

from __future__ import annotations

import datetime
from typing import Any

import pyarrow as pa
import pytest

from txsink.errors import ConfigurationError, InternalError, UnsupportedSparkError
from txsink.spark import checks as _checks
from txsink.spark import jobs as _jobs
from txsink.spark import versions as _versions


@pytest.mark.matrix("arrow_schema")
def test_the_first_batch_check_reads_a_real_schema(spark: Any) -> None:
    """The Arrow schema of a DataFrame with every kind of column the demo and the sinks
    meet, through the installed PySpark: the same types a task's Arrow batches carry."""
    from pyspark.sql.types import (
        DecimalType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    schema = StructType(
        [
            StructField("id", LongType(), False),
            StructField("name", StringType()),
            StructField("at", TimestampType()),
            StructField("amount", DecimalType(12, 2)),
        ]
    )
    at = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
    df = spark.createDataFrame([(1, "a", at, None)], schema)
    arrow = _checks.arrow_schema(df)
    assert arrow.names == ["id", "name", "at", "amount"]
    assert arrow.field("id").type == pa.int64() and not arrow.field("id").nullable
    assert pa.types.is_timestamp(arrow.field("at").type)
    assert arrow.field("at").type.unit == "us" and arrow.field("at").type.tz is not None
    assert arrow.field("amount").type == pa.decimal128(12, 2)
    # The tasks see the same fields (the sinks check what they will be given).
    seen = df.mapInArrow(_schema_of_batches, "schema string").collect()
    task_fields = {f.split(":")[0] for f in seen[0]["schema"].split(";")}
    assert task_fields == {"id", "name", "at", "amount"}


def _schema_of_batches(batches: Any) -> Any:
    for batch in batches:
        text = ";".join(f"{f.name}:{f.type}" for f in batch.schema)
        yield pa.RecordBatch.from_pylist([{"schema": text}])


def test_a_column_arrow_cannot_carry_is_the_users_to_fix(spark: Any) -> None:
    """PySpark's own refusal of a column type (its error condition, on every line) stays a
    ConfigurationError that names the fix."""
    from pyspark.sql.types import StructField, StructType, YearMonthIntervalType

    class _Frame:
        sparkSession = spark
        schema = StructType([StructField("every", YearMonthIntervalType())])

    with pytest.raises(ConfigurationError, match="Cast or drop that column") as err:
        _checks.arrow_schema(_Frame())  # type: ignore[arg-type]
    assert not isinstance(err.value, InternalError)


# -- each line's signature of to_arrow_schema, by stand-ins --------------------------------


def _spark_3_5(schema: Any) -> pa.Schema:
    return pa.schema([("at", pa.timestamp("us", tz="UTC"))])


def _spark_4_0(
    schema: Any,
    error_on_duplicated_field_names_in_struct: bool = False,
    timestamp_utc: bool = True,
    prefers_large_types: bool = False,
) -> pa.Schema:
    assert timestamp_utc is True
    return pa.schema([("at", pa.timestamp("us", tz="UTC"))])


def _spark_4_2(
    schema: Any,
    error_on_duplicated_field_names_in_struct: bool = False,
    timezone: str | None = None,
    prefers_large_types: bool = False,
) -> pa.Schema:
    return pa.schema([("at", pa.timestamp("us", tz=timezone))])


class _Conf:
    def get(self, key: str, default: Any = None) -> str:
        return "Europe/Berlin"


class _Session:
    conf = _Conf()


class _DF:
    sparkSession = _Session()
    schema = None


@pytest.mark.parametrize(
    ("to_arrow_schema", "tz"),
    [(_spark_3_5, "UTC"), (_spark_4_0, "UTC"), (_spark_4_2, "Europe/Berlin")],
    ids=["3.5", "4.0-4.1", "4.2+"],
)
def test_arrow_schema_follows_each_lines_signature(
    monkeypatch: pytest.MonkeyPatch, to_arrow_schema: Any, tz: str
) -> None:
    """3.5 takes the schema alone (UTC), 4.0 and 4.1 ``timestamp_utc=``, 4.2+
    ``timezone=`` (the session's zone)."""
    from pyspark.sql.pandas import types

    monkeypatch.setattr(types, "to_arrow_schema", to_arrow_schema)
    _versions._arrow_schema_options.cache_clear()
    try:
        assert _checks.arrow_schema(_DF()).field("at").type.tz == tz  # type: ignore[arg-type]
    finally:
        _versions._arrow_schema_options.cache_clear()


def test_a_call_pyspark_does_not_take_is_an_internal_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bug of issue #38 as it would show again: a PySpark whose ``to_arrow_schema``
    refuses our call. That is txsink's bug, said as one, with the versions to report;
    never "cast or drop that column"."""
    from pyspark.sql.pandas import types

    def refuses(schema: Any, **kwargs: Any) -> pa.Schema:
        raise TypeError("to_arrow_schema() got an unexpected keyword argument 'timestamp_utc'")

    monkeypatch.setattr(types, "to_arrow_schema", refuses)
    _versions._arrow_schema_options.cache_clear()
    try:
        with pytest.raises(InternalError) as err:
            _checks.arrow_schema(_DF())  # type: ignore[arg-type]
    finally:
        _versions._arrow_schema_options.cache_clear()
    text = str(err.value)
    assert "Cast or drop" not in text and "bug of txsink" in text
    assert "unexpected keyword argument 'timestamp_utc'" in text
    for name in ("txsink", "python", "pyspark", "pyarrow"):
        assert f"{name} " in text, text
    assert err.value.phase == "check"
    assert isinstance(err.value.__cause__, TypeError)


# -- pinned per line --------------------------------------------------------------------------


@pytest.mark.spark_line("3.5")
def test_spark_3_5() -> None:
    """3.5: Scala 2.12 jars, the Connect server's jar from Maven, no Arrow byte cap, no
    Python Data Source."""
    assert _versions.spark_line() == "3.5"
    assert _versions.scala_binary() == "2.12"
    assert _versions.arrow_byte_cap_setting() is None
    major, minor, patch = _versions.spark_version()
    assert _versions.connect_server_packages() == [
        f"org.apache.spark:spark-connect_2.12:{major}.{minor}.{patch}"
    ]
    assert not _versions.has_data_source()
    with pytest.raises(UnsupportedSparkError, match=r"needs Spark 4\.0.*foreachBatch"):
        _versions.require_data_source()


@pytest.mark.spark_line("3.5")
@pytest.mark.matrix(
    "byte_cap", note="no byte cap on 3.5: Arrow batches are cut by maxRecordsPerBatch only"
)
def test_no_byte_cap_to_lift_on_3_5() -> None:
    """Spark 3.5 cuts Arrow batches by rows only: txsink's jobs set nothing."""

    class Conf:
        def __init__(self) -> None:
            self.values: dict[str, str] = {}

        def get(self, key: str, default: Any = None) -> Any:
            return self.values.get(key, default)

        def set(self, key: str, value: str) -> None:
            self.values[key] = value

    class Session:
        conf = Conf()

    with _jobs.arrow_batches_cut_by_rows(Session()):
        assert Session.conf.values == {}


@pytest.mark.spark_line("3.5")
@pytest.mark.matrix(
    "datasource",
    refused="the Python Data Source API is Spark 4.0's; txsink says so at once and names "
    "foreachBatch",
)
def test_the_data_source_is_refused_on_3_5(spark: Any) -> None:
    """``format("txsink")`` on 3.5: refused at registration, and the classes refuse on
    first use, naming the version and ``foreachBatch``; the package itself imports (the
    runner and the CLI read its error helpers on every line)."""
    import txsink.datasource as ds

    with pytest.raises(UnsupportedSparkError, match=r"PySpark 3\.5\.\d+.*foreachBatch"):
        ds.register(spark)
    with pytest.raises(UnsupportedSparkError):
        ds.TxsinkDataSource  # noqa: B018
    assert ds.format_not_found(RuntimeError("not a Spark error")) is None


@pytest.mark.spark_line("4.0")
@pytest.mark.matrix(
    "datasource",
    refused="PySpark 4.0's streaming Data Source writer takes rows, not Arrow batches "
    "(DataSourceStreamArrowWriter is 4.1's): txsink refuses writeStream.format('txsink') at "
    "once and names foreachBatch; static df.write.format('txsink') runs",
)
def test_the_streaming_data_source_is_refused_on_4_0() -> None:
    """4.0 (Databricks 17.3 LTS) has the Data Source API but no streaming Arrow writer: the
    format's module imports (static writes), and a stream is refused before any writer is
    made, naming the version and foreachBatch (found by the compatibility matrix)."""
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter

    from txsink.datasource import TxsinkDataSource, source

    assert _versions.stream_writer_base() is DataSourceStreamWriter
    assert issubclass(source._BatchWriter, DataSourceArrowWriter)
    ds = TxsinkDataSource({"connector": "files", "path": "/nonexistent", "uid": "x"})
    with pytest.raises(
        UnsupportedSparkError, match=r"needs Spark 4\.1.*PySpark 4\.0\.\d+.*foreachBatch"
    ):
        ds.streamWriter(None, False)  # type: ignore[arg-type]


@pytest.mark.spark_line("4")
def test_spark_4() -> None:
    """4.x: Scala 2.13 jars, the Connect server in PySpark's jars, the byte cap, the Python
    Data Source."""
    assert _versions.spark_line().startswith("4.")
    assert _versions.scala_binary() == "2.13"
    assert _versions.arrow_byte_cap_setting() == "spark.sql.execution.arrow.maxBytesPerBatch"
    assert _versions.connect_server_packages() == []
    assert _versions.has_data_source()
    _versions.require_data_source()
