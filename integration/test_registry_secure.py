"""The Kafka sink's Avro format with a secured Schema Registry (issue 40): HTTPS with a
throw-away CA, HTTP basic auth, and a user holding the role ``developer`` only (register
and read schemas; no config, mode, delete or admin rights). The ``registry_secure``
service.

1. The sink registers its derived schema at the start-up check as that user, with
   confluent-kafka's own ``basic.auth.user.info`` and ``ssl.ca.location``, the password
   read from its 0600 file; one epoch commits; a read_committed consumer and the
   administrator's registry client decode every id exactly once.
2. A missing or wrong password, a user without the right to write schemas, and a client
   that does not trust the registry's CA are each refused at the start-up check with the
   setting to fix; nothing reaches the topic or the registry.
3. The password is in none of the run's artifacts (the sink's repr, the WAL and log
   folders, captured output and log records, the harness's env file and logs).

The registry is ``integration/services up registry_secure`` (its env:
TXSINK_REGISTRY_SECURE_*), started when missing; without it the tests are skipped, under
``CI=true`` they fail. The broker is the plain one (``kafka``): the secured broker's
rights are ``test_kafka_secure.py``'s subject, and both meet in
``test_secure_cross_system.py``.
"""

from __future__ import annotations

import json
import logging
import secrets
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _services.common import ENV_FILE, LOG_DIR, ServiceError, real_servers_required, redact
from _services.registry_secure import request
from _services.resolve import resolve_registry_secure
from readback import open_transactions, read_topic

from txsink.connectors.kafka import KafkaSink
from txsink.errors import ConfigurationError
from txsink.testing.contract import SCHEMA, commit, rows
from txsink.txid import TxnId

pytestmark = [pytest.mark.registry_secure, pytest.mark.kafka]


