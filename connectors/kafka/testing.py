"""The Kafka connector's testing adapter: a ``read_committed`` verifier, observer views,
the pipeline factory.

Registered in :mod:`txsink.connectors.kafka.plugin`. The server comes from
``TXSINK_KAFKA_BOOTSTRAP``; the ``wal-s3`` variant keeps its WAL on the S3 server of
``TXSINK_S3_ENDPOINT``, ``TXSINK_S3_ACCESS_KEY``, ``TXSINK_S3_SECRET_KEY`` and
``TXSINK_S3_REGION`` (what ``integration/services up`` writes), in a bucket of its own.
The ``secure-*`` variants (:attr:`KafkaTesting.secure_variants`) run on the secured broker
(``TXSINK_KAFKA_SECURE_*``): made and read back by its administrator, written by its
least-privileged principal (:mod:`~txsink.connectors.kafka.secure_testing`).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from typing_extensions import override

from txsink.connectors.kafka import readback, secure_testing
from txsink.connectors.kafka.clients.offsets import settled_ends, topic_ends
from txsink.connectors.kafka.clients.producers import fence
from txsink.connectors.kafka.clients.settings import rdkafka_logger
from txsink.connectors.kafka.sink import SHARED_MARKER_TOPIC, KafkaSink
from txsink.connectors.kafka.wal.store import WalStore
from txsink.testing.adapter import ConnectorTesting
from txsink.testing.observer import Snapshot, Target, by_epoch
from txsink.testing.verifiers import SinkVerifier

__all__ = ["ADAPTER", "KafkaTarget", "KafkaTesting", "KafkaVerifier"]

BOOTSTRAP = "TXSINK_KAFKA_BOOTSTRAP"
#: The Schema Registry of the harness (``integration/services up registry``): a target made
#: with ``value_format="avro"`` writes Confluent Avro values through it.
REGISTRY = "TXSINK_SCHEMA_REGISTRY_URL"
S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY, S3_REGION = (
    "TXSINK_S3_ENDPOINT",
    "TXSINK_S3_ACCESS_KEY",
    "TXSINK_S3_SECRET_KEY",
    "TXSINK_S3_REGION",
)


def s3_wal_options(env: Mapping[str, str]) -> dict[str, Any]:
    """``wal_options`` (``pyarrow.fs.S3FileSystem``'s) for the S3 server ``env`` names."""
    endpoint = env[S3_ENDPOINT]
    scheme, _, address = endpoint.rpartition("://")
    return {
        "endpoint_override": address,
        "scheme": scheme or "https",
        "access_key": env.get(S3_ACCESS_KEY) or None,
        "secret_key": env.get(S3_SECRET_KEY) or None,
        "region": env.get(S3_REGION) or "us-east-1",
        "connect_timeout": 3,
        "request_timeout": 10,
    }


def wal_store(spec: Mapping[str, Any], env: Mapping[str, str]) -> WalStore:
    """The WAL location of a spec: its folder, or its S3 URL on the server of ``env``."""
    url = str(spec["wal"])
    return WalStore(url, s3_wal_options(env) if url.startswith("s3://") else None)


def _bucket(spec: Mapping[str, Any]) -> str | None:
    wal = str(spec.get("wal", ""))
    return wal[len("s3://") :].partition("/")[0] if wal.startswith("s3://") else None


def _uploads(env: Mapping[str, str], bucket: str) -> list[tuple[str, str]]:
    """The incomplete multipart uploads of ``bucket``: (key, upload id)."""
    listing = _s3_client(env).list_multipart_uploads(Bucket=bucket)
    return [(u["Key"], u["UploadId"]) for u in listing.get("Uploads", [])]


def _s3_client(env: Mapping[str, str]) -> Any:
    import boto3

    return boto3.session.Session().client(
        "s3",
        endpoint_url=env[S3_ENDPOINT],
        aws_access_key_id=env.get(S3_ACCESS_KEY) or None,
        aws_secret_access_key=env.get(S3_SECRET_KEY) or None,
        region_name=env.get(S3_REGION) or "us-east-1",
    )


@dataclass
class KafkaVerifier:
    """A Kafka topic read with ``isolation.level=read_committed`` (JSON values with an id).

    lingering = files left in the write-ahead log (``wal``: its folder or S3 prefix), plus
    one per partition whose last stable offset is behind its high watermark (a
    transaction still open).
    """

    bootstrap: str
    topic: str
    expected: Iterable[int]
    wal: str | WalStore | None = None
    #: The reader's own client settings (TLS, SASL) on a secured cluster; no secret shown.
    config: Mapping[str, Any] | None = field(default=None, repr=False)
    #: How many incomplete multipart uploads the WAL's bucket holds (a WAL on S3).
    uploads: Callable[[], int] | None = field(default=None, repr=False)
    id_field: str = "id"
    timeout_s: float = 60.0
    #: Avro values: the registry's URL; each value is read with confluent-kafka's own
    #: ``AvroDeserializer`` (the writer's schema by its id), not txsink's code.
    registry: str | None = None
    #: The offsets (last stable, high) a wait for settled ends gave up on: a transaction
    #: open then. The same offsets read again are the same open transaction.
    _open: tuple[dict[int, int], dict[int, int]] | None = field(
        default=None, init=False, repr=False
    )

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        return [int(v[self.id_field]) for v in self.read_values()]

    def read_values(self) -> list[dict[str, Any]]:
        """Every committed record's value, decoded as a downstream reader would."""
        stable, _ = self._ends()
        records = readback.read_records(
            self.bootstrap,
            self.topic,
            timeout_s=self.timeout_s,
            ends=stable,
            client_config=self.config,
        )
        return self.values([r.value for r in records])

    def values(self, raw: list[bytes | None]) -> list[dict[str, Any]]:
        """The values as a downstream reader decodes them (JSON, or Avro by the registry)."""
        decode = value_decoder(self.topic, self.registry)
        return [decode(v) for v in raw]

    def _ends(self) -> tuple[dict[int, int], dict[int, int]]:
        """The last stable offsets and high watermarks once they agree (a transaction
        committed a moment ago may not have its markers everywhere yet: a few seconds for
        them), without waiting again on a transaction already found open: ``read_ids``
        then ``lingering`` wait once, not twice (10 s each while a transaction is open)."""
        admin = readback.admin_client(self.bootstrap, self.config)
        if self._open is not None:
            now = (
                topic_ends(admin, self.topic, "read_committed", self.timeout_s),
                topic_ends(admin, self.topic, "read_uncommitted", self.timeout_s),
            )
            if now == self._open:
                return now
        stable, high, _ = settled_ends(admin, self.topic, self.timeout_s, wait_s=10.0)
        still_open = any(stable.get(p, 0) < end for p, end in high.items())
        self._open = (stable, high) if still_open else None
        return stable, high

    def lingering(self) -> int:
        left = 0
        if isinstance(self.wal, WalStore):
            left += len(self.wal.list_files())
            left += self.uploads() if self.uploads is not None else 0
        elif self.wal is not None and os.path.isdir(self.wal):
            left += sum(len(files) for _, _, files in os.walk(self.wal))
        stable, high = self._ends()
        return left + sum(1 for p, end in high.items() if stable.get(p, 0) < end)


def value_decoder(topic: str, registry: str | None) -> Callable[[bytes | None], Any]:
    """How a downstream reader decodes the topic's values: JSON, or (``registry``: its URL)
    Confluent Avro with confluent-kafka's own ``AvroDeserializer``, not txsink's code."""
    if registry is None:
        return lambda value: json.loads(value or b"null")
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    decode = AvroDeserializer(SchemaRegistryClient({"url": registry}))
    where = SerializationContext(topic, MessageField.VALUE)
    return lambda value: decode(value, where)


class KafkaTarget:
    """A Kafka topic read by one long-lived consumer (values are JSON objects with an id).

    ``isolation="read_committed"`` is the guaranteed view; ``"read_uncommitted"`` is a
    boundary view (it can show records of aborted transactions). The consumer reads on
    from where it was at every sample, so a sample costs what is new.
    """

    counts_rows = True

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        isolation: str = "read_committed",
        name: str | None = None,
        id_field: str = "id",
        config: Mapping[str, Any] | None = None,
        registry: str | None = None,
    ) -> None:
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ValueError(
                f"KafkaTarget: isolation must be read_(un)committed, not {isolation!r}"
            )
        self.bootstrap = bootstrap
        self.topic = topic
        self.isolation = isolation
        self.name = name or ("kafka" if isolation == "read_committed" else "kafka-uncommitted")
        self.guaranteed = isolation == "read_committed"
        self.id_field = id_field
        self.config = dict(config or {})
        self._consumer: Any = None
        self._ids: list[int] = []
        self._logs: dict[int, list[int]] = {}
        self._decode = value_decoder(topic, registry)

    def _open(self) -> Any:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        quiet = rdkafka_logger("txsink.testing.observer.rdkafka", silent=True)
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": f"txsink-observer-{uuid.uuid4().hex[:12]}",
            "isolation.level": self.isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 20,
            "logger": quiet,
        }
        conf.update(self.config)
        consumer = Consumer(conf)
        meta = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
        if meta is None or meta.error is not None:
            consumer.close()
            raise LookupError(f"topic {self.topic!r} not found")
        consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        return consumer

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        if self._consumer is None:
            self._consumer = self._open()
        # Drain what is readable now; stop at the first empty poll.
        while True:
            msg = self._consumer.poll(0.02)
            if msg is None:
                break
            if msg.error() is not None:
                continue  # partition EOF and transient errors: the next sample reads on
            value = msg.value()
            with contextlib.suppress(ValueError, TypeError, KeyError):
                id_ = int(self._decode(value)[self.id_field])
                self._ids.append(id_)
                self._logs.setdefault(int(msg.partition()), []).append(id_)
        # The partitions' logs in order: the history checker's epoch-order check.
        return by_epoch(self._ids, epoch_of, logs=self._logs)

    def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()
            self._consumer = None


