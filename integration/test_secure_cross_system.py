"""The cross-system move on the secured profile (issue 40, point 3): one streaming query
into Kafka (WAL mode, ``kafka_secure``), PostgreSQL (``postgres_secure``), S3
(``s3_secure``), Iceberg and Delta, each through its least-privileged principal over verified
TLS, granted exactly what ``docs/security.md`` lists (rendered by each connector's
``acls`` / ``grants`` module), nothing more.

The run, in child processes as a user's job runs (``integration/secure_xs.py`` builds the
sinks from the environment and credential files):

1. the driver is SIGKILLed after the decision of epoch 1;
2. the operator, with the same least-privileged credentials: ``txsink status`` shows
   epoch 1 decided and not committed, ``txsink recover --break-lease`` (the killed driver's
   lease is still held) commits it, ``txsink inspect`` writes its report;
3. the query restarts and finishes the input.

Then the administrators' own clients (a read_committed consumer, a psycopg query, a boto3
listing) read every id exactly once in each target, and nothing lingers: no open Kafka
transaction, no prepared PostgreSQL transaction, no multipart upload. Last, every artifact
of the run (the txsink log and WAL, the checkpoint, the HTML report, the children's and
the CLI's output, the objects written to S3, the harness's env file and server logs) is
scanned for the three passwords.

Iceberg is the fourth target: its SQL catalog on ``postgres_secure`` (the app role holds
``SELECT, UPDATE`` on ``iceberg_tables`` only) and its warehouse under ``s3_secure``'s
allowed prefix; the administrators make and read its table in child processes
(``python secure_xs.py OP``: pyarrow's S3 client reads its CA, ``SSL_CERT_FILE``, once per
process).

Delta is the fifth target: its table under ``s3_secure``'s allowed prefix, made and read
back by the administrators with delta-rs in this process (delta-rs and pyarrow take the CA
per client, from the storage option ``certificate_path``); its least policy alone is
``test_delta_secure.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _services.common import ENV_FILE, LOG_DIR, ServiceError, real_servers_required, redact
from _services.manager import up
from _services.resolve import resolve_postgres_secure, resolve_s3_secure
from secure_xs import sinks
from test_delta_secure import admin_options
from test_kafka_secure import SecureKafka, _open_transactions, _read_committed, _topics
from test_postgres_secure import SecurePg
from test_s3_secure import SecureS3, _ids

from tests.childrun import cli, run_pipeline, runner_cmd
from txsink.connectors.kafka.acls import create_acls, delete_acls, required_acls
from txsink.connectors.postgres.grants import rights, setup_sql
from txsink.testing.contract import SCHEMA  # the input's columns, as Arrow
from txsink.testing.inputs import make_input

pytestmark = [
    pytest.mark.kafka_secure,
    pytest.mark.postgres_secure,
    pytest.mark.s3_secure,
    pytest.mark.spark,
]

ROWS, FILES = 300, 3
#: The Iceberg sink's least rights in a SQL catalog (the table made by an administrator):
#: read the catalog's row, and move its metadata pointer at each commit.
ICEBERG_GRANT = 'GRANT SELECT, UPDATE ON public.iceberg_tables TO "{role}"'
COLUMNS = "id bigint NOT NULL, key text, amount double precision, payload text"
INTEGRATION = Path(__file__).parent


class Secured:
    """The three secured servers, as their env files describe them."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.kafka = SecureKafka(
            {k.removeprefix("TXSINK_KAFKA_SECURE_"): v for k, v in env.items()
             if k.startswith("TXSINK_KAFKA_SECURE_")}
        )  # fmt: skip
        self.pg = SecurePg(
            dsn=env["TXSINK_PG_SECURE_DSN"],
            admin_dsn=env["TXSINK_PG_SECURE_ADMIN_DSN"],
            role=env["TXSINK_PG_SECURE_APP_ROLE"],
            passfile=Path(env["TXSINK_PG_SECURE_PASSFILE"]),
        )
        self.s3 = SecureS3({k: v for k, v in env.items() if k.startswith("TXSINK_S3_SECURE_")})

    def secrets(self) -> dict[str, str]:
        return {
            "kafka": self.kafka.password(self.kafka.user),
            "postgres": self.pg.password(),
            "s3": self.s3.app_secret(),
        }


