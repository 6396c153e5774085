"""Exactly-once without prepared transactions: the staging commit (``commit="staging"``).

For servers with ``max_prepared_transactions = 0`` (PostgreSQL's default, most managed
services) and databases without ``PREPARE TRANSACTION``. The idea of the Kafka
connector's WAL mode, kept inside the target database::

    begin    BEGIN; set_config('txsink.gid', <transaction name>, local)
    write    binary COPY into the sink's staging table; its gid column's default reads
             txsink.gid, so every row carries its task attempt's transaction name
    prepare  COMMIT (a plain local commit: the rows are durable, and invisible to readers
             of the target); the handle names the transaction and its row count
    commit   on the driver, after the decision, ONE local transaction:
               advisory lock (table, uid); the progress rows of the decided names present?
               -> committed before: nothing to do (idempotent)
               INSERT INTO target SELECT ... FROM staging's rows of the decided names
               (upsert: DISTINCT ON (key) ... ORDER BY key, arrival DESC
               ON CONFLICT (key) DO UPDATE: the last row of a key wins), and remove them:
               TRUNCATE when the transaction can lock staging alone and it holds nothing
               else, else DELETE (stagerows.move_staged)
               each name's moved row count == its handle's, else CommitError (rolled back)
               INSERT the progress rows
    abort    DELETE FROM staging WHERE gid = <name> (idempotent)
    recover  SELECT gid, count(*) FROM staging WHERE gid starts with txsink.<app>.<uid>.

Why one staging table per sink, logged, with a transaction-name column:

* logged, not ``UNLOGGED``: crash recovery truncates unlogged tables, so a server crash
  between the decision and the commit would lose a decided epoch's rows. No covered way
  around it exists inside PostgreSQL (an unlogged table's contents are gone after any
  crash, and the driver cannot rebuild them: Spark's replay is not promised to be the
  same rows). ``test_a_server_crash_between_decision_and_commit_keeps_the_staged_epoch``
  pins it: with an UNLOGGED staging table its commit finds no rows and fails;
* one table, created once at the start-up check: no CREATE or DROP per task or epoch
  (catalog churn, and their ACCESS EXCLUSIVE locks would serialize the tasks' COPYs).
  One LIST partition per epoch, dropped at commit, would leave no dead rows but pays a
  CREATE and a DROP per epoch, each locking the parent against the COPYs of the
  next epoch;
* no index on the name: the table holds only the epochs in flight, and a sequential scan
  or two per commit is cheaper than an index updated for every row COPY sends. Measured
  (text COPY of 200k-400k narrow rows, 3-5 runs each, on a loaded 2-core machine, so
  the ranges are wide): into the target 510k-780k rows/s, into the logged staging table
  360k-860k, with an index on the name 220k-290k;
* emptied by ``TRUNCATE`` in the commit when nothing else is in it (the usual case: the
  commit's lock, taken without waiting, proves no task is writing): no dead rows, and a
  commit about twice as fast as a ``DELETE`` of the moved rows (400k rows: 1.1-1.3 s
  against 2.0-2.8 s). A partition per epoch, dropped at commit, measured 0.6-1.1 s, but
  needs a CREATE before the epoch's tasks (no hook runs there) and a DROP per epoch,
  both under an ACCESS EXCLUSIVE lock on the parent that waits for every COPY;
* the staging table has the target's column types, NOT NULL and CHECK constraints and
  defaults (``LIKE ... INCLUDING DEFAULTS INCLUDING CONSTRAINTS``), so whatever the move
  could refuse for a row is refused by the task's COPY, before the vote, naming the row
  and the column. What a COPY cannot check against concurrent writers (a unique index
  or an exclusion constraint for append, any unique index but the key's for upsert, a
  foreign key) is refused at the start-up check (:func:`refusals`).

The staging table is named from the target and the sink uid (``txsink_staging_<hash>``)
in the target's schema or ``staging_schema``; its comment holds a fingerprint of what it
was made from (the target's columns and constraints, the DataFrame's columns, the write
mode). The check re-creates it when the fingerprint changed and it is empty, and
refuses when it still holds rows of a run made with the old definition.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink.connectors.postgres.upsert import ORD, add_order_column
from txsink.errors import ConfigurationError

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql

    from txsink.connectors.postgres.tables import Tables

__all__ = [
    "GID",
    "ORD",
    "Staging",
    "begin_staged",
    "ensure_staging",
    "exists",
    "refusals",
    "stamp",
    "triggers",
]

#: The staging table's columns of its own (names kept out of users' way); ``ORD``, the
#: arrival order, is the upsert stage's, as the move uses the upsert's statement.
GID = "__txsink_gid"
#: The session setting a task's transaction names itself with (the gid column's default).
GID_SETTING = "txsink.gid"


@dataclass(frozen=True)
class Staging:
    """The staging table of a sink: ``schema``.``name``, for ``tables``' target."""

    schema: str
    name: str

    @classmethod
    def of(cls, tables: Tables, uid: str, staging_schema: str | None) -> Staging:
        """The staging table of the sink ``uid`` writing ``tables``' target (schema resolved)."""
        key = f"{tables.schema}.{tables.table}|{uid}".encode()
        schema = staging_schema or tables.schema
        if schema is None:
            raise ValueError("the target's schema is not resolved yet")
        return cls(schema, "txsink_staging_" + hashlib.sha256(key).hexdigest()[:24])

    @property
    def ident(self) -> sql.Identifier:
        from psycopg import sql

        return sql.Identifier(self.schema, self.name)

    @property
    def regclass(self) -> str:
        return self.ident.as_string(None)

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"


