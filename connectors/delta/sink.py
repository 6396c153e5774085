"""Delta Lake connector: exactly-once appends to a Delta table through delta-rs.

How the two phases map to Delta::

    begin    nothing yet (the first row of a partition value opens its file)
    write    rows conformed to the table's schema, split by its partition columns, written
             as Parquet to [<col>=<value>/]<txn>-<seq>.parquet in the table's folder
    prepare  close (and fsync) every file; the handle lists per file: path, size, partition
             values, row count and the add action's statistics. No log entry names them:
             readers of the table do not see them
    commit   one Delta commit per epoch (commit_epoch): add actions for every file of the
             epoch + txn(appId=txsink.<app>.<uid>, version=epoch) + commit info (+ the new
             schema's metaData, when the epoch evolves it: ``evolve``); skipped when
             the table already records the epoch (:mod:`~txsink.connectors.delta.commit`)
    abort    delete the transaction's files
    recover  list the table's folder for files named after this app and uid that the table
             does not reference

Package map: ``sink`` (configuration and hooks), ``handles``, ``naming`` (file names and
partition folders), ``writer`` (a task's open files and statistics), ``commit`` (the epoch's
commit), ``checks`` (table and schema at start), ``evolve`` (schema evolution in the
epoch's commit), ``access`` (the rights on S3, probed at start), ``storage`` (local and
S3), ``audit`` (what the table holds for audited epochs), ``errors``, ``testing``,
``plugin``.

Guarantee: exactly-once for every reader of the Delta table (the log is the only way in).
The txn record lives in the log and its checkpoints, so ``VACUUM`` and log cleanup do not
forget it; a prepared file must not wait longer than ``VACUUM``'s retention for its commit.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from typing_extensions import override

from txsink.audit.found import AuditRequest, TargetAudit
from txsink.connectors.delta import access, audit, checks, commit, evolve, naming, storage
from txsink.connectors.delta.errors import describe, is_not_found
from txsink.connectors.delta.handles import DeltaFile, DeltaHandle
from txsink.connectors.delta.writer import OpenTxn, conform, first_null, groups
from txsink.contract import EpochCommit
from txsink.errors import (
    CommitError,
    ConfigurationError,
    RetryableError,
    UnreachableError,
    WriteError,
)
from txsink.handles import Handle
from txsink.observe.logs import EpochLogger, get_logger
from txsink.rowref import RowNaming
from txsink.schema import SchemaChange
from txsink.sink import TwoPhaseCommitSink
from txsink.store import LogStore
from txsink.txid import TxnId

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["DeltaSink"]

_COMPRESSIONS = ("snappy", "zstd", "gzip", "lz4", "none")


class DeltaSink(TwoPhaseCommitSink[OpenTxn, DeltaHandle]):
    """Exactly-once appends to a Delta Lake table (local folder or ``s3://``).

    Args:
        table: the table's location: a local path or ``s3://bucket/path``.
        uid: the sink's stable id (keep it across restarts and upgrades); with the app id it
            names the table's ``txn`` record, ``txsink.<app>.<uid>``.
        storage_options: delta-rs storage options (``AWS_ENDPOINT_URL``,
            ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
            ``AWS_ALLOW_HTTP``...); the ``AWS_*`` environment variables fill what is not
            given. Never logged, never in handles or reprs.
        create_table: create the table from the DataFrame's schema when there is none
            (default False: a missing table is refused at start).
        partition_by: partition columns of a table the sink creates; for an existing table
            they must be its own (or left empty).
        compression: Parquet codec of the data files (default ``snappy``).
        redact_rows: name a rejected row in errors by its column names and a hash of its
            values only (for sensitive data; default: the first columns' values).
        log: the txsink log, to use the sink alone as ``foreachBatch(sink)``.
        schema_evolution: ``"strict"`` (default: an epoch whose columns differ from the
            table's stops the query before writing) or ``"add-columns"`` (new nullable
            columns and struct fields join the table's schema in the epoch's own commit;
            docs/connectors/delta.md#schema-evolution).
    """

    connector: ClassVar[str] = "delta"
    handle_type: ClassVar[type[Handle]] = DeltaHandle

    def __init__(
        self,
        table: str,
        uid: str,
        *,
        storage_options: Mapping[str, str] | None = None,
        create_table: bool = False,
        partition_by: Sequence[str] = (),
        compression: str = "snappy",
        redact_rows: bool = False,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        self.redact_rows = redact_rows
        self.table = storage.table_uri(table)
        options = {str(k): str(v) for k, v in (storage_options or {}).items()}
        storage.check_options(options)
        self._options = options
        if compression not in _COMPRESSIONS:
            raise ValueError(f"DeltaSink compression must be one of {_COMPRESSIONS}")
        self.compression = compression
        self.create_table = bool(create_table)
        if isinstance(partition_by, str):
            partition_by = (partition_by,)
        self.partition_by = tuple(partition_by)
        # Filled by check() on the driver, shipped to the tasks with the sink.
        self._schema: pa.Schema | None = None
        self._partitions: tuple[str, ...] | None = None
        # The table's schema after the epoch's change (prepare_evolution), for check().
        self._evolved: pa.Schema | None = None

    @override
    def __repr__(self) -> str:
        return f"DeltaSink(uid={self.uid!r}, table={self.table!r})"

    @property
    def _storage(self) -> storage.Storage:
        return storage.Storage(self.table, self._options)

    def _ctx(self, **more: Any) -> dict[str, Any]:
        return {"sink_uid": self.uid, "connector": self.connector, **more}

    def _log(self, epoch: int | None = None) -> EpochLogger:
        return get_logger(__name__, uid=self.uid, epoch=epoch)

    def _open(self, phase: str, epoch: int | None = None) -> DeltaTable:
        """The table, read now; typed errors (``phase``: where it is read)."""
        from deltalake import DeltaTable

        target = self._storage
        try:
            return DeltaTable(target.uri, storage_options=target.delta_options())
        except Exception as err:
            ctx = self._ctx(phase=phase, epoch=epoch)
            if is_not_found(err):
                gone = (
                    f"there is no Delta table at {self.table} any more: it was deleted or "
                    "moved while the query ran. Restore it, or start over with a new "
                    "checkpoint and txsink log"
                )
                raise (
                    CommitError(gone, **ctx)
                    if phase == "commit"
                    else ConfigurationError(gone, **ctx)
                ) from None
            raise RetryableError(
                f"cannot read the Delta table at {self.table}: {describe(err)}. Check that "
                "the storage is reachable and the storage options' credentials",
                **ctx,
            ) from err

    # -- driver: start -------------------------------------------------------------------

    @property
    @override
    def fewer_tasks(self) -> bool:
        """Each task writes data files of its own: fewer, larger ones serve every reader
        (the coordinator's default ``max_tasks="auto"`` coalesces to the task slots)."""
        return True

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        ctx = self._ctx(phase="check")
        # Every IAM action, probed and named before the table is read (a missing read right
        # would otherwise be told only as a table that cannot be opened).
        access.check_access(self._storage, ctx)
        table = checks.open_or_create(
            self._storage, schema, create=self.create_table, partition_by=self.partition_by, ctx=ctx
        )
        partitions = tuple(table.metadata().partition_columns)
        if self.partition_by and self.partition_by != partitions:
            raise ConfigurationError(
                f"partition_by={list(self.partition_by)} but the Delta table at {self.table} "
                f"is partitioned by {list(partitions)}: leave partition_by empty (the table's "
                "own are used) or write to another table",
                **ctx,
            )
        table_schema = checks.table_schema(table)
        checks.check_schema(schema, table_schema, ctx)
        for name in checks.nullable_into_required(schema, table_schema):
            self._log().warning(
                "column %r is NOT NULL in the Delta table at %s, and the DataFrame's %r is "
                "nullable: a null in it refuses its epoch when written (before the decision, "
                "naming the row), and the query stops until it is fixed. If it may hold "
                "nulls, filter them (df.where(col(%r).isNotNull())) or fill a default "
                "(coalesce(col(%r), lit(...))) before the sink; else accept the risk",
                name,
                self.table,
                name,
                name,
                name,
            )
        # With a change planned for the epoch, its files hold the table's schema after it.
        self._schema, self._partitions = self._evolved or table_schema, partitions

    # -- driver: schema evolution -----------------------------------------------------------

    @override
    def target_schema(self, app_id: str) -> pa.Schema | None:
        """The table's schema (None: no table yet; check() creates it or refuses)."""
        from deltalake import DeltaTable

        self._evolved = None  # a new comparison: the last plan is void
        target = self._storage
        try:
            table = DeltaTable(target.uri, storage_options=target.delta_options())
        except Exception as err:
            if is_not_found(err):
                return None
            ctx = self._ctx(phase="check")
            access.check_access(target, ctx)  # a refused right, named (else unreachable)
            raise UnreachableError(
                f"cannot read the Delta table at {self.table}: {describe(err)}. Check the "
                "URI, that the storage is reachable and the credentials in storage_options",
                **ctx,
            ) from None
        return checks.table_schema(table)

    @override
    def evolution_support(self) -> frozenset[str]:
        """New nullable columns and struct fields (:mod:`~txsink.connectors.delta.evolve`;
        widenings need a protocol upgrade delta-rs does not write with data)."""
        return evolve.SUPPORTED

    @override
    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        """Check the table takes ``change`` (reads only); the tasks then write the epoch's
        files in the table's schema after it."""
        table = self._open("check")
        self._evolved = evolve.plan(table, change, self.table, self._ctx(phase="check"))

    def _layout(self) -> tuple[pa.Schema, tuple[str, ...]]:
        if self._schema is None or self._partitions is None:
            table = self._open("begin")  # a sink that was not checked in this process
            self._schema = checks.table_schema(table)
            self._partitions = tuple(table.metadata().partition_columns)
        return self._schema, self._partitions

    # -- executor: write and prepare --------------------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> OpenTxn:
        table_schema, partitions = self._layout()
        return OpenTxn(txn, self._storage, table_schema, partitions, self.compression)

    @override
    def write(self, txn: OpenTxn, batch: pa.RecordBatch) -> None:
        bad = first_null(batch, txn.table_schema)
        if bad is not None:
            row, column = bad
            raise WriteError(
                f"column {column!r} is NOT NULL in the Delta table and this row holds a null: "
                "filter or fill the nulls before the sink (e.g. coalesce), or make the column "
                "nullable in the table",
                row=RowNaming(partition=txn.txn.partition, redact=self.redact_rows).ref(
                    batch, row, txn.rows + row
                ),
                column=column,
                phase="write",
                epoch=txn.txn.epoch,
                partition=txn.txn.partition,
                **self._ctx(),
            )
        for values, rows in groups(conform(batch, txn.table_schema), txn.partition_by):
            txn.file_for(values).write(rows)
        txn.rows += batch.num_rows

    @override
    def prepare(self, txn: OpenTxn) -> DeltaHandle:
        while txn.open:
            txn.finish(next(iter(txn.open)))
        files = tuple(txn.done)
        return DeltaHandle(
            txn=txn.txn,
            rows=sum(f.rows for f in files),
            nbytes=sum(f.size for f in files),
            table=self.table,
            files=files,
        )

    @override
    def discard(self, txn: OpenTxn) -> None:
        paths = [f.path for f in txn.open.values()] + [f.path for f in txn.done]
        txn.close_all()
        for path in paths:
            txn.storage.delete(path)

    # -- driver: commit, abort, recover -------------------------------------------------------

    @override
    def commit_epoch(self, request: EpochCommit[DeltaHandle]) -> None:
        target = self._storage
        commit.commit_epoch(
            request,
            uid=self.uid,
            open_table=lambda: self._open("commit", request.epoch),
            storage=target,
            log=self._log(request.epoch),
            ctx=self._ctx(phase="commit"),
        )
        if request.schema_change is not None:
            self._evolved = None  # applied: the table has the schema now

    @override
    def abort(self, handle: DeltaHandle) -> None:
        target = self._storage
        for f in handle.files:
            target.delete(f.path)

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        return commit.recorded_version(self._open("check"), app_id, self.uid)

    @override
    def list_prepared(self, app_id: str) -> Iterator[DeltaHandle]:
        target = self._storage
        referenced = self._referenced()
        found: dict[TxnId, list[DeltaFile]] = {}
        try:
            listed = list(target.files())
        except OSError as err:
            raise RetryableError(
                f"cannot list the Delta table's folder {self.table}: {describe(err)}. Check that "
                "the storage is reachable and the storage options' credentials",
                **self._ctx(phase="recover"),
            ) from err
        for path, size in listed:
            txn = naming.parse(path)
            if txn is None or txn.app != app_id or txn.uid != self.uid or path in referenced:
                continue
            found.setdefault(txn, []).append(DeltaFile(path=path, size=size))
        for txn in sorted(found):
            files = tuple(sorted(found[txn], key=lambda f: f.path))
            yield DeltaHandle(
                txn=txn, nbytes=sum(f.size for f in files), table=self.table, files=files
            )

    # -- operator side: the audit ---------------------------------------------------------

    @override
    def audit(self, request: AuditRequest) -> TargetAudit:
        """The table's log entries for the epochs, their files' record counts and sizes;
        with ``request.deep`` the files read and digested (:mod:`~txsink.connectors.delta.audit`;
        docs/connectors/delta.md#audit). Read-only, its own clients."""
        return audit.audit_table(
            request,
            uid=self.uid,
            storage=self._storage,
            open_table=lambda: self._open("audit"),
            ctx=self._ctx(phase="audit"),
        )

    def _referenced(self) -> set[str]:
        """The stored paths of every file the table's current version adds (none: no table)."""
        try:
            table = self._open("recover")
        except ConfigurationError:
            return set()
        actions = pa.table(table.get_add_actions(flatten=True))
        return {urllib.parse.unquote(p) for p in actions.column("path").to_pylist()}
