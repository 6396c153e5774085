"""Exactly-once into an Apache Iceberg table, on pyiceberg.

    prepare  (task)   the partition's rows as Parquet data files in the table's data
                      location, named after the transaction (:mod:`.naming`), encoded while
                      the rows arrive (:mod:`.writer`): durable, and invisible (no snapshot
                      references them)
    commit   (driver) one table transaction per epoch: append every file of the epoch and
                      set ``txsink.<app>.<uid>.committed-epoch`` (:mod:`.commit`)
    evolve   (driver) ``schema_evolution="add-columns"``: new columns and struct fields,
                      Iceberg's promotions, planned with their field ids before the epoch
                      and committed in the epoch's own table transaction (:mod:`.evolve`)
    abort             delete the handle's files
    recover           ``list_prepared`` lists the data location for transaction-named files
                      of this app and sink that no snapshot references
    audit             each epoch's marked snapshot, its files live and in storage, their
                      rows; ``deep`` reads and digests them (:mod:`.audit`)

Options: ``catalog`` (pyiceberg catalog properties: ``type``, ``uri``, ``warehouse``,
``s3.*``...), ``table`` (``namespace.name``), ``catalog_name``, ``create`` (create the
table from the stream's schema when missing), ``redact_rows`` (a rejected row is named by
the table's identifier fields, else its first columns; with ``redact_rows=True`` by the
column names and a hash of the values only, for sensitive data).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from typing_extensions import override

from txsink import Handle, TwoPhaseCommitSink, TxnId
from txsink.connectors.iceberg import catalog as cat
from txsink.connectors.iceberg import evolve
from txsink.connectors.iceberg.checks import check_schema, target_arrow_schema
from txsink.connectors.iceberg.commit import commit_files, commit_schema, committed_epoch
from txsink.connectors.iceberg.handles import IcebergHandle
from txsink.connectors.iceberg.naming import txn_of
from txsink.connectors.iceberg.rights import check_catalog_rights, refused_read
from txsink.connectors.iceberg.writer import PreparedWriter
from txsink.contract import EpochCommit
from txsink.errors import ConfigurationError, RetryableError, UnreachableError
from txsink.observe.logs import get_logger
from txsink.schema import SchemaChange, SchemaEvolutionError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from txsink.audit.found import AuditRequest, TargetAudit

__all__ = ["IcebergSink"]

_log = get_logger(__name__)


class IcebergSink(TwoPhaseCommitSink[PreparedWriter, IcebergHandle]):
    """Exactly-once appends into the Iceberg table ``table`` (see the module doc)."""

    connector: ClassVar[str] = "iceberg"
    handle_type: ClassVar[type[Handle]] = IcebergHandle

    def __init__(
        self,
        catalog: Mapping[str, str],
        table: str,
        uid: str,
        *,
        catalog_name: str = "txsink",
        create: bool = False,
        redact_rows: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(uid, **options)
        self.redact_rows = redact_rows
        self.catalog_properties = dict(catalog)
        self.table = table
        self.catalog_name = catalog_name
        self.create = create
        self._catalog: Catalog | None = None
        #: The schema the epoch's planned change gives the table (:meth:`prepare_evolution`).
        self._planned: evolve.Planned | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_catalog"] = None  # connections stay where they were opened
        return state

    @property
    @override
    def fewer_tasks(self) -> bool:
        """Each task writes data files of its own: fewer, larger ones serve every reader
        (the coordinator's default ``max_tasks="auto"`` coalesces to the task slots)."""
        return True

    @override
    def release(self) -> None:
        catalog, self._catalog = self._catalog, None
        if catalog is not None:
            catalog.close()  # a SQL catalog's connection pool

    def _cat(self) -> Catalog:
        if self._catalog is None:
            try:
                self._catalog = cat.load_catalog(self.catalog_name, self.catalog_properties)
            except Exception as exc:
                # A property pyiceberg refuses is a setting; anything else (a server down, a
                # connection refused) may pass at a restart.
                setting = isinstance(exc, (ValueError, TypeError, KeyError, ImportError))
                raise (ConfigurationError if setting else UnreachableError)(
                    f"cannot open Iceberg catalog {self.catalog_name!r} ({cat.describe(exc)}): "
                    "check its 'type', 'uri' and credentials, and that the server is reachable",
                    sink_uid=self.uid,
                    connector=self.connector,
                ) from None
        return self._catalog

    def _load(self) -> Table:
        return cat.load_table(self._cat(), self.table, uid=self.uid, connector=self.connector)

    def _find(self) -> Table | None:
        """The table, or None when it does not exist; a catalog that cannot be read is an
        :class:`UnreachableError` (or the right it lacks, named)."""
        from pyiceberg.exceptions import NoSuchTableError

        catalog = self._cat()
        try:
            return catalog.load_table(self.table)
        except NoSuchTableError:
            return None
        except Exception as exc:
            if refused_read(exc):  # the server answered: a right is missing, not the server
                check_catalog_rights(
                    catalog, uid=self.uid, connector=self.connector, table=self.table
                )
            raise UnreachableError(
                f"cannot reach Iceberg catalog {self.catalog_name!r} ({cat.describe(exc)}): "
                "check its 'uri' and credentials, and that the server is up",
                sink_uid=self.uid,
                connector=self.connector,
            ) from None

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        catalog = self._cat()
        table = self._find()
        if table is None:
            if not self.create:
                table = self._load()  # raises the ConfigurationError
            else:
                namespace = self.table.rsplit(".", 1)[0]
                catalog.create_namespace_if_not_exists(namespace)
                table = catalog.create_table_if_not_exists(self.table, schema=schema)
                _log.bind(uid=self.uid).info("created Iceberg table %s", self.table)
        check_catalog_rights(catalog, uid=self.uid, connector=self.connector, table=self.table)
        check_schema(
            schema,
            target_arrow_schema(table.schema()),
            uid=self.uid,
            connector=self.connector,
            name=self.table,
        )

    # -- schema evolution (:mod:`.evolve`) -----------------------------------------------

    @override
    def target_schema(self, app_id: str) -> pa.Schema | None:
        """The table's current schema as Arrow (Iceberg ``string`` as ``large_string``,
        ``timestamptz`` as UTC microseconds: the core holds those the same as Spark's);
        None when the table does not exist yet (``check`` creates it, or refuses).

        Asked first whenever the core plans an epoch's schema: a plan made for an earlier
        schema is dropped here, so tasks never write a change the core no longer plans."""
        self._planned = None
        table = self._find()
        return None if table is None else target_arrow_schema(table.schema())

    @override
    def evolution_support(self) -> frozenset[str]:
        """New optional columns and struct fields, ``int`` -> ``long``, ``float`` ->
        ``double``, a decimal's precision up: Iceberg takes each in table metadata alone."""
        return evolve.SUPPORTED

    @override
    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        """Stage ``change`` in a transaction that is never committed: what Iceberg refuses
        is a :class:`SchemaEvolutionError` naming the column and the fix; the schema it
        yields (its new field ids) is kept for the epoch's tasks. Writes nothing."""
        table = self._load()
        try:
            self._planned = evolve.plan(table, change)
        except evolve.Refused as refused:
            raise SchemaEvolutionError(
                f"Iceberg table {self.table!r} cannot take the epoch's change of column "
                f"{refused.column!r}: {refused.why}. Nothing of the epoch was written. Fix: "
                f"{refused.fix}",
                sink_uid=self.uid,
                column=refused.column,
                connector=self.connector,
                phase="check",
            ) from None

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> PreparedWriter:
        """Data files of the table's schema, or of the schema the epoch's change gives it
        (planned on the driver, while the table is still where the plan started)."""
        table = self._load()
        planned = self._planned
        writes = planned.schema if planned is not None and planned.applies_to(table) else None
        have = (writes or table.schema()).as_struct()
        missing = [n for n in schema.names if have.field_by_name(n) is None]
        if missing:  # conform() would drop the column: never write a row without its values
            raise RetryableError(
                f"Iceberg table {self.table!r} has no column {missing[0]!r} of the epoch: "
                "its schema changed after the epoch was planned; the epoch aborts and the "
                "query's next run compares the schemas again",
                sink_uid=self.uid,
                connector=self.connector,
                column=missing[0],
                phase="prepare",
            )
        return PreparedWriter(table, txn, self.uid, self.connector, self.redact_rows, schema=writes)

    @override
    def write(self, txn: PreparedWriter, batch: pa.RecordBatch) -> None:
        txn.add(batch)

    @override
    def prepare(self, txn: PreparedWriter) -> IcebergHandle:
        files = txn.finish()
        return IcebergHandle(txn=txn.txn, rows=txn.rows, nbytes=txn.nbytes, files=files)

    @override
    def discard(self, txn: PreparedWriter) -> None:
        txn.discard()

    @override
    def commit_epoch(self, request: EpochCommit[IcebergHandle]) -> None:
        """One table commit: the epoch's files, its committed epoch and, when the decision
        records one, its schema change (:func:`.commit.commit_files`)."""
        handles = [h for h in request.handles if h.files]
        change, app = request.schema_change, request.app_id
        if app is not None and (handles or change is not None):
            commit_files(
                self._load, request.epoch, handles, app=app, uid=self.uid,
                connector=self.connector, change=change,
            )  # fmt: skip
        elif change is not None:  # no handle at all, so no app to record: the change alone
            commit_schema(self._load, request.epoch, change, uid=self.uid, connector=self.connector)
        request.committed(request.handles)

    def _in_table(self, table: Table, app: str, epochs: set[int]) -> set[str]:
        """Which of this sink's files of ``epochs`` the table references (scheme-less keys).
        An epoch past the committed-epoch property has nothing in the table (the property
        and the files commit in one transaction); the others' own snapshots say."""
        done = committed_epoch(table, app, self.uid)
        maybe = {e for e in epochs if e <= done}
        if not maybe:
            return set()
        found = cat.added_in_epochs(table, app, self.uid, maybe)
        return cat.referenced(table) if found is None else found

    @override
    def abort(self, handle: IcebergHandle) -> None:
        table = self._load()
        referenced = self._in_table(table, handle.txn.app, {handle.txn.epoch})
        for path, *_ in handle.files:
            if cat.path_key(table, path) in referenced:
                continue  # committed: never delete a file the table reads
            with contextlib.suppress(FileNotFoundError):
                table.io.delete(path)

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        found = committed_epoch(self._load(), app_id, self.uid)
        return None if found < 0 else found

    @override
    def list_prepared(self, app_id: str) -> Iterator[IcebergHandle]:
        table = self._load()
        ours: dict[TxnId, list[str]] = {}
        for key in cat.list_files(table):
            txn = txn_of(key)
            if txn is not None and txn.belongs_to(app_id, self.uid):
                ours.setdefault(txn, []).append(key)
        if not ours:
            return
        referenced = self._in_table(table, app_id, {txn.epoch for txn in ours})
        location = cat.data_location(table)
        scheme = location.split("://", 1)[0] + "://" if "://" in location else ""
        for txn in sorted(ours):
            left = [k for k in ours[txn] if k not in referenced]
            if left:
                files = tuple(
                    (scheme + k, 0, table.metadata.default_spec_id, None) for k in sorted(left)
                )
                yield IcebergHandle(txn=txn, files=files)

    @override
    def audit(self, request: AuditRequest) -> TargetAudit:
        """What the table itself says of ``request``'s epochs (:mod:`.audit`), through a
        catalog of its own (it may run beside a commit); read-only."""
        from txsink.connectors.iceberg.audit import audit_table

        try:
            catalog = cat.load_catalog(self.catalog_name, self.catalog_properties)
        except Exception as exc:
            raise UnreachableError(
                f"cannot open Iceberg catalog {self.catalog_name!r} to audit "
                f"({cat.describe(exc)}): check its 'type', 'uri' and credentials, and that the "
                "server is reachable",
                sink_uid=self.uid,
                connector=self.connector,
                phase="audit",
            ) from None
        try:
            table = cat.load_table(catalog, self.table, uid=self.uid, connector=self.connector)
            return audit_table(table, request, uid=self.uid)
        except OSError as exc:  # storage: pyarrow's file systems raise OSError
            raise UnreachableError(
                f"cannot read Iceberg table {self.table!r}'s metadata or files to audit "
                f"({cat.describe(exc)}): check that its storage is reachable",
                sink_uid=self.uid,
                connector=self.connector,
                phase="audit",
            ) from None
        finally:
            catalog.close()

    def __repr__(self) -> str:
        return f"IcebergSink(table={self.table!r}, uid={self.uid!r})"
