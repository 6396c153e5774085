"""Where a table lives: a local folder or ``s3://bucket/path``, reached two ways.

delta-rs reads and commits the table (its ``storage_options``); pyarrow's filesystems write,
list, size and delete the data files txsink names (the same options, translated here). The
options may hold keys: they are never logged, never put in handles, specs or reprs.

On S3, delta-rs 1.x commits each log entry with a conditional PUT (``If-None-Match: *``),
which AWS S3 and MinIO honour: no locking provider is needed, and
``AWS_S3_ALLOW_UNSAFE_RENAME`` must not be set (:func:`check_options` refuses it).

Both clients must trust the same server as the same identity:

* a private CA is delta-rs's own option ``certificate_path`` (a PEM file; delta-rs adds it to
  its roots), handed to pyarrow as ``tls_ca_file_path`` (pyarrow 20 or later);
* with an endpoint and no key in the options or the environment, delta-rs would not look
  at the AWS SDK's chain (profiles, ``AWS_SHARED_CREDENTIALS_FILE``) at all, while pyarrow
  does: ``AWS_FORCE_CREDENTIAL_LOAD=true`` makes delta-rs take the same chain.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from txsink.store import fsync_dir

__all__ = ["Storage", "check_options", "table_uri"]

#: Storage option names (upper-cased) that locate and authenticate an S3 server.
_S3_KEYS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
)
LOG_FOLDER = "_delta_log"
#: The first pyarrow whose S3FileSystem takes ``tls_ca_file_path``.
_PYARROW_WITH_CA = 20
#: delta-rs's storage option for a private CA (a PEM file). Matched in any case, passed in
#: lower case: delta-rs reads only that spelling.
CA_OPTION = "certificate_path"


def _key(name: str) -> str:
    """A storage option's name as delta-rs reads it: ``certificate_path`` as is, the
    object-store ones upper-cased (delta-rs lower-cases those itself)."""
    return CA_OPTION if name.lower() == CA_OPTION else name.upper()


def table_uri(uri: str) -> str:
    """``s3://`` URIs as given (without a trailing ``/``); local paths made absolute."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme in ("s3", "s3a"):
        if not parsed.netloc:
            raise ValueError(f"DeltaSink table {uri!r} names no bucket: use s3://bucket/path")
        return f"s3://{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
    if parsed.scheme == "file":
        return str(Path(urllib.parse.unquote(parsed.path)).resolve())
    if parsed.scheme:
        raise ValueError(
            f"DeltaSink table {uri!r}: txsink's Delta connector writes local paths and "
            "s3:// URIs only"
        )
    return str(Path(uri).resolve())


def check_options(options: Mapping[str, str]) -> None:
    """Refuse storage options that would make concurrent commits unsafe, and a private CA
    the data files' client (pyarrow) cannot take."""
    ca = any(key.lower() == CA_OPTION for key in options)
    if ca and int(pa.__version__.split(".")[0]) < _PYARROW_WITH_CA:
        raise ValueError(
            f"DeltaSink storage option {CA_OPTION!r} needs pyarrow {_PYARROW_WITH_CA} or later "
            f"(S3FileSystem's tls_ca_file_path; this is {pa.__version__}) to write the data "
            "files over TLS with that CA: upgrade pyarrow, or drop the option and set "
            "SSL_CERT_FILE to the CA bundle in the environment of the driver and every executor"
        )
    for key, value in options.items():
        if key.upper() == "AWS_S3_ALLOW_UNSAFE_RENAME" and str(value).lower() == "true":
            raise ValueError(
                "DeltaSink storage option AWS_S3_ALLOW_UNSAFE_RENAME=true lets two commits "
                "overwrite each other's log entry: remove it (delta-rs commits with a "
                "conditional PUT, which S3 and MinIO support)"
            )


