"""Secrets rotation and expiry on the secured servers (issue 40, point 4).

Per connector (PostgreSQL, Kafka, S3), an epoch is decided and the driver dies before its
commit (the fault point ``after_decision``; the coordinator is then dropped, as a killed
driver's is). Each test gets a login of its own (a role, a SCRAM user, a MinIO user) so
that changing its secret disturbs no other test. Then, while the query is down:

1. **Rotation**: the secret is changed on the server and in the file the sink reads (the
   passfile, the password file, the shared-credentials file); the old secret is shown to
   be refused. A new driver, built from the file, recovers: the decided epoch is committed
   exactly once, read back by an admin client of the test's own, nothing left lingering.
   A sink that kept the old secret anywhere (the txsink log, a handle, a cached client)
   would fail here; the old and new secrets are nowhere in the txsink log either.
2. **Expiry or revocation**: the secret changed (or expired, or the login revoked) and
   *not* given to the sink. The recovery's commit meets the blocked state: one
   :class:`~txsink.errors.EpochBlockedError` naming the connector, the epoch and the fix,
   no retry loop, the block recorded in the txsink log, nothing of the epoch visible.
   Once the credential is given back, ``txsink recover`` (PostgreSQL) or the next
   driver's recovery commits it exactly once.
3. **Certificate rotation** (PostgreSQL): the server's certificate replaced by one from a
   new CA while the query is down; a client trusting only the old CA is refused, the sink
   given the new CA file recovers.

The servers are ``integration/services up postgres_secure kafka_secure s3_secure``; each
part is skipped without its server (an error under ``CI=true``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _services.common import ServiceError, real_servers_required, redact
from _services.resolve import resolve_postgres_secure

from tests.memsink import memory_precommit
from txsink import Coordinator
from txsink.errors import EpochBlockedError, InjectedFault
from txsink.protocol.faults import FaultPlan
from txsink.testing.contract import SCHEMA, rows

APP = "rot"
#: Epoch 0 commits; epoch 1 is decided, then the driver dies before its commit.
FIRST, DECIDED = [[0, 1], [2]], [[3, 4], [5]]
ALL_IDS = list(range(6))


def _write_secret_file(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, 0600 before the secret goes in (as an operator's
    rotation script does: write a new file, then rename it over the old one)."""
    tmp = path.with_name(path.name + ".new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


def _decide_then_die(sink: Any, tmp_path: Path) -> None:
    """Epoch 0 committed, epoch 1 decided; the driver dies right after the decision."""
    faults = FaultPlan.parse("after_decision:raise@1", str(tmp_path / "faults"))
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP, faults=faults)
    sink.check(SCHEMA, APP)
    coord.run_epoch(0, memory_precommit([[rows(p)] for p in FIRST]), app_id=APP)
    with pytest.raises(InjectedFault):
        coord.run_epoch(1, memory_precommit([[rows(p)] for p in DECIDED]), app_id=APP)
    coord.close()  # what is left of a dead driver: nothing but the txsink log


def _new_driver(sink: Any, tmp_path: Path) -> Coordinator:
    """The restarted query's coordinator, on the same txsink log."""
    return Coordinator([sink], log=str(tmp_path / "log"), app_id=APP)


def _log_holds(tmp_path: Path, *secrets_: str) -> list[str]:
    """The files of the txsink log that hold any of ``secrets_``."""
    files = [p for p in (tmp_path / "log").rglob("*") if p.is_file()]
    assert files, "the run left no txsink log to scan"
    return [str(p) for p in files if any(s.encode() in p.read_bytes() for s in secrets_)]


def _blocked_records(tmp_path: Path, epoch: int) -> list[Path]:
    found = (tmp_path / "log" / "epochs").glob("*/blocked-*")
    return sorted(p for p in found if int(p.parent.name) == epoch)


def _assert_blocked(err: EpochBlockedError, connector: str, *fix_words: str) -> None:
    """The blocked state as an operator meets it: connector, epoch, phase and the fix."""
    assert err.context.get("connector") == connector, err.context
    assert err.context.get("epoch") == 1, err.context
    assert err.context.get("phase") == "commit", err.context
    assert err.fix, str(err)
    for word in fix_words:
        assert word in err.fix, err.fix


# == PostgreSQL ================================================================================


