"""Postgres connector: exactly-once with PostgreSQL's own two-phase commit.

How the two phases map to PostgreSQL::

    begin    connect; BEGIN (psycopg tpc_begin with the transaction name as gid)
    write    COPY the Arrow batch into the table (append) or a stage table (upsert)
    prepare  upsert: INSERT ... ON CONFLICT from the stage; record progress; PREPARE TRANSACTION
    commit   COMMIT PREPARED gid, from the driver; "no such gid" is success only if the
             progress row written inside that transaction is visible
    abort    ROLLBACK PREPARED gid ("no such gid" = already gone)
    recover  pg_prepared_xacts rows whose gid is a txsink name of this app and sink

Guarantee: exactly-once. Needs ``max_prepared_transactions > 0`` on the server
(checked at start). A prepared transaction holds its locks until it is
committed or rolled back, so lingering ones block writers and vacuum: the
check at start warns about old ones, and recovery removes every one of ours.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.csv as pacsv
from typing_extensions import override

from txsink.errors import (
    CommitError,
    ConfigurationError,
    RetryableError,
    TxsinkError,
    WriteError,
)
from txsink.handles import Handle, register_handle
from txsink.log import LogStore
from txsink.sink import Partitioning, TwoPhaseCommitSink
from txsink.txid import TxnId

if TYPE_CHECKING:
    import psycopg

__all__ = ["PgHandle", "PostgresSink", "arrow_to_pg_type", "redact_dsn"]

Mode = Literal["append", "upsert"]
_log = logging.getLogger(__name__)
_COPY_LINE = re.compile(r"\bline (\d+)")
_ORD = "__txsink_ord"


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ``***`` (for logs, errors and reprs)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return "<unparseable dsn>"
    if "password" in params:
        params["password"] = "***"  # noqa: S105 - a redaction marker, not a password
    return make_conninfo("", **params)


@register_handle
@dataclass(frozen=True)
class PgHandle(Handle):
    """A prepared PostgreSQL transaction; its gid is ``str(txn)``."""

    serializer: ClassVar[str] = "postgres.prepared"
    version: ClassVar[int] = 1


@dataclass
class _OpenTxn:
    txn: TxnId
    conn: psycopg.Connection[Any]
    copy_cm: Any
    copy: Any
    csv: bool
    columns: list[str]
    target: str  # the table the COPY feeds (the stage table in upsert mode)
    rows: int = 0
    nbytes: int = 0


# Arrow type -> PostgreSQL column type for create_table, and the column types
# that can take it (checked at start).
def arrow_to_pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type ``create_table`` uses for an Arrow (Spark) type."""
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_int8(t) or pa.types.is_int16(t):
        return "smallint"
    if pa.types.is_int32(t):
        return "integer"
    if pa.types.is_int64(t):
        return "bigint"
    if pa.types.is_float32(t):
        return "real"
    if pa.types.is_float64(t):
        return "double precision"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytea"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = t.value_type
        if pa.types.is_nested(inner):
            return "jsonb"
        return arrow_to_pg_type(inner) + "[]"
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return "jsonb"
    raise ConfigurationError(f"no PostgreSQL type for Arrow type {t}")


_COMPATIBLE: dict[str, set[str]] = {
    "boolean": {"boolean", "text"},
    "smallint": {"smallint", "integer", "bigint", "numeric", "real", "double precision", "text"},
    "integer": {"integer", "bigint", "numeric", "double precision", "text"},
    "bigint": {"bigint", "numeric", "text"},
    "real": {"real", "double precision", "numeric", "text"},
    "double precision": {"double precision", "numeric", "text"},
    "numeric": {"numeric", "text"},
    "text": {
        "text",
        "character varying",
        "character",
        "json",
        "jsonb",
        "uuid",
        "citext",
        "inet",
        "cidr",
        "xml",
        "name",
        "bpchar",
    },
    "bytea": {"bytea"},
    "date": {"date", "timestamp without time zone", "timestamp with time zone", "text"},
    "timestamp with time zone": {"timestamp with time zone", "timestamp without time zone", "text"},
    "timestamp without time zone": {
        "timestamp without time zone",
        "timestamp with time zone",
        "text",
    },
    "jsonb": {"jsonb", "json", "text"},
}


