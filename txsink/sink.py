"""The two-phase-commit sink contract that every connector implements.

The protocol itself lives in :class:`txsink.Coordinator`; a connector only
implements the hooks below. Who calls what, and where::

    driver    check(schema, app_id)            once per query run, before any write
    executor  begin(txn, schema) -> T          first non-empty batch of a partition
    executor  write(T, batch)                  each Arrow record batch
    executor  prepare(T) -> Handle             pre-commit: make the writes durable, invisible
    executor  discard(T)                       the task failed before or during prepare
    driver    commit(handle)                   after the epoch's decision is durable
    driver    finish_epoch(epoch, handles)     after every handle of the epoch committed
    driver    abort(handle)                    a prepared transaction no decision names
    driver    list_prepared(app_id)            recovery: every prepared transaction of ours

The contracts, one line each (Flink's words where they fit):

* after ``prepare`` returns, ``commit`` of its handle must always succeed, on
  any driver, after any crash — or the rows are lost;
* ``commit`` and ``abort`` are idempotent, and "already committed" is verified
  in the target, never assumed;
* ``list_prepared`` finds *every* prepared transaction of this app and sink,
  including those of crashed tasks, retried and speculative attempts;
* nothing a sink writes is visible before ``commit``.

Traps:

* Sinks are pickled into Spark tasks. Keep only configuration in ``__init__``;
  open connections in ``begin`` (executor) or lazily on the driver.
* A task attempt can run twice (retries, speculation) and a batch can be
  replayed (a crash after Spark ran it): names come from the
  :class:`~txsink.txid.TxnId`, never from time, randomness or ``hash()``.
* A replayed epoch must write nothing: the coordinator skips committed epochs
  before any hook runs.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from txsink.handles import Handle
from txsink.txid import TxnId, check_name

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from txsink.coordinator import Coordinator
    from txsink.log import LogStore

__all__ = ["Partitioning", "TwoPhaseCommitSink"]


@dataclasses.dataclass(frozen=True)
class Partitioning:
    """How a sink needs an epoch's rows spread over the partition tasks.

    ``columns``: rows with equal values meet in one task (Spark's stable
    Murmur3 hash of them). ``num_partitions``: a fixed task count (e.g. one
    task per Kafka shard), else ``spark.sql.shuffle.partitions``.
    """

    columns: tuple[str, ...]
    num_partitions: int | None = None


T = TypeVar("T")
H = TypeVar("H", bound=Handle)


class TwoPhaseCommitSink(abc.ABC, Generic[T, H]):
    """Base class of every txsink connector (the two-phase-commit template).

    ``T`` is the connector's open-transaction object (lives in one task),
    ``H`` its :class:`~txsink.handles.Handle` type (crosses processes as JSON).

    Given ``log=``, a sink is also usable on its own as
    ``writeStream.foreachBatch(sink)``: it builds a one-sink
    :class:`~txsink.Coordinator` on first use.
    """

    #: Short connector name, used in errors and logs.
    connector: ClassVar[str] = "base"
    #: The guarantee this sink gives, stated in its docs and ``txsink status``.
    guarantee: ClassVar[str] = "exactly-once"
    #: The handle type written by this sink (for loading decided handles).
    handle_type: ClassVar[type[Handle]] = Handle

    def __init__(
        self, uid: str, *, log: str | LogStore | None = None, **coordinator_options: Any
    ) -> None:
        self.uid = check_name("sink uid", uid)
        self._log_location = log
        self._coordinator_options = coordinator_options
        self._coordinator: Coordinator | None = None

    # -- driver side: start -------------------------------------------------------

    def check(self, schema: pa.Schema, app_id: str) -> None:
        """Validate configuration, target and schema before anything is written.

        Called on the driver once per query run (and for each one-shot write).
        Raise :class:`~txsink.errors.ConfigurationError` for anything that would
        otherwise fail at the first crash or the first bad row. Must not write.
        """

    @property
    def commits_from_data(self) -> bool:
        """True for sinks whose commit re-reads the epoch's rows (Kafka replay mode).

        The coordinator then calls :meth:`commit_from_data` instead of :meth:`commit`.
        """
        return False

    def required_partitioning(self) -> Partitioning | None:
        """How this sink needs the epoch's rows partitioned (default: any way).

        An upsert sink returns its key: two prepared transactions upserting the
        same key in different partitions would wait on each other's row locks
        until the decision, which never comes. The coordinator repartitions the
        epoch's DataFrame accordingly (all sinks of a coordinator must agree).
        """
        return None

    def commit_from_data(self, data: Any, epoch: int, handles: Sequence[H]) -> None:
        """Commit an epoch by reading its rows again (``commits_from_data`` sinks only).

        ``data`` is the epoch's DataFrame, partitioned as
        :meth:`required_partitioning` asked. Called on the driver after the
        decision, and by recovery only inside the replay of that same epoch.
        Idempotent, and must refuse (not write) rows that differ from what
        the handles recorded at pre-commit.
        """
        raise NotImplementedError(f"{type(self).__name__} does not commit from data")

    # -- executor side: one partition of one epoch ------------------------------

    @abc.abstractmethod
    def begin(self, txn: TxnId, schema: pa.Schema) -> T:
        """Open a transaction named ``txn`` for rows of ``schema``.

        Called in a Spark task before its first non-empty batch. Nothing written
        through it may become visible before :meth:`commit`.
        """

    @abc.abstractmethod
    def write(self, txn: T, batch: pa.RecordBatch) -> None:
        """Write one Arrow record batch into the open transaction.

        Raise :class:`~txsink.errors.WriteError` naming the row (counted from
        the partition's first row, 0-based) and column for input the target
        cannot take, :class:`~txsink.errors.RetryableError` for transient
        failures. Either way the epoch is aborted, not partial.
        """

    @abc.abstractmethod
    def prepare(self, txn: T) -> H:
        """Pre-commit: make the transaction durable but invisible; return its handle.

        After this returns, :meth:`commit` of the handle must always succeed.
        Checks that can fail (sizes, constraints) belong here or earlier.
        """

    def discard(self, txn: T) -> None:
        """Best-effort cleanup of a transaction whose task failed before ``prepare`` returned.

        May be skipped entirely (the task process can die); recovery's
        :meth:`list_prepared` + :meth:`abort` must clean up regardless.
        """

    # -- driver side: after the decision ------------------------------------------

    @abc.abstractmethod
    def commit(self, handle: H) -> None:
        """Make the prepared transaction visible. Idempotent.

        Called on the driver after the epoch's decision is durable, and again by
        recovery after a crash. A handle that is already committed is success
        only once verified in the target; one that cannot be committed raises
        :class:`~txsink.errors.CommitError` (its rows would be lost).
        """

    def finish_epoch(self, epoch: int, handles: Sequence[H]) -> None:
        """Called after every handle of ``epoch`` committed (e.g. to write a manifest).

        Idempotent: recovery calls it again after a crash. ``handles`` may be
        empty (an epoch with no rows for this sink).
        """

    @abc.abstractmethod
    def abort(self, handle: H) -> None:
        """Roll back a prepared transaction that no decision names. Idempotent."""

    @abc.abstractmethod
    def list_prepared(self, app_id: str) -> Iterable[H]:
        """Every prepared-but-uncommitted transaction of ``app_id`` and this sink's uid.

        Used by recovery (which commits those a decision names and aborts the
        rest) and after each epoch to abort the leftovers of retried attempts.
        """

    # -- drop-in use as foreachBatch(sink) ------------------------------------------

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point for a sink used on its own (needs ``log=``)."""
        if self._coordinator is None:
            if self._log_location is None:
                raise TypeError(
                    f"{type(self).__name__}(uid={self.uid!r}) was used as foreachBatch(sink) "
                    "without log=...: pass log='<path or URL of the txsink log>' or wrap it "
                    "in txsink.Coordinator([sink], log=...)"
                )
            from txsink.coordinator import Coordinator

            self._coordinator = Coordinator(
                [self], log=self._log_location, **self._coordinator_options
            )
        self._coordinator(df, batch_id)

    def __getstate__(self) -> dict[str, Any]:
        # Sinks travel to executors inside the task closure; the coordinator and the log
        # (a store may hold credentials and refuse pickling) stay on the driver.
        state = self.__dict__.copy()
        state["_coordinator"] = None
        state["_log_location"] = None
        return state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uid={self.uid!r})"
