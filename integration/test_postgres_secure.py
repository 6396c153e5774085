"""The Postgres sink on a secured server (the ``postgres_secure`` service): TLS required and
verified (``sslmode=verify-full``), SCRAM passwords from a libpq passfile, and a login role
with only the rights :mod:`txsink.connectors.postgres.grants` lists.

Every check reads the server back as the harness's superuser with psycopg queries of its
own, never through the sink. The rights granted here are exactly
:func:`~txsink.connectors.postgres.grants.setup_sql`'s output, which ``docs/security.md``
shows: each removed right in turn is named by the start-up check with its ``GRANT`` line,
and nothing is written.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _services.common import ServiceError, real_servers_required, redact
from _services.resolve import resolve_postgres_secure

from txsink.connectors.postgres import PostgresSink
from txsink.connectors.postgres.grants import Right, rights, setup_sql
from txsink.connectors.postgres.testing import staged_names
from txsink.errors import ConfigurationError
from txsink.handles import Handle, dump_handle, load_handle
from txsink.testing.contract import SCHEMA, commit, rows
from txsink.txid import TxnId

pytestmark = pytest.mark.postgres_secure

APP = "sec"
COLUMNS = "id bigint NOT NULL, key text, amount double precision, payload text"


@dataclass
class SecurePg:
    """The secured server: the app role's DSN (no password in it), the admin's, the role."""

    dsn: str
    admin_dsn: str
    role: str
    passfile: Path
    _schemas: list[str] = field(default_factory=list)

    def admin(self) -> Any:
        import psycopg

        return psycopg.connect(self.admin_dsn, autocommit=True)

    def password(self) -> str:
        for line in self.passfile.read_text().splitlines():
            if line.split(":")[3] == self.role:
                return line.split(":", 4)[4]
        raise LookupError(f"no password for {self.role} in {self.passfile}")

    def new_schema(self, prefix: str) -> str:
        name = f"{prefix}_{os.urandom(4).hex()}"
        with self.admin() as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        self._schemas.append(name)
        return name

    def cleanup(self) -> None:
        with self.admin() as conn:
            for (gid,) in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"txsink.{APP}.",)
            ).fetchall():
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
            for name in self._schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        self._schemas.clear()


@pytest.fixture(scope="module")
def secure() -> Iterator[SecurePg]:
    """The ``postgres_secure`` service (started if need be); skipped when it cannot start,
    an error under ``CI=true``, like every other service."""
    try:
        env = resolve_postgres_secure()
    except (ServiceError, OSError) as exc:
        message = f"postgres_secure server unavailable: {redact(str(exc))}"
        if real_servers_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    server = SecurePg(
        dsn=env["TXSINK_PG_SECURE_DSN"],
        admin_dsn=env["TXSINK_PG_SECURE_ADMIN_DSN"],
        role=env["TXSINK_PG_SECURE_APP_ROLE"],
        passfile=Path(env["TXSINK_PG_SECURE_PASSFILE"]),
    )
    yield server


@pytest.fixture
def server(secure: SecurePg) -> Iterator[SecurePg]:
    yield secure
    secure.cleanup()


@dataclass(frozen=True)
class Setup:
    """One way to run the sink: its mode, commit protocol, a staging schema made for it,
    and whether an administrator created the progress table beforehand."""

    mode: str
    commit: str
    staging_schema: bool = False
    progress_made: bool = True

    @property
    def id(self) -> str:
        parts = [self.commit, self.mode]
        parts += ["stagingschema"] if self.staging_schema else []
        parts += [] if self.progress_made else ["progresscreated"]
        return "-".join(parts)

    def rights(self, schema: str, staging: str | None) -> list[Right]:
        return rights(
            schema=schema,
            table="events",
            mode=self.mode,
            commit=self.commit,
            progress_exists=self.progress_made,
            staging_schema=staging,
        )


SETUPS = [
    Setup("append", "2pc"),
    Setup("upsert", "2pc"),
    Setup("append", "staging"),
    Setup("upsert", "staging"),
    Setup("append", "staging", staging_schema=True),
    Setup("append", "2pc", progress_made=False),
    Setup("upsert", "staging", staging_schema=True, progress_made=False),
]


def _prepare_target(server: SecurePg, setup: Setup) -> tuple[str, str | None, list[Right]]:
    """As the administrator: the target, the progress table (if made beforehand), a staging
    schema (if any), and every right of ``setup`` granted by :func:`setup_sql`."""
    schema = server.new_schema("sec")
    staging = server.new_schema("stg") if setup.staging_schema else None
    needed = setup.rights(schema, staging)
    progress = (schema, "txsink_progress") if setup.progress_made else None
    with server.admin() as conn:
        key = ", PRIMARY KEY (id)" if setup.mode == "upsert" else ""
        conn.execute(f'CREATE TABLE "{schema}".events ({COLUMNS}{key})')
        conn.execute(setup_sql(server.role, needed, progress=progress))
    return schema, staging, needed


def _sink(server: SecurePg, schema: str, staging: str | None, setup: Setup) -> PostgresSink:
    return PostgresSink(
        server.dsn,
        f"{schema}.events",
        uid="sec",
        mode="upsert" if setup.mode == "upsert" else "append",
        key=("id",) if setup.mode == "upsert" else (),
        commit="staging" if setup.commit == "staging" else "2pc",
        staging_schema=staging,
        stall_timeout_s=20,
    )


def _prepare(sink: PostgresSink, epoch: int, parts: Sequence[Sequence[int]]) -> list[Handle]:
    handles = []
    for p, ids in enumerate(parts):
        txn = TxnId(APP, sink.uid, epoch, 0, p, 100 + p)
        open_ = sink.begin(txn, SCHEMA)
        sink.write(open_, rows(ids))
        handles.append(sink.prepare(open_))
    return handles


def _ids(server: SecurePg, schema: str) -> list[int]:
    with server.admin() as conn:
        return [int(r[0]) for r in conn.execute(f'SELECT id FROM "{schema}".events ORDER BY id')]


def _leftovers(server: SecurePg, schema: str, staging: str | None) -> list[str]:
    with server.admin() as conn:
        found = [
            str(r[0])
            for r in conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"txsink.{APP}.",)
            )
        ]
        found += staged_names(conn, f"{schema}.events", "txsink.")
        if staging is not None:
            found += staged_names(conn, f"{staging}.events", "txsink.")
    return found


@pytest.mark.parametrize("setup", SETUPS, ids=[s.id for s in SETUPS])
def test_an_epoch_through_the_least_privileged_role(server: SecurePg, setup: Setup) -> None:
    """The check passes with exactly the documented rights; an epoch prepared by one driver
    is committed by a new one (as recovery does), over verify-full TLS, exactly once."""
    schema, staging, _ = _prepare_target(server, setup)
    sink = _sink(server, schema, staging, setup)
    sink.check(SCHEMA, APP)
    with sink._on_driver(None, "check") as conn:  # what the sink's own connection is
        who = conn.execute(
            "SELECT current_user, s.ssl, r.rolsuper FROM pg_stat_ssl s, pg_roles r "
            "WHERE s.pid = pg_backend_pid() AND r.rolname = current_user"
        ).fetchone()
    assert who == (server.role, True, False)
    handles = _prepare(sink, 0, [[1, 2], [3]])
    sink.release()
    # A new driver (after a crash between decision and commit) finishes it as the same role.
    again = _sink(server, schema, staging, setup)
    again.check(SCHEMA, APP)
    listed = {str(h.txn) for h in again.list_prepared(APP)}
    assert listed == {str(h.txn) for h in handles}
    commit(again, 0, [load_handle(dump_handle(h)) for h in handles])
    again.release()
    assert _ids(server, schema) == [1, 2, 3]
    assert _leftovers(server, schema, staging) == []


def test_a_connection_without_tls_is_refused(server: SecurePg) -> None:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(server.dsn)
    plain = make_conninfo("", **{**params, "sslmode": "disable"})
    with pytest.raises(psycopg.OperationalError, match="no encryption"):
        psycopg.connect(plain).close()
    # And TLS without verifying the server's name is not what the DSN asks for.
    assert params["sslmode"] == "verify-full" and "password" not in params


def _cases() -> list[Any]:
    cases = []
    for setup in SETUPS:
        for i, right in enumerate(setup.rights("S", "Z" if setup.staging_schema else None)):
            what = right.name if right.kind == "table" else f"schema{right.schema}"
            cases.append(pytest.param(setup, i, id=f"{setup.id}-{right.privilege}-{what}".lower()))
    return cases


@pytest.mark.parametrize(("setup", "index"), _cases())
def test_each_missing_right_is_named_with_its_grant(
    server: SecurePg, setup: Setup, index: int
) -> None:
    schema, staging, needed = _prepare_target(server, setup)
    removed = needed[index]
    with server.admin() as conn:
        conn.execute(removed.revoke(server.role))
        before = _owned(conn, server.role)
    sink = _sink(server, schema, staging, setup)
    with pytest.raises(ConfigurationError) as info:
        sink.check(SCHEMA, APP)
    sink.release()
    message = str(info.value)
    assert "lacks 1 right(s)" in message, message
    assert removed.grant(server.role) in message, message
    assert f"{removed.privilege} on {removed.on}" in message
    with server.admin() as conn:
        assert _owned(conn, server.role) == before  # nothing created (progress, staging)
    assert _ids(server, schema) == []
    # Granted back, the check passes: the right was the only thing missing.
    with server.admin() as conn:
        conn.execute(removed.grant(server.role))
    again = _sink(server, schema, staging, setup)
    again.check(SCHEMA, APP)
    again.release()


def _owned(conn: Any, role: str) -> list[str]:
    return [
        str(r[0])
        for r in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner "
            "WHERE r.rolname = %s ORDER BY 1",
            (role,),
        )
    ]


def test_prepared_transactions_of_another_role_are_refused_at_the_check(
    server: SecurePg, tmp_path: Path
) -> None:
    """Only the preparing role (or a superuser) may COMMIT PREPARED: a driver connecting as
    another role could not finish the epoch, so it does not start."""

    setup = Setup("append", "2pc")
    schema, staging, needed = _prepare_target(server, setup)
    sink = _sink(server, schema, staging, setup)
    sink.check(SCHEMA, APP)
    _prepare(sink, 0, [[1]])
    sink.release()
    with _another_role(server, tmp_path, needed) as dsn:
        stranger = PostgresSink(dsn, f"{schema}.events", uid="sec", commit="2pc")
        with pytest.raises(ConfigurationError, match=f"belongs to role '{server.role}'"):
            stranger.check(SCHEMA, APP)
        stranger.release()


@pytest.mark.spark
def test_a_streaming_run_with_a_crash_recovers_and_leaks_no_password(
    spark: Any,
    server: SecurePg,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A query through the least-privileged role, with a crash after the decision: the
    restarted query's recovery commits as the same role. Then no artifact of the run (the
    txsink log, tmp_path, the captured output and log records) holds the role's password."""
    from tests.streaming import prepare_input, run_until_done
    from txsink import Coordinator
    from txsink.protocol.faults import FaultPlan

    setup = Setup("append", "2pc")
    schema, staging, _ = _prepare_target(server, setup)
    prepare_input(tmp_path, 100, files=2)
    plan = FaultPlan.parse("during_commit:raise@1", str(tmp_path / "faults"))

    def make() -> Any:
        sink = _sink(server, schema, staging, setup)
        return Coordinator([sink], log=str(tmp_path / "txlog"), faults=plan)

    restarts, _ = run_until_done(spark, tmp_path, make)
    assert restarts == 1
    assert _ids(server, schema) == list(range(100))
    assert _leftovers(server, schema, staging) == []
    secret = server.password()
    found = [
        str(p) for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()
    ]
    out, err = capfd.readouterr()
    assert found == []
    assert secret not in out + err
    assert secret not in caplog.text
    assert secret not in server.dsn


