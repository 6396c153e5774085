"""Kafka errors to txsink errors, by ``KafkaError`` code (never by message text).

::

    fenced, after about transaction.timeout.ms               -> CommitError (timed out)
    INVALID_PRODUCER_ID_MAPPING (the id expired)               -> as below, and says so
    fenced (_FENCED, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH)  -> FencedError
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED                      -> ConfigurationError
    retriable, or _TIMED_OUT                                   -> RetryableError
    a refused SASL login at commit (_AUTHENTICATION,
      SASL_AUTHENTICATION_FAILED: a password changed or expired,
      a SCRAM credential deleted; the producer's error_cb keeps
      it, the call itself fails with _TRANSPORT)               -> EpochBlockedError (the fix:
                                                                  renew the credential)
    refused for good after the decision (by the first failed
      delivery's code, else the commit's): MSG_SIZE_TOO_LARGE,
      *_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_OR_PART, INVALID_RECORD,
      ...: :data:`PERMANENT`                                   -> EpochBlockedError, with the fix
    anything else at commit                                    -> CommitError

At the start-up check (:func:`check_error`, and :func:`commit_error` with
``phase="check"``) every failure is a ConfigurationError with its fix: brokers that
cannot be reached (_TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN, _RESOLVE), refused
credentials or ACLs (_AUTHENTICATION, SASL_AUTHENTICATION_FAILED, *_AUTHORIZATION_FAILED),
TLS (_SSL), anything else with its code.

Any other client call (admin, consumer, a fencing ``init_transactions``; :func:`client_calls`
around it, :func:`kind_of` its table)::

    fenced (_FENCED, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH)         -> FencedError
    refused credentials or ACLs (_AUTHENTICATION, *_AUTHORIZATION_FAILED) -> ConfigurationError
    retriable(), a broker or leader gone for a moment (_TRANSPORT, _TIMED_OUT,
    _ALL_BROKERS_DOWN, _RESOLVE, _NOENT, LEADER_NOT_AVAILABLE, NOT_COORDINATOR, ...),
    or a client-side timeout of a call's future                       -> RetryableError
    anything else                  -> CommitError at commit (the decision stands), else TxsinkError

Each text says what to do; a transaction that ran close to ``transaction.timeout.ms``
says that the broker aborted it, and a failed ``init_transactions`` what the brokers
need for transactions.

A broker that aborts a timed-out transaction bumps its producer epoch, so the producer's
next request is refused as *fenced* ("fenced by a newer instance", measured with Kafka
4.1 and librdkafka 2.16): the same codes a zombie meets. After about
``transaction.timeout.ms`` the timeout is the cause, and the error says so first
(a CommitError: the decision stands, recovery retries), not "another producer took the
id over" (docs/time-limits.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.errors import (
    CommitError,
    ConfigurationError,
    EpochBlockedError,
    FencedError,
    RetryableError,
    TxsinkError,
    UnreachableError,
)

__all__ = [
    "PERMANENT",
    "REFUSED_LOGIN",
    "FailedDelivery",
    "Kind",
    "check_error",
    "client_calls",
    "client_error",
    "commit_error",
    "error_code",
    "failed_delivery",
    "has_code",
    "kind_of",
]

#: Codes with which the brokers refuse a decided epoch's records or transaction until an
#: operator changes something (a topic's config, an ACL, a deleted topic): no retry helps.
PERMANENT = (
    "MSG_SIZE_TOO_LARGE",
    "RECORD_LIST_TOO_LARGE",
    "TOPIC_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "UNKNOWN_TOPIC_OR_PART",
    "_UNKNOWN_TOPIC",
    "_UNKNOWN_PARTITION",
    "INVALID_RECORD",
    "INVALID_TIMESTAMP",
    "POLICY_VIOLATION",
)


#: Codes with which the brokers refuse the SASL login itself (the credentials, not a right).
REFUSED_LOGIN = ("_AUTHENTICATION", "SASL_AUTHENTICATION_FAILED")


@dataclass(frozen=True)
class FailedDelivery:
    """A record the brokers did not take: its error's code and text, where, and its key."""

    code: int
    name: str
    text: str
    topic: str
    partition: int
    key: bytes | None
    size: int

    def __str__(self) -> str:
        return f"{self.text} (topic {self.topic} partition {self.partition})"