def exists(conn: psycopg.Connection[Any], regclass: str) -> bool:
    found = conn.execute("SELECT to_regclass(%s)", (regclass,)).fetchone()
    return found is not None and found[0] is not None


def fingerprint(
    conn: psycopg.Connection[Any], tables: Tables, columns: Sequence[str], mode: str
) -> str:
    """What the staging table is made from: the target's columns (type, NOT NULL, default)
    and CHECK constraints, the DataFrame's ``columns`` and the write ``mode``."""
    cols = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, "
        "coalesce(pg_get_expr(d.adbin, d.adrelid), '') FROM pg_attribute a "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (tables.regclass(),),
    ).fetchall()
    checks = conn.execute(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = to_regclass(%s) AND contype = 'c' ORDER BY conname",
        (tables.regclass(),),
    ).fetchall()
    text = repr((cols, checks, list(columns), mode))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def refusals(
    conn: psycopg.Connection[Any],
    tables: Tables,
    mode: str,
    key: Sequence[str],
    columns: Sequence[str],
) -> str:
    """Why the target cannot take a staging commit for ``mode``, or ``""``.

    A staged row is checked against the target's constraints by the task's COPY, before the
    decision; what depends on other rows (a unique index, an exclusion constraint, a foreign
    key's referenced row) can change between that check and the commit, by any writer, so
    the move could fail after the decision. Upsert's own key index is the exception: ON
    CONFLICT turns its conflicts into updates. For upsert, a CHECK constraint that reads a
    column the DataFrame does not send also refuses: an update keeps that column's old
    value, which staging never sees.
    """
    regclass = tables.regclass()
    uniques = conn.execute(
        "SELECT i.indexrelid::regclass::text, array_agg(a.attname::text ORDER BY a.attname), "
        "i.indpred IS NOT NULL FROM pg_index i "
        "LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
        "WHERE i.indrelid = to_regclass(%s) AND i.indisunique GROUP BY i.indexrelid, i.indpred",
        (regclass,),
    ).fetchall()
    others = conn.execute(
        "SELECT conname, contype FROM pg_constraint "
        "WHERE conrelid = to_regclass(%s) AND contype IN ('x', 'f') ORDER BY conname",
        (regclass,),
    ).fetchall()
    found: list[str] = []
    key_sorted = sorted(key)
    for index, cols, partial in uniques:
        if mode == "upsert" and not partial and sorted(c for c in cols if c) == key_sorted:
            continue  # the ON CONFLICT target
        found.append(f"unique index {index}")
    kinds = {"x": "exclusion constraint", "f": "foreign key"}
    found += [f"{kinds[str(kind)]} {name}" for name, kind in others]
    if mode == "upsert":
        checks = conn.execute(
            "SELECT c.conname, array_agg(a.attname::text) FROM pg_constraint c "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey) "
            "WHERE c.conrelid = to_regclass(%s) AND c.contype = 'c' GROUP BY c.conname",
            (regclass,),
        ).fetchall()
        sent = set(columns)
        found += [
            f"CHECK constraint {name} (reads {', '.join(sorted(set(cols) - sent))}, "
            "which the DataFrame does not send)"
            for name, cols in checks
            if not set(cols) <= sent
        ]
    return ", ".join(found)


def triggers(conn: psycopg.Connection[Any], tables: Tables) -> list[str]:
    """The target's own enabled triggers: they run at the move, after the decision."""
    rows = conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND NOT tgisinternal "
        "AND tgenabled <> 'D' ORDER BY tgname",
        (tables.regclass(),),
    ).fetchall()
    return [str(r[0]) for r in rows]


