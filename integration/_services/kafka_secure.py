"""A secured Apache Kafka: one KRaft node like :mod:`.kafka`, but TLS everywhere, SCRAM
logins and ACLs on, so tests see what a production cluster refuses.

Made afresh at every start (nothing in it is worth keeping): a throw-away CA, a broker
certificate for ``IP:127.0.0.1``, random passwords, a newly formatted data folder.

Listeners (all on 127.0.0.1, ports from :func:`~.common.choose_port`):

- ``CLIENT`` (``SASL_SSL``, SCRAM-SHA-512): what clients use. Two SCRAM users exist, added
  at ``kafka-storage format --add-scram``: the harness's admin ``txsink-admin`` (a super
  user: tests create topics and ACLs with it) and the application ``txsink-app``, which
  has no right at all until a test grants it some.
- ``INTERNAL`` and ``CONTROLLER`` (``SSL`` with client certificates required): the broker
  talks to itself and its controller as ``User:CN=txsink-broker``, the only other super
  user. No listener is open without a certificate or a password.

``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: a principal may do
only what an ACL grants. Passwords go to 0600 files whose paths the env file names (the
env file holds no secret in clear text); they appear nowhere in the harness's logs.
"""

from __future__ import annotations

import datetime
import secrets
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar

from .common import (
    LOG_DIR,
    LOOPBACK,
    WORK_DIR,
    StartReport,
)
from .kafka import (
    Broker,
    cluster_answers,
    format_storage,
    java,
    java_and_jars,
    warm_up_transactions,
    write_config,
)

DEFAULT_PORT = 59192
DEFAULT_INTERNAL_PORT = 59193
DEFAULT_CONTROLLER_PORT = 59194

SECURE_DIR = WORK_DIR / "kafka_secure"
DATA_DIR = SECURE_DIR / "data"
TLS_DIR = SECURE_DIR / "tls"
SECRETS_DIR = SECURE_DIR / "secrets"
PROPERTIES = SECURE_DIR / "server.properties"
LOG4J = SECURE_DIR / "log4j2.properties"
LOG_FILE = LOG_DIR / "kafka_secure.log"
STDOUT_FILE = LOG_DIR / "kafka_secure.out"

MECHANISM = "SCRAM-SHA-512"
APP_USER = "txsink-app"
ADMIN_USER = "txsink-admin"
BROKER_CN = "txsink-broker"


def password_file(user: str) -> Path:
    return SECRETS_DIR / f"{user}.password"