@pytest.fixture(scope="module")
def secured() -> Secured:
    """All three secured services (started if need be); skipped when one cannot start, an
    error under ``CI=true``."""
    try:
        env = {**resolve_postgres_secure(), **resolve_s3_secure()}
        keys = ("BOOTSTRAP", "CA", "USER", "PASSWORD_FILE", "ADMIN_USER", "ADMIN_PASSWORD_FILE")
        if all(os.environ.get(f"TXSINK_KAFKA_SECURE_{k}") for k in keys):
            env.update({k: v for k, v in os.environ.items() if k.startswith("TXSINK_KAFKA_")})
        else:
            env.update(up(["kafka_secure"])[0])
    except (ServiceError, OSError) as exc:
        message = f"a secured server is unavailable: {redact(str(exc))}"
        if real_servers_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return Secured(env)


@pytest.fixture
def run(secured: Secured, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The run's targets, made by the administrators, the least rights granted to the
    apps; the child processes' environment (names and files only, no secret). Dropped
    afterwards as the administrators."""
    tag = uuid.uuid4().hex[:8]
    kafka, pg, s3 = secured.kafka, secured.pg, secured.s3
    topic, markers = f"xs-{tag}", f"xs-markers-{tag}"
    _topics(kafka, topic, markers, compact=(markers,))
    schema = pg.new_schema("xs")
    table = f"{schema}.events"
    prefix = f"{s3.prefix}xs-{tag}/"
    warehouse = f"s3://{s3.bucket}/{prefix}warehouse"
    iceberg_table = f"xs_{tag}.events"
    delta = f"s3://{s3.bucket}/{prefix}delta"
    targets = {
        "TXSINK_SECURE_XS_TOPIC": topic,
        "TXSINK_SECURE_XS_MARKERS": markers,
        "TXSINK_SECURE_XS_WAL": str(tmp_path / "wal"),
        "TXSINK_SECURE_XS_TABLE": table,
        "TXSINK_SECURE_XS_S3_URL": f"s3://{s3.bucket}/{prefix}data/",
        "TXSINK_SECURE_XS_ICEBERG_TABLE": iceberg_table,
        "TXSINK_SECURE_XS_WAREHOUSE": warehouse,
        "TXSINK_SECURE_XS_DELTA": delta,
    }
    env = {
        **{k: v for k, v in secured.env.items() if "ADMIN" not in k},
        **targets,
        "AWS_SHARED_CREDENTIALS_FILE": secured.env["TXSINK_S3_SECURE_CREDENTIALS"],
        "AWS_PROFILE": secured.env["TXSINK_S3_SECURE_PROFILE"],
        # pyarrow's S3 client (Iceberg's FileIO) trusts the CA only through OpenSSL's own
        # variable: pyiceberg 0.12 has no property for it, AWS_CA_BUNDLE is not read.
        "SSL_CERT_FILE": secured.env["TXSINK_S3_SECURE_CA"],
        "PYTHONPATH": os.pathsep.join([str(INTEGRATION), *sys.path]),
    }
    # The profile, never keys inherited from the caller: the variables unset, not empty
    # (delta-rs takes an empty AWS_ACCESS_KEY_ID for a key; boto3 and pyarrow skip it).
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    saved = {k: os.environ.get(k) for k in (*env, *keys)}
    for var in keys:
        os.environ.pop(var, None)
    os.environ.update(env)  # secure_xs.sinks() reads it here too
    kafka_sink = sinks()[0]
    acls = required_acls(kafka_sink.settings, topic)
    create_acls(kafka.admin(), acls, kafka.user)
    with pg.admin() as conn:
        conn.execute(f'CREATE TABLE "{schema}"."events" ({COLUMNS})')
        needed = rights(schema=schema, table="events", mode="append", commit="2pc")
        conn.execute(setup_sql(pg.role, needed, progress=(schema, "txsink_progress")))
    _iceberg_admin("create", secured, env)
    _delta_table(secured, delta, create=True)
    with pg.admin() as conn:  # the catalog's tables exist now (made by the admin's catalog)
        conn.execute(ICEBERG_GRANT.format(role=pg.role))
    _settled(kafka_sink)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        delete_acls(kafka.admin(), acls, kafka.user)
        with pg.admin() as conn:
            conn.execute(f'REVOKE ALL ON public.iceberg_tables FROM "{pg.role}"')
        with contextlib.suppress(AssertionError):  # best effort: the prefix goes next
            _iceberg_admin("drop", secured, env)
        s3.purge(prefix)
        pg.cleanup()


def _settled(sink: Any) -> None:
    """The Kafka sink's start-up check passes here first, as the app: a broker that just
    started answers the rights check's group description with NOT_COORDINATOR for a few
    seconds (an UnreachableError: a restart passes), and the killed run must not meet it."""
    from txsink.errors import UnreachableError

    for attempt in range(15):
        try:
            sink.check(SCHEMA, "xs-settle")
            return
        except UnreachableError:
            if attempt == 14:
                raise
            time.sleep(2.0)


def _pg_ids(pg: SecurePg, table: str) -> list[int]:
    with pg.admin() as conn:
        return sorted(r[0] for r in conn.execute(f"SELECT id FROM {table}").fetchall())


def _prepared(pg: SecurePg) -> list[str]:
    with pg.admin() as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'txsink%'")
        return [r[0] for r in rows.fetchall()]


def _iceberg_admin(op: str, secured: Secured, run: dict[str, str]) -> Any:
    """``secure_xs.admin(op)`` as the administrators, in a child process (pyarrow's S3
    client takes its CA from SSL_CERT_FILE once per process)."""
    done = subprocess.run(
        [sys.executable, str(INTEGRATION / "secure_xs.py"), op],
        env={**os.environ, **secured.env, **run},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"secure_xs {op}: {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _delta_table(secured: Secured, uri: str, *, create: bool = False) -> Any:
    """The Delta table as the administrators (MinIO's root), made first with ``create``."""
    from deltalake import DeltaTable

    options = admin_options(secured.s3)
    if create:
        return DeltaTable.create(uri, SCHEMA, storage_options=options)
    return DeltaTable(uri, storage_options=options)


def _delta_ids(secured: Secured, uri: str) -> list[int]:
    data = _delta_table(secured, uri).to_pyarrow_table(columns=["id"])
    return [int(v) for v in data.column("id").to_pylist()]


def _delta_unreferenced(secured: Secured, uri: str) -> list[str]:
    """Data files in the Delta table's folder that its log does not name (listed as root)."""
    s3 = secured.s3
    named = {u.removeprefix(f"s3://{s3.bucket}/") for u in _delta_table(secured, uri).file_uris()}
    folder = uri.removeprefix(f"s3://{s3.bucket}/") + "/"
    return [k for k in s3.keys(folder) if k.endswith(".parquet") and k not in named]


def _status(log: str) -> dict[int, str]:
    done = cli("status", "--log", log, "--json", check=True)
    doc = json.loads(done.stdout)
    return {int(e["epoch"]): str(e["status"]) for e in doc["epochs"]}


def test_secure_cross_system_kill_driver_then_operator_cli(
    secured: Secured, run: dict[str, str], tmp_path: Path
) -> None:
    log = str(tmp_path / "txlog")
    make_input(tmp_path / "input", ROWS, FILES)
    cmd = runner_cmd(
        "txsink.testing.pipelines:run_stream",
        {"workdir": str(tmp_path), "sinks": [], "factory": "secure_xs:sinks", "log": log},
    )
    child = {
        **os.environ,
        **run,
        "TXSINK_FAULT": "after_decision:kill-driver@1",
        "TXSINK_FAULT_STATE": str(tmp_path / "faults"),
    }
    outputs: list[str] = []
    # 1. The driver dies after the decision of epoch 1 (no restart yet).
    report, lines = run_pipeline(cmd, env=child, max_runs=1)
    outputs += lines
    assert not report.finished, "\n".join(lines[-40:])
    fired = (tmp_path / "faults").is_dir() and os.listdir(tmp_path / "faults")
    assert fired, "the kill never fired:\n" + "\n".join(lines[-40:])
    # 2. The operator, as the least-privileged principals.
    states = _status(log)
    assert states.get(1) == "decided", states
    pipeline = f"{INTEGRATION / 'secure_xs.py'}:sinks"
    for args in (
        ("recover", "--log", log, "--pipeline", pipeline, "--break-lease"),
        ("inspect", "--log", log, "--pipeline", pipeline, "--out", str(tmp_path / "r.html")),
    ):
        done = cli(*args)
        outputs += [done.stdout, done.stderr]
        assert done.returncode == 0, f"txsink {args[0]}: {done.stdout}\n{done.stderr}"
    assert _status(log).get(1) == "committed"
    # 3. The query restarts and finishes (no fault left to fire).
    del child["TXSINK_FAULT"]
    report, lines = run_pipeline(cmd, env=child, max_runs=2)
    outputs += lines
    assert report.finished, "\n".join(lines[-20:])

    # Exactly once in every target, read by the administrators' own clients.
    kafka, pg, s3 = secured.kafka, secured.pg, secured.s3
    topic, markers = run["TXSINK_SECURE_XS_TOPIC"], run["TXSINK_SECURE_XS_MARKERS"]
    prefix = run["TXSINK_SECURE_XS_S3_URL"].removeprefix(f"s3://{s3.bucket}/").removesuffix("data/")
    seen = {
        "kafka": Counter(json.loads(v or b"{}")["id"] for v in _read_committed(kafka, topic)),
        "pg": Counter(_pg_ids(pg, run["TXSINK_SECURE_XS_TABLE"])),
        "s3": Counter(_ids(s3, prefix + "data/")),
        "iceberg": Counter(_iceberg_admin("ids", secured, run)),
        "delta": Counter(_delta_ids(secured, run["TXSINK_SECURE_XS_DELTA"])),
    }
    for name, counts in seen.items():
        assert sorted(counts) == list(range(ROWS)), f"{name}: missing or extra ids"
        assert max(counts.values()) == 1, f"{name}: duplicates"
    # Nothing lingering.
    assert _open_transactions(kafka, topic) == 0
    assert _open_transactions(kafka, markers) == 0
    assert _prepared(pg) == []
    assert s3.open_uploads(prefix) == []
    assert _iceberg_admin("unreferenced", secured, run) == [], "Iceberg files no snapshot names"
    assert _delta_unreferenced(secured, run["TXSINK_SECURE_XS_DELTA"]) == [], "Delta files left"
    assert not list((tmp_path / "wal").rglob("records.arrow")), "WAL files left"
    assert set(_status(log).values()) == {"committed"}, _status(log)
    assert (tmp_path / "r.html").stat().st_size > 0

    # No secret in any artifact.
    root = s3.root()
    for name, secret in secured.secrets().items():
        raw = secret.encode()
        assert all(secret not in text for text in outputs), f"{name}'s secret in the output"
        harness = [ENV_FILE, *LOG_DIR.glob("*")] if LOG_DIR.exists() else []
        files = [p for p in [*tmp_path.rglob("*"), *harness] if p.is_file()]
        leaked = [str(p) for p in files if raw in p.read_bytes()]
        assert not leaked, f"{name}'s secret is in {leaked}"
        for key in s3.keys(prefix):
            body = root.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
            assert raw not in body, f"{name}'s secret is in s3://{s3.bucket}/{key}"