@dataclass
class PgLogin:
    """A login role of this test's own on ``postgres_secure``, its passfile and rights."""

    admin_dsn: str
    host: str
    port: str
    role: str
    passfile: Path
    password: str
    schema: str
    ca: str
    #: The CA file the test's own admin client trusts (both CAs during a rotation).
    admin_ca: str | None = None

    def dsn(self, ca: str | None = None) -> str:
        return (
            f"host={self.host} port={self.port} dbname=txsink user={self.role} "
            f"sslmode=verify-full sslrootcert={ca or self.ca} passfile={self.passfile}"
        )

    def admin(self) -> Any:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(self.admin_dsn)
        if self.admin_ca is not None:
            params["sslrootcert"] = self.admin_ca
        return psycopg.connect(make_conninfo("", **params), autocommit=True)

    def give(self, password: str) -> None:
        """The passfile the sink reads now holds ``password``."""
        _write_secret_file(self.passfile, f"{self.host}:{self.port}:*:{self.role}:{password}\n")

    def ids(self) -> list[int]:
        with self.admin() as conn:
            sql = f'SELECT id FROM "{self.schema}".events ORDER BY id'
            return [int(r[0]) for r in conn.execute(sql)]

    def prepared(self) -> list[str]:
        """The role's prepared transactions (a streaming query's app id is its query id)."""
        with self.admin() as conn:
            sql = "SELECT gid FROM pg_prepared_xacts WHERE owner = %s"
            return [str(r[0]) for r in conn.execute(sql, (self.role,))]

    def refuses(self, password: str, ca: str | None = None) -> bool:
        """Whether the server refuses ``password`` for the role (a client of our own)."""
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = {k: v for k, v in conninfo_to_dict(self.dsn(ca)).items() if k != "passfile"}
        try:
            psycopg.connect(make_conninfo("", **params, password=password)).close()
        except psycopg.OperationalError:
            return True
        return False

    def sink(self, ca: str | None = None) -> Any:
        from txsink.connectors.postgres import PostgresSink

        return PostgresSink(
            self.dsn(ca), f"{self.schema}.events", uid="rot", commit="2pc", stall_timeout_s=20
        )


@pytest.fixture(scope="module")
def pg_env() -> dict[str, str]:
    try:
        return resolve_postgres_secure()
    except (ServiceError, OSError) as exc:
        message = f"postgres_secure server unavailable: {redact(str(exc))}"
        if real_servers_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture
def pg(pg_env: dict[str, str], tmp_path: Path) -> Iterator[PgLogin]:
    """A new role with the documented rights (append, 2pc) on a new schema's table."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from txsink.connectors.postgres.grants import rights, setup_sql

    params = conninfo_to_dict(pg_env["TXSINK_PG_SECURE_DSN"])
    suffix = os.urandom(4).hex()
    login = PgLogin(
        admin_dsn=pg_env["TXSINK_PG_SECURE_ADMIN_DSN"],
        host=str(params["host"]),
        port=str(params["port"]),
        role=f"rot_{suffix}",
        passfile=tmp_path / "pgpass",
        password=secrets.token_hex(16),
        schema=f"rot_{suffix}",
        ca=str(params["sslrootcert"]),
    )
    login.give(login.password)
    needed = rights(schema=login.schema, table="events", mode="append", commit="2pc")
    with login.admin() as conn:
        conn.execute(f"CREATE ROLE \"{login.role}\" LOGIN PASSWORD '{login.password}'")
        conn.execute(f'CREATE SCHEMA "{login.schema}"')
        conn.execute(f'CREATE TABLE "{login.schema}".events (id bigint NOT NULL, key text, '
                     "amount double precision, payload text)")  # fmt: skip
        conn.execute(setup_sql(login.role, needed, progress=(login.schema, "txsink_progress")))
    yield login
    with login.admin() as conn:
        for gid in login.prepared():
            with contextlib.suppress(psycopg.Error):
                conn.execute(f"ROLLBACK PREPARED '{gid}'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{login.schema}" CASCADE')
        conn.execute(f'DROP OWNED BY "{login.role}"')
        conn.execute(f'DROP ROLE IF EXISTS "{login.role}"')


@pytest.mark.postgres_secure
def test_postgres_password_rotated_while_down(pg: PgLogin, tmp_path: Path) -> None:
    old = pg.password
    _decide_then_die(pg.sink(), tmp_path)
    assert pg.ids() == [0, 1, 2] and len(pg.prepared()) == 2
    new = secrets.token_hex(16)
    with pg.admin() as conn:
        conn.execute(f"ALTER ROLE \"{pg.role}\" PASSWORD '{new}'")
    pg.give(new)
    assert pg.refuses(old) and not pg.refuses(new)
    coord = _new_driver(pg.sink(), tmp_path)
    coord.recover()
    coord.close()
    assert pg.ids() == ALL_IDS
    assert pg.prepared() == []
    assert _log_holds(tmp_path, old, new) == []


def _pg_revoke(pg: PgLogin, how: str) -> tuple[str, str]:
    """Revoke the role's credential ``how`` (the sink's passfile unchanged) and end its
    sessions, as an operator revoking access does. Returns (the password to give the sink
    back, the SQL that gives the credential back on the server)."""
    new, back = pg.password, ""
    if how == "password-changed":
        new = secrets.token_hex(16)
        statement = f"ALTER ROLE \"{pg.role}\" PASSWORD '{new}'"
    elif how == "password-expired":
        statement = f"ALTER ROLE \"{pg.role}\" VALID UNTIL '2000-01-01'"
        back = f"ALTER ROLE \"{pg.role}\" VALID UNTIL 'infinity'"
    else:  # login-revoked
        statement = f'ALTER ROLE "{pg.role}" NOLOGIN'
        back = f'ALTER ROLE "{pg.role}" LOGIN'
    with pg.admin() as conn:
        conn.execute(statement)
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
            (pg.role,),
        )
    assert pg.refuses(pg.password)
    return new, back


def _pg_give_back(pg: PgLogin, new: str, back: str) -> None:
    if back:
        with pg.admin() as conn:
            conn.execute(back)
    pg.give(new)


def _pipeline(tmp_path: Path, pg: PgLogin) -> str:
    """A pipeline file as an operator's ``txsink recover --pipeline`` loads it."""
    path = tmp_path / "pipeline.py"
    path.write_text(
        "from txsink import Coordinator\n"
        "from txsink.connectors.postgres import PostgresSink\n\n\n"
        "def build():\n"
        f"    sink = PostgresSink({pg.dsn()!r}, {pg.schema + '.events'!r}, uid='rot', "
        "commit='2pc')\n"
        f"    return Coordinator([sink], log={str(tmp_path / 'log')!r}, app_id={APP!r})\n"
    )
    return f"{path}:build"


