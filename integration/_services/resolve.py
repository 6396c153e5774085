"""Where the test servers come from, in this order (``resolve_*``):
1. the ``TXSINK_*`` environment variables (your own servers, or what ``integration/services
   up`` wrote to ``integration/.services.env``);
2. testcontainers, if a Docker engine answers;
3. local processes started by this package (the same code as ``integration/services up``).

Each ``resolve_*`` returns the fixture's object (:mod:`.fixtures`); Docker containers'
stop callbacks go to the session's finalizers (:func:`session_finalizers`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from .common import ServiceError, real_servers_required
from .fixtures import Finalizer, KafkaService, PostgresService, RegistryService, S3Service


def docker_available() -> bool:
    """True if a Docker engine answers; ``TXSINK_NO_DOCKER=1`` forces local processes."""
    if os.environ.get("TXSINK_NO_DOCKER") == "1":
        return False
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _local(name: str) -> dict[str, str]:
    from .manager import up

    env, _ = up([name])
    return env


def resolve_postgres(finalizers: list[Finalizer]) -> PostgresService:
    dsn = os.environ.get("TXSINK_PG_DSN")
    if dsn:
        return PostgresService(dsn=dsn, origin="env")
    if docker_available():
        from . import containers

        return PostgresService(dsn=containers.postgres(finalizers), origin="docker")
    return PostgresService(dsn=_local("postgres")["TXSINK_PG_DSN"], origin="local")


def resolve_postgres_stock(finalizers: list[Finalizer]) -> PostgresService:
    """A PostgreSQL server with ``max_prepared_transactions = 0`` (PostgreSQL's default)."""
    var = "TXSINK_PG_STOCK_DSN"
    dsn = os.environ.get(var)
    if dsn:
        return PostgresService(dsn=dsn, origin="env", env_var=var)
    if docker_available():
        from . import containers

        dsn = containers.postgres(finalizers, max_prepared=0)
        return PostgresService(dsn=dsn, origin="docker", env_var=var)
    return PostgresService(dsn=_local("postgres_stock")[var], origin="local", env_var=var)


def resolve_postgres_secure() -> dict[str, str]:
    """The secured PostgreSQL (TLS only, a least-privilege role; :mod:`.postgres_secure`):
    its ``TXSINK_PG_SECURE_*`` variables, from the environment or a local process (it
    needs the harness's own superuser to set up roles: no Docker variant)."""
    keys = ("TXSINK_PG_SECURE_DSN", "TXSINK_PG_SECURE_ADMIN_DSN", "TXSINK_PG_SECURE_APP_ROLE")
    if all(os.environ.get(k) for k in keys):
        return {k: v for k, v in os.environ.items() if k.startswith("TXSINK_PG_SECURE_")}
    return {k: v for k, v in _local("postgres_secure").items() if k.startswith("TXSINK_PG_")}


def resolve_s3_secure() -> dict[str, str]:
    """The secured MinIO (TLS only, a least-privilege user; :mod:`.s3_secure`): its
    ``TXSINK_S3_SECURE_*`` variables, from the environment or a local process (it needs the
    harness's root user to set up users and policies: no Docker variant)."""
    keys = ("TXSINK_S3_SECURE_ENDPOINT", "TXSINK_S3_SECURE_CA", "TXSINK_S3_SECURE_CREDENTIALS")
    if all(os.environ.get(k) for k in keys):
        return {k: v for k, v in os.environ.items() if k.startswith("TXSINK_S3_SECURE_")}
    return {k: v for k, v in _local("s3_secure").items() if k.startswith("TXSINK_S3_SECURE_")}


def resolve_kafka_secure() -> dict[str, str]:
    """The secured Kafka (SASL_SSL with SCRAM, ACLs on; :mod:`.kafka_secure`): its
    ``TXSINK_KAFKA_SECURE_*`` variables, from the environment or a local process (its admin
    principal grants the rights: no Docker variant)."""
    keys = ("TXSINK_KAFKA_SECURE_BOOTSTRAP", "TXSINK_KAFKA_SECURE_CA")
    prefix = "TXSINK_KAFKA_SECURE_"
    if all(os.environ.get(k) for k in keys):
        return {k: v for k, v in os.environ.items() if k.startswith(prefix)}
    return {k: v for k, v in _local("kafka_secure").items() if k.startswith(prefix)}


def resolve_registry_secure() -> dict[str, str]:
    """The secured Schema Registry (HTTPS, basic auth, a ``developer`` user;
    :mod:`.registry_secure`): its ``TXSINK_REGISTRY_SECURE_*`` variables, from the environment
    or a local process (its admin makes the users: no Docker variant)."""
    keys = ("TXSINK_REGISTRY_SECURE_URL", "TXSINK_REGISTRY_SECURE_CA")
    prefix = "TXSINK_REGISTRY_SECURE_"
    if all(os.environ.get(k) for k in keys):
        return {k: v for k, v in os.environ.items() if k.startswith(prefix)}
    return {k: v for k, v in _local("registry_secure").items() if k.startswith(prefix)}


def resolve_kafka(finalizers: list[Finalizer]) -> KafkaService:
    bootstrap = os.environ.get("TXSINK_KAFKA_BOOTSTRAP")
    if bootstrap:
        return KafkaService(
            bootstrap=bootstrap,
            origin="env",
            proxy_listen=os.environ.get("TXSINK_KAFKA_PROXY_LISTEN"),
            proxy_target=os.environ.get("TXSINK_KAFKA_PROXY_TARGET"),
        )
    if docker_available():
        from . import containers

        return KafkaService(bootstrap=containers.kafka(finalizers), origin="docker")
    env = _local("kafka")
    return KafkaService(
        bootstrap=env["TXSINK_KAFKA_BOOTSTRAP"],
        origin="local",
        proxy_listen=env.get("TXSINK_KAFKA_PROXY_LISTEN"),
        proxy_target=env.get("TXSINK_KAFKA_PROXY_TARGET"),
    )


def resolve_s3(finalizers: list[Finalizer]) -> S3Service:
    endpoint = os.environ.get("TXSINK_S3_ENDPOINT")
    if endpoint:
        return S3Service(
            endpoint=endpoint,
            access_key=os.environ.get("TXSINK_S3_ACCESS_KEY", ""),
            secret_key=os.environ.get("TXSINK_S3_SECRET_KEY", ""),
            region=os.environ.get("TXSINK_S3_REGION", "us-east-1"),
            server=os.environ.get("TXSINK_S3_SERVER", "unknown"),
            origin="env",
        )
    if docker_available():
        from . import containers

        endpoint, access, secret = containers.minio(finalizers)
        return S3Service(
            endpoint=endpoint, access_key=access, secret_key=secret, server="minio", origin="docker"
        )
    env = _local("s3")
    if env.get("TXSINK_S3_SERVER") == "moto" and real_servers_required():
        raise ServiceError(
            "the S3 server is moto, a stand-in: under CI=true the tests need MinIO "
            "(run `integration/services down` and `up` again; see its build log)"
        )
    return S3Service(
        endpoint=env["TXSINK_S3_ENDPOINT"],
        access_key=env["TXSINK_S3_ACCESS_KEY"],
        secret_key=env["TXSINK_S3_SECRET_KEY"],
        region=env.get("TXSINK_S3_REGION", "us-east-1"),
        server=env.get("TXSINK_S3_SERVER", "unknown"),
        origin="local",
    )


def resolve_registry(finalizers: list[Finalizer]) -> RegistryService:
    """``TXSINK_SCHEMA_REGISTRY_URL``, else the local process (there is no Docker variant)."""
    url = os.environ.get("TXSINK_SCHEMA_REGISTRY_URL")
    if url:
        return RegistryService(url=url.rstrip("/"), origin="env")
    return RegistryService(url=_local("registry")["TXSINK_SCHEMA_REGISTRY_URL"], origin="local")


@contextlib.contextmanager
def session_finalizers() -> Iterator[list[Finalizer]]:
    """Collects stop callbacks of Docker containers; runs them (last first) at exit."""
    finalizers: list[Finalizer] = []
    try:
        yield finalizers
    finally:
        for fin in reversed(finalizers):
            with contextlib.suppress(Exception):
                fin()
