"""Apache Kafka, one KRaft node in combined mode (broker + controller), from Maven Central jars.

Why jars through Maven: no Kafka broker exists in Debian or on PyPI, and Maven Central is a
package registry we may use through its ordinary client (``mvn``). The jars are the
official ``org.apache.kafka:kafka_2.13`` artifacts and their runtime dependencies, cached
under ``~/.cache/txsink-services/kafka/<version>/jars``.

The quorum is a static voter set (``controller.quorum.voters``), formatted without
``--standalone``: with a static quorum the controller's address is read from the config at
every start, so a port that moved since the last run does not invalidate the data folder.

Besides the normal listener the broker has a ``PROXIED`` listener that advertises a port
a test can put ``integration.netproxy.NetProxy`` on: Kafka clients connect to the
*advertised* address after bootstrap, so a proxy only sees the traffic if the broker
advertises the proxy's own port. Nothing binds that port until a test does, so "free" says
nothing about it: like every port it is chosen with :func:`~.common.choose_port`, whose
machine-wide claims keep two checkouts' brokers from advertising the same one.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

from .base import LocalService
from .common import (
    LOG_DIR,
    LOOPBACK,
    WORK_DIR,
    StartReport,
    apt_install,
    cache_dir,
    cache_lock,
    log,
    port_open,
    quiet_logger,
    run,
)

KAFKA_VERSION = "4.1.1"
SCALA = "2.13"
# Kafka's own jars only declare the slf4j API; this binds it to log4j2 so the broker logs.
LOG4J_SLF4J = "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3"

DEFAULT_PORT = 59092
DEFAULT_CONTROLLER_PORT = 59093
DEFAULT_PROXY_TARGET_PORT = 59094
DEFAULT_PROXY_LISTEN_PORT = 59095
HEAP = "-Xmx512m"

KAFKA_DIR = WORK_DIR / "kafka"
DATA_DIR = KAFKA_DIR / "data"
PROPERTIES = KAFKA_DIR / "server.properties"
LOG4J = KAFKA_DIR / "log4j2.properties"
LOG_FILE = LOG_DIR / "kafka.log"
STDOUT_FILE = LOG_DIR / "kafka.out"

POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.txsink.harness</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>{l_group}</groupId>
      <artifactId>{l_artifact}</artifactId>
      <version>{l_version}</version>
    </dependency>
  </dependencies>
</project>
"""


#: One KRaft node (broker and controller) for tests: every internal topic with one replica,
#: no topic made by a client's request. Shared with :mod:`.kafka_secure`.
SINGLE_NODE = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "auto.create.topics.enable": "false",
    "delete.topic.enable": "true",
    "group.initial.rebalance.delay.ms": "0",
}


def write_config(
    properties: Path,
    props: dict[str, str],
    log4j: Path,
    log_file: Path,
    loggers: dict[str, str],
) -> None:
    """The broker's ``server.properties`` (:data:`SINGLE_NODE` with ``props`` over it) and
    its log4j2 file: everything to ``log_file``, at INFO but for ``loggers`` (name: level)."""
    properties.parent.mkdir(parents=True, exist_ok=True)
    merged = {**SINGLE_NODE, **props}
    properties.write_text("".join(f"{k}={v}\n" for k, v in merged.items()))
    lines = [
        "status = warn",
        "appender.file.type = File",
        "appender.file.name = file",
        f"appender.file.fileName = {log_file}",
        "appender.file.layout.type = PatternLayout",
        "appender.file.layout.pattern = [%d] %p %m (%c)%n",
        "rootLogger.level = INFO",
        "rootLogger.appenderRef.file.ref = file",
    ]
    for i, (name, level) in enumerate(loggers.items()):
        lines += [f"logger.l{i}.name = {name}", f"logger.l{i}.level = {level}"]
    log4j.write_text("\n".join([*lines, ""]))


