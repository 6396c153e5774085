"""The objects the ``postgres`` / ``kafka`` / ``s3`` / ``schema_registry`` fixtures hand to tests.

Servers are shared by the whole test session (starting them is the slow part); isolation
between tests comes from fresh names instead: every ``new_*`` helper creates a uniquely
named schema / topic / bucket / subject and remembers it, and ``cleanup()`` (called by the
conftest after each test) drops what the test created.

Where the servers come from: :mod:`.resolve`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from .common import quiet_logger, redact

if TYPE_CHECKING:
    import psycopg
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

    from txsink.testing.netproxy import NetProxy

Finalizer = Callable[[], None]


def unique(prefix: str, sep: str = "_") -> str:
    """A short unique name; lowercase hex so it is valid for schemas, topics and buckets."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:12]}"


def _proxy_for(host: str, port: int, listen_port: int = 0) -> NetProxy:
    from txsink.testing.netproxy import NetProxy

    proxy = NetProxy(host, port, listen_port=listen_port)
    proxy.start()
    return proxy


# -- Postgres ---------------------------------------------------------------------------


# Prepared transactions holding a lock on a relation in the schema: their relation lock and
# their transaction-id lock share a virtualtransaction; the latter names the xid.
_PREPARED_IN_SCHEMA = """
SELECT DISTINCT p.gid
FROM pg_locks l
JOIN pg_class c ON c.oid = l.relation
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_locks x ON x.virtualtransaction = l.virtualtransaction AND x.locktype = 'transactionid'
JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
WHERE n.nspname = %s AND l.pid IS NULL
"""


@dataclass(repr=False)
class PostgresService:
    """A PostgreSQL server with ``max_prepared_transactions > 0`` (``env_var``
    ``TXSINK_PG_DSN``), or one as PostgreSQL ships, with 0 (``TXSINK_PG_STOCK_DSN``);
    ``dsn`` is for psycopg."""

    dsn: str
    origin: str
    env_var: str = "TXSINK_PG_DSN"
    _schemas: list[str] = field(default_factory=list)
    _proxies: list[NetProxy] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"PostgresService(dsn={redact(self.dsn)!r}, origin={self.origin!r})"

    def env(self, address: str | None = None) -> dict[str, str]:
        """The variables testing adapters read (``address``: a DSN through a proxy)."""
        return {self.env_var: address or self.dsn}

    def connect(
        self, *, autocommit: bool = True, dsn: str | None = None
    ) -> psycopg.Connection[Any]:
        import psycopg

        return psycopg.connect(dsn or self.dsn, autocommit=autocommit)

    def new_schema(self, prefix: str = "t") -> str:
        """Create a fresh schema and return its name; dropped (CASCADE) after the test."""
        from psycopg import sql

        name = unique(prefix)
        with self.connect() as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        self._schemas.append(name)
        return name

    def dsn_for_schema(self, schema: str) -> str:
        """The DSN with ``search_path`` set, so unqualified table names land in ``schema``."""
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(self.dsn)
        params["options"] = f"{params.get('options') or ''} -c search_path={schema}".strip()
        return make_conninfo("", **params)

    def with_proxy(self) -> tuple[NetProxy, str]:
        """A NetProxy in front of the server and a DSN through it (stopped after the test)."""
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(self.dsn)
        host = str(params.get("host") or "127.0.0.1")
        proxy = _proxy_for(host, int(str(params.get("port") or 5432)))
        self._proxies.append(proxy)
        params.update(host="127.0.0.1", port=str(proxy.port))
        return proxy, make_conninfo("", **params)

    def cleanup(self) -> None:
        for proxy in self._proxies:
            proxy.stop()
        self._proxies.clear()
        if not self._schemas:
            return
        from psycopg import sql

        with self.connect() as conn:
            for schema in self._schemas:
                # A prepared transaction holding locks in the schema would block DROP forever.
                for (gid,) in conn.execute(_PREPARED_IN_SCHEMA, (schema,)).fetchall():
                    with contextlib.suppress(Exception):
                        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                try:
                    conn.execute("SET lock_timeout = '10s'")
                    conn.execute(
                        sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                    )
                except Exception as exc:
                    logging.getLogger(__name__).warning("could not drop schema %s: %s", schema, exc)
        self._schemas.clear()


# -- Kafka ------------------------------------------------------------------------------