def failed_delivery(err: Any, msg: Any) -> FailedDelivery:
    """The :class:`FailedDelivery` of a delivery callback's ``err`` and ``msg``."""
    key = msg.key()
    headers = msg.headers() or []
    size = len(msg.value() or b"") + len(key or b"")
    size += sum(len(k) + len(v or b"") for k, v in headers)
    return FailedDelivery(
        int(err.code()), str(err.name()), str(err.str()), str(msg.topic()),
        int(msg.partition()), key, size,
    )  # fmt: skip


#: What a client error means for the caller (:func:`kind_of`).
Kind = Literal["fenced", "denied", "transient", "other"]

_FENCED = ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
#: Codes of a failed ``init_transactions`` that mean "the brokers cannot do transactions".
_NO_TRANSACTIONS = (
    "_TIMED_OUT",
    "COORDINATOR_NOT_AVAILABLE",
    "_UNSUPPORTED_FEATURE",
    "UNSUPPORTED_VERSION",
)
#: Codes that mean "the brokers cannot be reached from here".
_UNREACHABLE = ("_TRANSPORT", "_TIMED_OUT", "_ALL_BROKERS_DOWN", "_RESOLVE")
#: A group coordinator that is moving or still loading (a broker just started): the admin
#: API's answers carry these without the retriable flag.
_COORDINATOR_MOVING = (
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
)
_DENIED = (
    "_AUTHENTICATION",
    "SASL_AUTHENTICATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
)


#: Codes of a broker or partition that is not there for a moment: a leader election, a
#: broker restarting, a coordinator moving (librdkafka does not mark all of them
#: ``retriable()``: "No leaders found" is ``_NOENT``).
_MOMENTARY = (
    *_UNREACHABLE,
    "_NOENT",
    "_MSG_TIMED_OUT",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_FOR_PARTITION",
    "REQUEST_TIMED_OUT",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
)


def error_code(name: str) -> int:
    """The ``KafkaError`` code called ``name`` (``"TOPIC_ALREADY_EXISTS"``, ``"_FENCED"``)."""
    from confluent_kafka import KafkaError

    return int(getattr(KafkaError, name))


def has_code(err: Any, *names: str) -> bool:
    """Whether the ``KafkaError`` ``err`` has one of the codes ``names``; a name the installed
    client does not define is a code it cannot report, never an ``AttributeError`` in the
    middle of telling an error (tests/test_kafka_errors_codes.py checks ours all exist)."""
    from confluent_kafka import KafkaError

    codes = {int(getattr(KafkaError, name)) for name in names if hasattr(KafkaError, name)}
    return int(err.code()) in codes


def kind_of(err: Any) -> Kind:
    """What the ``KafkaError`` ``err`` (or a client call's own exception) means, by code
    (never by its text): see the module's table."""
    if not hasattr(err, "code"):  # not a KafkaError: a future's timeout is transient
        return "transient" if isinstance(err, TimeoutError) else "other"
    if has_code(err, *_FENCED):
        return "fenced"
    if has_code(err, *_DENIED):
        return "denied"
    if err.retriable() or has_code(err, *_MOMENTARY):
        return "transient"
    return "other"


def _told(err: Any) -> str:
    """``err`` in a message: a KafkaError's text and name, or an exception's type and text."""
    if hasattr(err, "code"):
        return f"{err.str()} ({err.name()})"
    if isinstance(err, TimeoutError):
        return "no answer in time (TimeoutError)"
    return f"{type(err).__name__}: {err}"


