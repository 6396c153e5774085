"""The start-up check of the sink's rights on a secured cluster: every ACL of
:func:`~txsink.connectors.kafka.acls.required_acls` that this principal lacks is named,
with the ``kafka-acls`` line that grants it, before anything is written.

Why probe instead of ``describe_acls``: listing ACLs needs DESCRIBE on the cluster, which
the sink's principal should not have. The brokers tell each principal its own rights
instead (KIP-430's authorized operations on topics, the cluster and groups), and a
transactional id's right shows only by using it: ``init_transactions`` on shard 0's id,
which the check does for every shard right after anyway (fencing zombies).

A right missing after the decision would block a decided epoch (the marker reader's
group is first used by the second epoch's commit, when the marker topic holds markers):
hence every right, not only those the check's own calls happen to use.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from txsink.connectors.kafka.acls import Acl, required_acls
from txsink.connectors.kafka.checks import Cluster
from txsink.connectors.kafka.clients.errors import check_error, has_code
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.errors import ConfigurationError

__all__ = ["check_rights", "missing_rights"]

_DENIED = (
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
)


def check_rights(
    settings: KafkaSettings, topic: str | None, cluster: Cluster, ctx: dict[str, Any]
) -> None:
    """Raise :class:`ConfigurationError` naming every right the sink lacks (none: return).

    ``cluster`` is :func:`~txsink.connectors.kafka.checks.list_cluster`'s answer: the
    brokers answered it already (brokers that are down are told as such, not as rights
    that could not be checked). Rights on a topic that does not exist are not judged here:
    the brokers' check says the topic is missing (the marker topic's CREATE is named when
    creating it fails).
    """
    from confluent_kafka import KafkaException

    doing = "check the sink's rights"
    try:
        missing = missing_rights(settings, topic, cluster)
    except KafkaException as err:
        raise check_error(err.args[0], settings, doing) from err
    except TimeoutError as err:
        raise check_error(err, settings, doing) from err
    if not missing:
        return
    principal = str(settings.producer_config.get("sasl.username") or "<the sink's principal>")
    lines = "\n".join(
        f"  - {a.operation} on {a.kind} {a.name!r}{' (prefixed)' if a.prefixed else ''} "
        f"({a.why}): {a.line(principal, settings.bootstrap_servers)}"
        for a in missing
    )
    raise ConfigurationError(
        f"principal User:{principal} lacks {len(missing)} right(s) this sink needs on the "
        f"brokers at {settings.bootstrap_servers}; nothing was written. Grant them "
        f"(docs/security.md lists every right and why):\n{lines}",
        **ctx,
    )


def missing_rights(settings: KafkaSettings, topic: str | None, cluster: Cluster) -> list[Acl]:
    """The required ACLs this principal lacks, as the brokers report its rights."""
    admin = cluster.admin
    wanted = required_acls(settings, topic)
    topics = sorted({a.name for a in wanted if a.kind == "Topic"})
    granted: dict[tuple[str, str], set[str] | None] = {}
    for name, ops in _topic_operations(admin, topics, settings.timeout_s).items():
        granted[("Topic", name)] = ops
    if all(ops is None for ops in granted.values()):
        return []  # no authorizer on the brokers (or no topic yet: the brokers' check says)
    granted[("Cluster", "kafka-cluster")] = _cluster_operations(
        admin, cluster.meta, settings.timeout_s
    )
    for acl in wanted:
        if acl.kind == "Group":
            granted[("Group", acl.name)] = _group_operations(admin, acl.name, settings.timeout_s)
        elif acl.kind == "TransactionalId":
            granted[("TransactionalId", acl.name)] = _transactional_id(settings)
    missing = []
    for acl in wanted:
        ops = granted.get((acl.kind, acl.name))
        if ops is not None and _op_name(acl.operation) not in ops:
            missing.append(acl)
    return missing


def _op_name(operation: str) -> str:
    """``DescribeConfigs`` -> ``DESCRIBE_CONFIGS`` (confluent-kafka's AclOperation names)."""
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(operation)).upper()


def _names(ops: Any) -> set[str] | None:
    """AclOperation names; None: the brokers did not say (no authorizer configured)."""
    return None if ops is None else {op.name for op in ops}


