"""The Iceberg connector's testing adapter: a SQL catalog in the test PostgreSQL server and
the warehouse on the test S3 server (MinIO), as ``integration/services up`` provides them
(``TXSINK_PG_DSN``, ``TXSINK_S3_ENDPOINT``, ``TXSINK_S3_ACCESS_KEY``,
``TXSINK_S3_SECRET_KEY``, ``TXSINK_S3_REGION``). ``new_target(..., catalog="sqlite")``
makes a local target instead (a SQLite catalog file and a local warehouse), for tests
without servers.

Specs hold no secret: the sink's catalog properties are built from the environment.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from txsink.connectors.iceberg import catalog as cat
from txsink.connectors.iceberg.commit import SUMMARY_EPOCH
from txsink.connectors.iceberg.naming import txn_of
from txsink.connectors.iceberg.sink import IcebergSink
from txsink.testing.adapter import ConnectorTesting
from txsink.testing.contract import SCHEMA
from txsink.testing.observer import Snapshot, Target, by_epoch
from txsink.testing.verifiers import SinkVerifier

__all__ = ["ADAPTER", "BUCKET", "IcebergTesting", "IcebergVerifier", "catalog_properties"]

DSN, ENDPOINT, ACCESS_KEY, SECRET_KEY, REGION = (
    "TXSINK_PG_DSN",
    "TXSINK_S3_ENDPOINT",
    "TXSINK_S3_ACCESS_KEY",
    "TXSINK_S3_SECRET_KEY",
    "TXSINK_S3_REGION",
)
#: The warehouse bucket on the test S3 server (each target its own prefix).
BUCKET = "txsink-iceberg"


def _sqlalchemy_url(dsn: str) -> str:
    """A libpq URL as SQLAlchemy's psycopg (3) URL."""
    for prefix in ("postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+psycopg://" + dsn[len(prefix) :]
    raise ValueError("TXSINK_PG_DSN must be a postgresql:// URL for the Iceberg SQL catalog")


def catalog_properties(spec: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """pyiceberg catalog properties for a spec (secrets from ``env``: never print them)."""
    if spec["catalog"] == "sqlite":
        return {
            "type": "sql",
            "uri": f"sqlite:///{spec['catalog_file']}",
            "warehouse": spec["warehouse"],
        }
    return {
        "type": "sql",
        "uri": _sqlalchemy_url(env[DSN]),
        "warehouse": spec["warehouse"],
        "s3.endpoint": env[ENDPOINT],
        "s3.access-key-id": env.get(ACCESS_KEY, ""),
        "s3.secret-access-key": env.get(SECRET_KEY, ""),
        "s3.region": env.get(REGION) or "us-east-1",
    }


def _load(spec: Mapping[str, Any], env: Mapping[str, str]) -> Any:
    # A fresh catalog, as any pyiceberg reader would open it: not the sink's objects.
    return cat.load_catalog(spec["catalog_name"], catalog_properties(spec, env)).load_table(
        spec["table"]
    )


def _read(spec: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[int], list[int]]:
    table = _load(spec, env)
    ids = [int(i) for i in table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()]
    epochs = sorted(
        int(s.summary[SUMMARY_EPOCH])
        for s in table.snapshots()
        if s.summary is not None and SUMMARY_EPOCH in s.summary.additional_properties
    )
    return ids, epochs


@dataclass
class IcebergVerifier:
    """The table read with a pyiceberg scan; lingering = transaction-named data files that
    no snapshot references (orphans recovery should have deleted)."""

    spec: Mapping[str, Any]
    env: Mapping[str, str]
    expected: Iterable[int] = field(default_factory=list)

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        return _read(self.spec, self.env)[0]

    def epochs(self) -> int:
        return len(_read(self.spec, self.env)[1])

    def lingering(self) -> int:
        table = _load(self.spec, self.env)
        referenced = cat.referenced(table)
        return sum(
            1 for key in cat.list_files(table) if txn_of(key) is not None and key not in referenced
        )


class IcebergTarget:
    """The table as a pyiceberg reader sees it, for the cross-system observer.

    One catalog of its own (not the sink's) for the whole run, closed by :meth:`close`: a
    catalog per sample opened a PostgreSQL connection (a server process) twenty times a
    second. The table is loaded at every sample, and scanned only when its metadata file
    changed: an Iceberg metadata file never changes once written, so the same file always
    reads the same rows, and the sample costs one catalog query and one metadata read.
    """

    guaranteed = True
    counts_rows = True

    def __init__(
        self, spec: Mapping[str, Any], env: Mapping[str, str], name: str = "iceberg"
    ) -> None:
        self.spec, self.env, self.name = spec, env, name
        self._catalog: Any = None
        self._read: tuple[str, Snapshot] | None = None  # (metadata location, its snapshot)

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        if self._catalog is None:
            self._catalog = cat.load_catalog(
                self.spec["catalog_name"], catalog_properties(self.spec, self.env)
            )
        try:
            table = self._catalog.load_table(self.spec["table"])
        except Exception:
            self.close()  # e.g. the catalog's server was killed: a fresh catalog next time
            raise
        if self._read is None or self._read[0] != table.metadata_location:
            ids = table.scan(selected_fields=("id",)).to_arrow()["id"].to_pylist()
            self._read = (table.metadata_location, by_epoch((int(i) for i in ids), epoch_of))
        return self._read[1]

    def close(self) -> None:
        """Close the catalog (a SQL catalog's connection pool)."""
        catalog, self._catalog = self._catalog, None
        if catalog is not None:
            catalog.close()


class IcebergTesting(ConnectorTesting):
    """A new table per target: SQL catalog on Postgres, warehouse on MinIO."""

    name: ClassVar[str] = "iceberg"
    env_vars: ClassVar[tuple[str, ...]] = (DSN, ENDPOINT)
    services: ClassVar[tuple[str, ...]] = ("postgres", "s3")
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {"sql-s3": {"catalog": "postgres"}}
    #: The default suite runs the matrix's quick cells only (the rest with --run-slow).
    slow_variants: ClassVar[frozenset[str]] = frozenset({"sql-s3"})

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        names = (DSN, ENDPOINT, ACCESS_KEY, SECRET_KEY, REGION)
        return {var: env[var] for var in names if var in env}

    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        kind = options.get("catalog", "postgres")
        spec: dict[str, Any] = {
            "kind": self.name,
            "catalog": kind,
            "catalog_name": f"txsink_{tag}",
            "table": f"txsink.{tag.replace('-', '_')}",
            "uid": options.get("uid", "iceberg"),
        }
        if kind == "sqlite":
            spec["catalog_file"] = str(Path(workdir, f"{tag}-catalog.db"))
            spec["warehouse"] = Path(workdir, f"{tag}-warehouse").resolve().as_uri()
        else:
            spec["warehouse"] = f"s3://{BUCKET}/{tag}"
            self._bucket(env)
        catalog = cat.load_catalog(spec["catalog_name"], catalog_properties(spec, env))
        catalog.create_namespace_if_not_exists("txsink")
        catalog.create_table(spec["table"], schema=_schema(), partition_spec=_spec(options))
        return spec

    def _bucket(self, env: Mapping[str, str]) -> None:
        from txsink.connectors.s3.client import make_client
        from txsink.connectors.s3.testing import client_options

        client = make_client(client_options(env))
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=BUCKET)

    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> IcebergSink:
        return IcebergSink(
            catalog_properties(spec, env),
            spec["table"],
            uid=spec["uid"],
            catalog_name=spec["catalog_name"],
        )

    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        return IcebergVerifier(spec, env, expected)

    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        return [IcebergTarget(spec, env)]

    def drop_target(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> None:
        """Drop the table and delete its files (best effort)."""
        with contextlib.suppress(Exception):
            catalog = cat.load_catalog(spec["catalog_name"], catalog_properties(spec, env))
            catalog.drop_table(spec["table"])
        if spec["catalog"] == "sqlite":
            shutil.rmtree(Path(spec["catalog_file"]).parent / Path(spec["warehouse"]).name, True)
            return
        with contextlib.suppress(Exception):
            from txsink.connectors.s3.client import make_client
            from txsink.connectors.s3.testing import client_options

            client = make_client(client_options(env))
            prefix = str(spec["warehouse"]).split(f"{BUCKET}/", 1)[1] + "/"
            for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix=prefix
            ):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", []) if "Key" in o]
                if keys:
                    client.delete_objects(Bucket=BUCKET, Delete={"Objects": keys})  # type: ignore[typeddict-item]


def _schema() -> Any:
    """The contract input's schema (:data:`txsink.testing.contract.SCHEMA`) with field ids."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType

    types = {"id": LongType(), "key": StringType(), "amount": DoubleType(), "payload": StringType()}
    return Schema(
        *(NestedField(n, f.name, types[f.name], required=False) for n, f in enumerate(SCHEMA, 1))
    )


def _spec(options: Mapping[str, Any]) -> Any:
    """The partition spec a test asks for: ``partition=["identity:key", "bucket4:id"]``."""
    from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
    from pyiceberg.transforms import BucketTransform, IdentityTransform

    wanted = options.get("partition") or ()
    if not wanted:
        return UNPARTITIONED_PARTITION_SPEC
    ids = {"id": 1, "key": 2, "amount": 3, "payload": 4}
    fields = []
    for n, item in enumerate(wanted):
        kind, column = item.split(":")
        transform: Any = (
            BucketTransform(int(kind[6:])) if kind.startswith("bucket") else IdentityTransform()
        )
        fields.append(PartitionField(ids[column], 1000 + n, transform, f"{column}_{kind}"))
    return PartitionSpec(*fields)


ADAPTER = IcebergTesting()
