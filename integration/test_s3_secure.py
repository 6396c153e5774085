"""The S3 sink on a secured MinIO (the ``s3_secure`` service): verified TLS with a
throw-away CA, credentials from an AWS shared-credentials file and profile (as users keep
them), and a user whose policy is exactly :func:`txsink.connectors.s3.grants.policy` for
the target prefix and the log prefix.

Every check reads the bucket back as the harness's root user with a boto3 client of its
own, never through the sink. Each action of the policy removed in turn (through MinIO's
admin API) is named by the sink's start-up check, before anything is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _services.common import ENV_FILE, LOG_DIR, ServiceError, real_servers_required, redact
from _services.resolve import resolve_s3_secure

from txsink.connectors.s3 import S3Sink
from txsink.connectors.s3.access import PROBE_FOLDER, S3AccessError
from txsink.connectors.s3.grants import LOG_ACTIONS, SINK_ACTIONS, policy, statement
from txsink.connectors.s3.log_store import S3Store
from txsink.errors import LogError, TxsinkError
from txsink.handles import dump_handle, load_handle
from txsink.testing.contract import SCHEMA, commit, rows
from txsink.txid import TxnId

pytestmark = pytest.mark.s3_secure

APP = "sec"


@dataclass
class SecureS3:
    """The secured server, as the env of ``integration/services up s3_secure`` says."""

    env: dict[str, str]

    @property
    def endpoint(self) -> str:
        return self.env["TXSINK_S3_SECURE_ENDPOINT"]

    @property
    def ca(self) -> str:
        return self.env["TXSINK_S3_SECURE_CA"]

    @property
    def bucket(self) -> str:
        return self.env["TXSINK_S3_SECURE_BUCKET"]

    @property
    def prefix(self) -> str:
        return self.env["TXSINK_S3_SECURE_PREFIX"]

    @property
    def log_prefix(self) -> str:
        return self.env["TXSINK_S3_SECURE_LOG_PREFIX"]

    def _profile(self, name: str) -> tuple[str, str]:
        import configparser

        parser = configparser.ConfigParser()
        parser.read(self.env["TXSINK_S3_SECURE_CREDENTIALS"])
        sec = parser[name]
        return sec["aws_access_key_id"], sec["aws_secret_access_key"]

    def app_secret_pair(self) -> tuple[str, str]:
        return self._profile(self.env["TXSINK_S3_SECURE_PROFILE"])

    def app_secret(self) -> str:
        return self._profile(self.env["TXSINK_S3_SECURE_PROFILE"])[1]

    def root(self) -> Any:
        """A boto3 client of the harness's root user (read-back and clean-up only)."""
        import boto3

        key, secret = self._profile(self.env["TXSINK_S3_SECURE_ADMIN_PROFILE"])
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name=self.env["TXSINK_S3_SECURE_REGION"],
            verify=self.ca,
        )

    def set_policy(self, document: dict[str, Any]) -> None:
        """Replace the app user's policy through MinIO's admin API (effective at once)."""
        import urllib3
        from minio import MinioAdmin
        from minio.credentials.providers import StaticProvider

        admin = MinioAdmin(
            endpoint=self.endpoint.removeprefix("https://"),
            credentials=StaticProvider(*self._profile(self.env["TXSINK_S3_SECURE_ADMIN_PROFILE"])),
            region=self.env["TXSINK_S3_SECURE_REGION"],
            secure=True,
            http_client=urllib3.PoolManager(ca_certs=self.ca, cert_reqs="CERT_REQUIRED"),
        )
        admin.policy_add(self.env["TXSINK_S3_SECURE_POLICY"], policy=document)

    def full_policy(self, without: tuple[str, ...] = ()) -> dict[str, Any]:
        return policy(self.bucket, self.prefix, self.log_prefix, without=without)

    def keys(self, prefix: str) -> list[str]:
        root = self.root()
        return [
            o["Key"]
            for page in root.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for o in page.get("Contents", [])
        ]

    def open_uploads(self, prefix: str) -> list[str]:
        answer = self.root().list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        return [u["Key"] for u in answer.get("Uploads", [])]

    def purge(self, prefix: str) -> None:
        root = self.root()
        for u in root.list_multipart_uploads(Bucket=self.bucket, Prefix=prefix).get("Uploads", []):
            root.abort_multipart_upload(Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"])
        for key in self.keys(prefix):
            root.delete_object(Bucket=self.bucket, Key=key)


@pytest.fixture(scope="module")
def secure() -> Iterator[SecureS3]:
    """The ``s3_secure`` service (started if need be); skipped when it cannot start, an
    error under ``CI=true``, like every other service."""
    try:
        env = resolve_s3_secure()
    except (ServiceError, OSError) as exc:
        message = f"s3_secure server unavailable: {redact(str(exc))}"
        if real_servers_required():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    yield SecureS3(env)


@pytest.fixture
def server(secure: SecureS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[SecureS3]:
    """The app user's credentials through boto3's own chain: the shared-credentials file
    and the profile, as a user's job sets them; no key or secret in the sink's options."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", secure.env["TXSINK_S3_SECURE_CREDENTIALS"])
    monkeypatch.setenv("AWS_PROFILE", secure.env["TXSINK_S3_SECURE_PROFILE"])
    yield secure
    secure.set_policy(secure.full_policy())


@pytest.fixture
def run_prefix(server: SecureS3) -> Iterator[str]:
    """A fresh folder under the allowed prefix, emptied (as root) afterwards."""
    prefix = f"{server.prefix}{os.urandom(4).hex()}/"
    yield prefix
    server.purge(prefix)


def _sink(server: SecureS3, prefix: str) -> S3Sink:
    return S3Sink(
        f"s3://{server.bucket}/{prefix}",
        uid="sec",
        format="jsonl",
        client_options={
            "endpoint_url": server.endpoint,
            "region_name": server.env["TXSINK_S3_SECURE_REGION"],
            "verify": server.ca,
        },
    )


def _ids(server: SecureS3, prefix: str) -> list[int]:
    """The ids in the data objects under ``prefix``, read as root (not through the sink)."""
    root = server.root()
    found: list[int] = []
    for key in server.keys(prefix):
        if "/epoch=" not in key:
            continue
        body = root.get_object(Bucket=server.bucket, Key=key)["Body"].read().decode()
        found += [json.loads(line)["id"] for line in body.splitlines() if line.strip()]
    return sorted(found)


def test_an_epoch_through_the_least_privileged_user(
    server: SecureS3,
    run_prefix: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check passes with exactly the documented policy; an epoch prepared by one driver
    is committed by a new one (as recovery does), over verified TLS, exactly once, with no
    multipart upload left open. Then no artifact holds the user's secret."""
    sink = _sink(server, run_prefix)
    sink.check(SCHEMA, APP)
    handles = []
    for p, ids in enumerate([[1, 2], [3]]):
        txn = TxnId(APP, sink.uid, 0, 0, p, 100 + p)
        open_ = sink.begin(txn, SCHEMA)
        sink.write(open_, rows(ids))
        handles.append(sink.prepare(open_))
    dumped = [dump_handle(h) for h in handles]
    again = _sink(server, run_prefix)  # a new driver, after a crash between decision and commit
    again.check(SCHEMA, APP)
    assert {str(h.txn) for h in again.list_prepared(APP)} == {str(h.txn) for h in handles}
    commit(again, 0, [load_handle(d) for d in dumped])
    assert _ids(server, run_prefix) == [1, 2, 3]
    assert server.open_uploads(run_prefix) == []
    keys = server.keys(run_prefix)
    assert not [k for k in keys if PROBE_FOLDER in k or "/_txsink/uploads/" in k], keys
    assert [k for k in keys if "/_manifests/" in k], keys
    # The txsink log on its own prefix, through the same user: its conditional writes.
    log_prefix = f"{server.log_prefix}{os.urandom(4).hex()}/"
    try:
        store = S3Store(f"s3://{server.bucket}/{log_prefix}", client_options=_options(server))
        assert store.create("epochs/0", b"decided")
        assert not store.create("epochs/0", b"again")
        assert store.read("epochs/0") == b"decided"
        assert store.list("epochs/") == ["epochs/0"]
    finally:
        server.purge(log_prefix)
    # No artifact of the run holds the secret: handles, tmp_path, output, log records, and
    # every object the run wrote (read back as root).
    secret = server.app_secret()
    (tmp_path / "handles.json").write_text(json.dumps([str(d) for d in dumped]))
    found = [str(p) for p in tmp_path.rglob("*") if p.is_file() and secret in p.read_text()]
    assert found == []
    root = server.root()
    for key in keys:
        assert secret.encode() not in root.get_object(Bucket=server.bucket, Key=key)["Body"].read()
    out, err = capfd.readouterr()
    assert secret not in out + err
    assert secret not in caplog.text
    assert secret not in repr(sink) + repr(store)
    # Nor what the harness wrote: the env (file and variables) and the server's logs.
    assert not [k for k, v in server.env.items() if secret in v]
    if ENV_FILE.exists():
        assert secret not in ENV_FILE.read_text()
    logs = [p for p in LOG_DIR.glob("s3_secure*") if secret.encode() in p.read_bytes()]
    assert logs == []


def _options(server: SecureS3) -> dict[str, Any]:
    return {
        "endpoint_url": server.endpoint,
        "region_name": server.env["TXSINK_S3_SECURE_REGION"],
        "verify": server.ca,
    }


def test_plain_http_and_an_unverified_certificate_are_refused(server: SecureS3) -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError, HTTPClientError, SSLError

    quick = Config(retries={"max_attempts": 1}, connect_timeout=3, read_timeout=5)
    plain = boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint.replace("https://", "http://"),
        region_name=server.env["TXSINK_S3_SECURE_REGION"],
        config=quick,
    )
    # MinIO closes a plain-HTTP connection on its TLS port without an answer.
    with pytest.raises((ClientError, HTTPClientError)):
        plain.list_objects_v2(Bucket=server.bucket, Prefix=server.prefix, MaxKeys=1)
    # TLS against the system's CAs (not the server's): the certificate is not trusted.
    system = boto3.session.Session().client(
        "s3",
        endpoint_url=server.endpoint,
        region_name=server.env["TXSINK_S3_SECURE_REGION"],
        config=quick,
    )
    with pytest.raises(SSLError):
        system.list_objects_v2(Bucket=server.bucket, Prefix=server.prefix, MaxKeys=1)


@pytest.mark.parametrize("action", [a.name for a in SINK_ACTIONS])
def test_each_missing_action_is_named_with_its_statement(
    server: SecureS3, run_prefix: str, action: str
) -> None:
    server.set_policy(server.full_policy(without=(action,)))
    sink = _sink(server, run_prefix)
    with pytest.raises(S3AccessError) as info:
        sink.check(SCHEMA, APP)
    assert info.value.missing == [action]
    message = str(info.value)
    fix = json.dumps(statement(action, server.bucket, [run_prefix]), separators=(",", ":"))
    assert fix in message, message
    assert "phase=check" in message and "sink_uid=sec" in message
    # Nothing of the sink was written (a refused delete or abort may leave the probe only).
    assert [k for k in server.keys(run_prefix) if PROBE_FOLDER not in k] == []
    # Granted back, the check passes: the action was the only thing missing.
    server.set_policy(server.full_policy())
    _sink(server, run_prefix).check(SCHEMA, APP)


# -- each action of the policy is needed ------------------------------------------------------


def _prepared(server: SecureS3, prefix: str) -> tuple[S3Sink, list[Any]]:
    """A checked sink and two prepared transactions of epoch 0, under the full policy."""
    sink = _sink(server, prefix)
    sink.check(SCHEMA, APP)
    handles = []
    for p, ids in enumerate([[1, 2], [3]]):
        open_ = sink.begin(TxnId(APP, sink.uid, 0, 0, p, 100 + p), SCHEMA)
        sink.write(open_, rows(ids))
        handles.append(sink.prepare(open_))
    return sink, handles


def _forget_an_upload_id(server: SecureS3, handle: Any) -> None:
    """As root: the marker of ``handle`` as a task that died between recording the key and
    the upload id leaves it, so recovery must list the bucket's multipart uploads."""
    root = server.root()
    doc = json.loads(root.get_object(Bucket=server.bucket, Key=handle.marker)["Body"].read())
    for upload in doc["uploads"]:
        upload["upload_id"] = ""
    root.put_object(Bucket=server.bucket, Key=handle.marker, Body=json.dumps(doc).encode())


def _step(action: str, server: SecureS3, prefix: str, sink: S3Sink, handles: list[Any]) -> None:
    """The one thing of an epoch's life that needs ``action`` (and would fail without it).

    A refused marker delete does not fail the commit (it is logged, and the next recovery
    re-verifies the transaction), so for ``s3:DeleteObject`` the marker left is the failure.
    """
    if action == "s3:PutObject":  # a task's writes
        open_ = sink.begin(TxnId(APP, sink.uid, 1, 0, 0, 200), SCHEMA)
        sink.write(open_, rows([9]))
        sink.prepare(open_)
    elif action in ("s3:ListBucket", "s3:GetObject"):  # recovery: list and read the markers
        listed = list(_sink(server, prefix).list_prepared(APP))
        assert {str(h.txn) for h in listed} == {str(h.txn) for h in handles}
    elif action == "s3:ListBucketMultipartUploads":  # recovery of a marker without its id
        found = {str(h.txn): h for h in _sink(server, prefix).list_prepared(APP)}
        ids = {o.upload_id for o in found[str(handles[0].txn)].objects}
        assert ids == {o.upload_id for o in handles[0].objects}
    elif action == "s3:DeleteObject":  # the commit deletes each marker
        commit(sink, 0, handles)
        left = [h.marker for h in handles if h.marker in server.keys(prefix)]
        if left:  # committed all the same, but every recovery would re-verify them
            raise TxsinkError(f"AccessDenied: the commit left its markers {left}")
    elif action == "s3:AbortMultipartUpload":  # an undecided epoch is aborted
        for handle in handles:
            sink.abort(handle)
    else:
        raise AssertionError(f"no step for {action}")


@pytest.mark.parametrize("allowed", [True, False], ids=["granted", "removed"])
@pytest.mark.parametrize("action", [a.name for a in SINK_ACTIONS])
def test_each_action_is_needed_by_an_epoch(
    server: SecureS3, run_prefix: str, action: str, allowed: bool
) -> None:
    """With the policy less one action (and the start-up check passed before it was
    removed), the step of the epoch that uses it is refused by the server: the policy holds
    nothing the sink could do without. With the action the same step succeeds."""
    sink, handles = _prepared(server, run_prefix)
    if action == "s3:ListBucketMultipartUploads":
        _forget_an_upload_id(server, handles[0])
    if not allowed:
        server.set_policy(server.full_policy(without=(action,)))
        with pytest.raises(TxsinkError, match="AccessDenied"):
            _step(action, server, run_prefix, sink, handles)
        return
    _step(action, server, run_prefix, sink, handles)


@pytest.mark.parametrize("action", [a.name for a in LOG_ACTIONS])
def test_the_log_names_its_actions_when_one_is_refused(server: SecureS3, action: str) -> None:
    """The txsink log on S3 with its policy less one action: its use (the conditional-write
    probe and a create, a listing, a prune's delete) fails naming every action it needs."""
    log_prefix = f"{server.log_prefix}{os.urandom(4).hex()}/"
    server.set_policy(server.full_policy(without=(action,)))
    store = S3Store(f"s3://{server.bucket}/{log_prefix}", client_options=_options(server))
    try:
        with pytest.raises(LogError) as info:
            store.create("epochs/0", b"decided")
            store.list("epochs/")
            store.delete("epochs/0")  # pruning
        message = str(info.value)
        assert "access denied" in message
        assert all(a.name in message for a in LOG_ACTIONS), message
        assert "docs/security.md" in message
    finally:
        server.set_policy(server.full_policy())
        server.purge(log_prefix)


@pytest.mark.spark
def test_a_streaming_run_with_a_crash_recovers_and_leaks_no_secret(
    spark: Any,
    server: SecureS3,
    run_prefix: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A query through the least-privileged user over TLS, its txsink log on S3 too, with a
    crash after the decision: the restarted query's recovery commits exactly once. The keys
    are given in ``client_options`` here (Spark's executors do not see this test's
    ``AWS_PROFILE``), the hardest case: then no artifact of the run (the txsink log and
    every object in the bucket, tmp_path with the checkpoint, the output and the log
    records) holds the secret."""
    from tests.streaming import prepare_input, run_until_done
    from txsink import Coordinator
    from txsink.protocol.faults import FaultPlan

    key, secret = server.app_secret_pair()
    options = {**_options(server), "aws_access_key_id": key, "aws_secret_access_key": secret}
    log_prefix = f"{server.log_prefix}{os.urandom(4).hex()}/"
    prepare_input(tmp_path, 100, files=2)
    plan = FaultPlan.parse("during_commit:raise@1", str(tmp_path / "faults"))

    def make() -> Any:
        sink = S3Sink(f"s3://{server.bucket}/{run_prefix}", uid="sec", format="jsonl",
                      client_options=options)  # fmt: skip
        log = S3Store(f"s3://{server.bucket}/{log_prefix}", client_options=options)
        return Coordinator([sink], log=log, faults=plan)

    try:
        restarts, _ = run_until_done(spark, tmp_path, make)
        assert restarts == 1
        assert _ids(server, run_prefix) == list(range(100))
        assert server.open_uploads(run_prefix) == []
        root = server.root()
        written = server.keys(run_prefix) + server.keys(log_prefix)
        assert [k for k in server.keys(log_prefix)], "the log wrote nothing"
        for k in written:
            body = root.get_object(Bucket=server.bucket, Key=k)["Body"].read()
            assert secret.encode() not in body, k
    finally:
        server.purge(log_prefix)
    found = [
        str(p) for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()
    ]
    out, err = capfd.readouterr()
    assert found == []
    assert secret not in out + err
    assert secret not in caplog.text
