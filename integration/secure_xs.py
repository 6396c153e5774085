"""The secured cross-system pipeline's sinks: Kafka (WAL mode), PostgreSQL, S3, and (when
their targets are named) Iceberg and Delta, each through its least-privileged principal over
verified TLS, built from the environment the
way a user's job builds them (no secret in code, in arguments or in a spec).

One function serves the three places that must build the same sinks:
``integration/test_secure_cross_system.py`` (in-process checks), the child driver
(``txsink.testing.pipelines:run_stream`` with ``factory="secure_xs:sinks"``, killed and
restarted by the runner) and the operator CLI (``txsink recover|inspect --pipeline
integration/secure_xs.py:sinks``).

Where each credential comes from:

* Kafka: SASL/SCRAM ``txsink-app``, its password read from ``TXSINK_KAFKA_SECURE_PASSWORD_FILE``
  when the sink is built, the CA from ``TXSINK_KAFKA_SECURE_CA``;
* PostgreSQL: the DSN ``TXSINK_PG_SECURE_DSN`` (``sslmode=verify-full``, a libpq passfile:
  no password in it);
* S3: boto3's own chain (``AWS_SHARED_CREDENTIALS_FILE`` and ``AWS_PROFILE``), the CA in
  ``verify=``;
* Delta: the same chain (delta-rs and pyarrow both take it when no key is given), the CA in
  the storage option ``certificate_path``.

The run's target names come in ``TXSINK_SECURE_XS_*`` variables (:data:`TARGET_VARS`),
set by the test for its child processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The per-run targets: topic, marker topic, WAL folder, table, S3 URL, and (optional)
#: the Iceberg table and its warehouse, and the Delta table's ``s3://`` URI.
TARGET_VARS = (
    "TXSINK_SECURE_XS_TOPIC",
    "TXSINK_SECURE_XS_MARKERS",
    "TXSINK_SECURE_XS_WAL",
    "TXSINK_SECURE_XS_TABLE",
    "TXSINK_SECURE_XS_S3_URL",
    "TXSINK_SECURE_XS_ICEBERG_TABLE",
    "TXSINK_SECURE_XS_WAREHOUSE",
    "TXSINK_SECURE_XS_DELTA",
)
UIDS = ("kafka", "pg", "s3", "iceberg", "delta")
ICEBERG_CATALOG = "txsink_xs"


def sqlalchemy_url(dsn: str) -> str:
    """A libpq key=value DSN as SQLAlchemy's psycopg URL (the Iceberg SQL catalog's
    ``uri``): TLS settings and the passfile go along as query parameters, no password."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    parts = {k: str(v) for k, v in conninfo_to_dict(dsn).items()}
    return URL.create(
        "postgresql+psycopg",
        username=parts.pop("user", None),
        host=parts.pop("host", None),
        port=int(parts.pop("port")) if "port" in parts else None,
        database=parts.pop("dbname", None),
        query=parts,
    ).render_as_string(hide_password=False)


def iceberg_catalog(dsn: str, warehouse: str, env: Any = None) -> dict[str, str]:
    """pyiceberg properties: the SQL catalog at ``dsn``, the warehouse on the secured S3.
    No S3 keys: pyarrow's S3 client takes boto's chain (``AWS_PROFILE``); its CA comes from
    ``SSL_CERT_FILE`` (pyiceberg 0.12 has no property for it)."""
    env = os.environ if env is None else env
    return {
        "type": "sql",
        "uri": sqlalchemy_url(dsn),
        "warehouse": warehouse,
        "s3.endpoint": env["TXSINK_S3_SECURE_ENDPOINT"],
        "s3.region": env["TXSINK_S3_SECURE_REGION"],
    }