def _txsink_recover(tmp_path: Path, pg: PgLogin) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "txsink.cli", "recover", "--log", str(tmp_path / "log"),
         "--pipeline", _pipeline(tmp_path, pg)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


REVOKED = ["password-changed", "password-expired", "login-revoked"]


@pytest.mark.postgres_secure
@pytest.mark.parametrize("how", REVOKED)
def test_postgres_credential_revoked_between_decision_and_commit_blocks(
    pg: PgLogin, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The live driver decided epoch 1; the operator revokes the credential (and ends the
    role's sessions) just before its commit: the commit is blocked, recorded, and waits."""
    old = pg.password
    sink = pg.sink()
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP)
    sink.check(SCHEMA, APP)
    coord.run_epoch(0, memory_precommit([[rows(p)] for p in FIRST]), app_id=APP)
    given: list[tuple[str, str]] = []
    commit_epoch = sink.commit_epoch

    def revoked_first(request: Any) -> None:
        if request.epoch == 1 and not given:
            given.append(_pg_revoke(pg, how))
        commit_epoch(request)

    monkeypatch.setattr(sink, "commit_epoch", revoked_first)
    with pytest.raises(EpochBlockedError) as info:
        coord.run_epoch(1, memory_precommit([[rows(p)] for p in DECIDED]), app_id=APP)
    coord.close()
    _assert_blocked(info.value, "postgres", f'ALTER ROLE "{pg.role}"')
    assert info.value.context.get("sink_uid") == "rot" and "txsink recover" in str(info.value)
    assert _blocked_records(tmp_path, 1), "the block is not in the txsink log"
    assert pg.ids() == [0, 1, 2]  # nothing of the decided epoch is visible
    assert len(pg.prepared()) == 2  # nor lost: it waits, prepared
    new, back = given[0]
    _pg_give_back(pg, new, back)
    done = _txsink_recover(tmp_path, pg)
    assert done.returncode == 0, done.stdout + done.stderr
    assert pg.ids() == ALL_IDS
    assert pg.prepared() == []
    for text in (done.stdout, done.stderr, str(info.value)):
        assert old not in text and new not in text
    assert _log_holds(tmp_path, old, new) == []


@pytest.mark.postgres_secure
@pytest.mark.parametrize("how", REVOKED)
def test_postgres_credential_revoked_while_down_stops_the_restart(
    pg: PgLogin, tmp_path: Path, how: str
) -> None:
    """Revoked while the query is down and not given back: the restarted driver's recovery
    names the fix and is not worth restarting again (no restart loop); the decided epoch
    waits, prepared. Given back, ``txsink recover`` commits it exactly once."""
    from txsink.errors import ConfigurationError, restart_cannot_help

    old = pg.password
    _decide_then_die(pg.sink(), tmp_path)
    new, back = _pg_revoke(pg, how)
    coord = _new_driver(pg.sink(), tmp_path)
    with pytest.raises(ConfigurationError) as info:
        coord.recover()
    coord.close()
    assert restart_cannot_help(info.value)
    assert info.value.context.get("connector") == "postgres"
    assert pg.role in str(info.value) and "ALTER ROLE" in str(info.value)
    assert pg.ids() == [0, 1, 2]
    assert len(pg.prepared()) == 2
    _pg_give_back(pg, new, back)
    done = _txsink_recover(tmp_path, pg)
    assert done.returncode == 0, done.stdout + done.stderr
    assert pg.ids() == ALL_IDS
    assert pg.prepared() == []
    assert _log_holds(tmp_path, old, new) == []


def _new_ca_and_server_cert(folder: Path, host: str) -> tuple[Path, Path, Path]:
    """A new CA (never seen by the sink) and a server certificate for ``host`` signed by
    it; returns (CA certificate, server certificate, server key)."""
    folder.mkdir(parents=True, exist_ok=True)
    ca, ca_key = folder / "ca.crt", folder / "ca.key"
    crt, key, csr, ext = (folder / n for n in ("server.crt", "server.key", "req.csr", "ext"))
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ext.write_text(
        f"subjectAltName = IP:{host}\nbasicConstraints = CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\nextendedKeyUsage = serverAuth\n"
    )
    for cmd in (
        ["req", "-x509", *curve, "-keyout", ca_key, "-out", ca, "-days", "2",
         "-subj", "/CN=txsink rotated CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        ["req", *curve, "-keyout", key, "-out", csr, "-subj", f"/CN={host}"],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", crt, "-days", "2", "-extfile", ext],
    ):  # fmt: skip
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True, timeout=60)
    return ca, crt, key


