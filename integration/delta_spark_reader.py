"""A second, independent reader of Delta tables: Spark with Delta Lake's own jar.

Run with an interpreter that has a PySpark Delta supports (3.5 to 4.2: each matrix venv,
with its line's jar in ``TXSINK_DELTA_SPARK_PACKAGE``, ``spark_jars.py``; no Delta release
runs on PySpark 4.3 yet, so for txsink's venv ``./dev delta-reader`` makes
``.venv-delta-spark`` with PySpark 4.2 for ``io.delta:delta-spark_2.13:4.4.0``, built on
Spark 4.2, the default here). It imports nothing of txsink. Prints one JSON line: the
table's ids, its version and its history's operations::

    .venv-delta-spark/bin/python integration/delta_spark_reader.py /path/to/table
"""

from __future__ import annotations

import json
import os
import sys

DELTA = os.environ.get("TXSINK_DELTA_SPARK_PACKAGE", "io.delta:delta-spark_2.13:4.4.0")


def main(path: str, id_column: str = "id") -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[1]")
        .appName("delta-second-reader")
        .config("spark.jars.packages", DELTA)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.ui.enabled", "false")
    )
    if os.environ.get("TXSINK_SPARK_IVY_SETTINGS"):  # Maven Central alone (ivysettings.xml)
        builder = builder.config("spark.jars.ivySettings", os.environ["TXSINK_SPARK_IVY_SETTINGS"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        ids = [r[0] for r in spark.read.format("delta").load(path).select(id_column).collect()]
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version", "operation")
        ops = sorted((r.version, r.operation) for r in history.collect())
    finally:
        spark.stop()
    print(json.dumps({"ids": ids, "version": ops[-1][0] if ops else None, "operations": ops}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
