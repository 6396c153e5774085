"""Write the golden txsink logs of this release's format (``log-v1/``) and ``incompatible/``.

    ./.venv/bin/python tests/golden/make_golden.py            # refuses if log-v1/ exists
    ./.venv/bin/python tests/golden/make_golden.py --out DIR  # a fresh copy elsewhere
    ./.venv/bin/python tests/golden/make_golden.py --schema-v2  # schema-v2/ only (#41)

A RELEASED FORMAT'S GOLDEN FILES ARE NEVER REGENERATED: they are what that release
wrote, and every later txsink must read them (tests/test_golden_log.py). When the log
format or a handle serializer gets a new version, add a new folder (``log-v2/``, or a
new connector folder) from that release's generator and keep the old ones untouched.

Each ``log-v1/<connector>/`` is a txsink log written through :class:`txsink.protocol.log.TxLog`
of this release, with handles dumped by the connectors' own handle classes
(``dump_handle``), telling one story per connector (app ``golden-app``):

- epoch 0, round 0: decided and committed;
- epoch 1, round 0: voided by recovery (its driver crashed before the decision);
  round 1: decided, not committed (the driver crashed after the decision);
- epoch 2, round 0: claimed, then voided (aborted).

``kafka-replay`` decided epoch 0 with a version-1 handle (written as txsink <= 0.1
wrote it: no ``checksum_version``) and epoch 1 with a version-2 handle.

``files-evidence`` (issue #42, the audit): the files-v2 story with each handle's
``"evidence"``, the digest of its rows (:mod:`txsink.audit.digest` version 1), beside its
``data``.

``files`` and ``s3`` hold version-1 handles (as txsink <= 0.1 wrote them: no ``schema``);
``files-v2`` and ``s3-v2`` the same story with version-2 handles, which carry the epoch's
schema (issue #41, schema evolution).

Machine-specific values that do not matter are replaced by stable ones (times, host,
pid); handles hold fake but well-formed paths, buckets, keys and upload ids. No secret.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from txsink.audit.digest import digest_batch
from txsink.connectors.files import FileEntry, FilesHandle
from txsink.connectors.kafka import KafkaReplayHandle, KafkaWalHandle
from txsink.connectors.postgres import PgHandle
from txsink.connectors.s3 import S3Handle, S3Object, S3Part
from txsink.handles import Handle, dump_handle
from txsink.kit.evolving import encode_schema
from txsink.protocol.log import FileStore, TxLog
from txsink.schema import SchemaChange, diff
from txsink.txid import TxnId

APP = "golden-app"
#: The epoch's schema the version-2 files and S3 handles carry.
SCHEMA = encode_schema(
    pa.schema([("id", pa.int64()), ("amount", pa.int64()), ("note", pa.string())])
)
HERE = Path(__file__).resolve().parent
#: Stable stand-ins for the values a real run gets from the clock and the machine.
STABLE = {
    "created_at": 1700000000.0,
    "at": 1700000001.0,
    "decided_at": 1700000002.0,
    "committed_at": 1700000003.0,
    "host": "golden-host",
    "pid": 4242,
}


def _txn(uid: str, epoch: int, round_: int, partition: int) -> TxnId:
    return TxnId(APP, uid, epoch, round_, partition, attempt=10 * epoch + round_ + partition)


def files_handle(epoch: int, round_: int, partition: int) -> FilesHandle:
    txn = _txn("out", epoch, round_, partition)
    entry = FileEntry(
        staged=f"_txsink/staging/{txn}/part-0000.parquet",
        final=f"epoch={epoch}/out-p{partition:05d}-0000.parquet",
        rows=3,
        nbytes=1024 + partition,
        sha256=f"{epoch:02x}{partition:02x}" + "ab" * 30,
    )
    return FilesHandle(txn=txn, rows=3, nbytes=entry.nbytes, files=(entry,), schema=SCHEMA)


def pg_handle(epoch: int, round_: int, partition: int) -> PgHandle:
    return PgHandle(txn=_txn("pg", epoch, round_, partition), rows=3, nbytes=96)


def wal_handle(epoch: int, round_: int, partition: int) -> KafkaWalHandle:
    txn = _txn("kafka", epoch, round_, partition)
    return KafkaWalHandle(
        txn=txn, rows=3, nbytes=210, path=f"{txn}/records.arrow", crc32=305419896 + partition
    )


def replay_handle(epoch: int, round_: int, partition: int) -> KafkaReplayHandle:
    txn = _txn("kafka", epoch, round_, partition)
    return KafkaReplayHandle(txn=txn, rows=3, nbytes=210, shards=2, checksum=2882400000 + partition)


def s3_handle(epoch: int, round_: int, partition: int) -> S3Handle:
    txn = _txn("s3", epoch, round_, partition)
    obj = S3Object(
        key=f"out/epoch={epoch}/s3-p{partition:05d}-0000.parquet",
        upload_id=f"golden-upload-{epoch}-{round_}-{partition}",
        parts=(S3Part(1, "9b2cf535f27731c974343645a3985328", "AAAAAA=="),),
        rows=3,
        nbytes=2048,
        etag="0d2ab3e9a2f4c1b7d5e8f9a0b1c2d3e4-1",
        checksum="AAAAAA==-1",
    )
    return S3Handle(
        txn=txn,
        rows=3,
        nbytes=2048,
        bucket="golden-bucket",
        marker=f"out/_txsink/uploads/s3/{txn}.json",
        objects=(obj,),
        format="parquet",
        schema=SCHEMA,
    )


def files_evidence_handle(epoch: int, round_: int, partition: int) -> FilesHandle:
    """:func:`files_handle` with the digest of its three rows (ids ``epoch*100+p*10+i``)."""
    ids = [epoch * 100 + partition * 10 + i for i in range(3)]
    rows = pa.table({"id": ids, "amount": [i * 2 for i in ids], "note": [f"n{i}" for i in ids]})
    evidence = digest_batch(rows).to_json()
    return dataclasses.replace(files_handle(epoch, round_, partition), evidence=evidence)


def replay_v1_doc(handle: KafkaReplayHandle) -> dict[str, Any]:
    """A replay handle as txsink <= 0.1 wrote it: version 1, no checksum_version."""
    doc = dump_handle(handle)
    data = dict(doc["data"])
    data.pop("checksum_version")
    return {"serializer": "kafka.replay", "version": 1, "data": data}


def v1_doc(handle: Handle) -> dict[str, Any]:
    """A files or S3 handle as txsink <= 0.1 wrote it: version 1, no schema."""
    doc = dump_handle(handle)
    data = {k: v for k, v in doc["data"].items() if k != "schema"}
    return {"serializer": doc["serializer"], "version": 1, "data": data}


CONNECTORS: dict[str, tuple[str, Any]] = {
    "files": ("out", files_handle),
    "postgres": ("pg", pg_handle),
    "kafka-wal": ("kafka", wal_handle),
    "kafka-replay": ("kafka", replay_handle),
    "s3": ("s3", s3_handle),
    "files-v2": ("out", files_handle),
    "s3-v2": ("s3", s3_handle),
    "files-evidence": ("out", files_evidence_handle),
}
#: The folders whose handles are all written as version 1 (:func:`v1_doc`).
V1_FOLDERS = ("files", "s3")


def write_log(folder: Path, uid: str, make: Any, *, replay_v1: bool = False) -> None:
    """The story of the module docstring, for one sink ``uid``."""
    log = TxLog(FileStore(folder))
    log.bind_app(APP)

    def docs(epoch: int, round_: int) -> list[dict[str, Any]]:
        handles: list[Handle] = [make(epoch, round_, p) for p in (0, 1)]
        if replay_v1 and epoch == 0:
            return [replay_v1_doc(h) for h in handles if isinstance(h, KafkaReplayHandle)]
        if folder.name in V1_FOLDERS:
            return [v1_doc(h) for h in handles]
        return [dump_handle(h) for h in handles]

    stats = {"rows": {uid: 6}, "seconds": {"precommit": 0.5}}
    # epoch 0: decided and committed
    r = log.claim_round(0)
    log.decide(0, r, {uid: docs(0, r)}, stats)
    log.mark_committed(0, r)
    # epoch 1: round 0 voided by recovery, round 1 decided, not committed
    r0 = log.claim_round(1)
    log.void(1, r0, "aborted by recovery")
    r1 = log.claim_round(1)
    log.decide(1, r1, {uid: docs(1, r1)}, stats)
    # epoch 2: claimed, voided (aborted)
    r = log.claim_round(2)
    log.void(2, r, "pre-commit failed")
    _stabilise(folder)


def write_schema_v2(folder: Path) -> None:
    """``schema-v2/``: the first record version 2 (issue #41), a files log whose epoch 1
    added a column (decided and committed) and epoch 2 widened one (decided, not
    committed: recovery must apply the change with the rows)."""
    log = TxLog(FileStore(folder))
    log.bind_app(APP)
    s0 = pa.schema([("id", pa.int64()), ("amount", pa.int32())])
    s1 = s0.append(pa.field("note", pa.string()))
    s2 = s1.set(1, pa.field("amount", pa.int64()))
    stats = {"rows": {"out": 6}, "seconds": {"precommit": 0.5}}
    for epoch, (old, new) in enumerate([(s0, s0), (s0, s1), (s1, s2)]):
        found = diff(old, new)
        change = SchemaChange("out", old, found.merged, found.changes)
        schema = {"out": change.to_json()} if found.changes else None
        r = log.claim_round(epoch)
        handles = {"out": [dump_handle(files_handle(epoch, r, p)) for p in (0, 1)]}
        log.decide(epoch, r, handles, stats, schema)
        if epoch < 2:
            log.mark_committed(epoch, r)
    _stabilise(folder)


def write_incompatible(folder: Path) -> None:
    """Logs a release-1 txsink must refuse, with the clear errors the tests check."""
    # A handle of version 99 of a known serializer (written by a "newer" txsink).
    handle_v99 = folder / "handle-v99"
    log = TxLog(FileStore(handle_v99))
    log.bind_app(APP)
    r = log.claim_round(0)
    doc = dump_handle(pg_handle(0, r, 0))
    log.decide(0, r, {"pg": [{**doc, "version": 99}]}, {"rows": {"pg": 3}})
    _stabilise(handle_v99)
    # A log of format version 2.
    meta_v2 = folder / "meta-v2"
    TxLog(FileStore(meta_v2)).bind_app(APP)
    _rewrite(meta_v2 / "meta.json", lambda d: {**d, "version": 2})
    _stabilise(meta_v2)
    # A committed record of version 3 (this txsink reads record versions 1 and 2).
    record_v3 = folder / "record-v3"
    log = TxLog(FileStore(record_v3))
    log.bind_app(APP)
    r = log.claim_round(0)
    log.decide(0, r, {"pg": [dump_handle(pg_handle(0, r, 0))]}, {"rows": {"pg": 3}})
    log.mark_committed(0, r)
    _rewrite(record_v3 / "epochs" / f"{0:020d}" / "committed.json", lambda d: {**d, "version": 3})
    _stabilise(record_v3)


def _rewrite(path: Path, change: Any) -> None:
    doc = json.loads(path.read_text())
    path.write_text(json.dumps(change(doc), indent=1, sort_keys=True) + "\n")


def _stabilise(folder: Path) -> None:
    """Replace times, host and pid by :data:`STABLE` (same JSON layout as the log's own)."""
    for path in sorted(folder.rglob("*.json")):
        _rewrite(path, lambda d: {k: STABLE.get(k, v) for k, v in d.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=HERE, help="folder for log-v1/ and incompatible/"
    )
    parser.add_argument(
        "--schema-v2", action="store_true", help="write only schema-v2/ (record version 2)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        help="write only these connector folders into an existing log-v1/ (a new handle "
        "version's folders: files-v2 s3-v2); refuses a folder that exists",
    )
    args = parser.parse_args(argv)
    out: Path = args.out
    if args.schema_v2:
        if (out / "schema-v2").exists():
            print(f"{out / 'schema-v2'} exists: never regenerated", file=sys.stderr)
            return 1
        write_schema_v2(out / "schema-v2")
        return 0
    if args.only:
        for name in args.only:
            if (out / "log-v1" / name).exists():
                print(f"{out / 'log-v1' / name} exists: never regenerated", file=sys.stderr)
                return 1
            uid, make = CONNECTORS[name]
            write_log(out / "log-v1" / name, uid, make)
        print(f"golden logs {args.only} written under {out / 'log-v1'}")
        return 0
    for name in ("log-v1", "incompatible"):
        if (out / name).exists():
            print(
                f"{out / name} exists: released golden files are never regenerated "
                "(add a new folder for a new version instead)",
                file=sys.stderr,
            )
            return 1
    for name, (uid, make) in CONNECTORS.items():
        write_log(out / "log-v1" / name, uid, make, replay_v1=name == "kafka-replay")
    write_incompatible(out / "incompatible")
    print(f"golden logs written under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
