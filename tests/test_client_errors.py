"""The classification tables of raw client errors (issue 34, point 4): confluent-kafka by
``KafkaError`` code, psycopg by SQLSTATE, botocore by exception type, S3 error code and
HTTP status — never by message text. Each table is driven with the library's own
exception types, their texts chosen to mislead: only the code may decide."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from botocore import exceptions as bx
from confluent_kafka import KafkaError, KafkaException

from txsink.connectors.kafka.clients.errors import check_error, client_calls, client_error, kind_of
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.connectors.postgres.errors import map_error
from txsink.connectors.s3.errors import classify, log_error, sink_error
from txsink.errors import (
    CommitError,
    ConfigurationError,
    EpochBlockedError,
    FencedError,
    LogError,
    LogUnavailableError,
    RetryableError,
    TxsinkError,
    UnreachableError,
    WriteError,
    restart_cannot_help,
)
from txsink.txid import TxnId

SETTINGS = KafkaSettings("127.0.0.1:9092", "k", "txsink", "markers", 2, 10.0)

# -- Kafka ---------------------------------------------------------------------------------

KAFKA_KINDS = [
    ("_TRANSPORT", "transient"),
    ("_TIMED_OUT", "transient"),
    ("_ALL_BROKERS_DOWN", "transient"),
    ("_RESOLVE", "transient"),
    ("_NOENT", "transient"),  # "No leaders found": not retriable() in librdkafka
    ("LEADER_NOT_AVAILABLE", "transient"),
    ("NOT_LEADER_FOR_PARTITION", "transient"),
    ("NOT_COORDINATOR", "transient"),
    ("COORDINATOR_LOAD_IN_PROGRESS", "transient"),
    ("REQUEST_TIMED_OUT", "transient"),
    ("_FENCED", "fenced"),
    ("PRODUCER_FENCED", "fenced"),
    ("INVALID_PRODUCER_EPOCH", "fenced"),
    ("_AUTHENTICATION", "denied"),
    ("SASL_AUTHENTICATION_FAILED", "denied"),
    ("TOPIC_AUTHORIZATION_FAILED", "denied"),
    ("TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "denied"),
    ("INVALID_CONFIG", "other"),
    ("MSG_SIZE_TOO_LARGE", "other"),
    ("POLICY_VIOLATION", "other"),
]


@pytest.mark.parametrize(("name", "kind"), KAFKA_KINDS)
def test_kafka_errors_are_classified_by_code(name: str, kind: str) -> None:
    misleading = "connection refused, fenced, access denied"  # the text decides nothing
    assert kind_of(KafkaError(getattr(KafkaError, name), misleading)) == kind


KAFKA_TYPES: dict[str, dict[str, type[TxsinkError]]] = {
    "transient": {"commit": RetryableError, "recover": RetryableError},
    "fenced": {"commit": FencedError, "recover": FencedError},
    "denied": {"commit": ConfigurationError, "recover": ConfigurationError},
    "other": {"commit": CommitError, "recover": TxsinkError},
}


@pytest.mark.parametrize(("name", "kind"), KAFKA_KINDS)
@pytest.mark.parametrize("phase", ["commit", "recover"])
def test_kafka_client_errors_become_typed_errors_with_their_context(
    name: str, kind: str, phase: str
) -> None:
    err = client_error(
        KafkaError(getattr(KafkaError, name), "it failed"),
        SETTINGS,
        "reading the marker topic",
        phase=phase,
        epoch=3,
        shard=1,
    )
    assert type(err) is KAFKA_TYPES[kind][phase]
    assert str(err).startswith(
        f"[sink_uid=k, epoch=3, shard=1, phase={phase}, connector=kafka] Kafka shard 1: "
        f"reading the marker topic failed: it failed ({name})"
    )


def test_a_kafka_calls_timeout_is_transient_and_never_leaves_raw() -> None:
    with (
        pytest.raises(RetryableError) as caught,
        client_calls(SETTINGS, "listing", phase="recover"),
    ):
        raise TimeoutError()  # a future's result(timeout=...) that did not come
    assert str(caught.value).startswith(
        "[sink_uid=k, phase=recover, connector=kafka] Kafka: listing failed: no answer in time "
        "(TimeoutError); transient"
    )
    assert kind_of(ValueError("bad")) == "other"
    checked = check_error(TimeoutError(), SETTINGS, "list the topics")
    # Brokers that did not answer may be back at a restart: a ConfigurationError that the
    # restarting runner restarts on; refused credentials are not.
    assert type(checked) is UnreachableError and isinstance(checked, ConfigurationError)
    assert not restart_cannot_help(checked)
    assert "did not answer in time" in str(checked)
    denied = check_error(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED), SETTINGS, "list")
    assert type(denied) is ConfigurationError and restart_cannot_help(denied)
    # A group coordinator still loading on a broker that just started (seen by the rights
    # check's group description, without librdkafka's retriable flag): a restart passes.
    for code in (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS):
        moving = check_error(KafkaError(code), SETTINGS, "check the sink's rights")
        assert type(moving) is UnreachableError, code


def test_fencing_an_unreachable_broker_raises_a_classified_error() -> None:
    """A fencing ``init_transactions`` (abort of a direct-mode handle, migrate, leftovers)
    against no broker at all: a RetryableError of the caller's phase, never a raw
    KafkaException (a real client: nothing listens on port 1)."""
    from txsink.connectors.kafka.clients.producers import fence

    settings = KafkaSettings("127.0.0.1:1", "k", "txsink", "markers", 1, 1.0)
    with pytest.raises(RetryableError) as caught:
        fence(settings, ["txsink-k-0"], phase="abort")
    assert str(caught.value).startswith(
        "[sink_uid=k, phase=abort, connector=kafka] Kafka: fencing transactional id "
        "'txsink-k-0' failed: "
    )
    assert isinstance(caught.value.__cause__, KafkaException)


# -- PostgreSQL ----------------------------------------------------------------------------

PG_STATES = [
    ("08006", RetryableError),  # connection_failure
    ("08001", RetryableError),  # sqlclient_unable_to_establish_sqlconnection
    ("08003", RetryableError),  # connection_does_not_exist
    ("57P01", RetryableError),  # admin_shutdown
    ("57P02", RetryableError),  # crash_shutdown
    ("57P03", RetryableError),  # cannot_connect_now (starting up, recovering)
    ("53300", RetryableError),  # too_many_connections
    ("40001", RetryableError),  # serialization_failure
    ("40P01", RetryableError),  # deadlock_detected
    ("55P03", RetryableError),  # lock_not_available
    ("23505", WriteError),  # unique_violation
    ("23502", WriteError),  # not_null_violation
    ("22P02", WriteError),  # invalid_text_representation
    ("28P01", ConfigurationError),  # invalid_password
    ("42501", ConfigurationError),  # insufficient_privilege
    ("42P01", TxsinkError),  # undefined_table
    ("XX000", TxsinkError),  # internal_error
]


@pytest.mark.parametrize(("state", "kind"), PG_STATES)
@pytest.mark.parametrize("phase", ["write", "recover", "commit"])
def test_postgres_errors_are_classified_by_sqlstate(
    state: str, kind: type[TxsinkError], phase: str
) -> None:
    err = psycopg.errors.lookup(state)("connection refused")  # the text decides nothing
    mapped = map_error(err, TxnId("app", "pg", 4, 0, 2, 0), sink_uid="pg", table="t", phase=phase)
    if kind is ConfigurationError and phase in ("commit", "recover"):
        kind = EpochBlockedError  # a decided epoch's grant revoked: blocked until fixed
    assert type(mapped) is kind
    assert f"(SQLSTATE {state})" in str(mapped)
    assert str(mapped).startswith(
        f"[sink_uid=pg, epoch=4, partition=2, phase={phase}, connector=postgres] "
    )


def test_a_lost_postgres_connection_says_who_retries_it() -> None:
    lost = psycopg.OperationalError("consuming input failed")  # no session: no SQLSTATE
    told = {
        phase: str(map_error(lost, None, sink_uid="pg", table="t", phase=phase))
        for phase in ("write", "commit", "recover")
    }
    assert "SQLSTATE" not in "".join(told.values())
    assert "Spark retries the task" in told["write"]
    assert "The decision stands" in told["commit"] and "Spark" not in told["commit"]
    assert "recovery does it again" in told["recover"] and "Spark" not in told["recover"]


# -- S3 (botocore) -------------------------------------------------------------------------


def _client_error(code: str, status: int) -> bx.ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": "connection reset; slow down"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return bx.ClientError(response, "PutObject")


S3_KINDS: list[tuple[Exception, str]] = [
    (bx.EndpointConnectionError(endpoint_url="http://s3:9000"), "unreachable"),
    (bx.ConnectTimeoutError(endpoint_url="http://s3:9000"), "unreachable"),
    (bx.ReadTimeoutError(endpoint_url="http://s3:9000"), "connection"),
    (bx.ConnectionClosedError(endpoint_url="http://s3:9000"), "connection"),
    (_client_error("SlowDown", 503), "throttled"),
    (_client_error("", 503), "throttled"),
    (_client_error("TooManyRequestsException", 429), "throttled"),
    (_client_error("InternalError", 500), "transient"),
    (_client_error("RequestTimeout", 400), "transient"),
    (_client_error("AccessDenied", 403), "denied"),
    (_client_error("InvalidAccessKeyId", 403), "denied"),
    (_client_error("NoSuchBucket", 404), "no-bucket"),
    (bx.NoCredentialsError(), "credentials"),
    (_client_error("InvalidRequest", 400), "other"),
]
S3_PASSING = {"unreachable", "connection", "throttled", "transient"}


@pytest.mark.parametrize(("err", "kind"), S3_KINDS, ids=[k for _, k in S3_KINDS])
def test_s3_errors_are_classified_by_type_code_and_status(err: Exception, kind: str) -> None:
    assert classify(err) == kind


@pytest.mark.parametrize(("err", "kind"), S3_KINDS, ids=[k for _, k in S3_KINDS])
@pytest.mark.parametrize("phase", ["write", "commit", "recover"])
def test_s3_sink_errors_are_transient_or_permanent_by_class(
    err: Exception, kind: str, phase: str
) -> None:
    context = {"sink_uid": "s3", "phase": phase, "connector": "s3"}
    mapped = sink_error(err, "upload a part of", "s3://b/k", bucket="b", context=context)
    if kind in S3_PASSING:
        assert type(mapped) is RetryableError
    elif kind in ("denied", "no-bucket", "credentials"):
        # refused for good: at the start a fix, after the decision a blocked epoch
        assert type(mapped) is (EpochBlockedError if phase == "commit" else ConfigurationError)
    else:
        assert type(mapped) is (CommitError if phase == "commit" else ConfigurationError)
    assert str(mapped).startswith(f"[sink_uid=s3, phase={phase}, connector=s3] cannot upload")


@pytest.mark.parametrize(("err", "kind"), S3_KINDS, ids=[k for _, k in S3_KINDS])
def test_s3_log_store_errors_are_transient_or_permanent_by_class(err: Exception, kind: str) -> None:
    mapped = log_error("read", "s3://b/log/epoch-1", "b", "http://s3:9000", err)
    assert isinstance(mapped, LogError)
    assert isinstance(mapped, RetryableError) is (kind in S3_PASSING)
    assert (type(mapped) is LogUnavailableError) is (kind in S3_PASSING)
    if kind in S3_PASSING:
        assert "Transient: the call is safe to retry" in str(mapped)
