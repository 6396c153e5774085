"""The epoch's commit: one Delta commit adding every file of the epoch, with the app's
transaction (``txn``: app id + epoch) in the same log entry.

Steps (each attempt starts again at step 1, on a freshly read table):

1. Read the version the table records for the app id ``txsink.<app>.<uid>``. At or past the
   epoch: committed before (by this or an earlier driver), verified in the log. delta-rs
   does not enforce the version, txsink checks it here.
2. Check every file of the decided handles is there with its size; a file gone means the
   epoch's rows are lost: :class:`~txsink.errors.CommitError`, never a partial commit.
3. Commit ``add`` actions + ``txn`` + commit info (app, uid, epoch); with the epoch's
   schema change, when the table lacks part of it, the ``metaData`` action too, in the
   same log entry, written by :mod:`~txsink.connectors.delta.evolve`. delta-rs retries a
   commit that only races plain appends; a conflict it cannot reconcile (a concurrent commit
   of the same app id, a metadata change) or an error that leaves the outcome unknown (the
   log entry's PUT timed out) sends us back to step 1, which decides from the log.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from txsink.connectors.delta import evolve
from txsink.connectors.delta.errors import describe, is_conflict
from txsink.connectors.delta.handles import DeltaHandle
from txsink.connectors.delta.storage import Storage
from txsink.contract import EpochCommit
from txsink.errors import CommitError
from txsink.observe.logs import EpochLogger

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["ATTEMPTS", "app_txn_id", "commit_epoch", "recorded_version"]

#: Commit attempts before giving up (the next run retries from step 1).
ATTEMPTS = 4


def app_txn_id(app: str, uid: str) -> str:
    """The Delta ``txn`` app id of one txsink app and sink uid."""
    return f"txsink.{app}.{uid}"


def recorded_version(table: DeltaTable, app: str, uid: str) -> int | None:
    """The last epoch the table records for ``app`` and ``uid`` (None: none yet)."""
    version = table.transaction_version(app_txn_id(app, uid))
    return None if version is None else int(version)


def commit_epoch(
    request: EpochCommit[DeltaHandle],
    *,
    uid: str,
    open_table: Callable[[], DeltaTable],
    storage: Storage,
    log: EpochLogger,
    ctx: Mapping[str, Any],
) -> None:
    """Make the epoch's files part of the table, once (see the module's steps)."""
    handles = request.handles
    if not handles:
        return  # nothing to add: no commit (the next epoch's txn supersedes)
    app, epoch = handles[0].txn.app, request.epoch
    last: BaseException | None = None
    for attempt in range(1, ATTEMPTS + 1):
        # Step 1
        table = open_table()
        recorded = recorded_version(table, app, uid)
        if recorded is not None and recorded >= epoch:
            log.info("epoch %d already in the Delta log (app version %d)", epoch, recorded)
            request.committed(handles)
            return
        # Step 2
        _check_files(handles, storage.size, epoch, ctx)
        # Step 3
        evolved = _evolved(table, request, ctx)
        try:
            if evolved is None:
                _commit(table, handles, app_txn_id(app, uid), epoch, uid)
            else:
                version = evolve.commit_with_schema(
                    table, storage, evolved, handles, app_id=app_txn_id(app, uid),
                    epoch=epoch, info=_info(handles, uid, epoch),
                )  # fmt: skip
                log.info("epoch %d evolved the table's schema in version %d", epoch, version)
                _checkpoint(open_table, version, log)
        except Exception as err:
            last = err
            conflict = is_conflict(err) or isinstance(err, evolve.LogEntryExists)
            what = "conflicts with a concurrent commit" if conflict else "failed"
            log.warning(
                "Delta commit attempt %d/%d %s (%s); re-reading the log to decide",
                attempt,
                ATTEMPTS,
                what,
                describe(err),
            )
            continue
        request.committed(handles)
        return
    table = open_table()
    recorded = recorded_version(table, app, uid)
    if recorded is not None and recorded >= epoch:
        request.committed(handles)
        return
    why = describe(last) if last is not None else "unknown"
    raise CommitError(
        f"could not commit epoch {epoch} to the Delta table after {ATTEMPTS} attempts "
        f"(last: {why}); the table records app version {recorded}. The decision stands and "
        "the next run commits it again: check the storage, and that no other writer keeps "
        "changing the table's metadata or writes with the same app id (sink uid)",
        epoch=epoch,
        **ctx,
    ) from last


def _check_files(
    handles: tuple[DeltaHandle, ...],
    size_of: Callable[[str], int | None],
    epoch: int,
    ctx: Mapping[str, Any],
) -> None:
    for handle in handles:
        for f in handle.files:
            size = size_of(f.path)
            if size != f.size:
                state = "is gone" if size is None else f"has {size} bytes, not {f.size}"
                raise CommitError(
                    f"data file {f.path} of {handle.txn} {state}, and the table does not "
                    f"record epoch {epoch}: its rows are lost (aborted or deleted by hand, or "
                    "by VACUUM while the epoch waited for its commit). Replay the epoch from "
                    "the source if it still holds it",
                    epoch=epoch,
                    partition=handle.txn.partition,
                    **ctx,
                )


def _evolved(
    table: DeltaTable, request: EpochCommit[DeltaHandle], ctx: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The table's schema JSON after the epoch's change; None when there is no change or
    the table already has all of it (then a commit without ``metaData`` does). A table
    that took a feature txsink does not honour since the epoch was planned is a
    :class:`CommitError`: the decision stands, the operator adds the columns by hand."""
    change = request.schema_change
    if change is None:
        return None
    current = json.loads(table.schema().to_json())
    merged = evolve.merged_json(current, change)
    if merged == current:
        return None
    blocked = evolve.unwritable(table, change, "the Delta table")
    if blocked is not None:
        raise CommitError(
            f"cannot commit epoch {request.epoch}, which evolves the schema: {blocked} (the "
            "table changed since the epoch was planned). The decision stands: stop the "
            f"query, add the column(s) by hand (ALTER TABLE ... ADD COLUMNS: "
            f"{change.describe()}), then start it again; the commit then adds the rows only",
            epoch=request.epoch,
            **ctx,
        )
    return merged


