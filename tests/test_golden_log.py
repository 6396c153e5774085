"""Golden logs: every txsink log format ever released stays readable (tests/golden/).

A golden log is never regenerated; this test is what fails when a change would make
an old log unreadable (a renamed field, a dropped version), and what checks that a
log of an unknown newer version is refused with an error naming uid and versions.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pytest
from typing_extensions import override

from txsink import Coordinator
from txsink.cli import main as cli_main
from txsink.connectors.files import FilesHandle
from txsink.connectors.kafka import KafkaReplayHandle, KafkaWalHandle
from txsink.connectors.postgres import PgHandle
from txsink.connectors.s3 import S3Handle
from txsink.errors import HandleFormatError, LogError
from txsink.handles import Handle, load_handle
from txsink.kit.evolving import decode_schema
from txsink.ops.schemas import schema_history
from txsink.protocol.log import open_log
from txsink.protocol.recovery import ActionKind
from txsink.sink import TwoPhaseCommitSink
from txsink.txid import TxnId

GOLDEN = Path(__file__).resolve().parent / "golden"
APP = "golden-app"
#: connector folder -> (sink uid, handle type, commits from data)
CONNECTORS: dict[str, tuple[str, type[Handle], bool]] = {
    "files": ("out", FilesHandle, False),
    "postgres": ("pg", PgHandle, False),
    "kafka-wal": ("kafka", KafkaWalHandle, False),
    "kafka-replay": ("kafka", KafkaReplayHandle, True),
    "s3": ("s3", S3Handle, False),
    "files-v2": ("out", FilesHandle, False),
    "s3-v2": ("s3", S3Handle, False),
}


class ListedSink(TwoPhaseCommitSink[Any, Any]):
    """A sink that only lists the prepared transactions it is given (planning needs no more)."""

    connector: ClassVar[str] = "golden"

    def __init__(self, uid: str, prepared: list[TxnId], from_data: bool = False) -> None:
        super().__init__(uid)
        self.prepared = prepared
        self.from_data = from_data

    @property
    @override
    def commits_from_data(self) -> bool:
        return self.from_data

    @override
    def begin(self, txn: TxnId, schema: pa.Schema) -> Any:
        raise NotImplementedError

    @override
    def write(self, txn: Any, batch: pa.RecordBatch) -> None:
        raise NotImplementedError

    @override
    def prepare(self, txn: Any) -> Any:
        raise NotImplementedError

    @override
    def commit(self, handle: Any) -> None:
        raise NotImplementedError

    @override
    def abort(self, handle: Any) -> None:
        raise NotImplementedError

    @override
    def list_prepared(self, app_id: str) -> Iterator[Handle]:
        for txn in self.prepared:
            yield Handle(txn=txn)


@pytest.fixture(params=sorted(CONNECTORS))
def golden(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    """A copy of one golden log (reading must not change it, but a copy makes sure)."""
    name = str(request.param)
    copy = tmp_path / name
    shutil.copytree(GOLDEN / "log-v1" / name, copy)
    return name, copy


def test_every_golden_log_opens(golden: tuple[str, Path]) -> None:
    _name, path = golden
    log = open_log(path)
    meta = log.meta()
    assert meta is not None and meta["app_id"] == APP and meta["version"] == 1
    assert [s.status for s in log.states()] == ["committed", "decided", "aborted"]
    state = log.state(1)
    assert (state.rounds, state.voided) == ((0, 1), (0,))
    assert state.decision is not None and state.decision.round == 1
    assert [d.epoch for d in log.pending()] == [1]
    assert log.last_committed() == 0


def test_status_json_reads_every_golden_log(
    golden: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    name, path = golden
    uid = CONNECTORS[name][0]
    assert cli_main(["status", "--log", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["app_id"] == APP and doc["format_version"] == 1
    assert [e["status"] for e in doc["epochs"]] == ["committed", "decided", "aborted"]
    assert doc["epochs"][1]["pending_handles"] == {
        uid: [f"txsink.{APP}.{uid}.e1.r1.p0.a11", f"txsink.{APP}.{uid}.e1.r1.p1.a12"]
    }


def test_status_counts_every_status_of_its_table(
    golden: tuple[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 35: the last line said "3 epochs, 1 committed, 1 decided ..." over a table
    that showed an aborted epoch too."""
    _name, path = golden
    assert cli_main(["status", "--log", str(path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (
        "3 epochs, 1 committed, 1 decided and waiting for commit (recovery finishes them on "
        "restart), 1 aborted (nothing of them is visible)"
    )


def test_every_golden_handle_loads_into_its_type(golden: tuple[str, Path]) -> None:
    name, path = golden
    uid, handle_type, _ = CONNECTORS[name]
    log = open_log(path)
    for epoch in (0, 1):
        decision = log.decision(epoch)
        assert decision is not None
        handles = [load_handle(doc, sink_uid=uid) for doc in decision.handles[uid]]
        assert [type(h) for h in handles] == [handle_type, handle_type]
        for partition, handle in enumerate(handles):
            assert handle.txn == TxnId(
                APP, uid, epoch, decision.round, partition, handle.txn.attempt
            )
            assert handle.rows == 3
        _check_fields(name, epoch, handles)


def _check_fields(name: str, epoch: int, handles: list[Handle]) -> None:
    first = handles[0]
    if isinstance(first, FilesHandle | S3Handle):
        # version 1 (txsink <= 0.1) carries no schema; version 2 the epoch's (issue #41)
        if name.endswith("-v2"):
            assert decode_schema(first.schema).names == ["id", "amount", "note"]
        else:
            assert first.schema == ""
    if isinstance(first, FilesHandle):
        (entry,) = first.files
        assert entry.final == f"epoch={epoch}/out-p00000-0000.parquet"
        assert entry.staged.startswith(f"_txsink/staging/{first.txn}/")
        assert (entry.rows, entry.nbytes, len(entry.sha256)) == (3, 1024, 64)
    elif isinstance(first, KafkaWalHandle):
        assert first.path == f"{first.txn}/records.arrow" and first.crc32 == 305419896
    elif isinstance(first, KafkaReplayHandle):
        assert (first.shards, first.checksum) == (2, 2882400000)
        # epoch 0 was decided with a version-1 handle: its replay is verified the old way
        assert first.checksum_version == (1 if epoch == 0 else 2)
    elif isinstance(first, S3Handle):
        (obj,) = first.objects
        assert (first.bucket, first.format) == ("golden-bucket", "parquet")
        assert first.marker == f"out/_txsink/uploads/s3/{first.txn}.json"
        assert obj.key == f"out/epoch={epoch}/s3-p00000-0000.parquet"
        assert obj.parts[0].number == 1 and obj.upload_id.startswith("golden-upload-")
    else:
        assert isinstance(first, PgHandle) and first.nbytes == 96, name


def test_recovery_plan_over_every_golden_log(golden: tuple[str, Path]) -> None:
    """Epoch 1 is finished; a lingering attempt of voided round 0 and one of an undecided
    epoch 3 are aborted, the latter's round voided first."""
    name, path = golden
    uid, _, from_data = CONNECTORS[name]
    lingering = [TxnId(APP, uid, 1, 0, 0, 99), TxnId(APP, uid, 3, 0, 1, 7)]
    sink = ListedSink(uid, lingering, from_data)
    plan = Coordinator([sink], log=path).recovery_plan()
    decided = [f"txsink.{APP}.{uid}.e1.r1.p0.a11", f"txsink.{APP}.{uid}.e1.r1.p1.a12"]
    assert [(a.kind, a.epoch, a.txn) for a in plan] == [
        (ActionKind.COMMIT, 1, None),
        (ActionKind.MARK_COMMITTED, 1, None),
        (ActionKind.ABORT, 1, str(lingering[0])),
        (ActionKind.VOID, 3, None),
        (ActionKind.ABORT, 3, str(lingering[1])),
    ]
    assert [str(h.txn) for h in plan[0].handles] == decided
    assert open_log(path).pending() != [], "planning changed the log"


def test_the_first_version_2_record_reads_and_recovers_with_its_change(tmp_path: Path) -> None:
    """``schema-v2/`` (issue #41): epoch 1 added a column and committed; epoch 2 widened
    one and is decided: recovery commits it with the change its decision recorded."""
    path = tmp_path / "log"
    shutil.copytree(GOLDEN / "schema-v2", path)
    versions = [json.loads(p.read_text())["version"] for p in sorted(path.rglob("decision-*.json"))]
    assert versions == [1, 2, 2]
    told = [
        (e.epoch, e.sink, e.change.describe(), e.committed) for e in schema_history(open_log(path))
    ]
    assert told == [
        (1, "out", "adds note (string)", True),
        (2, "out", "widens amount int32 -> int64", False),
    ]
    plan = Coordinator([ListedSink("out", [], False)], log=path).recovery_plan()
    commit = plan[0]
    assert (commit.kind, commit.epoch) == (ActionKind.COMMIT, 2)
    assert commit.schema_change is not None
    assert commit.schema_change.new.field("amount").type == pa.int64()


def test_the_first_evidence_reads_as_the_digest_of_its_rows(tmp_path: Path) -> None:
    """``log-v1/files-evidence/`` (issue #42): each handle's ``"evidence"`` beside its data
    is the version-1 digest of its rows, and survives a load and a dump unchanged."""
    from txsink.audit.digest import Digest, digest_batch
    from txsink.handles import dump_handle

    path = GOLDEN / "log-v1" / "files-evidence"
    decision = open_log(path).decision(0)
    assert decision is not None
    for p, doc in enumerate(decision.handles["out"]):
        handle = load_handle(doc, sink_uid="out")
        ids = [p * 10 + i for i in range(3)]
        rows = pa.table({"id": ids, "amount": [i * 2 for i in ids], "note": [f"n{i}" for i in ids]})
        assert handle.evidence is not None
        assert Digest.from_json(handle.evidence) == digest_batch(rows)
        assert dump_handle(handle) == doc


# -- incompatible logs --------------------------------------------------------------------


def test_handle_of_a_newer_version_is_refused_naming_uid_and_versions(tmp_path: Path) -> None:
    log = open_log(GOLDEN / "incompatible" / "handle-v99")
    decision = log.decision(0)
    assert decision is not None
    with pytest.raises(HandleFormatError) as info:
        load_handle(decision.handles["pg"][0], sink_uid="pg")
    text = str(info.value)
    assert "sink pg" in text and "'postgres.prepared'" in text
    assert "version 99" in text and "version(s) 1 " in text
    assert "newer txsink" in text and "Upgrade txsink" in text
    assert info.value.sink_uid == "pg"
    # Recovery refuses the same way before touching anything.
    shutil.copytree(GOLDEN / "incompatible" / "handle-v99", tmp_path / "log")
    coordinator = Coordinator([ListedSink("pg", [])], log=tmp_path / "log")
    with pytest.raises(HandleFormatError, match="version 99"):
        coordinator.recovery_plan()


def test_unknown_serializer_and_malformed_handles_are_refused() -> None:
    with pytest.raises(
        HandleFormatError, match=r"sink pg: unknown handle serializer 'postgres\.v9'"
    ):
        load_handle({"serializer": "postgres.v9", "version": 1, "data": {}}, sink_uid="pg")
    with pytest.raises(HandleFormatError, match="version '1'"):
        load_handle({"serializer": "postgres.prepared", "version": "1", "data": {}}, sink_uid="pg")
    with pytest.raises(HandleFormatError, match=r"version 0 .*no longer supported"):
        load_handle({"serializer": "postgres.prepared", "version": 0, "data": {}}, sink_uid="pg")
    with pytest.raises(HandleFormatError, match="malformed"):
        load_handle({"serializer": "postgres.prepared", "version": 1, "data": {}}, sink_uid="pg")
    # Kafka replay reads its three versions, and no fourth one.
    assert KafkaReplayHandle.readable_versions() == (1, 2, 3)
    with pytest.raises(HandleFormatError, match=r"version 4 .*version\(s\) 1, 2, 3"):
        load_handle({"serializer": "kafka.replay", "version": 4, "data": {}}, sink_uid="k")


def test_log_of_a_newer_format_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    path = GOLDEN / "incompatible" / "meta-v2"
    with pytest.raises(LogError) as info:
        open_log(path).meta()
    text = str(info.value)
    assert "meta.json" in text and "log format version 2" in text
    assert "1 to 1" in text and "upgrade txsink" in text
    assert cli_main(["status", "--log", str(path), "--json"]) == 1
    assert "log format version 2" in capsys.readouterr().err


def test_record_of_a_newer_version_is_refused() -> None:
    log = open_log(GOLDEN / "incompatible" / "record-v3")
    with pytest.raises(LogError) as info:
        log.states()
    text = str(info.value)
    assert "committed.json" in text and "record version 3" in text
    assert "1 to 2" in text and "newer txsink" in text
