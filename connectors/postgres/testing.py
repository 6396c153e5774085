"""The Postgres connector's testing adapter: a SQL verifier, an observer view, the pipeline
factory, and the clean-up of a target (its schema, after its prepared transactions).

Registered in :mod:`txsink.connectors.postgres.plugin`. The server comes from
``TXSINK_PG_DSN`` (a libpq connection string or URL); the ``staging`` variant's from
``TXSINK_PG_STOCK_DSN``, a server as PostgreSQL ships (``max_prepared_transactions = 0``,
where ``commit="auto"`` must choose the staging commit), else ``TXSINK_PG_DSN`` with the
staging commit forced. The ``secure`` variant (:attr:`PostgresTesting.secure_variants`) runs
on the secured server (``TXSINK_PG_SECURE_DSN``: TLS verified, the least-privileged role
``TXSINK_PG_SECURE_APP_ROLE``, a passfile), its targets made and read back through
``TXSINK_PG_SECURE_ADMIN_DSN`` (the administrator), the role granted exactly
:mod:`txsink.connectors.postgres.grants`'s rights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from txsink.connectors.postgres.prepared import prepared_gids, rollback_prepared
from txsink.connectors.postgres.sink import PostgresSink
from txsink.testing.adapter import ConnectorTesting
from txsink.testing.observer import Snapshot, Target, by_epoch
from txsink.testing.verifiers import SinkVerifier
from txsink.txid import TxnId

__all__ = ["ADAPTER", "DDL", "PostgresTarget", "PostgresTesting", "PostgresVerifier"]

DSN = "TXSINK_PG_DSN"
STOCK_DSN = "TXSINK_PG_STOCK_DSN"
SECURE_DSN = "TXSINK_PG_SECURE_DSN"
SECURE_ADMIN_DSN = "TXSINK_PG_SECURE_ADMIN_DSN"
SECURE_ROLE = "TXSINK_PG_SECURE_APP_ROLE"
#: How long drop_target waits for a lock other sessions hold (best effort: it gives up).
DROP_LOCK_TIMEOUT = "10s"
#: The sinks' stall_timeout_s in tests (the default, 60 s, is for production servers).
STALL_TIMEOUT_S = 8.0
#: The table every test target gets (the columns of the test input).
DDL = "CREATE TABLE {} (id bigint, key text, amount double precision, payload text)"


def _app_id(log: str | None) -> str | None:
    if log is None:
        return None
    from txsink import open_log

    meta = open_log(log).meta()
    return None if meta is None else str(meta["app_id"])


@dataclass
class PostgresVerifier:
    """A Postgres table: ``SELECT id``; lingering = this sink's prepared transactions.

    With ``log`` (the txsink log of the run) only the run's own prepared transactions
    count (``txsink.<app_id>.<uid>.``), so other users of the server do not disturb it.
    """

    dsn: str
    table: str
    expected: Iterable[int]
    uid: str
    log: str | None = None
    id_column: str = "id"

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        import psycopg
        from psycopg import sql

        query = sql.SQL("SELECT {} FROM {}").format(
            sql.Identifier(self.id_column), sql.Identifier(*self.table.split("."))
        )
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return [int(r[0]) for r in conn.execute(query).fetchall()]

    def lingering(self) -> int:
        """This sink's prepared transactions, and its transactions with rows left in a
        staging table (``txsink_staging_*`` in the target's schema, found in the catalog)."""
        import psycopg

        app = _app_id(self.log)
        prefix = f"txsink.{app}.{self.uid}." if app else "txsink."
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            gids = prepared_gids(conn, prefix) + staged_names(conn, self.table, prefix)
        return sum(1 for gid in gids if app or f".{self.uid}." in gid)


def staged_names(conn: Any, table: str, prefix: str) -> list[str]:
    """The transaction names starting with ``prefix`` that have rows in a staging table of
    ``table``'s schema (read with plain SQL: the tables by name pattern, not by the sink's
    own naming)."""
    from psycopg import sql

    schema = table.split(".", maxsplit=1)[0] if "." in table else "public"
    found = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind = 'r' AND c.relname LIKE 'txsink\\_staging\\_%%'",
        (schema,),
    ).fetchall()
    names: list[str] = []
    for (relname,) in found:
        rows = conn.execute(
            sql.SQL(
                "SELECT DISTINCT __txsink_gid FROM {} WHERE starts_with(__txsink_gid, %s)"
            ).format(sql.Identifier(schema, relname)),
            (prefix,),
        ).fetchall()
        names += [str(r[0]) for r in rows]
    return names


class PostgresTarget:
    """A Postgres table: the ids a new autocommit query sees (committed rows only)."""

    counts_rows = True
    guaranteed = True

    def __init__(self, dsn: str, table: str, *, name: str = "postgres", id_column: str = "id"):
        self.dsn = dsn
        self.table = table
        self.name = name
        self.id_column = id_column
        self._conn: Any = None

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        import psycopg
        from psycopg import sql

        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.Identifier(self.id_column), sql.Identifier(*self.table.split("."))
        )
        try:
            rows = self._conn.execute(query).fetchall()
        except Exception:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
            raise
        return by_epoch((int(r[0]) for r in rows), epoch_of)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


