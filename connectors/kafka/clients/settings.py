"""How the Kafka connector's clients are built: one sink's settings (brokers, identity,
timeouts) shared by its admin client, its marker consumer and its transactional
producers, and the logger librdkafka reports to (rate-limited: one WARNING per outage).

:class:`KafkaSettings` is plain data: it is pickled into replay commit tasks with the
sink, and its ``producer_config`` (TLS/SASL secrets) is kept out of ``repr``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txsink.observe.outages import Failure, OutageFilter

__all__ = ["ENFORCED", "KafkaSettings", "init_transactions", "outages", "rdkafka_logger"]

#: Producer settings the connector's guarantee depends on; a conflicting setting is refused.
ENFORCED: dict[str, Any] = {"enable.idempotence": True, "acks": "all"}
#: Producer defaults, overridable in ``producer_config``.
_PRODUCER_DEFAULTS: dict[str, Any] = {
    "linger.ms": 20,
    "compression.type": "lz4",
    "partitioner": "murmur2_random",
}
#: librdkafka's default ``batch.size``.
DEFAULT_BATCH_SIZE = 1_000_000
#: librdkafka's default ``transaction.timeout.ms``.
DEFAULT_TXN_TIMEOUT_MS = 60_000
#: Settings a non-producer client (admin, consumer) takes from ``producer_config``.
_CLIENT_PREFIXES = ("security.", "ssl.", "sasl.", "client.", "socket.")


_LIBRDKAFKA = "txsink.connectors.kafka.librdkafka"
#: librdkafka's log facilities (its codes, not its text) for a broker connection failing.
_CONNECTION_FACILITIES = frozenset({"FAIL", "REQTMOUT"})
#: librdkafka's facility for a client's fatal error. The same error fails the client's next
#: call, where the connector classifies it by its code (KafkaError.fatal(), _FENCED...);
#: the log line is only a copy of it, and in direct mode the expected one: a pooled producer
#: fenced by a newer one with its transactional id, made where Spark ran its shard's task.
_FATAL_FACILITIES = frozenset({"FATAL"})
#: One outage filter per sink uid and process: its clients share it.
_OUTAGES: dict[str, OutageFilter] = {}


def outages(uid: str) -> OutageFilter:
    """The outage filter on the librdkafka logger of sink ``uid``'s clients in this process:
    one WARNING per outage instead of a line per refused connection, and one line when
    the sink's next operation succeeds (:meth:`KafkaSettings.reachable`)."""
    found = _OUTAGES.get(uid)
    if found is None:
        logger = rdkafka_logger(f"{_LIBRDKAFKA}.{uid}")
        found = _OUTAGES.setdefault(uid, OutageFilter(logger, _connection_failure, uid=uid))
    return found


def _connection_failure(record: logging.LogRecord) -> Failure | None:
    """A librdkafka record (``fac``, client name, text) about a broker connection failing:
    the broker and the reason, e.g. ``127.0.0.1:59092``, ``Connection refused``."""
    args = record.args if isinstance(record.args, tuple) else ()
    if len(args) != 3 or args[0] not in _CONNECTION_FACILITIES:
        return None
    # "[thrd:127.0.0.1:59092/1]: 127.0.0.1:59092/1: Connect to ipv4#127.0.0.1:59092 failed:
    # Connection refused (after 0ms in state CONNECT)"
    broker, _, reason = str(args[2]).rpartition("]: ")[2].partition(": ")
    if reason.startswith("Connect to ") and " failed: " in reason:
        reason = reason.split(" failed: ", 1)[1]
    reason = reason.split(" (after ", 1)[0]
    return Failure(f"Kafka broker {broker.split('/')[0]}", reason or str(args[2]))


def init_transactions(producer: Any, timeout_s: float) -> None:
    """``producer.init_transactions(timeout_s)`` on a new producer, without librdkafka's
    half-second stall.

    A new librdkafka producer asks for its transaction coordinator before its first broker
    connection is up; finding none, it waits for its 500 ms coordinator-query timer
    (measured, librdkafka 2.16, local broker: 2 of 3 inits took 0.51 s instead of 0.06 s,
    and a sink's parallel inits wait for the slowest). A metadata request first brings a
    connection up, so the coordinator is asked at once: every init took 0.06-0.07 s.
    Raises ``KafkaException`` as ``init_transactions`` does.
    """
    producer.list_topics(timeout=timeout_s)
    producer.init_transactions(timeout_s)


