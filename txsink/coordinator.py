"""The epoch coordinator: Flink's two-phase commit on Spark micro-batches.

One :class:`Coordinator` drives one or more sinks with one decision per
epoch, so several targets move atomically. Use it as
``df.writeStream.foreachBatch(coordinator)`` or, for a static DataFrame,
``coordinator.write(df)``.

The face of three rooms: the protocol's steps
(:class:`~txsink.protocol.epoch.EpochProtocol`, which never sees a DataFrame), the
operator's entry points around them (:class:`~txsink.ops.operator.Operations`), and
the Spark side that turns a DataFrame into an epoch
(:class:`~txsink.spark.epoch.SparkEpochs`). The replay edge cases each step handles are
listed in :mod:`txsink.protocol.epoch`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, final

from txsink.contract import SinkContract
from txsink.metrics import Metrics
from txsink.observe import failure as _failure
from txsink.observe.logs import failures_logged, install_console
from txsink.ops.audit.continuous import check_audit_every
from txsink.ops.operator import Operations
from txsink.protocol.epoch import EpochResult
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import TxLog
from txsink.spark.epoch import SparkEpochs
from txsink.spark.layout import MaxTasks
from txsink.spark.remote import location_of
from txsink.store import LogStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Coordinator", "EpochResult"]

AnySink = SinkContract[Any, Any]


class Coordinator(Operations):
    """Runs the txsink protocol for each epoch over a set of sinks.

    Args:
        sinks: one sink or several; all share one decision per epoch.
        log: where the txsink log lives (a path, or a :class:`~txsink.store.LogStore`).
        app_id: the app's stable id. Defaults to the streaming query's id, which
            Spark keeps in its checkpoint. Required for :meth:`write` on a
            fresh log, and under Spark Connect (docs/spark-connect.md).
        allow_non_restored_state: start even if the log holds pending handles
            for a sink uid that is not configured any more (they are skipped
            and reported in the epoch's committed record).
        retired: sinks removed from the pipeline, kept only so recovery can clean up after
            them (never written): their lingering prepared transactions are aborted; their
            decided but uncommitted handles only with ``allow_non_restored_state=True``,
            recorded as ``not_restored`` (the one place where atomicity across targets is
            given up, on purpose and on record), else
            :class:`~txsink.errors.NonRestoredStateError`. See docs/operations.md.
        retain_epochs: how many epochs of records the log keeps.
        faults: a fault plan, its text form, or ``None`` to read ``TXSINK_FAULT``.
        from_savepoint: a savepoint (``txsink savepoint create``) to start from: on
            first use, an empty ``log`` is filled from it (a restore cut short is
            completed; a log that has moved on since is left alone). Spark reads its
            checkpoint before ``foreachBatch`` runs, so the checkpoint copy must be
            restored before the query starts (``txsink savepoint restore
            --checkpoint``); see docs/upgrades.md.
        metrics: one :class:`~txsink.metrics.Metrics` or several (exporters:
            docs/observability.md), called on the driver; they travel with the coordinator.
        max_tasks: at most this many pre-commit tasks per epoch: an int, ``"slots"`` (the
            task slots the cluster runs at once, read at each epoch), None (one task per
            partition of the batch), or ``"auto"`` (the default): ``"slots"`` when every
            sink prefers fewer tasks (tables), else None. The epoch is ``coalesce``d (no
            shuffle): fewer, larger tasks, prepared transactions and files. Not with sinks
            that commit in their tasks or need a fixed task count (refused here). See
            docs/performance.md.
        outage_s: how long an epoch keeps running new rounds of its pre-commit, and trying
            its commit again, while a target is unreachable, before it fails the query
            (default: ``TXSINK_OUTAGE_S``, else 60; docs/reliability.md).
        lease_s: how long this driver's lease on the query (:mod:`txsink.protocol.lease`) lives
            unrenewed; default ``max(60, 3 x trigger interval)``. Shorter: faster take-over
            of a frozen driver; longer: fewer false take-overs (docs/operations.md).
        audit_every: audit every N committed epochs, in a background thread, that each
            target holds what the log decided (``txsink audit``'s check; metrics and an
            ERROR line per mismatch; docs/audit.md). Below ``retain_epochs``. Default: off.
        audit_deep: the continuous audit reads the epochs' rows and compares checksums,
            not only the targets' metadata (costs a read of every row once).
    """

    def __init__(
        self,
        sinks: AnySink | Sequence[AnySink],
        *,
        log: str | os.PathLike[str] | LogStore | TxLog,
        app_id: str | None = None,
        allow_non_restored_state: bool = False,
        retired: Sequence[AnySink] = (),
        retain_epochs: int = 100,
        faults: FaultPlan | str | None = None,
        from_savepoint: str | os.PathLike[str] | LogStore | TxLog | None = None,
        metrics: Metrics | Sequence[Metrics] | None = None,
        max_tasks: MaxTasks = "auto",
        outage_s: float | None = None,
        lease_s: float | None = None,
        audit_every: int | None = None,
        audit_deep: bool = False,
    ) -> None:
        super().__init__(
            sinks, log=log, app_id=app_id, allow_non_restored_state=allow_non_restored_state,
            retired=retired, retain_epochs=retain_epochs, faults=faults, metrics=metrics,
            outage_s=outage_s, lease_s=lease_s,
        )  # fmt: skip
        self._spark = SparkEpochs(self, max_tasks)
        self._log_location = location_of(log)  # what travels to Spark Connect (remote)
        self.from_savepoint = from_savepoint
        self._restored = from_savepoint is None
        self.audit_every = check_audit_every(audit_every, retain_epochs)
        self.audit_deep = audit_deep
        self._start_audit()
        install_console()  # one line per epoch on stderr, unless logging is configured
        _failure.install_excepthook()  # a failure that ends the process: one paragraph

    @property
    def max_tasks(self) -> int | Literal["slots"] | None:
        """The pre-commit tasks' bound as resolved (an int, ``"slots"`` or None)."""
        return self._spark.max_tasks

    @final
    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """``foreachBatch`` entry point: run epoch ``batch_id`` over ``df``. A failure is
        logged once at ERROR, on one line, first (:mod:`txsink.observe.failure`), as in
        write."""
        with failures_logged(self._log, epoch=int(batch_id), on_failure=self.close):
            self._spark.foreach_batch(df, int(batch_id))

    @final
    def write(self, df: DataFrame, epoch: int | None = None) -> EpochResult:
        """Write a static DataFrame as one epoch (the next one unless ``epoch`` is given).

        Re-running the same call with the same explicit ``epoch`` after a crash
        writes nothing twice; without ``epoch`` every call is a new epoch.
        """
        with failures_logged(self._log, epoch=epoch):
            return self._spark.write(df, epoch, self.app_id or self._app_from_log())

    def __repr__(self) -> str:
        return f"Coordinator(sinks={list(self.sinks)!r}, log={self.log.location!r})"
