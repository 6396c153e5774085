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
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink.errors import LogError, SavepointError
from txsink.log import FileStore, LogStore, TxLog, open_log

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

SAVEPOINT_FORMAT = "txsink-savepoint"
SAVEPOINT_VERSION = 1
MANIFEST = "savepoint.json"
CHECKPOINT_PREFIX = "spark-checkpoint/"
#: Written into a restored log last: the restore is complete.
RESTORED_MARKER = "restored-from-savepoint.json"
#: Key prefixes a txsink log (or a savepoint) may hold; FileStore.list needs a prefix.
_PREFIXES = ("epochs/", "upgrades/", CHECKPOINT_PREFIX)
_ROOT_KEYS = ("meta.json", MANIFEST, RESTORED_MARKER)

LogLike = str | os.PathLike[str] | LogStore | TxLog


# -- what a savepoint says ------------------------------------------------------------------


@dataclass(frozen=True)
class CheckpointInfo:
    """What a Spark checkpoint directory says about the query (see :func:`inspect_checkpoint`).

    ``next_batch`` is the batch Spark runs first when the query starts from it: the last
    planned batch again if Spark did not finish it (``commits/`` one behind ``offsets/``),
    else the one after.
    """

    path: str
    query_id: str | None
    last_offsets: int | None
    last_commit: int | None

    @property
    def next_batch(self) -> int:
        if self.last_offsets is None:
            return 0
        if self.last_commit is None or self.last_commit < self.last_offsets:
            return self.last_offsets
        return self.last_offsets + 1


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
    source = _as_log(log)
    meta_raw = source.store.read("meta.json")
    if meta_raw is None:
        raise SavepointError(
            f"no txsink log at {source.location} (no meta.json): nothing to save; check the "
            "--log location"
        )
    meta = _meta(source)
    app_id = str(meta["app_id"])
    _refuse_unfinished_rename(source)
    records, epochs, sinks = _canonical_records(source, meta_raw)
    last = source.last_committed()
    ckpt_files: list[tuple[str, bytes]] = []
    ckpt_doc: dict[str, Any] | None = None
    if checkpoint is not None:
        info = inspect_checkpoint(checkpoint)
        _check_checkpoint_matches(info, source, app_id, last)
        ckpt_files = list(_read_tree(Path(info.path)))
        ckpt_doc = {
            "source": info.path,
            "query_id": info.query_id,
            "last_offsets": info.last_offsets,
            "last_commit": info.last_commit,
            "next_batch": info.next_batch,
            "files": [_entry(CHECKPOINT_PREFIX + rel, data) for rel, data in ckpt_files],
        }
    dest = _as_log(to)
    if not _is_empty(dest.store):
        raise SavepointError(
            f"the savepoint destination {dest.location} is not empty: give a new, empty "
            "location (savepoints are never overwritten or merged)"
        )
    for key, data in records:
        _create_exact(dest.store, key, data, "savepoint")
    for rel, data in ckpt_files:
        _create_exact(dest.store, CHECKPOINT_PREFIX + rel, data, "savepoint")
    from txsink import __version__

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
        "records": [_entry(key, data) for key, data in records],
        "checkpoint": ckpt_doc,
    }
    _create_exact(dest.store, MANIFEST, _dumps(manifest), "savepoint")
    return read_savepoint(dest)


def _canonical_records(
    log: TxLog, meta_raw: bytes
) -> tuple[list[tuple[str, bytes]], list[int], list[str]]:
    """The records that describe the committed history; refuses unfinished epochs."""
    decided: list[int] = []
    open_: list[str] = []
    records: list[tuple[str, bytes]] = [("meta.json", meta_raw)]
    epochs: list[int] = []
    sinks: set[str] = set()
    for state in log.states():
        prefix = f"epochs/{state.epoch:020d}/"
        if state.committed is not None:
            keys = [f"{prefix}committed.json"]
            if state.decision is not None:
                keys.insert(0, f"{prefix}decision-{state.decision.round:06d}.json")
                sinks.update(state.decision.handles)
            epochs.append(state.epoch)
        elif state.decision is not None:
            decided.append(state.epoch)
            continue
        else:
            live = sorted(set(state.rounds) - set(state.voided))
            if live:
                open_.append(_describe_claim(log, state.epoch, live[0]))
                continue
            # Aborted: every round voided. Keep claims and voids (see the module doc).
            keys = [
                k
                for k in log.store.list(prefix)
                if k.rsplit("/", 1)[1].startswith(("claim-", "decision-"))
            ]
        for key in keys:
            data = log.store.read(key)
            if data is None:
                raise SavepointError(
                    f"txsink log record {key} at {log.location} vanished while the savepoint "
                    "was taken: is a query (or a prune) running? Stop it and try again"
                )
            records.append((key, data))
    if decided:
        raise SavepointError(
            f"the txsink log at {log.location} has epoch(s) {decided} decided but not yet "
            "committed, so it is not at a fully committed epoch: restart the query so its "
            "recovery finishes them (or run `txsink recover`), stop it, then take the "
            "savepoint",
            epoch=decided[0],
        )
    if open_:
        raise SavepointError(
            f"the txsink log at {log.location} has open epoch(s) (claimed, neither decided "
            f"nor voided): {'; '.join(open_)}. A query may be running: stop it first. If it "
            "crashed during that epoch's pre-commit, restart it once (its recovery voids "
            "the round) and stop it, then take the savepoint"
        )
    return records, epochs, sorted(sinks)


