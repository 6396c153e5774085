"""What a Postgres sink verifies at start, on the driver, before anything is written.

In order, each failure a :class:`~txsink.errors.ConfigurationError` that names the fix:

1. the commit protocol (:func:`choose_protocol`): two-phase commit needs
   ``max_prepared_transactions > 0`` (else the server cannot PREPARE TRANSACTION); the
   staging commit (:mod:`~txsink.connectors.postgres.staging`) needs none;
1a. the table's schema exists (its absence is the primary cause, not the rights on it);
1b. every right the mode needs (:mod:`~txsink.connectors.postgres.grants`), in one query:
   one error names each missing privilege, its object and the ``GRANT`` that fixes it;
   and this sink's prepared transactions, if any, belong to the connecting role (only it,
   or a superuser, may finish them);
2. the table exists, or is created from the DataFrame's schema (``create_table=True``);
3. every DataFrame column exists with a type binary COPY can fill from it (its plan,
   :func:`~txsink.connectors.postgres.casts.plan_column`, kept for the tasks); every NOT
   NULL column without a default is in the DataFrame; the upsert key columns are; a
   warning for every nullable DataFrame column into a NOT NULL column (not a refusal: Spark
   marks most columns nullable, and most hold no NULL; one that arrives refuses its epoch
   at pre-commit, before the decision, naming the row); ``epoch_column``
   (:mod:`~txsink.connectors.postgres.epochs`): not in the DataFrame, ``bigint`` in the table;
4. upsert: a unique index (or primary key) on exactly the key, which ON CONFLICT needs;
5. (the rights, checked at 1b);
6. the progress table exists (created if missing) and the role may use it;
7. a warning for every prepared transaction older than ``prepared_age_warning_s``:
   it holds its locks and blocks vacuum until someone finishes it;
8. staging: the target has nothing a staged row could meet only at the move, after the
   decision (:func:`~txsink.connectors.postgres.staging.refusals`); a warning for each
   trigger on it (it runs at the move); the staging table exists (created if missing)
   and the role may use it.

The only writes: the table (2, when asked), the progress table (6), the staging table (8).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.connectors.postgres import grants
from txsink.connectors.postgres.casts import ColumnPlan, Unsendable, plan_column
from txsink.connectors.postgres.epochs import check_epoch_column, not_carried
from txsink.connectors.postgres.prepared import foreign_owner, old_prepared
from txsink.connectors.postgres.progress import ensure_progress_table
from txsink.connectors.postgres.staging import Staging, ensure_staging, refusals, triggers
from txsink.connectors.postgres.types import arrow_to_pg_type
from txsink.errors import ConfigurationError

if TYPE_CHECKING:
    import psycopg

    from txsink.connectors.postgres.tables import Tables

__all__ = [
    "StartCheck",
    "choose_protocol",
    "nullable_into_not_null",
    "plan_columns",
    "plans_for",
    "table_columns",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartCheck:
    """The checks of one sink on the driver's connection ``conn``.

    ``tables`` has its schema resolved; ``server`` is the DSN as it may be shown
    (redacted). The other fields are the sink's options of the same names.
    """

    conn: psycopg.Connection[Any]
    tables: Tables
    uid: str
    mode: str
    key: Sequence[str]
    create_table: bool
    server: str
    prepared_age_warning_s: float
    #: The commit protocol :func:`choose_protocol` chose: ``"2pc"`` or ``"staging"``.
    protocol: str = "2pc"
    #: The staging table (``protocol == "staging"``).
    staging: Staging | None = None
    #: The app id (its prepared transactions' owner is checked); "": not checked.
    app_id: str = ""
    #: The column the sink fills with each row's epoch (:mod:`.epochs`); None: none.
    epoch_column: str | None = None

    @property
    def _ctx(self) -> dict[str, Any]:
        return {"sink_uid": self.uid, "connector": "postgres", "phase": "check"}

    def run(self, schema: pa.Schema) -> list[ColumnPlan]:
        """Every check, in the order of the module's list, for rows of ``schema``; returns
        how each column goes over binary COPY."""
        import psycopg

        try:
            if self.protocol == "2pc":
                self._two_phase_commit()
            # A schema that is not there is the primary cause, not the rights on it.
            self._schema_exists()
            self._rights()
            self._prepared_owner()
            plans = self._columns(schema)
            self._warn_nullable(schema)
            if self.mode == "upsert":
                self._unique_key()
            ensure_progress_table(self.conn, self.tables, self._ctx)
            self._warn_old_prepared()
            if self.staging is not None:
                self._staging(schema)
            return plans
        except psycopg.errors.InsufficientPrivilege as err:
            table = self.tables.qualified
            raise ConfigurationError(
                f"the connecting role lacks a privilege txsink needs at start: "
                f"{(err.diag.message_primary or str(err)).strip()}. It needs INSERT (and UPDATE "
                f"for upsert) on {table}, and CREATE on its schema for the "
                f"progress table {self.tables.progress!r} (or create that table beforehand)",
                **self._ctx,
            ) from err

    def _two_phase_commit(self) -> None:
        max_prepared = int(self.conn.execute("SHOW max_prepared_transactions").fetchone()[0])  # type: ignore[index]
        if max_prepared == 0:
            raise ConfigurationError(
                f"PostgreSQL at {self.server} has max_prepared_transactions = 0, so "
                "it cannot PREPARE TRANSACTION (two-phase commit). Set max_prepared_transactions "
                "to at least the number of Spark partitions times the number of Postgres sinks "
                "(e.g. 100) in postgresql.conf and restart the server; or use the staging "
                "commit, which needs no server change (commit='staging', or the default "
                "commit='auto')",
                **self._ctx,
            )

    def _staging(self, schema: pa.Schema) -> None:
        if self.staging is None:
            return
        table = self.tables.qualified
        sent = [*schema.names, *([self.epoch_column] if self.epoch_column else [])]
        refused = refusals(self.conn, self.tables, self.mode, self.key, sent)
        if refused:
            fix = (
                "use mode='upsert' with key= on the unique columns"
                if self.mode == "append"
                else "drop it, or send every column it reads"
            )
            raise ConfigurationError(
                f"{table} has {refused}: the staging commit moves the rows into {table} "
                "after the decision, where such a constraint could still refuse them (it "
                "depends on rows other writers change), and nothing decided may fail. "
                f"Fix: {fix}; or use two-phase commit (commit='2pc', which checks them "
                "before the decision; it needs max_prepared_transactions > 0 on the server)",
                **self._ctx,
            )
        for name in triggers(self.conn, self.tables):
            _log.warning(
                "[uid=%s epoch=None] trigger %s on %s runs when the staging commit moves an "
                "epoch's rows in, after the decision: if it can raise, a decided epoch stays "
                "blocked until it is fixed (commit='2pc' runs it before the decision)",
                self.uid,
                name,
                table,
            )
        if ensure_staging(
            self.conn,
            self.tables,
            self.staging,
            columns=sent,
            mode=self.mode,
            ctx=self._ctx,
        ):
            _log.info(
                "[uid=%s epoch=None] created the staging table %s for %s",
                self.uid,
                self.staging.qualified,
                table,
            )

    def _columns(self, schema: pa.Schema) -> list[ColumnPlan]:
        table = self.tables.qualified
        if self.epoch_column is not None:
            not_carried(schema, self.epoch_column, table, self._ctx)
        columns = table_columns(self.conn, self.tables)
        if columns is None:
            self._schema_exists()
            if not self.create_table:
                raise ConfigurationError(
                    f"table {table} does not exist: create it, or pass "
                    "create_table=True to create it from the DataFrame's schema",
                    **self._ctx,
                )
            self._create(schema)
            columns = table_columns(self.conn, self.tables) or {}
        if self.epoch_column is not None:
            check_epoch_column(columns, self.tables, self.epoch_column, self._ctx)
        plans = plan_columns(columns, schema, table, self._ctx)
        for name, (_, required) in columns.items():
            if required and name not in (*schema.names, self.epoch_column):
                raise ConfigurationError(
                    f"column {name!r} of {table} is NOT NULL without a default, "
                    "but the DataFrame has no such column",
                    column=name,
                    **self._ctx,
                )
        for key in self.key:
            if key not in schema.names:
                raise ConfigurationError(
                    f"upsert key column {key!r} is not in the DataFrame", column=key, **self._ctx
                )
        return plans

    def _warn_nullable(self, schema: pa.Schema) -> None:
        for name in nullable_into_not_null(self.conn, self.tables, schema):
            _log.warning(
                "[uid=%s epoch=None] column %r of %s is NOT NULL, and the DataFrame's %r is "
                "nullable: a NULL in it refuses its epoch at pre-commit (before the decision, "
                "naming the row), and the query stops until it is fixed. If it may hold NULLs, "
                "filter them (df.where(col(%r).isNotNull())) or fill a default "
                "(coalesce(col(%r), lit(...))) before the sink; else accept the risk",
                self.uid,
                name,
                self.tables.qualified,
                name,
                name,
                name,
            )

    def _schema_exists(self) -> None:
        """The table's schema exists: ``create_table`` creates a table, never its schema."""
        from psycopg import sql

        name = self.tables.schema
        found = self.conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (name,))
        if name is not None and found.fetchone() is None:
            raise ConfigurationError(
                f"schema {name!r} of table {self.tables.qualified} does not exist: create it "
                f"(CREATE SCHEMA {sql.Identifier(name).as_string(None)}) and the table, or "
                "pass create_table=True once the schema exists (it creates the table, not "
                "its schema); or name an existing schema in table=",
                **self._ctx,
            )

    def _create(self, schema: pa.Schema) -> None:
        from psycopg import sql

        cols = [
            sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(arrow_to_pg_type(f.type)))
            for f in schema
        ]
        if self.epoch_column is not None:
            cols.append(sql.SQL("{} bigint").format(sql.Identifier(self.epoch_column)))
        if self.key:
            cols.append(
                sql.SQL("PRIMARY KEY ({})").format(
                    sql.SQL(", ").join(sql.Identifier(k) for k in self.key)
                )
            )
        self.conn.execute(
            sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                self.tables.ident(), sql.SQL(", ").join(cols)
            )
        )
        _log.info("[uid=%s epoch=None] created table %s", self.uid, self.tables.qualified)

    def _unique_key(self) -> None:
        rows = self.conn.execute(
            "SELECT array_agg(a.attname ORDER BY a.attname) FROM pg_index i "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indpred IS NULL "
            "GROUP BY i.indexrelid",
            (self.tables.regclass(),),
        ).fetchall()
        if sorted(self.key) not in [sorted(r[0]) for r in rows]:
            table = self.tables.qualified
            raise ConfigurationError(
                f"upsert on {table} needs a unique index or primary key on "
                f"exactly {list(self.key)} (ON CONFLICT needs it): CREATE UNIQUE INDEX ON "
                f"{table} ({', '.join(self.key)})",
                **self._ctx,
            )

    def needed(self) -> list[grants.Right]:
        """The rights this sink needs (:func:`~txsink.connectors.postgres.grants.rights`)."""
        schema = self.tables.schema or "public"
        return grants.rights(
            schema=schema,
            table=self.tables.table,
            mode=self.mode,
            commit=self.protocol,
            progress=self.tables.progress,
            progress_exists=grants.exists(self.conn, schema, self.tables.progress),
            staging_schema=self.staging.schema if self.staging is not None else None,
            table_exists=grants.exists(self.conn, schema, self.tables.table),
            create_table=self.create_table,
        )

    def _rights(self) -> None:
        """Every right at once, before anything is created or written: a role missing three
        grants hears of all three in one start, each with the line that fixes it."""
        lacking = grants.missing(self.conn, self.needed())
        if not lacking:
            return
        role = str(self.conn.execute("SELECT current_user").fetchone()[0])  # type: ignore[index]
        lines = "".join(
            f"\n  - {r.privilege} on {r.on} ({r.why}): {r.grant(role)}" for r in lacking
        )
        raise ConfigurationError(
            f"the role {role!r} lacks {len(lacking)} right(s) this sink needs "
            f"(mode={self.mode!r}, commit={self.protocol!r}); nothing was written:{lines}\n"
            "Grant them as an administrator (docs/security.md lists every mode's rights), or "
            "connect as a role that has them",
            **self._ctx,
        )

    def _prepared_owner(self) -> None:
        """Only the role that prepared a transaction, or a superuser, may COMMIT PREPARED or
        ROLLBACK PREPARED it: a sink whose prepared transactions belong to another role
        could not finish a decided epoch."""
        if not self.app_id:
            return
        row = foreign_owner(self.conn, f"txsink.{self.app_id}.{self.uid}.")
        if row is not None:
            raise ConfigurationError(
                f"prepared transaction {row[0]} of this sink belongs to role {row[1]!r}, and "
                "only that role or a superuser may COMMIT PREPARED or ROLLBACK PREPARED it: "
                f"connect as {row[1]!r} (the DSN's user) for the query and for txsink "
                "recover, as when it was prepared",
                **self._ctx,
            )

    def _warn_old_prepared(self) -> None:
        for gid, age in old_prepared(self.conn, self.prepared_age_warning_s):
            _log.warning(
                "[uid=%s epoch=None] prepared transaction %s is %.0f s old: it holds locks and "
                "blocks vacuum until committed or rolled back (txsink recovery rolls back its "
                "own; others need ROLLBACK PREPARED by hand)",
                self.uid,
                gid,
                float(age),
            )


