"""The least rights a :class:`~txsink.connectors.kafka.KafkaSink` needs on a secured
cluster: one list, from which ``docs/security.md`` shows the ``kafka-acls`` lines, the
tests create the ACLs (:func:`create_acls`) and the start-up check names what is missing.

Found against Kafka 4.1 with the StandardAuthorizer and ``allow.everyone.if.no.acl.found
=false``, by running each mode with no ACL and adding what each refusal named
(``integration/test_kafka_secure.py`` removes each in turn). WRITE and READ imply
DESCRIBE, so DESCRIBE is never listed on its own; IDEMPOTENT_WRITE on the cluster is not
needed since Kafka 3.0 (KIP-679: WRITE on a topic implies it). The same rights serve
``wal``, ``replay`` and ``direct`` mode: they differ only in the marker topic's default
name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from txsink.connectors.kafka.clients.settings import KafkaSettings

__all__ = ["Acl", "create_acls", "delete_acls", "kafka_acls_line", "required_acls"]

ResourceKind = Literal["Topic", "TransactionalId", "Cluster", "Group"]
Operation = Literal["Write", "Read", "Create", "DescribeConfigs", "Describe", "IdempotentWrite"]


@dataclass(frozen=True)
class Acl:
    """One ALLOW right: ``operation`` on the ``kind`` resource ``name`` (a ``prefixed``
    pattern matches every name starting with it), and why the sink needs it."""

    kind: ResourceKind
    name: str
    operation: Operation
    why: str
    prefixed: bool = False

    def line(self, principal: str, bootstrap: str = "<brokers>") -> str:
        return kafka_acls_line(self, principal, bootstrap)

    def binding(self, principal: str, *, as_filter: bool = False) -> Any:
        """This right as confluent-kafka's ``AclBinding`` (ALLOW, any host), or as the
        ``AclBindingFilter`` matching exactly it (``as_filter``: for ``delete_acls``)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            AclBinding,
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        kinds = {
            "Topic": ResourceType.TOPIC,
            "TransactionalId": ResourceType.TRANSACTIONAL_ID,
            "Cluster": ResourceType.BROKER,  # librdkafka's name for the cluster resource
            "Group": ResourceType.GROUP,
        }
        ops = {
            "Write": AclOperation.WRITE,
            "Read": AclOperation.READ,
            "Create": AclOperation.CREATE,
            "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
            "Describe": AclOperation.DESCRIBE,
            "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
        }
        cls = AclBindingFilter if as_filter else AclBinding
        return cls(
            kinds[self.kind],
            self.name,
            ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL,
            f"User:{principal}",
            "*",
            ops[self.operation],
            AclPermissionType.ALLOW,
        )


_RESOURCE_FLAG = {"Topic": "--topic", "TransactionalId": "--transactional-id", "Group": "--group"}


def kafka_acls_line(acl: Acl, principal: str, bootstrap: str = "<brokers>") -> str:
    """The ``kafka-acls`` command (Kafka's ``bin/kafka-acls.sh``) that grants ``acl``."""
    if acl.kind == "Cluster":
        resource = "--cluster"
    else:
        resource = f"{_RESOURCE_FLAG[acl.kind]} {acl.name}"
        if acl.prefixed:
            resource += " --resource-pattern-type prefixed"
    return (
        f"kafka-acls --bootstrap-server {bootstrap} --command-config admin.properties --add "
        f"--allow-principal User:{principal} --operation {acl.operation} {resource}"
    )


def required_acls(
    settings: KafkaSettings, topic: str | None, *, create_marker_topic: bool = False
) -> list[Acl]:
    """The rights of the sink with these ``settings`` writing to ``topic`` (None: the
    topics of ``topic_column``, each needing the topic's rights).

    ``create_marker_topic``: the marker topic does not exist yet and the sink is to make
    it (otherwise an administrator creates it, compacted, and CREATE is not needed).
    """
    marker = settings.marker_topic
    acls: list[Acl] = []
    if topic is not None:
        acls += [
            Acl("Topic", topic, "Write", "the epochs' records (WRITE implies DESCRIBE)"),
            Acl("Topic", topic, "DescribeConfigs", "the check reads max.message.bytes"),
        ]
    acls += [
        Acl("Topic", marker, "Write", "a shard's marker, in its commit transaction"),
        Acl("Topic", marker, "Read", "recovery and the commit read the markers"),
        Acl("Topic", marker, "DescribeConfigs", "the check reads its cleanup.policy"),
    ]
    if create_marker_topic:
        acls.append(Acl("Topic", marker, "Create", "the sink creates the marker topic"))
    acls += [
        Acl(
            "TransactionalId",
            f"{settings.prefix}-{settings.uid}-",
            "Write",
            "one transactional producer per shard (WRITE implies DESCRIBE)",
            prefixed=True,
        ),
        Acl(
            "Group",
            f"txsink-marker-{settings.uid}",
            "Describe",
            "the marker reader's consumer group (assigned, never joined nor committed)",
        ),
        Acl(
            "Cluster",
            "kafka-cluster",
            "DescribeConfigs",
            "the check reads the brokers' transaction.max.timeout.ms",
        ),
    ]
    return acls


def create_acls(admin: Any, acls: list[Acl], principal: str, timeout_s: float = 30.0) -> None:
    """Grant ``acls`` to ``principal`` with ``admin`` (an ``AdminClient`` allowed to)."""
    if acls:
        for future in admin.create_acls([a.binding(principal) for a in acls]).values():
            future.result(timeout=timeout_s)


def delete_acls(admin: Any, acls: list[Acl], principal: str, timeout_s: float = 30.0) -> None:
    """Revoke ``acls`` from ``principal`` (the filters match each binding exactly)."""
    if acls:
        for future in admin.delete_acls(
            [a.binding(principal, as_filter=True) for a in acls]
        ).values():
            future.result(timeout=timeout_s)
