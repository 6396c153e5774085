"""Direct mode's task: this worker's producer holds the shard's transaction, commits it.

The begin, write, prepare, commit and abort of one task (the driver's vote in between:
:mod:`txsink.protocol.singlepass`), on a producer kept across tasks in this Python worker (made
and ``init_transactions``-ed once per query run), and the handle of the open transaction.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from txsink.connectors.kafka.clients.columns import py_columns
from txsink.connectors.kafka.clients.errors import FailedDelivery, commit_error
from txsink.connectors.kafka.clients.markers import Markers
from txsink.connectors.kafka.clients.producers import (
    on_failed_delivery,
    produce_records,
    warn_if_slow,
)
from txsink.connectors.kafka.clients.settings import KafkaSettings, init_transactions
from txsink.connectors.kafka.records.checksum import CHECKSUM_VERSION, Tally
from txsink.errors import (
    ConfigurationError,
    RetryableError,
)
from txsink.handles import Handle, register_handle
from txsink.observe.logs import get_logger
from txsink.txid import TxnId

__all__ = ["KafkaDirectHandle", "OpenDirect", "clear", "open_direct"]


@register_handle
@dataclass(frozen=True)
class KafkaDirectHandle(Handle):
    """A shard's open transaction, flushed and counted: its shard (= Spark partition) and
    the count and checksum its replay must match."""

    serializer: ClassVar[str] = "kafka.direct"
    version: ClassVar[int] = 1

    shard: int = 0
    checksum: int = 0
    checksum_version: int = CHECKSUM_VERSION


# -- this Python worker's producers ------------------------------------------------------

#: A failed delivery (its text where the callback could not read it).
Delivery = FailedDelivery | str

#: transactional id -> (generation, producer, delivery errors). Spark reuses Python
#: workers across tasks, so a producer made for one epoch serves the next ones.
_POOL: dict[str, tuple[str, Any, list[Delivery]]] = {}


def _pooled(
    settings: KafkaSettings, shard: int, generation: str, epoch: int
) -> tuple[Any, list[Delivery], bool]:
    """The shard's producer, its delivery errors, and whether it was made just now.

    Made and initialised once per ``generation`` (one query run's check, which fences
    every id) and worker; within a generation another worker may take the id over (Spark
    runs partition ``shard`` wherever a slot is free), which :func:`open_direct` finds out
    before any row is read.
    """
    from confluent_kafka import KafkaException, Producer

    tid = settings.transactional_id(shard)
    found = _POOL.get(tid)
    if found is not None and found[0] == generation:
        return found[1], found[2], False
    errors: list[Delivery] = []
    on_delivery = functools.partial(on_failed_delivery, errors)
    producer = Producer(settings.producer_conf(shard, on_delivery))
    try:
        init_transactions(producer, settings.timeout_s)
    except KafkaException as err:
        raise commit_error(
            err.args[0], settings, epoch=epoch, shard=shard, init=True, phase="begin"
        ) from err
    _POOL[tid] = (generation, producer, errors)
    return producer, errors, True


def _evict(settings: KafkaSettings, shard: int) -> None:
    _POOL.pop(settings.transactional_id(shard), None)


def clear() -> None:
    """Close every pooled producer of this process (tests that run tasks in-process)."""
    pooled = list(_POOL.values())
    _POOL.clear()
    for _, producer, _ in pooled:
        producer.flush(0)


# -- the open transaction ------------------------------------------------------------------


@dataclass
class OpenDirect:
    """One task's open Kafka transaction (direct mode)."""

    txn: TxnId
    settings: KafkaSettings
    producer: Any
    errors: list[Delivery]
    tally: Tally = field(default_factory=Tally)
    started: float = field(default_factory=time.monotonic)

    @property
    def shard(self) -> int:
        return self.txn.partition

    @property
    def rows(self) -> int:
        return self.tally.rows

    def _elapsed(self) -> float:
        return time.monotonic() - self.started

    def write(self, records: pa.RecordBatch) -> None:
        columns = py_columns(records)  # once, for the checksum and the produce loop
        self.tally.add(records, columns)
        produce_records(self.producer, records, columns)

    def prepare(self) -> KafkaDirectHandle:
        """Flush: every record is at the brokers (in the open transaction, with the
        marker produced at begin), or the task fails."""
        from confluent_kafka import KafkaException

        txn = self.txn
        try:
            left = self.producer.flush(self.settings.timeout_s)
        except KafkaException as err:
            raise self._error(err.args[0], "prepare") from err
        if left or self.errors:
            raise RetryableError(
                f"shard {self.shard}: {left} record(s) not delivered within "
                f"{self.settings.timeout_s:.0f}s"
                + (f"; first delivery error: {self.errors[0]}" if self.errors else ""),
                **self.settings.context("prepare", epoch=txn.epoch),
                partition=self.shard,
            )
        t = self.tally
        return KafkaDirectHandle(
            txn=txn,
            rows=t.rows,
            nbytes=t.nbytes,
            shard=self.shard,
            checksum=t.checksum,
            checksum_version=t.version,
        )

    def commit(self) -> None:
        """``commit_transaction``, retried on retriable errors as librdkafka asks."""
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            try:
                self.producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                # Begun in the pre-commit: the span covers the whole epoch.
                warn_if_slow(self.settings, self.shard, self.txn.epoch, self._elapsed())
                return
            except KafkaException as err:
                kerr = err.args[0]
                if not kerr.retriable() or time.monotonic() >= deadline:
                    _evict(self.settings, self.shard)
                    raise self._error(kerr, "commit") from err

    def discard(self) -> None:
        """Abort the transaction; a producer that cannot is dropped (the next one's
        init_transactions aborts it at the broker)."""
        from confluent_kafka import KafkaException

        try:
            self.producer.abort_transaction(self.settings.timeout_s)
        except KafkaException:
            _evict(self.settings, self.shard)

    def _error(self, kerr: Any, phase: str) -> Exception:
        if kerr.fatal():
            _evict(self.settings, self.shard)
        return commit_error(
            kerr,
            self.settings,
            epoch=self.txn.epoch,
            shard=self.shard,
            delivery=self.errors,
            elapsed=self._elapsed(),
            phase=phase,
        )


