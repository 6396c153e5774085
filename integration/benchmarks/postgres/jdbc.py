"""Spark's JDBC writer: ``df.write.jdbc(..., mode="append")`` with the PostgreSQL JDBC driver
(from Maven Central), ``batchsize`` 10000 and ``reWriteBatchedInserts=true``."""

from __future__ import annotations

from typing import Any

from .context import Bench

JDBC_DRIVER = ("org.postgresql", "postgresql", "42.7.8")
JDBC_BATCHSIZE = 10_000


def jdbc_url(dsn: str) -> tuple[str, dict[str, str]]:
    """The JDBC URL and connection properties for the server at ``dsn``."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(dsn)
    host = str(params.get("host") or "localhost")
    port = str(params.get("port") or "5432")
    dbname = str(params.get("dbname") or params.get("user") or "postgres")
    url = f"jdbc:postgresql://{host}:{port}/{dbname}?reWriteBatchedInserts=true"
    props = {"driver": "org.postgresql.Driver", "batchsize": str(JDBC_BATCHSIZE)}
    for key in ("user", "password"):
        if params.get(key):
            props[key] = str(params[key])
    return url, props


def write_jdbc(bench: Bench, df: Any, table: str, *, json_text: bool = False) -> dict[str, Any]:
    props = dict(bench.jdbc_properties)
    if json_text:  # let the server type the JSON strings as jsonb
        props["stringtype"] = "unspecified"
    df.write.jdbc(bench.jdbc_url, bench.qualified(table), mode="append", properties=props)
    return {}
