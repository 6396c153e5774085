"""Postgres connector: exactly-once with PostgreSQL's own two-phase commit, or with a
staging table where the server has no prepared transactions.

Two commit protocols (``commit=``; ``auto``, the default, takes two-phase commit when the
server allows prepared transactions, staging otherwise, and logs which at start):

* ``2pc``, below;
* ``staging``: tasks COPY into a staging table in the target database and commit locally;
  the driver moves the decided rows into the target in one local transaction that also
  writes the progress rows (:mod:`~txsink.connectors.postgres.staging`, which says why).

How the two phases map to PostgreSQL with ``2pc``::

    begin    connect; BEGIN (psycopg tpc_begin with the transaction name as gid)
    write    binary COPY of the Arrow batch, cast to the table's column types, into the
             table (append) or a stage table (upsert)
    prepare  upsert: INSERT ... ON CONFLICT from the stage; record progress; PREPARE TRANSACTION
    commit   COMMIT PREPARED gid, from the driver; "no such gid" is success only if the
             progress row written inside that transaction is visible
    abort    ROLLBACK PREPARED gid ("no such gid" = already gone)
    recover  pg_prepared_xacts rows whose gid is a txsink name of this app and sink

Guarantee: exactly-once, with either protocol. ``2pc`` needs
``max_prepared_transactions > 0`` on the server (checked at start). A prepared
transaction holds its locks until it is committed or rolled back, so lingering ones
block writers and vacuum: the check at start warns about old ones, and recovery
removes every one of ours.

This module holds the configuration and the hooks; the work is in the package's
other modules: :mod:`~txsink.connectors.postgres.checks` (start), ``copy`` and
``upsert`` (write), ``casts`` and ``binary`` (Arrow into binary COPY), ``stall`` (the
timeouts), ``connections`` (the task's and the driver's), ``progress`` (the
committed-transaction record), ``prepared`` (the server's prepared transactions and their
handle), ``staging`` (the staging commit and its table), ``stagerows`` (its rows) and
``stagecommit`` (its driver side), ``evolve`` (schema evolution), ``epochs`` (the
epoch column) and ``audit`` (``txsink audit``), ``errors``, ``types`` and ``tables``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
from typing_extensions import override

from txsink.connectors.postgres.audit import Audited
from txsink.connectors.postgres.casts import ColumnPlan
from txsink.connectors.postgres.checks import StartCheck, choose_protocol, plans_for
from txsink.connectors.postgres.copy import OpenTxn, start_copy
from txsink.connectors.postgres.epochs import epoch_option, epoch_plans
from txsink.connectors.postgres.errors import check_error, redact_dsn
from txsink.connectors.postgres.evolve import added_plans, stage_columns
from txsink.connectors.postgres.prepared import (
    PgHandle,
    commit_prepared,
    prepared_gids,
    rollback_prepared,
)
from txsink.connectors.postgres.progress import (
    prune_progress,
    record_progress,
    recorded_epoch,
    relabel_progress,
    was_committed,
)
from txsink.connectors.postgres.stagecommit import StageCommit, StagedHandle
from txsink.connectors.postgres.stagerows import drop_if_empty
from txsink.connectors.postgres.staging import Staging, begin_staged
from txsink.connectors.postgres.stall import Timeouts
from txsink.connectors.postgres.tables import Tables, primary_key, split_table
from txsink.connectors.postgres.upsert import create_stage, merge_stage
from txsink.contract import EpochCommit
from txsink.errors import CommitError, RetryableError, TxsinkError
from txsink.handles import Handle
from txsink.rowref import RowNames
from txsink.sink import Partitioning, TwoPhaseCommitSink
from txsink.store import LogStore
from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg

__all__ = ["Commit", "Mode", "PgHandle", "PostgresSink", "StagedHandle"]

Mode = Literal["append", "upsert"]
Commit = Literal["auto", "2pc", "staging"]

_log = logging.getLogger(__name__)

# COMMIT PREPARED of a gid another session is finishing: tries, and the back-off step.
_BUSY_TRIES = 5
_BUSY_STEP_S = 0.2


class PostgresSink(Audited, TwoPhaseCommitSink[OpenTxn, Handle]):
    """Exactly-once rows into a PostgreSQL table.

    Args:
        dsn: a libpq connection string or URL; TLS and any libpq option pass through.
        table: target table, ``"name"`` or ``"schema.name"`` (quoted as identifiers).
        uid: the sink's stable id.
        mode: ``append`` (COPY) or ``upsert`` (COPY to a stage table, then
            ``INSERT ... ON CONFLICT (key) DO UPDATE``; the last row of a key wins).
        key: the upsert key columns (a unique index on exactly them must exist).
        commit: the commit protocol: ``2pc`` (PREPARE TRANSACTION, needs
            ``max_prepared_transactions > 0``), ``staging`` (a staging table in the target
            database, committed by one local transaction after the decision; no server
            setting), or ``auto`` (default): ``2pc`` when the server allows prepared
            transactions, else ``staging``.
        staging_schema: where ``staging`` keeps its table (default: the target's schema);
            a schema made for it, for a role without CREATE on the target's schema.
        create_table: create the table from the DataFrame's schema if missing.
        epoch_column: a ``bigint`` column of the table (not of the DataFrame) the sink fills
            with each row's epoch: what the audit counts and reads back per epoch.
        progress_table: the table recording which transactions committed
            (created if missing; default ``txsink_progress`` in the table's schema).
        connect_timeout_s: the longest a connection may take to open (libpq).
        stall_timeout_s: the longest one wait for the server may last (a statement, a COPY
            write, COMMIT PREPARED) before the connection is dropped; None: no bound.
        tcp_user_timeout_ms, keepalives_idle_s: the kernel's bounds on a dead network
            path (libpq ``tcp_user_timeout``, ``keepalives*``); None: the system's.
        statement_timeout_ms, lock_timeout_ms, idle_in_transaction_timeout_ms: the
            server's, set (``SET LOCAL``) in every task's transaction; None: the server's.
        prepared_age_warning_s: warn at start about prepared transactions older than this.
        connect_kwargs: extra keyword arguments for ``psycopg.connect``.
        redact_rows: name a rejected row in errors by its column names and a hash of its
            values only (for sensitive data; default: the values of ``key``, else of the
            table's primary key, else of the first columns).
        log: the txsink log, to use the sink alone as ``foreachBatch(sink)``.
    """

    connector: ClassVar[str] = "postgres"
    handle_type: ClassVar[type[Handle]] = PgHandle

    def __init__(
        self,
        dsn: str,
        table: str,
        uid: str,
        *,
        mode: Mode = "append",
        key: Sequence[str] = (),
        commit: Commit = "auto",
        staging_schema: str | None = None,
        create_table: bool = False,
        epoch_column: str | None = None,
        progress_table: str | None = None,
        connect_timeout_s: float = 10.0,
        stall_timeout_s: float | None = 60.0,
        tcp_user_timeout_ms: int | None = 30_000,
        keepalives_idle_s: int | None = 30,
        statement_timeout_ms: int | None = None,
        lock_timeout_ms: int | None = 30_000,
        idle_in_transaction_timeout_ms: int | None = 300_000,
        prepared_age_warning_s: float = 600.0,
        connect_kwargs: dict[str, Any] | None = None,
        redact_rows: bool = False,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        self.redact_rows = redact_rows
        if mode not in ("append", "upsert"):
            raise ValueError(f"PostgresSink mode must be 'append' or 'upsert', got {mode!r}")
        if mode == "upsert" and not key:
            raise ValueError("PostgresSink(mode='upsert') needs key=[...] columns")
        if commit not in ("auto", "2pc", "staging"):
            raise ValueError(
                f"PostgresSink commit must be 'auto', '2pc' or 'staging', got {commit!r}"
            )
        self.commit_option: Commit = commit
        #: The protocol in use, chosen at the check (None: not yet; a task asks the server).
        self.protocol: Literal["2pc", "staging"] | None = None if commit == "auto" else commit
        self.staging_schema = staging_schema
        self.dsn = dsn
        self.schema, self.table = split_table(table)
        self.mode: Mode = mode
        self.key = tuple(key)
        self.create_table = create_table
        self.epoch_column = epoch_option(epoch_column, self.key)
        self.progress = progress_table or "txsink_progress"
        self.timeouts = Timeouts(
            connect_s=connect_timeout_s,
            stall_s=stall_timeout_s,
            tcp_user_timeout_ms=tcp_user_timeout_ms,
            keepalives_idle_s=keepalives_idle_s,
            statement_ms=statement_timeout_ms,
            lock_ms=lock_timeout_ms,
            idle_in_transaction_ms=idle_in_transaction_timeout_ms,
        )
        # How each column goes over binary COPY, read at the check (the executors get it
        # with the pickled sink); None: begin reads the table's types itself.
        self._plans: list[ColumnPlan] | None = None
        self.prepared_age_warning_s = prepared_age_warning_s
        self.connect_kwargs = dict(connect_kwargs or {})
        self._driver_conn: psycopg.Connection[Any] | None = None
        #: The columns that name a rejected row: ``key``, else the table's primary key
        #: (read at the check; the executors get it with the pickled sink).
        self._row_key: tuple[str, ...] = self.key
        self._evolution = None  # the epoch's planned schema change (evolve.py)

    @property
    @override
    def tables(self) -> Tables:
        """The target, progress and stage tables, quoted (the schema as resolved so far:
        :meth:`check` fills in the server's current schema when the table names none)."""
        return Tables(self.schema, self.table, self.progress)

    @property
    @override
    def qualified_table(self) -> str:
        return self.tables.qualified

    @property
    @override
    def staging(self) -> Staging:
        """The sink's staging table (the target's schema must be resolved)."""
        return Staging.of(self.tables, self.uid, self.staging_schema)

    def _stage_commit(self) -> StageCommit:
        return StageCommit(self.tables, self.staging, self.uid, key=self.key)

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_driver_conn"] = None  # connections do not travel to executors
        return state

    # -- driver: start -------------------------------------------------------------

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        import psycopg

        try:
            conn = self._driver("check")
            with self._stall(conn).guard("the start-up check"):
                if self.schema is None:
                    # Resolved once, on the driver: the executors get it with the pickled sink.
                    self.schema = str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
                protocol, why = choose_protocol(conn, self.commit_option)
                self.protocol = "staging" if protocol == "staging" else "2pc"
                _log.info(
                    "[uid=%s epoch=None] %s commits with %s: %s",
                    self.uid,
                    self.qualified_table,
                    "a staging table" if protocol == "staging" else "two-phase commit",
                    why,
                )
                self._plans = StartCheck(
                    conn,
                    self.tables,
                    uid=self.uid,
                    mode=self.mode,
                    key=self.key,
                    create_table=self.create_table,
                    server=redact_dsn(self.dsn),
                    prepared_age_warning_s=self.prepared_age_warning_s,
                    protocol=self.protocol,
                    staging=self.staging if self._stages else None,
                    app_id=app_id,
                    epoch_column=self.epoch_column,
                ).run(schema)
                if self._evolution is not None:  # its tasks stage, with the new columns
                    stage_columns(conn, self.staging, self._evolution)
                self._row_key = self.key or primary_key(conn, self.tables)
        except (psycopg.Error, TxsinkError) as err:
            if isinstance(err, (psycopg.OperationalError, RetryableError)):
                self._driver_conn = None
            ctx = {"sink_uid": self.uid, "connector": "postgres", "phase": "check"}
            server = redact_dsn(self.dsn)
            raise check_error(err, server=server, table=self.qualified_table, ctx=ctx) from err

    @override
    def required_partitioning(self) -> Partitioning | None:
        # Rows of one key must meet in one transaction: two prepared transactions
        # upserting the same key would wait on each other until the decision.
        return Partitioning(self.key) if self.mode == "upsert" else None

    # -- executor: write and prepare -----------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> OpenTxn:
        try:
            conn = self._connect(autocommit=False)
        except TxsinkError as err:
            self._map(err, txn, phase="begin")  # fills in the epoch, partition and phase
            raise
        stall = self._stall(conn)
        try:
            with stall.guard("begin"):
                if self.protocol is None:  # hooks driven without the check
                    self.protocol = "staging" if self._staged(conn) else "2pc"
                if self._stages:
                    self._resolve_schema(conn)
                    begin_staged(conn, str(txn))
                else:
                    conn.tpc_begin(str(txn))
                self.timeouts.set_local(conn)
                planned = [*(self._plans or ()), *added_plans(self._evolution)]
                plans = plans_for(conn, self.tables, planned, schema, sink_uid=self.uid)
                plans += epoch_plans(self.epoch_column)
                target = self.tables.ident()
                if self._stages:
                    target = self.staging.ident
                elif self.mode == "upsert":
                    target = create_stage(conn, self.tables, txn, [p.name for p in plans])
            names = RowNames(self._row_key, partition=txn.partition, redact=self.redact_rows)
            return start_copy(txn, conn, stall, target, plans, names=names)
        except Exception as err:
            conn.close()
            raise self._map(err, txn, phase="begin") from err

    def _staged(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether ``auto`` means staging on this server (a task's own answer)."""
        with conn.transaction():  # a failed SHOW must not end the task's transaction
            return choose_protocol(conn, self.commit_option)[0] == "staging"

    @override
    def write(self, txn: OpenTxn, batch: pa.RecordBatch) -> None:
        try:
            txn.write(batch)
        except Exception as err:
            raise self._map(err, txn.txn, phase="write", names=txn.names) from err

    @override
    def prepare(self, txn: OpenTxn) -> Handle:
        conn = txn.conn
        staged = self._stages
        try:
            txn.end_copy()
            with txn.stall.guard("prepare"):
                if staged:
                    # The rows are durable in staging and invisible in the target; the
                    # driver moves them after the decision.
                    conn.commit()
                    return StagedHandle(
                        txn=txn.txn,
                        rows=txn.rows,
                        nbytes=txn.nbytes,
                        staging=(self.staging.schema, self.staging.name),
                        columns=tuple(txn.columns),
                        key=self.key if self.mode == "upsert" else (),
                    )
                if self.mode == "upsert":
                    merge_stage(conn, self.tables, txn.txn, txn.columns, self.key)
                record_progress(conn, self.tables, txn.txn, txn.rows, sink_uid=self.uid)
                conn.tpc_prepare()
        except Exception as err:
            raise self._map(err, txn.txn, phase="prepare", names=txn.names) from err
        finally:
            conn.close()
        return PgHandle(txn=txn.txn, rows=txn.rows, nbytes=txn.nbytes)

    @override
    def discard(self, txn: OpenTxn) -> None:
        # Closing a connection whose transaction is not prepared rolls it back.
        txn.conn.close()

    # -- driver: commit, abort, recover ----------------------------------------------

    @override
    def commit_epoch(self, request: EpochCommit[Handle]) -> None:
        """Staged handles in one local transaction, with the epoch's schema change if any;
        prepared ones one by one; then the progress table's pruning. A log may hold both
        kinds (``auto`` chose another protocol after a server change): each handle is
        committed the way it was made. An evolving epoch's tasks staged (evolve.py)."""
        staged = [h for h in request.handles if isinstance(h, StagedHandle)]
        change = request.schema_change
        if staged or change is not None:
            rows = sum(h.rows for h in staged)
            txn = staged[0].txn if staged else None
            with self._on_driver(txn, "commit", rows=rows) as conn:
                self._resolve_schema(conn)
                lost = self._stage_commit().commit(conn, staged, change)
            if lost:
                raise lost
            request.committed(staged)
        for handle in request.handles:
            if not isinstance(handle, StagedHandle):
                self.commit(handle)
                request.committed([handle])
        if change is not None:
            self._plans = [*(self._plans or ()), *added_plans(change)]
            self._evolution = None
        self.finish_epoch(request.epoch, request.handles)

    @override
    def commit(self, handle: Handle) -> None:
        import psycopg

        gid = str(handle.txn)
        for attempt in range(_BUSY_TRIES):
            try:
                with self._on_driver(handle.txn, "commit") as conn:
                    commit_prepared(conn, gid)
                return
            except psycopg.errors.UndefinedObject:
                break  # no such gid: committed already, or lost: verify below
            except psycopg.errors.ObjectNotInPrerequisiteState as err:
                # "prepared transaction ... is busy": another session is finishing it.
                if attempt == _BUSY_TRIES - 1:
                    raise self._map(err, handle.txn, phase="commit") from err
                time.sleep(_BUSY_STEP_S * (attempt + 1))
        with self._on_driver(handle.txn, "commit") as conn:
            committed = was_committed(conn, self.tables, gid)
        if not committed:
            raise CommitError(
                f"cannot commit {gid}: PostgreSQL has no such prepared transaction and its "
                f"progress row is not in {self.progress}, so it was rolled back (by hand, or "
                f"by another tool) and its {handle.rows} rows are lost",
                sink_uid=self.uid,
                epoch=handle.txn.epoch,
                partition=handle.txn.partition,
                connector="postgres",
                phase="commit",
            )

    @override
    def finish_epoch(self, epoch: int, handles: Sequence[Handle]) -> None:
        # Progress rows only need to outlive recovery of the latest epochs.
        if handles:
            with self._on_driver(handles[0].txn, "commit") as conn:
                prune_progress(conn, self.tables, handles[0].txn.app, self.uid, epoch)

    @override
    def abort(self, handle: Handle) -> None:
        import psycopg

        try:
            with self._on_driver(handle.txn, "abort") as conn:
                if isinstance(handle, StagedHandle):
                    self._resolve_schema(conn)
                    self._stage_commit().abort(conn, handle)
                else:
                    rollback_prepared(conn, str(handle.txn))  # no such gid: gone already
        except psycopg.Error as err:
            raise self._map(err, handle.txn, phase="abort") from err

    @override
    def recorded_epoch(self, app_id: str) -> int | None:
        with self._on_driver(None, "check") as conn:
            return recorded_epoch(conn, self.tables, app_id, self.uid)

    @override
    def list_prepared(self, app_id: str) -> Iterator[Handle]:
        """Both kinds, whatever the protocol in use: a protocol change (``auto`` on a server
        whose setting changed) must not hide the other kind's leftovers."""
        prefix = f"txsink.{app_id}.{self.uid}."
        with self._on_driver(None, "recover") as conn:
            gids = prepared_gids(conn, prefix)
            self._resolve_schema(conn)
            staged = self._stage_commit().listed(conn, prefix)
        for gid in gids:
            txn = TxnId.try_parse(gid)
            if txn is not None and txn.belongs_to(app_id, self.uid):
                yield PgHandle(txn=txn)
        for gid, rows in staged.items():
            txn = TxnId.try_parse(gid)
            if txn is not None and txn.belongs_to(app_id, self.uid):
                yield StagedHandle(txn=txn, rows=rows)

    # -- operator: upgrades ----------------------------------------------------------

    @override
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """Re-label the progress rows, so the sink's own clean-up (by uid) reaches them; drop
        the old uid's staging table when it is empty (the new uid's is made at its check)."""
        import psycopg

        with self._connect(autocommit=True, phase="migrate") as conn:
            name = self.tables.progress_ident.as_string(conn)
            try:
                count = relabel_progress(
                    conn, self.tables, app_id=app_id, old=old, new=self.uid, dry_run=dry_run
                )
                self._resolve_schema(conn)
                staging = Staging.of(self.tables, old, self.staging_schema)
                dropped = drop_if_empty(conn, staging, dry_run=dry_run)
            except psycopg.Error as err:
                raise self._map(err, None, phase="migrate") from err
        lines = []
        if count is None:
            lines.append(f"{self!r}: no progress table {name}: nothing to re-label")
        else:
            verb = "would re-label" if dry_run else "re-labelled"
            lines.append(f"{self!r}: {verb} {count} progress row(s) of {name} from uid {old!r}")
        if dropped is not None:
            lines.append(f"{self!r}: {dropped} the staging table {staging.qualified} of {old!r}")
        return lines

    @override
    def __repr__(self) -> str:
        return (
            f"PostgresSink(uid={self.uid!r}, table={self.qualified_table!r}, "
            f"mode={self.mode!r}, commit={self.commit_option!r}, dsn={redact_dsn(self.dsn)!r})"
        )
