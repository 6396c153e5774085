"""The coordinator's operator entry points: checks before the start, recovery and aborts
by hand (``txsink check``, ``txsink recover``, ``txsink abort``), starting from a
savepoint, and closing what the sinks hold once the query is over.

:class:`Operations` is the protocol (:class:`~txsink.protocol.epoch.EpochProtocol`) with
these around it; :class:`txsink.Coordinator` is an :class:`Operations` with its Spark
side, and :mod:`txsink.ops.operate` builds one without Spark. The methods drive the same
:class:`~txsink.protocol.recovery.Recovery` the epochs use, so an operator's recovery is
the query's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, final

from txsink.ops import precheck as _precheck
from txsink.ops.audit.continuous import ContinuousAudit
from txsink.ops.follow import LogFollower, follow
from txsink.ops.precheck import CheckResult
from txsink.protocol.epoch import EpochProtocol
from txsink.protocol.lease import DEFAULT_LEASE_S, DriverLease, LeaseKeeper, until_the_query_runs
from txsink.protocol.log import TxLog
from txsink.protocol.recovery import RecoveryAction
from txsink.spark.remote import arrived_state, portable_state
from txsink.store import LogStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Operations"]


class Operations(EpochProtocol):
    """The protocol, with the operator's entry points around it: :meth:`check`,
    :meth:`recovery_plan`, :meth:`recover`, :meth:`abort`, :meth:`close`, :meth:`follow`
    and :meth:`hold_lease`, travelling to another process, and starting from a savepoint."""

    #: :class:`txsink.Coordinator`'s ``from_savepoint=`` (none for an operator's own).
    from_savepoint: str | os.PathLike[str] | LogStore | TxLog | None = None
    _restored: bool = True
    #: :class:`txsink.Coordinator`'s ``audit_every=`` and ``audit_deep=``: the continuous
    #: audit (:mod:`txsink.ops.audit.continuous`), started in each driver process.
    audit_every: int | None = None
    audit_deep: bool = False
    auditor: ContinuousAudit | None = None

    # -- travelling (Spark Connect), closing, following --------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = portable_state(self.__dict__)  # Spark Connect's foreachBatch: txsink.spark.remote
        state["auditor"] = None  # a thread: each process starts its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(arrived_state(state))
        self._recovery = self._new_recovery()
        self._start_audit()

    def _start_audit(self) -> None:
        """Start the continuous audit in this process, if ``audit_every`` asks for one."""
        if self.audit_every is None or self.auditor is not None:
            return
        self.auditor = ContinuousAudit(
            self.log, self.sinks, every=self.audit_every, deep=self.audit_deep,
            meter=self._meter, logger=self._log,
        )  # fmt: skip
        self._meter.after_commit.append(self.auditor.committed)

    def close(self) -> None:
        """Close what the sinks hold open in this driver (:meth:`SinkContract.release`):
        call it once the query has stopped. Using the coordinator again opens what it
        needs again; a failed epoch closes it by itself (Spark ends the query). The
        driver lease is released: the next driver takes over at once. A continuous audit
        that is running is given a few seconds to end."""
        if self.auditor is not None:
            self.auditor.wait(timeout=5.0)
        lease = self._lease
        if lease is not None:
            lease.release()
            self._lease = None
        for sink in (*self.sinks, *self.retired):
            try:
                sink.release()
            except Exception as err:  # best effort: the query is over anyway
                self._log.warning("%r: release failed: %s", sink, err)

    @final
    def follow(self, query: Any) -> contextlib.AbstractContextManager[LogFollower | None]:
        """Print this coordinator's epoch lines in this process while ``query`` runs
        elsewhere: under Spark Connect the coordinator runs on the server, whose log gets
        its lines. Read from the txsink log (which must be readable here: a shared path,
        ``s3://``); never affects the query; nothing to do for a classic query
        (:mod:`txsink.ops.follow`, docs/spark-connect.md)::

            with coordinator.follow(query):
                query.awaitTermination()
        """
        label = "+".join(s.uid for s in (*self.sinks, *self.retired))
        return follow(self.log, query, label=label)

    @final
    def check(
        self, df: DataFrame, *, checkpoint: str | os.PathLike[str] | None = None
    ) -> list[CheckResult]:
        """Check the pipeline before ``start()``: what its first batch would refuse, now.

        ``df``: the DataFrame the query writes (streaming or static). Every sink's
        start-up check runs against its real target with ``df``'s schema, and the
        coordinator's own (the log, the app, the partitioning: :mod:`txsink.ops.precheck`).
        Nothing is bound or written but what a sink's check creates.

        The app id: ``app_id=``, else the query id in ``checkpoint``'s ``metadata`` (the
        query's ``checkpointLocation``, a local path); a checkpoint without one is a new
        query. Without ``checkpoint`` the log's app is not compared, and the sinks are
        checked as the log's app (a restart) or, on an empty log, as ``"new-query"``.

        Returns every check with what it found. Raises the first failure (its context
        and message name the sink, the phase and the fix), the others as its notes.
        """
        return _precheck.check_or_raise(
            df,
            log=self.log,
            sinks=self.sinks,
            app_id=self.app_id,
            checkpoint=checkpoint,
            from_savepoint=self.from_savepoint,
        )

    @final
    def recovery_plan(self, app_id: str | None = None) -> list[RecoveryAction]:
        """What :meth:`recover` would do now, in order; changes nothing (a dry run).

        ``app_id`` defaults to the coordinator's, else the log's. Raises
        :class:`~txsink.errors.NonRestoredStateError` as recovery would.
        """
        return self._recovery.plan(self._recovery.operator_app(app_id or self.app_id))

    @final
    def recover(
        self, app_id: str | None = None, *, dry_run: bool = False, break_lease: bool = False
    ) -> list[RecoveryAction]:
        """Run recovery now, outside a query (an operator's ``txsink recover``).

        The same plan and execution a query runs before its first epoch: commit
        every decided-but-uncommitted epoch (a *blocked* one too: it commits once its
        cause is fixed) and mark it committed; void, then abort, every prepared
        transaction no decision names. Returns the actions done (with ``dry_run``, the
        plan). A sink that commits by re-reading the epoch's rows (Kafka replay mode)
        cannot be finished here: that raises :class:`~txsink.errors.CommitError` saying
        to restart the query. Run it while the query is stopped: it holds the driver
        lease meanwhile, and refuses (:class:`~txsink.errors.DriverLeaseError`) while a
        live driver holds it, unless ``break_lease`` (the holder is known dead).
        """
        app = self._recovery.operator_app(app_id or self.app_id)
        if dry_run:
            return self._recovery.plan(app)
        with self._operator_lease(break_lease):
            done = self._recovery.execute(self._recovery.plan(app))
        self._needs_recovery = True  # the next epoch looks again
        return done

    @final
    def abort(
        self,
        app_id: str | None = None,
        *,
        epoch: int | None = None,
        dry_run: bool = False,
        break_lease: bool = False,
    ) -> list[RecoveryAction]:
        """Abort lingering, undecided prepared transactions by hand (``txsink abort``).

        Each one's round is voided first, so no zombie driver can decide it
        afterwards. ``epoch`` limits the abort to one epoch. A decided epoch is
        never aborted — its decision stands and :meth:`recover` commits it — so
        naming one raises :class:`~txsink.errors.StateError`, unless only
        removed or retired sinks hold its handles: then their share is given up
        as with ``allow_non_restored_state`` (retired sinks' handles aborted, the
        epoch marked committed with them as ``not_restored``). Without ``epoch``
        decided epochs are left alone. Returns the actions done (or the plan).
        Holds the driver lease as :meth:`recover` does.
        """
        app = self._recovery.operator_app(app_id or self.app_id)
        if dry_run:
            return self._recovery.plan(app, abort=True, epoch=epoch)
        with self._operator_lease(break_lease):
            done = self._recovery.execute(self._recovery.plan(app, abort=True, epoch=epoch))
        self._needs_recovery = True
        return done

    @contextlib.contextmanager
    def _operator_lease(self, force: bool) -> Iterator[None]:
        """The driver lease for an operator's command: refused while a live driver holds
        it (before anything is voided), released at the end."""
        lease_s = self.lease_s or DEFAULT_LEASE_S
        lease = LeaseKeeper(self.log, lease_s, by="operator")
        lease.hold(force=force)
        try:
            yield
        finally:
            lease.release()

    # -- the driver lease, before the query starts -------------------------------------

    @final
    def hold_lease(self) -> DriverLease:
        """Take this driver's lease on the query now: call it before
        ``writeStream...start()``.

        Spark writes its checkpoint (``offsets/<n>``) before ``foreachBatch`` runs, so a
        second driver that only learns of the first inside its first epoch has already
        raced it there, and Spark may fail *either* query with
        ``CONCURRENT_STREAM_LOG_UPDATE``. Held before ``start()``, the lease refuses the
        second driver (:class:`~txsink.errors.DriverLeaseError`) before its query reads or
        writes the checkpoint, and the first runs on undisturbed.

        The lease is renewed from a daemon thread from now on (the query's epochs take it
        over once it runs) and released by :meth:`close`, when the query stops, or when
        the process exits. Renews it if this coordinator already holds it; raises
        :class:`~txsink.errors.FencedError` if it was taken over since. Classic PySpark
        only: under Spark Connect the epochs run in another process, which takes the lease
        at its first epoch (docs/operations.md#the-driver-lease).
        """
        lease = self._keeper()
        held = lease.hold()
        lease.keep_alive(until_the_query_runs)
        return held

    # -- starting from a savepoint ------------------------------------------------------

    def _restore_once(self) -> None:
        """Fill an empty log from ``from_savepoint`` (once per coordinator)."""
        if self._restored or self.from_savepoint is None:
            return
        from txsink.ops.savepoint import restore_if_empty

        if restore_if_empty(self.from_savepoint, self.log):
            self._log.info("restored the txsink log from savepoint %s", self.from_savepoint)
        self._restored = True

    def _app_from_log(self) -> str:
        self._restore_once()
        meta = self.log.meta()
        if meta is None:
            raise _precheck.empty_log_error(self.log.location)
        return str(meta["app_id"])
