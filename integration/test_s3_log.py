"""The txsink log on S3 (``txsink.connectors.s3.S3Store``) against the real S3 server (MinIO).

What is checked: create-if-absent semantics and racing creators, listing across pages, a
full ``TxLog`` round trip, the conditional-write probe (a store that ignores
``If-None-Match`` is simulated by stripping the header from our requests before they are
signed, so the real server sees a plain PUT), a PUT resent after its answer was lost,
error mapping, that no secret shows anywhere, and real streaming runs of the FilesSink with
the log on S3 through crash points. Tests that fake S3 answers with botocore's ``Stubber``
(409 conflicts, 501) need no server.
"""

from __future__ import annotations

import json
import logging
import pickle
import threading
import urllib.request
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from _services.fixtures import S3Service
from botocore.config import Config
from botocore.stub import Stubber

from tests.streaming import CRASH_MATRIX, fault_spec, prepare_input, run_until_done
from txsink import Coordinator, open_log
from txsink.connectors.files.testing import verify_files
from txsink.connectors.s3.log_store import ConditionalWritesUnsupportedError, S3Store
from txsink.errors import ConfigurationError, LogError
from txsink.protocol.faults import FaultPlan
from txsink.protocol.log import TxLog

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def options(s3: S3Service, **extra: Any) -> dict[str, Any]:
    """Explicit client options for the test server (path-style, few retries)."""
    return {
        "endpoint_url": s3.endpoint,
        "aws_access_key_id": s3.access_key,
        "aws_secret_access_key": s3.secret_key,
        "region_name": s3.region,
        "config": Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
        **extra,
    }


def store_at(s3: S3Service, bucket: str, prefix: str = "txlog", **kw: Any) -> S3Store:
    return S3Store(f"s3://{bucket}/{prefix}", client_options=options(s3), **kw)


def count_calls(client: S3Client, operation: str) -> Counter[str]:
    """Count the requests of ``operation`` the client sends (retries included)."""
    calls: Counter[str] = Counter()

    def hook(**_: Any) -> None:
        calls[operation] += 1

    client.meta.events.register(f"before-send.s3.{operation}", hook)
    return calls


# -- the store's contract ------------------------------------------------------------------


def test_create_if_absent_read_list_delete(s3: S3Service) -> None:
    bucket = s3.new_bucket()
    store = store_at(s3, bucket)
    assert store.location == f"s3://{bucket}/txlog/"
    assert store.create("epochs/1/a.json", b"first")
    assert not store.create("epochs/1/a.json", b"second")
    assert store.read("epochs/1/a.json") == b"first"
    assert store.read("epochs/1/missing.json") is None
    assert store.create("epochs/1/b.json", b"b")
    assert store.create("epochs/2/a.json", b"c")
    assert store.create("meta.json", b"{}")
    assert store.list("epochs/") == ["epochs/1/a.json", "epochs/1/b.json", "epochs/2/a.json"]
    assert store.list("epochs/1/") == ["epochs/1/a.json", "epochs/1/b.json"]
    assert store.list("epochs/3/") == []
    # Records sit under the prefix; the probe object is gone.
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert sorted(keys) == [
        "txlog/epochs/1/a.json",
        "txlog/epochs/1/b.json",
        "txlog/epochs/2/a.json",
        "txlog/meta.json",
    ]
    store.delete("epochs/1/a.json")
    store.delete("epochs/1/a.json")  # deleting a missing key is fine
    assert store.read("epochs/1/a.json") is None
    assert store.create("epochs/1/a.json", b"again")  # a deleted key can be created anew
    with pytest.raises(ValueError, match="bad log key"):
        store.read("../escape")


