"""The Delta sink's audit (:meth:`~txsink.contract.SinkContract.audit`): what the table's
own log and files hold for the requested epochs.

Metadata level (the default):

1. Open the table's current version (its snapshot: the live files, ``get_add_actions``).
2. Read the log's JSON entries backwards from the current version until one carries our
   ``txn`` (``txsink.<app>.<uid>``) for an epoch before the first one asked (or the log's
   start, or an entry cleaned up after a checkpoint): the cost is the versions since the
   oldest audited epoch, not the table.
3. Per epoch: the version whose entry carries the epoch's ``txn`` (two of them: committed
   twice), its ``add`` actions against the decided handles' files, their
   ``stats.numRecords`` summed over the files the current version still holds (a file
   removed since is named with the version and operation that removed it), and each such
   file's size in storage (a HEAD / stat, no read).
4. Extras: live files named by this app and sink uid for an epoch of the range that no
   decision names; files of ours added by a commit that is not ours; a commit of ours for
   an epoch whose decision has no files of this sink.

Deep level: also reads the epoch's live files (only those), puts back the partition
columns from the ``add`` actions' values (cast to the table's types), keeps the columns the
evidence names (a column added later by schema evolution is not in an older epoch's
digest) and digests them (:func:`~txsink.audit.digest.digest_rows`).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from txsink.audit.digest import digest_rows
from txsink.audit.found import AuditRequest, EpochFound, EpochToAudit, Extra, TargetAudit
from txsink.connectors.delta import naming
from txsink.connectors.delta.commit import app_txn_id
from txsink.connectors.delta.errors import describe
from txsink.connectors.delta.handles import DeltaFile, DeltaHandle
from txsink.connectors.delta.storage import LOG_FOLDER, Storage
from txsink.errors import RetryableError

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["LogEntry", "audit_table", "read_entry"]


@dataclass
class LogEntry:
    """One version of the Delta log, as far as the audit reads it."""

    version: int
    operation: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    txn: int | None = None  # the version our app id records in this entry
    adds: dict[str, dict[str, Any]] = field(default_factory=dict)  # stored path -> add
    removes: set[str] = field(default_factory=set)
    #: removed with ``dataChange: false``: the rows rearranged, not changed (OPTIMIZE)
    rearranged: set[str] = field(default_factory=set)

    @property
    def what(self) -> str:
        """The operation, for a reader: ``DELETE (predicate: id < 3)``."""
        shown = {k: v for k, v in self.parameters.items() if k in ("predicate", "mode")}
        more = ", ".join(f"{k}: {v}" for k, v in shown.items())
        return f"{self.operation or 'unknown'}" + (f" ({more})" if more else "")


def read_entry(storage: Storage, version: int, app_id: str) -> LogEntry | None:
    """The actions of ``_delta_log/<version>.json`` (None: no such entry, cleaned up or
    never written), read as a file: the table's own record, not delta-rs' replay."""
    fs, root = storage.filesystem()
    try:
        with fs.open_input_stream(f"{root}/{LOG_FOLDER}/{version:020d}.json") as f:
            text = f.read().decode()
    except FileNotFoundError:
        return None
    entry = LogEntry(version)
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
            entry.operation = str(info.get("operation", ""))
            entry.parameters = dict(info.get("operationParameters") or {})
        elif "txn" in action and action["txn"].get("appId") == app_id:
            entry.txn = int(action["txn"]["version"])
        elif "add" in action:
            entry.adds[urllib.parse.unquote(action["add"]["path"])] = action["add"]
        elif "remove" in action:
            path = urllib.parse.unquote(action["remove"]["path"])
            entry.removes.add(path)
            if action["remove"].get("dataChange") is False:
                entry.rearranged.add(path)
    return entry


def _records(add: Mapping[str, Any]) -> int | None:
    """An add action's ``stats.numRecords`` (None: no statistics)."""
    try:
        value = json.loads(add.get("stats") or "{}").get("numRecords")
    except ValueError:
        return None
    return None if value is None else int(value)