def _until(condition: Any, what: str, tries: int = 100) -> None:
    """Wait for ``condition()`` (a server's reload is asynchronous); fail naming ``what``."""
    import time

    for _ in range(tries):
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"never happened: {what}")


@contextlib.contextmanager
def _server_certificate(pg: PgLogin, crt: Path, key: Path) -> Iterator[None]:
    """The server presents ``crt`` (its key ``key``) to new connections, as an operator's
    rotation does (files in the data folder, ``ssl_cert_file``, a reload); put back after."""
    import shutil

    from _services.postgres import _chown_to_server_user

    with pg.admin() as conn:
        data = Path(str(conn.execute("SHOW data_directory").fetchone()[0]))
    placed = [data / "rotated-server.crt", data / "rotated-server.key"]
    shutil.copyfile(crt, placed[0])
    shutil.copyfile(key, placed[1])
    placed[1].chmod(0o600)
    _chown_to_server_user(*placed)

    def use(cert: str | None, key_file: str | None) -> None:
        with pg.admin() as conn:
            if cert is None:
                conn.execute("ALTER SYSTEM RESET ssl_cert_file")
                conn.execute("ALTER SYSTEM RESET ssl_key_file")
            else:
                conn.execute(f"ALTER SYSTEM SET ssl_cert_file = '{cert}'")
                conn.execute(f"ALTER SYSTEM SET ssl_key_file = '{key_file}'")
            conn.execute("SELECT pg_reload_conf()")

    use(placed[0].name, placed[1].name)
    try:
        yield
    finally:
        use(None, None)
        _until(lambda: not pg.refuses(pg.password), "the harness's certificate back in use")
        for path in placed:
            path.unlink(missing_ok=True)


@pytest.mark.postgres_secure
def test_postgres_certificate_rotated_to_a_new_ca_while_down(pg: PgLogin, tmp_path: Path) -> None:
    """The server's certificate replaced by one of a new CA while the query is down: a
    client trusting only the old CA is refused (the rotation is real); the sink given the
    new CA file recovers the decided epoch exactly once."""
    _decide_then_die(pg.sink(), tmp_path)
    new_ca, crt, key = _new_ca_and_server_cert(tmp_path / "tls", pg.host)
    both = tmp_path / "tls" / "both-cas.crt"  # the test's admin client trusts either
    both.write_text(Path(pg.ca).read_text() + new_ca.read_text())
    pg.admin_ca = str(both)
    with _server_certificate(pg, crt, key):
        _until(lambda: pg.refuses(pg.password), "the old CA refused after the rotation")
        assert not pg.refuses(pg.password, ca=str(new_ca))
        coord = _new_driver(pg.sink(ca=str(new_ca)), tmp_path)
        coord.recover()
        coord.close()
        assert pg.ids() == ALL_IDS
        assert pg.prepared() == []


# == Kafka =====================================================================================