def check_error(err: Any, settings: KafkaSettings, doing: str) -> ConfigurationError:
    """The start-up check's error for the ``KafkaError`` ``err`` (or a call's timeout) met
    while ``doing``: an :class:`~txsink.errors.UnreachableError` when the brokers did not
    answer or answered with a retriable code (a restart may pass it), else a
    ConfigurationError."""
    ctx = settings.context("check")
    what = f"cannot {doing} at {settings.bootstrap_servers}: {_told(err)}"
    if not hasattr(err, "code"):
        fix = (
            "the brokers did not answer in time: check bootstrap_servers, that the brokers "
            "run and that they are not overloaded, or raise timeout_s"
        )
    elif has_code(err, *_UNREACHABLE):
        fix = (
            "the brokers cannot be reached: check bootstrap_servers, that the brokers run "
            "and that their advertised listeners are reachable from the driver and executors"
        )
    elif has_code(err, *_DENIED):
        fix = (
            "the brokers refused the credentials or the ACLs: check the SASL/TLS settings in "
            "producer_config, and grant DESCRIBE and WRITE on the topics, CREATE on the "
            "marker topic, WRITE on TransactionalId "
            f"{settings.prefix}-{settings.uid}-*, DESCRIBE_CONFIGS on the cluster and the topics"
        )
    elif has_code(err, "_SSL"):
        fix = "the TLS handshake failed: check ssl.* in producer_config and the brokers' certs"
    else:
        fix = "fix what the brokers say, then start again"
    # Brokers that did not answer, cannot be reached or answered with a retriable code (a
    # coordinator still loading) may pass at a restart: the brokers may be back by then.
    passing = (
        not hasattr(err, "code")
        or has_code(err, *_UNREACHABLE, *_COORDINATOR_MOVING)
        or bool(getattr(err, "retriable", lambda: False)())
    )
    return (UnreachableError if passing else ConfigurationError)(f"{what}; {fix}", **ctx)


