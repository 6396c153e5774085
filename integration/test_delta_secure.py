"""The Delta sink on the secured MinIO (``s3_secure``): verified TLS with a private CA (the
storage option ``certificate_path``, for delta-rs and pyarrow alike), the credentials from
an AWS shared-credentials file and profile (no key in the options), and a user whose policy
is exactly :func:`txsink.connectors.delta.grants.policy` for the table's folder, nothing else.

The administrators' client (delta-rs as MinIO's root user, and boto3 as root) makes the
table and reads it back; never the sink. Both clients
take the CA per client (delta-rs's ``certificate_path``, pyarrow's ``tls_ca_file_path``), so
the administrators' reads need no process of their own (Iceberg's need ``SSL_CERT_FILE``).
Each action removed in turn is named by the start-up check's probe, with its statement.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence

import pytest
from test_s3_secure import SecureS3, secure, server

from txsink.connectors.delta import DeltaSink
from txsink.connectors.delta.access import PROBE_FOLDER, DeltaAccessError
from txsink.connectors.delta.grants import ACTIONS, policy, statement
from txsink.connectors.delta.handles import DeltaHandle
from txsink.errors import UnreachableError
from txsink.handles import dump_handle, load_handle
from txsink.testing.contract import SCHEMA, commit, rows
from txsink.txid import TxnId

pytestmark = pytest.mark.s3_secure

__all__ = ["secure", "server"]  # the s3_secure fixtures, shared with test_s3_secure.py
APP = "secdelta"


def admin_options(s3: SecureS3) -> dict[str, str]:
    """delta-rs storage options of MinIO's root user (set-up and read-back only)."""
    key, secret = s3._profile(s3.env["TXSINK_S3_SECURE_ADMIN_PROFILE"])
    return {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_REGION": s3.env["TXSINK_S3_SECURE_REGION"],
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "certificate_path": s3.ca,
    }


def app_options(s3: SecureS3, ca: str | None = None) -> dict[str, str]:
    """The sink's storage options as a user's job gives them: the server and its CA, no key
    (AWS_PROFILE and AWS_SHARED_CREDENTIALS_FILE name the credentials)."""
    return {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_REGION": s3.env["TXSINK_S3_SECURE_REGION"],
        "certificate_path": ca or s3.ca,
    }


@pytest.fixture
def folder(server: SecureS3) -> Iterator[str]:
    """A Delta table made by the administrator under the allowed prefix (its path in the
    bucket); the app user's policy is the Delta sink's for it alone. Deleted as root."""
    from deltalake import DeltaTable

    path = f"{server.prefix}delta-{uuid.uuid4().hex[:8]}/events"
    DeltaTable.create(f"s3://{server.bucket}/{path}", SCHEMA, storage_options=admin_options(server))
    server.set_policy(policy(server.bucket, path))
    yield path
    server.purge(f"{path}/")


def _sink(s3: SecureS3, folder: str, ca: str | None = None) -> DeltaSink:
    return DeltaSink(f"s3://{s3.bucket}/{folder}", uid="sec", storage_options=app_options(s3, ca))


def _prepare(sink: DeltaSink, epoch: int, parts: Sequence[Sequence[int]]) -> list[DeltaHandle]:
    handles = []
    for p, ids in enumerate(parts):
        txn = sink.begin(TxnId(APP, sink.uid, epoch, 0, p, 1), SCHEMA)
        sink.write(txn, rows(ids))
        handles.append(sink.prepare(txn))
    return handles


def _admin_ids(s3: SecureS3, folder: str) -> list[int]:
    from deltalake import DeltaTable

    table = DeltaTable(f"s3://{s3.bucket}/{folder}", storage_options=admin_options(s3))
    return sorted(int(v) for v in table.to_pyarrow_table(columns=["id"]).column("id").to_pylist())


def _unreferenced(s3: SecureS3, folder: str) -> list[str]:
    """Data files in the table's folder that its log does not name (listed as root)."""
    from deltalake import DeltaTable

    table = DeltaTable(f"s3://{s3.bucket}/{folder}", storage_options=admin_options(s3))
    named = {u.removeprefix(f"s3://{s3.bucket}/") for u in table.file_uris()}
    return [k for k in s3.keys(f"{folder}/") if k.endswith(".parquet") and k not in named]