@dataclass
class KafkaLogin:
    """A SCRAM user of this test's own on ``kafka_secure``, its password file and rights."""

    bootstrap: str
    ca: str
    admin_user: str
    admin_password_file: Path
    user: str
    password_file: Path
    topic: str
    marker: str

    def security(self, user: str, password: str) -> dict[str, Any]:
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user,
            "sasl.password": password,
            "ssl.ca.location": self.ca,
            "ssl.endpoint.identification.algorithm": "https",
        }

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        password = self.admin_password_file.read_text()
        return AdminClient(
            {"bootstrap.servers": self.bootstrap, **self.security(self.admin_user, password)}
        )

    def set_password(self, password: str) -> None:
        """The user's SCRAM credential set to ``password`` on the brokers (admin API)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        change = UserScramCredentialUpsertion(self.user, info, password.encode())
        admin = self.admin()  # kept until its futures are done
        for future in admin.alter_user_scram_credentials([change]).values():
            future.result(timeout=30)

    def logs_in(self, password: str) -> bool:
        """Whether the brokers take ``password`` for the user (a client of our own)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        failed: list[Any] = []
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            **self.security(self.user, password),
            "error_cb": failed.append,
        }
        client = AdminClient(conf)
        try:
            client.list_topics(timeout=10)
        except KafkaException:
            return False
        return not failed

    def sink(self, tmp_path: Path) -> Any:
        """The sink as a restarted driver builds it: the password read from its file."""
        from txsink.connectors.kafka import KafkaSink

        return KafkaSink(
            self.bootstrap,
            self.topic,
            uid="rot",
            mode="wal",
            wal=str(tmp_path / "wal"),
            marker_topic=self.marker,
            transactional_id_prefix=f"txsink-{self.topic}",
            key="key",
            value="payload",
            shards=2,
            producer_config=self.security(self.user, self.password_file.read_text()),
            timeout_s=20.0,
        )

    def ids(self) -> list[int]:
        """The ids a read_committed consumer (as the admin) sees, sorted."""
        from test_kafka_secure import SecureKafka, _read_committed

        env = {
            "BOOTSTRAP": self.bootstrap,
            "CA": self.ca,
            "USER": self.user,
            "PASSWORD_FILE": str(self.password_file),
            "ADMIN_USER": self.admin_user,
            "ADMIN_PASSWORD_FILE": str(self.admin_password_file),
        }
        values = _read_committed(SecureKafka(env), self.topic)
        return sorted(int((v or b"").decode().removeprefix("event-")) for v in values)

    def open_transactions(self) -> int:
        from txsink.connectors.kafka.clients.offsets import settled_ends

        found = 0
        for topic in (self.topic, self.marker):
            stable, high, _ = settled_ends(self.admin(), topic, 30.0, wait_s=10.0)
            found += sum(1 for p, end in high.items() if stable.get(p, 0) < end)
        return found


