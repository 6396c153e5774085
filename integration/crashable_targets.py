"""Target servers of a test's own, to crash: SIGKILL of the whole server, then a restart.

The suite's shared servers (``integration/services``) must never be killed: other tests use
them. A target-crash test starts a private one instead.

:class:`CrashablePostgres` is a private PostgreSQL cluster (Debian's binaries, the harness's
``find_bindir``): ``initdb`` into a fresh folder (a throw-away loopback-only server, trust
authentication), ``pg_ctl start`` on a free port with ``max_prepared_transactions``,
``fsync`` and ``synchronous_commit`` on: what a prepared transaction has to survive is a
real crash, and crash recovery replays the WAL at the next start.

:meth:`CrashablePostgres.kill` SIGKILLs the postmaster and every process it started (the
machine lost its power, as far as the server can tell); :meth:`start` starts it again on the
same port and folder. As root every server command runs as ``postgres`` (initdb insists),
and the cluster lives under ``/var/lib/txsink-services`` (a test's tmp folder is 0700).

:class:`CrashableMinio` is a private MinIO server (the harness's binary) on its own data
folder and port: :meth:`~CrashableMinio.kill` SIGKILLs it, :meth:`~CrashableMinio.start`
starts it again on the same folder, where objects and open multipart uploads survive.
``CrashableMinio.create(folder, env={...})`` adds server settings (``MINIO_API_*``, e.g.
a short stale-upload expiry for the expiry tests), kept across restarts.

:class:`CrashableKafka` is a private single-node KRaft broker (the harness's jars) whose log
folder, transaction state included, survives a SIGKILL.
``CrashableKafka.create(folder, broker={...})`` adds (or overrides) broker properties
(short transaction or transactional-id expiry, a fast log cleaner, for the expiry tests).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from _services.common import is_root
from _services.postgres import _as_server_user, _chown_to_server_user, find_bindir

from txsink.testing.chaos.targetcrash import child_pids, process_alive

__all__ = ["CrashableKafka", "CrashableMinio", "CrashablePostgres"]

USER = "txsink"
DATABASE = "postgres"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _accepts(port: int) -> bool:
    """Something listens on 127.0.0.1:``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class _Server:
    """A server of a test's own in ``folder``: :meth:`kill` SIGKILLs the process group it
    was spawned in (:meth:`_spawn`), :meth:`stop` kills it and deletes its folder."""

    folder: Path
    port: int = field(default_factory=_free_port)
    proc: subprocess.Popen[bytes] | None = None
    kills: int = 0

    def _spawn(self, cmd: list[str], log: str, env: dict[str, str] | None = None) -> None:
        with open(self.folder / log, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: kill() takes all its processes
                cwd=self.folder,
            )

    def running(self) -> bool:
        return _accepts(self.port)

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        self.kills += 1

    def stop(self) -> None:
        """Kill it and delete its folder (a test's end)."""
        self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class CrashablePostgres(_Server):
    """One private PostgreSQL cluster: :attr:`dsn`, :meth:`kill`, :meth:`start`, :meth:`stop`
    (``pg_ctl`` detaches the postmaster: its processes are found by parent, not by group)."""

    #: ``max_prepared_transactions``; 0 is PostgreSQL's default (no two-phase commit).
    max_prepared: int = 50

    @classmethod
    def create(cls, *, max_prepared: int = 50) -> CrashablePostgres:
        base = Path("/var/lib/txsink-services") if is_root() else Path("/tmp")
        server = cls(base / f"crashable-pg-{uuid.uuid4().hex[:8]}")
        server.max_prepared = max_prepared
        server._initdb()
        server.start()
        return server

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def dsn(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{DATABASE}"

    def _bin(self, name: str) -> str:
        bindir = find_bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL binaries (integration/services up postgres)")
        return str(bindir / name)

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(
            _as_server_user(argv), capture_output=True, text=True, timeout=180, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {done.stdout[-1500:]} {done.stderr[-1500:]}")

    def _initdb(self) -> None:
        self.folder.mkdir(parents=True)
        self.folder.chmod(0o755)
        _chown_to_server_user(self.folder)
        self._run(
            [
                self._bin("initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ]
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n".join(
                    [
                        "",
                        "listen_addresses = '127.0.0.1'",
                        f"port = {self.port}",
                        "unix_socket_directories = ''",
                        f"max_prepared_transactions = {self.max_prepared}",
                        "fsync = on",
                        "synchronous_commit = on",
                        "log_min_messages = warning",
                        "",
                    ]
                )
            )

    def pids(self) -> list[int]:
        """The postmaster and every process whose parent it is."""
        try:
            postmaster = int((self.data / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return []
        return [postmaster, *child_pids(postmaster)]

    def start(self) -> None:
        """Start (again): crash recovery replays the WAL, prepared transactions come back."""
        log = self.folder / "postgres.log"
        log.touch()
        _chown_to_server_user(log)
        self._run(
            [self._bin("pg_ctl"), "-D", str(self.data), "-l", str(log), "-w", "-t", "120", "start"]
        )

    def kill(self) -> None:
        """SIGKILL the postmaster and all its processes at once, and wait until they are gone."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(process_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        # A killed postmaster may linger as a zombie (nobody reaps it here), which a new
        # postmaster would take for a running one: its lock file goes with it.
        (self.data / "postmaster.pid").unlink(missing_ok=True)
        self.kills += 1


@dataclass
class CrashableMinio(_Server):
    """One private MinIO server: :attr:`endpoint`, :meth:`kill`, :meth:`start`, :meth:`stop`."""

    console_port: int = field(default_factory=_free_port)
    access_key: str = "crash-user"
    secret_key: str = "crash-secret"  # a throw-away loopback-only server
    #: Extra server environment (``MINIO_API_STALE_UPLOADS_EXPIRY``, ...), every start.
    extra_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, folder: Path, *, env: Mapping[str, str] | None = None) -> CrashableMinio:
        server = cls(folder, extra_env=dict(env or {}))
        (folder / "data").mkdir(parents=True)
        server.start()
        return server

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables a test's S3 clients take it from (``connectors.s3.testing``)."""
        return {
            "TXSINK_S3_ENDPOINT": self.endpoint,
            "TXSINK_S3_ACCESS_KEY": self.access_key,
            "TXSINK_S3_SECRET_KEY": self.secret_key,
            "TXSINK_S3_REGION": "us-east-1",
        }

    def start(self) -> None:
        from _services.s3 import minio_binary

        env = {
            **os.environ,
            "MINIO_ROOT_USER": self.access_key,
            "MINIO_ROOT_PASSWORD": self.secret_key,
            **self.extra_env,
        }
        address = f"127.0.0.1:{self.port}"
        console = f"127.0.0.1:{self.console_port}"
        cmd = [str(minio_binary()), "server", str(self.folder / "data"), "--address", address]
        self._spawn([*cmd, "--console-address", console, "--quiet"], "minio.log", env)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"MinIO did not start: see {self.folder / 'minio.log'}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as r:
                return int(r.status) == 200
        except OSError:
            return False


@dataclass
class CrashableKafka(_Server):
    """One private single-node KRaft broker (the harness's jars): :attr:`bootstrap`,
    :meth:`kill`, :meth:`start`, :meth:`stop`. Its log folder, the transaction state among
    it, survives a kill, as a broker's disk does."""

    controller_port: int = field(default_factory=_free_port)
    #: Extra broker properties, over the defaults (``transaction.max.timeout.ms``, ...).
    broker: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, folder: Path, *, broker: Mapping[str, str] | None = None) -> CrashableKafka:
        from _services.common import StartReport
        from _services.kafka import ensure_jars

        server = cls(folder, broker={k: str(v) for k, v in (broker or {}).items()})
        folder.mkdir(parents=True)
        server._configure()
        jars = ensure_jars(StartReport("crashable-kafka", {}))
        cluster = (
            subprocess.run(
                server._java(jars, "kafka.tools.StorageTool", "random-uuid"),
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        subprocess.run(
            server._java(
                jars, "kafka.tools.StorageTool", "format", "-t", cluster, "-c", str(server.props)
            ),
            capture_output=True,
            check=True,
        )
        server.start()
        return server

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def props(self) -> Path:
        return self.folder / "server.properties"

    def _configure(self) -> None:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://{self.bootstrap},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.bootstrap}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.folder / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "auto.create.topics.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            **self.broker,
        }
        self.props.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.folder / "log4j2.properties").write_text(
            "status = warn\nappender.file.type = File\nappender.file.name = file\n"
            f"appender.file.fileName = {self.folder / 'kafka.log'}\n"
            "appender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\n"
            "rootLogger.level = WARN\nrootLogger.appenderRef.file.ref = file\n"
        )

    def _java(self, jars: Path, main: str, *args: str) -> list[str]:
        log4j = self.folder / "log4j2.properties"
        return [
            "java",
            "-Xmx384m",
            "-XX:+ExitOnOutOfMemoryError",
            "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={self.folder}",
            "-cp",
            f"{jars}/*",
            main,
            *args,
        ]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and _accepts(self.port)

    def start(self) -> None:
        """Start (again) and wait until a transaction can run (the transaction state topic
        loaded: what a producer's init_transactions waits for)."""
        from _services.kafka import jars_dir
        from confluent_kafka import Producer

        self._spawn(self._java(jars_dir(), "kafka.Kafka", str(self.props)), "stdout.log")
        deadline = time.monotonic() + 120
        while not _accepts(self.port):
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Kafka did not start: see {self.folder / 'stdout.log'}")
            time.sleep(0.2)
        # Within the broker's transaction.max.timeout.ms, when a test lowers it.
        timeout_ms = min(60_000, int(self.broker.get("transaction.max.timeout.ms", 60_000)))
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"warmup-{uuid.uuid4()}",
                "transaction.timeout.ms": timeout_ms,
            }
        )
        producer.init_transactions(90)
        producer.begin_transaction()
        producer.abort_transaction(60)
