"""The per-shard transactional producers of one process, and the commit transaction.

A shard's producer has the stable ``transactional.id`` ``<prefix>-<uid>-<shard>``;
``init_transactions`` on it fences every older producer with that id (a zombie driver, a
crashed run) and aborts whatever transaction it left open. The driver keeps its producers
across epochs (WAL mode); replay commit tasks take theirs from the Python worker's pool
(:mod:`~txsink.connectors.kafka.clients.pool`), which may have been fenced since: :meth:`confirm`
finds out before the task's records are all consumed.

A commit is one Kafka transaction per shard: the shard's records, then its marker
(:mod:`~txsink.connectors.kafka.clients.markers`), then ``commit_transaction``, retried as
librdkafka asks. Any failure aborts the transaction: nothing of it is visible, and no
transaction is left open to hold ``read_committed`` readers back; the producer is dropped
(the next use makes a new one), so no producer carries a failed transaction on.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import operator
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from txsink.connectors.kafka.clients.columns import PyColumns, py_columns
from txsink.connectors.kafka.clients.errors import (
    REFUSED_LOGIN,
    client_calls,
    commit_error,
    failed_delivery,
    has_code,
)
from txsink.connectors.kafka.clients.markers import Markers
from txsink.connectors.kafka.clients.settings import ENFORCED, KafkaSettings, init_transactions
from txsink.observe.logs import get_logger

__all__ = ["ShardProducers", "StaleProducerError", "fence", "produce_records"]


class StaleProducerError(Exception):
    """A reused producer cannot write any more (another producer took over its
    transactional id, or it failed): raised by :meth:`ShardProducers.confirm` before the
    caller's work is lost, so the caller can make a new producer and start again. Never
    leaves the connector."""


class ShardProducers:
    """This process's producer per shard, with the shards' markers as it last saw them.

    Not picklable (librdkafka clients): the sink builds one lazily in each process.
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.markers = Markers(settings)
        self._producers: dict[int, Any] = {}
        self._delivery_errors: dict[int, list[Any]] = {}

    def has(self, shard: int) -> bool:
        """Whether ``shard``'s producer exists (initialised) in this process."""
        return shard in self._producers

    def get(self, shard: int, phase: str = "commit") -> Any:
        """``shard``'s producer, created and ``init_transactions``-ed on first use (a
        failure is an error of ``phase``)."""
        from confluent_kafka import KafkaException, Producer

        producer = self._producers.get(shard)
        if producer is not None:
            return producer
        on_delivery = functools.partial(
            on_failed_delivery, self._delivery_errors.setdefault(shard, [])
        )
        conf = self.settings.producer_conf(shard, on_delivery)
        refused: list[Any] = []
        conf["error_cb"] = functools.partial(_note_refused_login, refused, conf.get("error_cb"))
        producer = Producer(conf)
        try:
            init_transactions(producer, self.settings.timeout_s)
        except KafkaException as err:
            # A refused SASL login never brings a connection up: the call then fails with
            # _TRANSPORT or _TIMED_OUT, and only the client's error callback gets the cause
            # (served by poll()).
            producer.poll(0)
            code = refused[0] if refused else err.args[0]
            # Not kept alive by the frames of the error's traceback: a producer whose login
            # is refused retries it, with its threads, until it is destroyed.
            del producer
            raise commit_error(
                code, self.settings, epoch=None, shard=shard, init=True, phase=phase
            ) from err.with_traceback(None)
        self._producers[shard] = producer
        self.markers.forget(shard)  # read it again under the new producer epoch
        self.settings.reachable()
        return producer

    def init_all(self, phase: str = "commit") -> None:
        """Initialise every shard's producer now: fences zombies and aborts any transaction
        they left open, so ``read_committed`` readers are not held back. In parallel: each
        ``init_transactions`` waits on the broker (GIL released)."""
        shards = self.settings.shards
        with ThreadPoolExecutor(max_workers=min(8, shards)) as pool:
            list(pool.map(functools.partial(self.get, phase=phase), range(shards)))

    def close(self) -> None:
        for producer in self._producers.values():
            producer.flush(0)
        self._producers.clear()
        self.markers.clear()

    def drop(self, shard: int) -> None:
        """Forget ``shard``'s producer and cached marker (the next :meth:`get` makes and
        initialises a new producer, which fences this one)."""
        self._producers.pop(shard, None)
        self.markers.forget(shard)

    def confirm(self, shard: int) -> None:
        """Inside a transaction of a reused producer, after its first records: wait until
        they are delivered, or raise :class:`StaleProducerError` (fenced by another
        producer of the same transactional id, or failed). A fenced producer's first
        produce is refused by the transaction coordinator."""
        from confluent_kafka import KafkaException

        producer = self._producers.get(shard)
        if producer is None:
            raise StaleProducerError(f"shard {shard}: no producer")
        try:
            left = producer.flush(self.settings.timeout_s)
        except (KafkaException, SystemError) as err:
            # A fenced producer's flush raises the fatal error (a SystemError when it
            # interrupts a delivery callback: confluent-kafka 2.16)
            raise StaleProducerError(f"shard {shard}: {_kafka_error(err) or err}") from err
        except:  # noqa: E722 - see below
            # confluent-kafka 2.16 can leave the fatal error's bare KafkaError (not an
            # exception class) as the pending exception of a fenced producer's flush: no
            # typed clause matches it, and uncaught it kills Spark's Python worker. This
            # producer is stale whatever was raised: a fresh one takes the shard over.
            raise StaleProducerError(f"shard {shard}: {sys.exc_info()[1]!r}") from None
        errors = self._delivery_errors.get(shard) or []
        if left or errors:
            raise StaleProducerError(f"shard {shard}: {errors[0] if errors else 'not delivered'}")

    def transaction(
        self,
        shard: int,
        app: str,
        epoch: int,
        body: Callable[[Any], None],
        *,
        reused: bool = False,
    ) -> None:
        """One Kafka transaction on ``shard``'s producer: ``body(producer)`` produces the
        records, then the marker for ``epoch``; commit. ``reused``: the producer served an
        earlier task (pooled); a ``begin_transaction`` it fails raises
        :class:`StaleProducerError`, before ``body`` ran."""
        from confluent_kafka import KafkaException

        producer = self.get(shard)
        errors = self._delivery_errors.setdefault(shard, [])
        errors.clear()
        marker_key, marker_value = self.markers.record(app, shard, epoch)
        started = time.monotonic()
        if reused:
            try:
                producer.begin_transaction()
            except KafkaException as err:
                self.drop(shard)
                raise StaleProducerError(f"shard {shard}: {err.args[0].name()}") from err
        try:
            if not reused:
                producer.begin_transaction()
            body(producer)
            # The records may have filled the local queue: the marker waits for room too
            _produce_when_room(
                producer, self.settings.marker_topic, marker_value, marker_key, partition=0
            )
            self._commit_transaction(producer)
        except (KafkaException, SystemError) as err:
            # Drop the producer and the cached marker: the next attempt re-initialises
            # (which completes or aborts whatever this one left at the broker) and reads
            # the marker again; the marker, not this outcome, says whether it committed.
            kerr = _kafka_error(err)
            if kerr is None:
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(self.settings.timeout_s)
                self.drop(shard)
                raise
            self.drop(shard)
            if not kerr.fatal():
                with contextlib.suppress(KafkaException):
                    producer.abort_transaction(self.settings.timeout_s)
            elapsed = time.monotonic() - started
            # The dropped producer is not kept alive (with its threads) by the frames of the
            # error's traceback for as long as the error is kept: the cause goes without its.
            del producer
            raise commit_error(
                kerr, self.settings, epoch=epoch, shard=shard, delivery=errors, elapsed=elapsed
            ) from err.with_traceback(None)
        except BaseException:
            with contextlib.suppress(KafkaException):
                producer.abort_transaction(self.settings.timeout_s)
            self.drop(shard)  # a producer whose transaction failed is not used again
            raise
        self.markers.remember(shard, epoch)
        self.settings.reachable()
        warn_if_slow(self.settings, shard, epoch, time.monotonic() - started)

    def _commit_transaction(self, producer: Any) -> None:
        """``commit_transaction``, retried on retriable errors as librdkafka asks."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            try:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                return
            except KafkaException as err:
                if not err.args[0].retriable() or time.monotonic() >= deadline:
                    raise


def warn_if_slow(settings: KafkaSettings, shard: int, epoch: int, elapsed: float) -> None:
    """A WARNING when a shard's transaction ran over half of ``transaction.timeout.ms``
    (the broker aborts it at the whole: the commit would then fail on every retry)."""
    uid, limit = settings.uid, settings.txn_timeout_s
    if elapsed > limit / 2:
        get_logger(__name__, uid=uid, epoch=epoch).warning(
            "Kafka shard %s: the transaction took %.1fs to commit, over half "
            "of transaction.timeout.ms (%.0fs); the broker aborts longer ones and the commit "
            "would then fail on every retry. Raise transaction.timeout.ms (up to the "
            "broker's transaction.max.timeout.ms) or use more shards",
            shard,
            elapsed,
            limit,
            extra={"txsink_uid": uid, "txsink_epoch": epoch},
        )


def produce_records(producer: Any, batch: pa.RecordBatch, columns: PyColumns | None = None) -> None:
    """Hand one batch of records (:data:`~txsink.connectors.kafka.records.format.
    RECORD_SCHEMA`) to the producer: the hot loop of every commit. ``columns``: the batch
    as Python objects, if the caller converted it already
    (:func:`~txsink.connectors.kafka.clients.columns.py_columns`).

    Positional arguments and no per-record callback: the producers report failed
    deliveries only (``delivery.report.only.error``), and any failure also fails
    ``commit_transaction``. Records of one topic with no partition and no headers (the
    usual case) take the leanest loop: ``map`` over the values and keys, drained by a
    ``deque``, calls ``produce`` from C, with no bytecode per record. confluent-kafka
    takes each record as Python objects in a call of its own; its ``produce_batch`` (a
    dict per record, parsed back in C, one partition per call) measured no cheaper
    (docs/performance.md, "The Kafka produce path").
    """
    cols = columns or py_columns(batch)
    n = cols.rows
    simple = batch.column(1).null_count == n and batch.column(4).null_count == n
    if simple and cols.topic is not None:
        _produce_all(producer, cols.topic, cols.values.tolist(), cols.keys.tolist())
    else:
        keys, values = cols.keys.tolist(), cols.values.tolist()
        topics = [cols.topic] * n if cols.topic is not None else cols.topics.tolist()
        parts, headers = batch.column(1).to_pylist(), batch.column(4).to_pylist()
        for topic, part, key, value, hdrs in zip(topics, parts, keys, values, headers, strict=True):
            hs = [(h["key"], h["value"]) for h in hdrs or ()] or None
            at = -1 if part is None else part
            _produce_when_room(producer, topic, value, key, partition=at, headers=hs)
    producer.poll(0)


def _produce_all(producer: Any, topic: str, values: list[Any], keys: list[Any]) -> None:
    """``produce(topic, value, key)`` for each record, in order, from C. When the local
    queue is full (``BufferError``), the record refused is the last one ``map`` took: the
    list iterator's ``operator.length_hint`` says how many are left after it, so it is
    produced again once there is room, and the rest follow; none twice, none skipped
    (integration/test_kafka_produce.py)."""
    values_left, keys_left = iter(values), iter(keys)
    while True:
        try:
            collections.deque(
                map(producer.produce, itertools.repeat(topic), values_left, keys_left), maxlen=0
            )
            return
        except BufferError:
            refused = len(values) - operator.length_hint(values_left) - 1
            _produce_when_room(producer, topic, values[refused], keys[refused])


def _produce_when_room(
    producer: Any,
    topic: str,
    value: Any,
    key: Any,
    *,
    partition: int = -1,
    headers: list[tuple[str, Any]] | None = None,
) -> None:
    """Produce one record, waiting while the local queue is full (deliveries drain)."""
    while True:
        try:
            if headers is None and partition == -1:
                producer.produce(topic, value, key)
            else:
                producer.produce(topic, value, key, partition, headers=headers)
            return
        except BufferError:
            producer.poll(0.05)


def fence(settings: KafkaSettings, transactional_ids: list[str], *, phase: str) -> None:
    """``init_transactions`` on each id: aborts the transaction a dead producer left open
    (it would hold ``read_committed`` readers back) and fences a zombie. A client error is
    raised classified (:func:`~txsink.connectors.kafka.clients.errors.client_calls`), of
    ``phase``."""
    from confluent_kafka import Producer

    for tid in transactional_ids:
        conf = {
            **settings.producer_config,
            "bootstrap.servers": settings.bootstrap_servers,
            "transactional.id": tid,
            **ENFORCED,
        }
        with client_calls(settings, f"fencing transactional id {tid!r}", phase=phase):
            init_transactions(Producer(conf), settings.timeout_s)


def _kafka_error(err: BaseException) -> Any:
    """The ``KafkaError`` of ``err``: a KafkaException's, or that of the KafkaException a
    fatal error raised inside a callback turned into a SystemError; else None."""
    from confluent_kafka import KafkaException

    for exc in (err, err.__cause__):
        if isinstance(exc, KafkaException):
            return exc.args[0]
    return None


def _note_refused_login(seen: list[Any], given: Callable[[Any], None] | None, err: Any) -> None:
    """A producer's ``error_cb``: keep the brokers' refusal of the SASL login (by code), then
    call the one given in ``producer_config``, if any."""
    if not seen and has_code(err, *REFUSED_LOGIN):
        seen.append(err)
    if given is not None:
        given(err)


def on_failed_delivery(errors: list[Any], err: Any, msg: Any) -> None:
    """Producer-wide delivery callback (failures only) of every mode: keep the first, with
    its context (its code and key: a refusal for good blocks the epoch, naming the record).

    It never raises into librdkafka: when a fenced producer's fatal error is pending,
    confluent-kafka (2.16) calls it with that error already set, and reading the message
    (``msg.key()``) then fails; the error alone is kept (``repr``) instead."""
    if err is not None and not errors:
        try:
            errors.append(failed_delivery(err, msg))
        except Exception:
            errors.append(repr(err))