@pytest.fixture
def kafka(tmp_path: Path) -> Iterator[KafkaLogin]:
    """A new SCRAM user with exactly the sink's rights (``required_acls``) on new topics."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        NewTopic,
        ScramMechanism,
        UserScramCredentialDeletion,
    )

    from txsink.connectors.kafka.acls import create_acls, delete_acls, required_acls

    names = ("BOOTSTRAP", "CA", "ADMIN_USER", "ADMIN_PASSWORD_FILE")
    env = {v: os.environ.get(f"TXSINK_KAFKA_SECURE_{v}", "") for v in names}
    if not all(env.values()):
        msg = "no secured Kafka: run `integration/services up kafka_secure` and source its env"
        if real_servers_required():
            pytest.fail(msg + " (CI=true needs every server)")
        pytest.skip(msg)
    suffix = os.urandom(4).hex()
    login = KafkaLogin(
        bootstrap=env["BOOTSTRAP"],
        ca=env["CA"],
        admin_user=env["ADMIN_USER"],
        admin_password_file=Path(env["ADMIN_PASSWORD_FILE"]),
        user=f"rot-{suffix}",
        password_file=tmp_path / "kafka.password",
        topic=f"rot-{suffix}",
        marker=f"rot-m-{suffix}",
    )
    password = secrets.token_hex(16)
    _write_secret_file(login.password_file, password)
    admin = login.admin()
    topics = [
        NewTopic(login.topic, 2, 1),
        NewTopic(login.marker, 1, 1, config={"cleanup.policy": "compact"}),
    ]
    for future in admin.create_topics(topics).values():
        future.result(timeout=30)
    acls = required_acls(login.sink(tmp_path).settings, login.topic)
    create_acls(admin, acls, login.user)
    login.set_password(password)
    _until(lambda: login.logs_in(password), "the new SCRAM user logs in", tries=10)
    yield login
    admin = login.admin()
    delete_acls(admin, acls, login.user)
    gone = UserScramCredentialDeletion(login.user, ScramMechanism.SCRAM_SHA_512)
    for future in admin.alter_user_scram_credentials([gone]).values():
        with contextlib.suppress(Exception):
            future.result(timeout=30)
    for future in admin.delete_topics([login.topic, login.marker]).values():
        with contextlib.suppress(Exception):
            future.result(timeout=30)


@pytest.mark.kafka_secure
def test_kafka_scram_password_rotated_while_down(kafka: KafkaLogin, tmp_path: Path) -> None:
    old = kafka.password_file.read_text()
    _decide_then_die(kafka.sink(tmp_path), tmp_path)
    assert kafka.ids() == [0, 1, 2]
    new = secrets.token_hex(16)
    kafka.set_password(new)
    _write_secret_file(kafka.password_file, new)
    _until(lambda: not kafka.logs_in(old), "the old SCRAM password refused", tries=10)
    assert kafka.logs_in(new)
    coord = _new_driver(kafka.sink(tmp_path), tmp_path)
    coord.recover()
    coord.close()
    assert kafka.ids() == ALL_IDS
    assert kafka.open_transactions() == 0
    assert _log_holds(tmp_path, old, new) == []


def _kafka_revoke(kafka: KafkaLogin, how: str) -> Any:
    """Revoke the user's credential ``how`` (its password file unchanged); returns the
    function that gives it back (and the sink its password file)."""
    from txsink.connectors.kafka.acls import create_acls, delete_acls, required_acls

    if how == "password-changed":
        old, new = kafka.password_file.read_text(), secrets.token_hex(16)
        kafka.set_password(new)
        _until(lambda: not kafka.logs_in(old), "the old SCRAM password refused", tries=10)
        return lambda: _write_secret_file(kafka.password_file, new)
    # write-revoked: the topic's Write ACL deleted
    write = [
        a
        for a in required_acls(kafka.sink(Path("/nonexistent")).settings, kafka.topic)
        if a.name == kafka.topic and a.operation == "Write"
    ]
    delete_acls(kafka.admin(), write, kafka.user)
    return lambda: create_acls(kafka.admin(), write, kafka.user)


#: A password changed under a live driver is not a refusal: its producers' connections are
#: authenticated already (brokers re-authenticate only with connections.max.reauth.ms).
KAFKA_REVOKED = ["write-revoked"]


@pytest.mark.kafka_secure
@pytest.mark.parametrize("how", KAFKA_REVOKED)
def test_kafka_credential_revoked_between_decision_and_commit_blocks(
    kafka: KafkaLogin, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = kafka.sink(tmp_path)
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP)
    sink.check(SCHEMA, APP)
    coord.run_epoch(0, memory_precommit([[rows(p)] for p in FIRST]), app_id=APP)
    given: list[Any] = []
    commit_epoch = sink.commit_epoch

    def revoked_first(request: Any) -> None:
        if request.epoch == 1 and not given:
            given.append(_kafka_revoke(kafka, how))
        commit_epoch(request)

    monkeypatch.setattr(sink, "commit_epoch", revoked_first)
    with pytest.raises(EpochBlockedError) as info:
        coord.run_epoch(1, memory_precommit([[rows(p)] for p in DECIDED]), app_id=APP)
    coord.close()
    _assert_blocked(info.value, "kafka")
    assert _blocked_records(tmp_path, 1), "the block is not in the txsink log"
    assert kafka.ids() == [0, 1, 2]
    given[0]()
    again = _new_driver(kafka.sink(tmp_path), tmp_path)
    again.recover()
    again.close()
    assert kafka.ids() == ALL_IDS
    assert kafka.open_transactions() == 0


@pytest.mark.kafka_secure
def test_kafka_password_changed_while_down_blocks_the_commit(
    kafka: KafkaLogin, tmp_path: Path
) -> None:
    """The SCRAM password changed while the query is down and not given to the sink: the
    restarted driver's recovery commit is blocked (a refused login, not a retried broker
    outage), recorded in the log; nothing of the epoch is visible. Given the new password,
    the next driver commits it exactly once."""
    old = kafka.password_file.read_text()
    _decide_then_die(kafka.sink(tmp_path), tmp_path)
    give_back = _kafka_revoke(kafka, "password-changed")
    coord = _new_driver(kafka.sink(tmp_path), tmp_path)
    with pytest.raises(EpochBlockedError) as info:
        coord.recover()
    coord.close()
    _assert_blocked(info.value, "kafka", kafka.user, "kafka-configs")
    assert _blocked_records(tmp_path, 1), "the block is not in the txsink log"
    assert kafka.ids() == [0, 1, 2]
    give_back()
    new = kafka.password_file.read_text()
    again = _new_driver(kafka.sink(tmp_path), tmp_path)
    again.recover()
    again.close()
    assert kafka.ids() == ALL_IDS
    assert kafka.open_transactions() == 0
    assert old not in str(info.value) and new not in str(info.value)
    assert _log_holds(tmp_path, old, new) == []


# == S3 ========================================================================================


@dataclass
class S3Login:
    """A MinIO user of this test's own on ``s3_secure`` (the least-privilege policy), its
    secret in a shared-credentials file the sink reads through boto3's chain."""

    env: dict[str, str]
    access_key: str
    secret: str
    credentials: Path
    prefix: str

    def server(self) -> Any:
        from test_s3_secure import SecureS3

        return SecureS3(self.env)

    def admin(self) -> Any:
        import urllib3
        from minio import MinioAdmin
        from minio.credentials.providers import StaticProvider

        server = self.server()
        root = server._profile(self.env["TXSINK_S3_SECURE_ADMIN_PROFILE"])
        return MinioAdmin(
            endpoint=server.endpoint.removeprefix("https://"),
            credentials=StaticProvider(*root),
            region=self.env["TXSINK_S3_SECURE_REGION"],
            secure=True,
            http_client=urllib3.PoolManager(ca_certs=server.ca, cert_reqs="CERT_REQUIRED"),
        )

    def set_secret(self, secret: str) -> None:
        """The user's secret changed on the server (MinIO's admin API)."""
        self.admin().user_add(self.access_key, secret)

    def give(self, secret: str) -> None:
        """The shared-credentials file the sink reads now holds ``secret``."""
        _write_secret_file(
            self.credentials,
            f"[rot]\naws_access_key_id = {self.access_key}\naws_secret_access_key = {secret}\n",
        )

    def refuses(self, secret: str) -> bool:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import ClientError

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.server().endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret,
            region_name=self.env["TXSINK_S3_SECURE_REGION"],
            verify=self.server().ca,
            config=Config(retries={"max_attempts": 1}),
        )
        bucket = self.env["TXSINK_S3_SECURE_BUCKET"]
        try:
            client.list_objects_v2(Bucket=bucket, Prefix=self.prefix, MaxKeys=1)
        except ClientError:
            return True
        return False

    def sink(self) -> Any:
        from txsink.connectors.s3 import S3Sink

        server = self.server()
        return S3Sink(
            f"s3://{server.bucket}/{self.prefix}",
            uid="rot",
            format="jsonl",
            client_options={
                "endpoint_url": server.endpoint,
                "region_name": self.env["TXSINK_S3_SECURE_REGION"],
                "verify": server.ca,
            },
        )

    def ids(self) -> list[int]:
        from test_s3_secure import _ids

        return _ids(self.server(), self.prefix)

    def open_uploads(self) -> list[str]:
        return list(self.server().open_uploads(self.prefix))