def java(jars: Path, log4j: Path, main: str, *args: str) -> list[str]:
    """The command that runs ``main`` from Kafka's jars with the harness's heap and logs."""
    return [
        "java",
        HEAP,
        "-Xms128m",
        "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
        f"-Dkafka.logs.dir={LOG_DIR}",
        "-cp",
        f"{jars}/*",
        main,
        *args,
    ]


def format_storage(
    jars: Path, log4j: Path, properties: Path, *extra: str, log_path: Path | None = None
) -> None:
    """Format the data folder of ``properties`` for a new cluster id. ``extra``: more
    ``kafka-storage format`` arguments (SCRAM users: their command line holds passwords, so
    give no ``log_path`` with them)."""
    storage = "kafka.tools.StorageTool"
    cluster_id = run(java(jars, log4j, storage, "random-uuid")).strip().splitlines()[-1]
    argv = java(jars, log4j, storage, "format", "-t", cluster_id, "-c", str(properties), *extra)
    run(argv, timeout=120, log_path=log_path)


def java_and_jars(report: StartReport) -> Path:
    """Java (installed from Debian's packages if missing) and the broker's jars."""
    if shutil.which("java") is None:
        apt_install("openjdk-17-jre-headless")
    return ensure_jars(report)


def cluster_answers(conf: dict[str, Any]) -> bool:
    """Whether the brokers ``conf`` names describe their cluster to its client."""
    from confluent_kafka.admin import AdminClient

    settings: dict[str, Any] = {**conf, "logger": quiet_logger()}
    admin = AdminClient(settings)
    try:
        cluster = admin.describe_cluster(request_timeout=5).result(timeout=10)
        return bool(cluster.nodes)
    except Exception:
        return False


def warm_up_transactions(conf: dict[str, Any]) -> None:
    """One transaction by ``conf``'s client, so ``__transaction_state`` exists before the
    first test (its first use costs seconds)."""
    from confluent_kafka import Producer

    settings: dict[str, Any] = {
        **conf,
        "transactional.id": f"txsink-harness-warmup-{uuid.uuid4().hex[:8]}",
        "logger": quiet_logger(),
    }
    producer = Producer(settings)
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.abort_transaction(60)


def jars_dir() -> Path:
    return cache_dir() / "kafka" / KAFKA_VERSION / "jars"


def ensure_jars(report: StartReport) -> Path:
    """Fetch the broker jars with Maven once; later starts use the cached folder."""
    target = jars_dir()
    done = target.parent / ".complete"
    if done.exists() and any(target.glob("kafka_*.jar")):
        return target
    with cache_lock("kafka-jars"):  # a second cold `up` waits, then finds the jars
        if done.exists() and any(target.glob("kafka_*.jar")):
            return target
        return _fetch_jars(target, done, report)