@pytest.mark.slow
@pytest.mark.parametrize(("setup", "index"), _cases())
def test_each_right_is_needed_by_an_epoch(
    server: SecurePg, setup: Setup, index: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The list is minimal: with the rights check skipped and one right removed, an epoch
    (check, prepare, commit, what recovery reads) fails somewhere; granted back, it passes."""
    from txsink.connectors.postgres.checks import StartCheck

    schema, staging, needed = _prepare_target(server, setup)
    with server.admin() as conn:
        conn.execute(needed[index].revoke(server.role))
    monkeypatch.setattr(StartCheck, "_rights", lambda self: None)
    sink = _sink(server, schema, staging, setup)
    with pytest.raises(Exception):  # noqa: B017 - any refusal: the right was used
        sink.check(SCHEMA, APP)
        sink.recorded_epoch(APP)
        list(sink.list_prepared(APP))
        commit(sink, 0, _prepare(sink, 0, [[1, 2], [3]]))
    sink.release()
    # Granted back, the same flow passes (a new epoch): the failure was the right's.
    with server.admin() as conn:
        conn.execute(needed[index].grant(server.role))
    again = _sink(server, schema, staging, setup)
    again.check(SCHEMA, APP)
    commit(again, 1, _prepare(again, 1, [[4], [5]]))
    again.release()
    assert 4 in _ids(server, schema) and 5 in _ids(server, schema)


def _pipeline(tmp_path: Path, name: str, dsn: str, table: str) -> str:
    """A pipeline file as an operator's ``txsink recover --pipeline`` loads it."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "from txsink import Coordinator\n"
        "from txsink.connectors.postgres import PostgresSink\n\n\n"
        "def build():\n"
        f"    sink = PostgresSink({dsn!r}, {table!r}, uid='sec', commit='2pc')\n"
        f"    return Coordinator([sink], log={str(tmp_path / 'log')!r}, app_id={APP!r})\n"
    )
    return f"{path}:build"


