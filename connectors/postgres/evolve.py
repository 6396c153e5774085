"""Schema evolution for the Postgres sink (issue #41; the core's rules are
:mod:`txsink.schema`): the table's schema as Arrow types, the checks before an epoch that
adds columns, and the ``ALTER TABLE ... ADD COLUMN`` inside the commit that makes the
epoch's rows visible.

What the target takes: ``add`` only. A nullable column without a default is a catalog
change in PostgreSQL (no rewrite), so it fits in the commit's transaction; it takes an
ACCESS EXCLUSIVE lock on the table until that transaction ends (readers and writers of the
table wait that long). Widening a type (``ALTER COLUMN ... TYPE``) rewrites the table for
integers and floats, under the same lock for as long as the rewrite takes: not in a
commit. ``numeric(p,s)`` to a higher precision does not rewrite, but a ``numeric`` column
takes integers and floats as well as decimals (the connector casts them), so its Arrow
type cannot be told (below): a wider decimal is written as before, the column's
precision bounding its values.

Why the staging path: a prepared transaction (``2pc``) cannot be changed after PREPARE,
and an ``ALTER TABLE`` inside a task's transaction would hold the table's ACCESS
EXCLUSIVE lock until the decision, blocking every other task's COPY. So an epoch with a
planned change is staged, whatever the sink's ``commit``: its tasks COPY into the sink's
staging table (given the new columns at the check, before any row of the epoch), and the
driver's commit runs ``ALTER TABLE`` + the move + the progress rows in one transaction
(:mod:`~txsink.connectors.postgres.stagecommit`): the new columns appear exactly with the
epoch's rows. Recovery finds the progress rows (done, column and rows) or does it all.

The table's Arrow schema (:func:`pg_schema`): a column whose PostgreSQL type takes values
of one Arrow family only has that family's widest type (``bigint``: int64, ``varchar``:
string, ``timestamptz``: timestamp[us, UTC]); a column that takes several (``text``,
``numeric``, ``double precision``, ``jsonb``, ...: the connector casts ints into them)
is ``null`` with its PostgreSQL type in the field's metadata, which the core's
comparison leaves to the sink's own check (as before evolution): a DataFrame the sink
accepted before compares as no change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from txsink.connectors.postgres import grants
from txsink.connectors.postgres.casts import ColumnPlan, Unsendable, base_type, plan_column
from txsink.connectors.postgres.checks import choose_protocol, table_columns
from txsink.connectors.postgres.connections import Connections
from txsink.connectors.postgres.staging import GID, ORD, Staging, exists, refusals
from txsink.connectors.postgres.types import arrow_to_pg_type
from txsink.errors import ConfigurationError
from txsink.schema import ADD, TARGET_TYPE, SchemaChange, SchemaEvolutionError

if TYPE_CHECKING:
    import psycopg

    from txsink.connectors.postgres.tables import Tables

__all__ = ["Evolving", "added_plans", "apply_change", "pg_schema", "stage_columns"]

#: The Arrow type of a PostgreSQL column type (``format_type`` without modifiers) that
#: takes values of one Arrow family only.
_ONE_FAMILY: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "smallint": pa.int16(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "bytea": pa.binary(),
    "date": pa.date32(),
    "timestamp without time zone": pa.timestamp("us"),
    "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    **{
        t: pa.string()
        for t in (
            "character varying",
            "character",
            "bpchar",
            "uuid",
            "inet",
            "cidr",
            "citext",
            "xml",
            "name",
        )
    },
}
#: Column names PostgreSQL keeps for itself (system columns), and the staging table's own.
_SYSTEM = ("ctid", "xmin", "xmax", "cmin", "cmax", "tableoid", GID, ORD)
_NAMEDATALEN = 63  # bytes of an identifier; a longer one is silently truncated
_DOCS = "docs/connectors/postgres.md#schema-evolution"


def arrow_type_of(pg_type: str) -> pa.DataType:
    """The Arrow type :func:`pg_schema` gives a column of ``pg_type``."""
    base = base_type(pg_type)
    if base.endswith("[]"):
        return pa.list_(arrow_type_of(base[:-2].strip()))
    return _ONE_FAMILY.get(base, pa.null())


def pg_schema(conn: psycopg.Connection[Any], tables: Tables) -> pa.Schema | None:
    """The target's columns as Arrow types (module docstring), in the table's order;
    None when the table does not exist."""
    columns = table_columns(conn, tables)
    if columns is None:
        return None
    fields = []
    for name, (pg_type, required) in columns.items():
        arrow = arrow_type_of(pg_type)
        # Arrow's null type is nullable by definition (and the comparison reads no flag).
        nullable = not required or pa.types.is_null(arrow)
        fields.append(pa.field(name, arrow, nullable, metadata={TARGET_TYPE: pg_type}))
    return pa.schema(fields)


def added_plans(change: SchemaChange | None) -> list[ColumnPlan]:
    """How each added column goes over binary COPY (into the type it is added with)."""
    if change is None:
        return []
    return [plan_column(c.column, c.new, arrow_to_pg_type(c.new)) for c in change.added()]


def apply_change(conn: psycopg.Connection[Any], tables: Tables, change: SchemaChange) -> None:
    """In the caller's transaction: add the change's columns to the target (nullable, no
    default: no rewrite). ``IF NOT EXISTS``: a column already there (added by hand with
    the query stopped) is kept, and the move then writes into it."""
    from psycopg import sql

    for column in change.added():
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}").format(
                tables.ident(), sql.Identifier(column.column), sql.SQL(arrow_to_pg_type(column.new))
            )
        )


def stage_columns(conn: psycopg.Connection[Any], staging: Staging, change: SchemaChange) -> None:
    """Give the staging table the change's columns, before the epoch's tasks COPY into it.
    Only the staging table changes (nothing a reader of the target sees). An aborted epoch
    leaves the columns there, empty; one left with another type (an aborted epoch brought
    the column as another type) is made again with this one when the staging table is
    empty, and refused when it holds rows (a decided epoch's, not yet recovered: this
    check runs before recovery)."""
    from psycopg import sql

    have = dict(
        conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (staging.regclass,),
        ).fetchall()
    )
    for column in change.added():
        name, pg_type = sql.Identifier(column.column), arrow_to_pg_type(column.new)
        if have.get(column.column) == pg_type:
            continue
        if column.column in have:
            held = conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(staging.ident))
            if (row := held.fetchone()) is not None and row[0]:
                raise ConfigurationError(
                    f"the staging table {staging.qualified} holds rows staged with column "
                    f"{column.column!r} as {have[column.column]}, and this epoch brings it as "
                    f"{pg_type}: run the query once more as it was (its recovery commits or "
                    "aborts those rows), then change the column's type",
                    column=column.column,
                )
            conn.execute(sql.SQL("ALTER TABLE {} DROP COLUMN {}").format(staging.ident, name))
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(staging.ident, name, sql.SQL(pg_type))
        )


class Evolving(Connections):
    """The sink's schema-evolution hooks (a base class of
    :class:`~txsink.connectors.postgres.sink.PostgresSink`, which sets these attributes)."""

    schema: str | None
    mode: str
    key: tuple[str, ...]
    commit_option: str
    protocol: str | None
    staging_schema: str | None
    #: The change planned for the coming epoch (set by :meth:`prepare_evolution`, travels
    #: with the pickled sink into the epoch's tasks: they stage, with its columns).
    _evolution: SchemaChange | None

    @property
    def tables(self) -> Tables:
        raise NotImplementedError

    @property
    def staging(self) -> Staging:
        raise NotImplementedError

    def _resolve_schema(self, conn: psycopg.Connection[Any]) -> None:
        """Fill in the server's current schema when the table names none (the check does
        it on the driver; hooks driven without it need it for the staging table's name)."""
        if self.schema is None:
            self.schema = str(conn.execute("SELECT current_schema()").fetchone()[0])  # type: ignore[index]

    @property
    def _stages(self) -> bool:
        """Whether this epoch's tasks write into staging (the protocol, or a change)."""
        return self.protocol == "staging" or self._evolution is not None

    def target_schema(self, app_id: str) -> pa.Schema | None:
        """The table's columns (:func:`pg_schema`); None when it does not exist yet."""
        self._evolution = None  # planned again for this epoch
        with self._on_driver(None, "check") as conn:
            self._resolve_schema(conn)
            return pg_schema(conn, self.tables)

    def evolution_support(self) -> frozenset[str]:
        """Added nullable columns only (the module docstring says why not the widenings)."""
        return frozenset({ADD})

    def prepare_evolution(self, change: SchemaChange, app_id: str) -> None:
        """Refuse, naming the column and the fix, what would make the commit's
        ``ALTER TABLE ... ADD COLUMN`` or its staged move fail; writes nothing."""
        with self._on_driver(None, "check") as conn:
            self._resolve_schema(conn)
            self._check_table(conn, change)
            for column in change.added():
                self._check_column(conn, column.column, column.new)
            protocol = self.protocol or choose_protocol(conn, self.commit_option)[0]
            self._check_staging(conn, change, two_phase=protocol == "2pc")
        self._evolution = change

    def _refuse(self, column: str, message: str) -> SchemaEvolutionError:
        return SchemaEvolutionError(
            f"{message} Nothing of the epoch was written ({_DOCS})",
            sink_uid=self.uid,
            column=column,
            connector="postgres",
            phase="check",
        )

    def _check_table(self, conn: psycopg.Connection[Any], change: SchemaChange) -> None:
        first = change.added()[0].column
        table = self.tables.qualified
        row = conn.execute(
            "SELECT c.relkind, c.relispartition, c.reloftype <> 0 FROM pg_class c "
            "WHERE c.oid = to_regclass(%s)",
            (self.tables.regclass(),),
        ).fetchone()
        if row is None:
            raise self._refuse(first, f"table {table} is gone: it cannot take {first!r}.")
        kind, partition, typed = row
        why = (
            "is a partition (columns are added to its partitioned table)"
            if partition
            else "is a typed table (CREATE TABLE ... OF type)"
            if typed
            else f"is not a plain or partitioned table (relkind {kind!r})"
            if kind not in ("r", "p")
            else ""
        )
        if why:
            raise self._refuse(
                first,
                f"{table} {why}, so ALTER TABLE cannot add {change.describe()}. Write to a "
                "plain or partitioned table, or add the columns by hand with the query "
                "stopped, or select the target's columns before the sink.",
            )
        # ALTER TABLE needs the table's owner (a member of the owning role), and recurses
        # into partitions and inheritance children, each of which it checks the same way.
        foreign = conn.execute(
            "WITH RECURSIVE tree(oid) AS (SELECT to_regclass(%s)::oid UNION "
            "SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.oid) "
            "SELECT c.oid::regclass::text, pg_get_userbyid(c.relowner) FROM tree "
            "JOIN pg_class c ON c.oid = tree.oid WHERE NOT pg_has_role(c.relowner, 'USAGE') "
            "ORDER BY 1",
            (self.tables.regclass(),),
        ).fetchall()
        if foreign:
            name, owner = foreign[0]
            role = conn.execute("SELECT current_user").fetchone()
            raise self._refuse(
                first,
                f"the epoch {change.describe()}, and adding a column to {table} needs its "
                f"owner: {name} belongs to role {owner!r}, and the connecting role "
                f"{role[0] if role else '?'!r} is not a member of it. Fix: GRANT {owner} TO "
                "<the sink's role>; or add the columns by hand (ALTER TABLE ... ADD COLUMN) "
                "with the query stopped, then restart it.",
            )

    def _check_column(self, conn: psycopg.Connection[Any], name: str, arrow: pa.DataType) -> None:
        table = self.tables.qualified
        if len(name.encode()) > _NAMEDATALEN:
            raise self._refuse(
                name,
                f"column {name!r} is longer than PostgreSQL's {_NAMEDATALEN} bytes for a name: "
                f"rename it in Spark (withColumnRenamed) before the sink writes {table}.",
            )
        if name in _SYSTEM:
            raise self._refuse(
                name,
                f"column {name!r} is a name PostgreSQL (or txsink's staging table) keeps for "
                f"itself, so {table} cannot take it: rename it in Spark before the sink.",
            )
        try:
            plan_column(name, arrow, arrow_to_pg_type(arrow))
        except (ConfigurationError, Unsendable) as err:
            raise self._refuse(
                name,
                f"column {name!r} ({arrow}) has no PostgreSQL type txsink can add to {table} "
                f"({err}): cast it in Spark to a type of docs/connectors/postgres.md's type "
                "mapping, or add the column by hand with the query stopped.",
            ) from err

    def _check_staging(
        self, conn: psycopg.Connection[Any], change: SchemaChange, *, two_phase: bool
    ) -> None:
        """The staging table, if there, must take the new columns (the role owns it); and a
        two-phase-commit sink, which stages the evolving epoch, needs what the staging
        commit needs (checked at start only for ``commit='staging'``)."""
        first = change.added()[0].column
        table = self.tables.qualified
        refused = refusals(conn, self.tables, self.mode, self.key, change.new.names)
        if refused and two_phase:
            raise self._refuse(
                first,
                f"the epoch {change.describe()}; a two-phase-commit sink commits such an "
                f"epoch through its staging table (ALTER TABLE and the rows in one "
                f"transaction after the decision), and {table} has {refused}, which could "
                "refuse rows at that move. Add the columns by hand (ALTER TABLE ... ADD "
                "COLUMN) with the query stopped, then restart it; or select the target's "
                "columns before the sink.",
            )
        schema = self.tables.schema or "public"
        needed = grants.rights(
            schema=schema,
            table=self.tables.table,
            mode=self.mode,
            commit="staging",
            progress=self.tables.progress,
            progress_exists=grants.exists(conn, schema, self.tables.progress),
            staging_schema=self.staging.schema,
        )
        if exists(conn, self.staging.regclass):
            owned = conn.execute(
                "SELECT pg_has_role(relowner, 'USAGE') FROM pg_class WHERE oid = to_regclass(%s)",
                (self.staging.regclass,),
            ).fetchone()
            if not (owned and owned[0]):
                raise self._refuse(
                    first,
                    f"the epoch {change.describe()}; it is committed through the staging "
                    f"table {self.staging.qualified}, which must take the new columns, and "
                    "the connecting role does not own it: drop it (it is made again), or "
                    "connect as its owner.",
                )
            return
        lacking = [r for r in grants.missing(conn, needed) if r.kind == "schema"]
        if lacking and two_phase:
            lines = "; ".join(f"{r.privilege} on {r.on}" for r in lacking)
            raise self._refuse(
                first,
                f"the epoch {change.describe()}; a two-phase-commit sink commits such an "
                f"epoch through a staging table in schema {self.staging.schema}, and the "
                f"connecting role lacks {lines}: GRANT USAGE, CREATE ON SCHEMA "
                f"{self.staging.schema} TO <role>, or name a schema it may create in "
                "with staging_schema=.",
            )