def _fetch_jars(target: Path, done: Path, report: StartReport) -> Path:
    if shutil.which("mvn") is None:
        apt_install("maven")
    t0 = time.monotonic()
    log(f"kafka: fetching org.apache.kafka:kafka_{SCALA}:{KAFKA_VERSION} jars with Maven")
    work = target.parent
    work.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.rmtree(target)
    group, artifact, version = LOG4J_SLF4J.split(":")
    (work / "pom.xml").write_text(
        POM.format(
            scala=SCALA,
            version=KAFKA_VERSION,
            l_group=group,
            l_artifact=artifact,
            l_version=version,
        )
    )
    run(
        [
            "mvn",
            "-B",
            "-q",
            f"-Dmaven.repo.local={cache_dir() / 'm2'}",
            "-f",
            str(work / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={target}",
        ],
        timeout=1200,
        log_path=LOG_DIR / "kafka-maven.log",
    )
    done.write_text(KAFKA_VERSION)
    report.cold = True
    report.provision_seconds += time.monotonic() - t0
    return target


class Broker(LocalService):
    """What the harness's one-node brokers share, plain (:class:`Kafka`) or secured
    (:class:`~.kafka_secure.KafkaSecure`): start and stop times, the process marker (the
    broker's ``server.properties``, a class's own), and the listening check."""

    #: The broker's ``server.properties``: in its command line, so its marker.
    properties: ClassVar[Path]
    start_timeout = 180.0
    # SIGTERM runs Kafka's controlled shutdown (flushes logs, closes the quorum cleanly).
    stop_timeout = 60.0

    def marker(self, state: dict[str, Any]) -> str:
        return str(self.properties)

    def listening(self, state: dict[str, Any]) -> bool:
        """The client port of ``state`` takes connections (before any client request)."""
        port = state.get("port")
        return isinstance(port, int) and port_open(port)


class Kafka(Broker):
    name = "kafka"
    default_ports: ClassVar[dict[str, int]] = {
        "port": DEFAULT_PORT,
        "controller_port": DEFAULT_CONTROLLER_PORT,
        "proxy_target_port": DEFAULT_PROXY_TARGET_PORT,
        "proxy_listen_port": DEFAULT_PROXY_LISTEN_PORT,
    }
    properties = PROPERTIES
    logs = ((LOG_FILE, 25), (STDOUT_FILE, 10))

    def healthy(self, state: dict[str, Any]) -> bool:
        if not self.listening(state):
            return False
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:  # plain python3 without the venv: trust the broker's own log
            return self._started_since(int(state.get("log_offset", 0)))
        return cluster_answers({"bootstrap.servers": f"{LOOPBACK}:{state['port']}"})

    def _started_since(self, offset: int) -> bool:
        try:
            with LOG_FILE.open("rb") as fh:
                fh.seek(offset)
                return b"Kafka Server started" in fh.read()
        except OSError:
            return False

    def env(self, state: dict[str, Any]) -> dict[str, str]:
        return {
            "TXSINK_KAFKA_BOOTSTRAP": f"{LOOPBACK}:{state['port']}",
            # A NetProxy listening here and forwarding to the target sees all broker traffic.
            "TXSINK_KAFKA_PROXY_LISTEN": f"{LOOPBACK}:{state['proxy_listen_port']}",
            "TXSINK_KAFKA_PROXY_TARGET": f"{LOOPBACK}:{state['proxy_target_port']}",
        }

    def _write_config(self, state: dict[str, Any]) -> None:
        port, cport = state["port"], state["controller_port"]
        ptarget, plisten = state["proxy_target_port"], state["proxy_listen_port"]
        props = {
            "controller.quorum.voters": f"1@{LOOPBACK}:{cport}",
            "listeners": (
                f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{cport},"
                f"PROXIED://{LOOPBACK}:{ptarget}"
            ),
            "advertised.listeners": (
                f"PLAINTEXT://{LOOPBACK}:{port},PROXIED://{LOOPBACK}:{plisten}"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT"
            ),
            "log.dirs": str(DATA_DIR),
            "log.retention.hours": "168",
        }
        loggers = {"kafka": "INFO", "state.change.logger": "WARN"}
        write_config(PROPERTIES, props, LOG4J, LOG_FILE, loggers)

    def _format(self, jars: Path, report: StartReport) -> None:
        if (DATA_DIR / "meta.properties").exists():
            return
        if DATA_DIR.exists():
            shutil.rmtree(DATA_DIR)
        t0 = time.monotonic()
        format_storage(jars, LOG4J, PROPERTIES, log_path=LOG_DIR / "kafka-format.log")
        report.notes.append(f"storage formatted {time.monotonic() - t0:.1f}s")

    def warm_up(self, state: dict[str, Any]) -> None:
        """Run one transaction so ``__transaction_state`` exists before the first test."""
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            return
        warm_up_transactions({"bootstrap.servers": f"{LOOPBACK}:{state['port']}"})

    def start(self, state: dict[str, Any], taken_ports: set[int], report: StartReport) -> None:
        jars = java_and_jars(report)
        self.assign_ports(state, taken_ports, report)
        self._write_config(state)
        self._format(jars, report)
        state["log_offset"] = LOG_FILE.stat().st_size if LOG_FILE.exists() else 0
        self.launch(
            java(jars, LOG4J, "kafka.Kafka", str(PROPERTIES)), state, STDOUT_FILE, cwd=KAFKA_DIR
        )
