"""The S3 connector's testing adapter: a manifest-following verifier, observer views, the
pipeline factory.

Registered in :mod:`txsink.connectors.s3.plugin`. The server comes from
``TXSINK_S3_ENDPOINT``, ``TXSINK_S3_ACCESS_KEY``, ``TXSINK_S3_SECRET_KEY`` and
``TXSINK_S3_REGION`` (what ``integration/services up`` writes). The ``secure`` variant
(:attr:`S3Testing.secure_variants`) writes under the allowed prefix of the secured server
(``TXSINK_S3_SECURE_*``: TLS with a private CA, a user whose policy is exactly
:func:`txsink.connectors.s3.grants.policy`), its txsink log under the allowed log prefix, and
is read back as the server's root user; both users' keys come from the server's AWS
shared-credentials file, never from a spec.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from txsink.connectors.s3.client import make_client, parse_s3_url
from txsink.connectors.s3.errors import describe
from txsink.connectors.s3.log_store import S3Store
from txsink.connectors.s3.markers import UPLOADS, upload_exists, uploads_in
from txsink.connectors.s3.readers import read_committed, read_manifests
from txsink.connectors.s3.sink import S3Sink
from txsink.kit import manifests
from txsink.testing.adapter import ConnectorTesting
from txsink.testing.observer import Snapshot, Target
from txsink.testing.verifiers import SinkVerifier

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

__all__ = [
    "ADAPTER",
    "S3ListingTarget",
    "S3ManifestTarget",
    "S3Testing",
    "S3Verifier",
    "client_options",
]

_logger = logging.getLogger(__name__)

ENDPOINT, ACCESS_KEY, SECRET_KEY, REGION = (
    "TXSINK_S3_ENDPOINT",
    "TXSINK_S3_ACCESS_KEY",
    "TXSINK_S3_SECRET_KEY",
    "TXSINK_S3_REGION",
)
#: The secured server's variables (``integration/services up s3_secure``): no secret.
SECURE_VARS = tuple(
    f"TXSINK_S3_SECURE_{name}"
    for name in (
        "ENDPOINT", "CA", "CREDENTIALS", "PROFILE", "ADMIN_PROFILE", "BUCKET", "PREFIX",
        "LOG_PREFIX", "REGION",
    )
)  # fmt: skip


def secure_client_options(env: Mapping[str, str], *, admin: bool = False) -> dict[str, Any]:
    """``boto3.client("s3", ...)`` options for the secured server: verified TLS, the app
    user's keys (``admin``: the root user's) read from its shared-credentials file now."""
    import configparser

    from botocore.config import Config

    profiles = configparser.ConfigParser()
    profiles.read(env["TXSINK_S3_SECURE_CREDENTIALS"])
    profile = profiles[
        env["TXSINK_S3_SECURE_ADMIN_PROFILE" if admin else "TXSINK_S3_SECURE_PROFILE"]
    ]
    return {
        "endpoint_url": env["TXSINK_S3_SECURE_ENDPOINT"],
        "aws_access_key_id": profile["aws_access_key_id"],
        "aws_secret_access_key": profile["aws_secret_access_key"],
        "region_name": env.get("TXSINK_S3_SECURE_REGION") or "us-east-1",
        "verify": env["TXSINK_S3_SECURE_CA"],
        "config": Config(s3={"addressing_style": "path"}, retries={"max_attempts": 2}),
    }


def _options(
    spec: Mapping[str, Any], env: Mapping[str, str], *, admin: bool = False
) -> dict[str, Any]:
    """The client options of a spec's server (``admin``: the secured server's root)."""
    if spec.get("server") == "secure":
        return secure_client_options(env, admin=admin)
    return client_options(env)


def client_options(env: Mapping[str, str], **config: Any) -> dict[str, Any]:
    """``boto3.client("s3", ...)`` options for the server ``env`` names (path-style
    addressing, short timeouts and two attempts, so a cut network shows quickly)."""
    from botocore.config import Config

    settings: dict[str, Any] = {
        "s3": {"addressing_style": "path"},
        "retries": {"max_attempts": 2, "mode": "standard"},
        "connect_timeout": 2,
        "read_timeout": 3,
    }
    settings.update(config)
    return {
        "endpoint_url": env[ENDPOINT],
        "aws_access_key_id": env.get(ACCESS_KEY, ""),
        "aws_secret_access_key": env.get(SECRET_KEY, ""),
        "region_name": env.get(REGION) or "us-east-1",
        "config": Config(**settings),
    }


def _secure_log_url(spec: Mapping[str, Any], env: Mapping[str, str]) -> str:
    """A secured target's txsink log: under the user's allowed log prefix, named after the
    target's folder."""
    loc = parse_s3_url(spec["url"])
    folder = loc.prefix.rstrip("/").removesuffix("/out").rsplit("/", 1)[-1]
    return f"s3://{loc.bucket}/{env['TXSINK_S3_SECURE_LOG_PREFIX']}{folder}/"


