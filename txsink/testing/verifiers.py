"""Verifiers: what a sink really holds after a chaos run, compared with what it should.

A verifier answers three questions, each by reading the target the way a downstream
reader would (never from txsink's own log):

- :meth:`SinkVerifier.expected_ids`: the ids the input holds (each must arrive once);
- :meth:`SinkVerifier.read_ids`: the ids a reader sees, duplicates included;
- :meth:`SinkVerifier.lingering`: prepared-but-undecided leftovers still in the target
  (staged files, prepared transactions, open multipart uploads, open Kafka transactions).

Implement the protocol for your own sink; :func:`verify` turns it into a
:class:`~txsink.verify.Verdict`. Built in: :class:`FilesVerifier`, and, imported lazily
with their client libraries, :class:`PostgresVerifier`, :class:`KafkaVerifier`,
:class:`S3Verifier`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from txsink.verify import Verdict, count_ids

__all__ = [
    "FilesVerifier",
    "IdsVerifier",
    "KafkaVerifier",
    "PostgresVerifier",
    "S3Verifier",
    "SinkVerifier",
    "verify",
]


@runtime_checkable
class SinkVerifier(Protocol):
    """Reads one sink back. Called once, in the test process, after the run ended."""

    def expected_ids(self) -> Iterable[int]:
        """Every id the input holds; each must be read back exactly once."""
        ...

    def read_ids(self) -> Iterable[int]:
        """Every id a reader of the target sees now, duplicates included."""
        ...

    def lingering(self) -> int:
        """How many prepared-but-undecided leftovers the target still holds (0 when clean)."""
        ...


def verify(verifier: SinkVerifier) -> Verdict:
    """The verdict for one sink: duplicates, missing, unexpected ids, lingering leftovers.

    ``epochs`` comes from the verifier's optional ``epochs()`` method (0 without it).
    """
    epochs_of = getattr(verifier, "epochs", None)
    epochs = int(epochs_of()) if callable(epochs_of) else 0
    return count_ids(
        verifier.expected_ids(),
        verifier.read_ids(),
        lingering=int(verifier.lingering()),
        epochs=epochs,
    )


@dataclass
class IdsVerifier:
    """A verifier from plain values or callables: for tests and quick custom sinks.

    ``read`` and ``lingering_count`` may be values or zero-argument callables.
    """

    expected: Iterable[int]
    read: Iterable[int] | Any
    lingering_count: int | Any = 0

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> Iterable[int]:
        return list(self.read() if callable(self.read) else self.read)

    def lingering(self) -> int:
        value = self.lingering_count() if callable(self.lingering_count) else self.lingering_count
        return int(value)


@dataclass
class FilesVerifier:
    """A :class:`~txsink.connectors.files.FilesSink` folder, read through its manifests.

    ``lingering`` counts staged transactions left in ``_txsink/staging`` plus published
    data files that no manifest names (a reader listing the folder would see them).
    """

    path: str | os.PathLike[str]
    expected: Iterable[int]
    uid: str | None = None
    id_column: str = "id"

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        from txsink.connectors.files import read_committed

        table = read_committed(self.path, self.uid)
        if self.id_column not in table.column_names:
            return []
        return [int(v) for v in table.column(self.id_column).to_pylist()]

    def epochs(self) -> int:
        from txsink.connectors.files import read_manifests

        return len(read_manifests(self.path, self.uid))

    def lingering(self) -> int:
        from txsink.connectors.files import MANIFESTS, STAGING, read_manifests

        root = Path(self.path)
        staging = root / STAGING
        staged = [
            name
            for name in (os.listdir(staging) if staging.is_dir() else [])
            if self.uid is None or f".{self.uid}." in name
        ]
        named = {f["path"] for doc in read_manifests(root, self.uid) for f in doc["files"]}
        orphans = 0
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            if rel_dir.parts and rel_dir.parts[0] in (MANIFESTS, STAGING.split("/")[0]):
                dirnames.clear()
                continue
            for name in filenames:
                if self.uid is not None and not name.startswith(f"{self.uid}-"):
                    continue
                if not rel_dir.parts or name.startswith("."):
                    continue
                if str(rel_dir / name) not in named:
                    orphans += 1
        return len(staged) + orphans


def _app_id(log: str | os.PathLike[str] | None) -> str | None:
    if log is None:
        return None
    from txsink.log import open_log

    meta = open_log(log).meta()
    return None if meta is None else str(meta["app_id"])


@dataclass
class PostgresVerifier:
    """A Postgres table: ``SELECT id``; lingering = this sink's prepared transactions.

    With ``log`` (the txsink log of the run) only the run's own prepared transactions
    count (``txsink.<app_id>.<uid>.``), so other users of the server do not disturb it.
    Needs ``psycopg``.
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
        import psycopg

        app = _app_id(self.log)
        prefix = f"txsink.{app}.{self.uid}." if app else "txsink."
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                "AND starts_with(gid, %s)",
                (prefix,),
            ).fetchall()
        return sum(1 for (gid,) in rows if app or f".{self.uid}." in gid)


