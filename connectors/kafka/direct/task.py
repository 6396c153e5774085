"""Direct mode (single pass): the task's producer holds the epoch's transaction and commits it.

Flink's Kafka sink on Spark: no write-ahead log, no second pass. The coordinator runs the
epoch as one barrier job (:mod:`txsink._singlepass`); in each task::

    begin    the task's shard is its Spark partition; its producer, transactional id
             <prefix>-<uid>-<partition>, is taken from this Python worker's pool (made
             and init_transactions-ed once per query run: that fences any zombie with
             the id and aborts what it left open); begin_transaction
    write    encode, count and checksum the records (the replay's verification), produce
    prepare  produce the shard's marker (epoch) into the same transaction; flush; any
             failed delivery fails the task -> KafkaDirectHandle(rows, checksum, shards)
    vote     the driver decides while the transaction is open; on "commit":
    commit   commit_transaction (commit_in_task)
    abort    abort_transaction (discard), or, if the task died, the next init_transactions
             on the id (a retry, the next run's check) aborts it

After the decision, a shard whose task could not commit (killed, lost its executor, the
driver died before answering) is committed from the epoch's replay (Spark re-runs the
batch): the same verified path as replay mode (:func:`~txsink.connectors.kafka.replay.
commit_by_content`): the shard's marker says whether it is committed, and the replayed
rows must match the decided count and checksum. The shard is the partition, so the replay
must deal each partition the rows it had: plans that do not (a round-robin repartition,
``rand()``...) are refused at the start (:mod:`txsink._stability`); a replay that only
numbers the partitions otherwise is matched by content; one whose rows differ is refused
with NonDeterministicReplayError, nothing of that shard written.

No marker is read in the single pass: the coordinator skips committed epochs and
recovery finishes decided ones before a new round begins, so a new round's shards are
never committed yet. (Reading markers there would wait on the other tasks' open
transactions, which sit in the same marker partition.)
"""

from __future__ import annotations

import contextlib
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa

from txsink._logging import get_logger
from txsink.connectors.kafka.clients import KafkaSettings, init_transactions
from txsink.connectors.kafka.columns import py_columns
from txsink.connectors.kafka.errors import FailedDelivery, commit_error, failed_delivery
from txsink.connectors.kafka.markers import Markers
from txsink.connectors.kafka.producers import fence, produce_records, warn_if_slow
from txsink.connectors.kafka.records import RecordFormat
from txsink.connectors.kafka.replay import CHECKSUM_VERSION, Tally, commit_by_content
from txsink.contract import EpochCommit
from txsink.errors import (
    CommitError,
    ConfigurationError,
    RetryableError,
)
from txsink.handles import Handle, register_handle
from txsink.txid import TxnId

__all__ = ["KafkaDirectHandle", "OpenDirect", "clear", "commit_leftovers", "open_direct"]


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
    on_delivery = functools.partial(_on_failed_delivery, errors)
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


def _on_failed_delivery(errors: list[Delivery], err: Any, msg: Any) -> None:
    """Producer-wide delivery callback (failures only): keep the first, with its code and
    key, as :mod:`~txsink.connectors.kafka.producers` does (a refusal for good is then
    classified by the record's own code, not only the commit's)."""
    if err is not None and not errors:
        try:
            errors.append(failed_delivery(err, msg))
        except Exception:  # a callback must never raise into librdkafka
            errors.append(repr(err))


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


# -- the driver: leftovers after the decision ---------------------------------------------------


def commit_leftovers(request: EpochCommit[Any], settings: KafkaSettings, fmt: RecordFormat) -> None:
    """Commit the decided shards no task committed, from the epoch's replay, verified.

    One task per partition of the replay: the shard's marker says whether it committed; if
    not, the replayed records must match the decided count and checksum. A replay that
    numbers the partitions otherwise (a source listing its partitions in another order
    after a restart) is matched by content (:func:`~txsink.connectors.kafka.replay.
    commit_by_content`); one whose rows differ is refused.
    """
    epoch, handles, data = request.epoch, request.handles, request.data
    if not handles:
        return
    if data is None:  # pragma: no cover - the core refuses before calling
        raise CommitError("direct mode commits leftovers from the epoch's rows", epoch=epoch)
    decided = {h.shard: (h.rows, h.checksum, h.checksum_version) for h in handles}
    app = handles[0].txn.app
    # Abort whatever this sink's tasks left open first (this epoch's, or a dead task's of
    # any partition): each commit task reads its marker, and a read_committed read waits
    # on every transaction open on the marker topic.
    ids = [settings.transactional_id(shard) for shard in range(settings.shards)]
    with ThreadPoolExecutor(max_workers=min(8, len(ids))) as pool:  # each waits on a broker
        list(pool.map(lambda tid: fence(settings, [tid], phase="commit"), ids))
    commit_by_content(data, settings, fmt, app=app, epoch=epoch, decided=decided)
    request.committed(handles)