def ensure_staging(
    conn: psycopg.Connection[Any],
    tables: Tables,
    staging: Staging,
    *,
    columns: Sequence[str],
    mode: str,
    ctx: Mapping[str, Any],
) -> bool:
    """At start: create the staging table if missing, or re-create it if made from another
    definition and empty. True when it was (re)created. ``conn`` is in autocommit.

    Raises :class:`~txsink.errors.ConfigurationError` (with ``ctx``) naming the grant when
    the role cannot create it, or when a changed definition meets rows still staged.
    """
    import psycopg
    from psycopg import sql

    wanted = fingerprint(conn, tables, columns, mode)
    comment = _comment(tables, mode, wanted)
    with conn.transaction():
        # Two drivers starting at once must not both create it.
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (staging.regclass,))
        if exists(conn, staging.regclass):
            row = conn.execute(
                "SELECT obj_description(to_regclass(%s), 'pg_class')", (staging.regclass,)
            ).fetchone()
            if row is not None and str(row[0] or "").endswith(wanted):
                _check_privileges(conn, staging, ctx)
                return False
            held = conn.execute(
                sql.SQL("SELECT count(*), min({}) FROM {}").format(
                    sql.Identifier(GID), staging.ident
                )
            ).fetchone()
            if held is not None and int(held[0]):
                raise ConfigurationError(
                    f"the staging table {staging.qualified} of {tables.qualified} holds "
                    f"{held[0]} rows staged before the table's definition (or the sink's "
                    f"columns or mode) changed, e.g. of {held[1]}: finish them first. Run the "
                    "query once more as it was before the change (its recovery commits or "
                    "aborts them), then change; or, if that epoch may be lost, delete "
                    "the staging table's rows",
                    **ctx,
                )
            conn.execute(sql.SQL("DROP TABLE {}").format(staging.ident))
        if not _can_create(conn, staging.schema):
            raise _no_create(staging, tables, ctx)
        try:
            _create(conn, tables, staging, columns=columns, mode=mode, comment=comment)
        except psycopg.errors.InsufficientPrivilege as err:
            raise _no_create(staging, tables, ctx) from err
    return True


def _comment(tables: Tables, mode: str, wanted: str) -> str:
    return f"txsink staging of {tables.qualified} ({mode}); fingerprint {wanted}"


def stamp(
    conn: psycopg.Connection[Any],
    tables: Tables,
    staging: Staging,
    columns: Sequence[str],
    mode: str,
) -> None:
    """Name the target's current definition in ``staging``'s fingerprint (in the caller's
    transaction): after a schema change committed with an epoch, the staging table (which
    was given the new columns) matches the changed target."""
    from psycopg import sql

    wanted = fingerprint(conn, tables, columns, mode)
    conn.execute(
        sql.SQL("COMMENT ON TABLE {} IS {}").format(
            staging.ident, sql.Literal(_comment(tables, mode, wanted))
        )
    )


def _create(
    conn: psycopg.Connection[Any],
    tables: Tables,
    staging: Staging,
    *,
    columns: Sequence[str],
    mode: str,
    comment: str,
) -> None:
    from psycopg import sql

    ident = staging.ident
    conn.execute(
        sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(
            ident, tables.ident()
        )
    )
    # Columns the DataFrame does not send are filled by the target at the move (identity,
    # generated, defaults), never from staging: staging must not refuse their NULL.
    loose = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
        "AND NOT attisdropped AND attnotnull AND NOT (attname = ANY(%s))",
        (staging.regclass, list(columns)),
    ).fetchall()
    for (name,) in loose:
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL").format(
                ident, sql.Identifier(str(name))
            )
        )
    conn.execute(
        # missing_ok: NULL where no task named its transaction (the NOT NULL refuses it).
        sql.SQL(
            "ALTER TABLE {} ADD COLUMN {} text NOT NULL DEFAULT current_setting({}, true)"
        ).format(ident, sql.Identifier(GID), sql.Literal(GID_SETTING))
    )
    if mode == "upsert":
        add_order_column(conn, ident)
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(ident, sql.Literal(comment)))


def _can_create(conn: psycopg.Connection[Any], schema: str) -> bool:
    row = conn.execute(
        "SELECT has_schema_privilege(n.oid, 'CREATE') AND has_schema_privilege(n.oid, 'USAGE') "
        "FROM pg_namespace n WHERE n.nspname = %s",
        (schema,),
    ).fetchone()
    return bool(row and row[0])


def _no_create(staging: Staging, tables: Tables, ctx: Mapping[str, Any]) -> ConfigurationError:
    from psycopg import sql

    schema = sql.Identifier(staging.schema).as_string(None)
    return ConfigurationError(
        f"the staging commit needs a staging table {staging.qualified} for {tables.qualified}, "
        f"and the connecting role cannot create it: GRANT USAGE, CREATE ON SCHEMA {schema} "
        "TO <role>; or create a schema for txsink's staging tables, grant those on it, and "
        "name it in staging_schema=...; or use commit='2pc' on a server with "
        "max_prepared_transactions > 0",
        **ctx,
    )


def _check_privileges(
    conn: psycopg.Connection[Any], staging: Staging, ctx: Mapping[str, Any]
) -> None:
    for privilege in ("INSERT", "SELECT", "DELETE"):
        row = conn.execute(
            "SELECT has_table_privilege(%s, %s)", (staging.regclass, privilege)
        ).fetchone()
        if not (row and row[0]):
            raise ConfigurationError(
                f"the connecting role lacks {privilege} on the staging table "
                f"{staging.qualified}: GRANT INSERT, SELECT, DELETE ON it TO <role>",
                **ctx,
            )


def begin_staged(conn: psycopg.Connection[Any], gid: str) -> None:
    """Name the open transaction ``gid``: every row it COPYs into staging carries it."""
    conn.execute("SELECT set_config(%s, %s, true)", (GID_SETTING, gid))