def _write_secret(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by us only (created 0600, never wider)."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def make_tls(folder: Path) -> tuple[Path, Path]:
    """A throw-away CA and a broker key + certificate (``IP:127.0.0.1``, server and client
    use: the broker presents it to clients and to its own controller).

    Returns (CA certificate, broker PEM keystore: unencrypted PKCS#8 key then the chain),
    the two files Kafka's ``ssl.*.type=PEM`` stores read.
    """
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "txsink test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BROKER_CN)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(LOOPBACK)), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    ca_file = folder / "ca.pem"
    keystore = folder / "broker.pem"
    folder.mkdir(parents=True, exist_ok=True)
    ca_file.write_bytes(ca_cert.public_bytes(pem))
    _write_secret(
        keystore,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
        + ca_cert.public_bytes(pem),
    )
    return ca_file, keystore


def client_config(state: dict[str, Any], user: str) -> dict[str, Any]:
    """confluent-kafka settings of ``user`` on the CLIENT listener (CA-verified)."""
    return {
        "bootstrap.servers": f"{LOOPBACK}:{state['port']}",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password_file(user).read_text(),
        "ssl.ca.location": str(TLS_DIR / "ca.pem"),
        "ssl.endpoint.identification.algorithm": "https",
    }


class KafkaSecure(Broker):
    name = "kafka_secure"
    default_ports: ClassVar[dict[str, int]] = {
        "port": DEFAULT_PORT,
        "internal_port": DEFAULT_INTERNAL_PORT,
        "controller_port": DEFAULT_CONTROLLER_PORT,
    }
    properties = PROPERTIES
    logs = ((LOG_FILE, 25), (STDOUT_FILE, 10))

    def healthy(self, state: dict[str, Any]) -> bool:
        if not self.listening(state) or not password_file(ADMIN_USER).exists():
            return False
        return cluster_answers(client_config(state, ADMIN_USER))

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        return {
            "TXSINK_KAFKA_SECURE_BOOTSTRAP": f"{LOOPBACK}:{state['port']}",
            "TXSINK_KAFKA_SECURE_CA": str(TLS_DIR / "ca.pem"),
            "TXSINK_KAFKA_SECURE_USER": APP_USER,
            "TXSINK_KAFKA_SECURE_PASSWORD_FILE": str(password_file(APP_USER)),
            "TXSINK_KAFKA_SECURE_ADMIN_USER": ADMIN_USER,
            "TXSINK_KAFKA_SECURE_ADMIN_PASSWORD_FILE": str(password_file(ADMIN_USER)),
        }

    def _write_config(self, state: dict[str, Any], keystore: Path, ca: Path) -> None:
        port, iport, cport = state["port"], state["internal_port"], state["controller_port"]
        props = {
            "controller.quorum.voters": f"1@{LOOPBACK}:{cport}",
            "listeners": (
                f"CLIENT://{LOOPBACK}:{port},INTERNAL://{LOOPBACK}:{iport},"
                f"CONTROLLER://{LOOPBACK}:{cport}"
            ),
            "advertised.listeners": f"CLIENT://{LOOPBACK}:{port},INTERNAL://{LOOPBACK}:{iport}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SSL,CONTROLLER:SSL",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(ca),
            "listener.name.internal.ssl.client.auth": "required",
            "listener.name.controller.ssl.client.auth": "required",
            "sasl.enabled.mechanisms": MECHANISM,
            "listener.name.client.sasl.enabled.mechanisms": MECHANISM,
            "listener.name.client.scram-sha-512.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:CN={BROKER_CN};User:{ADMIN_USER}",
            "log.dirs": str(DATA_DIR),
        }
        # Every refused request is a WARN/INFO line of the authorizer's naming principal and
        # resource.
        loggers = {"state.change.logger": "WARN", "kafka.authorizer.logger": "INFO"}
        write_config(PROPERTIES, props, LOG4J, LOG_FILE, loggers)

    def _format(self, jars: Path, report: StartReport) -> None:
        """Format a fresh data folder with both SCRAM users (new passwords every start).

        The command line carries the passwords for the second the tool runs; it is not
        written to any log (``run`` without ``log_path``)."""
        if DATA_DIR.exists():
            shutil.rmtree(DATA_DIR)
        t0 = time.monotonic()
        scram = []
        for user in (ADMIN_USER, APP_USER):
            password = secrets.token_urlsafe(24)
            _write_secret(password_file(user), password.encode())
            scram += ["--add-scram", f"{MECHANISM}=[name={user},password={password}]"]
        format_storage(jars, LOG4J, PROPERTIES, *scram)
        report.notes.append(f"storage formatted {time.monotonic() - t0:.1f}s")

    def warm_up(self, state: dict[str, Any]) -> None:
        """One transaction as the admin, so ``__transaction_state`` exists before tests."""
        warm_up_transactions(client_config(state, ADMIN_USER))

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        jars = java_and_jars(report)
        self.assign_ports(state, taken_ports, report)
        t0 = time.monotonic()
        ca, keystore = make_tls(TLS_DIR)
        report.notes.append(f"CA and broker certificate {time.monotonic() - t0:.1f}s")
        self._write_config(state, keystore, ca)
        self._format(jars, report)
        self.launch(
            java(jars, LOG4J, "kafka.Kafka", str(PROPERTIES)), state, STDOUT_FILE, cwd=SECURE_DIR
        )