@dataclass
class _Walk:
    """The log entries read, newest first, and why the reading stopped."""

    entries: list[LogEntry]
    complete: bool  # reached an entry of ours before the range, or version 0
    oldest: int  # the oldest version read

    def of_epoch(self, epoch: int) -> list[LogEntry]:
        """The entries carrying our ``txn`` for ``epoch``, oldest first."""
        return sorted((e for e in self.entries if e.txn == epoch), key=lambda e: e.version)

    def removal(self, path: str, after: int) -> LogEntry | None:
        """The first entry after version ``after`` that removes ``path``."""
        later = sorted((e for e in self.entries if e.version > after), key=lambda e: e.version)
        return next((e for e in later if path in e.removes), None)


def _walk(storage: Storage, current: int, app_id: str, first: int, ctx: Mapping[str, Any]) -> _Walk:
    entries: list[LogEntry] = []
    for version in range(current, -1, -1):
        try:
            entry = read_entry(storage, version, app_id)
        except OSError as err:
            raise RetryableError(
                f"cannot read version {version} of the Delta log of {storage.uri}: "
                f"{describe(err)}. Check that the storage is reachable and the credentials",
                **ctx,
            ) from err
        if entry is None:
            return _Walk(entries, False, version + 1)
        entries.append(entry)
        if entry.txn is not None and entry.txn < first:
            return _Walk(entries, True, version)
    return _Walk(entries, True, 0)


