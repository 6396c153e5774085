"""PostgreSQL from Debian's packages, as private clusters under ``.work/<service>``.

Why a private cluster and not the distribution's ``main`` one: we need
``max_prepared_transactions > 0`` (two-phase commit), a fixed loopback port and a
throw-away data folder, without touching a server the machine may already run.
``initdb`` refuses to run as root, so as root every server command runs as ``postgres``.

Two services, the same binaries: ``postgres`` (two-phase commit allowed,
``TXSINK_PG_DSN``) and ``postgres_stock`` (:class:`PostgresStock`: PostgreSQL's default
``max_prepared_transactions = 0``, as most servers and managed services run it,
``TXSINK_PG_STOCK_DSN``), for the connector's staging commit.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Any, ClassVar

from .base import LocalService
from .common import (
    LOG_DIR,
    LOOPBACK,
    WORK_DIR,
    ServiceError,
    StartReport,
    apt_install,
    choose_port,
    is_root,
    log,
    pid_alive,
    read_pid,
    run,
    stop_pid,
    tail_file,
    write_pid,
)

DEFAULT_PORT = 55432
STOCK_PORT = 55433
USER = "txsink"
PASSWORD = "txsink"  # a fixed test credential for a loopback-only throw-away server
DATABASE = "txsink"
MAX_PREPARED = 200


def _pg_dir(name: str = "postgres") -> Path:
    """Where the cluster lives.

    As root, the server runs as ``postgres``, which must be able to reach its
    data folder: a checkout under a private folder (``mktemp -d`` is 0700, as
    is a home folder) is out of its reach. So as root the cluster lives under
    ``/var/lib/txsink-services/<key of this work folder>/``, one per checkout,
    and ``.work/postgres`` is a symlink to it.
    """
    if not is_root():
        return WORK_DIR / name
    key = hashlib.sha256(str(WORK_DIR.resolve()).encode()).hexdigest()[:12]
    return Path("/var/lib/txsink-services") / key / name


PG_DIR = _pg_dir()
DATA_DIR = PG_DIR / "data"
ADMIN_PW_FILE = PG_DIR / "admin-password"
LOG_FILE = PG_DIR / "postgres.log"


def find_bindir() -> Path | None:
    """Newest ``/usr/lib/postgresql/<ver>/bin`` with initdb, else whatever is on PATH."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def _as_server_user(argv: list[str]) -> list[str]:
    """Prefix a command so it runs as ``postgres`` when we are root (initdb insists)."""
    if not is_root():
        return argv
    if shutil.which("runuser"):
        return ["runuser", "-u", "postgres", "--", *argv]
    return ["su", "-s", "/bin/sh", "postgres", "-c", " ".join(argv)]


def _chown_to_server_user(*paths: Path) -> None:
    if not is_root():
        return
    entry = pwd.getpwnam("postgres")
    for path in paths:
        os.chown(path, entry.pw_uid, entry.pw_gid)


def dsn(port: int, password: str = PASSWORD) -> str:
    return f"postgresql://{USER}:{password}@{LOOPBACK}:{port}/{DATABASE}"