def kafka_security(user: str, password_file: str, ca: str) -> dict[str, Any]:
    """librdkafka's settings for SASL_SSL with SCRAM-SHA-512, the password read now."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": Path(password_file).read_text().strip(),
        "ssl.ca.location": ca,
        "ssl.endpoint.identification.algorithm": "https",
    }


def delta_options(env: Any = None) -> dict[str, str]:
    """delta-rs storage options for the secured S3: the server and its CA, no key (the AWS
    chain: ``AWS_PROFILE``, ``AWS_SHARED_CREDENTIALS_FILE``)."""
    env = os.environ if env is None else env
    return {
        "AWS_ENDPOINT_URL": env["TXSINK_S3_SECURE_ENDPOINT"],
        "AWS_REGION": env["TXSINK_S3_SECURE_REGION"],
        "certificate_path": env["TXSINK_S3_SECURE_CA"],
    }


def sinks() -> list[Any]:
    """The sinks, in commit order, as the least-privileged principals."""
    from txsink.connectors.kafka import KafkaSink
    from txsink.connectors.postgres import PostgresSink
    from txsink.connectors.s3 import S3Sink

    env = os.environ
    kafka = KafkaSink(
        env["TXSINK_KAFKA_SECURE_BOOTSTRAP"],
        env["TXSINK_SECURE_XS_TOPIC"],
        uid=UIDS[0],
        mode="wal",
        wal=env["TXSINK_SECURE_XS_WAL"],
        marker_topic=env["TXSINK_SECURE_XS_MARKERS"],
        key="key",
        shards=2,
        producer_config=kafka_security(
            env["TXSINK_KAFKA_SECURE_USER"],
            env["TXSINK_KAFKA_SECURE_PASSWORD_FILE"],
            env["TXSINK_KAFKA_SECURE_CA"],
        ),
        timeout_s=30.0,
    )
    pg = PostgresSink(
        env["TXSINK_PG_SECURE_DSN"], env["TXSINK_SECURE_XS_TABLE"], uid=UIDS[1], commit="2pc"
    )
    s3 = S3Sink(
        env["TXSINK_SECURE_XS_S3_URL"],
        uid=UIDS[2],
        format="jsonl",
        client_options={
            "endpoint_url": env["TXSINK_S3_SECURE_ENDPOINT"],
            "region_name": env["TXSINK_S3_SECURE_REGION"],
            "verify": env["TXSINK_S3_SECURE_CA"],
        },
    )
    out: list[Any] = [kafka, pg, s3]
    if env.get("TXSINK_SECURE_XS_ICEBERG_TABLE"):
        from txsink.connectors.iceberg import IcebergSink

        catalog = iceberg_catalog(env["TXSINK_PG_SECURE_DSN"], env["TXSINK_SECURE_XS_WAREHOUSE"])
        out.append(
            IcebergSink(
                catalog,
                env["TXSINK_SECURE_XS_ICEBERG_TABLE"],
                uid=UIDS[3],
                catalog_name=ICEBERG_CATALOG,
            )
        )
    if env.get("TXSINK_SECURE_XS_DELTA"):
        from txsink.connectors.delta import DeltaSink

        out.append(
            DeltaSink(env["TXSINK_SECURE_XS_DELTA"], uid=UIDS[4], storage_options=delta_options())
        )
    return out


def _admin_catalog() -> Any:
    """The Iceberg catalog as the administrators (PostgreSQL's superuser, MinIO's root)."""
    import configparser

    from txsink.connectors.iceberg.catalog import load_catalog

    env = os.environ
    profiles = configparser.ConfigParser()
    profiles.read(env["TXSINK_S3_SECURE_CREDENTIALS"])
    root = profiles[env["TXSINK_S3_SECURE_ADMIN_PROFILE"]]
    props = iceberg_catalog(env["TXSINK_PG_SECURE_ADMIN_DSN"], env["TXSINK_SECURE_XS_WAREHOUSE"])
    props["s3.access-key-id"] = root["aws_access_key_id"]
    props["s3.secret-access-key"] = root["aws_secret_access_key"]
    return load_catalog(ICEBERG_CATALOG, props)


def admin(op: str) -> Any:
    """The administrators' Iceberg operations on the run's table, for the test: ``create``
    (the namespace and the table, with the input's columns), ``ids`` (every row's id),
    ``unreferenced`` (data files in the table's folder that no snapshot names), ``drop``.

    Run in a process of its own (``python secure_xs.py OP``, ``SSL_CERT_FILE`` set): pyarrow
    reads the CA once, when its S3 client first starts in a process."""
    import pyarrow.fs as pafs

    from txsink.testing.contract import SCHEMA

    catalog = _admin_catalog()
    name = os.environ["TXSINK_SECURE_XS_ICEBERG_TABLE"]
    namespace = name.split(".")[0]
    if op == "create":
        catalog.create_namespace(namespace)
        catalog.create_table(name, schema=SCHEMA)
        return None
    if op == "drop":
        catalog.drop_table(name)
        catalog.drop_namespace(namespace)
        return None
    table = catalog.load_table(name)
    if op == "ids":
        return [int(i) for i in table.scan().to_arrow().column("id").to_pylist()]
    if op == "unreferenced":
        named = {
            str(p).removeprefix("s3://") for p in table.inspect.all_files()["file_path"].to_pylist()
        }
        fs, folder = table.io.fs_by_scheme("s3", None), table.location().removeprefix("s3://")
        found = fs.get_file_info(
            pafs.FileSelector(f"{folder}/data", recursive=True, allow_not_found=True)
        )
        return sorted(f.path for f in found if f.path.endswith(".parquet") and f.path not in named)
    raise ValueError(f"unknown operation {op!r}")


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(admin(sys.argv[1])))