def _live(table: DeltaTable) -> dict[str, int | None]:
    """The current version's files (stored path) and their record counts."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = actions.column("path").to_pylist()
    counts = (
        actions.column("num_records").to_pylist()
        if "num_records" in actions.column_names
        else [None] * len(paths)
    )
    return {
        urllib.parse.unquote(p): (None if n is None else int(n))
        for p, n in zip(paths, counts, strict=True)
    }


@dataclass
class _Audit:
    """One audit of one table: what was read, and the answer being built."""

    request: AuditRequest
    uid: str
    storage: Storage
    walk: _Walk
    live: Mapping[str, int | None]  # the current version's files and their record counts
    schema: pa.Schema  # the table's, now
    answer: TargetAudit = field(default_factory=TargetAudit)
    reported: set[str] = field(default_factory=set)  # files already named as extras

    @property
    def txn_id(self) -> str:
        return app_txn_id(self.request.app_id, self.uid)

    def add_extra(self, what: str, epoch: int, rows: int | None, path: str = "") -> None:
        self.answer.extras.append(Extra(what, epoch, rows))
        if path:
            self.reported.add(path)


def audit_table(
    request: AuditRequest,
    *,
    uid: str,
    storage: Storage,
    open_table: Callable[[], DeltaTable],
    ctx: Mapping[str, Any],
) -> TargetAudit:
    """The audit of one Delta sink's table (see the module's docstring); read-only."""
    table = open_table()
    try:
        return _read(request, uid, storage, table, ctx)
    except OSError as err:
        raise RetryableError(
            f"cannot read the Delta table at {storage.uri} for the audit: {describe(err)}. "
            "Check that the storage is reachable and the storage options' credentials",
            **ctx,
        ) from err


def _read(
    request: AuditRequest,
    uid: str,
    storage: Storage,
    table: DeltaTable,
    ctx: Mapping[str, Any],
) -> TargetAudit:
    walk = _walk(storage, int(table.version()), app_txn_id(request.app_id, uid), request.first, ctx)
    run = _Audit(request, uid, storage, walk, _live(table), pa.schema(table.schema().to_arrow()))
    for epoch in request.epochs:
        if epoch.handles:
            run.answer.epochs[epoch.epoch] = _epoch(run, epoch)
            continue
        for entry in walk.of_epoch(epoch.epoch):
            run.add_extra(
                f"version {entry.version} commits epoch {epoch.epoch} (txn {run.txn_id}), "
                "whose decision names no file of this sink",
                epoch.epoch,
                sum(_records(a) or 0 for a in entry.adds.values()),
            )
    asked = {e.epoch for e in request.epochs}
    for entry in walk.entries:
        txn = entry.txn
        if txn is not None and request.first <= txn <= request.last and txn not in asked:
            run.answer.notes.append(
                f"version {entry.version} commits epoch {txn}, which the txsink log does not "
                "record as committed: not audited (a commit under way, or one no decision "
                "made: audit it again once the log commits it)"
            )
    _extras(run)
    run.answer.notes += _notes(walk, run.txn_id, request.deep)
    return run.answer


def _files(handle: Any) -> tuple[DeltaFile, ...]:
    return handle.files if isinstance(handle, DeltaHandle) else ()


def _epoch(run: _Audit, epoch: EpochToAudit) -> EpochFound:
    """What the table holds for one epoch with files (see the module's step 3)."""
    e, walk, live, txn_id = epoch.epoch, run.walk, run.live, run.txn_id
    files = {f.path: f for h in epoch.handles for f in _files(h)}
    found = EpochFound(rows=0)
    commits = walk.of_epoch(e)
    entry = commits[0] if commits else None
    if len(commits) > 1:
        versions = ", ".join(str(c.version) for c in commits)
        found.problems.append(f"epoch {e} is committed {len(commits)} times: versions {versions}")
    if entry is None and walk.complete:
        found.problems.append(
            f"no version of the Delta log records epoch {e} (txn {txn_id}, version {e}): the "
            "table does not hold its commit (restored from an older copy, or re-created?)"
        )
    elif entry is None:
        run.answer.notes.append(
            f"epoch {e}: its log entry is before version {walk.oldest}, the oldest the log "
            "still holds (log cleanup after a checkpoint); its files were checked against the "
            "current version only"
        )
    if entry is not None:
        for path in sorted(set(files) - set(entry.adds)):
            found.problems.append(f"file {path} of the decision is not in version {entry.version}")
        for path in sorted(set(entry.adds) - set(files)):
            run.add_extra(
                f"data file {path}, committed with epoch {e} in version {entry.version}, "
                "is named by no decision",
                e,
                _records(entry.adds[path]),
                path,
            )
    counted = 0
    compacted: list[str] = []
    readable: list[tuple[str, Mapping[str, str | None]]] = []  # path, partition values
    for path, f in sorted(files.items()):
        add = entry.adds.get(path) if entry is not None else None
        if entry is not None and add is None:
            continue  # not committed with the epoch: named above
        records = _records(add) if add is not None else live.get(path)
        if path not in live:
            gone = walk.removal(path, entry.version if entry is not None else -1)
            if gone is not None and path in gone.rearranged:  # the table says: same rows
                changed = _changed_since(walk, gone, live)
                if changed is None:
                    counted += records if records is not None else f.rows
                    compacted.append(f"{path} (version {gone.version}, {gone.what})")
                    continue
                n = records if records is not None else f.rows
                found.problems.append(
                    f"{n} rows of epoch {e} were compacted at version {gone.version} into "
                    f"files changed since: {changed}"
                )
                continue
            by = f"at version {gone.version} (operation {gone.what})" if gone else "from the table"
            n = records if records is not None else f.rows
            found.problems.append(f"{n} rows of epoch {e} removed {by}: file {path}")
            continue
        now = live[path]
        if now is not None and records is not None and now != records:
            found.problems.append(
                f"file {path} of epoch {e} holds {now} records in the current version, "
                f"{records} when committed (rows deleted by a deletion vector?)"
            )
            records = now
        counted += records if records is not None else f.rows
        size = run.storage.size(path)
        if size is None:
            found.problems.append(
                f"data file {path} of epoch {e} is gone from storage, and the table's current "
                "version still adds it: readers of the table fail on it"
            )
            continue
        if size != f.size:
            found.problems.append(
                f"data file {path} of epoch {e} has {size} bytes, the decision {f.size}"
            )
        # Deep reads what the table holds, changed or not; the partition values the log has.
        readable.append((path, add["partitionValues"] if add is not None else dict(f.partition)))
    found.rows = counted
    where = f"version {entry.version}" if entry is not None else "the current version"
    found.how = f"{where}'s add actions (numRecords) and {len(files)} file(s) sized"
    if compacted:  # counted as the log says (dataChange false); no longer readable per epoch
        run.answer.notes.append(
            f"epoch {e}: file(s) rewritten without a data change (the Delta log's dataChange "
            f"false), counted as committed, not read by --deep: {'; '.join(compacted)}"
        )
        found.how += "; compacted since: not read"
    elif run.request.deep:
        _deep(epoch, readable, run.storage, run.schema, found)
    return found


def _changed_since(walk: _Walk, compaction: LogEntry, live: Mapping[str, Any]) -> str | None:
    """Whether the files ``compaction`` wrote (all rearranged rows, ``dataChange`` false)
    were changed since: a file of them gone with a data change, named; ``None``: every one
    is live, or was itself only rearranged again (followed)."""
    pending = [(p, compaction) for p in compaction.adds]
    seen: set[str] = set()
    while pending:
        path, added = pending.pop()
        if path in live or path in seen:
            continue
        seen.add(path)
        gone = walk.removal(path, added.version)
        if gone is None:
            return f"file {path} is gone from the table"
        if path not in gone.rearranged:
            return f"file {path} removed at version {gone.version} (operation {gone.what})"
        pending += [(p, gone) for p in gone.adds]
    return None


def _deep(
    epoch: EpochToAudit,
    files: Iterable[tuple[str, Mapping[str, str | None]]],
    storage: Storage,
    schema: pa.Schema,
    found: EpochFound,
) -> None:
    """Read the epoch's files, digest the evidence's columns, count the rows read."""
    expected = epoch.expected
    fs, root = storage.filesystem()
    batches: list[pa.Table] = []
    for path, partition in files:
        try:
            data = _with_partitions(
                pq.read_table(f"{root}/{path}", filesystem=fs), partition, schema
            )
        except (OSError, pa.ArrowException) as err:
            found.problems.append(f"data file {path} of epoch {epoch.epoch} cannot be read: {err}")
            continue
        if expected is not None:
            data = data.select([c for c in data.column_names if c in expected.cols])
        batches.append(data)
    digest = digest_rows(batches)
    read = sum(b.num_rows for b in batches)
    if found.rows is not None and read != found.rows and not found.problems:
        found.problems.append(
            f"the files of epoch {epoch.epoch} hold {read} rows, their add actions say {found.rows}"
        )
    found.rows, found.digest = read, digest
    found.how += f"; deep: read {len(batches)} file(s)"


def _with_partitions(
    data: pa.Table, partition: Mapping[str, str | None], schema: pa.Schema
) -> pa.Table:
    """``data`` with the file's partition columns (Hive layout: not in the file), each
    value cast from the log's text to the table's type."""
    for column, value in partition.items():
        typ = schema.field(column).type if column in schema.names else pa.string()
        text = pa.array([value] * data.num_rows, pa.string())
        data = data.append_column(column, text.cast(typ))
    return data


def _extras(run: _Audit) -> None:
    """Files of ours (by name) for an epoch of the range that no decision names: added by
    a commit that is not ours, or live in the table."""
    request = run.request
    named = run.reported | {f.path for e in request.epochs for h in e.handles for f in _files(h)}

    def ours(path: str) -> int | None:
        txn = naming.parse(path)
        if txn is None or txn.app != request.app_id or txn.uid != run.uid:
            return None
        return txn.epoch if request.first <= txn.epoch <= request.last else None

    for entry in sorted(run.walk.entries, key=lambda x: x.version):
        if entry.txn is not None:
            continue  # ours: checked per epoch
        for path, add in sorted(entry.adds.items()):
            e = ours(path)
            if e is not None and path not in named:
                named.add(path)
                run.add_extra(
                    f"data file {path}, named as epoch {e}'s, added at version "
                    f"{entry.version} by another writer (operation {entry.what})",
                    e,
                    _records(add),
                )
    for path, records in sorted(run.live.items()):
        e = ours(path)
        if e is not None and path not in named:
            run.add_extra(
                f"data file {path}, named as epoch {e}'s, is in the table and in no decision",
                e,
                records,
            )


def _notes(walk: _Walk, txn_id: str, deep: bool) -> list[str]:
    others = [e for e in walk.entries if e.txn is None and e.operation != "CREATE TABLE"]
    notes = []
    if others:
        ops = sorted({e.operation or "unknown" for e in others})
        notes.append(
            f"{len(others)} commit(s) in the versions read are not txsink's ({txn_id}): "
            f"{', '.join(ops)}"
        )
    notes.append(
        "rows other writers add in files not named by txsink (write_deltalake, Spark, a "
        "copy of an epoch's rows) belong to no epoch: without keys the audit cannot tell a "
        "copy of our rows from new rows"
    )
    if not deep:
        notes.append(
            "metadata audit: rows counted from the add actions' numRecords, files sized "
            "(not read); --deep reads and digests them"
        )
    return notes