@dataclass(frozen=True)
class Storage:
    """One table's storage: ``uri`` (no secret) and the ``options`` (secrets, never shown)."""

    uri: str
    options: Mapping[str, str]

    def __repr__(self) -> str:
        return f"Storage({self.uri!r})"

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    def delta_options(self) -> dict[str, str] | None:
        """``storage_options`` for delta-rs (the user's, plus the S3 ones from the
        environment delta-rs would read anyway, so both sides see one server)."""
        if not self.is_s3:
            return dict(self.options) or None
        merged = {_key(k): str(v) for k, v in self.options.items()}
        for key in _S3_KEYS:
            if key not in merged and os.environ.get(key):
                merged[key] = os.environ[key]
        endpoint = merged.get("AWS_ENDPOINT_URL", "")
        if endpoint:
            # delta-rs (like the AWS SDKs) prefers the S3-specific variable over
            # AWS_ENDPOINT_URL, and reads it from the environment even when the options
            # name an endpoint: a process with AWS_ENDPOINT_URL_S3 set for another server
            # would send the table's requests there. The options' endpoint wins.
            merged.setdefault("AWS_ENDPOINT_URL_S3", endpoint)
        if endpoint.startswith("http://") and "AWS_ALLOW_HTTP" not in merged:
            merged["AWS_ALLOW_HTTP"] = "true"
        if endpoint and not merged.get("AWS_ACCESS_KEY_ID"):
            # No key given: the SDK's chain (AWS_PROFILE, the shared-credentials file, a
            # role), as pyarrow takes it; delta-rs skips it for a custom endpoint otherwise.
            merged.setdefault("AWS_FORCE_CREDENTIAL_LOAD", "true")
        return merged

    @property
    def ca_file(self) -> str | None:
        """The private CA's PEM file of the ``certificate_path`` option, if given."""
        return next((str(v) for k, v in self.options.items() if k.lower() == CA_OPTION), None)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the table's root in it."""
        if not self.is_s3:
            return pafs.LocalFileSystem(), self.uri
        opts = self.delta_options() or {}
        kwargs: dict[str, Any] = {
            "access_key": opts.get("AWS_ACCESS_KEY_ID"),
            "secret_key": opts.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": opts.get("AWS_SESSION_TOKEN"),
            "region": opts.get("AWS_REGION") or "us-east-1",
            "allow_bucket_creation": False,
            "allow_bucket_deletion": False,
            "connect_timeout": 5,
            "request_timeout": 30,
        }
        endpoint = opts.get("AWS_ENDPOINT_URL")
        if endpoint:
            parsed = urllib.parse.urlparse(endpoint)
            kwargs["endpoint_override"] = parsed.netloc or parsed.path
            kwargs["scheme"] = parsed.scheme or "https"
        if self.ca_file is not None:
            kwargs["tls_ca_file_path"] = self.ca_file
        return pafs.S3FileSystem(**kwargs), self.uri.removeprefix("s3://")

    def files(self) -> Iterator[tuple[str, int]]:
        """Every data file under the table's root (not its log): relative path and size."""
        fs, root = self.filesystem()
        try:
            infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except FileNotFoundError:
            return
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            rel = info.path[len(root) :].lstrip("/")
            if rel.startswith(f"{LOG_FOLDER}/"):
                continue
            yield rel, int(info.size or 0)

    def size(self, path: str) -> int | None:
        """The size of a file under the root; None when it does not exist."""
        fs, root = self.filesystem()
        info = fs.get_file_info(f"{root}/{path}")
        return None if info.type == pafs.FileType.NotFound else int(info.size or 0)

    def delete(self, path: str) -> None:
        """Delete a file under the root; a file already gone is fine."""
        fs, root = self.filesystem()
        with contextlib.suppress(FileNotFoundError):
            fs.delete_file(f"{root}/{path}")

    def sync(self, path: str) -> None:
        """Make a written file durable: fsync it and its folder (local); an S3 PUT is."""
        if self.is_s3:
            return
        full = Path(self.uri, path)
        fd = os.open(full, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(full.parent)

    def create_log_entry(self, name: str, data: bytes) -> bool:
        """Create ``_delta_log/<name>`` holding ``data`` if it does not exist; False when it
        does (another commit took that version). The guards delta-rs commits with: a hard
        link of a synced temporary file locally, a conditional PUT (``If-None-Match: *``) on
        S3 (:mod:`~txsink.connectors.delta.evolve` writes a log entry itself)."""
        if self.is_s3:
            return self._put_if_absent(f"{LOG_FOLDER}/{name}", data)
        folder = Path(self.uri, LOG_FOLDER)
        temp = folder / f".{name}.{uuid.uuid4().hex}.tmp"
        with open(temp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(temp, folder / name)
        except FileExistsError:
            return False
        finally:
            temp.unlink()
        fsync_dir(folder)
        return True

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        import boto3
        from botocore.exceptions import ClientError

        opts = self.delta_options() or {}
        bucket, _, root = self.uri.removeprefix("s3://").partition("/")
        # A session of its own: boto3's default one keeps the environment (AWS_PROFILE, the
        # credentials file) of whichever call made it first in this process.
        client = boto3.session.Session().client(
            "s3",
            endpoint_url=opts.get("AWS_ENDPOINT_URL") or None,
            aws_access_key_id=opts.get("AWS_ACCESS_KEY_ID") or None,
            aws_secret_access_key=opts.get("AWS_SECRET_ACCESS_KEY") or None,
            aws_session_token=opts.get("AWS_SESSION_TOKEN") or None,
            region_name=opts.get("AWS_REGION") or "us-east-1",
            verify=self.ca_file if self.ca_file is not None else True,
        )
        try:
            client.put_object(
                Bucket=bucket, Key=f"{root}/{key}" if root else key, Body=data, IfNoneMatch="*"
            )
        except ClientError as err:
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (409, 412):  # exists, or a concurrent conditional PUT won
                return False
            raise
        return True

    def open_output(self, path: str) -> Any:
        """A writable stream for a new file under the root (folders made as needed)."""
        fs, root = self.filesystem()
        full = f"{root}/{path}"
        if not self.is_s3:
            fs.create_dir(full.rsplit("/", 1)[0], recursive=True)
        return fs.open_output_stream(full)