def _txsink(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txsink.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_txsink_recover_commits_as_the_preparing_role_and_leaks_no_password(
    server: SecurePg, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A decided epoch left prepared by a crash: ``txsink recover`` as another role is
    blocked (only the preparing role or a superuser may COMMIT PREPARED) and changes
    nothing; as the same role it commits. No artifact holds the role's password."""

    from tests.memsink import memory_precommit
    from txsink import Coordinator
    from txsink.errors import InjectedFault
    from txsink.protocol.faults import FaultPlan

    setup = Setup("append", "2pc")
    schema, staging, needed = _prepare_target(server, setup)
    table = f"{schema}.events"
    sink = _sink(server, schema, staging, setup)
    faults = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP, faults=faults)
    sink.check(SCHEMA, APP)
    coord.run_epoch(0, memory_precommit([[rows([0, 1])], [rows([2])]]), app_id=APP)
    with pytest.raises(InjectedFault):  # epoch 1 decided, not committed
        coord.run_epoch(1, memory_precommit([[rows([3, 4])], [rows([5])]]), app_id=APP)
    coord.close()
    assert _ids(server, schema) == [0, 1, 2]

    with _another_role(server, tmp_path, needed) as dsn:
        blocked = _txsink(
            "recover",
            "--log",
            str(tmp_path / "log"),
            "--pipeline",
            _pipeline(tmp_path, "as_other", dsn, table),
        )
        assert blocked.returncode != 0, blocked.stdout + blocked.stderr
        err = " ".join(blocked.stderr.split())
        assert "COMMIT PREPARED needs the role that prepared the transaction" in err, err
        assert _ids(server, schema) == [0, 1, 2]
        done = _txsink(
            "recover",
            "--log",
            str(tmp_path / "log"),
            "--pipeline",
            _pipeline(tmp_path, "as_app", server.dsn, table),
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert _ids(server, schema) == [0, 1, 2, 3, 4, 5]
    assert _leftovers(server, schema, staging) == []
    secret = server.password()
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files, "the run left no artifacts to scan"
    assert [str(p) for p in files if secret.encode() in p.read_bytes()] == []
    for text in (blocked.stdout, blocked.stderr, done.stdout, done.stderr, caplog.text):
        assert secret not in text


def test_a_password_written_into_the_dsn_still_reaches_no_artifact(
    server: SecurePg,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Against advice, the password in the DSN itself: the txsink log, the sink's repr,
    the errors of a failed epoch and the log records still do not carry it."""
    import logging

    from tests.memsink import memory_precommit
    from txsink import Coordinator
    from txsink.errors import InjectedFault
    from txsink.protocol.faults import FaultPlan

    setup = Setup("append", "2pc")
    schema, _, _ = _prepare_target(server, setup)
    secret = server.password()
    sink = PostgresSink(f"{server.dsn} password={secret}", f"{schema}.events", uid="sec")
    faults = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP, faults=faults)
    with caplog.at_level(logging.DEBUG):
        sink.check(SCHEMA, APP)
        coord.run_epoch(0, memory_precommit([[rows([0, 1])], [rows([2])]]), app_id=APP)
        with pytest.raises(InjectedFault) as info:
            coord.run_epoch(1, memory_precommit([[rows([3])]]), app_id=APP)
        coord.close()
    files = [p for p in (tmp_path / "log").rglob("*") if p.is_file()]
    assert files
    assert [str(p) for p in files if secret.encode() in p.read_bytes()] == []
    out, err = capfd.readouterr()
    for text in (repr(sink), str(info.value), caplog.text, out, err):
        assert secret not in text


@contextlib.contextmanager
def _another_role(server: Any, tmp_path: Path, needed: Sequence[Right]) -> Iterator[str]:
    """A second login role with the same rights as the app's, its password in a passfile of
    its own; yields its DSN (TLS, no password) and drops the role afterwards."""
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    other, password = f"other_{os.urandom(3).hex()}", os.urandom(12).hex()
    params = conninfo_to_dict(server.dsn)
    passfile = tmp_path / f"{other}.pgpass"
    passfile.touch(mode=0o600)
    passfile.write_text(f"{params['host']}:{params['port']}:*:{other}:{password}\n")
    role = sql.Identifier(other)
    with server.admin() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(role, sql.Literal(password))
        )
        conn.execute(setup_sql(other, needed))
    try:
        yield make_conninfo("", **{**params, "user": other, "passfile": str(passfile)})
    finally:
        with server.admin() as conn, contextlib.suppress(Exception):
            conn.execute(sql.SQL("DROP OWNED BY {}").format(role))
            conn.execute(sql.SQL("DROP ROLE {}").format(role))