def _topic_operations(
    admin: Any, topics: list[str], timeout_s: float
) -> dict[str, set[str] | None]:
    """Per topic: the operations this principal may do (empty: none, not even DESCRIBE);
    None: the topic does not exist (not judged here)."""
    from confluent_kafka import KafkaException, TopicCollection

    futures = admin.describe_topics(
        TopicCollection(topics), request_timeout=timeout_s, include_authorized_operations=True
    )
    found: dict[str, set[str] | None] = {}
    for name in topics:
        try:
            found[name] = _names(futures[name].result(timeout=timeout_s).authorized_operations)
        except KafkaException as err:
            if has_code(err.args[0], "TOPIC_AUTHORIZATION_FAILED"):
                # No DESCRIBE (no WRITE, no READ): its configs may still be readable.
                found[name] = _configs_readable(admin, "TOPIC", name, timeout_s)
            elif has_code(err.args[0], "UNKNOWN_TOPIC_OR_PART"):
                found[name] = None
            else:
                raise
    return found


def _configs_readable(admin: Any, kind: str, name: str, timeout_s: float) -> set[str]:
    """DESCRIBE_CONFIGS if this principal may read the configs of the ``kind`` (``TOPIC``,
    ``BROKER``) resource ``name``; none if the brokers refuse it."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    res = ConfigResource(getattr(ResourceType, kind), name)
    try:
        admin.describe_configs([res])[res].result(timeout=timeout_s)
    except KafkaException as err:
        if has_code(err.args[0], *_DENIED):
            return set()
        raise
    return {"DESCRIBE_CONFIGS"}


def _cluster_operations(admin: Any, meta: Any, timeout_s: float) -> set[str]:
    """DESCRIBE_CONFIGS if this principal may read a broker's configs (one of ``meta``'s
    brokers). (The cluster's authorized operations are only told to a principal with
    DESCRIBE on the cluster.)"""
    broker = str(next(iter(meta.brokers)))
    return _configs_readable(admin, "BROKER", broker, timeout_s)


#: The group coordinator is moving or loading (a broker just started): a passing answer.
_COORDINATOR_NOT_READY = (
    "COORDINATOR_LOAD_IN_PROGRESS",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
)


def _group_operations(admin: Any, group: str, timeout_s: float) -> set[str]:
    """DESCRIBE if this principal may describe (find the coordinator of) ``group``; a group
    that does not exist yet is described too (as dead) when the right is there."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + timeout_s
    while True:
        futures = admin.describe_consumer_groups(
            [group], request_timeout=timeout_s, include_authorized_operations=True
        )
        try:
            ops = _names(futures[group].result(timeout=timeout_s).authorized_operations)
        except KafkaException as err:
            if has_code(err.args[0], *_DENIED):
                return set()
            # A broker just started loads its group coordinator first: asked again, it answers.
            if has_code(err.args[0], *_COORDINATOR_NOT_READY) and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            raise
        return (ops or set()) | {"DESCRIBE"}


def _transactional_id(settings: KafkaSettings) -> set[str] | None:
    """WRITE if ``init_transactions`` on shard 0's transactional id is allowed; None if it
    failed for another reason."""
    from confluent_kafka import KafkaException, Producer

    from txsink.connectors.kafka.clients.settings import init_transactions, rdkafka_logger

    conf = settings.producer_conf(0, lambda _err, _msg: None)
    # Its refusal is the answer, not an error to log (the sink's logger would say CRITICAL).
    conf["logger"] = rdkafka_logger(f"txsink.connectors.kafka.rights.{settings.uid}", silent=True)
    producer = Producer(conf)
    try:
        init_transactions(producer, settings.timeout_s)
    except KafkaException as err:
        # Any other refusal (a transaction timeout above the brokers' limit, no transaction
        # coordinator) is not about rights: the checks after this one name it.
        return set() if has_code(err.args[0], *_DENIED) else None
    finally:
        # A refused producer's flush raises its fatal error again (a SystemError in
        # confluent-kafka 2.16 when it interrupts a callback): the answer is already had.
        with contextlib.suppress(KafkaException, SystemError):
            producer.flush(0)
    return {"WRITE", "DESCRIBE"}