@dataclass
class S3Verifier:
    """An :class:`~txsink.connectors.s3.S3Sink` prefix, read through its manifests.

    lingering = open multipart uploads under the prefix plus the sink's upload markers
    (``<prefix>_txsink/uploads/``). ``client_options`` go to ``boto3.client("s3", ...)``
    (without them boto3's environment chain decides).
    """

    url: str
    expected: Iterable[int]
    uid: str | None = None
    id_column: str = "id"
    client_options: Mapping[str, Any] | None = field(default=None)

    def expected_ids(self) -> Iterable[int]:
        return list(self.expected)

    def read_ids(self) -> list[int]:
        table = self.read_table()
        if self.id_column not in table.column_names:
            return []
        return [int(v) for v in table.column(self.id_column).to_pylist()]

    def read_table(self, columns: list[str] | None = None) -> Any:
        """The committed objects (those the manifests name), read with pyarrow; the
        ``columns`` wanted (default: all)."""
        table = read_committed(self.url, self.uid, client_options=self.client_options)
        return table if columns is None else table.select(columns)

    def epochs(self) -> int:
        return len(read_manifests(self.url, self.uid, self.client_options))

    def lingering(self) -> int:
        loc = parse_s3_url(self.url)
        client = make_client(self.client_options)
        # Listed without Prefix: MinIO reads Prefix as an exact key.
        uploads = sum(
            1
            for key, upload_id in uploads_in(client, loc.bucket)
            if key.startswith(loc.prefix) and upload_exists(client, loc.bucket, key, upload_id)
        )
        markers = 0
        for listing in client.get_paginator("list_objects_v2").paginate(
            Bucket=loc.bucket, Prefix=f"{loc.prefix}{UPLOADS}"
        ):
            markers += len(listing.get("Contents", []))
        return uploads + markers


class S3ManifestTarget:
    """An S3 sink's prefix read through its epoch manifests, the way ``read_committed`` does.

    A new manifest is read once; its rows are counted from the manifest (the objects it names
    are read only by the final verifier). ``uid``: only this sink's manifests.
    """

    counts_rows = True
    guaranteed = True

    def __init__(
        self,
        url: str,
        *,
        uid: str | None = None,
        name: str = "s3",
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        loc = parse_s3_url(url)
        self.bucket = loc.bucket
        self.prefix = loc.prefix
        self.uid = uid
        self.name = name
        self.client_options = client_options
        self._client: Any = None
        self._rows: dict[int, int] = {}
        self._read: set[str] = set()

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        if self._client is None:
            self._client = make_client(self.client_options)
        folder = f"{self.prefix}{manifests.FOLDER}/{self.uid + '-' if self.uid else ''}"
        for page in self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=folder
        ):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                if key in self._read or not key.endswith(".json"):
                    continue
                doc = json.loads(
                    self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                )
                if self.uid is not None and doc.get("uid") != self.uid:
                    continue
                self._rows[int(doc["epoch"])] = self._rows.get(int(doc["epoch"]), 0) + int(
                    doc["rows"]
                )
                self._read.add(key)
        return Snapshot(dict(self._rows))

    def close(self) -> None:
        self._client = None


_EPOCH_DIR = re.compile(r"(?:^|/)epoch=(\d+)/")


class S3ListingTarget:
    """A boundary view: an S3 reader that lists the prefix and ignores the manifests.

    ``Snapshot.rows`` counts completed objects per epoch (from ``epoch=<e>/`` in their keys).
    It can show an epoch's objects before its manifest exists: during the commit step, and
    until the restart's recovery after a crash in the middle of the commit.
    """

    counts_rows = False
    guaranteed = False

    def __init__(
        self,
        url: str,
        *,
        name: str = "s3-listing",
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        loc = parse_s3_url(url)
        self.bucket = loc.bucket
        self.prefix = loc.prefix
        self.name = name
        self.client_options = client_options
        self._client: Any = None

    def sample(self, epoch_of: Mapping[int, int]) -> Snapshot:
        if self._client is None:
            self._client = make_client(self.client_options)
        objects: Counter[int] = Counter()
        for page in self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        ):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(self.prefix) :]
                if rel.startswith("_"):
                    continue  # _manifests/, _txsink/
                match = _EPOCH_DIR.search(rel)
                if match:
                    objects[int(match.group(1))] += 1
        return Snapshot(dict(objects))

    def close(self) -> None:
        self._client = None