def open_direct(settings: KafkaSettings, txn: TxnId, generation: str) -> OpenDirect:
    """Begin the task's transaction on its pooled producer (shard = the Spark partition,
    below ``settings.shards``: the ids the driver fences at each start)."""
    from confluent_kafka import KafkaException

    shard = txn.partition
    if shard >= settings.shards:
        raise ConfigurationError(
            f"epoch {txn.epoch} has a partition {shard}, but this direct-mode sink has "
            f"shards={settings.shards}: in direct mode each Spark partition is a shard with "
            "its own transactional id, fenced at every start. Raise shards= to the most "
            "partitions an epoch may have, or repartition the stream by key to fewer "
            "partitions (df.repartition(n, 'key'))",
            **settings.context("begin", epoch=txn.epoch),
            partition=shard,
        )
    key, value = Markers(settings).record(txn.app, shard, txn.epoch)
    while True:
        producer, errors, fresh = _pooled(settings, shard, generation, txn.epoch)
        errors.clear()
        try:
            # The marker first, flushed: one round trip that finds out, before any row is
            # read, whether another worker took the id over (this producer is fenced).
            producer.begin_transaction()
            producer.produce(settings.marker_topic, key=key, value=value, partition=0)
            left = producer.flush(settings.timeout_s)
        except Exception as err:  # a fenced producer's flush may raise SystemError
            _evict(settings, shard)
            with contextlib.suppress(Exception):
                producer.abort_transaction(settings.timeout_s)
            if fresh and isinstance(err, KafkaException):
                raise commit_error(
                    err.args[0], settings, epoch=txn.epoch, shard=shard, phase="begin"
                ) from err
            if fresh:
                raise
            _moved(settings, txn, err)
            continue
        if not left and not errors:
            return OpenDirect(txn, settings, producer, errors)
        _evict(settings, shard)
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(settings.timeout_s)
        if fresh:
            raise RetryableError(
                f"shard {shard}: its marker was not delivered within "
                f"{settings.timeout_s:.0f}s" + (f": {errors[0]}" if errors else ""),
                **settings.context("begin", epoch=txn.epoch),
                partition=shard,
            )


def _moved(settings: KafkaSettings, txn: TxnId, err: Exception) -> None:
    """A pooled producer was fenced: Spark ran its shard's task in another Python worker
    since, whose new producer took the transactional id over. Expected (Spark places tasks
    where a slot is free); a new producer takes it back."""
    get_logger(__name__, uid=settings.uid, epoch=txn.epoch).debug(
        "shard %d: this worker's producer was fenced by another worker's (%s); a new one "
        "takes the transactional id back",
        txn.partition,
        err,
    )