@dataclass(repr=False)
class KafkaService:
    """A Kafka broker that supports transactions with replication factor 1."""

    bootstrap: str
    origin: str
    proxy_listen: str | None = None
    proxy_target: str | None = None
    _topics: list[str] = field(default_factory=list)
    _groups: list[str] = field(default_factory=list)
    _proxies: list[NetProxy] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"KafkaService(bootstrap={self.bootstrap!r}, origin={self.origin!r})"

    def env(self, address: str | None = None) -> dict[str, str]:
        """The variables testing adapters read (``address``: a bootstrap through a proxy)."""
        return {"TXSINK_KAFKA_BOOTSTRAP": address or self.bootstrap}

    def config(self, **overrides: Any) -> dict[str, Any]:
        """Client config for confluent-kafka: bootstrap plus a logger that keeps stderr quiet.

        Keys use Kafka's dotted names; pass them as ``**{"transactional.id": "x"}``.
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": quiet_logger()}
        conf.update(overrides)
        return conf

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(self.config())

    def new_topic(
        self, partitions: int = 1, *, prefix: str = "t", config: dict[str, str] | None = None
    ) -> str:
        """Create a unique topic and wait until every partition has a leader."""
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        name = unique(prefix, "-")
        admin = self.admin()
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
        )[name].result(timeout=30)
        self._topics.append(name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = admin.list_topics(name, timeout=5).topics.get(name)
            if (
                meta is not None
                and meta.error is None
                and len(meta.partitions) == partitions
                and all(p.leader >= 0 for p in meta.partitions.values())
            ):
                return name
            time.sleep(0.1)
        raise TimeoutError(f"topic {name} has no leaders after 30s")

    def new_group(self, prefix: str = "g") -> str:
        """A unique consumer group id; the group is deleted after the test if it exists."""
        name = unique(prefix, "-")
        self._groups.append(name)
        return name

    def new_transactional_id(self, prefix: str = "tx") -> str:
        return unique(prefix, "-")

    def with_proxy(self) -> tuple[NetProxy, str]:
        """A NetProxy that carries *all* traffic of clients bootstrapped through it.

        Kafka clients reconnect to the broker's advertised address, so this needs the
        broker's PROXIED listener (local processes have one); otherwise the test is skipped.
        """
        if not (self.proxy_listen and self.proxy_target):
            import pytest

            pytest.skip("this Kafka has no PROXIED listener (TXSINK_KAFKA_PROXY_* unset)")
        t_host, t_port = self.proxy_target.rsplit(":", 1)
        l_port = int(self.proxy_listen.rsplit(":", 1)[1])
        if self._proxies:
            raise RuntimeError("only one Kafka proxy at a time (it owns the advertised port)")
        proxy = _proxy_for(t_host, int(t_port), listen_port=l_port)
        self._proxies.append(proxy)
        return proxy, proxy.address

    def cleanup(self) -> None:
        for proxy in self._proxies:
            proxy.stop()
        self._proxies.clear()
        if not (self._topics or self._groups):
            return
        admin = self.admin()
        if self._groups:
            with contextlib.suppress(Exception):
                for fut in admin.delete_consumer_groups(self._groups, request_timeout=10).values():
                    with contextlib.suppress(Exception):
                        fut.result(timeout=15)
        if self._topics:
            with contextlib.suppress(Exception):
                for fut in admin.delete_topics(self._topics, operation_timeout=30).values():
                    with contextlib.suppress(Exception):
                        fut.result(timeout=35)
        self._topics.clear()
        self._groups.clear()


# -- S3 ---------------------------------------------------------------------------------


@dataclass(repr=False)
class S3Service:
    """An S3-compatible endpoint (MinIO, moto, or your own); path-style addressing."""

    endpoint: str
    access_key: str
    secret_key: str
    origin: str
    server: str = "unknown"  # "minio" | "moto" | "unknown": lets tests expect known gaps
    region: str = "us-east-1"
    _buckets: list[str] = field(default_factory=list)
    _proxies: list[NetProxy] = field(default_factory=list)

    def __repr__(self) -> str:
        return (
            f"S3Service(endpoint={self.endpoint!r}, server={self.server!r}, origin={self.origin!r})"
        )

    def env(self, address: str | None = None) -> dict[str, str]:
        """The variables testing adapters read (``address``: an endpoint through a proxy)."""
        return {
            "TXSINK_S3_ENDPOINT": address or self.endpoint,
            "TXSINK_S3_ACCESS_KEY": self.access_key,
            "TXSINK_S3_SECRET_KEY": self.secret_key,
            "TXSINK_S3_REGION": self.region,
            "TXSINK_S3_SERVER": self.server,
        }

    def client(self, endpoint: str | None = None, **config: Any) -> S3Client:
        """A boto3 S3 client for this server (``endpoint`` overrides, e.g. via a proxy).

        ``config`` overrides botocore ``Config`` options (``retries``, ``read_timeout``...).
        """
        import boto3
        from botocore.config import Config

        options: dict[str, Any] = {
            "s3": {"addressing_style": "path"},
            "retries": {"max_attempts": 2, "mode": "standard"},
            "connect_timeout": 5,
            "read_timeout": 30,
        }
        options.update(config)
        cfg = Config(**options)
        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=cfg,
        )

    def new_bucket(self, prefix: str = "t") -> str:
        """Create a unique bucket; emptied (objects and open uploads) and deleted after the test."""
        name = unique(prefix, "-")
        self.client().create_bucket(Bucket=name)
        self._buckets.append(name)
        return name

    def with_proxy(self) -> tuple[NetProxy, str]:
        """A NetProxy in front of the endpoint and the endpoint URL through it."""
        parts = urlsplit(self.endpoint)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        proxy = _proxy_for(parts.hostname or "127.0.0.1", port)
        self._proxies.append(proxy)
        return proxy, urlunsplit((parts.scheme, f"127.0.0.1:{proxy.port}", parts.path, "", ""))

    def cleanup(self) -> None:
        for proxy in self._proxies:
            proxy.stop()
        self._proxies.clear()
        if not self._buckets:
            return
        client = self.client()
        for bucket in self._buckets:
            with contextlib.suppress(Exception):
                empty_bucket(client, bucket)
                client.delete_bucket(Bucket=bucket)
        self._buckets.clear()


def empty_bucket(client: S3Client, bucket: str) -> None:
    """Abort open multipart uploads and delete every object, so the bucket can be deleted."""
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for upload in page.get("Uploads", []):
            with contextlib.suppress(Exception):
                client.abort_multipart_upload(
                    Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
    for listing in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys: list[ObjectIdentifierTypeDef] = [
            {"Key": o["Key"]} for o in listing.get("Contents", [])
        ]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


# -- Schema Registry --------------------------------------------------------------------


@dataclass(repr=False)
class RegistryService:
    """A Confluent-API-compatible Schema Registry; ``url`` is its base URL."""

    url: str
    origin: str
    _subjects: list[str] = field(default_factory=list)
    _proxies: list[NetProxy] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"RegistryService(url={self.url!r}, origin={self.origin!r})"

    def env(self, address: str | None = None) -> dict[str, str]:
        """The variables testing adapters read (``address``: a URL through a proxy)."""
        return {"TXSINK_SCHEMA_REGISTRY_URL": address or self.url}

    def config(self, **overrides: Any) -> dict[str, Any]:
        """``SchemaRegistryClient`` config: the URL plus ``overrides`` (dotted names)."""
        conf: dict[str, Any] = {"url": self.url}
        conf.update(overrides)
        return conf

    def client(self, url: str | None = None, **overrides: Any) -> SchemaRegistryClient:
        """A new client (its own schema caches); ``url`` overrides, e.g. via a proxy."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return SchemaRegistryClient(self.config(**({"url": url} if url else {}), **overrides))

    def new_subject(self, prefix: str = "t") -> str:
        """A unique subject name; the subject is deleted (soft, then hard) after the test."""
        name = unique(prefix, "-")
        self._subjects.append(name)
        return name

    def topic_subject(self, topic: str, kind: str = "value") -> str:
        """``<topic>-value`` / ``-key`` (the serializers' default TopicNameStrategy).

        Deleted after the test; use it for the subjects a serializer registers on its own
        (``auto.register.schemas``) as well as for ones the test registers.
        """
        name = f"{topic}-{kind}"
        self._subjects.append(name)
        return name

    def with_proxy(self) -> tuple[NetProxy, str]:
        """A NetProxy in front of the registry and the URL through it."""
        parts = urlsplit(self.url)
        proxy = _proxy_for(parts.hostname or "127.0.0.1", parts.port or 80)
        self._proxies.append(proxy)
        return proxy, urlunsplit((parts.scheme, f"127.0.0.1:{proxy.port}", parts.path, "", ""))

    def cleanup(self) -> None:
        for proxy in self._proxies:
            proxy.stop()
        self._proxies.clear()
        if not self._subjects:
            return
        from confluent_kafka.schema_registry import SchemaRegistryClient

        client = SchemaRegistryClient(self.config(**{"max.retries": 1, "timeout": 10}))
        for subject in self._subjects:
            # Confluent's API refuses a hard delete before a soft one; a subject the test never
            # registered answers 404, which is fine.
            with contextlib.suppress(Exception):
                client.delete_subject(subject)
            with contextlib.suppress(Exception):
                client.delete_subject(subject, permanent=True)
        self._subjects.clear()
