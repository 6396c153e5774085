"""The Kafka WAL's locations without servers: a local folder, a generic ``pyarrow.fs``
filesystem (pyarrow's in-memory mock), and the options' rules. S3 is in
integration/test_kafka_wal.py, against MinIO."""

from __future__ import annotations

import pickle
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from pyarrow import fs

from txsink.connectors.kafka import KafkaSink
from txsink.connectors.kafka.records.format import RECORD_SCHEMA
from txsink.connectors.kafka.wal import KafkaWalHandle
from txsink.connectors.kafka.wal.store import WalStore
from txsink.errors import ConfigurationError
from txsink.txid import TxnId

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.string())])
TXN = TxnId("app", "k", 0, 0, 1, 7)


def _sink(wal: str | Path, **options: object) -> KafkaSink:
    return KafkaSink("127.0.0.1:1", "t", uid="k", wal=wal, key="key", **options)  # type: ignore[arg-type]


def _write(sink: KafkaSink, ids: range) -> object:
    open_ = sink.begin(TXN, SCHEMA)
    sink.write(open_, pa.RecordBatch.from_pydict({"id": list(ids), "key": ["a"] * len(ids)}))
    return open_


def test_local_file_appears_only_when_published(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "wal")
    open_ = _write(sink, range(10))
    folder = tmp_path / "wal" / str(TXN)
    assert sorted(p.name for p in folder.iterdir()) == [".records.arrow.partial"]
    assert not (folder / "records.arrow").exists()
    handle = sink.prepare(open_)  # type: ignore[arg-type]
    assert isinstance(handle, KafkaWalHandle)
    assert sorted(p.name for p in folder.iterdir()) == ["records.arrow"]
    assert handle.crc32 == zlib.crc32((folder / "records.arrow").read_bytes())
    table = pa.ipc.open_file(str(folder / "records.arrow")).read_all()
    assert table.schema == RECORD_SCHEMA and table.num_rows == 10
    assert [h.txn for h in sink.list_prepared("app")] == [TXN]
    sink.abort(handle)
    assert not folder.exists()


def test_a_discarded_file_leaves_nothing(tmp_path: Path) -> None:
    sink = _sink(tmp_path / "wal")
    sink.discard(_write(sink, range(10)))  # type: ignore[arg-type]
    assert list((tmp_path / "wal").iterdir()) == []


def test_a_generic_pyarrow_filesystem_writes_a_temp_name_then_moves() -> None:
    mock = fs._MockFileSystem()
    sink = _sink("wal", wal_filesystem=mock)
    open_ = _write(sink, range(5))
    folder = f"wal/{TXN}"
    names = {i.base_name for i in mock.get_file_info(fs.FileSelector(folder))}
    assert names == {".records.arrow.partial"}
    handle = sink.prepare(open_)  # type: ignore[arg-type]
    assert isinstance(handle, KafkaWalHandle)
    names = {i.base_name for i in mock.get_file_info(fs.FileSelector(folder))}
    assert names == {"records.arrow"}
    with mock.open_input_stream(f"{folder}/records.arrow") as f:
        assert zlib.crc32(f.read()) == handle.crc32
    assert [h.txn for h in sink.list_prepared("app")] == [TXN]
    sink.abort(handle)
    assert [h.txn for h in sink.list_prepared("app")] == []


def test_check_names_sink_phase_and_fix_for_an_unwritable_folder(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    sink = _sink(blocker / "wal")
    with pytest.raises(
        ConfigurationError, match=r"cannot write to the WAL location .* Fix: "
    ) as info:
        sink._wal.check(sink.settings.context("check"))
    assert (info.value.sink_uid, info.value.phase) == ("k", "check")


def test_options_are_checked_and_never_shown() -> None:
    secret = "sEcReT-123"
    options = {"endpoint_override": "127.0.0.1:1", "scheme": "http", "secret_key": secret}
    sink = _sink("s3://bucket/wal", wal_options={**options, "access_key": "me"})
    assert secret not in repr(sink) and secret not in repr(sink._wal)
    copy = pickle.loads(pickle.dumps(sink))  # travels to the tasks, filesystem rebuilt there
    assert copy._wal.store.options == sink._wal.store.options and copy._wal.store._fs is None
    assert sink.wal == "s3://bucket/wal"
    with pytest.raises(ValueError, match="must not carry credentials"):
        _sink("s3://me:secret@bucket/wal")
    with pytest.raises(ValueError, match="must not carry credentials"):
        _sink("s3://bucket/wal?secret_key=x")
    with pytest.raises(ValueError, match="pass wal_filesystem="):
        _sink("/tmp/wal", wal_options={"region": "x"})
    with pytest.raises(ValueError, match="not both"):
        _sink("s3://bucket/wal", wal_options={}, wal_filesystem=fs.LocalFileSystem())


def test_local_locations_are_absolute_folders(tmp_path: Path) -> None:
    assert WalStore(f"file://{tmp_path}/wal").url == f"{tmp_path}/wal"
    local = WalStore(str(tmp_path / "wal"), filesystem=fs.LocalFileSystem())
    assert local.is_local and local.kind == "local"
    assert not WalStore("s3://b/p", {"region": "x"}).is_local