class S3Testing(ConnectorTesting):
    """A fresh bucket per target, written under ``out/``."""

    name: ClassVar[str] = "s3"
    env_vars: ClassVar[tuple[str, ...]] = (ENDPOINT,)
    services: ClassVar[tuple[str, ...]] = ("s3",)
    variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {"parquet": {"format": "parquet"}}
    secure_variants: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "secure": {"format": "parquet", "server": "secure"},
    }
    secure_services: ClassVar[tuple[str, ...]] = ("s3_secure",)

    def new_target(
        self, workdir: Path, tag: str, env: Mapping[str, str], **options: Any
    ) -> dict[str, Any]:
        folder = f"txsink-{tag}".replace("_", "-").lower()[:63]
        if options.get("server") == "secure":  # a folder under the user's allowed prefix
            url = f"s3://{env['TXSINK_S3_SECURE_BUCKET']}/{env['TXSINK_S3_SECURE_PREFIX']}{folder}/out"
        else:
            make_client(client_options(env)).create_bucket(Bucket=folder)
            url = f"s3://{folder}/out"
        return {
            "kind": self.name,
            "server": options.get("server"),
            "url": url,
            "uid": options.get("uid", "s3"),
            "format": options.get("format", "parquet"),
            "partition_by": list(options.get("partition_by", ())),
        }

    def sink_options(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Without ``server`` (which of the harness's servers: the adapter's key)."""
        return {k: v for k, v in super().sink_options(spec).items() if k != "server"}

    def build_sink(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> S3Sink:
        return S3Sink(
            spec["url"],
            spec.get("uid", "s3"),
            format=spec.get("format", "parquet"),
            partition_by=spec.get("partition_by", ()),
            client_options=_options(spec, env),
        )

    def verifier(
        self,
        spec: Mapping[str, Any],
        expected: Iterable[int],
        env: Mapping[str, str],
        *,
        log: str | None = None,
    ) -> SinkVerifier:
        return S3Verifier(
            spec["url"],
            expected,
            spec.get("uid", "s3"),
            client_options=_options(spec, env, admin=True),
        )

    def observer_targets(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> list[Target]:
        direct = _options(spec, env, admin=True)
        return [
            S3ManifestTarget(spec["url"], uid=spec.get("uid", "s3"), client_options=direct),
            S3ListingTarget(spec["url"], client_options=direct),
        ]

    def log_store(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> S3Store:
        """The txsink log in the target's bucket, under ``txlog/``: the crash matrix's
        driver-side points then crash with the log on S3 too. On the secured server: under
        the user's allowed log prefix, as the user."""
        loc = parse_s3_url(spec["url"])
        if spec.get("server") == "secure":
            return S3Store(_secure_log_url(spec, env), client_options=_options(spec, env))
        return S3Store(f"s3://{loc.bucket}/txlog", client_options=client_options(env))

    def drop_target(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> None:
        """Abort the bucket's multipart uploads, delete its objects, then the bucket.

        Best effort: whatever fails is left (a later run uses a new bucket anyway). On the
        secured server, the target's folder and its log folder only, as the root user.
        """
        if spec.get("server") == "secure":
            self._purge_secure(spec, env)
            return
        bucket = parse_s3_url(str(spec["url"])).bucket
        try:
            client = make_client(client_options(env))
            for key, upload_id in uploads_in(client, bucket):
                with contextlib.suppress(Exception):
                    client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                keys: list[ObjectIdentifierTypeDef] = [
                    {"Key": o["Key"]} for o in page.get("Contents", []) if "Key" in o
                ]
                if keys:
                    with contextlib.suppress(Exception):
                        client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
            client.delete_bucket(Bucket=bucket)
        except Exception as err:  # best effort: say so, never fail the run for it
            _logger.warning("could not drop the test bucket %s: %s", bucket, describe(err))

    def _purge_secure(self, spec: Mapping[str, Any], env: Mapping[str, str]) -> None:
        loc = parse_s3_url(str(spec["url"]))
        folder = loc.prefix.rstrip("/").removesuffix("/out") + "/"
        log_folder = parse_s3_url(_secure_log_url(spec, env)).prefix
        try:
            client = make_client(_options(spec, env, admin=True))
            for key, upload_id in uploads_in(client, loc.bucket):
                if key.startswith(folder):
                    with contextlib.suppress(Exception):
                        client.abort_multipart_upload(
                            Bucket=loc.bucket, Key=key, UploadId=upload_id
                        )
            for prefix in (folder, log_folder):
                for page in client.get_paginator("list_objects_v2").paginate(
                    Bucket=loc.bucket, Prefix=prefix
                ):
                    for obj in page.get("Contents", []):
                        with contextlib.suppress(Exception):
                            client.delete_object(Bucket=loc.bucket, Key=obj["Key"])
        except Exception as err:  # best effort: say so, never fail the run for it
            _logger.warning("could not purge the test folder %s: %s", folder, describe(err))

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The server for the sinks, and for boto3's own chain (a txsink log on S3)."""
        secured = {var: env[var] for var in SECURE_VARS if var in env}
        if ENDPOINT not in env:
            return secured
        out = {var: env[var] for var in (ENDPOINT, ACCESS_KEY, SECRET_KEY, REGION) if var in env}
        out.update(
            AWS_ACCESS_KEY_ID=env.get(ACCESS_KEY, ""),
            AWS_SECRET_ACCESS_KEY=env.get(SECRET_KEY, ""),
            AWS_ENDPOINT_URL_S3=env[ENDPOINT],
            AWS_DEFAULT_REGION=env.get(REGION) or "us-east-1",
        )
        return {**out, **secured}


ADAPTER = S3Testing()