def _describe_claim(log: TxLog, epoch: int, round_: int) -> str:
    raw = log.store.read(f"epochs/{epoch:020d}/claim-{round_:06d}.json")
    doc: dict[str, Any] = {}
    if raw is not None:
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = {}
    who = f"host {doc.get('host', '?')} pid {doc.get('pid', '?')}"
    return f"epoch {epoch} round {round_} claimed by {who}"


def _refuse_unfinished_rename(log: TxLog) -> None:
    pending = log.store.list("upgrades/")
    if pending:
        raise SavepointError(
            f"the txsink log at {log.location} has an unfinished state upgrade ({pending[0]}): "
            "run the same `txsink state rename-uid` command again to finish it, then take "
            "the savepoint"
        )


# -- Spark checkpoint -----------------------------------------------------------------------


def inspect_checkpoint(path: str | os.PathLike[str]) -> CheckpointInfo:
    """Read the query id and the last planned and finished batch of a Spark checkpoint."""
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if "://" in text:
        raise SavepointError(
            f"Spark checkpoint {text!r}: only a local or mounted path can be copied here. "
            "Copy a checkpoint on HDFS or an object store yourself while the query is "
            "stopped (hadoop distcp, or your object store's own copy tool), and take the "
            "savepoint without --checkpoint"
        )
    root = Path(text).absolute()
    if not (root / "metadata").is_file():
        raise SavepointError(
            f"{root} is not a Spark checkpoint directory (no 'metadata' file): give the "
            "query's checkpointLocation"
        )
    query_id: str | None = None
    try:
        first = (root / "metadata").read_text().splitlines()[0]
        query_id = str(json.loads(first)["id"])
    except (IndexError, KeyError, ValueError) as err:
        raise SavepointError(f"cannot read the query id from {root / 'metadata'}: {err}") from err
    return CheckpointInfo(
        str(root), query_id, _last_batch(root / "offsets"), _last_batch(root / "commits")
    )


def _last_batch(folder: Path) -> int | None:
    if not folder.is_dir():
        return None
    batches = [int(name) for name in os.listdir(folder) if name.isdigit()]
    return max(batches) if batches else None


def _check_checkpoint_matches(
    info: CheckpointInfo, log: TxLog, app_id: str, last: int | None
) -> None:
    """Refuse a checkpoint that would not continue this log exactly once."""
    if info.query_id != app_id:
        raise SavepointError(
            f"the Spark checkpoint {info.path} belongs to query {info.query_id!r}, but the "
            f"txsink log at {log.location} to app {app_id!r}: they are not the same pipeline's "
            "state. Give the checkpointLocation of the query that writes this log (if your "
            "pipeline passes app_id= explicitly, copy its checkpoint yourself and take the "
            "savepoint without --checkpoint)"
        )
    nxt = info.next_batch
    if last is None:
        if nxt > 0:
            raise SavepointError(
                f"Spark finished batches up to {info.last_commit} in {info.path}, but the "
                f"txsink log at {log.location} has no committed epoch: those batches were not "
                "written through this log. Give the log the query writes with"
            )
        return
    if nxt < last:
        raise SavepointError(
            f"the Spark checkpoint {info.path} would restart at batch {nxt} (offsets up to "
            f"{info.last_offsets}, commits up to {info.last_commit}), but the txsink log at "
            f"{log.location} already committed epoch {last}: the checkpoint is older than the "
            "log and cannot replay that far (a restart would fail with "
            "CheckpointMismatchError). Use the checkpoint directory the query last ran with, "
            "copied after the query stopped"
        )
    if nxt > last + 1:
        raise SavepointError(
            f"the Spark checkpoint {info.path} has finished batches up to {info.last_commit}, "
            f"but the txsink log at {log.location} committed only up to epoch {last}: batches "
            f"{last + 1}..{nxt - 1} were not written through this log (another log, or a "
            "checkpoint of another run). Give the matching log and checkpoint"
        )