def choose_protocol(conn: psycopg.Connection[Any], commit: str) -> tuple[str, str]:
    """The commit protocol for ``commit`` (``auto``, ``2pc``, ``staging``), and why.

    ``auto`` takes two-phase commit when the server allows prepared transactions
    (``max_prepared_transactions > 0``), the staging commit otherwise, also on a server
    that does not know the setting (a PostgreSQL-compatible database without
    ``PREPARE TRANSACTION``).
    """
    import psycopg

    if commit != "auto":
        return commit, f"commit={commit!r}"
    try:
        row = conn.execute("SHOW max_prepared_transactions").fetchone()
        allowed = int(row[0]) if row else 0
    except psycopg.errors.UndefinedObject:
        return "staging", "the server has no max_prepared_transactions setting"
    if allowed > 0:
        return "2pc", f"the server allows {allowed} prepared transactions"
    return "staging", "the server has max_prepared_transactions = 0"


def table_columns(
    conn: psycopg.Connection[Any], tables: Tables
) -> dict[str, tuple[str, bool]] | None:
    """Column name -> (type, required: NOT NULL without a default); None: no table. A
    domain's column reads as its base type (binary COPY sends the base type's form)."""
    regclass = tables.regclass()
    rows = conn.execute(
        "SELECT a.attname, CASE WHEN t.typtype = 'd' "
        "THEN format_type(t.typbasetype, t.typtypmod) "
        "ELSE format_type(a.atttypid, a.atttypmod) END, "
        "a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = '' "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum",
        (regclass,),
    ).fetchall()
    if not rows:
        exists = conn.execute("SELECT to_regclass(%s)", (regclass,)).fetchone()
        if exists is None or exists[0] is None:
            return None
    return {str(r[0]): (str(r[1]), bool(r[2])) for r in rows}


