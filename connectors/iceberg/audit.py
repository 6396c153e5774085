"""The Iceberg sink's audit (``txsink audit``): what the table itself says of each epoch.

Per audited epoch, from the table's own metadata (read-only, a catalog of its own):

* the snapshot that committed it, found by txsink's marker in its summary (``txsink.app``,
  ``txsink.uid``, ``txsink.epoch``), and the data files that snapshot added (its own
  manifests): they must be the decision's handles' files (a file the decision names that
  the snapshot lacks, or one the snapshot adds that no handle names, is a difference);
* which of them the current snapshot still holds (its manifests written since the oldest
  audited epoch: an older manifest cannot hold a newer file, so an audit of the last N
  epochs reads those epochs' manifests, not the table's history); a file that left the
  table is named with the snapshot that removed it (a delete, an overwrite, a compaction)
  or, when the epoch's snapshot is no longer in the current one's history, as rolled back;
* each live file present in storage (one HEAD per file, no data read);
* the rows: the live, present files' ``record_count``; a position delete file that
  applies to one of them is a difference the metadata cannot count (``deep`` counts it).

``deep`` also reads the epoch's live data files (only those), with the position deletes
that apply to them, through pyiceberg's own reader, and digests the rows
(:func:`txsink.audit.digest.digest_rows`) over the columns the decision's digest covers.

Extras: a live file named after a transaction of this app and sink, of an epoch in the
audited range, that no committed snapshot of that epoch added (a copy fast-appended or
``add_files``-ed under our name, an epoch's files appended twice); a live file whose
metadata (row count, size, column bounds) is that of one of the audited epochs' files but
that another snapshot added (a copy under another name); a marked snapshot of an epoch in
range that no decision gives files to, or a second one for an epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from txsink.audit.digest import Digest, digest_rows
from txsink.audit.found import AuditRequest, EpochFound, EpochToAudit, Extra, TargetAudit
from txsink.connectors.iceberg import catalog as cat
from txsink.connectors.iceberg.commit import committed_epoch
from txsink.connectors.iceberg.handles import IcebergHandle
from txsink.connectors.iceberg.naming import SUMMARY_APP, SUMMARY_EPOCH, SUMMARY_UID, txn_of

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile, ManifestEntry
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

__all__ = ["audit_table"]

NOTES = (
    "metadata: the epochs' snapshots, their manifests and the current snapshot's manifests "
    "written since the oldest audited epoch, and one HEAD per data file; no rows are read",
    "a compaction (rewrite_data_files) moves an epoch's rows into files of no epoch: the "
    "audit reports them as removed by the rewrite's snapshot, it cannot follow them",
    "a copy of one of our files under another name is found by its metadata (row count, "
    "size, column bounds): a copy written again (re-encoded) is not",
    "equality delete files are not read (pyiceberg cannot): an epoch one may touch is "
    "reported as a difference, uncounted",
)


@dataclass
class _Live:
    """The current snapshot's live entries in manifests written since a sequence number."""

    data: dict[str, list[ManifestEntry]] = field(default_factory=dict)  # path key -> entries
    position: list[ManifestEntry] = field(default_factory=list)
    equality: list[ManifestEntry] = field(default_factory=list)


def audit_table(table: Table, request: AuditRequest, *, uid: str) -> TargetAudit:
    """The audit of ``request``'s epochs in ``table`` (the module's docstring)."""
    out = TargetAudit(notes=list(NOTES))
    if request.epochs:
        _Audit(table, request, uid).run(out)
    return out


