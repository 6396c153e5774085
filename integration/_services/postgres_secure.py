"""``postgres_secure``: PostgreSQL as production runs it: TLS required, passwords by SCRAM, and
a least-privilege login role for the sink.

The same binaries as :mod:`.postgres`, a cluster of its own (``.work/postgres_secure``).
Every start makes:

* a throw-away CA and a server certificate signed by it (``openssl``: the harness runs
  before the venv exists, so no Python package is assumed), with ``IP:127.0.0.1`` in its
  subjectAltName, so a client connects with ``sslmode=verify-full`` to ``127.0.0.1``;
* a ``pg_hba.conf`` with ``hostssl ... scram-sha-256`` lines only: a connection without
  TLS matches no line and is refused;
* a new random password for the login role ``txsink_app`` (NOSUPERUSER, NOCREATEDB,
  NOCREATEROLE, owner of nothing: a test grants it what it needs) and the
  harness's superuser ``postgres`` (set-up only), both written to a libpq passfile
  (mode 0600). The DSNs name that file (``passfile=``) and carry no password, so a DSN
  printed in a log, an error or a report holds no secret.

The env it writes: ``TXSINK_PG_SECURE_DSN`` (the app role), ``TXSINK_PG_SECURE_ADMIN_DSN``
(the superuser, for set-up), ``TXSINK_PG_SECURE_PASSFILE`` (the passfile; libpq's
``PGPASSFILE``), ``TXSINK_PG_SECURE_APP_ROLE``.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any, ClassVar

from .common import LOG_DIR, LOOPBACK, ServiceError, StartReport, run
from .postgres import DATABASE, MAX_PREPARED, Postgres, _chown_to_server_user, find_bindir
from .tls import make_server_certificate

SECURE_PORT = 55434
APP_ROLE = "txsink_app"
ADMIN_ROLE = "postgres"


def conninfo(port: int, user: str, ca: Path, passfile: Path, db: str = DATABASE) -> str:
    """A libpq key/value DSN with verify-full TLS and the password in ``passfile``."""
    return (
        f"host={LOOPBACK} port={port} dbname={db} user={user} "
        f"sslmode=verify-full sslrootcert={ca} passfile={passfile}"
    )


class PostgresSecure(Postgres):
    """TLS-only, SCRAM-only PostgreSQL with a least-privilege role (module docstring).

    Two-phase commit is allowed (``max_prepared_transactions > 0``), so both commit
    protocols of the Postgres sink can be tested through the least-privilege role.
    """

    name = "postgres_secure"
    default_port: ClassVar[int] = SECURE_PORT
    max_prepared: ClassVar[int] = MAX_PREPARED
    env_var: ClassVar[str] = "TXSINK_PG_SECURE_DSN"

    @property
    def tls_dir(self) -> Path:
        return self.pg_dir / "tls"

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.crt"

    @property
    def passfile(self) -> Path:
        return self.pg_dir / "passfile"

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        port = int(state["port"])
        return {
            self.env_var: conninfo(port, APP_ROLE, self.ca_file, self.passfile),
            "TXSINK_PG_SECURE_ADMIN_DSN": conninfo(port, ADMIN_ROLE, self.ca_file, self.passfile),
            "TXSINK_PG_SECURE_PASSFILE": str(self.passfile),
            "TXSINK_PG_SECURE_APP_ROLE": APP_ROLE,
        }

    def healthy(self, state: dict[str, Any]) -> bool:
        port = state.get("port")
        if not isinstance(port, int) or not self.passfile.exists():
            return False
        try:
            out = self._secure_psql(
                port, APP_ROLE, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            )
            return out.strip() == "t"
        except (ServiceError, OSError):
            return False

    def _secure_psql(self, port: int, user: str, query: str, db: str = DATABASE) -> str:
        """One statement with psql over verify-full TLS, the password from the passfile."""
        bindir = find_bindir()
        psql = str(bindir / "psql") if bindir and (bindir / "psql").exists() else "psql"
        dsn = conninfo(port, user, self.ca_file, self.passfile, db=db)
        return run(
            [psql, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-c", query],
            env={"PGCONNECT_TIMEOUT": "3"},
            timeout=30,
        )

    # -- provisioning -------------------------------------------------------------------

    def _make_certificates(self) -> None:
        """A new CA (in ``tls/``) and server certificate (EC P-256, in the data folder),
        :func:`~.tls.make_server_certificate`'s; the key readable by the server only."""
        self.tls_dir.mkdir(parents=True, exist_ok=True)
        self.tls_dir.chmod(0o755)
        server_crt, server_key = self.data_dir / "server.crt", self.data_dir / "server.key"
        make_server_certificate(
            ca_file=self.ca_file,
            crt=server_crt,
            key=server_key,
            label=self.name,
            log_path=LOG_DIR / f"{self.name}-tls.log",
        )
        _chown_to_server_user(server_crt, server_key)

    def _write_conf(self, port: int) -> None:
        super()._write_conf(port)
        conf = self.data_dir / "txsink.conf"
        with conf.open("a") as fh:
            fh.write(
                "ssl = on\n"
                "ssl_cert_file = 'server.crt'\n"
                "ssl_key_file = 'server.key'\n"
                "ssl_min_protocol_version = 'TLSv1.2'\n"
                "password_encryption = 'scram-sha-256'\n"
            )
        hba = self.data_dir / "pg_hba.conf"
        hba.write_text(
            "# txsink test harness (postgres_secure): TLS and SCRAM only, loopback only.\n"
            "# No `host` or `local` line: a connection without TLS matches nothing: refused.\n"
            f"hostssl all all {LOOPBACK}/32 scram-sha-256\n"
        )
        _chown_to_server_user(hba)
        self._make_certificates()

    def _write_passfile(self, port: int, admin_pw: str, app_pw: str) -> None:
        """libpq's passfile (``host:port:db:user:password``), 0600 before the secret goes in."""
        tmp = self.passfile.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        tmp.touch(mode=0o600)
        tmp.write_text(
            f"{LOOPBACK}:{port}:*:{ADMIN_ROLE}:{admin_pw}\n{LOOPBACK}:{port}:*:{APP_ROLE}:{app_pw}\n"
        )
        tmp.replace(self.passfile)

    def _bootstrap_roles(self, port: int) -> None:
        """As the superuser: the database (owned by the superuser, not the app), the app
        role with a new password, and the passfile holding both passwords."""
        admin_pw = self.admin_pw_file.read_text().strip()
        app_pw = secrets.token_hex(24)  # hex: nothing to quote in SQL or the passfile
        self._write_passfile(port, admin_pw, "")

        def admin(query: str, db: str = "postgres") -> str:
            return self._secure_psql(port, ADMIN_ROLE, query, db=db)

        if not admin(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'").strip():
            admin(f"CREATE DATABASE {DATABASE} OWNER {ADMIN_ROLE}")
        if not admin(f"SELECT 1 FROM pg_roles WHERE rolname = '{APP_ROLE}'").strip():
            admin(f"CREATE ROLE {APP_ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
        # psql -c sends one simple query: the password is not logged unless the server
        # logs statements (it does not: log_min_messages = warning, no log_statement).
        admin(f"ALTER ROLE {APP_ROLE} PASSWORD '{app_pw}'")
        # PostgreSQL 15 no longer grants CREATE on public to everyone; older servers do.
        admin("REVOKE CREATE ON SCHEMA public FROM PUBLIC", db=DATABASE)
        self._write_passfile(port, admin_pw, app_pw)
        (self.pg_dir / ".needs-bootstrap").unlink(missing_ok=True)

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        t0 = time.monotonic()
        super().start(state, taken_ports, report)
        report.notes.append(f"TLS + SCRAM, role {APP_ROLE}, {time.monotonic() - t0:.1f}s")