class PostgresTesting(ConnectorTesting):
    """A fresh schema with one table ``events`` per target; its name is the sink uid."""

    name: ClassVar[str] = "postgres"
    env_vars: ClassVar[tuple[str, ...]] = (DSN,)
    services: ClassVar[tuple[str, ...]] = ("postgres", "postgres_stock")
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        # With the epoch column: the runs' txsink audit reads each epoch's rows (deep).
        "append": {"mode": "append", "epoch_column": "txsink_epoch"},
        # commit="auto" on a server without prepared transactions: the staging commit.
        "staging": {"mode": "append", "server": "stock", "epoch_column": "txsink_epoch"},
    }
    secure_variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "secure": {"mode": "append", "server": "secure", "commit": "2pc"},
    }
    secure_services: ClassVar[tuple[str, ...]] = ("postgres_secure",)

    @staticmethod
    def dsn(spec: Mapping[str, Any], env: Mapping[str, str]) -> str:
        """The sink's server of a spec: the stock one when it asks for it and it is there;
        the secured one as the least-privileged role."""
        if spec.get("server") == "secure":
            return env[SECURE_DSN]
        if spec.get("server") == "stock" and env.get(STOCK_DSN):
            return env[STOCK_DSN]
        return env[DSN]

    @classmethod
    def admin_dsn(cls, spec: Mapping[str, Any], env: Mapping[str, str]) -> str:
        """Where targets are made and read back: the secured server's administrator, else
        the sink's own server."""
        return env[SECURE_ADMIN_DSN] if spec.get("server") == "secure" else cls.dsn(spec, env)

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {var: env[var] for var in (DSN, STOCK_DSN, SECURE_DSN) if var in env}

    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        import psycopg
        from psycopg import sql

        schema = f"t_{tag}"
        server = options.get("server")
        commit = options.get("commit", "auto")
        if server == "stock" and not env.get(STOCK_DSN):
            commit = "staging"  # a server with prepared transactions: force the staging commit
        with psycopg.connect(self.admin_dsn({"server": server}, env), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(sql.SQL(DDL).format(sql.Identifier(schema, "events")))
            if options.get("epoch_column"):
                conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint").format(
                        sql.Identifier(schema, "events"), sql.Identifier(options["epoch_column"])
                    )
                )
            if server == "secure":  # the role's least rights, as docs/security.md lists them
                from txsink.connectors.postgres.grants import rights, setup_sql

                mode = options.get("mode", "append")
                needed = rights(schema=schema, table="events", mode=mode, commit=commit)
                conn.execute(
                    setup_sql(env[SECURE_ROLE], needed, progress=(schema, "txsink_progress"))
                )
        return {
            "kind": self.name,
            "table": f"{schema}.events",
            "uid": options.get("uid", schema),
            "mode": options.get("mode", "append"),
            "key": list(options.get("key", ())),
            "server": server,
            "commit": commit,
            **({"epoch_column": options["epoch_column"]} if options.get("epoch_column") else {}),
        }

    def sink_options(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Without ``server`` (which of the harness's servers: the adapter's key, not the
        sink's; the DSN is the sink's)."""
        return {k: v for k, v in super().sink_options(spec).items() if k != "server"}

    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> PostgresSink:
        return PostgresSink(
            self.dsn(spec, env),
            spec["table"],
            uid=spec.get("uid", "pg"),
            mode=spec.get("mode", "append"),
            key=spec.get("key", ()),
            commit=spec.get("commit") or "auto",
            create_table=bool(spec.get("create_table", False)),
            epoch_column=spec.get("epoch_column"),
            connect_timeout_s=5,
            # Shorter than the cross-system tests' 12 s network stall, so that a stalled
            # server is ended by the sink's own bound, not by the network coming back.
            stall_timeout_s=STALL_TIMEOUT_S,
        )

    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        return PostgresVerifier(
            self.admin_dsn(spec, env), spec["table"], expected, spec.get("uid", "pg"), log=log
        )

    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        return [PostgresTarget(self.admin_dsn(spec, env), spec["table"])]

    def drop_target(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> None:
        """Drop the target's schema (``DROP SCHEMA ... CASCADE``), best effort.

        The sink's prepared transactions (any app's, by the uid in their gid) are rolled
        back first: they hold locks on the table, and the drop would wait on them.
        """
        import psycopg
        from psycopg import sql

        schema = str(spec["table"]).split(".")[0]
        uid = spec.get("uid", "pg")
        with (
            contextlib.suppress(Exception),
            psycopg.connect(self.admin_dsn(spec, env), autocommit=True, connect_timeout=5) as conn,
        ):
            for gid in prepared_gids(conn, "txsink."):
                txn = TxnId.try_parse(gid)
                if txn is not None and txn.uid == uid:
                    rollback_prepared(conn, gid)
            conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(DROP_LOCK_TIMEOUT)))
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


ADAPTER = PostgresTesting()
