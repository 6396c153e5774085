"""The least privileges a :class:`~txsink.connectors.postgres.PostgresSink` needs, as data.

One source for three readers: the start-up check (:func:`missing` names each right the
connecting role lacks, with the ``GRANT`` that fixes it, before any data flows), the docs
(``docs/security.md`` shows :func:`setup_sql`'s output; a docs test checks they match)
and the tests (they grant :func:`rights`, revoke one at a time, and expect the check to
name it).

What each commit protocol and write mode does, and so needs (``S`` the target's schema,
``T`` the target, ``P`` the progress table, ``Z`` the staging schema, ``S`` by default):

* always: ``USAGE`` on ``S``; ``INSERT`` on ``T`` (``2pc`` COPYs into it, ``staging``
  moves rows in with ``INSERT ... SELECT``); ``SELECT, INSERT, DELETE`` on ``P`` when an
  administrator created it beforehand, else ``CREATE`` on ``S`` (the sink creates it);
* ``upsert``: ``UPDATE`` and ``SELECT`` on ``T`` (``INSERT ... ON CONFLICT DO UPDATE``
  reads the conflicting row);
* ``2pc`` + ``upsert``: ``CREATE`` on ``S``: each transaction COPYs into a stage table of
  its own (``UNLOGGED``, dropped before ``PREPARE TRANSACTION``; a temporary table cannot
  be used in a prepared transaction);
* ``staging``: ``SELECT`` on ``T`` (the staging table is made ``LIKE`` it), ``USAGE`` and
  ``CREATE`` on ``Z`` (the sink creates and owns its staging table there).

Not grants, but rules: ``COMMIT PREPARED`` and ``ROLLBACK PREPARED`` are allowed only to
the role that prepared the transaction, or a superuser, so the query's recovery and
``txsink recover`` must connect as the same role as the tasks (the check refuses a role
that could not finish this sink's prepared transactions). ``CONNECT`` on the database and
``TEMP`` are PostgreSQL's defaults for ``PUBLIC``; ``TEMP`` is not used. The check reads
table-level privileges (``has_table_privilege``): column-level grants are not enough.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from txsink.connectors.postgres.progress import DDL

if TYPE_CHECKING:
    import psycopg

__all__ = ["Right", "exists", "missing", "rights", "setup_sql"]

Kind = Literal["schema", "table"]


def _quote(name: str) -> str:
    """A SQL identifier, always quoted (psycopg's own rule, without a connection)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Right:
    """``privilege`` on a schema (``name`` None) or a table ``schema.name``, and why the
    sink needs it."""

    privilege: str
    kind: Kind
    schema: str
    name: str | None
    why: str

    @property
    def on(self) -> str:
        """The object as a message names it: ``table s.t`` or ``schema s`` (unquoted)."""
        return (
            f"table {self.schema}.{self.name}" if self.kind == "table" else f"schema {self.schema}"
        )

    @property
    def target(self) -> str:
        """The object as SQL names it (quoted)."""
        if self.kind == "table":
            return f"TABLE {_quote(self.schema)}.{_quote(str(self.name))}"
        return f"SCHEMA {_quote(self.schema)}"

    def grant(self, role: str) -> str:
        return f"GRANT {self.privilege} ON {self.target} TO {_quote(role)};"

    def revoke(self, role: str) -> str:
        return f"REVOKE {self.privilege} ON {self.target} FROM {_quote(role)};"


def rights(
    *,
    schema: str,
    table: str,
    mode: str = "append",
    commit: str = "2pc",
    progress: str = "txsink_progress",
    progress_exists: bool = True,
    staging_schema: str | None = None,
    table_exists: bool = True,
    create_table: bool = False,
) -> list[Right]:
    """Every right the sink needs on ``schema.table`` for ``mode`` (``append``/``upsert``)
    and ``commit`` (``2pc``/``staging``), in the order the check reports them.

    ``progress_exists``: the progress table was created beforehand (else the sink creates
    it: ``CREATE`` on the schema). ``table_exists`` False: the target is created by the sink
    (``create_table``: ``CREATE`` on the schema, and it owns the table) or not checked here
    (the check says the table is missing).
    """
    if mode not in ("append", "upsert") or commit not in ("2pc", "staging"):
        raise ValueError(f"no such mode/commit: {mode!r}/{commit!r}")
    found: list[Right] = [Right("USAGE", "schema", schema, None, "to reach the target")]

    def on_table(privilege: str, why: str) -> None:
        found.append(Right(privilege, "table", schema, table, why))

    if table_exists:
        on_table("INSERT", "the rows go in by COPY (2pc) or INSERT ... SELECT (staging)")
        if mode == "upsert":
            on_table("UPDATE", "upsert: INSERT ... ON CONFLICT DO UPDATE")
            on_table("SELECT", "upsert: ON CONFLICT reads the conflicting row")
        if commit == "staging" and mode == "append":
            on_table("SELECT", "the staging table is created LIKE the target")
    elif create_table:
        found.append(Right("CREATE", "schema", schema, None, "create_table=True creates it"))
    if commit == "2pc" and mode == "upsert":
        found.append(
            Right("CREATE", "schema", schema, None, "each transaction's stage table (upsert)")
        )
    if commit == "staging":
        where = staging_schema or schema
        why = f"the staging table, created at start in schema {where}"
        found.append(Right("USAGE", "schema", where, None, why))
        found.append(Right("CREATE", "schema", where, None, why))
    if progress_exists:
        for privilege in ("SELECT", "INSERT", "DELETE"):
            found.append(
                Right(privilege, "table", schema, progress, "the record of committed transactions")
            )
    else:
        found.append(
            Right(
                "CREATE",
                "schema",
                schema,
                None,
                f"creates the progress table {schema}.{progress} (or have it created "
                "beforehand, then grant SELECT, INSERT, DELETE on it)",
            )
        )
    unique: dict[tuple[str, str, str, str | None], Right] = {}
    for right in found:
        unique.setdefault((right.privilege, right.kind, right.schema, right.name), right)
    return list(unique.values())


def setup_sql(
    role: str, needed: Sequence[Right], *, progress: tuple[str, str] | None = None
) -> str:
    """The SQL an administrator runs: with ``progress`` (schema, table), its ``CREATE TABLE``
    first; then one ``GRANT`` per object, its privileges in the order of ``needed``."""
    lines: list[str] = []
    if progress is not None:
        ident = f"{_quote(progress[0])}.{_quote(progress[1])}"
        lines.append(DDL.replace("{}", ident) + ";")
    merged: dict[str, list[str]] = {}
    for right in needed:
        merged.setdefault(right.target, []).append(right.privilege)
    lines += [
        f"GRANT {', '.join(p)} ON {target} TO {_quote(role)};" for target, p in merged.items()
    ]
    return "\n".join(lines) + "\n"


_MISSING = """
SELECT r.i FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[])
    WITH ORDINALITY AS r(kind, nsp, rel, priv, i)
WHERE NOT coalesce(CASE r.kind
    WHEN 'schema' THEN has_schema_privilege(
        (SELECT n.oid FROM pg_namespace n WHERE n.nspname = r.nsp), r.priv)
    WHEN 'table' THEN has_table_privilege(
        (SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = r.nsp AND c.relname = r.rel), r.priv)
    END, false)
ORDER BY r.i
"""


def missing(conn: psycopg.Connection[Any], needed: Sequence[Right]) -> list[Right]:
    """The rights of ``needed`` the connecting role lacks, in one query. Objects are found
    by name in the catalogs (readable without ``USAGE``); a missing object counts as a
    missing right."""
    if not needed:
        return []
    rows = conn.execute(
        _MISSING,
        (
            [r.kind for r in needed],
            [r.schema for r in needed],
            [r.name or "" for r in needed],
            [r.privilege for r in needed],
        ),
    ).fetchall()
    return [needed[int(row[0]) - 1] for row in rows]


def exists(conn: psycopg.Connection[Any], schema: str, name: str) -> bool:
    """Whether the table ``schema.name`` exists (by the catalogs: no ``USAGE`` needed)."""
    row = conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, name),
    ).fetchone()
    return row is not None