def _compatible(arrow_type: pa.DataType, pg_type: str) -> bool:
    want = arrow_to_pg_type(arrow_type)
    base_pg = re.sub(r"\(.*\)", "", pg_type).strip()
    if want.endswith("[]"):
        return base_pg.endswith("[]") or base_pg in ("jsonb", "json", "text")
    base_want = re.sub(r"\(.*\)", "", want).strip()
    if base_pg.endswith("[]"):
        return False
    return base_pg in _COMPATIBLE.get(base_want, {base_want})


def _csv_writable(t: pa.DataType) -> bool:
    """Types pyarrow's CSV writer renders in a form PostgreSQL's COPY CSV reads back exactly."""
    return not (pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t))


class PostgresSink(TwoPhaseCommitSink[_OpenTxn, PgHandle]):
    """Exactly-once rows into a PostgreSQL table.

    Args:
        dsn: a libpq connection string or URL; TLS and any libpq option pass through.
        table: target table, ``"name"`` or ``"schema.name"`` (quoted as identifiers).
        uid: the sink's stable id.
        mode: ``append`` (COPY) or ``upsert`` (COPY to a stage table, then
            ``INSERT ... ON CONFLICT (key) DO UPDATE``; the last row of a key wins).
        key: the upsert key columns (a unique index on exactly them must exist).
        create_table: create the table from the DataFrame's schema if missing.
        progress_table: the table recording which transactions committed
            (created if missing; default ``txsink_progress`` in the table's schema).
        statement_timeout_ms, lock_timeout_ms: applied to every task connection.
        prepared_age_warning_s: warn at start about prepared transactions older than this.
        connect_kwargs: extra keyword arguments for ``psycopg.connect``.
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
        create_table: bool = False,
        progress_table: str | None = None,
        statement_timeout_ms: int | None = None,
        lock_timeout_ms: int | None = 30_000,
        prepared_age_warning_s: float = 600.0,
        connect_kwargs: dict[str, Any] | None = None,
        log: str | LogStore | None = None,
        **coordinator_options: Any,
    ) -> None:
        super().__init__(uid, log=log, **coordinator_options)
        if mode not in ("append", "upsert"):
            raise ValueError(f"PostgresSink mode must be 'append' or 'upsert', got {mode!r}")
        if mode == "upsert" and not key:
            raise ValueError("PostgresSink(mode='upsert') needs key=[...] columns")
        self.dsn = dsn
        self.schema, self.table = _split_table(table)
        self.mode: Mode = mode
        self.key = tuple(key)
        self.create_table = create_table
        self.progress = progress_table or "txsink_progress"
        self.statement_timeout_ms = statement_timeout_ms
        self.lock_timeout_ms = lock_timeout_ms
        self.prepared_age_warning_s = prepared_age_warning_s
        self.connect_kwargs = dict(connect_kwargs or {})
        self._driver_conn: psycopg.Connection[Any] | None = None

    # -- connections ---------------------------------------------------------------

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        import psycopg

        try:
            conn = psycopg.connect(self.dsn, autocommit=autocommit, **self.connect_kwargs)
        except psycopg.OperationalError as err:
            raise RetryableError(
                f"cannot connect to PostgreSQL at {redact_dsn(self.dsn)}: "
                f"{str(err).strip().splitlines()[0] if str(err).strip() else err!r}",
                sink_uid=self.uid,
                connector="postgres",
            ) from err
        return conn

    def _driver(self) -> psycopg.Connection[Any]:
        if self._driver_conn is None or self._driver_conn.closed:
            self._driver_conn = self._connect(autocommit=True)
        return self._driver_conn

    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_driver_conn"] = None  # connections do not travel to executors
        return state

    def _ident(self, name: str | None = None) -> Any:
        from psycopg import sql

        if name is None:
            return (
                sql.Identifier(self.schema, self.table)
                if self.schema
                else sql.Identifier(self.table)
            )
        return sql.Identifier(self.schema, name) if self.schema else sql.Identifier(name)

    @property
    def qualified_table(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    # -- driver: start -------------------------------------------------------------

    @override
    def check(self, schema: pa.Schema, app_id: str) -> None:
        import psycopg

        try:
            self._check(schema)
        except psycopg.errors.InsufficientPrivilege as err:
            raise ConfigurationError(
                f"the connecting role lacks a privilege txsink needs at start: "
                f"{(err.diag.message_primary or str(err)).strip()}. It needs INSERT (and UPDATE "
                f"for upsert) on {self.qualified_table}, and CREATE on its schema for the "
                f"progress table {self.progress!r} (or create that table beforehand)",
                sink_uid=self.uid,
                connector="postgres",
                phase="check",
            ) from err
        except psycopg.OperationalError as err:
            self._driver_conn = None
            raise RetryableError(
                f"PostgreSQL at {redact_dsn(self.dsn)} failed during the start-up check: "
                f"{(err.diag.message_primary or str(err)).strip()}",
                sink_uid=self.uid,
                connector="postgres",
                phase="check",
            ) from err

    def _check(self, schema: pa.Schema) -> None:
        from psycopg import sql

        conn = self._driver()
        ctx: dict[str, Any] = {"sink_uid": self.uid, "connector": "postgres", "phase": "check"}
        max_prepared = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])  # type: ignore[index]
        if max_prepared == 0:
            raise ConfigurationError(
                f"PostgreSQL at {redact_dsn(self.dsn)} has max_prepared_transactions = 0, so "
                "it cannot PREPARE TRANSACTION (two-phase commit). Set max_prepared_transactions "
                "to at least the number of Spark partitions times the number of Postgres sinks "
                "(e.g. 100) in postgresql.conf and restart the server",
                **ctx,
            )
        if self.schema is None:
            self.schema = str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]
        columns = self._table_columns(conn)
        if columns is None:
            if not self.create_table:
                raise ConfigurationError(
                    f"table {self.qualified_table} does not exist: create it, or pass "
                    "create_table=True to create it from the DataFrame's schema",
                    **ctx,
                )
            self._create(conn, schema)
            columns = self._table_columns(conn) or {}
        for field in schema:
            if field.name not in columns:
                raise ConfigurationError(
                    f"table {self.qualified_table} has no column {field.name!r} (the DataFrame "
                    f"has it): add the column or drop it from the DataFrame before the sink",
                    column=field.name,
                    **ctx,
                )
            pg_type, _ = columns[field.name]
            if not _compatible(field.type, pg_type):
                raise ConfigurationError(
                    f"column {field.name!r} of {self.qualified_table} is {pg_type}, which cannot "
                    f"take the DataFrame's {field.type} (maps to {arrow_to_pg_type(field.type)}): "
                    "cast the column in Spark or change the table",
                    column=field.name,
                    **ctx,
                )
        for name, (_, required) in columns.items():
            if required and name not in schema.names:
                raise ConfigurationError(
                    f"column {name!r} of {self.qualified_table} is NOT NULL without a default, "
                    "but the DataFrame has no such column",
                    column=name,
                    **ctx,
                )
        for key in self.key:
            if key not in schema.names:
                raise ConfigurationError(
                    f"upsert key column {key!r} is not in the DataFrame", column=key, **ctx
                )
        if self.mode == "upsert":
            self._check_unique_key(conn, ctx)
        privileges = ["INSERT"] + (["UPDATE"] if self.mode == "upsert" else [])
        for privilege in privileges:
            ok = conn.execute(
                "SELECT has_table_privilege(%s, %s)", (self._regclass(), privilege)
            ).fetchone()[0]  # type: ignore[index]
            if not ok:
                raise ConfigurationError(
                    f"the connecting role lacks {privilege} on {self.qualified_table}: "
                    f"GRANT {privilege} ON {self.qualified_table} TO <role>",
                    **ctx,
                )
        # Look first: PostgreSQL checks the CREATE privilege even for IF NOT EXISTS,
        # so a role without it must be able to use a table created beforehand.
        found = conn.execute("SELECT to_regclass(%s)", (self._regclass(self.progress),)).fetchone()
        if found is None or found[0] is None:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (app_id text NOT NULL, uid text NOT NULL, "
                    "gid text PRIMARY KEY, epoch bigint NOT NULL, partition integer NOT NULL, "
                    "rows bigint NOT NULL, prepared_at timestamptz NOT NULL DEFAULT now())"
                ).format(self._ident(self.progress))
            )
        for privilege in ("INSERT", "SELECT", "DELETE"):
            ok = conn.execute(
                "SELECT has_table_privilege(%s, %s)", (self._regclass(self.progress), privilege)
            ).fetchone()[0]  # type: ignore[index]
            if not ok:
                raise ConfigurationError(
                    f"the connecting role lacks {privilege} on the progress table "
                    f"{self.schema}.{self.progress}: GRANT INSERT, SELECT, DELETE ON it",
                    **ctx,
                )
        self._warn_old_prepared(conn)

    def _regclass(self, name: str | None = None) -> str:

        return self._ident(name).as_string(None)  # type: ignore[no-any-return]

    def _table_columns(self, conn: psycopg.Connection[Any]) -> dict[str, tuple[str, bool]] | None:
        rows = conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), "
            "a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = '' "
            "FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 "
            "AND NOT a.attisdropped ORDER BY a.attnum",
            (self._regclass(),),
        ).fetchall()
        if not rows:
            exists = conn.execute("SELECT to_regclass(%s)", (self._regclass(),)).fetchone()
            if exists is None or exists[0] is None:
                return None
        return {str(r[0]): (str(r[1]), bool(r[2])) for r in rows}

    def _create(self, conn: psycopg.Connection[Any], schema: pa.Schema) -> None:
        from psycopg import sql

        cols = [
            sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(arrow_to_pg_type(f.type)))
            for f in schema
        ]
        if self.key:
            cols.append(
                sql.SQL("PRIMARY KEY ({})").format(
                    sql.SQL(", ").join(sql.Identifier(k) for k in self.key)
                )
            )
        conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                self._ident(), sql.SQL(", ").join(cols)
            )
        )
        _log.info("[uid=%s epoch=None] created table %s", self.uid, self.qualified_table)

    def _check_unique_key(self, conn: psycopg.Connection[Any], ctx: dict[str, Any]) -> None:
        rows = conn.execute(
            "SELECT array_agg(a.attname ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL "
            "GROUP BY i.indexrelid",
            (self._regclass(),),
        ).fetchall()
        if sorted(self.key) not in [sorted(r[0]) for r in rows]:
            raise ConfigurationError(
                f"upsert on {self.qualified_table} needs a unique index or primary key on "
                f"exactly {list(self.key)} (ON CONFLICT needs it): CREATE UNIQUE INDEX ON "
                f"{self.qualified_table} ({', '.join(self.key)})",
                **ctx,
            )

    def _warn_old_prepared(self, conn: psycopg.Connection[Any]) -> None:
        rows = conn.execute(
            "SELECT gid, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts "
            "WHERE database = current_database() AND prepared < now() - make_interval(secs => %s)",
            (self.prepared_age_warning_s,),
        ).fetchall()
        for gid, age in rows:
            _log.warning(
                "[uid=%s epoch=None] prepared transaction %s is %.0f s old: it holds locks and "
                "blocks vacuum until committed or rolled back (txsink recovery rolls back its "
                "own; others need ROLLBACK PREPARED by hand)",
                self.uid,
                gid,
                float(age),
            )

    @override
    def required_partitioning(self) -> Partitioning | None:
        # Rows of one key must meet in one transaction: two prepared transactions
        # upserting the same key would wait on each other until the decision.
        return Partitioning(self.key) if self.mode == "upsert" else None

    # -- executor: write and prepare -----------------------------------------------

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> _OpenTxn:
        from psycopg import sql

        conn = self._connect(autocommit=False)
        try:
            conn.tpc_begin(str(txn))
            if self.statement_timeout_ms is not None:
                conn.execute(
                    sql.SQL("SET LOCAL statement_timeout = {}").format(
                        sql.Literal(f"{int(self.statement_timeout_ms)}ms")
                    )
                )
            if self.lock_timeout_ms is not None:
                conn.execute(
                    sql.SQL("SET LOCAL lock_timeout = {}").format(
                        sql.Literal(f"{int(self.lock_timeout_ms)}ms")
                    )
                )
            columns = list(schema.names)
            target = self._ident()
            if self.mode == "upsert":
                target = self._ident(_stage_name(txn))
                conn.execute(
                    sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
                        target,
                        sql.SQL(", ").join(sql.Identifier(c) for c in columns),
                        self._ident(),
                    )
                )
                conn.execute(
                    sql.SQL(
                        "ALTER TABLE {} ADD COLUMN {} bigint GENERATED ALWAYS AS IDENTITY"
                    ).format(target, sql.Identifier(_ORD))
                )
            csv = all(_csv_writable(f.type) for f in schema)
            fmt = sql.SQL("(FORMAT CSV)") if csv else sql.SQL("")
            stmt = sql.SQL("COPY {} ({}) FROM STDIN {}").format(
                target, sql.SQL(", ").join(sql.Identifier(c) for c in columns), fmt
            )
            cm = conn.cursor().copy(stmt)
            copy = cm.__enter__()
            return _OpenTxn(txn, conn, cm, copy, csv, columns, target.as_string(conn))
        except Exception as err:
            conn.close()
            raise self._map(err, txn, phase="begin") from err

    @override
    def write(self, txn: _OpenTxn, batch: pa.RecordBatch) -> None:
        try:
            if txn.csv:
                buf = io.BytesIO()
                pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
                data = buf.getvalue()
                txn.copy.write(data)
                txn.nbytes += len(data)
            else:
                for row in _rows_for_copy(batch):
                    txn.copy.write_row(row)
                txn.nbytes += batch.nbytes
        except Exception as err:
            raise self._map(err, txn.txn, phase="write") from err
        txn.rows += batch.num_rows

    @override
    def prepare(self, txn: _OpenTxn) -> PgHandle:
        from psycopg import sql

        conn = txn.conn
        try:
            txn.copy_cm.__exit__(None, None, None)
            if self.mode == "upsert":
                cols = sql.SQL(", ").join(sql.Identifier(c) for c in txn.columns)
                keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.key)
                updates = [c for c in txn.columns if c not in self.key]
                action = (
                    sql.SQL("DO UPDATE SET {}").format(
                        sql.SQL(", ").join(
                            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                            for c in updates
                        )
                    )
                    if updates
                    else sql.SQL("DO NOTHING")
                )
                stage = self._ident(_stage_name(txn.txn))
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} "
                        "ORDER BY {}, {} DESC ON CONFLICT ({}) {}"
                    ).format(
                        self._ident(),
                        cols,
                        keys,
                        cols,
                        stage,
                        keys,
                        sql.Identifier(_ORD),
                        keys,
                        action,
                    )
                )
                conn.execute(sql.SQL("DROP TABLE {}").format(stage))
            self._record_progress(conn, txn)
            conn.tpc_prepare()
        except Exception as err:
            raise self._map(err, txn.txn, phase="prepare") from err
        finally:
            conn.close()
        return PgHandle(txn=txn.txn, rows=txn.rows, nbytes=txn.nbytes)

    def _record_progress(self, conn: psycopg.Connection[Any], txn: _OpenTxn) -> None:
        import psycopg
        from psycopg import sql

        t = txn.txn
        try:
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} (app_id, uid, gid, epoch, partition, rows) "
                    "VALUES (%s, %s, %s, %s, %s, %s)"
                ).format(self._ident(self.progress)),
                (t.app, t.uid, str(t), t.epoch, t.partition, txn.rows),
            )
        except psycopg.errors.UniqueViolation as err:
            # Not a bad row: the same transaction name committed before, so this
            # target has history the txsink log does not know about.
            raise ConfigurationError(
                f"{self.schema}.{self.progress} already records a committed transaction named "
                f"{t}: this table was written by an earlier pipeline with the same app id and "
                "sink uid, whose txsink log is not this one (a new log with an old app_id?). "
                "Keep the old txsink log, or use a new sink uid",
                sink_uid=self.uid,
                epoch=t.epoch,
                partition=t.partition,
                connector="postgres",
                phase="prepare",
            ) from err

    @override
    def discard(self, txn: _OpenTxn) -> None:
        # Closing a connection whose transaction is not prepared rolls it back.
        txn.conn.close()

    # -- driver: commit, abort, recover ----------------------------------------------

    @override
    def commit(self, handle: PgHandle) -> None:
        import psycopg
        from psycopg import sql

        gid = str(handle.txn)
        for attempt in range(5):
            try:
                self._driver().execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
                return
            except psycopg.errors.UndefinedObject:
                break  # no such gid: committed already, or lost: verify below
            except psycopg.errors.ObjectNotInPrerequisiteState as err:
                # "prepared transaction ... is busy": another session is finishing it.
                if attempt == 4:
                    raise self._map(err, handle.txn, phase="commit") from err
                time.sleep(0.2 * (attempt + 1))
            except psycopg.Error as err:
                self._driver_conn = None
                raise self._map(err, handle.txn, phase="commit") from err
        if not self._committed(gid):
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

    def _committed(self, gid: str) -> bool:
        from psycopg import sql

        row = (
            self._driver()
            .execute(
                sql.SQL("SELECT 1 FROM {} WHERE gid = %s").format(self._ident(self.progress)),
                (gid,),
            )
            .fetchone()
        )
        return row is not None

    @override
    def abort(self, handle: PgHandle) -> None:
        import psycopg
        from psycopg import sql

        try:
            self._driver().execute(
                sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(str(handle.txn)))
            )
        except psycopg.errors.UndefinedObject:
            return  # already gone
        except psycopg.Error as err:
            self._driver_conn = None
            raise self._map(err, handle.txn, phase="abort") from err

    @override
    def list_prepared(self, app_id: str) -> Iterator[PgHandle]:
        prefix = f"txsink.{app_id}.{self.uid}."
        rows = (
            self._driver()
            .execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND starts_with(gid, %s) ORDER BY gid",
                (prefix,),
            )
            .fetchall()
        )
        for (gid,) in rows:
            txn = TxnId.try_parse(gid)
            if txn is not None and txn.belongs_to(app_id, self.uid):
                yield PgHandle(txn=txn)

    @override
    def finish_epoch(self, epoch: int, handles: Sequence[PgHandle]) -> None:
        from psycopg import sql

        # Progress rows only need to outlive recovery of the latest epochs.
        if handles:
            self._driver().execute(
                sql.SQL("DELETE FROM {} WHERE app_id = %s AND uid = %s AND epoch < %s").format(
                    self._ident(self.progress)
                ),
                (handles[0].txn.app, self.uid, epoch - 1000),
            )

    # -- errors --------------------------------------------------------------------

    @override
    def migrate_uid(self, old: str, *, app_id: str, dry_run: bool = False) -> list[str]:
        """Re-label the progress rows, so the sink's own clean-up (by uid) reaches them."""
        from psycopg import sql

        table = self._ident(self.progress)
        with self._connect(autocommit=True) as conn:
            name = table.as_string(conn)
            found = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
            if found is None or found[0] is None:
                return [f"{self!r}: no progress table {name}: nothing to re-label"]
            if dry_run:
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {} WHERE app_id = %s AND uid = %s").format(
                        table
                    ),
                    (app_id, old),
                ).fetchone()
                count = int(row[0]) if row else 0
            else:
                cur = conn.execute(
                    sql.SQL("UPDATE {} SET uid = %s WHERE app_id = %s AND uid = %s").format(table),
                    (self.uid, app_id, old),
                )
                count = cur.rowcount
        verb = "would re-label" if dry_run else "re-labelled"
        return [f"{self!r}: {verb} {count} progress row(s) of {name} from uid {old!r}"]

    def _map(self, err: BaseException, txn: TxnId, *, phase: str) -> TxsinkError:
        """Map a psycopg error by SQLSTATE class to a txsink error with context."""
        import psycopg

        if isinstance(err, TxsinkError):
            return err.with_context(
                sink_uid=self.uid,
                partition=txn.partition,
                epoch=txn.epoch,
                phase=phase,
                connector="postgres",
            )
        ctx: dict[str, Any] = {
            "sink_uid": self.uid,
            "epoch": txn.epoch,
            "partition": txn.partition,
            "phase": phase,
            "connector": "postgres",
        }
        if not isinstance(err, psycopg.Error):
            return WriteError(f"{type(err).__name__}: {err}", **ctx)
        state = err.sqlstate or ""
        diag = err.diag
        summary = (diag.message_primary or str(err)).strip()
        if state[:2] in ("22", "23"):  # data exception, integrity constraint violation
            column = diag.column_name
            row = None
            m = _COPY_LINE.search(diag.context or "")
            if m is not None:
                row = int(m.group(1)) - 1  # COPY numbers lines from 1
                column = column or _copy_column(diag.context or "")
            return WriteError(
                f"{self.qualified_table} rejected a row (SQLSTATE {state}): {summary}. "
                "Fix or filter the offending rows (or the table's constraint) and restart "
                "the query; nothing of this epoch was committed",
                row=row,
                column=column,
                **ctx,
            )
        if state[:2] in ("08", "53", "57") or state in ("40001", "40P01", "55P03"):
            return RetryableError(
                f"transient PostgreSQL error (SQLSTATE {state}): {summary}", **ctx
            )
        return TxsinkError(f"PostgreSQL error (SQLSTATE {state}): {summary}", **ctx)

    @override
    def __repr__(self) -> str:
        return (
            f"PostgresSink(uid={self.uid!r}, table={self.qualified_table!r}, "
            f"mode={self.mode!r}, dsn={redact_dsn(self.dsn)!r})"
        )


def _split_table(table: str) -> tuple[str | None, str]:
    parts = table.split(".")
    if len(parts) == 1:
        return None, parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"table must be 'name' or 'schema.name', got {table!r}")


def _stage_name(txn: TxnId) -> str:
    return "txsink_stage_" + hashlib.sha256(str(txn).encode()).hexdigest()[:24]


def _copy_column(context: str) -> str | None:
    m = re.search(r"column (\S+?):", context)
    return m.group(1) if m else None


def _rows_for_copy(batch: pa.RecordBatch) -> Iterator[tuple[Any, ...]]:
    """Rows for psycopg's ``write_row``: nested values become JSON or arrays."""
    from psycopg.types.json import Jsonb

    fields = list(batch.schema)
    columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]

    def convert(value: Any, t: pa.DataType) -> Any:
        if value is None:
            return None
        if pa.types.is_map(t):
            return Jsonb({str(k): v for k, v in value})
        if pa.types.is_struct(t):
            return Jsonb(value)
        if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_nested(t.value_type):
            return Jsonb(value)
        return value

    for i in range(batch.num_rows):
        yield tuple(convert(columns[c][i], fields[c].type) for c in range(len(fields)))
