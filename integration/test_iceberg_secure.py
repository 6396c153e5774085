"""The Iceberg sink's rights in a SQL catalog on the secured PostgreSQL (``postgres_secure``:
TLS verified, the least-privileged role ``txsink_app``, a passfile): ``SELECT, UPDATE`` on
``iceberg_tables`` (:mod:`txsink.connectors.iceberg.rights`, docs/security.md, Iceberg).

Each right removed in turn is named by the start-up check with its ``GRANT``, before any
data flows; with both, an epoch commits through the role and the administrator reads it
back with pyiceberg. The warehouse is a local folder here: the object store's rights are
the cross-system test's (``test_secure_cross_system.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secure_xs import sqlalchemy_url
from test_postgres_secure import SecurePg, secure

from txsink.connectors.iceberg import IcebergSink
from txsink.connectors.iceberg.catalog import load_catalog
from txsink.connectors.iceberg.rights import CATALOG_TABLE, NEEDED, grant_line
from txsink.errors import ConfigurationError
from txsink.testing.contract import SCHEMA, commit, rows
from txsink.txid import TxnId

pytestmark = pytest.mark.postgres_secure

__all__ = ["secure"]  # the postgres_secure fixture, shared with test_postgres_secure.py
CATALOG = "txsink_sec"


def _catalog(dsn: str, warehouse: Path) -> dict[str, str]:
    return {"type": "sql", "uri": sqlalchemy_url(dsn), "warehouse": warehouse.as_uri()}


@pytest.fixture
def table(secure: SecurePg, tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Any]]:
    """A new table made by the administrator, no right granted on the catalog yet: its
    name, the app's catalog properties and the administrator's catalog."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    admin = load_catalog(CATALOG, _catalog(secure.admin_dsn, warehouse))
    namespace = f"sec_{uuid.uuid4().hex[:8]}"
    admin.create_namespace(namespace)
    admin.create_table(f"{namespace}.events", schema=SCHEMA)
    with secure.admin() as conn:
        conn.execute(f'REVOKE ALL ON TABLE {CATALOG_TABLE} FROM "{secure.role}"')
    try:
        yield f"{namespace}.events", _catalog(secure.dsn, warehouse), admin
    finally:
        with secure.admin() as conn:
            conn.execute(f'REVOKE ALL ON TABLE {CATALOG_TABLE} FROM "{secure.role}"')
        admin.drop_table(f"{namespace}.events")
        admin.drop_namespace(namespace)
        admin.close()


@pytest.mark.parametrize("held", [(), ("SELECT",)], ids=["none", "select-only"])
def test_each_missing_catalog_right_is_named_with_its_grant(
    secure: SecurePg, table: tuple[str, dict[str, str], Any], held: tuple[str, ...]
) -> None:
    name, props, admin = table
    if held:
        with secure.admin() as conn:
            conn.execute(grant_line(list(held), secure.role))
    sink = IcebergSink(props, name, uid="ice", catalog_name=CATALOG)
    try:
        with pytest.raises(ConfigurationError) as info:
            sink.check(SCHEMA, "sec")
    finally:
        sink.release()
    missing = [p for p, _ in NEEDED if p not in held]
    message = str(info.value)
    assert f"lacks {len(missing)} right(s)" in message, message
    assert grant_line(missing, secure.role) in message, message
    assert "phase=check" in message and "sink_uid=ice" in message
    assert secure.password() not in message
    assert admin.load_table(name).current_snapshot() is None  # nothing was written


def test_with_both_rights_an_epoch_commits(
    secure: SecurePg, table: tuple[str, dict[str, str], Any]
) -> None:
    name, props, admin = table
    with secure.admin() as conn:
        conn.execute(grant_line([p for p, _ in NEEDED], secure.role))
    sink = IcebergSink(props, name, uid="ice", catalog_name=CATALOG)
    try:
        sink.check(SCHEMA, "sec")
        open_ = sink.begin(TxnId("sec", "ice", 0, 0, 0, 1), SCHEMA)
        sink.write(open_, rows(range(10)))
        assert commit(sink, 0, [sink.prepare(open_)]), "no unit reported committed"
    finally:
        sink.release()
    ids = admin.load_table(name).scan().to_arrow().column("id").to_pylist()
    assert sorted(ids) == list(range(10))