def nullable_into_not_null(
    conn: psycopg.Connection[Any], tables: Tables, schema: pa.Schema
) -> list[str]:
    """The nullable columns of ``schema`` whose table column refuses NULL: NOT NULL (a
    default does not help: COPY sends the NULL itself) or a NOT NULL domain."""
    rows = conn.execute(
        "SELECT a.attname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
        "AND (a.attnotnull OR t.typnotnull)",
        (tables.regclass(),),
    ).fetchall()
    refusing = {str(r[0]) for r in rows}
    return [f.name for f in schema if f.nullable and f.name in refusing]


def plan_columns(
    columns: dict[str, tuple[str, bool]], schema: pa.Schema, table: str, ctx: dict[str, Any]
) -> list[ColumnPlan]:
    """Each DataFrame column's plan into ``columns`` (of :func:`table_columns`); a missing
    column or one binary COPY cannot fill is a ConfigurationError naming the fix."""
    plans = []
    for field in schema:
        if field.name not in columns:
            raise ConfigurationError(
                f"table {table} has no column {field.name!r} (the DataFrame "
                f"has it): add the column or drop it from the DataFrame before the sink",
                column=field.name,
                **ctx,
            )
        try:
            plans.append(plan_column(field.name, field.type, columns[field.name][0]))
        except Unsendable as err:
            raise ConfigurationError(
                f"column {field.name!r} of {table}: {err.reason}: {err.fix}",
                column=field.name,
                **ctx,
            ) from err
    return plans


def plans_for(
    conn: psycopg.Connection[Any],
    tables: Tables,
    planned: Sequence[ColumnPlan] | None,
    schema: pa.Schema,
    *,
    sink_uid: str,
) -> list[ColumnPlan]:
    """In a task: the check's column plans (``planned``) for ``schema``; read from the table
    when the check did not run on this sink (hooks driven directly) or planned other
    columns."""
    known = {(p.name, p.source): p for p in planned or ()}
    found = [known.get((f.name, f.type)) for f in schema]
    if all(p is not None for p in found):
        return [p for p in found if p is not None]
    ctx: dict[str, Any] = {"sink_uid": sink_uid, "connector": "postgres"}
    columns = table_columns(conn, tables)
    if columns is None:
        raise ConfigurationError(
            f"table {tables.qualified} does not exist: create it, or pass create_table=True",
            **ctx,
        )
    return plan_columns(columns, schema, tables.qualified, ctx)
