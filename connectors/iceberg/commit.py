"""The epoch's commit: one Iceberg table transaction appending every file of the epoch and
recording the epoch, in the table's own metadata, in the same atomic step.

"Already committed" is the table property ``txsink.<app>.<uid>.committed-epoch`` (it
survives snapshot expiry, unlike the snapshot summary, which also carries app, uid and
epoch for people and other tools). It is read before committing and again after any
failure whose outcome is unknown; a concurrent commit by another writer (appends do not
conflict) is retried on the refreshed table.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from txsink.connectors.iceberg.catalog import describe
from txsink.connectors.iceberg.evolve import Refused, stage
from txsink.connectors.iceberg.files import FileIdsDiffer, data_file
from txsink.connectors.iceberg.handles import IcebergHandle
from txsink.connectors.iceberg.naming import SUMMARY_APP, SUMMARY_EPOCH, SUMMARY_UID
from txsink.connectors.iceberg.writer import rewrite
from txsink.errors import CommitError, EpochBlockedError, RetryableError
from txsink.observe.logs import get_logger

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table, Transaction

    from txsink.schema import SchemaChange

__all__ = [
    "SUMMARY_APP",
    "SUMMARY_EPOCH",
    "SUMMARY_UID",
    "commit_files",
    "commit_schema",
    "committed_epoch",
    "epoch_key",
]

_log = get_logger(__name__)

ATTEMPTS = 8


def epoch_key(app: str, uid: str) -> str:
    """The table property holding the last epoch committed by ``app``'s sink ``uid``."""
    return f"txsink.{app}.{uid}.committed-epoch"


def committed_epoch(table: Table, app: str, uid: str) -> int:
    """The last epoch the table says ``app``'s sink ``uid`` committed (-1: none)."""
    value = table.properties.get(epoch_key(app, uid))
    if value is not None:
        return int(value)
    snapshot = table.current_snapshot()
    while snapshot is not None:  # a table whose property was removed by hand: the summaries
        summary = snapshot.summary
        if (
            summary is not None
            and summary.get(SUMMARY_APP) == app
            and summary.get(SUMMARY_UID) == uid
        ):
            return int(str(summary[SUMMARY_EPOCH]))
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return -1


def commit_files(
    load: Callable[[], Table],
    epoch: int,
    handles: Sequence[IcebergHandle],
    *,
    app: str,
    uid: str,
    connector: str,
    change: SchemaChange | None = None,
) -> None:
    """Make ``handles`` visible as one snapshot, unless the table says it already is; with
    ``change``, the schema update in the same table commit (:mod:`.evolve`), so the new
    columns and the epoch's rows become visible together. An epoch with a change and no
    file still commits the change (and the committed epoch): the next epochs' tasks write
    the new schema."""
    from pyiceberg.exceptions import CommitFailedException

    log = _log.bind(uid=uid, epoch=epoch)
    for attempt in range(ATTEMPTS):
        table = load()
        done = committed_epoch(table, app, uid)
        if done >= epoch:
            log.info("epoch already committed in the table (its committed epoch is %d)", done)
            return
        tx = table.transaction()
        schema = table.schema() if change is None else _staged(tx, change, uid, epoch, connector)
        files: list[DataFile] = []
        replaced: list[str] = []
        for handle in handles:
            for position, prepared in enumerate(handle.files):
                try:
                    entries = [data_file(table, prepared, schema, ids=change is not None)]
                except FileIdsDiffer as differs:  # another writer's schema change meanwhile
                    entries = _rewritten(
                        table, handle, position, schema, differs, uid=uid, epoch=epoch,
                        connector=connector,
                    )  # fmt: skip
                    replaced.append(prepared[0])
                if entries[0] is None:
                    name = prepared[0].rsplit("/", 1)[-1]
                    raise CommitError(
                        f"cannot commit {handle.txn}: its data file {name} "
                        "is gone and the table does not record this epoch as committed, so "
                        "its rows are lost. Was it deleted by hand or by orphan-file cleanup "
                        "(remove_orphan_files with a short older_than)?",
                        sink_uid=uid,
                        epoch=epoch,
                        partition=handle.txn.partition,
                        connector=connector,
                        phase="commit",
                    )
                files.extend(e for e in entries if e is not None)
        summary = {SUMMARY_APP: app, SUMMARY_UID: uid, SUMMARY_EPOCH: str(epoch)}
        try:
            tx.set_properties({epoch_key(app, uid): str(epoch)})
            if files:
                with tx.update_snapshot(snapshot_properties=summary).fast_append() as append:
                    for entry in files:
                        append.append_data_file(entry)
            tx.commit_transaction()
        except CommitFailedException:
            log.info("concurrent commit on the table; retrying on its new state (%d)", attempt)
            time.sleep(min(0.05 * 2**attempt, 2.0))
            continue
        except Exception as exc:  # commit state unknown, a cut connection...: look, never assume
            log.warning("commit outcome unknown (%s): reading the table back", describe(exc))
            try:
                if committed_epoch(load(), app, uid) >= epoch:
                    return
            except Exception as again:
                raise RetryableError(
                    f"the Iceberg commit's outcome is unknown ({describe(exc)}) and the table "
                    f"cannot be read back ({describe(again)}): the next run decides from the "
                    "table; check the catalog is reachable",
                    sink_uid=uid,
                    epoch=epoch,
                    connector=connector,
                    phase="commit",
                ) from None
            time.sleep(min(0.05 * 2**attempt, 2.0))
            continue
        evolved = f"; evolved the schema: {change.describe()}" if change is not None else ""
        log.info("committed %d data file(s) as one snapshot%s", len(files), evolved)
        for path in replaced:  # rewritten: the task's own file is referenced by nothing
            with contextlib.suppress(Exception):
                table.io.delete(path)
        return
    raise RetryableError(
        f"the Iceberg commit did not go through in {ATTEMPTS} attempts (other writers kept "
        "committing, or the catalog kept failing): the decision stands, the next run retries",
        sink_uid=uid,
        epoch=epoch,
        connector=connector,
        phase="commit",
    )