@pytest.fixture
def s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Login]:
    from _services.resolve import resolve_s3_secure

    try:
        env = resolve_s3_secure()
    except (ServiceError, OSError) as exc:
        message = f"s3_secure server unavailable: {redact(str(exc))}"
        if real_servers_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    suffix = os.urandom(4).hex()
    login = S3Login(
        env=env,
        access_key=f"rot-{suffix}",
        secret=secrets.token_hex(16),
        credentials=tmp_path / "aws-credentials",
        prefix=f"{env['TXSINK_S3_SECURE_PREFIX']}{suffix}/",
    )
    admin = login.admin()
    admin.user_add(login.access_key, login.secret)
    admin.policy_set(env["TXSINK_S3_SECURE_POLICY"], user=login.access_key)
    login.give(login.secret)
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(login.credentials))
    monkeypatch.setenv("AWS_PROFILE", "rot")
    _until(lambda: not login.refuses(login.secret), "the new MinIO user is usable", tries=30)
    yield login
    login.server().purge(login.prefix)
    with contextlib.suppress(Exception):
        login.admin().user_remove(login.access_key)


@pytest.mark.s3_secure
def test_s3_secret_rotated_while_down(s3: S3Login, tmp_path: Path) -> None:
    old = s3.secret
    _decide_then_die(s3.sink(), tmp_path)
    assert s3.ids() == [0, 1, 2]
    new = secrets.token_hex(16)
    s3.set_secret(new)
    s3.give(new)
    _until(lambda: s3.refuses(old), "the old secret refused", tries=30)
    assert not s3.refuses(new)
    coord = _new_driver(s3.sink(), tmp_path)
    coord.recover()
    coord.close()
    assert s3.ids() == ALL_IDS
    assert s3.open_uploads() == []
    assert _log_holds(tmp_path, old, new) == []