def rdkafka_logger(name: str, *, silent: bool = False) -> logging.Logger:
    """The logger a librdkafka client reports to (``logger`` in its config).

    librdkafka prints every refused connection to stderr by default. The sink's clients
    pass only ERRORs on (through :func:`outages`); ``silent`` drops everything (the
    read-back helpers of tests).
    """
    logger = logging.getLogger(name)
    if silent:
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())
            logger.propagate = False
    else:
        logger.setLevel(logging.ERROR)
        if not any(isinstance(f, _FatalAtDebug) for f in logger.filters):
            logger.filters.insert(0, _FatalAtDebug())
    return logger


class _FatalAtDebug(logging.Filter):
    """librdkafka's FATAL lines at DEBUG (see :data:`_FATAL_FACILITIES`): the error itself
    is raised by the client's next call and handled there, by its code."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) == 3 and args[0] in _FATAL_FACILITIES:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


@dataclass(frozen=True)
class KafkaSettings:
    """One sink's way to the brokers: who it is (uid, transactional ids, marker topic) and
    how long it waits. Derived from :class:`~txsink.connectors.kafka.KafkaSink`'s options."""

    bootstrap_servers: str
    uid: str
    prefix: str
    marker_topic: str
    shards: int
    timeout_s: float
    producer_config: dict[str, Any] = field(default_factory=dict, repr=False)
    #: The largest ``batch.size`` whose batches every topic written takes (the check's
    #: :func:`~txsink.connectors.kafka.records.limits.batch_cap`); None: librdkafka's own.
    batch_cap: int | None = None

    def transactional_id(self, shard: int) -> str:
        """``<prefix>-<uid>-<shard>``: stable across epochs, so a new producer fences the old."""
        return f"{self.prefix}-{self.uid}-{shard}"

    @property
    def txn_timeout_s(self) -> float:
        """The producers' ``transaction.timeout.ms``, in seconds."""
        return self.txn_timeout_ms / 1000

    @property
    def txn_timeout_ms(self) -> int:
        return int(self.producer_config.get("transaction.timeout.ms", DEFAULT_TXN_TIMEOUT_MS))

    def reachable(self) -> None:
        """An operation on the brokers succeeded: an outage of this sink's clients ended."""
        outages(self.uid).ended()

    def context(self, phase: str | None = None, **more: Any) -> dict[str, Any]:
        """The error context every error of this sink carries."""
        ctx: dict[str, Any] = {"sink_uid": self.uid, "connector": "kafka"}
        if phase is not None:
            ctx["phase"] = phase
        ctx.update(more)
        return ctx

    def client_config(self) -> dict[str, Any]:
        """Config of an admin client or a consumer: the brokers and the security settings
        (TLS/SASL) of ``producer_config``; producer tuning does not matter there."""
        conf = {k: v for k, v in self.producer_config.items() if k.startswith(_CLIENT_PREFIXES)}
        conf["bootstrap.servers"] = self.bootstrap_servers
        conf["logger"] = outages(self.uid).logger
        return conf

    def producer_conf(self, shard: int, on_delivery: Callable[[Any, Any], None]) -> dict[str, Any]:
        """Config of ``shard``'s transactional producer: the defaults, ``producer_config``,
        then what the guarantee needs. Failed deliveries only are reported, to
        ``on_delivery``. ``batch.size`` is capped at :attr:`batch_cap`: the broker checks
        a batch of several records against the topic's ``max.message.bytes`` too."""
        capped: dict[str, Any] = {}
        if self.batch_cap is not None:
            given = int(self.producer_config.get("batch.size", DEFAULT_BATCH_SIZE))
            capped["batch.size"] = min(given, self.batch_cap)
        return {
            **_PRODUCER_DEFAULTS,
            **self.producer_config,
            **capped,
            **ENFORCED,
            "bootstrap.servers": self.bootstrap_servers,
            "transactional.id": self.transactional_id(shard),
            "logger": outages(self.uid).logger,
            "delivery.report.only.error": True,
            "on_delivery": on_delivery,
        }
