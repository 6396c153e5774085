"""The Delta connector's testing adapter: a verifier that reads the table as a downstream
reader does (delta-rs' own reader, not the sink's code), and the target factory.

Registered in :mod:`txsink.connectors.delta.plugin`. Local tables need nothing; the ``s3``
option puts the table on the test server named by ``TXSINK_S3_ENDPOINT``,
``TXSINK_S3_ACCESS_KEY``, ``TXSINK_S3_SECRET_KEY`` and ``TXSINK_S3_REGION`` (what
``integration/services up`` writes). The ``s3-secure`` variant
(:attr:`DeltaTesting.secure_variants`) puts the table under the allowed prefix of the
secured server (``TXSINK_S3_SECURE_*``: TLS with a private CA, given as the storage option
``certificate_path``), written as its least-privileged user and read back as its root user,
both users' keys read from the server's shared-credentials file, never from a spec.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.fs as pafs

from txsink.connectors.delta.sink import DeltaSink
from txsink.connectors.delta.storage import LOG_FOLDER, Storage
from txsink.testing.adapter import ConnectorTesting
from txsink.testing.observer import Snapshot, Target, by_epoch
from txsink.testing.verifiers import SinkVerifier

__all__ = [
    "ADAPTER",
    "DeltaTableTarget",
    "DeltaTesting",
    "DeltaVerifier",
    "storage_options",
]

_logger = logging.getLogger(__name__)

ENDPOINT, ACCESS_KEY, SECRET_KEY, REGION = (
    "TXSINK_S3_ENDPOINT",
    "TXSINK_S3_ACCESS_KEY",
    "TXSINK_S3_SECRET_KEY",
    "TXSINK_S3_REGION",
)


def secure_storage_options(env: Mapping[str, str], *, admin: bool = False) -> dict[str, str]:
    """delta-rs storage options for the secured server: its CA, the app user's keys
    (``admin``: the root user's) read from its shared-credentials file now."""
    import configparser

    profiles = configparser.ConfigParser()
    profiles.read(env["TXSINK_S3_SECURE_CREDENTIALS"])
    profile = profiles[
        env["TXSINK_S3_SECURE_ADMIN_PROFILE" if admin else "TXSINK_S3_SECURE_PROFILE"]
    ]
    return {
        "AWS_ENDPOINT_URL": env["TXSINK_S3_SECURE_ENDPOINT"],
        "AWS_ACCESS_KEY_ID": profile["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": profile["aws_secret_access_key"],
        "AWS_REGION": env.get("TXSINK_S3_SECURE_REGION") or "us-east-1",
        "certificate_path": env["TXSINK_S3_SECURE_CA"],
    }


def _options(
    spec: Mapping[str, Any], env: Mapping[str, str], *, admin: bool = False
) -> dict[str, str]:
    """A spec's storage options (``admin``: the secured server's root user)."""
    if spec.get("server") == "secure":
        return secure_storage_options(env, admin=admin)
    return storage_options(str(spec["table"]), env)


def storage_options(table: str, env: Mapping[str, str]) -> dict[str, str]:
    """delta-rs storage options for a test table (none for a local one)."""
    if not table.startswith("s3://"):
        return {}
    if not env.get(ENDPOINT):
        raise ValueError(f"a Delta table on S3 needs the test server: set {ENDPOINT}")
    return {
        "AWS_ENDPOINT_URL": env[ENDPOINT],
        "AWS_ACCESS_KEY_ID": env.get(ACCESS_KEY, ""),
        "AWS_SECRET_ACCESS_KEY": env.get(SECRET_KEY, ""),
        "AWS_REGION": env.get(REGION) or "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


@dataclass
class DeltaVerifier:
    """A Delta table read back with delta-rs (``DeltaTable.to_pyarrow_table``).

    epochs = this uid's commits in the table's history (their commit info); lingering =
    files named ``txsink.*.parquet`` in the table's folder that the table does not reference.
    """

    table: str
    expected: Iterable[int]
    uid: str | None = None
    id_column: str = "id"
    options: Mapping[str, str] = field(default_factory=dict)

    def _table(self) -> Any:
        from deltalake import DeltaTable

        return DeltaTable(self.table, storage_options=dict(self.options) or None)

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        data: pa.Table = self._table().to_pyarrow_table(columns=[self.id_column])
        return [int(v) for v in data.column(self.id_column).to_pylist()]

    def epochs(self) -> int:
        history = self._table().history()
        return len(
            {
                c["txsink.epoch"]
                for c in history
                if "txsink.epoch" in c and (self.uid is None or c.get("txsink.uid") == self.uid)
            }
        )

    def lingering(self) -> int:
        fs, root = Storage(self.table, dict(self.options)).filesystem()
        referenced = {u.removeprefix("s3://").removeprefix("file://") for u in self._files()}
        selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        count = 0
        for info in fs.get_file_info(selector):
            name = info.path.rsplit("/", 1)[-1]
            if (
                info.type == pafs.FileType.File
                and f"/{LOG_FOLDER}/" not in info.path
                and name.startswith("txsink.")
                and name.endswith(".parquet")
                and info.path not in referenced
            ):
                count += 1
        return count

    def _files(self) -> list[str]:
        return list(self._table().file_uris())


class DeltaTableTarget:
    """The observer's view of a Delta table: its ids read with delta-rs at each sample (a
    reader of the latest version: whole epochs only, each once).

    The table is opened once and brought to its latest version at every sample; its files
    are read only when the version changed (a Delta version never changes once committed,
    so the same version always reads the same rows).
    """

    counts_rows = True
    guaranteed = True

    def __init__(
        self, table: str, *, name: str = "delta", options: Mapping[str, str] | None = None
    ) -> None:
        self.table = table
        self.name = name
        self.options = dict(options or {})
        self._delta: Any = None
        self._read: tuple[int, Snapshot] | None = None  # (version, its snapshot)

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        from deltalake import DeltaTable

        try:
            if self._delta is None:
                self._delta = DeltaTable(self.table, storage_options=self.options or None)
            else:
                self._delta.update_incremental()
        except Exception:
            self._delta = None  # e.g. the storage server was killed: open afresh next time
            raise
        version = int(self._delta.version())
        if self._read is None or self._read[0] != version:
            data = self._delta.to_pyarrow_table(columns=["id"])
            ids = (int(v) for v in data.column("id").to_pylist())
            self._read = (version, by_epoch(ids, epoch_of))
        return self._read[1]

    def close(self) -> None:
        self._delta = None


class DeltaTesting(ConnectorTesting):
    """A fresh table per target: a local folder, or a fresh bucket with ``s3=True``."""

    name: ClassVar[str] = "delta"
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "local": {},
        "partitioned": {"partition_by": ["key"]},
    }
    #: The partitioned layout runs the matrix's quick cells by default (the rest: --run-slow).
    slow_variants: ClassVar[frozenset[str]] = frozenset({"partitioned"})
    secure_variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "s3-secure": {"server": "secure"},
    }
    secure_services: ClassVar[tuple[str, ...]] = ("s3_secure",)

    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        if options.get("server") == "secure":  # under the user's allowed prefix
            folder = f"txsink-delta-{tag}".replace("_", "-").lower()
            bucket, prefix = env["TXSINK_S3_SECURE_BUCKET"], env["TXSINK_S3_SECURE_PREFIX"]
            table = f"s3://{bucket}/{prefix}{folder}/tbl"
        elif options.get("s3"):
            bucket = f"txsink-delta-{tag}".replace("_", "-").lower()[:63]
            made = pafs.S3FileSystem(
                **_fs_kwargs(storage_options("s3://x", env)), allow_bucket_creation=True
            )
            made.create_dir(bucket)
            table = f"s3://{bucket}/tbl"
        else:
            table = str(Path(workdir, f"delta-{tag}").resolve())
        return {
            "kind": self.name,
            "server": options.get("server"),
            "table": table,
            "uid": options.get("uid", "delta"),
            "partition_by": list(options.get("partition_by", ())),
        }

    def sink_options(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Without ``server`` (which of the harness's servers: the adapter's key)."""
        return {k: v for k, v in super().sink_options(spec).items() if k != "server"}

    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> DeltaSink:
        return DeltaSink(
            spec["table"],
            spec.get("uid", "delta"),
            storage_options=_options(spec, env),
            create_table=True,
            partition_by=spec.get("partition_by", ()),
        )

    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        return DeltaVerifier(
            spec["table"],
            expected,
            spec.get("uid", "delta"),
            options=_options(spec, env, admin=True),
        )

    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        return [DeltaTableTarget(spec["table"], options=_options(spec, env, admin=True))]

    def drop_target(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> None:
        """Delete the table's folder (and its bucket on S3), best effort."""
        table = str(spec["table"])
        try:
            if spec.get("server") == "secure":  # its folder only, as the root user
                fs, root = Storage(table, _options(spec, env, admin=True)).filesystem()
                fs.delete_dir(root.rsplit("/", 1)[0])
            elif table.startswith("s3://"):
                bucket = table.removeprefix("s3://").split("/", 1)[0]
                fs = pafs.S3FileSystem(
                    **_fs_kwargs(storage_options(table, env)), allow_bucket_deletion=True
                )
                fs.delete_dir(bucket)
            else:
                shutil.rmtree(table, ignore_errors=True)
        except Exception as err:  # best effort: say so, never fail the run for it
            _logger.warning("could not drop the test table %s: %s", table, type(err).__name__)

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        secured = [v for v in env if v.startswith("TXSINK_S3_SECURE_")]
        names = (ENDPOINT, ACCESS_KEY, SECRET_KEY, REGION, *secured)
        return {var: env[var] for var in names if var in env}


def _fs_kwargs(options: Mapping[str, str]) -> dict[str, Any]:
    endpoint = options["AWS_ENDPOINT_URL"]
    scheme, _, host = endpoint.partition("://")
    return {
        "access_key": options.get("AWS_ACCESS_KEY_ID"),
        "secret_key": options.get("AWS_SECRET_ACCESS_KEY"),
        "region": options.get("AWS_REGION") or "us-east-1",
        "endpoint_override": host.rstrip("/"),
        "scheme": scheme,
    }


ADAPTER = DeltaTesting()