def test_racing_creators_exactly_one_wins(s3: S3Service) -> None:
    """16 drivers (own clients) race for each of 10 keys: one create per key returns True."""
    bucket = s3.new_bucket()
    stores = [store_at(s3, bucket) for _ in range(16)]
    results: dict[str, list[int]] = {}
    lock = threading.Lock()

    def race(i: int, key: str, barrier: threading.Barrier) -> None:
        barrier.wait()
        if stores[i].create(key, f"driver {i}".encode()):
            with lock:
                results.setdefault(key, []).append(i)

    for k in range(10):
        key = f"epochs/{k:020d}/decision-000000.json"
        barrier = threading.Barrier(len(stores))
        threads = [
            threading.Thread(target=race, args=(i, key, barrier)) for i in range(len(stores))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = results.get(key, [])
        assert len(winners) == 1, f"{key}: winners {winners}"
        assert stores[0].read(key) == f"driver {winners[0]}".encode()


def test_list_pages(s3: S3Service) -> None:
    bucket = s3.new_bucket()
    store = store_at(s3, bucket, page_size=3)
    names = [f"epochs/{e:020d}/claim-000000.json" for e in (9, 3, 11, 0, 7, 5, 1, 10, 2, 4)]
    for name in names:
        assert store.create(name, b"{}")
    other = store_at(s3, bucket, prefix="txlog-other")
    assert other.create("epochs/00000000000000000001/claim-000000.json", b"{}")
    lists = count_calls(store._client, "ListObjectsV2")
    assert store.list("epochs/") == sorted(names)
    assert lists["ListObjectsV2"] == 4  # 10 keys, 3 per page
    assert TxLog(store).epochs() == sorted(int(n.split("/")[1]) for n in names)


def test_txlog_round_trip(s3: S3Service) -> None:
    bucket = s3.new_bucket()
    url = f"s3://{bucket}/apps/orders/txlog"
    log = open_log(url, client_options=options(s3))
    assert isinstance(log.store, S3Store)
    assert log.meta() is None
    log.bind_app("app-1")
    log.bind_app("app-1")  # idempotent
    assert log.meta() is not None
    handles = {"out": [{"serializer": "x", "version": 1, "data": {"txn": "t.e0.r0"}}]}
    for epoch in range(5):
        r = log.claim_round(epoch)
        assert r == 0
        assert log.claim_round(epoch) == 1  # a second driver gets the next round
        assert log.void(epoch, 1, "superseded") is None
        assert log.decide(epoch, r, handles, {"rows": {"out": 10}})
        assert not log.decide(epoch, 1, handles)  # voided round can never be decided
        assert log.void(epoch, r, "too late") is not None  # the decision stands
        assert [d.epoch for d in log.pending()] == [epoch]
        log.mark_committed(epoch, r)
        assert log.state(epoch).status == "committed"
    # An epoch voided before anyone decided it.
    r = log.claim_round(5)
    assert log.void(5, r, "pre-commit failed") is None
    assert log.state(5).status == "aborted"
    assert log.last_committed() == 4
    assert log.prune(keep=2) == [0, 1, 2, 3]
    assert log.epochs() == [4, 5]
    # A second process opening the log sees the same history.
    again = open_log(url, client_options=options(s3))
    assert [s.status for s in again.states()] == ["committed", "aborted"]
    assert again.decision(4) is not None
    with pytest.raises(ConfigurationError, match="belongs to app 'app-1'"):
        again.bind_app("app-2")


# -- conditional writes: the probe ----------------------------------------------------------


def strip_if_none_match(client: S3Client) -> None:
    """Make every PutObject of ``client`` a plain PUT: a store that ignores the header."""

    def hook(request: Any, **_: Any) -> None:
        if "If-None-Match" in request.headers:
            del request.headers["If-None-Match"]

    client.meta.events.register("before-sign.s3.PutObject", hook)


def test_probe_refuses_a_store_that_overwrites(s3: S3Service) -> None:
    bucket = s3.new_bucket()
    client = s3.client()
    strip_if_none_match(client)
    store = S3Store(f"s3://{bucket}/txlog", client=client)
    log = TxLog(store)
    with pytest.raises(ConditionalWritesUnsupportedError) as caught:
        log.bind_app("app")
    message = str(caught.value)
    assert "does not honour conditional writes (If-None-Match: *)" in message
    assert "succeeded and overwrote it" in message
    assert "AWS S3" in message and "docs/log-on-s3.md" in message
    assert isinstance(caught.value, LogError) and isinstance(caught.value, ConfigurationError)
    # Nothing was written: no meta.json, and the probe object was deleted.
    assert s3.client().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0
    # Reading needs no probe.
    assert log.meta() is None
    # The error pickles (Spark ships errors between processes).
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is ConditionalWritesUnsupportedError and str(again) == message


def test_probe_runs_once_per_process_and_location(s3: S3Service) -> None:
    bucket = s3.new_bucket()
    first = store_at(s3, bucket)
    puts = count_calls(first._client, "PutObject")
    assert first.create("a", b"1")
    assert puts["PutObject"] == 3  # probe create, probe re-create (refused), the record
    second = store_at(s3, bucket)
    puts2 = count_calls(second._client, "PutObject")
    assert second.create("b", b"2") and not second.create("a", b"x")
    assert puts2["PutObject"] == 2  # no probe: this location was probed already
    elsewhere = store_at(s3, bucket, prefix="other")
    puts3 = count_calls(elsewhere._client, "PutObject")
    assert elsewhere.create("a", b"1")
    assert puts3["PutObject"] == 3


def test_a_put_resent_after_its_answer_was_lost_counts_as_created(s3: S3Service) -> None:
    """botocore resends a PUT whose response was lost; the server answers 412 to the resend.

    The first copy is sent here, byte for byte (same signed headers, same body), before
    botocore sends it: that is what the server sees when a response goes missing.
    """
    bucket = s3.new_bucket()
    store = store_at(s3, bucket)
    assert store.create("warm", b"")  # the probe runs before the hook is in place
    sent: list[int] = []

    def send_twice(request: Any, **_: Any) -> None:
        if sent:
            return
        body = request.body if isinstance(request.body, bytes) else request.body.read()
        if not isinstance(request.body, bytes):
            request.body.seek(0)
        req = urllib.request.Request(
            request.url, data=body, headers=dict(request.headers), method="PUT"
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            sent.append(resp.status)

    store._client.meta.events.register("before-send.s3.PutObject", send_twice)
    assert store.create("epochs/1/decision-000000.json", b"mine")
    assert sent == [200]
    # Another driver's create of the same key still loses.
    assert not store_at(s3, bucket).create("epochs/1/decision-000000.json", b"theirs")
    assert store.read("epochs/1/decision-000000.json") == b"mine"


def _stubbed(prefix: str = "txlog") -> tuple[S3Store, Stubber]:
    client = boto3.session.Session().client(
        "s3",
        region_name="us-east-1",
        endpoint_url="http://stub.invalid:9000",
        aws_access_key_id="AKIDSTUB",
        aws_secret_access_key="stub-secret",
    )
    return S3Store(f"s3://stub-bucket/{prefix}", client=client), Stubber(client)


def _stub_probe(stubber: Stubber) -> None:
    stubber.add_response("put_object", {})
    stubber.add_client_error("put_object", "PreconditionFailed", http_status_code=412)
    stubber.add_response("head_object", {"Metadata": {"txsink-writer": "the-first-probe-put"}})
    stubber.add_response("delete_object", {})


def test_probe_not_implemented_is_unsupported() -> None:
    store, stubber = _stubbed("not-implemented")
    stubber.add_client_error("put_object", "NotImplemented", http_status_code=501)
    with stubber, pytest.raises(ConditionalWritesUnsupportedError, match=r"NotImplemented"):
        store.create("meta.json", b"{}")


def test_conflict_409_is_retried() -> None:
    store, stubber = _stubbed("conflict")
    _stub_probe(stubber)
    # 409 twice, then created.
    stubber.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    stubber.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    stubber.add_response("put_object", {})
    # 409, then 412: the racing writer won.
    stubber.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    stubber.add_client_error("put_object", "PreconditionFailed", http_status_code=412)
    stubber.add_response("head_object", {"Metadata": {"txsink-writer": "another-driver"}})
    # 409 for ever: a LogError, not a guess.
    for _ in range(store.conflict_retries + 1):
        stubber.add_client_error("put_object", "ConditionalRequestConflict", http_status_code=409)
    with stubber:
        assert store.create("a", b"1")
        assert not store.create("b", b"1")
        with pytest.raises(LogError, match="409 ConditionalRequestConflict"):
            store.create("c", b"1")
        stubber.assert_no_pending_responses()


def test_throttling_is_a_log_error() -> None:
    store, stubber = _stubbed("throttled")
    stubber.add_client_error("get_object", "SlowDown", http_status_code=503)
    with stubber, pytest.raises(LogError, match="throttled") as caught:
        store.read("meta.json")
    assert "s3://stub-bucket/throttled/meta.json" in str(caught.value)


# -- errors and secrets ----------------------------------------------------------------------


def test_errors_name_the_location_and_say_what_to_do(
    s3: S3Service, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = store_at(s3, "no-such-bucket-txsink")
    with pytest.raises(LogError, match="bucket 'no-such-bucket-txsink' does not exist"):
        missing.read("meta.json")
    with pytest.raises(LogError, match="does not exist"):
        missing.create("meta.json", b"{}")

    bucket = s3.new_bucket()
    wrong = S3Store(
        f"s3://{bucket}/txlog",
        client_options={**options(s3), "aws_secret_access_key": "wrong-secret-4711"},
    )
    with pytest.raises(LogError, match="access denied") as caught:
        wrong.list("epochs/")
    assert f"s3://{bucket}/txlog/epochs/" in str(caught.value)
    assert "wrong-secret-4711" not in str(caught.value)

    unreachable = S3Store(
        f"s3://{bucket}/txlog",
        client_options={
            **options(s3),
            "endpoint_url": "http://127.0.0.1:9",
            "config": Config(connect_timeout=1, retries={"max_attempts": 1}),
        },
    )
    with pytest.raises(LogError, match=r"cannot reach the S3 endpoint http://127\.0\.0\.1:9"):
        unreachable.read("meta.json")

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    anonymous = S3Store(
        f"s3://{bucket}/txlog", client_options={"endpoint_url": s3.endpoint, "region_name": "x"}
    )
    with pytest.raises(LogError, match="no usable AWS credentials"):
        anonymous.read("meta.json")

    with pytest.raises(ConfigurationError, match="no bucket"):
        open_log("s3:///txlog")
    with pytest.raises(ValueError, match="apply to a store URL, not to the local path"):
        open_log("/tmp/txlog", client_options={"region_name": "x"})


def test_secrets_never_show(
    s3: S3Service, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)  # botocore's debug output included
    bucket = s3.new_bucket()
    secret = s3.secret_key
    assert len(secret) >= 8
    store = store_at(s3, bucket)
    shown = repr(store)
    assert secret not in shown and "***" in shown and s3.endpoint in shown
    log = TxLog(store)
    log.bind_app("app")
    log.decide(0, log.claim_round(0), {}, {})
    assert log.void(0, 0, "x") is not None
    with pytest.raises(TypeError, match="cannot be pickled") as caught:
        pickle.dumps(store)
    assert secret not in str(caught.value)
    # Errors with a wrong secret: neither secret appears.
    bad_secret = "not-the-secret-0815"
    wrong = S3Store(
        f"s3://{bucket}/txlog",
        client_options={**options(s3), "aws_secret_access_key": bad_secret},
    )
    with pytest.raises(LogError) as err:
        wrong.create("x", b"1")
    assert bad_secret not in str(err.value) and bad_secret not in repr(wrong)
    # Nothing the log wrote holds it, and no log line (ours or botocore's) does.
    client = s3.client()
    for obj in client.list_objects_v2(Bucket=bucket)["Contents"]:
        body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        assert secret.encode() not in body
    assert caplog.records, "nothing was logged: the check would be void"
    assert secret not in caplog.text and bad_secret not in caplog.text


# -- real streaming runs with the log on S3 -----------------------------------------------

ROWS = 1000
# Two cells of the shared crash matrix, one with the log from boto3's environment chain
# (``log="s3://..."``), one with an S3Store given explicit client options.
CELLS = [
    (*cell, how)
    for cell, how in zip(
        [c for c in CRASH_MATRIX if c[0] in ("after_decision", "during_recovery")],
        ["env", "options"],
        strict=True,
    )
]


@pytest.mark.spark
@pytest.mark.parametrize(("point", "mode", "times", "how"), CELLS)
def test_streaming_files_sink_with_log_on_s3(
    spark: Any,
    s3: S3Service,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    point: str,
    mode: str,
    times: int,
    how: str,
) -> None:
    """FilesSink through a crash cell; the log on S3 from boto3's env chain or explicit options."""
    from txsink.connectors.files import FilesSink

    bucket = s3.new_bucket()
    url = f"s3://{bucket}/pipelines/{point}/txlog"
    if how == "env":
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", s3.endpoint)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
        monkeypatch.setenv("AWS_DEFAULT_REGION", s3.region)

    def log() -> str | S3Store:
        return url if how == "env" else S3Store(url, client_options=options(s3))

    prepare_input(tmp_path, ROWS)
    plan = FaultPlan.parse(fault_spec(point, mode, times), str(tmp_path / "faults"))
    restarts, _errors = run_until_done(
        spark,
        tmp_path,
        lambda: Coordinator(
            [FilesSink(tmp_path / "output", uid="out", format="parquet")], log=log(), faults=plan
        ),
    )
    assert len(plan.fired()) == len(plan.faults) * times, "the fault never fired: test is void"
    assert restarts >= 1
    verdict = verify_files(tmp_path / "output", range(ROWS))
    assert verdict.as_dict() == {
        **verdict.as_dict(),
        "duplicates": 0,
        "missing": 0,
        "unexpected": 0,
        "lingering": 0,
        "epochs": 4,
    }
    txlog = open_log(url, client_options=options(s3))
    assert txlog.pending() == []
    assert [s.status for s in txlog.states()].count("committed") == 4
    assert not (tmp_path / "txlog").exists()  # the log really lived on S3
    if how == "env":  # `txsink status --log s3://...` reads it with the same chain
        from txsink.cli import main

        assert main(["status", "--log", url, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["log"] == url + "/" and len(doc["epochs"]) == 4


# -- a client following the log (txsink.ops.follow, docs/spark-connect.md) --------------------


def test_a_follower_lists_once_per_poll_and_reads_each_epoch_once(s3: S3Service) -> None:
    """What ``coordinator.follow(query)`` costs on S3: one ListObjectsV2 per poll, and an
    epoch's records read when its committed mark appears, never again."""
    from txsink.ops.follow import LogFollower

    bucket = s3.new_bucket()
    writer = TxLog(store_at(s3, bucket))
    writer.bind_app("app")
    store = store_at(s3, bucket)
    lists = count_calls(store._client, "ListObjectsV2")
    gets = count_calls(store._client, "GetObject")
    follower = LogFollower(TxLog(store))
    follower.poll(history=True)
    for epoch in (0, 1):
        writer.decide(epoch, writer.claim_round(epoch), {"events": []}, {"rows": {"events": 3}})
        writer.mark_committed(epoch, 0)
    assert follower.poll() is True
    assert follower.printed == [(0, "committed"), (1, "committed")]
    read = gets["GetObject"]
    for _ in range(3):
        assert follower.poll() is False
    assert gets["GetObject"] == read  # nothing new: nothing read
    # a listing per poll (history, 1, 3 idle) and per finished epoch (its decision); a
    # decision and a committed mark read per epoch
    assert (lists["ListObjectsV2"], read) == (1 + 1 + 3 + 2, 2 * 2), (lists, gets)
