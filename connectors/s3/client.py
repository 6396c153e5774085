"""S3 plumbing shared by the S3 log store and the S3 connector: URLs and clients.

Credentials come from boto3's usual chain (environment, profile, instance
role) unless given in ``client_options``; those options are passed to
``boto3.client("s3", ...)`` untouched and are never logged, written to the
txsink log or put in a ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["SECRET_OPTIONS", "S3Location", "make_client", "parse_s3_url", "safe_options"]

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
