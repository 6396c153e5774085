"""The secured cross-system pipeline's sinks: Kafka (WAL mode), PostgreSQL and S3, each
through its least-privileged principal over verified TLS, built from the environment the
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
  ``verify=``.

The run's target names come in ``TXSINK_SECURE_XS_*`` variables (:data:`TARGET_VARS`),
set by the test for its child processes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The per-run targets: topic, marker topic, WAL folder, table, S3 URL.
TARGET_VARS = (
    "TXSINK_SECURE_XS_TOPIC",
    "TXSINK_SECURE_XS_MARKERS",
    "TXSINK_SECURE_XS_WAL",
    "TXSINK_SECURE_XS_TABLE",
    "TXSINK_SECURE_XS_S3_URL",
)
UIDS = ("kafka", "pg", "s3")


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


def sinks() -> list[Any]:
    """The three sinks, in commit order, as the least-privileged principals."""
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
    return [kafka, pg, s3]
