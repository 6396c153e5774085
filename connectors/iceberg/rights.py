"""The Iceberg sink's rights in a SQL catalog on PostgreSQL, checked before any data flows.

Why: the sink reads its table's row in the catalog (``SELECT``) and moves the table's
metadata pointer at each commit (``UPDATE ... WHERE metadata_location = <the one it read>``).
Without the ``UPDATE``, the start-up check and the pre-commit pass, and the commit of a
decided epoch fails at every attempt: a decided epoch that cannot finish until an operator
grants the right. So the check asks PostgreSQL (``has_table_privilege``) and refuses to
start, naming the ``GRANT``. Other catalogs (REST, Glue, Hive, SQL on other databases) are
not judged here: their rights are the catalog service's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigurationError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

__all__ = ["CATALOG_TABLE", "NEEDED", "check_catalog_rights", "grant_line", "refused_read"]

#: pyiceberg's SQL catalog keeps one row per table here (``IcebergTables.__tablename__``).
CATALOG_TABLE = "iceberg_tables"
#: What the sink does with the catalog's table, and why.
NEEDED = (
    ("SELECT", "load the table (its metadata location)"),
    ("UPDATE", "each commit moves the table's metadata location"),
)
#: PostgreSQL's insufficient_privilege.
_INSUFFICIENT_PRIVILEGE = "42501"


def grant_line(privileges: list[str], role: str) -> str:
    return f'GRANT {", ".join(privileges)} ON TABLE {CATALOG_TABLE} TO "{role}";'


def _postgres_engine(catalog: Catalog) -> Any:
    """The SQLAlchemy engine of a pyiceberg SQL catalog on PostgreSQL, else None."""
    engine = getattr(catalog, "engine", None)
    dialect = getattr(engine, "dialect", None)
    return engine if getattr(dialect, "name", None) == "postgresql" else None


def refused_read(exc: BaseException) -> bool:
    """Whether ``exc`` (from loading the table) is PostgreSQL refusing the catalog's table to
    this role: a missing right, not an unreachable server (told by SQLSTATE)."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "sqlstate", None) == _INSUFFICIENT_PRIVILEGE


def check_catalog_rights(catalog: Catalog, *, uid: str, connector: str, table: str) -> None:
    """Raise :class:`ConfigurationError` naming each right of :data:`NEEDED` that the
    catalog's PostgreSQL role lacks on :data:`CATALOG_TABLE`, with its ``GRANT``; return
    for any other catalog."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    engine = _postgres_engine(catalog)
    if engine is None:
        return
    query = text(
        "SELECT current_user, " + ", ".join(f"has_table_privilege(:t, '{p}')" for p, _ in NEEDED)
    )
    try:
        with engine.connect() as conn:
            row = conn.execute(query, {"t": CATALOG_TABLE}).one()
    except DBAPIError:  # the catalog's table elsewhere than the search path: not judged here
        return
    role, held = str(row[0]), [bool(v) for v in row[1:]]
    missing = [(p, why) for (p, why), ok in zip(NEEDED, held, strict=True) if not ok]
    if not missing:
        return
    lines = "\n".join(f"  - {p} on {CATALOG_TABLE} ({why})" for p, why in missing)
    raise ConfigurationError(
        f"the role {role!r} of Iceberg's SQL catalog lacks {len(missing)} right(s) the sink "
        f"needs for table {table!r}; nothing was written:\n{lines}\n"
        f"Grant them as an administrator: {grant_line([p for p, _ in missing], role)} "
        "(docs/security.md, section Iceberg), then start again",
        sink_uid=uid,
        connector=connector,
        phase="check",
    )
