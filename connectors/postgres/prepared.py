"""The server's prepared transactions, by gid: list, commit, roll back, find the old ones.

Every statement runs on an autocommit connection (``COMMIT PREPARED`` cannot run inside
a transaction block) of the database the transactions were prepared in:
``pg_prepared_xacts`` shows every database's, and only this one's can be finished here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from txsink.handles import Handle, register_handle

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "PgHandle",
    "commit_prepared",
    "foreign_owner",
    "old_prepared",
    "prepared_gids",
    "rollback_prepared",
]


@register_handle
@dataclass(frozen=True)
class PgHandle(Handle):
    """A prepared PostgreSQL transaction; its gid is ``str(txn)``."""

    serializer: ClassVar[str] = "postgres.prepared"
    version: ClassVar[int] = 1


def _has_view(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server has ``pg_prepared_xacts`` (a PostgreSQL-compatible database
    without two-phase commit may not: the staging commit runs there, with nothing to list)."""
    row = conn.execute("SELECT to_regclass('pg_catalog.pg_prepared_xacts')").fetchone()
    return row is not None and row[0] is not None


def prepared_gids(conn: psycopg.Connection[Any], prefix: str) -> list[str]:
    """The gids of this database's prepared transactions that start with ``prefix``, sorted."""
    if not _has_view(conn):
        return []
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, %s) ORDER BY gid",
        (prefix,),
    ).fetchall()
    return [str(gid) for (gid,) in rows]


def commit_prepared(conn: psycopg.Connection[Any], gid: str) -> None:
    """``COMMIT PREPARED gid``. Raises psycopg's ``UndefinedObject`` when there is no such
    gid (committed already, or rolled back: only the caller can tell which) and
    ``ObjectNotInPrerequisiteState`` while another session is finishing it."""
    from psycopg import sql

    conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))


def rollback_prepared(conn: psycopg.Connection[Any], gid: str) -> bool:
    """``ROLLBACK PREPARED gid``; False when there was no such gid (gone already)."""
    import psycopg
    from psycopg import sql

    try:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
    except psycopg.errors.UndefinedObject:
        return False
    return True


def old_prepared(conn: psycopg.Connection[Any], older_than_s: float) -> list[tuple[str, float]]:
    """(gid, age in seconds) of this database's prepared transactions older than
    ``older_than_s``, whoever prepared them."""
    if not _has_view(conn):
        return []
    rows = conn.execute(
        "SELECT gid, extract(epoch FROM now() - prepared) FROM pg_prepared_xacts "
        "WHERE database = current_database() AND prepared < now() - make_interval(secs => %s)",
        (older_than_s,),
    ).fetchall()
    return [(str(gid), float(age)) for gid, age in rows]


def foreign_owner(conn: psycopg.Connection[Any], prefix: str) -> tuple[str, str] | None:
    """A prepared transaction of this database whose gid starts with ``prefix`` and that the
    connecting role may not finish: (gid, its owner). Only the preparing role, or a
    superuser, may COMMIT PREPARED or ROLLBACK PREPARED."""
    if not _has_view(conn):
        return None
    row = conn.execute(
        "SELECT p.gid, p.owner FROM pg_prepared_xacts p "
        "WHERE p.database = current_database() AND starts_with(p.gid, %s) "
        "AND p.owner <> current_user "
        "AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) "
        "ORDER BY p.gid LIMIT 1",
        (prefix,),
    ).fetchone()
    return None if row is None else (str(row[0]), str(row[1]))