def commit_error(
    err: Any,
    settings: KafkaSettings,
    *,
    epoch: int | None,
    shard: int,
    delivery: Sequence[FailedDelivery | str] = (),
    elapsed: float = 0.0,
    init: bool = False,
    phase: str = "commit",
) -> TxsinkError:
    """The txsink error for the ``KafkaError`` ``err`` of ``shard``'s producer.

    ``delivery``: the first failed delivery of the transaction, if any; ``elapsed``: how
    long the transaction ran; ``init``: ``err`` came from ``init_transactions``;
    ``phase="check"``: from the start-up check (a ConfigurationError then).
    """
    if phase == "check" and not (init and has_code(err, *_NO_TRANSACTIONS)):
        tid = settings.transactional_id(shard)
        return check_error(err, settings, f"initialise the transactional producer {tid!r}")
    ctx = settings.context(phase, epoch=epoch)
    tid = settings.transactional_id(shard)
    detail = f"{err.str()}" + (f"; first delivery error: {delivery[0]}" if delivery else "")
    timed_out = elapsed >= 0.9 * settings.txn_timeout_s
    if timed_out and has_code(err, *_FENCED):
        return CommitError(
            f"Kafka shard {shard}: the broker aborted the commit transaction of "
            f"{tid!r}: it ran {elapsed:.0f}s, past transaction.timeout.ms "
            f"({settings.txn_timeout_s:.0f}s), and a broker fences the producer of a "
            "transaction it timed out. Nothing of it is visible; the decision stands and "
            "recovery retries the commit. Raise transaction.timeout.ms in producer_config "
            "(up to the brokers' transaction.max.timeout.ms), use more shards, or find "
            f"what held the commit up ({detail})",
            **ctx,
        )
    if has_code(err, "INVALID_PRODUCER_ID_MAPPING"):
        detail += (
            f"; the broker no longer maps {tid!r} to this producer: the transactional id "
            "expired (it had no transaction for the brokers' transactional.id.expiration.ms) "
            "or its transaction was aborted meanwhile. The next attempt initialises a new "
            "producer"
        )
    if timed_out:
        detail += (
            f"; the transaction ran {elapsed:.0f}s, about transaction.timeout.ms "
            f"({settings.txn_timeout_s:.0f}s), so the broker aborted it: raise "
            "transaction.timeout.ms or use more shards"
        )
    if has_code(err, *_FENCED):
        return FencedError(
            f"transactional id {tid!r} was taken over by another "
            "producer: another live query (or a zombie driver) writes with the same "
            f"transactional_id_prefix and uid. Give each query its own prefix or uid "
            f"({detail})",
            **ctx,
        )
    if has_code(err, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED") and phase != "commit":
        return ConfigurationError(
            f"not authorised to use transactional id {tid!r}: "
            f"grant WRITE on TransactionalId {settings.prefix}-* ({detail})",
            **ctx,
        )
    if init and has_code(err, *_NO_TRANSACTIONS):
        detail += (
            f"; init_transactions for {tid!r} did not complete: "
            "the brokers must support transactions (Kafka >= 2.5) and run the transaction "
            "coordinator, i.e. transaction.state.log.replication.factor and "
            "transaction.state.log.min.isr no larger than the number of live brokers"
        )
    if phase == "check":
        return ConfigurationError(f"Kafka shard {shard}: {detail}", **ctx)
    if has_code(err, *REFUSED_LOGIN):
        return _login_refused(err, settings, shard=shard, detail=detail, ctx=ctx)
    first = next((d for d in delivery if isinstance(d, FailedDelivery)), None)
    if (first is not None and first.name in PERMANENT) or has_code(err, *PERMANENT):
        return _blocked(err, first, settings, shard=shard, detail=detail, ctx=ctx)
    if err.retriable() or has_code(err, "_TIMED_OUT"):
        return RetryableError(f"Kafka shard {shard}: {detail}", **ctx)
    return CommitError(
        f"Kafka shard {shard}: {detail}; the decision stands and recovery retries the commit",
        **ctx,
    )


def client_error(
    err: Any,
    settings: KafkaSettings,
    doing: str,
    *,
    phase: str,
    epoch: int | None = None,
    shard: int | None = None,
) -> TxsinkError:
    """The txsink error for the ``KafkaError`` ``err`` (or a client call's own exception,
    such as a future's ``TimeoutError``) met while ``doing`` (``"reading the marker
    topic"``), by :func:`kind_of`: transient -> RetryableError; fenced -> FencedError;
    refused credentials or ACLs -> ConfigurationError; else a CommitError at commit (the
    decision stands) or a TxsinkError."""
    ctx = settings.context(phase, epoch=epoch, shard=shard)
    where = f"Kafka shard {shard}: " if shard is not None else "Kafka: "
    what = f"{where}{doing} failed: {_told(err)}"
    kind = kind_of(err)
    if kind == "fenced":
        return FencedError(
            f"{what}: another producer took transactional id {settings.prefix}-"
            f"{settings.uid}-* over; give each query its own prefix or uid",
            **ctx,
        )
    if kind == "denied":
        return ConfigurationError(
            f"{what}: the brokers refused the credentials or the ACLs; grant what the sink "
            "needs (docs/connectors/kafka.md), then restart",
            **ctx,
        )
    if kind == "transient":
        return RetryableError(
            f"{what}; transient: it is retried (a task by Spark, a commit by recovery). If "
            f"it persists, check that the brokers at {settings.bootstrap_servers} run and "
            "that the topics' partitions have leaders",
            **ctx,
        )
    if phase == "commit":
        return CommitError(f"{what}; the decision stands and recovery retries the commit", **ctx)
    return TxsinkError(f"{what}; fix what the brokers say, then restart", **ctx)


@contextlib.contextmanager
def client_calls(
    settings: KafkaSettings,
    doing: str,
    *,
    phase: str,
    epoch: int | None = None,
    shard: int | None = None,
) -> Iterator[None]:
    """Around calls into confluent-kafka: a ``KafkaException`` (or a call's future timing
    out) leaves as the txsink error :func:`client_error` makes of it (the context said, the
    code classified), never raw. A txsink error raised inside gets the shard and epoch it
    lacks."""
    from confluent_kafka import KafkaException

    try:
        yield
    except TxsinkError as err:
        raise err.with_context(**settings.context(phase, epoch=epoch, shard=shard)) from (
            err.__cause__
        )
    except (KafkaException, TimeoutError) as exc:
        code = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
        raise client_error(code, settings, doing, phase=phase, epoch=epoch, shard=shard) from exc


def _blocked(
    err: Any,
    first: FailedDelivery | None,
    settings: KafkaSettings,
    *,
    shard: int,
    detail: str,
    ctx: dict[str, Any],
) -> EpochBlockedError:
    """A decided epoch's shard the brokers refuse until an operator acts: what and the fix."""
    name = first.name if first is not None and first.name in PERMANENT else str(err.name())
    topic = first.topic if first is not None else "<topic>"
    servers = settings.bootstrap_servers
    record = ""
    if first is not None:
        key = "no key" if first.key is None else f"key {first.key[:64]!r}"
        record = (
            f" The first refused record: {key}, {first.size} bytes, partition {first.partition}."
        )
    if name in ("MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE"):
        need = 1024 * (((first.size if first else 0) + 1024) // 1024 + 1)
        fix = (
            f"raise topic {topic}'s max.message.bytes to at least {need}: kafka-configs "
            f"--bootstrap-server {servers} --alter --entity-type topics --entity-name "
            f"{topic} --add-config max.message.bytes={need}"
        )
    elif name in ("UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION"):
        fix = (
            f"create topic {topic} again with (at least) its former partitions: kafka-topics "
            f"--bootstrap-server {servers} --create --topic {topic} --partitions <n>"
        )
    elif name.endswith("AUTHORIZATION_FAILED"):
        fix = (
            f"grant the sink's principal WRITE on topic {topic} and on TransactionalId "
            f"{settings.prefix}-{settings.uid}-* again: kafka-acls --bootstrap-server {servers} "
            f"--add --allow-principal <principal> --operation Write --topic {topic}"
        )
    else:
        fix = (
            f"change topic {topic}'s configuration so the brokers accept the record "
            f"(kafka-configs --describe --entity-type topics --entity-name {topic}: the "
            "refusal names the setting)"
        )
    tid = settings.transactional_id(shard)
    return EpochBlockedError(
        f"Kafka shard {shard} ({tid!r}): the brokers refuse the decided records for good "
        f"({name}: {detail}).{record} Fix: {fix}",
        fix=fix,
        shard=shard,
        **{**ctx, "partition": ctx.get("partition", shard)},
    )


def _login_refused(
    err: Any, settings: KafkaSettings, *, shard: int, detail: str, ctx: dict[str, Any]
) -> EpochBlockedError:
    """A decided epoch's shard whose producer the brokers do not let log in: its SASL
    credentials were changed, expired or deleted after the decision. Blocked until the sink
    gets the current ones (a retry with the same password fails the same way)."""
    user = str(settings.producer_config.get("sasl.username", "<the sink's sasl.username>"))
    mechanism = str(settings.producer_config.get("sasl.mechanism", "SCRAM-SHA-512"))
    fix = (
        f"give the sink the current password of the SASL user {user!r} (producer_config's "
        "sasl.password, read from where you keep it, on the driver and every executor), or "
        "renew the user's credential on the brokers: kafka-configs --bootstrap-server "
        f"{settings.bootstrap_servers} --alter --entity-type users --entity-name {user} "
        f"--add-config '{mechanism}=[password=...]'"
    )
    tid = settings.transactional_id(shard)
    return EpochBlockedError(
        f"Kafka shard {shard} ({tid!r}): the brokers refuse the sink's SASL login after the "
        f"decision ({err.name()}: {detail}); nothing of the epoch is visible, and a retry "
        f"fails the same way until an operator acts. Fix: {fix}; then run `txsink recover` "
        "(or restart the query): it commits the epoch",
        fix=fix,
        shard=shard,
        **{**ctx, "partition": ctx.get("partition", shard)},
    )