class Postgres(LocalService):
    """Started and stopped with ``pg_ctl`` (it detaches the postmaster itself), not spawned.

    A subclass names another cluster: its own folder (``.work/<name>``), port, setting of
    ``max_prepared_transactions`` and env variable.
    """

    name = "postgres"
    stop_timeout = 60.0
    default_port: ClassVar[int] = DEFAULT_PORT
    max_prepared: ClassVar[int] = MAX_PREPARED
    env_var: ClassVar[str] = "TXSINK_PG_DSN"

    @property
    def pg_dir(self) -> Path:
        return _pg_dir(self.name)

    @property
    def data_dir(self) -> Path:
        return self.pg_dir / "data"

    @property
    def log_file(self) -> Path:
        return self.pg_dir / "postgres.log"

    @property
    def admin_pw_file(self) -> Path:
        return self.pg_dir / "admin-password"

    def marker(self, state: dict[str, Any]) -> str:
        return str(self.data_dir)

    def pid(self, state: dict[str, Any]) -> int | None:
        """The postmaster's pid, from its own pid file (first line of postmaster.pid)."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().splitlines()[0]
            return int(first)
        except (OSError, ValueError, IndexError):
            return read_pid(self.name)

    def healthy(self, state: dict[str, Any]) -> bool:
        port = state.get("port")
        if not isinstance(port, int):
            return False
        try:
            out = self._psql(port, USER, PASSWORD, DATABASE, "SHOW max_prepared_transactions")
            return int(out.strip()) == self.max_prepared
        except (ServiceError, ValueError, OSError):
            return False

    def _psql(self, port: int, user: str, password: str, db: str, query: str) -> str:
        """Run one statement with psql (no Python driver needed: works before the venv)."""
        bindir = find_bindir()
        psql = str(bindir / "psql") if bindir and (bindir / "psql").exists() else "psql"
        return run(
            [
                psql,
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                LOOPBACK,
                "-p",
                str(port),
                "-U",
                user,
                "-d",
                db,
                "-c",
                query,
            ],
            env={"PGPASSWORD": password, "PGCONNECT_TIMEOUT": "3"},
            timeout=30,
        )

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        return {self.env_var: dsn(int(state["port"]))}

    # -- provisioning -------------------------------------------------------------------

    def _ensure_binaries(self, report: StartReport) -> Path:
        bindir = find_bindir()
        if bindir is None:
            t0 = time.monotonic()
            apt_install("postgresql")
            report.cold = True
            report.provision_seconds += time.monotonic() - t0
            report.notes.append("installed postgresql with apt-get")
            bindir = find_bindir()
        if bindir is None:
            raise ServiceError("postgresql installed but initdb not found")
        return bindir

    def _init_cluster(self, bindir: Path, report: StartReport) -> None:
        version = run([str(bindir / "postgres"), "--version"]).split()[-1].split(".")[0]
        pg_dir, data_dir = self.pg_dir, self.data_dir
        marker = pg_dir / ".initialized"
        if marker.exists() and (data_dir / "PG_VERSION").exists():
            if (data_dir / "PG_VERSION").read_text().strip() == version:
                return
            log(f"{self.name}: data folder is from another major version; re-creating (test data)")
        if data_dir.exists():
            shutil.rmtree(data_dir)
        marker.unlink(missing_ok=True)
        pg_dir.mkdir(parents=True, exist_ok=True)
        for folder in (pg_dir, *list(pg_dir.parents)[:2]):
            if folder != WORK_DIR and folder.is_relative_to("/var/lib/txsink-services"):
                folder.chmod(0o755)
        pg_dir.chmod(0o755)
        link = WORK_DIR / self.name
        if link != pg_dir and not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(pg_dir, target_is_directory=True)
        data_dir.mkdir(mode=0o700)
        admin_pw = secrets.token_hex(16)
        self.admin_pw_file.write_text(admin_pw)
        self.admin_pw_file.chmod(0o600)
        pwfile = pg_dir / ".initdb-pw"
        pwfile.write_text(admin_pw + "\n")
        pwfile.chmod(0o600)
        _chown_to_server_user(data_dir, pwfile)
        t0 = time.monotonic()
        try:
            run(
                _as_server_user(
                    [
                        str(bindir / "initdb"),
                        "-D",
                        str(data_dir),
                        "-U",
                        "postgres",
                        f"--pwfile={pwfile}",
                        "--auth=scram-sha-256",
                        "--encoding=UTF8",
                        "--no-locale",
                    ]
                ),
                timeout=300,
                log_path=LOG_DIR / f"{self.name}-initdb.log",
            )
        finally:
            pwfile.unlink(missing_ok=True)
        conf = data_dir / "postgresql.conf"
        with conf.open("a") as fh:
            fh.write("\n# txsink test harness: settings rewritten by every `up`\n")
            fh.write("include_if_exists = 'txsink.conf'\n")
        report.notes.append(f"initdb {time.monotonic() - t0:.1f}s")
        (pg_dir / ".needs-bootstrap").write_text("1")
        marker.write_text(version)

    def _write_conf(self, port: int) -> None:
        conf = self.data_dir / "txsink.conf"
        conf.write_text(
            "\n".join(
                [
                    f"listen_addresses = '{LOOPBACK}'",
                    f"port = {port}",
                    "unix_socket_directories = ''",
                    f"max_prepared_transactions = {self.max_prepared}",
                    "max_connections = 200",
                    "fsync = on",
                    "synchronous_commit = on",
                    "full_page_writes = on",
                    "log_min_messages = warning",
                    "log_line_prefix = '%m [%p] %u@%d '",
                    "",
                ]
            )
        )
        _chown_to_server_user(conf)

    def _bootstrap_roles(self, port: int) -> None:
        """Create the test role and database once, as the cluster's superuser."""
        flag = self.pg_dir / ".needs-bootstrap"
        if not flag.exists():
            return
        admin_pw = self.admin_pw_file.read_text().strip()

        def admin(query: str) -> str:
            return self._psql(port, "postgres", admin_pw, "postgres", query)

        # Identifiers and the password are our own constants (no quoting issues).
        if not admin(f"SELECT 1 FROM pg_roles WHERE rolname = '{USER}'").strip():
            admin(f"CREATE ROLE {USER} LOGIN CREATEDB PASSWORD '{PASSWORD}'")
        if not admin(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'").strip():
            admin(f"CREATE DATABASE {DATABASE} OWNER {USER}")
        flag.unlink()

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        bindir = self._ensure_binaries(report)
        self._init_cluster(bindir, report)
        # Not assign_ports: the port goes into the state only once the server runs on it.
        port = choose_port(self.default_port, state.get("port"), taken_ports)
        if port != self.default_port:
            report.notes.append(f"port {self.default_port} taken, using {port}")
        self._write_conf(port)
        self.log_file.touch()
        _chown_to_server_user(self.log_file)
        # pg_ctl -w returns once postmaster.pid says "ready"; it detaches the postmaster.
        run(
            _as_server_user(
                [
                    str(bindir / "pg_ctl"),
                    "-D",
                    str(self.data_dir),
                    "-l",
                    str(self.log_file),
                    "-w",
                    "-t",
                    "120",
                    "start",
                ]
            ),
            timeout=150,
            log_path=LOG_DIR / f"{self.name}-ctl.log",
        )
        pid = self.pid(state)
        if pid is None:
            raise ServiceError(
                f"{self.name} did not write its pid file; log:\n{tail_file(self.log_file)}"
            )
        write_pid(self.name, pid)
        state.update({"port": port, "bindir": str(bindir)})
        self._bootstrap_roles(port)
        self.wait_healthy(state, lambda: self.running(state), 60)

    def down(self, state: dict[str, Any]) -> bool:
        """``pg_ctl stop -m fast``, then SIGINT (fast shutdown) to whatever is left."""
        pid = self.pid(state)
        if pid is None or not pid_alive(pid, self.marker(state)):
            return False
        bindir = state.get("bindir") or (str(find_bindir()) if find_bindir() else None)
        if bindir:
            try:
                run(
                    _as_server_user(
                        [
                            str(Path(bindir) / "pg_ctl"),
                            "-D",
                            str(self.data_dir),
                            "-m",
                            "fast",
                            "-w",
                            "-t",
                            "60",
                            "stop",
                        ]
                    ),
                    timeout=90,
                    log_path=LOG_DIR / f"{self.name}-ctl.log",
                )
            except ServiceError as exc:
                log(f"{self.name}: pg_ctl stop failed ({exc}); signalling the postmaster")
        # SIGINT is PostgreSQL's "fast shutdown"; a no-op if pg_ctl already stopped it.
        stop_pid(pid, self.marker(state), sig=signal.SIGINT, timeout=self.stop_timeout)
        return True


class PostgresStock(Postgres):
    """A second cluster as PostgreSQL ships: ``max_prepared_transactions = 0``, so no
    two-phase commit (the Postgres connector's staging commit is tested against it)."""

    name = "postgres_stock"
    default_port: ClassVar[int] = STOCK_PORT
    max_prepared: ClassVar[int] = 0
    env_var: ClassVar[str] = "TXSINK_PG_STOCK_DSN"
