"""A Kafka SASL login refused at a decided epoch's commit is a blocked epoch with its fix.

librdkafka fails the call of a producer that cannot log in with ``_TRANSPORT`` (no
connection came up) and gives the cause, ``_AUTHENTICATION``, only to the error callback;
the connector classifies the kept cause (integration/test_secret_rotation.py meets it on a
real broker).
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from txsink.connectors.kafka.clients.errors import commit_error
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.errors import ConfigurationError, EpochBlockedError

SETTINGS = KafkaSettings(
    "broker1:9093",
    "orders",
    "txsink",
    "txsink-markers",
    2,
    10.0,
    producer_config={"sasl.username": "txsink-app", "sasl.password": "s3cret"},
)


def test_a_refused_login_at_commit_is_blocked_with_the_fix() -> None:
    err = commit_error(KafkaError(KafkaError._AUTHENTICATION), SETTINGS, epoch=7, shard=1)
    assert isinstance(err, EpochBlockedError)
    assert err.context["epoch"] == 7 and err.shard == 1
    assert "kafka-configs --bootstrap-server broker1:9093" in err.fix
    assert "--entity-name txsink-app" in err.fix
    assert "s3cret" not in str(err)


def test_a_refused_login_at_the_check_is_a_configuration_error() -> None:
    code = KafkaError(KafkaError._AUTHENTICATION)
    err = commit_error(code, SETTINGS, epoch=None, shard=0, init=True, phase="check")
    assert type(err) is ConfigurationError


def test_a_broker_transport_failure_at_commit_is_not_blocked() -> None:
    err = commit_error(KafkaError(KafkaError._TRANSPORT), SETTINGS, epoch=7, shard=1)
    assert not isinstance(err, EpochBlockedError)
