"""Recover and abort by hand: the operator's entry points, thin on purpose.

Both run the coordinator's own recovery plan (:meth:`txsink.Coordinator.recover`,
:meth:`txsink.Coordinator.abort`): the protocol lives in the coordinator only, so
what an operator runs is exactly what a restarted query would run. Use them while
the query is stopped — to release what a crashed pipeline holds in its targets
(Postgres locks of prepared transactions, S3 multipart uploads, WAL files) without
restarting it, or to clean up after a sink was removed (``retired=``). With
``dry_run=True`` nothing changes: the returned actions are the plan.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from txsink.contract import SinkContract
from txsink.observe import failure as _failure
from txsink.observe.logs import install_console
from txsink.ops.operator import Operations
from txsink.protocol.epoch import EpochProtocol
from txsink.protocol.log import TxLog
from txsink.protocol.recovery import RecoveryAction
from txsink.store import LogStore

__all__ = ["abort", "recover"]

AnySink = SinkContract[Any, Any]
Log = str | os.PathLike[str] | LogStore | TxLog


def recover(
    log: Log,
    sinks: EpochProtocol | Sequence[AnySink],
    *,
    dry_run: bool = False,
    retired: Sequence[AnySink] = (),
    allow_non_restored_state: bool = False,
    app_id: str | None = None,
    break_lease: bool = False,
) -> list[RecoveryAction]:
    """Finish every decided epoch and abort every lingering undecided transaction.

    ``sinks`` are the pipeline's sinks as it configures them (same uids and
    settings), or its :class:`~txsink.Coordinator` (whose ``retired`` and
    ``allow_non_restored_state`` are then used). Returns the actions done, or with
    ``dry_run`` the actions it would do. Refused while a live driver holds the query's
    lease (:class:`~txsink.errors.DriverLeaseError`), unless ``break_lease``.
    """
    coordinator = _coordinator(log, sinks, retired, allow_non_restored_state, app_id)
    return coordinator.recover(dry_run=dry_run, break_lease=break_lease)


def abort(
    log: Log,
    sinks: EpochProtocol | Sequence[AnySink],
    *,
    epoch: int | None = None,
    dry_run: bool = False,
    retired: Sequence[AnySink] = (),
    app_id: str | None = None,
    break_lease: bool = False,
) -> list[RecoveryAction]:
    """Abort lingering undecided transactions (of ``epoch``, or all), voiding their rounds first.

    Refuses (:class:`~txsink.errors.StateError`) to abort a decided epoch that a
    configured sink holds handles of: the decision stands, :func:`recover` commits
    it. A decided epoch held only by removed or retired sinks is given up when
    named by ``epoch`` (see :class:`~txsink.Coordinator`'s ``retired``).
    """
    coordinator = _coordinator(log, sinks, retired, False, app_id)
    return coordinator.abort(epoch=epoch, dry_run=dry_run, break_lease=break_lease)


def _coordinator(
    log: Log,
    sinks: EpochProtocol | Sequence[AnySink],
    retired: Sequence[AnySink],
    allow: bool,
    app_id: str | None,
) -> Operations:
    """The protocol with its operator entry points, as :class:`~txsink.Coordinator` runs
    them, without the Spark side (an operator's recovery runs no Spark job)."""
    install_console()  # the epoch lines, as the Coordinator prints them
    _failure.install_excepthook()
    if isinstance(sinks, EpochProtocol):  # a Coordinator
        return Operations(
            sinks.sinks,
            log=log,
            app_id=app_id or sinks.app_id,
            allow_non_restored_state=allow or sinks.allow_non_restored_state,
            retired=(*sinks.retired, *retired),
            retain_epochs=sinks.retain_epochs,
            faults=sinks.faults,
            lease_s=sinks.lease_s,
        )
    return Operations(
        list(sinks), log=log, app_id=app_id, allow_non_restored_state=allow, retired=retired
    )