def _read_tree(root: Path) -> Iterator[tuple[str, bytes]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            full = Path(dirpath, name)
            yield full.relative_to(root).as_posix(), full.read_bytes()


# -- read and verify ------------------------------------------------------------------------


def read_savepoint(savepoint: LogLike) -> Savepoint:
    """Read and verify a savepoint: manifest present and readable, every record intact.

    Raises:
        SavepointError: no manifest (incomplete copy, or not a savepoint), a format version
            this txsink cannot read, a record missing or different from the manifest.
    """
    sp = _as_log(savepoint)
    raw = sp.store.read(MANIFEST)
    if raw is None:
        hint = (
            " (it holds log records: an incomplete savepoint, cut short before its manifest "
            "was written; take it again)"
            if sp.store.read("meta.json") is not None
            else ""
        )
        raise SavepointError(f"no savepoint at {sp.location}: no {MANIFEST}{hint}")
    try:
        manifest = json.loads(raw)
    except ValueError as err:
        raise SavepointError(
            f"the savepoint manifest {MANIFEST} at {sp.location} is not JSON ({err}): the "
            "savepoint is incomplete or damaged; take it again"
        ) from err
    if not isinstance(manifest, dict) or manifest.get("format") != SAVEPOINT_FORMAT:
        raise SavepointError(
            f"{sp.location}/{MANIFEST} is not a txsink savepoint manifest (format "
            f"{manifest.get('format') if isinstance(manifest, dict) else None!r})"
        )
    version = manifest.get("version")
    if version != SAVEPOINT_VERSION:
        raise SavepointError(
            f"the savepoint at {sp.location} has format version {version!r}, written by txsink "
            f"{manifest.get('txsink_version')!r}; this txsink reads savepoint version "
            f"{SAVEPOINT_VERSION} only: restore it with that txsink version (or newer)"
        )
    from txsink.log import LOG_FORMAT_VERSION

    log_version = manifest.get("log_format_version")
    if type(log_version) is not int or not 1 <= log_version <= LOG_FORMAT_VERSION:
        raise SavepointError(
            f"the savepoint at {sp.location} holds a txsink log of format version "
            f"{log_version!r} (written by txsink {manifest.get('txsink_version')!r}); this "
            f"txsink reads log format versions 1 to {LOG_FORMAT_VERSION}: restore it with "
            "that txsink release (or newer)"
        )
    ckpt = manifest.get("checkpoint") or {}
    files = tuple(ckpt.get("files", ()))
    problems = [
        p for entry in (*manifest["records"], *files) if (p := _check_entry(sp.store, entry))
    ]
    if problems:
        raise SavepointError(
            f"the savepoint at {sp.location} is incomplete or damaged: {len(problems)} of its "
            f"records fail the manifest's check ({'; '.join(problems[:3])}). Take the "
            "savepoint again from the log (or use another copy of it)"
        )
    return Savepoint(
        location=sp.location,
        app_id=str(manifest["app_id"]),
        last_committed=manifest.get("last_committed"),
        epochs=tuple(manifest.get("epochs", ())),
        sinks=tuple(manifest.get("sinks", ())),
        records=tuple(manifest["records"]),
        checkpoint_files=files,
        manifest=manifest,
    )


def _check_entry(store: LogStore, entry: dict[str, Any]) -> str | None:
    data = store.read(entry["key"])
    if data is None:
        return f"{entry['key']} is missing"
    if len(data) != entry["bytes"] or _sha(data) != entry["sha256"]:
        return f"{entry['key']} differs ({len(data)} bytes, expected {entry['bytes']})"
    return None


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
    source = _as_log(savepoint)
    sp = read_savepoint(source)
    target = _as_log(log)
    records = _ordered(sp, source.store)
    wanted = {key: data for key, data in records}
    present = _log_keys(target.store)
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
            written += _create_exact(target.store, key, data, "restore")
    if RESTORED_MARKER not in present:
        marker = {
            "version": 1,
            "savepoint": sp.location,
            "app_id": sp.app_id,
            "last_committed": sp.last_committed,
            "restored_at": time.time(),
        }
        target.store.create(RESTORED_MARKER, _dumps(marker))
    report = RestoreReport(
        log=target.location,
        app_id=sp.app_id,
        last_committed=sp.last_committed,
        records_written=written,
        already=already,
    )
    if checkpoint is None:
        return report
    files = _restore_checkpoint(sp, source.store, Path(checkpoint))
    return dataclasses.replace(report, checkpoint=str(checkpoint), checkpoint_files=files)


def _ordered(sp: Savepoint, store: LogStore) -> list[tuple[str, bytes]]:
    """Records in restore order (see :func:`restore_savepoint`), read from the savepoint."""

    def rank(key: str) -> tuple[int, int, int, str]:
        if key == "meta.json":
            return (0, 0, 0, key)
        epoch = int(key.split("/")[1])
        name = key.rsplit("/", 1)[1]
        kind = 0 if name == "committed.json" else 1 if name.startswith("claim-") else 2
        return (1, -epoch, kind, name)

    out = []
    for entry in sorted(sp.records, key=lambda e: rank(str(e["key"]))):
        data = store.read(entry["key"])
        if data is None or _sha(data) != entry["sha256"]:
            raise SavepointError(
                f"savepoint record {entry['key']} at {sp.location} changed during the restore"
            )
        out.append((str(entry["key"]), data))
    return out


def _restore_checkpoint(sp: Savepoint, store: LogStore, dest: Path) -> int:
    if not sp.has_checkpoint:
        raise SavepointError(
            f"the savepoint at {sp.location} holds no Spark checkpoint (it was taken without "
            "--checkpoint): restore the log only, and start the query with its own "
            "checkpoint directory"
        )
    files = {str(e["key"])[len(CHECKPOINT_PREFIX) :]: e for e in sp.checkpoint_files}
    if dest.exists() and any(dest.iterdir()):
        have = {rel: data for rel, data in _read_tree(dest)}
        same = set(have) == set(files) and all(
            _sha(have[rel]) == files[rel]["sha256"] for rel in files
        )
        if same:
            return 0
        raise SavepointError(
            f"the checkpoint directory {dest} is not empty: restore the Spark checkpoint into "
            "a new, empty directory (and point the query's checkpointLocation at it)"
        )
    tmp = dest.parent / f".{dest.name}.restoring-{uuid.uuid4().hex[:8]}"
    try:
        for rel, entry in files.items():
            data = store.read(str(entry["key"]))
            if data is None or _sha(data) != entry["sha256"]:
                raise SavepointError(
                    f"savepoint record {entry['key']} at {sp.location} is missing or changed"
                )
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        tmp.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.rmdir()  # empty (checked above); rename needs the name free
        os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(files)


def restore_if_empty(savepoint: LogLike, log: LogLike) -> bool:
    """For ``Coordinator(from_savepoint=...)``: restore into ``log`` unless it is in use.

    Returns True if this call restored (or completed a restore cut short). A log that
    holds records of the savepoint's app and has moved on since is left alone; a log of
    another app is refused.
    """
    source = _as_log(savepoint)
    target = _as_log(log)
    present = _log_keys(target.store)
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
        key in wanted and _sha(target.store.read(key) or b"") == wanted[key] for key in present
    )
    if partial:  # a restore cut short: finish it
        restore_savepoint(source, target)
        return True
    return False


