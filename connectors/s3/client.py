"""S3 plumbing shared by the S3 log store and the S3 sink: URLs, clients and their options.

Credentials come from boto3's usual chain (environment, profile, instance
role) unless given in ``client_options``; those options are passed to
``boto3.client("s3", ...)`` untouched and are never logged, written to the
txsink log or put in a ``repr``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = [
    "COMPLETE_TIMEOUT_S",
    "SECRET_OPTIONS",
    "S3Location",
    "cached_client",
    "completing_options",
    "make_client",
    "parse_s3_url",
    "safe_options",
]

#: ``client_options`` keys whose values must never appear in logs, errors or reprs.
SECRET_OPTIONS = frozenset({"aws_secret_access_key", "aws_session_token"})


class S3Location(tuple[str, str]):
    """``(bucket, prefix)``; the prefix is empty or ends with ``/``."""

    __slots__ = ()

    def __new__(cls, bucket: str, prefix: str) -> S3Location:
        prefix = prefix.strip("/")
        return super().__new__(cls, (bucket, f"{prefix}/" if prefix else ""))

    def __getnewargs__(self) -> tuple[str, str]:  # pickle: rebuild through __new__
        return (self[0], self[1])

    @property
    def bucket(self) -> str:
        return self[0]

    @property
    def prefix(self) -> str:
        return self[1]

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def parse_s3_url(url: str) -> S3Location:
    """``s3://bucket/some/prefix`` → ``S3Location("bucket", "some/prefix/")``."""
    for scheme in ("s3://", "s3a://"):
        if url.startswith(scheme):
            rest = url[len(scheme) :]
            break
    else:
        raise ValueError(f"not an S3 URL: {url!r} (expected s3://bucket/prefix)")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"S3 URL {url!r} has no bucket (expected s3://bucket/prefix)")
    return S3Location(bucket, prefix)


def safe_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``client_options`` with secrets replaced by ``***``, for reprs and error messages."""
    return {k: ("***" if k in SECRET_OPTIONS else v) for k, v in (options or {}).items()}


def make_client(options: Mapping[str, Any] | None = None) -> S3Client:
    """A boto3 S3 client: ``options`` go to ``boto3.client("s3", ...)`` as given.

    Without options the client follows boto3's chain, including
    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` for S3-compatible servers.
    A fresh session per client: boto3's default session is not thread-safe.
    """
    import boto3

    session = boto3.session.Session()
    return session.client("s3", **dict(options or {}))


# -- clients: one per process and options, never pickled -------------------------------------

#: Read timeout of CompleteMultipartUpload requests (see :func:`completing_options`).
COMPLETE_TIMEOUT_S = 600.0
_CLIENTS: dict[tuple[int, str], tuple[str, S3Client]] = {}
_CLIENTS_LOCK = threading.Lock()

#: The environment that boto3's credential chain reads (besides ``client_options``).
_CHAIN_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CA_BUNDLE",
)


def _chain_fingerprint() -> str:
    """What boto3's credential chain would read now: its variables, and the identity and
    change time of the shared-credentials and config files. A client is built with the
    credentials of the moment; when these change (a rotated secret written to the file, a
    new profile), the cached client must not go on signing with the old ones."""
    parts: list[Any] = [os.environ.get(name) for name in _CHAIN_VARIABLES]
    home = os.path.expanduser("~")
    for variable, default in (
        ("AWS_SHARED_CREDENTIALS_FILE", os.path.join(home, ".aws", "credentials")),
        ("AWS_CONFIG_FILE", os.path.join(home, ".aws", "config")),
    ):
        path = os.path.expanduser(os.environ.get(variable) or default)
        try:
            st = os.stat(path)
        except OSError:
            parts.append(None)
            continue
        parts.append((st.st_ino, st.st_size, st.st_mtime_ns))
    # In memory only, never logged: a digest, so the process holds no second copy.
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def cached_client(options: Mapping[str, Any] | None) -> S3Client:
    """The process's client for ``options`` (built once; a sink's tasks share it).

    Keyed by the process id too: a forked Python worker must not reuse its parent's
    connections. Options that cannot be pickled (so not fingerprinted) get a new client.
    A client is built again when boto3's credential chain changed since
    (:func:`_chain_fingerprint`): a driver restarted in the same process (``txsink
    recover``, a notebook, a reused Spark Python worker) signs with the current secret.
    """
    try:
        fingerprint = hashlib.sha256(pickle.dumps(dict(options or {}))).hexdigest()
    except Exception:  # unpicklable options: no sharing
        return make_client(options)
    key = (os.getpid(), fingerprint)
    chain = _chain_fingerprint()
    with _CLIENTS_LOCK:
        found = _CLIENTS.get(key)
        if found is None or found[0] != chain:
            found = _CLIENTS[key] = (chain, make_client(options))
        return found[1]


def completing_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``options`` with a read timeout of at least :data:`COMPLETE_TIMEOUT_S`.

    For ``CompleteMultipartUpload``: a complete can take minutes on S3, and a client that
    gives up mid-request makes the server cancel it: MinIO was seen to drop the upload's
    parts on such a cancelled complete without creating the object, so the decided rows
    were lost. Waiting long is the only safe answer; retries of the request stay as
    configured.
    """
    from botocore.config import Config

    out = dict(options or {})
    given = out.get("config")
    timeout = max(float(getattr(given, "read_timeout", None) or 60), COMPLETE_TIMEOUT_S)
    longer = Config(read_timeout=timeout)
    out["config"] = given.merge(longer) if given is not None else longer
    return out