def test_an_epoch_through_the_least_privileged_user(
    server: SecureS3,
    folder: str,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check passes with exactly the documented policy; epoch 1 prepared by one driver is
    committed by a new one from the handles' JSON (as recovery does), twice; recovery finds
    and aborts an undecided transaction. The administrator reads every row once, no file no
    commit names is left, no upload is open, and the user's secret is nowhere."""
    first = _sink(server, folder)
    first.check(SCHEMA, APP)
    decided = _prepare(first, 1, [range(0, 50), range(50, 100)])
    undecided = _prepare(first, 2, [range(100, 120)])
    assert _admin_ids(server, folder) == [], "prepared rows are visible"
    docs = [dump_handle(h) for h in decided]

    fresh = _sink(server, folder)
    fresh.check(SCHEMA, APP)
    loaded = [load_handle(d) for d in docs]
    commit(fresh, 1, loaded)
    commit(fresh, 1, loaded)  # a recovery that meets an epoch committed already
    assert fresh.recorded_epoch(APP) == 1
    listed = list(fresh.list_prepared(APP))
    assert [h.txn for h in listed] == [undecided[0].txn]
    for handle in listed:
        fresh.abort(handle)

    assert _admin_ids(server, folder) == list(range(100))
    assert _unreferenced(server, folder) == []
    assert server.open_uploads(f"{folder}/") == []
    secret = server.app_secret()
    out, err = capfd.readouterr()
    assert secret not in out + err + caplog.text
    assert all(secret not in json.dumps(d) for d in docs)
    assert secret not in repr(fresh)
    root = server.root()
    for key in server.keys(f"{folder}/"):
        body = root.get_object(Bucket=server.bucket, Key=key)["Body"].read()
        assert secret.encode() not in body, f"the secret is in {key}"


@pytest.mark.parametrize("action", [a.name for a in ACTIONS])
def test_each_missing_right_is_named_at_the_check(
    server: SecureS3, folder: str, action: str
) -> None:
    """One action of the policy removed: the start-up check names it, alone, with the IAM
    statement of :func:`~txsink.connectors.delta.grants.statement` that grants it, before
    any data flows (the check's probe leaves nothing behind but, without
    ``s3:DeleteObject``, its one empty probe object). Nothing of the table changed."""
    server.set_policy(policy(server.bucket, folder, without=(action,)))
    sink = _sink(server, folder)
    with pytest.raises(DeltaAccessError) as info:
        sink.check(SCHEMA, APP)
    failed = info.value
    assert failed.missing == [action]
    text = str(failed)
    grant = json.dumps(statement(action, server.bucket, folder), separators=(",", ":"))
    assert grant in text, text
    assert "phase=check" in text and "sink_uid=sec" in text
    assert server.app_secret() not in text
    server.set_policy(server.full_policy())
    probes = [k for k in server.keys(f"{folder}/") if f"/{PROBE_FOLDER}" in k]
    assert len(probes) == (1 if action == "s3:DeleteObject" else 0), probes
    assert _admin_ids(server, folder) == [], "a refused right let rows through"
    assert _unreferenced(server, folder) == []


def test_a_policy_for_another_folder_is_told_with_every_statement(
    server: SecureS3, folder: str
) -> None:
    """Every probe call refused (the policy names another folder): nothing tells that from
    a server that refuses the key, so the check says it cannot reach the storage, and lists
    the four statements for the table's folder."""
    server.set_policy(policy(server.bucket, f"{folder}-elsewhere"))
    with pytest.raises(UnreachableError) as info:
        _sink(server, folder).check(SCHEMA, APP)
    text = str(info.value)
    for action in ACTIONS:
        grant = json.dumps(statement(action.name, server.bucket, folder), separators=(",", ":"))
        assert grant in text, text
    assert "phase=check" in text and server.app_secret() not in text


def test_a_right_removed_after_the_check_fails_before_the_decision(
    server: SecureS3, folder: str
) -> None:
    """``s3:PutObject`` taken away after a passing check (a policy changed while the query
    runs): the pre-commit fails, before the decision; nothing is visible."""
    sink = _sink(server, folder)
    sink.check(SCHEMA, APP)
    server.set_policy(policy(server.bucket, folder, without=("s3:PutObject",)))
    with pytest.raises(OSError):
        _prepare(sink, 1, [range(10)])
    server.set_policy(server.full_policy())
    assert _admin_ids(server, folder) == []


@pytest.mark.parametrize("ca", ["missing", "another"])
def test_an_untrusted_server_is_refused_at_the_check(
    server: SecureS3, folder: str, ca: str
) -> None:
    """Without the server's CA (none given, or another CA's bundle) the check cannot open
    the table and says why: the certificate's issuer is unknown."""
    import certifi

    if ca == "missing":
        options = {k: v for k, v in app_options(server).items() if k != "certificate_path"}
        sink = DeltaSink(f"s3://{server.bucket}/{folder}", uid="sec", storage_options=options)
    else:
        sink = _sink(server, folder, ca=certifi.where())
    with pytest.raises(UnreachableError, match="certificate") as info:
        sink.check(SCHEMA, APP)
    assert "UnknownIssuer" in str(info.value), str(info.value)


def test_an_evolving_epoch_through_the_least_privileged_user(server: SecureS3, folder: str) -> None:
    """The epoch that adds a column writes its own log entry (boto3's conditional PUT, with
    the sink's CA and the profile's credentials): the documented policy is enough, and the
    administrator reads the new column in the rows of that epoch only."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from txsink.contract import EpochCommit
    from txsink.spark.checks import check_sinks

    sink = DeltaSink(
        f"s3://{server.bucket}/{folder}",
        uid="sec",
        storage_options=app_options(server),
        schema_evolution="add-columns",
    )
    check_sinks([sink], SCHEMA, APP, None)
    commit(sink, 0, _prepare(sink, 0, [range(0, 5)]))
    wider = SCHEMA.append(pa.field("note", pa.string()))
    change = check_sinks([sink], wider, APP, None)["sec"]
    txn = sink.begin(TxnId(APP, sink.uid, 1, 0, 0, 1), wider)
    batch = rows(range(5, 10))
    sink.write(txn, batch.append_column("note", pa.array([f"n{i}" for i in range(5, 10)])))
    sink.commit_epoch(EpochCommit(1, (sink.prepare(txn),), schema_change=change))
    table = DeltaTable(f"s3://{server.bucket}/{folder}", storage_options=admin_options(server))
    notes = dict(
        zip(*table.to_pyarrow_table(columns=["id", "note"]).to_pydict().values(), strict=True)
    )
    assert sorted(notes) == list(range(10))
    assert [notes[i] for i in range(10)] == [None] * 5 + [f"n{i}" for i in range(5, 10)]
    assert table.version() == 2 and sink.recorded_epoch(APP) == 1
