"""Transactional producers kept across tasks in one Python worker.

Spark reuses its Python workers (``spark.python.worker.reuse``, the default), so a
producer made by one task can serve the next task of the same shard in that worker:
``init_transactions`` (a broker round trip and the fencing, 0.3-0.5 s) then runs once
per worker and shard instead of once per task. The API, for any task-side code::

    pooled_producer(settings, shard) -> (producer, fresh)   the worker's producer
    shard_producers(settings) -> ShardProducers           the same, with its transactions
    evict(settings, shard)                                after any failure
    clear()                                               close them all (tests)

Safe reuse, and what a caller must do (:func:`commit_shard` does it all):

* A pooled producer may have been fenced since its last use: another worker ran a task
  of the same shard (``init_transactions`` there). Kafka refuses a fenced producer's
  transaction, so no record gets in twice; but the refusal must come before the task's
  records are consumed, to start again with a new producer. Hence, for a producer that
  is not ``fresh``: read the marker with a short wait (a transaction a dead producer of
  this id left open is aborted only by a new ``init_transactions``), begin with
  ``transaction(..., reused=True)``, and call ``ShardProducers.confirm`` after the first
  records. Each raises (``StaleProducerError``, or ``RetryableError`` for the read) while
  the task can still start again: evict, then once more with a new producer.
* The marker is read in every task (``Markers.reread``), never taken from the cache: the
  read, made after this producer's ``init_transactions`` and followed by a commit that
  fails if the producer was fenced since, is what verifies the epoch.
* A producer stays pooled only with no transaction open and nothing pending: after a
  committed transaction, or unused. ``ShardProducers.transaction`` drops the producer
  of a failed or aborted transaction.

The pool is keyed by the sink's settings (brokers, uid, prefix, marker topic, shards,
timeouts, ``producer_config`` with its secrets) and the process id (librdkafka clients
do not survive a fork); the key is never logged. At most :data:`MAX_SINKS` sinks' producers
are kept, the least recently used closed first.
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from txsink.connectors.kafka.clients.producers import ShardProducers, StaleProducerError
from txsink.connectors.kafka.clients.settings import KafkaSettings
from txsink.errors import CommitError, FencedError, RetryableError

__all__ = [
    "MAX_SINKS",
    "REUSED_MARKER_WAIT_S",
    "clear",
    "commit_shard",
    "evict",
    "pooled_producer",
    "shard_producers",
]

#: How many sinks' producers a worker keeps.
MAX_SINKS = 8
#: How long a reused producer's task waits for the marker topic's open transactions.
REUSED_MARKER_WAIT_S = 2.0

T = TypeVar("T")

_LOCK = threading.Lock()
_POOL: OrderedDict[tuple[Any, ...], ShardProducers] = OrderedDict()
_INHERITED: list[ShardProducers] = []
_SHARD_LOCKS: weakref.WeakKeyDictionary[ShardProducers, dict[int, threading.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _key(settings: KafkaSettings) -> tuple[Any, ...]:
    config = json.dumps(settings.producer_config, sort_keys=True, default=repr)
    return (
        os.getpid(),
        settings.bootstrap_servers,
        settings.uid,
        settings.prefix,
        settings.marker_topic,
        settings.shards,
        settings.timeout_s,
        config,
    )


def shard_producers(settings: KafkaSettings) -> ShardProducers:
    """This process's pooled :class:`ShardProducers` of the sink with ``settings``."""
    key = _key(settings)
    closing: list[ShardProducers] = []
    with _LOCK:
        if _POOL and next(iter(_POOL))[0] != key[0]:
            # Forked: the parent's librdkafka clients have no threads here, and destroying
            # one would wait for them forever. Keep them unreachable but alive.
            _INHERITED.extend(_POOL.values())
            _POOL.clear()
        found = _POOL.get(key)
        if found is None:
            found = _POOL[key] = ShardProducers(settings)
            while len(_POOL) > MAX_SINKS:
                closing.append(_POOL.popitem(last=False)[1])
        _POOL.move_to_end(key)
    for old in closing:
        old.close()
    return found


