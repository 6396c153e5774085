"""The Kafka adapter's secured targets (:attr:`KafkaTesting.secure_variants
<txsink.connectors.kafka.testing.KafkaTesting.secure_variants>`): the harness's secured
broker (``integration/services up kafka_secure``: SASL_SSL with SCRAM-SHA-512, the CA
verified, ACLs on and nothing allowed without one).

Three roles, as on a production cluster:

* the administrator (the harness's admin principal) creates the data topic and, unless it
  exists, the compacted marker topic, and grants the least-privileged principal exactly
  the rights of :func:`~txsink.connectors.kafka.acls.required_acls` (what ``kafka-acls``
  lines in docs/security.md grant); :func:`revoke` takes them back when the target is
  dropped;
* the sink runs as the least-privileged principal (:func:`security` without ``admin``);
* the verifier and the observer read back as the administrator, ``read_committed``.

The environment names the broker, its CA and each principal's password *file*
(``TXSINK_KAFKA_SECURE_*``); passwords are read when a client is made and never enter a
spec, a child's environment or a log.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.connectors.kafka import readback
from txsink.connectors.kafka.acls import create_acls, delete_acls, required_acls

if TYPE_CHECKING:
    from txsink.connectors.kafka.sink import KafkaSink

__all__ = [
    "SECURE_BOOTSTRAP",
    "SECURE_VARS",
    "grant",
    "make_topics",
    "revoke",
    "security",
]

_PREFIX = "TXSINK_KAFKA_SECURE_"
SECURE_BOOTSTRAP = f"{_PREFIX}BOOTSTRAP"
#: The secured broker's variables (no secret: the passwords' files are named, not read).
SECURE_VARS = tuple(
    f"{_PREFIX}{name}"
    for name in ("BOOTSTRAP", "CA", "USER", "PASSWORD_FILE", "ADMIN_USER", "ADMIN_PASSWORD_FILE")
)
#: What an administrator gives the marker topic (the sink refuses one that is not compact).
_MARKER_CONFIG = {"cleanup.policy": "compact"}


def security(env: Mapping[str, str], *, admin: bool = False) -> dict[str, Any]:
    """confluent-kafka settings of the least-privileged principal (``admin``: the
    administrator) on the secured broker: SASL_SSL, SCRAM-SHA-512, the CA verified, the
    password read from its file now."""
    user = env[f"{_PREFIX}ADMIN_USER" if admin else f"{_PREFIX}USER"]
    password_file = env[f"{_PREFIX}ADMIN_PASSWORD_FILE" if admin else f"{_PREFIX}PASSWORD_FILE"]
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": user,
        "sasl.password": Path(password_file).read_text(),
        "ssl.ca.location": env[f"{_PREFIX}CA"],
        "ssl.endpoint.identification.algorithm": "https",
    }


def make_topics(sink: KafkaSink, env: Mapping[str, str], *, partitions: int = 3) -> None:
    """As the administrator: the sink's data topic, and its marker topic (compacted) unless
    it exists (the shared one serves every WAL- and replay-mode sink)."""
    bootstrap, admin = env[SECURE_BOOTSTRAP], security(env, admin=True)
    if sink.topic is not None:
        readback.create_topic(bootstrap, sink.topic, partitions, client_config=admin)
    marker = sink.settings.marker_topic
    if marker not in readback.admin_client(bootstrap, admin).list_topics(timeout=30).topics:
        readback.create_topic(bootstrap, marker, 1, config=_MARKER_CONFIG, client_config=admin)


def grant(sink: KafkaSink, env: Mapping[str, str]) -> None:
    """As the administrator: exactly the sink's least rights, to its principal."""
    acls = required_acls(sink.settings, sink.topic)
    admin = readback.admin_client(env[SECURE_BOOTSTRAP], security(env, admin=True))
    create_acls(admin, acls, env[f"{_PREFIX}USER"])


def revoke(sink: KafkaSink, env: Mapping[str, str]) -> None:
    """As the administrator: take :func:`grant`'s rights back.

    Rights two targets share (the cluster's DescribeConfigs, the shared marker topic's) go
    with the first target dropped: targets are dropped when their test ends, after the
    runs that needed them."""
    acls = required_acls(sink.settings, sink.topic)
    admin = readback.admin_client(env[SECURE_BOOTSTRAP], security(env, admin=True))
    delete_acls(admin, acls, env[f"{_PREFIX}USER"])
