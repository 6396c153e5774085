"""A second, independent reader of Iceberg tables: Spark with Apache Iceberg's own Spark
runtime, through Iceberg's JDBC catalog on the PostgreSQL database pyiceberg's SQL catalog
writes (the same ``iceberg_tables`` rows), and Iceberg's S3FileIO on the S3 server.

Run with an interpreter whose PySpark an Iceberg runtime supports (3.5 to 4.1: each matrix
venv, ``spark_jars.py``; no Iceberg release runs on PySpark 4.3 yet, so for txsink's venv
``./dev iceberg-reader`` makes ``.venv-iceberg-spark`` with PySpark 4.1 for
``iceberg-spark-runtime-4.1_2.13``). It imports
nothing of txsink. Connection settings come from the environment (``TXSINK_PG_DSN``,
``TXSINK_S3_*``, as ``integration/services up`` writes them); nothing secret is printed.
Prints one JSON line: the table's ids, its snapshots (with their summaries) and its
properties::

    .venv-iceberg-spark/bin/python integration/iceberg_spark_reader.py CATALOG NS.TABLE WAREHOUSE

Optional ``ID`` (the id column, ``id``) and ``COLUMNS`` (comma-separated: also print those
columns of every row, as ``rows``) follow.
"""

from __future__ import annotations

import json
import os
import sys
from urllib.parse import unquote, urlsplit

ICEBERG = os.environ.get("TXSINK_ICEBERG_SPARK_VERSION", "1.12.0")
#: The jars, for the Spark line that runs this reader (``spark_jars.iceberg_packages``: the
#: tests set ``TXSINK_ICEBERG_SPARK_PACKAGES``); by hand, Spark 4.1's.
PACKAGES = os.environ.get("TXSINK_ICEBERG_SPARK_PACKAGES") or ",".join(
    [
        f"org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:{ICEBERG}",
        f"org.apache.iceberg:iceberg-aws-bundle:{ICEBERG}",
        "org.postgresql:postgresql:42.7.14",
    ]
)


def _jdbc(dsn: str) -> tuple[str, str, str]:
    """A libpq URL as (JDBC URL, user, password)."""
    parts = urlsplit(dsn)
    url = f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}"
    return url, unquote(parts.username or ""), unquote(parts.password or "")


def main(catalog: str, table: str, warehouse: str, id_column: str = "id", columns: str = "") -> int:
    """``columns`` (comma-separated): also print those columns of every row, as ``rows``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    url, user, password = _jdbc(os.environ["TXSINK_PG_DSN"])
    prefix = f"spark.sql.catalog.{catalog}"
    builder = (
        SparkSession.builder.master("local[1]")
        .appName("iceberg-second-reader")
        .config("spark.jars.packages", PACKAGES)
        .config(
            "spark.sql.extensions",
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.ui.enabled", "false")
        .config(prefix, "org.apache.iceberg.spark.SparkCatalog")
        .config(f"{prefix}.catalog-impl", "org.apache.iceberg.jdbc.JdbcCatalog")
        .config(f"{prefix}.uri", url)
        .config(f"{prefix}.warehouse", warehouse)
        .config(f"{prefix}.jdbc.user", user)
        .config(f"{prefix}.jdbc.password", password)
        .config(f"{prefix}.io-impl", "org.apache.iceberg.aws.s3.S3FileIO")
        .config(f"{prefix}.s3.endpoint", os.environ["TXSINK_S3_ENDPOINT"])
        .config(f"{prefix}.s3.path-style-access", "true")
        .config(f"{prefix}.s3.access-key-id", os.environ.get("TXSINK_S3_ACCESS_KEY", ""))
        .config(f"{prefix}.s3.secret-access-key", os.environ.get("TXSINK_S3_SECRET_KEY", ""))
        .config(f"{prefix}.client.region", os.environ.get("TXSINK_S3_REGION") or "us-east-1")
    )
    if os.environ.get("TXSINK_SPARK_IVY_SETTINGS"):  # Maven Central alone (ivysettings.xml)
        builder = builder.config("spark.jars.ivySettings", os.environ["TXSINK_SPARK_IVY_SETTINGS"])
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    name = f"{catalog}.{table}"
    try:
        ids = [r[0] for r in spark.table(name).select(id_column).collect()]
        wanted = [c for c in columns.split(",") if c]
        rows = (
            [r.asDict(recursive=True) for r in spark.table(name).select(*wanted).collect()]
            if wanted
            else []
        )
        snapshots = [
            {"snapshot_id": r.snapshot_id, "operation": r.operation, "summary": dict(r.summary)}
            for r in spark.sql(
                f"SELECT snapshot_id, operation, summary FROM {name}.snapshots "
                "ORDER BY committed_at"
            ).collect()
        ]
        properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
    finally:
        spark.stop()
    seen = {"ids": ids, "snapshots": snapshots, "properties": properties}
    if rows:
        seen["rows"] = rows
    print(json.dumps(seen, default=str))  # decimals as text
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