def _checkpoint(open_table: Callable[[], DeltaTable], version: int, log: EpochLogger) -> None:
    """The checkpoint delta-rs writes after its own commits at the table's interval (a
    hand-written entry skips delta-rs' post-commit hook). Best effort: a missing checkpoint
    only makes readers replay more of the log."""
    try:
        table = open_table()
        interval = int(table.metadata().configuration.get("delta.checkpointInterval") or 100)
        if version % interval == 0:
            table.create_checkpoint()
    except Exception as err:
        log.warning(
            "no checkpoint at version %d (%s): readers replay the log", version, describe(err)
        )


def _info(handles: tuple[DeltaHandle, ...], uid: str, epoch: int) -> dict[str, Any]:
    return {
        "txsink.app": handles[0].txn.app,
        "txsink.uid": uid,
        "txsink.epoch": epoch,
        "txsink.rows": sum(h.rows for h in handles),
    }


def _commit(
    table: DeltaTable, handles: tuple[DeltaHandle, ...], app_id: str, epoch: int, uid: str
) -> None:
    from deltalake import CommitProperties, Transaction
    from deltalake.transaction import AddAction, RemoveAction

    adds: list[AddAction | RemoveAction] = [
        AddAction(
            f.path,  # delta-rs URI-encodes it into the log
            f.size,
            dict(f.partition),
            f.modified_ms,
            True,
            f.stats,
        )
        for h in handles
        for f in h.files
    ]
    table.create_write_transaction(
        adds,
        "append",
        table.schema(),
        partition_by=list(table.metadata().partition_columns) or None,
        commit_properties=CommitProperties(
            custom_metadata=_info(handles, uid, epoch),
            app_transactions=[Transaction(app_id, epoch)],
        ),
    )