@dataclass
class _Audit:
    table: Table
    request: AuditRequest
    uid: str
    live: _Live = field(default_factory=_Live)
    accounted: set[str] = field(default_factory=set)  # the audited epochs' files (path keys)
    #: What a copy of each audited live file shares with it -> (epoch, path).
    prints: dict[tuple[Any, ...], tuple[int, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key = _keys(self.table)

    def run(self, out: TargetAudit) -> None:
        table, request, app = self.table, self.request, self.request.app_id
        marked = _marked(table, app, self.uid, request.first, request.last)
        for number, snapshots in marked.items():
            for extra in snapshots[1:]:  # one commit per epoch: a second is not the decision's
                rows = sum(e.data_file.record_count for e in _added(table, extra))
                what = f"snapshot {extra.snapshot_id} ({_operation(extra)}) also carries epoch"
                out.extras.append(Extra(f"{what} {number}'s marker: a second commit", number, rows))
        # The oldest audited epoch's sequence number: no manifest written before holds its
        # files (0, every manifest, when an epoch with files has no marked snapshot left).
        seqs = [
            marked[e.epoch][0].sequence_number or 0 if e.epoch in marked else 0
            for e in request.epochs
            if _files(e) or e.epoch in marked
        ]
        self.live = _live(table, min(seqs, default=0))
        if table.metadata.format_version < 2:
            out.notes.append(
                "a format-v1 table has no sequence numbers: every manifest of the current "
                "snapshot is read"
            )
        done = committed_epoch(table, app, self.uid)
        for epoch in request.epochs:
            snapshots = marked.get(epoch.epoch, [])
            if not _files(epoch) and not snapshots:  # no file decided, none committed
                if epoch.handles:  # tasks without rows: nothing to find, and nothing found
                    empty = _read(table, epoch, {}, {}) if request.deep else None
                    out.epochs[epoch.epoch] = EpochFound(0, empty, how="no data file decided")
                continue
            found = out.epochs[epoch.epoch] = self.epoch(epoch, snapshots[:1])
            if done < epoch.epoch and _files(epoch):
                found.problems.append(
                    f"the table's property txsink.{app}.{self.uid}.committed-epoch is {done}, "
                    f"before epoch {epoch.epoch}"
                )
            if not _files(epoch):
                what = f"snapshot {snapshots[0].snapshot_id} commits epoch {epoch.epoch}"
                out.extras.append(
                    Extra(f"{what}, to which no decision gives files", epoch.epoch, found.rows)
                )
        out.extras += self.extras()

    def epoch(self, epoch: EpochToAudit, snapshot: list[Snapshot]) -> EpochFound:
        """What the table holds of ``epoch`` (``snapshot``: its marked one, if any)."""
        table, live, e = self.table, self.live, epoch.epoch
        problems: list[str] = []
        decided = {self.key(p): p for p in _files(epoch)}
        if snapshot:
            added = {self.key(x.data_file.file_path): x for x in _added(table, snapshot[0])}
            how = f"snapshot {snapshot[0].snapshot_id}'s {len(added)} added file(s)"
        else:  # expired (its files may still be live), or rolled back and expired
            added = {k: es[0] for k, es in live.data.items() if _txn_name(k) in epoch.txn_names}
            how = f"the current snapshot's {len(added)} file(s) named after the epoch's txns"
            if not added:
                problems.append(
                    f"no snapshot of the table carries epoch {e}'s marker and none of its "
                    "files is in the current snapshot (rolled back to before it, or expired?)"
                )
        self.accounted |= set(added)
        for k, path in sorted(decided.items()):
            if added and k not in added and not _rewritten(k, added, epoch):
                where = f"snapshot {snapshot[0].snapshot_id}" if snapshot else "the table"
                problems.append(f"data file {path} of the decision is not in {where}")
        for k, entry in sorted(added.items()):
            if k not in decided and _txn_name(k) not in epoch.txn_names:
                problems.append(
                    f"snapshot {entry.snapshot_id} added data file {entry.data_file.file_path}, "
                    "which no handle of the decision names"
                )
        gone = {k: x for k, x in added.items() if k not in live.data}
        if gone:
            problems += self.removed(e, snapshot, gone)
        mine: dict[str, DataFile] = {}
        for k in sorted(set(added) - set(gone)):
            data_file = live.data[k][0].data_file
            if table.io.new_input(data_file.file_path).exists():
                mine[k] = data_file
                self.prints.setdefault(_print(data_file), (e, data_file.file_path))
            else:
                problems.append(
                    f"data file {data_file.file_path} of epoch {e} is listed by the table but "
                    "gone from storage"
                )
        rows = sum(f.record_count for f in mine.values())
        deletes = _deletes(live, mine, added)
        for k, files in sorted(deletes.items()) if not self.request.deep else ():
            problems += [
                f"position delete file {d.file_path} applies to epoch {e}'s data file "
                f"{mine[k].file_path} (its rows are not counted: audit deep)"
                for d in files
            ]
        for k in sorted(mine):
            problems += [
                f"equality delete file {x.data_file.file_path} may delete rows of epoch {e}'s "
                f"data file {mine[k].file_path}: not read"
                for x in _equality(live, mine[k], added[k])
            ]
        how += f", {len(mine)} live and present in storage"
        digest: Digest | None = None
        if self.request.deep:
            digest = _read(table, epoch, mine, deletes)
            if digest.rows != rows:
                names = sorted(
                    {d.file_path.rsplit("/", 1)[-1] for ds in deletes.values() for d in ds}
                )
                problems.append(
                    f"{rows - digest.rows} row(s) of epoch {e} are deleted by position "
                    f"delete file(s) {', '.join(names)}"
                )
            rows = digest.rows
            how += f"; read {len(mine)} data file(s)"
        return EpochFound(rows=rows, digest=digest, problems=problems, how=how)

    def removed(
        self, epoch: int, snapshot: list[Snapshot], gone: dict[str, ManifestEntry]
    ) -> list[str]:
        """Why files of ``epoch`` are not live: the snapshot that removed them, or a rollback."""
        rows = sum(x.data_file.record_count for x in gone.values())
        history = _ancestry(self.table)
        if snapshot and snapshot[0].snapshot_id not in {s.snapshot_id for s in history}:
            return [
                f"epoch {epoch}'s snapshot {snapshot[0].snapshot_id} is not in the current "
                f"snapshot's history (the table was rolled back before it?): {rows} row(s) in "
                f"{_names(gone)} are not in the table"
            ]
        left, out = dict(gone), []
        for later in history:  # newest first, down to the epoch's snapshot
            if not left or (snapshot and later.snapshot_id == snapshot[0].snapshot_id):
                break
            by = _deleted_by(self.table, later, self.key)
            removed = {k: x for k, x in left.items() if k in by}
            if removed:
                count = sum(x.data_file.record_count for x in removed.values())
                out.append(
                    f"{count} row(s) of epoch {epoch} were removed by snapshot "
                    f"{later.snapshot_id} (operation {_operation(later)}): {_names(removed)}"
                )
                left = {k: x for k, x in left.items() if k not in removed}
        if left:
            out.append(
                f"{rows} row(s) of epoch {epoch} are not in the current snapshot: {_names(left)}"
            )
        return out

    def extras(self) -> Iterator[Extra]:
        """Live files of ours (by name or by metadata) no audited epoch accounts for."""
        request, app = self.request, self.request.app_id
        requested = {e.epoch: e for e in request.epochs}
        for k, entries in sorted(self.live.data.items()):
            txn = txn_of(k)
            for entry in entries[1:] if k in self.accounted else entries:  # a path added twice
                adder, path = _adder(self.table, entry), entry.data_file.file_path
                rows = entry.data_file.record_count
                if txn is not None and txn.belongs_to(app, self.uid):
                    if request.first <= txn.epoch <= request.last:
                        decided = requested.get(txn.epoch)
                        why = (
                            "not a transaction of the decision"
                            if decided is not None and str(txn) not in decided.txn_names
                            else "not added by the epoch's commit"
                        )
                        yield Extra(
                            f"data file {path} named after {txn}, {why}: added by {adder}",
                            txn.epoch,
                            rows,
                        )
                    continue
                twin = self.prints.get(_print(entry.data_file))
                if twin is not None:
                    yield Extra(
                        f"data file {path}, added by {adder}, has the row count, size and column "
                        f"bounds of epoch {twin[0]}'s file {twin[1].rsplit('/', 1)[-1]}: a copy",
                        twin[0],
                        rows,
                    )


def _read(
    table: Table,
    epoch: EpochToAudit,
    files: dict[str, DataFile],
    deletes: dict[str, list[DataFile]],
) -> Digest:
    """The digest of ``files``' live rows, over the columns the decision's digest covers."""
    from pyiceberg.expressions import AlwaysTrue
    from pyiceberg.io.pyarrow import ArrowScan
    from pyiceberg.table import FileScanTask

    schema = table.schema()
    top = [f.name for f in schema.fields]
    expected = epoch.expected
    kept = [n for n in expected.cols if n in top] if expected is not None else top
    if not files or not kept:
        return Digest(cols={n: 0 for n in kept})
    tasks = [
        FileScanTask(f, delete_files=set(deletes.get(k, ()))) for k, f in sorted(files.items())
    ]
    data = ArrowScan(table.metadata, table.io, schema.select(*kept), AlwaysTrue()).to_table(tasks)
    return digest_rows([data.select(kept)])


# -- the table's metadata ------------------------------------------------------------------


def _keys(table: Table) -> Callable[[str], str]:
    cache: dict[str, str] = {}

    def key(path: str) -> str:
        if path not in cache:
            cache[path] = cat.path_key(table, path)
        return cache[path]

    return key


def _files(epoch: EpochToAudit) -> list[str]:
    return [
        path
        for handle in epoch.handles
        if isinstance(handle, IcebergHandle)
        for path, *_ in handle.files
    ]


def _txn_name(key: str) -> str | None:
    txn = txn_of(key)
    return None if txn is None else str(txn)


def _rewritten(k: str, added: dict[str, Any], epoch: EpochToAudit) -> bool:
    """A decided file the commit wrote again (another writer's schema change meanwhile:
    :func:`.writer.rewrite`): the snapshot adds other files of the same transaction."""
    txn = _txn_name(k)
    return txn is not None and any(_txn_name(o) == txn for o in added) and txn in epoch.txn_names


def _marked(table: Table, app: str, uid: str, first: int, last: int) -> dict[int, list[Snapshot]]:
    """The snapshots carrying this app and sink's marker for an epoch in [first, last],
    per epoch, oldest first."""
    out: dict[int, list[Snapshot]] = {}
    for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
        summary = snapshot.summary
        if summary is None or summary.get(SUMMARY_APP) != app or summary.get(SUMMARY_UID) != uid:
            continue
        epoch = _int(summary.get(SUMMARY_EPOCH))
        if epoch is not None and first <= epoch <= last:
            out.setdefault(epoch, []).append(snapshot)
    return out


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _added(table: Table, snapshot: Snapshot) -> list[ManifestEntry]:
    """The data files ``snapshot`` added (its own manifests' ADDED entries)."""
    from pyiceberg.manifest import DataFileContent, ManifestEntryStatus

    out = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if (
                entry.status == ManifestEntryStatus.ADDED
                and entry.snapshot_id == snapshot.snapshot_id
                and entry.data_file.content == DataFileContent.DATA
            ):
                out.append(entry)
    return out


def _deleted_by(table: Table, snapshot: Snapshot, key: Callable[[str], str]) -> set[str]:
    """The data files ``snapshot`` removed (DELETED entries of its own manifests)."""
    from pyiceberg.manifest import ManifestEntryStatus

    out: set[str] = set()
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.status == ManifestEntryStatus.DELETED:
                out.add(key(entry.data_file.file_path))
    return out


def _live(table: Table, since: int) -> _Live:
    """The current snapshot's live entries in manifests of sequence number ``since`` on."""
    from pyiceberg.manifest import DataFileContent

    out = _Live()
    current = table.current_snapshot()
    if current is None:
        return out
    key = _keys(table)
    for manifest in current.manifests(table.io):
        if (manifest.sequence_number or 0) < since:
            continue  # written before the oldest audited epoch: holds nothing of it, or after
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            content = entry.data_file.content
            if content == DataFileContent.DATA:
                out.data.setdefault(key(entry.data_file.file_path), []).append(entry)
            elif content == DataFileContent.POSITION_DELETES:
                out.position.append(entry)
            else:
                out.equality.append(entry)
    return out


def _deletes(
    live: _Live, mine: dict[str, DataFile], added: dict[str, ManifestEntry]
) -> dict[str, list[DataFile]]:
    """The position delete files that apply to each of ``mine`` (pyiceberg's own rule)."""
    from pyiceberg.table.delete_file_index import DeleteFileIndex

    if not live.position or not mine:
        return {}
    index = DeleteFileIndex()
    for entry in live.position:
        index.add_delete_file(entry, partition_key=entry.data_file.partition)
    out = {}
    for k, data_file in mine.items():
        seq = added[k].sequence_number or 0
        found = index.for_data_file(seq, data_file, partition_key=data_file.partition)
        if found:
            out[k] = sorted(found, key=lambda d: str(d.file_path))
    return out


def _equality(live: _Live, data_file: DataFile, entry: ManifestEntry) -> Iterable[ManifestEntry]:
    """The equality delete files newer than ``data_file``, of its spec and partition (or
    of an unpartitioned spec)."""
    seq = entry.sequence_number or 0
    for delete in live.equality:
        d = delete.data_file
        if (delete.sequence_number or 0) > seq and (
            d.spec_id != data_file.spec_id or d.partition == data_file.partition
        ):
            yield delete


def _ancestry(table: Table) -> list[Snapshot]:
    """The current snapshot and its ancestors, newest first."""
    out = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        out.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return out


def _print(data_file: DataFile) -> tuple[Any, ...]:
    """What a copy of a data file shares with it in the metadata."""
    return (
        data_file.record_count,
        data_file.file_size_in_bytes,
        tuple(sorted((data_file.lower_bounds or {}).items())),
        tuple(sorted((data_file.upper_bounds or {}).items())),
    )


def _operation(snapshot: Snapshot) -> str:
    summary = snapshot.summary
    return "unknown" if summary is None else str(summary.operation.value)


def _adder(table: Table, entry: ManifestEntry) -> str:
    """The snapshot that added ``entry``, with its operation and marker if any."""
    snapshot = table.snapshot_by_id(entry.snapshot_id) if entry.snapshot_id is not None else None
    if snapshot is None:
        return f"snapshot {entry.snapshot_id} (expired)"
    epoch = None if snapshot.summary is None else snapshot.summary.get(SUMMARY_EPOCH)
    mark = "" if epoch is None else f", txsink epoch {epoch}"
    return f"snapshot {snapshot.snapshot_id} (operation {_operation(snapshot)}{mark})"


def _names(entries: dict[str, ManifestEntry]) -> str:
    return ", ".join(sorted(x.data_file.file_path.rsplit("/", 1)[-1] for x in entries.values()))