class KafkaTesting(ConnectorTesting):
    """A fresh topic (3 partitions) per target; its own transactional ids and WAL (a
    folder in the workdir; ``wal_store="s3"``: a fresh bucket on the S3 server)."""

    name: ClassVar[str] = "kafka"
    env_vars: ClassVar[tuple[str, ...]] = (BOOTSTRAP,)
    #: Kafka first (the service a test's proxy routes); S3 for the ``wal-s3`` variant.
    services: ClassVar[tuple[str, ...]] = ("kafka", "s3")
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "wal": {"mode": "wal"},
        # replay and direct with the epoch header: their runs end with txsink audit
        "replay": {"mode": "replay", "epoch_header": True},
        "wal-s3": {"mode": "wal", "wal_store": "s3"},
        "direct": {"mode": "direct", "shards": 8, "epoch_header": True},
    }
    #: The WAL on S3 is WAL mode with its files elsewhere: a few cells by default.
    slow_variants: ClassVar[frozenset[str]] = frozenset({"wal-s3"})
    single_pass_variants: ClassVar[frozenset[str]] = frozenset({"direct"})
    #: A topic that takes records of at most 64 KiB: a longer payload must be refused in
    #: the pre-commit (the broker would refuse it at the commit, after the decision).
    poison: ClassVar[tuple[Mapping[str, Any], int] | None] = ({"max_message_bytes": 65536}, 65536)
    #: On the secured broker: the two ways the marker reaches Kafka (WAL: the markers'
    #: shared topic; direct: the sink's own, transactions open until the decision). Replay
    #: needs the same rights as WAL (connectors/kafka/acls.py). Own uids: one query may
    #: hold both.
    secure_variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "secure-wal": {"mode": "wal", "server": "secure", "uid": "ksec-wal"},
        "secure-direct": {"mode": "direct", "shards": 8, "server": "secure", "uid": "ksec-direct"},
    }
    secure_services: ClassVar[tuple[str, ...]] = ("kafka_secure",)

    @staticmethod
    def _secure(spec: Mapping[str, Any]) -> bool:
        return spec.get("server") == "secure"

    def _bootstrap(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> str:
        return env[secure_testing.SECURE_BOOTSTRAP if self._secure(spec) else BOOTSTRAP]

    def _admin(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any] | None:
        """The reading and administering client's settings: the secured broker's
        administrator, or none (a plain broker)."""
        return secure_testing.security(env, admin=True) if self._secure(spec) else None

    @override
    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        """A fresh topic; on the secured broker (``server="secure"``) made, with the marker
        topic and the least-privileged principal's rights, by the administrator."""
        topic = f"txsink-{tag}".replace("_", "-")
        wal = str(Path(workdir, f"kafka-wal-{tag}"))
        if options.get("wal_store") == "s3":
            if not env.get(S3_ENDPOINT):
                raise LookupError(f"the wal-s3 variant needs an S3 server: set {S3_ENDPOINT}")
            bucket = f"txsink-wal-{tag}".replace("_", "-").lower()[:63]
            _s3_client(env).create_bucket(Bucket=bucket)
            wal = f"s3://{bucket}/wal"
        spec = {
            "kind": self.name,
            "topic": topic,
            "uid": options.get("uid", "kafka"),
            "wal": wal,
            "key": options.get("key", "key"),
            "shards": options.get("shards", 2),
            "mode": options.get("mode", "wal"),
            # Separate pipelines need their own transactional ids, or they fence each other.
            "transactional_id_prefix": f"txsink-{tag}",
        }
        if options.get("value_format") == "avro":  # no variant: it needs the registry too
            spec["value_format"] = "avro"
        if self._secure(options):
            spec["server"] = "secure"
            sink = self.build_sink(spec, env)
            secure_testing.make_topics(sink, env)
            secure_testing.grant(sink, env)
            return spec
        limit = options.get("max_message_bytes")
        config = {"max.message.bytes": str(limit)} if limit else None
        readback.create_topic(env[BOOTSTRAP], topic, partitions=3, config=config)
        return spec

    @override
    def sink_options(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Without ``server`` (which of the harness's brokers: the adapter's key)."""
        return {k: v for k, v in super().sink_options(spec).items() if k != "server"}

    @override
    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> KafkaSink:
        return KafkaSink(
            self._bootstrap(spec, env),
            spec["topic"],
            uid=spec.get("uid", "kafka"),
            wal=spec["wal"],
            wal_options=s3_wal_options(env) if str(spec["wal"]).startswith("s3://") else None,
            key=spec.get("key", "key"),
            shards=spec.get("shards", 2),
            mode=spec.get("mode", "wal"),
            transactional_id_prefix=spec.get("transactional_id_prefix", "txsink"),
            timeout_s=float(spec.get("timeout_s", 30.0)),
            epoch_header=bool(spec.get("epoch_header", False)),
            # The least-privileged principal on the secured broker.
            producer_config=secure_testing.security(env) if self._secure(spec) else None,
            **self._avro(spec, env),
        )

    @staticmethod
    def _avro(spec: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
        """Avro values through the harness's registry, for a spec of ``value_format="avro"``."""
        if spec.get("value_format") != "avro":
            return {}
        if not env.get(REGISTRY):
            raise LookupError(f"an Avro target needs the Schema Registry: set {REGISTRY}")
        return {"value_format": "avro", "schema_registry": {"url": env[REGISTRY]}}

    @override
    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        wal = wal_store(spec, env) if spec.get("wal") else None
        bucket = _bucket(spec)
        uploads = None if bucket is None else (lambda: len(_uploads(env, bucket)))
        return KafkaVerifier(
            self._bootstrap(spec, env),
            spec["topic"],
            expected,
            wal=wal,
            uploads=uploads,
            config=self._admin(spec, env),
            registry=env.get(REGISTRY) if spec.get("value_format") == "avro" else None,
        )

    @override
    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        bootstrap, admin = self._bootstrap(spec, env), self._admin(spec, env)
        registry = env.get(REGISTRY) if spec.get("value_format") == "avro" else None
        return [
            KafkaTarget(bootstrap, spec["topic"], config=admin, registry=registry),
            KafkaTarget(
                bootstrap,
                spec["topic"],
                isolation="read_uncommitted",
                config=admin,
                registry=registry,
            ),
        ]

    @override
    def drop_target(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> None:
        """Delete the topic and the WAL's bucket, best effort (a WAL folder lives in the
        test's workdir).

        Direct mode: first abort whatever transaction a test left open (a prepared but
        never committed shard is an open Kafka transaction), then delete the sink's own
        marker topic. Then this process's pooled producers are closed: a test that ran a
        task's code here (the contract suite) leaves them, and only worker processes
        should keep them. On the secured broker the administrator deletes, and takes the
        principal's rights back last."""
        from txsink.connectors.kafka import direct
        from txsink.connectors.kafka.clients import pool

        bootstrap, admin = self._bootstrap(spec, env), self._admin(spec, env)
        if spec.get("mode") == "direct":
            sink = self.build_sink(spec, env)
            with contextlib.suppress(Exception):
                fence(
                    sink.settings,
                    [sink.transactional_id(s) for s in range(sink.shards)],
                    phase="abort",
                )
            if sink.marker_topic != SHARED_MARKER_TOPIC:  # others' markers live there too
                with contextlib.suppress(Exception):
                    readback.delete_topic(bootstrap, sink.marker_topic, client_config=admin)
        pool.clear()
        direct.clear()
        with contextlib.suppress(Exception):
            readback.delete_topic(bootstrap, spec["topic"], client_config=admin)
        if self._secure(spec):
            with contextlib.suppress(Exception):
                secure_testing.revoke(self.build_sink(spec, env), env)
        bucket = _bucket(spec)
        if bucket is not None:
            with contextlib.suppress(Exception):
                client = _s3_client(env)
                for key, upload in _uploads(env, bucket):
                    client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
                wal_store(spec, env).delete_dir("")
                client.delete_bucket(Bucket=bucket)

    @override
    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The brokers (and the secured broker's, which name password files, not
        passwords), the S3 server of a WAL on S3, and the registry of an Avro target."""
        names = (
            BOOTSTRAP,
            REGISTRY,
            *secure_testing.SECURE_VARS,
            S3_ENDPOINT,
            S3_ACCESS_KEY,
            S3_SECRET_KEY,
            S3_REGION,
        )
        return {var: env[var] for var in names if var in env}


ADAPTER = KafkaTesting()
