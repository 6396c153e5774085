"""Finish transactions either way: the one place that calls ``commit_epoch``, and the one
place that calls ``abort``.

:func:`commit_share` is used by the coordinator's step 5 and by recovery, so both wrap the
hook the same way: a sink that commits from data gets the epoch's rows or a clear refusal,
and any failure comes out as a :class:`~txsink.errors.TxsinkError` naming the sink, the
epoch and the phase (the decision stands either way; the next run retries).
:func:`abort_one` is used for every abort (a failed pre-commit, unused attempts, recovery,
a fenced driver, a renamed uid), so each aborted transaction is told once, in one line of
the same form, whatever the connector: connectors never log their own aborts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txsink.contract import EpochCommit, EpochData, SinkContract, TaskRunner, local_tasks
from txsink.errors import CommitError, EpochBlockedError, TxsinkError
from txsink.handles import Handle
from txsink.observe.logs import EpochLogger
from txsink.protocol.rounds import OutageBound, retry_transient
from txsink.protocol.taskerror import describe, from_task
from txsink.schema import SchemaChange

if TYPE_CHECKING:
    from txsink.observe.metering import Meter
    from txsink.protocol.log import TxLog

__all__ = ["abort_one", "commit_decided", "commit_share"]


def commit_share(
    sink: SinkContract[Any, Any],
    epoch: int,
    handles: Sequence[Handle],
    *,
    data: EpochData | None,
    on_committed: Callable[[Sequence[Handle]], None],
    tasks: TaskRunner = local_tasks,
    meter: Meter | None = None,
    recovering: bool = False,
    log: TxLog | None = None,
    round_: int = 0,
    schema_change: SchemaChange | None = None,
) -> None:
    """``sink.commit_epoch`` for ``handles`` (its decided handles of ``epoch``), with the
    ``schema_change`` the decision records for the sink.

    A commit the target refuses for good (:class:`~txsink.errors.EpochBlockedError`) is
    recorded in ``log`` as a *blocked* attempt of round ``round_`` (reason, shard, fix),
    counted by the ``blocked_epochs`` gauge, and raised saying it is blocked and how to
    finish it once fixed.

    ``data`` is the epoch's rows when this runs inside that epoch's replay; a sink that
    commits from data and has handles cannot be finished without them. ``tasks`` runs a
    commit spread over the cluster (the query's Spark session; in-process without one).
    ``meter`` counts the handle outcomes (``recovering``: recovery's commit).
    """
    ratio: Callable[[float], None] | None = None
    failed: Callable[[int], None] = _nothing
    notify = on_committed
    if meter:
        reported, ratio, failed = meter.commit_watch(sink, recovering=recovering)
        if recovering:
            meter.handles(sink, "retried", len(handles))

        def counted(hs: Sequence[Handle]) -> None:
            reported(hs)
            on_committed(hs)

        notify = counted

    if sink.commits_from_data:
        if not handles:
            return
        if data is None:
            raise CommitError(
                f"epoch {epoch} is decided, and sink {sink.uid} commits it by reading its "
                "rows again, which only the replay of that epoch provides: restart the "
                "query from its checkpoint (Spark replays the epoch) to finish it",
                sink_uid=sink.uid,
                epoch=epoch,
                phase="recover",
                connector=sink.connector,
            )
    rows = data if sink.commits_from_data else None
    request = EpochCommit(epoch, tuple(handles), rows, notify, tasks, ratio, schema_change)
    ctx: dict[str, Any] = {
        "sink_uid": sink.uid,
        "epoch": epoch,
        "phase": "commit",
        "connector": sink.connector,
    }
    try:
        _commit_counted(sink, request, failed)
    except EpochBlockedError as err:
        err.with_context(sink_uid=sink.uid, epoch=epoch, phase="commit", connector=sink.connector)
        _blocked(err, sink, epoch, round_=round_, log=log, meter=meter)
        raise
    except TxsinkError as err:
        if type(err) is not TxsinkError or not from_task(err):
            raise err.with_context(**ctx) from err.__cause__
        # A task's unclassified error (a connector's gap): told as the commit's failure.
        raise CommitError(
            f"commit of epoch {epoch} ({len(handles)} handle(s)) failed in a task: "
            f"{err.message}; the decision stands and recovery retries it on the next run",
            **{**ctx, **err.context},
        ) from err
    except Exception as err:
        raise CommitError(
            f"commit of epoch {epoch} ({len(handles)} handle(s)) failed: {describe(err)}; "
            "the decision stands and recovery retries it on the next run",
            **ctx,
        ) from err


def _blocked(
    err: EpochBlockedError,
    sink: SinkContract[Any, Any],
    epoch: int,
    *,
    round_: int,
    log: TxLog | None,
    meter: Meter | None,
) -> None:
    """Record the refusal and say, once, that the epoch is blocked until fixed."""
    attempt = 0
    if log is not None:
        attempt = log.record_block(
            epoch,
            round_,
            sink_uid=sink.uid,
            shard=err.shard if err.shard is not None else err.partition,
            reason=err.message,
            fix=err.fix,
        )
    if meter:
        meter.blocked(sink, epoch, True)
    nth = f" (refused attempt {attempt})" if attempt else ""
    reason = err.message.rstrip(".")
    if err.fix and err.fix not in reason:
        reason += f". Fix: {err.fix}"
    err.message = (
        f"epoch {epoch} is BLOCKED{nth}: its decision stands, but the target refuses it "
        f"for good, and no retry succeeds until the cause is fixed: {reason}. Once "
        "fixed, run `txsink recover` or restart the query: it commits the epoch. "
        "`txsink status` shows the epoch as blocked meanwhile"
    )
    err.args = (err.message,)


def _nothing(_count: int) -> None:
    pass


def _commit_counted(
    sink: SinkContract[Any, Any], request: EpochCommit[Any], failed: Callable[[int], None]
) -> None:
    try:
        sink.commit_epoch(request)
    except BaseException:
        failed(len(request.handles))
        raise


def abort_one(
    sink: SinkContract[Any, Any],
    handle: Handle,
    why: str,
    *,
    log: EpochLogger,
    by: str = "",
    level: int = logging.INFO,
    best_effort: bool = False,
    meter: Meter | None = None,
) -> bool:
    """``sink.abort(handle)``, then one line: ``[by: ]aborted <txn>: <why>``.

    ``best_effort``: a failing abort is logged as a WARNING and ``False`` returned, not
    raised (recovery aborts the transaction later). Returns whether it was aborted.
    """
    txn = handle.txn
    line = log.bind(uid=sink.uid, epoch=txn.epoch)
    lead = f"{by}: " if by else ""
    try:
        sink.abort(handle)
    except Exception as err:
        if not best_effort:
            raise
        line.warning("%scould not abort %s (recovery retries it): %s", lead, txn, err)
        return False
    line.log(level, "%saborted %s: %s", lead, txn, why)
    if meter:
        meter.handles(sink, "aborted", 1)
    return True


def commit_decided(
    sinks: Sequence[SinkContract[Any, Any]],
    epoch: int,
    handles: Mapping[str, Sequence[Handle]],
    *,
    data: EpochData | None,
    done: set[str],
    first_visible: Callable[[], None],
    tasks: TaskRunner,
    meter: Meter,
    bound: OutageBound,
    logger: EpochLogger,
    log: TxLog | None = None,
    round_: int = 0,
    schema: Mapping[str, SchemaChange] | None = None,
) -> None:
    """The coordinator's step 5: each sink's share of the decided ``handles``, in order.

    ``done``: transactions the single-pass tasks committed already (only reported here).
    ``first_visible`` runs once, when the first part of the epoch is visible (the
    ``during_commit`` crash point). ``log`` and ``round_``: where a share refused for good
    is recorded as blocked (:func:`commit_share`). A share that fails transiently (a target briefly
    unreachable) is committed again after ``bound``'s pauses (:mod:`txsink.protocol.rounds`:
    ``commit_epoch`` is idempotent); its last failure, or any other, is raised: the
    decision stands, and the next run's recovery finishes the commit.
    """
    first: list[bool] = []

    def committed(_handles: Sequence[Handle]) -> None:
        if not first:
            first.append(True)
            first_visible()

    for sink in sinks:
        mine = [h for h in handles[sink.uid] if str(h.txn) not in done]
        if len(mine) < len(handles[sink.uid]):
            committed([h for h in handles[sink.uid] if str(h.txn) in done])
            meter.handles(sink, "committed", len(handles[sink.uid]) - len(mine))

        def share(sink: SinkContract[Any, Any] = sink, mine: list[Handle] = mine) -> None:
            commit_share(
                sink, epoch, mine, data=data, on_committed=committed, tasks=tasks, meter=meter,
                log=log, round_=round_, schema_change=(schema or {}).get(sink.uid),
            )  # fmt: skip

        what = f"the commit of sink {sink.uid}'s share of epoch {epoch} failed"
        retry_transient(share, bound=bound, logger=logger.bind(uid=sink.uid), what=what)