def pooled_producer(settings: KafkaSettings, shard: int, phase: str = "commit") -> tuple[Any, bool]:
    """``shard``'s transactional producer in this process, and whether it is ``fresh``
    (made and ``init_transactions``-ed by this call: a reused one may have been fenced
    since, see the module docs)."""
    producers = shard_producers(settings)
    fresh = not producers.has(shard)
    return producers.get(shard, phase), fresh


def evict(settings: KafkaSettings, shard: int) -> None:
    """Drop ``shard``'s pooled producer (after a failure: the next one is new)."""
    shard_producers(settings).drop(shard)


def _shard_lock(producers: ShardProducers, shard: int) -> threading.Lock:
    with _LOCK:
        return _SHARD_LOCKS.setdefault(producers, {}).setdefault(shard, threading.Lock())


def clear() -> None:
    """Close every pooled producer of this process."""
    with _LOCK:
        pooled = list(_POOL.values())
        _POOL.clear()
        _SHARD_LOCKS.clear()
    for producers in pooled:
        producers.close()


def commit_shard(
    settings: KafkaSettings,
    shard: int,
    app: str,
    epoch: int,
    *,
    items: Iterable[T],
    produce: Callable[[Any, T], int],
    start: Callable[[], None] = lambda: None,
    finish: Callable[[], None] = lambda: None,
) -> bool:
    """Commit ``epoch`` on ``shard`` with the pooled producer: read the marker; then in one
    transaction ``start()``, ``produce(producer, item)`` (returns how many records it
    produced) for each of ``items``, ``finish()`` (raise to abort), the marker; commit.

    False if the marker says the epoch is committed already (nothing produced). A reused
    producer that fails before its first records are confirmed delivered is replaced and
    the work starts again once, from the items taken so far (kept until then). Errors as
    ``ShardProducers.transaction``.
    """
    producers = shard_producers(settings)
    with _shard_lock(producers, shard):  # one task of a shard at a time per producer
        return _commit(
            producers, shard, app, epoch, iter(items), produce=produce, start=start, finish=finish
        )


def _commit(
    producers: ShardProducers,
    shard: int,
    app: str,
    epoch: int,
    source: Iterator[T],
    *,
    produce: Callable[[Any, T], int],
    start: Callable[[], None],
    finish: Callable[[], None],
) -> bool:
    head: list[T] = []  # the items taken while the producer was not confirmed
    for attempt in (1, 2):
        fresh = not producers.has(shard)
        producers.get(shard)
        try:
            marker = producers.markers.reread(
                app, shard, wait_s=None if fresh else REUSED_MARKER_WAIT_S
            )
        except RetryableError:
            if fresh:
                raise
            producers.drop(shard)
            continue
        if marker is not None and marker >= epoch:
            return False
        state = _Attempt(producers, shard, confirmed=fresh)

        def body(producer: Any, state: _Attempt = state) -> None:
            start()
            for item in state.kept(head, source):
                if produce(producer, item):
                    state.confirm()
            finish()

        try:
            producers.transaction(shard, app, epoch, body, reused=not fresh)
        except (StaleProducerError, FencedError, CommitError, RetryableError):
            if state.confirmed or attempt == 2:
                raise
            continue  # transaction() dropped the producer: the next attempt makes a new one
        return True
    raise AssertionError("unreachable")  # pragma: no cover


class _Attempt:
    """One attempt of :func:`commit_shard`: whether its producer is known to write."""

    def __init__(self, producers: ShardProducers, shard: int, *, confirmed: bool) -> None:
        self.producers, self.shard, self.confirmed = producers, shard, confirmed

    def confirm(self) -> None:
        """After records were produced: wait for them once (a reused producer)."""
        if not self.confirmed:
            self.producers.confirm(self.shard)
            self.confirmed = True

    def kept(self, head: list[T], source: Iterator[T]) -> Iterator[T]:
        """The items of ``head``, then of ``source``; those taken from ``source`` while
        not confirmed are added to ``head``, to start again from there."""
        yield from list(head)
        for item in source:
            if not self.confirmed:
                head.append(item)
            yield item