@dataclass
class KafkaVerifier:
    """A Kafka topic read with ``isolation.level=read_committed`` (JSON values with an id).

    lingering = files left in the write-ahead log folder (``wal``), plus one per partition
    whose last stable offset is behind its high watermark (a transaction still open).
    Needs ``confluent-kafka``.
    """

    bootstrap: str
    topic: str
    expected: Iterable[int]
    wal: str | None = None
    id_field: str = "id"
    timeout_s: float = 60.0

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        from txsink.testing import _kafka

        values = _kafka.read_committed_values(self.bootstrap, self.topic, self.timeout_s)
        return [int(json.loads(v or b"null")[self.id_field]) for v in values]

    def lingering(self) -> int:
        from txsink.testing import _kafka

        left = 0
        if self.wal is not None and os.path.isdir(self.wal):
            left += sum(len(files) for _, _, files in os.walk(self.wal))
        stable = _kafka.end_offsets(self.bootstrap, self.topic, "read_committed", self.timeout_s)
        high = _kafka.end_offsets(self.bootstrap, self.topic, "read_uncommitted", self.timeout_s)
        return left + sum(1 for p, end in high.items() if stable.get(p, 0) < end)


@dataclass
class S3Verifier:
    """An :class:`~txsink.connectors.s3.S3Sink` prefix, read through its manifests.

    lingering = open multipart uploads under the prefix plus the sink's upload markers
    (``<prefix>_txsink/uploads/``). Needs ``boto3``; ``client_options`` go to
    ``boto3.client("s3", ...)`` (without them boto3's environment chain decides).
    """

    url: str
    expected: Iterable[int]
    uid: str | None = None
    id_column: str = "id"
    client_options: Mapping[str, Any] | None = field(default=None)

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        from txsink.connectors.s3 import read_committed

        table = read_committed(self.url, self.uid, client_options=self.client_options)
        if self.id_column not in table.column_names:
            return []
        return [int(v) for v in table.column(self.id_column).to_pylist()]

    def epochs(self) -> int:
        from txsink.connectors.s3 import read_manifests

        return len(read_manifests(self.url, self.uid, self.client_options))

    def lingering(self) -> int:
        from txsink._s3 import make_client, parse_s3_url

        loc = parse_s3_url(self.url)
        prefix = loc.prefix if not loc.prefix or loc.prefix.endswith("/") else loc.prefix + "/"
        client = make_client(self.client_options)
        uploads = 0
        kwargs: dict[str, Any] = {"Bucket": loc.bucket}
        while True:  # listed without Prefix: MinIO reads Prefix as an exact key
            page = client.list_multipart_uploads(**kwargs)
            uploads += sum(1 for u in page.get("Uploads", []) if u["Key"].startswith(prefix))
            if not page.get("IsTruncated"):
                break
            kwargs["KeyMarker"] = page.get("NextKeyMarker", "")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker", "")
        markers = 0
        for listing in client.get_paginator("list_objects_v2").paginate(
            Bucket=loc.bucket, Prefix=f"{prefix}_txsink/uploads/"
        ):
            markers += len(listing.get("Contents", []))
        return uploads + markers