def commit_schema(
    load: Callable[[], Table], epoch: int, change: SchemaChange, *, uid: str, connector: str
) -> None:
    """``change`` alone, for an epoch without any handle (no app to record a committed
    epoch for): idempotent by content, as :func:`.evolve.stage` stages only what the table
    lacks."""
    from pyiceberg.exceptions import CommitFailedException

    for attempt in range(ATTEMPTS):
        tx = load().transaction()
        _staged(tx, change, uid, epoch, connector)
        try:
            tx.commit_transaction()  # nothing staged: no commit
        except CommitFailedException:
            time.sleep(min(0.05 * 2**attempt, 2.0))
            continue
        return
    raise RetryableError(
        f"the Iceberg schema change did not go through in {ATTEMPTS} attempts: the decision "
        "stands, the next run retries",
        sink_uid=uid,
        connector=connector,
        phase="commit",
    )


def _rewritten(
    table: Table,
    handle: IcebergHandle,
    position: int,
    schema: Schema,
    differs: FileIdsDiffer,
    *,
    uid: str,
    epoch: int,
    connector: str,
) -> list[DataFile | None]:
    """A decided file whose field ids another writer's schema change made wrong, written
    again with the committed schema's ids (:func:`.writer.rewrite`); blocked when its
    columns cannot be told apart by name."""
    name = differs.path.rsplit("/", 1)[-1]
    again = rewrite(
        table, handle.files[position], handle.txn, schema, position, uid=uid, connector=connector
    )
    if again is None:
        raise _ids_differ(differs, uid, epoch, connector)
    _log.bind(uid=uid, epoch=epoch).warning(
        "the table's schema was changed by another writer after epoch %d was planned: data "
        "file %s written again with the table's field ids (%s)",
        epoch,
        name,
        differs.detail,
    )
    try:
        return [data_file(table, f, schema, ids=True) for f in again]
    except FileIdsDiffer as still:  # pragma: no cover - rewrite() writes the schema's ids
        raise _ids_differ(still, uid, epoch, connector) from None


_CHANGED = (
    "the table's schema was changed by another writer after this epoch was planned; a "
    "retry fails the same way until an operator acts"
)


def _blocked(
    message: str, fix: str, column: str, *, uid: str, epoch: int, connector: str
) -> EpochBlockedError:
    return EpochBlockedError(
        f"{message}: {_CHANGED}. Fix: {fix}; then run `txsink recover` (or restart the "
        "query): it commits the epoch",
        fix=fix,
        sink_uid=uid,
        epoch=epoch,
        connector=connector,
        column=column,
        phase="commit",
    )


def _staged(tx: Transaction, change: SchemaChange, uid: str, epoch: int, connector: str) -> Schema:
    """The decided ``change`` staged in ``tx`` (:func:`.evolve.stage`); a column Iceberg
    refuses now (it took it when the epoch was planned) blocks the epoch."""
    try:
        return stage(tx, change)
    except Refused as refused:
        raise _blocked(
            f"cannot evolve the table's column {refused.column!r} in decided epoch {epoch} "
            f"({refused.why})",
            "put the table's column back as it was when the epoch was planned (the epoch "
            f"{change.describe()})",
            refused.column,
            uid=uid,
            epoch=epoch,
            connector=connector,
        ) from None


def _ids_differ(differs: FileIdsDiffer, uid: str, epoch: int, connector: str) -> EpochBlockedError:
    """The epoch's data files carry other field ids than the table's schema gives their
    columns: committing them would show one column's values under another."""
    name = differs.path.rsplit("/", 1)[-1]
    return _blocked(
        f"cannot commit decided epoch {epoch}: its data file {name} and the table disagree "
        f"on a column's field id ({differs.detail})",
        "undo the other writer's schema change by making the table's metadata file from "
        "before it current again (e.g. register_table with that file: Iceberg never reuses "
        "a field id, so dropping the other writer's column is not enough)",
        differs.detail.split(":", 1)[0],
        uid=uid,
        epoch=epoch,
        connector=connector,
    )
