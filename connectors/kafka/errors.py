"""Kafka errors to txsink errors, by ``KafkaError`` code (never by message text).

::

    fenced, after about transaction.timeout.ms               -> CommitError (timed out)
    INVALID_PRODUCER_ID_MAPPING (the id expired)               -> as below, and says so
    fenced (_FENCED, PRODUCER_FENCED, INVALID_PRODUCER_EPOCH)  -> FencedError
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED                      -> ConfigurationError
    retriable, or _TIMED_OUT                                   -> RetryableError
    anything else at commit                                    -> CommitError

At the start-up check (:func:`check_error`, and :func:`commit_error` with
``phase="check"``) every failure is a ConfigurationError with its fix: brokers that
cannot be reached (_TRANSPORT, _TIMED_OUT, _ALL_BROKERS_DOWN, _RESOLVE), refused
credentials or ACLs (_AUTHENTICATION, SASL_AUTHENTICATION_FAILED, *_AUTHORIZATION_FAILED),
TLS (_SSL), anything else with its code.

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

from collections.abc import Sequence
from typing import Any

from txsink.connectors.kafka.clients import KafkaSettings
from txsink.errors import CommitError, ConfigurationError, FencedError, RetryableError, TxsinkError

__all__ = ["check_error", "commit_error", "error_code", "has_code"]

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
_DENIED = (
    "_AUTHENTICATION",
    "SASL_AUTHENTICATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
)


def error_code(name: str) -> int:
    """The ``KafkaError`` code called ``name`` (``"TOPIC_ALREADY_EXISTS"``, ``"_FENCED"``)."""
    from confluent_kafka import KafkaError

    return int(getattr(KafkaError, name))


def has_code(err: Any, *names: str) -> bool:
    """Whether the ``KafkaError`` ``err`` has one of the codes ``names``."""
    return int(err.code()) in {error_code(name) for name in names}


def check_error(err: Any, settings: KafkaSettings, doing: str) -> ConfigurationError:
    """The start-up check's error for the ``KafkaError`` ``err`` met while ``doing``."""
    ctx = settings.context("check")
    what = f"cannot {doing} at {settings.bootstrap_servers}: {err.str()} ({err.name()})"
    if has_code(err, *_UNREACHABLE):
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
    return ConfigurationError(f"{what}; {fix}", **ctx)


def commit_error(
    err: Any,
    settings: KafkaSettings,
    *,
    epoch: int | None,
    shard: int,
    delivery: Sequence[str] = (),
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
    if has_code(err, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"):
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
    if err.retriable() or has_code(err, "_TIMED_OUT"):
        return RetryableError(f"Kafka shard {shard}: {detail}", **ctx)
    return CommitError(
        f"Kafka shard {shard}: {detail}; the decision stands and recovery retries the commit",
        **ctx,
    )