@pytest.mark.s3_secure
def test_s3_secret_changed_between_decision_and_commit_blocks(
    s3: S3Login, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = s3.secret
    sink = s3.sink()
    coord = Coordinator([sink], log=str(tmp_path / "log"), app_id=APP)
    sink.check(SCHEMA, APP)
    coord.run_epoch(0, memory_precommit([[rows(p)] for p in FIRST]), app_id=APP)
    new = secrets.token_hex(16)
    commit_epoch = sink.commit_epoch

    def revoked_first(request: Any) -> None:
        if request.epoch == 1 and not s3.refuses(old) and old != new:
            s3.set_secret(new)
            _until(lambda: s3.refuses(old), "the old secret refused", tries=30)
        commit_epoch(request)

    monkeypatch.setattr(sink, "commit_epoch", revoked_first)
    with pytest.raises(EpochBlockedError) as info:
        coord.run_epoch(1, memory_precommit([[rows(p)] for p in DECIDED]), app_id=APP)
    coord.close()
    _assert_blocked(info.value, "s3", "current credentials", "secret key was changed")
    assert _blocked_records(tmp_path, 1), "the block is not in the txsink log"
    assert s3.ids() == [0, 1, 2]
    s3.give(new)
    again = _new_driver(s3.sink(), tmp_path)
    again.recover()
    again.close()
    assert s3.ids() == ALL_IDS
    assert s3.open_uploads() == []
    assert old not in str(info.value) and new not in str(info.value)
    assert _log_holds(tmp_path, old, new) == []


@pytest.mark.s3_secure
def test_s3_secret_changed_while_down_stops_the_restart(s3: S3Login, tmp_path: Path) -> None:
    from txsink.errors import ConfigurationError, restart_cannot_help

    old = s3.secret
    _decide_then_die(s3.sink(), tmp_path)
    new = secrets.token_hex(16)
    s3.set_secret(new)
    _until(lambda: s3.refuses(old), "the old secret refused", tries=30)
    coord = _new_driver(s3.sink(), tmp_path)
    with pytest.raises(ConfigurationError) as info:
        coord.recover()
    coord.close()
    assert restart_cannot_help(info.value)
    assert info.value.context.get("connector") == "s3"
    assert s3.ids() == [0, 1, 2]
    s3.give(new)
    again = _new_driver(s3.sink(), tmp_path)
    again.recover()
    again.close()
    assert s3.ids() == ALL_IDS
    assert s3.open_uploads() == []
    assert _log_holds(tmp_path, old, new) == []


# == A streaming query killed after the decision (PostgreSQL) ==================================


@pytest.mark.spark
@pytest.mark.postgres_secure
def test_postgres_streaming_driver_killed_then_password_rotated(
    pg: PgLogin, tmp_path: Path
) -> None:
    """The chaos toolkit's pipeline in a child process: SIGKILL of the driver right after
    epoch 1's decision (``after_decision:kill-driver``). Before the runner restarts it, the
    role's password is changed on the server and in the passfile; the restarted query's
    recovery commits epoch 1 with the new password, and the stream goes on: every row
    exactly once, nothing prepared left, neither password in the txsink log."""
    import json

    from txsink.runner import run_until_done
    from txsink.testing.inputs import make_input

    make_input(tmp_path / "input", 60, files=3)
    spec = {"kind": "postgres", "table": f"{pg.schema}.events", "uid": "rot", "commit": "2pc"}
    args = {
        "workdir": str(tmp_path),
        "sinks": [spec],
        "partitions": 2,
        "log": str(tmp_path / "log"),
    }
    env = {
        **os.environ,
        "TXSINK_PG_DSN": pg.dsn(),
        "TXSINK_FAULT": "after_decision:kill-driver@1",
        "TXSINK_FAULT_STATE": str(tmp_path / "faults"),
    }
    old, new = pg.password, secrets.token_hex(16)
    rotated: list[int] = []

    def rotate(run: int, code: int) -> None:
        assert pg.ids() == list(range(20)) and len(pg.prepared()) == 2, "not left decided"
        with pg.admin() as conn:
            conn.execute(f"ALTER ROLE \"{pg.role}\" PASSWORD '{new}'")
        pg.give(new)
        assert pg.refuses(old)
        rotated.append(code)

    cmd = [sys.executable, "-m", "txsink.runner", "txsink.testing.pipelines:run_stream"]
    report = run_until_done([*cmd, json.dumps(args)], env=env, max_runs=3, on_restart=rotate)
    assert rotated and report.runs == 2, report
    assert pg.ids() == list(range(60))
    assert pg.prepared() == []
    assert _log_holds(tmp_path, old, new) == []
