"""``registry_secure``: the Schema Registry as production runs one: HTTPS only, HTTP basic
auth on every schema endpoint, and a least-privileged user for the sink.

The same AxonOps Schema Registry binary as :mod:`.registry` (built once), with its own
folder (``.work/registry_secure``) and config. Every start makes, afresh:

* a throw-away CA and a server certificate for ``IP:127.0.0.1`` (:mod:`.tls`), served by
  the registry's own TLS (``security.tls``): the port speaks HTTPS only;
* authentication on (``security.auth``, method ``basic``) with RBAC on: an administrator
  ``txsink-registry-admin`` made by the registry's bootstrap at start (its password goes to
  the server in ``SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD``, never into the config file), who
  then creates the application user ``txsink-app`` with the role ``developer`` through the
  admin API (``POST /admin/users``): ``schema:read`` and ``schema:write``, the least a sink
  needs (the registry maps ``POST /subjects/...``, lookup included, to ``schema:write``);
  no config, mode or delete rights;
* both passwords random, each in a 0600 file: the env names the files, never a secret.

Storage is in memory, as for :mod:`.registry`: every start is an empty registry, and the
users are made again (the bootstrap runs because the user table is empty).

The env it writes: ``TXSINK_REGISTRY_SECURE_URL`` (``https://127.0.0.1:<port>``),
``TXSINK_REGISTRY_SECURE_CA`` (the CA file: the client's ``ssl.ca.location``),
``TXSINK_REGISTRY_SECURE_USER`` and ``TXSINK_REGISTRY_SECURE_PASSWORD_FILE`` (the
application's ``basic.auth.user.info`` is ``user:<the file's content>``), and
``TXSINK_REGISTRY_SECURE_ADMIN_USER`` / ``..._ADMIN_PASSWORD_FILE`` for set-up and
read-back.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import ssl
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

from .common import LOG_DIR, LOOPBACK, WORK_DIR, ServiceError, StartReport, port_open
from .registry import COMPATIBILITY, Registry, build_registry
from .tls import make_server_certificate

DEFAULT_PORT = 58082
APP_USER = "txsink-app"
APP_ROLE = "developer"
ADMIN_USER = "txsink-registry-admin"
REALM = "txsink test registry"

SECURE_DIR = WORK_DIR / "registry_secure"
CONFIG = SECURE_DIR / "config.yaml"
CA_FILE = SECURE_DIR / "ca.crt"
CERTS_DIR = SECURE_DIR / "certs"
SECRETS_DIR = SECURE_DIR / "secrets"
LOG_FILE = LOG_DIR / "registry_secure.log"
TLS_LOG = LOG_DIR / "registry_secure-tls.log"


def password_file(user: str) -> Path:
    return SECRETS_DIR / f"{user}.password"


def _write_secret(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by us only (created 0600, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def request(
    url: str,
    user: str,
    password: str,
    *,
    method: str = "GET",
    body: Any = None,
    ca: Path = CA_FILE,
    timeout: float = 5.0,
) -> Any:
    """One authenticated JSON request over verified TLS; the decoded answer (None if empty).

    Raises ``urllib.error.HTTPError`` for an HTTP error status (401, 403, ...)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    headers = {"Authorization": f"Basic {token}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/vnd.schemaregistry.v1+json"
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    context = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


class RegistrySecure(Registry):
    """The Schema Registry over TLS with basic auth and a ``developer`` user (module doc)."""

    name = "registry_secure"
    default_ports: ClassVar[dict[str, int]] = {"port": DEFAULT_PORT}
    logs = ((LOG_FILE, 25),)

    def marker(self, state: dict[str, Any]) -> str:
        return str(CONFIG)

    def _url(self, state: dict[str, Any]) -> str:
        return f"https://{LOOPBACK}:{state['port']}"

    def healthy(self, state: dict[str, Any]) -> bool:
        """The admin reads ``/subjects`` over verified TLS (and, once made, the app user)."""
        port = state.get("port")
        if not isinstance(port, int) or not port_open(port):
            return False
        users = [ADMIN_USER] + ([APP_USER] if state.get("provisioned") else [])
        try:
            for user in users:
                password = password_file(user).read_text()
                request(f"{self._url(state)}/subjects", user, password)
        except Exception:
            return False
        return True

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        return {
            "TXSINK_REGISTRY_SECURE_URL": self._url(state),
            "TXSINK_REGISTRY_SECURE_CA": str(CA_FILE),
            "TXSINK_REGISTRY_SECURE_USER": APP_USER,
            "TXSINK_REGISTRY_SECURE_PASSWORD_FILE": str(password_file(APP_USER)),
            "TXSINK_REGISTRY_SECURE_ADMIN_USER": ADMIN_USER,
            "TXSINK_REGISTRY_SECURE_ADMIN_PASSWORD_FILE": str(password_file(ADMIN_USER)),
        }

    def _settings(self, state: dict[str, Any]) -> dict[str, str]:
        settings = super()._settings(state)
        settings.update(
            {
                "SCHEMA_REGISTRY_BOOTSTRAP_ENABLED": "true",
                "SCHEMA_REGISTRY_BOOTSTRAP_USERNAME": ADMIN_USER,
                "SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD": password_file(ADMIN_USER).read_text(),
                "SCHEMA_REGISTRY_AUTH_TYPE": "memory",
            }
        )
        return settings

    def _write_config(self, state: dict[str, Any]) -> None:
        SECURE_DIR.mkdir(parents=True, exist_ok=True)
        CONFIG.write_text(
            "# written by integration/services up; no secret here (the bootstrap password\n"
            "# reaches the server in SCHEMA_REGISTRY_BOOTSTRAP_PASSWORD)\n"
            "server:\n"
            f"  host: {LOOPBACK}\n"
            f"  port: {state['port']}\n"
            "storage:\n"
            "  type: memory\n"
            "compatibility:\n"
            f"  default_level: {COMPATIBILITY}\n"
            "logging:\n"
            "  level: info\n"
            "  format: json\n"
            "security:\n"
            "  tls:\n"
            "    enabled: true\n"
            f"    cert_file: {CERTS_DIR / 'server.crt'}\n"
            f"    key_file: {CERTS_DIR / 'server.key'}\n"
            "    min_version: TLS1.2\n"
            "    client_auth: none\n"
            "  auth:\n"
            "    enabled: true\n"
            "    methods: [basic]\n"
            "    basic:\n"
            f'      realm: "{REALM}"\n'
            "    bootstrap:\n"
            "      enabled: true\n"
            f"      username: {ADMIN_USER}\n"
            "    rbac:\n"
            "      enabled: true\n"
            "      default_role: readonly\n"
        )

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        binary = build_registry(report)
        state["provisioned"] = False
        self.assign_ports(state, taken_ports, report)
        shutil.rmtree(SECURE_DIR, ignore_errors=True)
        CERTS_DIR.mkdir(parents=True)
        make_server_certificate(
            ca_file=CA_FILE,
            crt=CERTS_DIR / "server.crt",
            key=CERTS_DIR / "server.key",
            label="registry_secure",
            log_path=TLS_LOG,
        )
        _write_secret(password_file(ADMIN_USER), secrets.token_urlsafe(24))
        self._write_config(state)
        self.launch(
            [str(binary), "-config", str(CONFIG)],
            state,
            LOG_FILE,
            env=self._settings(state),
            cwd=SECURE_DIR,
            what="schema registry (registry_secure)",
        )
        report.notes.insert(0, f"TLS, basic auth, user {APP_USER} ({APP_ROLE})")

    def warm_up(self, state: dict[str, Any]) -> None:
        """As the bootstrap admin: the application user, with a new random password."""
        password = secrets.token_urlsafe(24)
        _write_secret(password_file(APP_USER), password)
        body = {"username": APP_USER, "password": password, "role": APP_ROLE}
        try:
            request(
                f"{self._url(state)}/admin/users",
                ADMIN_USER,
                password_file(ADMIN_USER).read_text(),
                method="POST",
                body=body,
            )
        except Exception as exc:
            raise ServiceError(
                f"registry_secure: creating the user {APP_USER} failed: {type(exc).__name__}"
            ) from None
        state["provisioned"] = True
