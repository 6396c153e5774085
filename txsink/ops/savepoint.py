"""Savepoints: a self-contained, canonical copy of the txsink log at a fully committed epoch.

A savepoint moves or upgrades a pipeline: to a new log location, a new cluster, a new
Spark checkpoint directory. It is the txsink log's half of the pipeline's state; Spark's
checkpoint directory is the other half, and the two only make sense together:

* the Spark checkpoint holds the source offsets of every batch (``offsets/``), which
  batches Spark finished (``commits/``), and the query id (``metadata``), which *is* the
  txsink app id;
* the txsink log holds, per epoch (= Spark batch id), the decision: every prepared
  transaction of every sink, and whether it was committed.

So copy both while the query is stopped: ``create_savepoint(log, to, checkpoint=dir)``
checks that they agree and keeps a copy of the checkpoint in ``<to>/spark-checkpoint/``.

Layout of a savepoint (a txsink log itself, plus its manifest)::

    meta.json                                   the log's meta record, byte for byte
    epochs/<epoch:020d>/decision-<round>.json   committed epochs: the deciding round only
    epochs/<epoch:020d>/committed.json
    epochs/<epoch:020d>/claim-*.json, decision-*.json   aborted epochs (every round voided):
                                                kept, so their round numbers are never reused
    spark-checkpoint/...                        optional: the Spark checkpoint directory
    savepoint.json                              written last: format, version, app id, source
                                                log, last committed epoch, sinks, and every
                                                record above with its size and sha256

Canonical means: only what describes the committed history. Claims and voids of the dead
rounds of committed epochs are dropped (a committed epoch is never run again, so its round
numbers cannot collide). Aborted epochs keep their claims and voids: the next run does that
epoch again, and a target may still hold a transaction of an old round (recovery aborts it),
whose name a reused round number would repeat.

A savepoint is taken only at a *fully committed* state: no epoch decided but not yet
committed (recovery must finish it first: the decision would otherwise be carried to a
place where nothing finishes it with the same targets), and no epoch open (claimed, neither
decided nor voided: a query may be running).

Restore copies the records into an empty log location and, if asked, the checkpoint copy
into an empty directory; a pipeline started with both continues exactly once from the next
epoch. A *new* checkpoint (a new query id, batch ids from 0) with a restored log is refused
by the coordinator with :class:`~txsink.errors.CheckpointMismatchError`: see
docs/upgrades.md for the supported ways.

Here: the public API and the create/read/restore steps. The manifest's format and check
are in :mod:`txsink.ops.savepoint_manifest`, the choice and order of the log's records in
:mod:`txsink.ops.savepoint_records`, Spark's checkpoint directory in :mod:`txsink.ops.checkpoint`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink._version import __version__
from txsink.errors import LogError, SavepointError
from txsink.kit.jsonrows import dumps_record
from txsink.ops.checkpoint import (
    CheckpointInfo,
    check_checkpoint_matches,
    checkpoint_records,
    inspect_checkpoint,
    restore_checkpoint,
)
from txsink.ops.savepoint_manifest import (
    CHECKPOINT_PREFIX,
    MANIFEST,
    RESTORED_MARKER,
    SAVEPOINT_FORMAT,
    SAVEPOINT_VERSION,
    checkpoint_entries,
    entry,
    sha,
    verify_manifest,
)
from txsink.ops.savepoint_records import (
    canonical_records,
    create_exact,
    is_empty,
    log_keys,
    refuse_unfinished_rename,
    restore_order,
)
from txsink.protocol.log import TxLog, open_log
from txsink.store import LogStore

__all__ = [
    "CHECKPOINT_PREFIX",
    "MANIFEST",
    "RESTORED_MARKER",
    "SAVEPOINT_FORMAT",
    "SAVEPOINT_VERSION",
    "CheckpointInfo",
    "RestoreReport",
    "Savepoint",
    "create_savepoint",
    "inspect_checkpoint",
    "read_savepoint",
    "restore_if_empty",
    "restore_savepoint",
]

LogLike = str | os.PathLike[str] | LogStore | TxLog


# -- what a savepoint says ------------------------------------------------------------------


@dataclass(frozen=True)
class Savepoint:
    """A verified savepoint: its manifest, and where it is."""

    location: str
    app_id: str
    last_committed: int | None
    epochs: tuple[int, ...]
    sinks: tuple[str, ...]
    records: tuple[dict[str, Any], ...]
    checkpoint_files: tuple[dict[str, Any], ...]
    manifest: dict[str, Any] = field(repr=False)

    @property
    def has_checkpoint(self) -> bool:
        return self.manifest.get("checkpoint") is not None


@dataclass(frozen=True)
class RestoreReport:
    """What :func:`restore_savepoint` did: ``already`` when the log already was the savepoint."""

    log: str
    app_id: str
    last_committed: int | None
    records_written: int
    already: bool
    checkpoint: str | None = None
    checkpoint_files: int = 0


# -- create ---------------------------------------------------------------------------------


def create_savepoint(
    log: LogLike, to: LogLike, *, checkpoint: str | os.PathLike[str] | None = None
) -> Savepoint:
    """Write a canonical copy of ``log`` at its last committed epoch to ``to``.

    ``to`` is a path or an ``s3://`` URL (or a store) and must be empty; every record is
    created with create-if-absent and ``savepoint.json`` last, so a copy cut short has no
    manifest (or a manifest whose records are missing) and is refused by restore.

    ``checkpoint``: the query's Spark checkpoint directory (a local or mounted path),
    copied into ``<to>/spark-checkpoint/``. It must belong to the log's app (its query id)
    and be where the log is: Spark would start at the log's last committed epoch (a
    replay, skipped) or the one after.

    Raises:
        SavepointError: an epoch is decided but not committed, or open; a uid rename is
            unfinished; ``to`` is not empty; the checkpoint does not match the log.
    """
    source = open_log(log)
    meta_raw = source.store.read("meta.json")
    if meta_raw is None:
        raise SavepointError(
            f"no txsink log at {source.location} (no meta.json): nothing to save; check the "
            "--log location"
        )
    meta = _meta(source)
    app_id = str(meta["app_id"])
    refuse_unfinished_rename(source)
    records, epochs, sinks = canonical_records(source, meta_raw)
    last = source.last_committed()
    ckpt_records: list[tuple[str, bytes]] = []
    ckpt_doc: dict[str, Any] | None = None
    if checkpoint is not None:
        info = inspect_checkpoint(checkpoint)
        check_checkpoint_matches(info, source, app_id, last)
        ckpt_records, ckpt_doc = checkpoint_records(info)
    dest = open_log(to)
    if not is_empty(dest.store):
        raise SavepointError(
            f"the savepoint destination {dest.location} is not empty: give a new, empty "
            "location (savepoints are never overwritten or merged)"
        )
    for key, data in (*records, *ckpt_records):
        create_exact(dest.store, key, data, "savepoint")

    manifest = {
        "format": SAVEPOINT_FORMAT,
        "version": SAVEPOINT_VERSION,
        "app_id": app_id,
        "log_format_version": meta.get("version"),
        "source_log": source.location,
        "last_committed": last,
        "epochs": epochs,
        "sinks": sinks,
        "created_at": time.time(),
        "txsink_version": __version__,
        "records": [entry(key, data) for key, data in records],
        "checkpoint": ckpt_doc,
    }
    create_exact(dest.store, MANIFEST, dumps_record(manifest), "savepoint")
    return read_savepoint(dest)


def _meta(log: TxLog) -> dict[str, Any]:
    try:
        meta = log.meta()
    except LogError as err:
        raise SavepointError(f"cannot save the txsink log: {err.message}") from err
    if meta is None:  # pragma: no cover - checked by the caller
        raise SavepointError(f"no txsink log at {log.location}")
    return meta


# -- read and verify ------------------------------------------------------------------------


def read_savepoint(savepoint: LogLike) -> Savepoint:
    """Read and verify a savepoint: manifest present and readable, every record intact.

    Raises:
        SavepointError: no manifest (incomplete copy, or not a savepoint), a format version
            this txsink cannot read, a record missing or different from the manifest.
    """
    sp = open_log(savepoint)
    manifest = verify_manifest(sp.store, sp.location)
    return Savepoint(
        location=sp.location,
        app_id=str(manifest["app_id"]),
        last_committed=manifest.get("last_committed"),
        epochs=tuple(manifest.get("epochs", ())),
        sinks=tuple(manifest.get("sinks", ())),
        records=tuple(manifest["records"]),
        checkpoint_files=checkpoint_entries(manifest),
        manifest=manifest,
    )


# -- restore --------------------------------------------------------------------------------


def restore_savepoint(
    savepoint: LogLike, log: LogLike, *, checkpoint: str | os.PathLike[str] | None = None
) -> RestoreReport:
    """Copy a verified savepoint into an empty log location (and its checkpoint copy).

    Idempotent: a log that already holds this savepoint (or a part of it, left by a
    restore cut short) is completed, not refused. Any other content is refused.

    Order, for safety if the restore is cut short and a query is started anyway: the meta
    record first, then epochs from the newest down, each epoch's committed mark before its
    decision, so a partial log already knows the last committed epoch (a replay of it is
    skipped, never written twice) and never shows a decided-but-uncommitted epoch. The
    checkpoint comes after the whole log: a restored checkpoint next to a partial log
    could replay a committed epoch into it.

    ``checkpoint``: an empty (or missing) local directory to receive the savepoint's copy
    of the Spark checkpoint; it appears whole (copied aside, then renamed into place).
    """
    source = open_log(savepoint)
    sp = read_savepoint(source)
    target = open_log(log)
    records = restore_order(sp.records, source.store, sp.location)
    wanted = {key: data for key, data in records}
    present = log_keys(target.store)
    foreign = []
    for key in present:
        if key == RESTORED_MARKER:
            continue
        if key not in wanted or target.store.read(key) != wanted[key]:
            foreign.append(key)
    if foreign:
        raise SavepointError(
            f"cannot restore the savepoint {sp.location} into {target.location}: that log "
            f"location is not empty and does not hold this savepoint ({len(foreign)} other "
            f"record(s), e.g. {foreign[0]}). Restore into a new, empty location; to use the "
            "log that is there, start the pipeline without restoring"
        )
    already = RESTORED_MARKER in present and set(wanted) <= set(present)
    written = 0
    for key, data in records:
        if key not in present:
            written += create_exact(target.store, key, data, "restore")
    if RESTORED_MARKER not in present:
        marker = {
            "version": 1,
            "savepoint": sp.location,
            "app_id": sp.app_id,
            "last_committed": sp.last_committed,
            "restored_at": time.time(),
        }
        target.store.create(RESTORED_MARKER, dumps_record(marker))
    report = RestoreReport(
        log=target.location,
        app_id=sp.app_id,
        last_committed=sp.last_committed,
        records_written=written,
        already=already,
    )
    if checkpoint is None:
        return report
    if not sp.has_checkpoint:
        raise SavepointError(
            f"the savepoint at {sp.location} holds no Spark checkpoint (it was taken without "
            "--checkpoint): restore the log only, and start the query with its own "
            "checkpoint directory"
        )
    files = restore_checkpoint(sp.checkpoint_files, source.store, Path(checkpoint), sp.location)
    return dataclasses.replace(report, checkpoint=str(checkpoint), checkpoint_files=files)


def restore_if_empty(savepoint: LogLike, log: LogLike) -> bool:
    """For ``Coordinator(from_savepoint=...)``: restore into ``log`` unless it is in use.

    Returns True if this call restored (or completed a restore cut short). A log that
    holds records of the savepoint's app and has moved on since is left alone; a log of
    another app is refused.
    """
    source = open_log(savepoint)
    target = open_log(log)
    present = log_keys(target.store)
    if not present:
        restore_savepoint(source, target)
        return True
    if RESTORED_MARKER in present:
        return False
    sp = read_savepoint(source)
    meta = target.meta()
    if meta is not None and meta.get("app_id") != sp.app_id:
        raise SavepointError(
            f"from_savepoint={sp.location} is of app {sp.app_id!r}, but the txsink log at "
            f"{target.location} already holds app {meta.get('app_id')!r}: use an empty log "
            "location to restore into"
        )
    wanted = {str(e["key"]): str(e["sha256"]) for e in sp.records}
    partial = all(
        key in wanted and sha(target.store.read(key) or b"") == wanted[key] for key in present
    )
    if partial:  # a restore cut short: finish it
        restore_savepoint(source, target)
        return True
    return False
