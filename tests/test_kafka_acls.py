"""The least-privilege list of KafkaSink (``txsink.connectors.kafka.acls``), without a broker:
what each mode needs, the ``kafka-acls`` lines and the confluent-kafka bindings made from
it. ``integration/test_kafka_secure.py`` proves the list against a secured broker."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.acls import Acl, Operation, kafka_acls_line, required_acls
from txsink.connectors.kafka.rights import _op_name


@pytest.mark.parametrize(
    ("mode", "marker"),
    [("wal", "txsink-markers"), ("replay", "txsink-markers"), ("direct", "app-markers-o")],
)
def test_every_mode_needs_the_same_rights_on_its_own_marker_topic(
    tmp_path: Path, mode: str, marker: str
) -> None:
    sink = KafkaSink(
        "b:9093",
        "orders",
        uid="o",
        mode=mode,  # type: ignore[arg-type]
        wal=str(tmp_path),
        key="k",
        transactional_id_prefix="app",
    )
    got = {
        (a.kind, a.name, a.operation, a.prefixed) for a in required_acls(sink.settings, "orders")
    }
    assert got == {
        ("Topic", "orders", "Write", False),
        ("Topic", "orders", "DescribeConfigs", False),
        ("Topic", marker, "Write", False),
        ("Topic", marker, "Read", False),
        ("Topic", marker, "DescribeConfigs", False),
        ("TransactionalId", "app-o-", "Write", True),
        ("Group", "txsink-marker-o", "Describe", False),
        ("Cluster", "kafka-cluster", "DescribeConfigs", False),
    }
    created = required_acls(sink.settings, "orders", create_marker_topic=True)
    assert ("Topic", marker, "Create") in {(a.kind, a.name, a.operation) for a in created}


def test_lines_name_the_pattern_and_the_cluster() -> None:
    txid = Acl("TransactionalId", "app-o-", "Write", "why", prefixed=True)
    assert kafka_acls_line(txid, "u", "b:1").endswith(
        "--allow-principal User:u --operation Write --transactional-id app-o- "
        "--resource-pattern-type prefixed"
    )
    cluster = Acl("Cluster", "kafka-cluster", "DescribeConfigs", "why")
    assert kafka_acls_line(cluster, "u").endswith("--operation DescribeConfigs --cluster")


def test_bindings_are_confluent_kafkas() -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclBindingFilter,
        AclOperation,
        ResourcePatternType,
        ResourceType,
    )

    acl = Acl("TransactionalId", "app-o-", "Write", "why", prefixed=True)
    binding = acl.binding("u")
    assert type(binding) is AclBinding
    assert binding.restype == ResourceType.TRANSACTIONAL_ID
    assert binding.resource_pattern_type == ResourcePatternType.PREFIXED
    assert binding.operation == AclOperation.WRITE
    assert binding.principal == "User:u"
    assert type(acl.binding("u", as_filter=True)) is AclBindingFilter


@pytest.mark.parametrize("operation", get_args(Operation))
def test_each_operation_has_its_confluent_kafka_name(operation: str) -> None:
    from confluent_kafka.admin import AclOperation  # type: ignore[attr-defined]

    assert _op_name(operation) in AclOperation.__members__
