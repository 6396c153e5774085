"""testcontainers variants of the three servers, used when a Docker engine answers.

Configured like the local processes (2PC enabled, one-node transactions, fixed test
credentials). Images can be overridden with ``TXSINK_PG_IMAGE``, ``TXSINK_KAFKA_IMAGE`` and
``TXSINK_MINIO_IMAGE``. Each starter registers a finalizer that stops its container at the
end of the test session.

Note: our own machines have no Docker engine, so this path is exercised only where one exists.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .common import ServiceError, free_port

PG_IMAGE = os.environ.get("TXSINK_PG_IMAGE", "postgres:16")
KAFKA_IMAGE = os.environ.get("TXSINK_KAFKA_IMAGE", "apache/kafka:4.1.1")
MINIO_IMAGE = os.environ.get("TXSINK_MINIO_IMAGE", "minio/minio:RELEASE.2025-04-22T22-12-26Z")
S3_ACCESS_KEY = "txsink"
S3_SECRET_KEY = "txsink-secret"


def _poll(what: str, check: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.5)
    raise ServiceError(f"{what} container not ready after {timeout:.0f}s")


def postgres(finalizers: list[Callable[[], None]], *, max_prepared: int = 200) -> str:
    """A PostgreSQL container; ``max_prepared=0`` is the image's (and PostgreSQL's) default."""
    try:  # testcontainers >= 4.14 moved the modules under .community
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:
        from testcontainers.postgres import PostgresContainer

    container: Any = PostgresContainer(
        PG_IMAGE, username="txsink", password="txsink", dbname="txsink", driver=None
    ).with_command(f"postgres -c max_prepared_transactions={max_prepared} -c fsync=on")
    container.start()
    finalizers.append(container.stop)
    return str(container.get_connection_url(driver=None))


def kafka(finalizers: list[Callable[[], None]]) -> str:
    """apache/kafka in KRaft combined mode, advertised on a fixed host port.

    A fixed host port (chosen free up front) lets the broker advertise the address clients
    on the host really use, without the image-specific start-script tricks.
    """
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.docker_client import DockerClient

    host = DockerClient().host()
    host_port = free_port()
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{host}:{host_port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_HEAP_OPTS": "-Xmx512m -Xms128m",
    }
    container: Any = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, host_port)
    for key, value in env.items():
        container = container.with_env(key, value)
    container.start()
    finalizers.append(container.stop)
    bootstrap = f"{host}:{host_port}"

    def ready() -> bool:
        from confluent_kafka.admin import AdminClient

        from .common import quiet_logger

        conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "logger": quiet_logger()}
        admin = AdminClient(conf)
        return bool(admin.describe_cluster(request_timeout=5).result(timeout=10).nodes)

    _poll("kafka", ready)
    return bootstrap


def minio(finalizers: list[Callable[[], None]]) -> tuple[str, str, str]:
    from testcontainers.core.container import DockerContainer

    container: Any = (
        DockerContainer(MINIO_IMAGE)
        .with_env("MINIO_ROOT_USER", S3_ACCESS_KEY)
        .with_env("MINIO_ROOT_PASSWORD", S3_SECRET_KEY)
        .with_command("server /data --address :9000")
        .with_exposed_ports(9000)
    )
    container.start()
    finalizers.append(container.stop)
    endpoint = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(9000)}"

    def ready() -> bool:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name="us-east-1",
        ).list_buckets()
        return True

    _poll("minio", ready)
    return endpoint, S3_ACCESS_KEY, S3_SECRET_KEY