# -- helpers --------------------------------------------------------------------------------


def _as_log(where: LogLike) -> TxLog:
    return open_log(where)


def _meta(log: TxLog) -> dict[str, Any]:
    try:
        meta = log.meta()
    except LogError as err:
        raise SavepointError(f"cannot save the txsink log: {err.message}") from err
    if meta is None:  # pragma: no cover - checked by the caller
        raise SavepointError(f"no txsink log at {log.location}")
    return meta


def _log_keys(store: LogStore) -> list[str]:
    keys = [key for key in _ROOT_KEYS if store.read(key) is not None]
    for prefix in _PREFIXES:
        keys.extend(store.list(prefix))
    return keys


def _is_empty(store: LogStore) -> bool:
    if isinstance(store, FileStore):
        return not store.root.exists() or not any(store.root.iterdir())
    return not _log_keys(store)


def _create_exact(store: LogStore, key: str, data: bytes, what: str) -> int:
    """Create ``key``; an existing record must hold exactly ``data``. 1 if created."""
    if store.create(key, data):
        return 1
    if store.read(key) != data:
        raise SavepointError(
            f"{what}: {store.location}/{key} was written by someone else meanwhile (another "
            f"{what} or a running query into the same location): use a location nobody else "
            "writes to"
        )
    return 0


def _entry(key: str, data: bytes) -> dict[str, Any]:
    return {"key": key, "bytes": len(data), "sha256": _sha(data)}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _dumps(doc: dict[str, Any]) -> bytes:
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
