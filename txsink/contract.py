"""The two-phase-commit contract that every connector implements: hooks only.

The protocol itself lives in :class:`txsink.Coordinator` (and
:mod:`txsink.protocol.recovery`); a connector implements the hooks below and never
re-implements the protocol. Who calls what, and where::

    driver    check(schema, app_id)            once per query run, before any write
    executor  begin(txn, schema) -> T          first non-empty batch of a partition
    executor  write(T, batch)                  each Arrow record batch
    executor  prepare(T) -> Handle             pre-commit: make the writes durable, invisible
    executor  discard(T)                       the task failed before or during prepare,
                                               or (commits_in_task) the epoch was not decided
    executor  commit_in_task(T)                commits_in_task sinks: the decision is made,
                                               the task commits what it holds open
    driver    commit_epoch(request)            after the epoch's decision is durable; by
                                               default commit(handle) for each handle, then
                                               finish_epoch(epoch, handles)
    driver    abort(handle)                    a prepared transaction no decision names
    driver    list_prepared(app_id)            recovery: every prepared transaction of ours
    driver    migrate_uid(old, app_id)         ``txsink state rename-uid``: the target side
    any       audit(request)                   ``txsink audit``: what the target holds for
                                               the decided epochs (read-only)

Schema evolution (:mod:`txsink.schema`; only for sinks whose policy is ``add-columns``)::

    driver    target_schema(app_id)            the target's schema, when an epoch's differs
    driver    evolution_support()              the kinds of change it takes in one commit
    driver    prepare_evolution(change, app_id)  will the target take it? Must not write
    driver    commit_epoch(request)            request.schema_change: apply it in the
                                               commit that makes the epoch visible

The contracts, one line each (Flink's words where they fit):

* after ``prepare`` returns, committing its handle must always succeed, on any
  driver, after any crash — or the rows are lost;
* committing and aborting are idempotent, and "already committed" is verified
  in the target, never assumed;
* ``list_prepared`` finds *every* prepared transaction of this app and sink,
  including those of crashed tasks, retried and speculative attempts;
* nothing a sink writes is visible before it is committed.

Traps:

* Sinks are pickled into Spark tasks. Keep only configuration in ``__init__``;
  open connections in ``begin`` (executor) or lazily on the driver.
* A task attempt can run twice (retries, speculation) and a batch can be
  replayed (a crash after Spark ran it): names come from the
  :class:`~txsink.txid.TxnId`, never from time, randomness or ``hash()``.
* A replayed epoch must write nothing: the coordinator skips committed epochs
  before any hook runs.
* The unit a target commits in need not be the Spark partition: Kafka commits
  one transaction per shard, a table format one snapshot per epoch. Such a sink
  overrides :meth:`SinkContract.commit_epoch` and reports each unit it made
  visible through :meth:`EpochCommit.committed`; it does not hide its commit in
  another hook (the ``during_commit`` crash point and the metrics rely on it).

``txsink.testing.contract`` checks these contracts against a real target.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

from txsink.handles import Handle
from txsink.schema import Policy, SchemaChange, check_policy
from txsink.txid import TxnId, check_name

if TYPE_CHECKING:
    import pyarrow as pa

    from txsink.audit.found import AuditRequest, TargetAudit

__all__ = [
    "EpochCommit",
    "EpochData",
    "Partitioning",
    "SinkContract",
    "TaskInfo",
    "TaskRunner",
    "local_tasks",
]

T = TypeVar("T")
H = TypeVar("H", bound=Handle)
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class Partitioning:
    """How a sink needs an epoch's rows spread over the partition tasks.

    ``columns``: rows with equal values meet in one task (Spark's stable
    Murmur3 hash of them). ``num_partitions``: a fixed task count (e.g. one
    task per Kafka shard), else ``spark.sql.shuffle.partitions``.
    """

    columns: tuple[str, ...]
    num_partitions: int | None = None


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """Which task runs a partition function: its partition and its attempt's id.

    ``attempt`` is unique per task attempt within the application (Spark's
    ``taskAttemptId``): a retried or speculative attempt gets a new one.
    """

    partition: int
    attempt: int
    #: A barrier job's (single-pass) task count; None elsewhere.
    tasks: int | None = None


class EpochData(Protocol):
    """The rows of one epoch, for the few sinks that must read them again to commit.

    The core runs the job (Spark today, Spark Connect tomorrow); a connector never
    imports Spark. ``task`` is pickled into one task per partition, as the sink is;
    its return value comes back pickled. A :class:`~txsink.errors.TxsinkError` it
    raises that is not retryable is re-raised on the driver with its context; other
    exceptions fail the task (Spark retries it) and then the job.
    """

    def map_partitions(
        self, task: Callable[[TaskInfo, Iterator[pa.RecordBatch]], R], *, barrier: bool = False
    ) -> list[R]:
        """Run ``task`` once per partition (all of them, in one job); the results in
        partition order. ``barrier``: all tasks run at once or none (gang scheduling; a
        failed task restarts them all), and :class:`TaskInfo` carries the task count."""
        ...


class TaskRunner(Protocol):
    """Runs a function over a few items as parallel tasks: a commit spread over the cluster.

    The core provides it (Spark tasks in a query; in-process, one after the other, for an
    operator's ``txsink recover`` without Spark); a connector never imports Spark. ``fn``
    and each item are pickled into one task per item; results come back pickled, in item
    order. Errors as for :meth:`EpochData.map_partitions`: a non-retryable
    :class:`~txsink.errors.TxsinkError` is re-raised on the driver with its context.
    """

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """``[fn(item) for item in items]``, each in its own task where possible."""
        ...


class _LocalTasks:
    """:class:`TaskRunner` in this process, one item after the other (no cluster)."""

    def run(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
        return [fn(item) for item in items]

    def __repr__(self) -> str:
        return "local_tasks"


#: The runner when no cluster is at hand (``txsink recover``, tests of the core).
local_tasks: TaskRunner = _LocalTasks()


@dataclasses.dataclass(frozen=True)
class EpochCommit(Generic[H]):
    """One sink's share of a decided epoch: what :meth:`SinkContract.commit_epoch` commits.

    ``handles`` are the decided handles of this sink (possibly none: an epoch with no
    rows for it). ``data`` is the epoch's rows, given only to sinks that
    :attr:`~SinkContract.commits_from_data`, and only inside the replay of that
    epoch (elsewhere the coordinator refuses before calling).

    A sink calls :meth:`committed` each time a unit of the epoch has become
    visible in the target (a transaction, a shard, a snapshot), *after* it is
    visible: the coordinator's ``during_commit`` and ``during_recovery`` crash
    points fire there, and metrics count there.

    ``tasks`` runs work on the cluster (one task per unit, in parallel), for a sink
    whose commit moves data that executors reach as well as the driver (a write-ahead
    log on shared storage); units committed in tasks are reported once the tasks
    returned. Outside a query it runs in the driver's process.
    """

    epoch: int
    handles: tuple[H, ...]
    data: EpochData | None = None
    on_committed: Callable[[Sequence[Handle]], None] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    tasks: TaskRunner = dataclasses.field(default=local_tasks, repr=False, compare=False)
    on_timeout_ratio: Callable[[float], None] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )
    schema_change: SchemaChange | None = None

    def committed(self, handles: Sequence[H]) -> None:
        """Report that ``handles`` are now visible (committed now or verified as before)."""
        if self.on_committed is not None:
            self.on_committed(handles)

    def report_timeout_ratio(self, ratio: float) -> None:
        """Report how long this commit held the target's transactions open, as a share of
        the target's transaction timeout (1.0: the target would abort it); the metric
        ``commit_timeout_ratio`` of docs/observability.md. Optional; a connector whose
        target has such a timeout reports it once per commit."""
        if self.on_timeout_ratio is not None:
            self.on_timeout_ratio(ratio)

    @property
    def app_id(self) -> str | None:
        """The app that prepared the handles (``None`` for an epoch without handles)."""
        return self.handles[0].txn.app if self.handles else None


class SinkContract(abc.ABC, Generic[T, H]):
    """The hooks of a two-phase-commit sink (connectors subclass
    :class:`txsink.sink.TwoPhaseCommitSink`, which adds the drop-in
    ``foreachBatch(sink)`` use on top of this contract).

    ``T`` is the connector's open-transaction object (lives in one task),
    ``H`` its :class:`~txsink.handles.Handle` type (crosses processes as JSON).
    """

    #: Short connector name, used in errors and logs (the registry's name).
    connector: ClassVar[str] = "base"
    #: The guarantee this sink gives, stated in its docs and ``txsink status``.
    guarantee: ClassVar[str] = "exactly-once"
    #: The handle type written by this sink (for loading decided handles).
    handle_type: ClassVar[type[Handle]] = Handle

    def __init__(self, uid: str, *, schema_evolution: Policy = "strict") -> None:
        self.uid = check_name("sink uid", uid)
        #: ``strict`` (the default) or ``add-columns``: :mod:`txsink.schema`.
        self.schema_evolution: Policy = check_policy(schema_evolution)

    # -- driver side: start -------------------------------------------------------

    def check(self, schema: pa.Schema, app_id: str) -> None:
        """Validate configuration, target and schema before anything is written.

        Called on the driver once per query run (and for each one-shot write).
        Raise :class:`~txsink.errors.ConfigurationError` for anything that would
        otherwise fail at the first crash or the first bad row. Must not write.
        """

    @property
    def commits_from_data(self) -> bool:
        """True for sinks whose commit reads the epoch's rows again (Kafka replay mode).

        The coordinator then keeps the epoch's rows for the commit and hands them
        to :meth:`commit_epoch` as :attr:`EpochCommit.data`; recovery outside that
        epoch's replay cannot finish such a sink and says to restart the query.
        """
        return False

    @property
    def commits_in_task(self) -> bool:
        """True for sinks whose prepared transaction lives in the task that opened it.

        A Kafka producer's transaction cannot be handed to another process (KIP-939 is in
        no release): the producer that holds it must commit it. The coordinator then runs
        the epoch as one single-pass job whose tasks all run at once: each prepares, votes
        to the driver, waits while the driver writes the decision, and commits in the task
        (:meth:`commit_in_task`) or discards. Such a sink must also be able to commit a
        decided epoch without the task that held it (the task or driver may die after the
        decision): through :attr:`commits_from_data` (the epoch's replay, verified) or data
        its handle names. Its :meth:`commit_epoch` is called only for those leftovers.
        """
        return False

    @property
    def fewer_tasks(self) -> bool:
        """True for sinks better served by fewer, larger tasks per epoch (a table's data
        files: one or more per task, and small files cost every reader).

        When every sink of a coordinator says so, its default ``max_tasks="auto"`` coalesces
        each epoch to the cluster's task slots (no shuffle); ``max_tasks=None`` keeps one
        task per partition.
        """
        return False

    def required_partitioning(self) -> Partitioning | None:
        """How this sink needs the epoch's rows partitioned (default: any way).

        An upsert sink returns its key: two prepared transactions upserting the
        same key in different partitions would wait on each other's row locks
        until the decision, which never comes. The coordinator repartitions the
        epoch's DataFrame accordingly (all sinks of a coordinator must agree). Asked
        when the coordinator is built: from the sink's settings, not from its target.
        """
        return None

    # -- executor side: one partition of one epoch ------------------------------

    @abc.abstractmethod
    def begin(self, txn: TxnId, schema: pa.Schema) -> T:
        """Open a transaction named ``txn`` for rows of ``schema``.

        Called in a Spark task before its first non-empty batch. Nothing written
        through it may become visible before it is committed.
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

        After this returns, committing the handle must always succeed. Checks
        that can fail (sizes, constraints) belong here or earlier.
        """

    def discard(self, txn: T) -> None:
        """Best-effort cleanup of a transaction whose task failed before ``prepare`` returned.

        May be skipped entirely (the task process can die); recovery's
        :meth:`list_prepared` + :meth:`abort` must clean up regardless.
        """

    def commit_in_task(self, txn: T) -> None:
        """Commit ``txn``, prepared in this task, now that the epoch is decided
        (:attr:`commits_in_task` sinks only). A failure here is not the end: the driver
        finishes the epoch through :meth:`commit_epoch`, which must then find out what
        this task made visible (idempotence, as after any crash)."""
        raise NotImplementedError(f"{type(self).__name__} does not commit in its tasks")

    # -- driver side: after the decision ------------------------------------------

    def commit_epoch(self, request: EpochCommit[H]) -> None:
        """Make this sink's share of a decided epoch visible. Idempotent.

        Called on the driver after the epoch's decision is durable, and again by
        recovery after a crash (then some units may be committed already). Call
        ``request.committed(handles)`` after each unit became visible. Raise
        :class:`~txsink.errors.CommitError` for a unit that cannot be committed
        (its rows would be lost): the decision stands and the next run retries.

        The default commits handle by handle (:meth:`commit`), then calls
        :meth:`finish_epoch`. Override it when the target's unit of commit is a
        shard or the whole epoch (a Kafka transaction per shard, a table snapshot);
        then :meth:`commit` need not be implemented.
        """
        for handle in request.handles:
            self.commit(handle)
            request.committed([handle])
        self.finish_epoch(request.epoch, request.handles)

    def commit(self, handle: H) -> None:
        """Make one prepared transaction visible. Idempotent (default :meth:`commit_epoch`).

        A handle that is already committed is success only once verified in the
        target; one that cannot be committed raises
        :class:`~txsink.errors.CommitError` (its rows would be lost).
        """
        raise NotImplementedError(
            f"{type(self).__name__} implements neither commit(handle) nor commit_epoch(request)"
        )

    def finish_epoch(self, epoch: int, handles: Sequence[H]) -> None:
        """After every handle of ``epoch`` committed (default :meth:`commit_epoch`): a
        manifest, say. Idempotent: recovery calls it again after a crash. ``handles`` may
        be empty (an epoch with no rows for this sink)."""

    @abc.abstractmethod
    def abort(self, handle: H) -> None:
        """Roll back a prepared transaction that no decision names. Idempotent."""

    @abc.abstractmethod
    def list_prepared(self, app_id: str) -> Iterable[H]:
        """Every prepared-but-uncommitted transaction of ``app_id`` and this sink's uid.

        Used by recovery (which commits those a decision names and aborts the
        rest) and after each epoch to abort the leftovers of retried attempts.
        """

    def recorded_epoch(self, app_id: str) -> int | None:
        """The newest epoch of ``app_id`` and this uid that the *target itself* records
        as committed (a marker, a progress row, a manifest, a table property), or ``None``
        when it has none or keeps no such record (the default).

        A sink that skips an epoch the target already records must implement it: the
        coordinator asks once, at the start-up check, on a log that holds no epoch at all,
        and refuses to start when the target remembers epochs of this app (a new log
        reusing an app id would number its epochs from 0 again, and the sink would skip
        them as already written: their rows would be lost without a word).
        """
        return None

    def release(self) -> None:
        """Close what this sink holds open in the driver between epochs (a connection, a
        producer, a catalog's pool); the next epoch opens it again. Idempotent; default:
        nothing held.

        Called when an epoch fails out of ``foreachBatch`` (Spark ends the query) and by
        :meth:`~txsink.Coordinator.close`. Why not leave it to the garbage collector: a
        query's ``foreachBatch`` function stays in py4j's proxy pool until the JVM has
        collected the ended query, so connections would outlive the query by an
        unbounded time (each restart of a query in one driver would add one).
        """

    # -- driver side: schema evolution (txsink.schema) ----------------------------------

    def target_schema(self, app_id: str) -> pa.Schema | None:
        """The target's schema as Arrow types, or ``None`` when it has none to compare
        yet (no table, no committed output) or keeps none (the default: the sink's
        :meth:`check` alone judges the schema, as before evolution).

        Asked on the driver when an epoch's schema differs from the last one checked, and
        again after recovery changed the target. A sink that implements it has the core
        compare the schemas (:func:`txsink.schema.diff`): under ``strict`` any change
        stops the query before anything is written; under ``add-columns`` the change is
        planned for the epoch. :meth:`check` is then called with the part of the epoch's
        schema the target already has (its columns, in the target's types), and the rest
        goes to :meth:`prepare_evolution`.
        """
        return None

    def evolution_support(self) -> frozenset[str]:
        """The kinds of :mod:`txsink.schema` this target takes in one commit, with the
        epoch's rows (default: none). A change of another kind is refused before the
        epoch, naming the column."""
        return frozenset()

    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        """Check that the target will take ``change`` at this epoch's commit, and get
        ready for it; raise :class:`~txsink.schema.SchemaEvolutionError` naming the column
        and the fix when it will not (rights, a name the target cannot hold, a view on
        the table). Must not write: the epoch may still abort, and an aborted epoch leaves
        no schema change behind.

        Called on the driver before the epoch's pre-commit, after every sink's change was
        compared (the core asks no sink while another refuses). What the sink keeps on
        itself here travels with it into the epoch's tasks (they write rows of the new
        schema); the commit gets the change again as :attr:`EpochCommit.schema_change`.
        """

    # -- operator side: the audit (txsink.audit) ------------------------------------

    @property
    def auditable(self) -> bool:
        """Whether :meth:`audit` can check this sink as it is configured: by default,
        whether the connector has an audit. A sink configured without what its audit needs
        says False (its :meth:`audit` then raises ``NotImplementedError`` saying what to
        change); the testing toolkit's ``assert_audited`` leaves such sinks out."""
        return type(self).audit is not SinkContract.audit

    def audit(self, request: AuditRequest) -> TargetAudit:
        """What the target holds for ``request``'s epochs, read by the target's own means
        (:mod:`txsink.audit.found` says what to read and answer); read-only, and bounded by
        the epochs asked. Runs on any thread (``txsink audit``, or the coordinator's
        ``audit_every`` in the background, beside a commit): open its own clients, share
        none with the commit. Default: this connector cannot be audited (the report says
        so, and ``txsink audit`` does not pass).
        """
        raise NotImplementedError(f"{type(self).__name__} has no audit")

    # -- operator side: upgrades ----------------------------------------------------

    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """Move what the target keys by sink uid from ``old`` to ``self.uid``; idempotent.

        Called by ``txsink state rename-uid`` with the pipeline stopped at a fully
        committed epoch, after the old uid's lingering transactions were aborted. The
        sink is configured with the NEW uid. Returns one plain line per action (with
        ``dry_run``, what it would do). Default: no migration; say so.
        """
        return [
            f"{self!r}: {type(self).__name__} migrates nothing in the target; whatever it "
            f"keys by uid still says {old!r}"
        ]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(uid={self.uid!r})"
