"""KafkaSink on a secured broker (issue 40): SASL_SSL with SCRAM-SHA-512, the CA verified,
ACLs on (StandardAuthorizer, nothing allowed without an ACL), the sink's principal holding
exactly the rights of :func:`txsink.connectors.kafka.acls.required_acls`.

1. Each mode (``wal``, ``replay``, ``direct``) commits two epochs through the
   least-privilege principal (the second reads the markers the first wrote: the marker
   reader's group right is used only then); read back as the admin with a read_committed
   confluent-kafka consumer: every id once, no transaction left open.
2. Each right removed in turn: the start-up check names it with its ``kafka-acls`` grant
   line, and nothing reaches the topic.
3. The password is nowhere in the run's artifacts: the txsink log folder, the WAL,
   ``tmp_path``, the captured output and log records.

The server is ``integration/services up kafka_secure`` (its env: TXSINK_KAFKA_SECURE_*);
without it the tests are skipped, under ``CI=true`` they fail.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from _services.common import ENV_FILE, LOG_DIR, real_servers_required

from txsink import Coordinator
from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.acls import Acl, create_acls, delete_acls, required_acls
from txsink.connectors.kafka.clients.offsets import settled_ends
from txsink.errors import ConfigurationError

pytestmark = pytest.mark.kafka_secure

ROWS = 40
_VARS = ("BOOTSTRAP", "CA", "USER", "PASSWORD_FILE", "ADMIN_USER", "ADMIN_PASSWORD_FILE")


class SecureKafka:
    """The secured broker as its env describes it; passwords are read from their files
    when a client is made, the way a user's deployment keeps them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.bootstrap = env["BOOTSTRAP"]
        self.ca = env["CA"]
        self.user = env["USER"]
        self.admin_user = env["ADMIN_USER"]
        self._files = {self.user: env["PASSWORD_FILE"], self.admin_user: env["ADMIN_PASSWORD_FILE"]}

    def security(self, user: str) -> dict[str, Any]:
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": Path(self._files[user]).read_text(),
            "ssl.ca.location": self.ca,
            "ssl.endpoint.identification.algorithm": "https",
        }

    def password(self, user: str) -> str:
        return Path(self._files[user]).read_text()

    def admin(self) -> Any:
        """A new admin client: keep it until its futures are done."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, **self.security(self.admin_user)})


@pytest.fixture(scope="module")
def secure_kafka() -> SecureKafka:
    env = {v: os.environ.get(f"TXSINK_KAFKA_SECURE_{v}", "") for v in _VARS}
    if not all(env.values()):
        msg = "no secured Kafka: run `integration/services up kafka_secure` and source its env"
        if real_servers_required():
            pytest.fail(msg + " (CI=true needs every server)")
        pytest.skip(msg)
    return SecureKafka(env)


def _topics(kafka: SecureKafka, *names: str, compact: tuple[str, ...] = ()) -> None:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    new = [
        NewTopic(
            n,
            1 if n in compact else 2,
            1,
            config={"cleanup.policy": "compact"} if n in compact else {},
        )
        for n in names
    ]
    admin = kafka.admin()
    for future in admin.create_topics(new).values():
        future.result(timeout=30)


def _sink(kafka: SecureKafka, tmp: Path, mode: str, uid: str, topic: str) -> KafkaSink:
    return KafkaSink(
        kafka.bootstrap,
        topic,
        uid=uid,
        mode=mode,  # type: ignore[arg-type]
        wal=str(tmp / "wal") if mode == "wal" else None,
        key="key",
        value="value",
        shards=2,
        producer_config=kafka.security(kafka.user),
        timeout_s=20.0,
    )


def _read_committed(kafka: SecureKafka, topic: str) -> list[bytes | None]:
    """Every record of ``topic`` a read_committed consumer (as the admin) sees."""
    from confluent_kafka import Consumer, TopicPartition

    admin = kafka.admin()
    partitions = list(admin.list_topics(topic, timeout=30).topics[topic].partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            **kafka.security(kafka.admin_user),
            "group.id": f"readback-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    values: list[bytes | None] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        at_end: set[int] = set()
        while len(at_end) < len(partitions):
            msg = consumer.poll(30)
            if msg is None:
                raise TimeoutError(f"{topic}: no end of partitions after 30 s")
            err = msg.error()
            if err is not None:
                if err.code() != err._PARTITION_EOF:
                    raise RuntimeError(f"{topic}: {err}")
                at_end.add(msg.partition() or 0)
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def _open_transactions(kafka: SecureKafka, topic: str) -> int:
    stable, high, _ = settled_ends(kafka.admin(), topic, 30.0, wait_s=10.0)
    return sum(1 for p, end in high.items() if stable.get(p, 0) < end)


def _granted(kafka: SecureKafka, sink: KafkaSink, topic: str, acls: list[Acl]) -> None:
    create_acls(kafka.admin(), acls, kafka.user)


@pytest.mark.spark
@pytest.mark.parametrize(
    "mode",
    [
        "wal",
        # The same rights (connectors/kafka/acls.py): the default suite runs one mode.
        pytest.param("replay", marks=pytest.mark.slow),
        pytest.param("direct", marks=pytest.mark.slow),
    ],
)
def test_each_mode_commits_exactly_once_with_least_privilege(
    secure_kafka: SecureKafka,
    spark: Any,
    tmp_path: Path,
    mode: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    kafka = secure_kafka
    uid = f"sec{uuid.uuid4().hex[:8]}"
    topic = f"t-{uid}"
    sink = _sink(kafka, tmp_path, mode, uid, topic)
    _topics(kafka, topic)
    _topics(kafka, sink.settings.marker_topic, compact=(sink.settings.marker_topic,)) if (
        sink.settings.marker_topic not in kafka.admin().list_topics(timeout=10).topics
    ) else None
    acls = required_acls(sink.settings, topic)
    create_acls(kafka.admin(), acls, kafka.user)
    caplog.set_level(logging.DEBUG)
    try:
        coordinator = Coordinator([sink], log=str(tmp_path / "txlog"), app_id=f"app-{uid}")
        half = ROWS // 2
        for epoch, ids in enumerate((range(half), range(half, ROWS))):
            rows = [(i, f"k{i}", str(i)) for i in ids]
            df = spark.createDataFrame(rows, "id long, key string, value string")
            coordinator.write(df, epoch)
    finally:
        delete_acls(kafka.admin(), acls, kafka.user)
    values = Counter(int(v or b"-1") for v in _read_committed(kafka, topic))
    assert sorted(values) == list(range(ROWS)), "missing or extra ids"
    assert max(values.values()) == 1, f"duplicates: {[i for i, n in values.items() if n > 1]}"
    assert _open_transactions(kafka, topic) == 0
    assert _open_transactions(kafka, sink.settings.marker_topic) == 0
    # The password is nowhere the run left anything.
    secret = kafka.password(kafka.user)
    out, err = capfd.readouterr()
    assert secret not in out + err
    assert secret not in caplog.text
    # ... nor in what the harness wrote (its env file, the broker's logs) when it is local.
    harness = [ENV_FILE, *LOG_DIR.glob("*")] if LOG_DIR.exists() else []
    files = [*tmp_path.rglob("*"), *harness]
    leaked = [p for p in files if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaked, f"the password is in {leaked}"


def _rights_params() -> list[Any]:
    """One case per right of a sink (uid ``u``, topic ``t``), by its position."""
    from txsink.connectors.kafka.clients.settings import KafkaSettings

    probe = KafkaSettings("b", "u", "txsink", "m", 2, 1.0)
    role = {"t": "topic", "m": "marker"}
    return [
        pytest.param(i, id=f"{a.operation}-{role.get(a.name, a.kind)}")
        for i, a in enumerate(required_acls(probe, "t"))
    ]


SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string()), ("value", pa.string())])


def _replay_sink(kafka: SecureKafka) -> tuple[KafkaSink, str, str]:
    """A replay-mode sink of the least-privileged principal on a new topic, with its own
    new marker topic (made by the admin): the sink, its uid and its topic."""
    uid = f"sec{uuid.uuid4().hex[:8]}"
    topic, marker = f"t-{uid}", f"m-{uid}"
    _topics(kafka, topic, marker, compact=(marker,))
    sink = KafkaSink(
        kafka.bootstrap,
        topic,
        uid=uid,
        mode="replay",
        marker_topic=marker,
        key="key",
        value="value",
        producer_config=kafka.security(kafka.user),
        timeout_s=20.0,
    )
    return sink, uid, topic


@pytest.mark.parametrize("removed", _rights_params())
def test_each_missing_right_is_named_with_its_grant(
    secure_kafka: SecureKafka, tmp_path: Path, removed: int
) -> None:
    kafka = secure_kafka
    sink, uid, topic = _replay_sink(kafka)
    acls = required_acls(sink.settings, topic)
    gone = acls.pop(removed)
    create_acls(kafka.admin(), acls, kafka.user)
    try:
        with pytest.raises(ConfigurationError) as caught:
            sink.check(SCHEMA, f"app-{uid}")
    finally:
        delete_acls(kafka.admin(), acls, kafka.user)
    message = str(caught.value)
    assert gone.line(kafka.user, kafka.bootstrap) in message
    assert "lacks 1 right(s)" in message, message
    assert kafka.password(kafka.user) not in message
    assert _read_committed(kafka, topic) == []
    assert _read_committed(kafka, sink.settings.marker_topic) == []


def test_the_check_lists_the_topics_once(
    secure_kafka: SecureKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up check (rights, then brokers, topic and marker topic) asks the brokers
    for their topics once, and passes the answer on: with every right granted it passes,
    and its admin clients listed the topics one time."""
    from confluent_kafka import admin as kafka_admin

    kafka = secure_kafka
    sink, uid, topic = _replay_sink(kafka)
    listed: list[float] = []
    original = kafka_admin.AdminClient.list_topics

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        listed.append(1.0)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(kafka_admin.AdminClient, "list_topics", counting)
    acls = required_acls(sink.settings, topic)
    create_acls(kafka.admin(), acls, kafka.user)
    try:
        sink.check(SCHEMA, f"app-{uid}")
    finally:
        delete_acls(kafka.admin(), acls, kafka.user)
        sink.release()
    assert len(listed) == 1, f"the check listed the topics {len(listed)} times"
