"""Commit one sink's share of a decided epoch: the one place that calls ``commit_epoch``.

Used by the coordinator's step 5 and by recovery, so both wrap the hook the same way:
a sink that commits from data gets the epoch's rows or a clear refusal, and any
failure comes out as a :class:`~txsink.errors.TxsinkError` naming the sink, the epoch
and the phase (the decision stands either way; the next run retries).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from txsink.contract import EpochCommit, EpochData, SinkContract
from txsink.errors import CommitError, TxsinkError
from txsink.handles import Handle

__all__ = ["commit_share"]


def commit_share(
    sink: SinkContract[Any, Any],
    epoch: int,
    handles: Sequence[Handle],
    *,
    data: EpochData | None,
    on_committed: Callable[[Sequence[Handle]], None],
) -> None:
    """``sink.commit_epoch`` for ``handles`` (its decided handles of ``epoch``).

    ``data`` is the epoch's rows when this runs inside that epoch's replay; a sink that
    commits from data and has handles cannot be finished without them.
    """
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
    request = EpochCommit(
        epoch, tuple(handles), data if sink.commits_from_data else None, on_committed
    )
    try:
        sink.commit_epoch(request)
    except TxsinkError as err:
        err.with_context(sink_uid=sink.uid, epoch=epoch, phase="commit", connector=sink.connector)
        raise
    except Exception as err:
        raise CommitError(
            f"commit of epoch {epoch} ({len(handles)} handle(s)) failed: {err!r}; the "
            "decision stands and recovery retries it on the next run",
            sink_uid=sink.uid,
            epoch=epoch,
            phase="commit",
            connector=sink.connector,
        ) from err