class SecureRegistry:
    """The secured registry as its env describes it; passwords are read from their files
    when a client is made, the way a user's deployment keeps them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.url = env["TXSINK_REGISTRY_SECURE_URL"]
        self.ca = env["TXSINK_REGISTRY_SECURE_CA"]
        self.user = env["TXSINK_REGISTRY_SECURE_USER"]
        self.admin_user = env["TXSINK_REGISTRY_SECURE_ADMIN_USER"]
        self._files = {
            self.user: env["TXSINK_REGISTRY_SECURE_PASSWORD_FILE"],
            self.admin_user: env["TXSINK_REGISTRY_SECURE_ADMIN_PASSWORD_FILE"],
        }

    def password(self, user: str) -> str:
        return Path(self._files[user]).read_text().strip()

    def config(self, user: str | None = None, password: str | None = None) -> dict[str, Any]:
        """confluent-kafka's ``SchemaRegistryClient`` config of ``user`` (the app's)."""
        user = user or self.user
        secret = password if password is not None else self.password(user)
        return {
            "url": self.url,
            "ssl.ca.location": self.ca,
            "basic.auth.user.info": f"{user}:{secret}",
        }

    def admin_client(self) -> Any:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        return SchemaRegistryClient(self.config(self.admin_user))

    def subjects(self) -> list[str]:
        return list(self.admin_client().get_subjects() or [])

    def admin_request(self, path: str, method: str, body: dict[str, Any]) -> Any:
        admin = self.admin_user
        return request(
            f"{self.url}{path}", admin, self.password(admin), method=method, body=body,
            ca=Path(self.ca),
        )  # fmt: skip

    def add_user(self, role: str) -> tuple[str, str, int]:
        """A new user with ``role`` and a random password, made by the administrator: its
        name, password and id."""
        name, password = f"u{uuid.uuid4().hex[:8]}", secrets.token_urlsafe(18)
        made = self.admin_request(
            "/admin/users", "POST", {"username": name, "password": password, "role": role}
        )
        return name, password, int(made["id"])


@pytest.fixture(scope="module")
def secure_registry() -> Iterator[SecureRegistry]:
    """The ``registry_secure`` service (started if need be); skipped when it cannot start,
    an error under ``CI=true``, like every other service."""
    try:
        env = resolve_registry_secure()
    except (ServiceError, OSError) as exc:
        message = f"registry_secure server unavailable: {redact(str(exc))}"
        if real_servers_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    yield SecureRegistry(env)


def _sink(kafka: Any, tmp: Path, topic: str, registry: dict[str, Any]) -> KafkaSink:
    return KafkaSink(
        kafka.bootstrap,
        topic,
        uid=f"r{uuid.uuid4().hex[:8]}",
        wal=tmp / "wal",
        key="key",
        value_format="avro",
        schema_registry=registry,
    )


def test_avro_through_basic_auth_over_tls_exactly_once_and_no_secret_left(
    kafka: Any,
    secure_registry: SecureRegistry,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    reg = secure_registry
    caplog.set_level(logging.DEBUG)
    topic = kafka.new_topic(2)
    sink = _sink(kafka, tmp_path, topic, reg.config())
    sink.check(SCHEMA, "app")  # registers the derived schema as the developer user
    latest = reg.admin_client().get_latest_version(f"{topic}-value")
    assert [f["name"] for f in json.loads(latest.schema.schema_str)["fields"]] == [
        "id", "amount", "payload"
    ]  # fmt: skip
    parts = [range(0, 30), range(30, 50)]
    handles = []
    for p, ids in enumerate(parts):
        open_ = sink.begin(TxnId("app", sink.uid, 0, 0, p, 9000 + p), SCHEMA)
        sink.write(open_, rows(ids))
        handles.append(sink.prepare(open_))
    assert commit(sink, 0, handles), "no unit reported committed"
    decode = AvroDeserializer(reg.admin_client())
    ctx = SerializationContext(topic, MessageField.VALUE)
    seen = Counter(decode(r.value, ctx)["id"] for r in read_topic(kafka.bootstrap, topic))
    assert sorted(seen) == list(range(50)), "missing or extra ids"
    assert max(seen.values()) == 1, f"duplicates: {[i for i, n in seen.items() if n > 1]}"
    assert open_transactions(kafka.bootstrap, topic) == 0
    # The password is nowhere the run left anything.
    secret = reg.password(reg.user)
    assert secret not in repr(sink)
    out, err = capfd.readouterr()
    assert secret not in out + err
    assert secret not in caplog.text
    harness = [ENV_FILE, *LOG_DIR.glob("*")] if LOG_DIR.exists() else []
    files = [*tmp_path.rglob("*"), *harness]
    leaked = [p for p in files if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaked, f"the password is in {leaked}"


@pytest.mark.parametrize("password", ["missing", "wrong"])
def test_missing_or_wrong_password_is_refused_at_start(
    kafka: Any, secure_registry: SecureRegistry, tmp_path: Path, password: str
) -> None:
    reg = secure_registry
    topic = kafka.new_topic(1)
    wrong = "not-" + secrets.token_hex(6)
    config = reg.config(password=wrong)
    if password == "missing":
        del config["basic.auth.user.info"]
    sink = _sink(kafka, tmp_path, topic, config)
    with pytest.raises(ConfigurationError, match=r"refused the credentials \(HTTP 401\)") as info:
        sink.check(SCHEMA, "app")
    message = str(info.value)
    assert "basic.auth.user.info" in message and "nothing was written" in message
    assert info.value.sink_uid == sink.uid and info.value.phase == "check"
    assert wrong not in message
    assert f"{topic}-value" not in reg.subjects()
    assert read_topic(kafka.bootstrap, topic) == []


def test_user_without_schema_write_is_refused_at_start(
    kafka: Any, secure_registry: SecureRegistry, tmp_path: Path
) -> None:
    reg = secure_registry
    user, password, _ = reg.add_user("readonly")
    topic = kafka.new_topic(1)
    sink = _sink(kafka, tmp_path, topic, reg.config(user, password))
    with pytest.raises(ConfigurationError, match=r"refused the request \(HTTP 403\)") as info:
        sink.check(SCHEMA, "app")
    assert "developer" in str(info.value) and password not in str(info.value)
    assert f"{topic}-value" not in reg.subjects()


def test_untrusted_certificate_names_the_ca_setting(
    kafka: Any, secure_registry: SecureRegistry, tmp_path: Path
) -> None:
    reg = secure_registry
    config = reg.config()
    del config["ssl.ca.location"]
    sink = _sink(kafka, tmp_path, kafka.new_topic(1), config)
    with pytest.raises(ConfigurationError, match=r"ssl\.ca\.location") as info:
        sink.check(SCHEMA, "app")
    assert reg.password(reg.user) not in str(info.value)


def test_a_password_changed_while_running_fails_the_task_with_the_fix(
    kafka: Any, secure_registry: SecureRegistry, tmp_path: Path
) -> None:
    """The password rotated between the start-up check and a task (whose registry client is
    new: the sink travels pickled): the pre-commit fails with the credentials' fix, naming
    the row, not with "fix the row"; nothing reaches the topic."""
    import pickle

    reg = secure_registry
    user, password, user_id = reg.add_user("developer")
    topic = kafka.new_topic(1)
    sink = _sink(kafka, tmp_path, topic, reg.config(user, password))
    sink.check(SCHEMA, "app")
    reg.admin_request(f"/admin/users/{user_id}", "PUT", {"password": secrets.token_urlsafe(18)})
    task_sink = pickle.loads(pickle.dumps(sink))  # as Spark ships it: no client yet
    open_ = task_sink.begin(TxnId("app", sink.uid, 0, 0, 0, 9100), SCHEMA)
    with pytest.raises(ConfigurationError, match=r"refused the credentials \(HTTP 401\)") as info:
        task_sink.write(open_, rows(range(3)))
    assert getattr(info.value.row, "offset", None) == 0 and info.value.column is not None
    assert password not in str(info.value)
    task_sink.discard(open_)
    assert read_topic(kafka.bootstrap, topic) == []
