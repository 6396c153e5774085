"""The txsink log on S3: AWS S3 or an S3-compatible server (MinIO).

Use it by giving the log an ``s3://bucket/prefix`` location::

    from txsink import Coordinator, open_log
    from txsink.connectors.s3.log_store import S3Store

    # Credentials, region and endpoint from boto3's usual chain: environment
    # (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
    # AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL for MinIO), profile, instance role.
    Coordinator(sinks, log="s3://my-bucket/pipelines/orders/txlog")

    # Explicit settings: ``client_options`` go to ``boto3.client("s3", ...)`` as given.
    store = S3Store(
        "s3://my-bucket/pipelines/orders/txlog",
        client_options={
            "endpoint_url": "http://127.0.0.1:9000",
            "aws_access_key_id": "...",
            "aws_secret_access_key": "...",
            "region_name": "us-east-1",
        },
    )
    Coordinator(sinks, log=store)
    open_log("s3://my-bucket/pipelines/orders/txlog", client_options={...})  # the same store

How each :class:`~txsink.log.LogStore` operation maps to S3 (a record ``key`` is
stored as the object ``<prefix><key>``):

* ``create`` — ``PutObject`` with ``If-None-Match: *``. S3 answers 412
  ``PreconditionFailed`` when the key exists: ``create`` returns False. Because
  botocore may resend a PUT whose first attempt did succeed (its answer was lost),
  every create carries a random token in its object metadata and a 412 is
  checked against it: the call returns True exactly when *its* bytes are the
  record. AWS answers 409 ``ConditionalRequestConflict`` when a conflicting
  write races on the key; the create is then retried (a few times, with
  backoff) and settles on 200 or 412.
* ``read`` — ``GetObject``; ``NoSuchKey`` reads as ``None``.
* ``list`` — ``ListObjectsV2`` pages (``page_size`` keys per request), sorted.
* ``delete`` — ``DeleteObject`` (deleting a missing key is not an error).

Conditional writes are checked, not assumed: a store that ignores
``If-None-Match`` silently overwrites, and then two drivers could both decide
one epoch — the fencing of zombie drivers and the create-if-absent commit point
would be gone without any error. Before its first write, a store probes its
location once per process (PUT a probe key, PUT it again conditionally: the
second must be refused; the probe key is deleted) and raises
:class:`ConditionalWritesUnsupportedError` otherwise. Reading the log (for
example ``txsink status``) needs no probe and no write permission.

Secrets: ``client_options`` are handed to boto3 and not kept; ``repr`` shows
them with ``aws_secret_access_key`` / ``aws_session_token`` as ``***``. No
message, log line or record names a secret, and a store refuses to be pickled
(it belongs to the driver; a pickle would carry the client's credentials).

Errors: every botocore failure becomes a :class:`~txsink.errors.LogError` that
names the operation, the key and the location, mapped by S3 error code or HTTP
status (no such bucket, access denied, throttled, endpoint unreachable, no
credentials).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

from txsink.connectors.s3.client import make_client, parse_s3_url, safe_options
from txsink.errors import ConditionalWritesUnsupportedError, ConfigurationError, LogError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["ConditionalWritesUnsupportedError", "S3Store"]

_logger = logging.getLogger(__name__)

#: Object metadata key (``x-amz-meta-txsink-writer``) holding the create call's token.
_WRITER_META = "txsink-writer"
#: Probe objects live directly under the log prefix, outside ``epochs/`` and ``meta.json``,
#: so a reader of the log never sees one (and prefix-scoped permissions still cover them).
_PROBE_PREFIX = "_txsink-probe-"

_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidSecurity",
    }
)
_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestThrottled",
        "ServiceUnavailable",
    }
)
_NOT_IMPLEMENTED = frozenset({"NotImplemented"})

# Locations whose conditional writes were probed successfully in this process.
_probed: set[tuple[str, str, str]] = set()
_probe_lock = threading.Lock()


class S3Store:
    """A :class:`~txsink.log.LogStore` on S3; see the module docstring for the contract.

    Args:
        url: ``s3://bucket/prefix`` (``s3a://`` is accepted too); the log's
            records are the objects under ``prefix/``.
        client_options: keyword arguments for ``boto3.client("s3", ...)``
            (``endpoint_url``, ``aws_access_key_id``, ``aws_secret_access_key``,
            ``aws_session_token``, ``region_name``, ``config``...). Without them
            boto3's chain decides. Not kept after the client is built.
        client: an S3 client to use instead (then ``client_options`` must be empty),
            e.g. one from your own ``boto3.Session``.
        page_size: keys per ``ListObjectsV2`` request (1..1000).
        conflict_retries: how often a create answered 409
            ``ConditionalRequestConflict`` is retried before giving up.
    """

    def __init__(
        self,
        url: str,
        *,
        client_options: Mapping[str, Any] | None = None,
        client: S3Client | None = None,
        page_size: int = 1000,
        conflict_retries: int = 5,
    ) -> None:
        try:
            loc = parse_s3_url(url)
        except ValueError as err:
            raise ConfigurationError(f"txsink log location: {err}") from err
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be within 1..1000, got {page_size}")
        if conflict_retries < 0:
            raise ValueError(f"conflict_retries must be >= 0, got {conflict_retries}")
        self.bucket = loc.bucket
        self.prefix = loc.prefix
        self.location = loc.url
        self.page_size = page_size
        self.conflict_retries = conflict_retries
        self._shown_options = safe_options(client_options)
        if client is not None:
            if client_options:
                raise ValueError("S3Store: pass client_options or client, not both")
            self._client = client
        else:
            try:
                self._client = make_client(client_options)
            except Exception as err:  # botocore's own errors for bad options (no secrets)
                raise ConfigurationError(
                    f"cannot build an S3 client for the txsink log at {self.location} with "
                    f"client_options={self._shown_options}: {type(err).__name__}: {err}"
                ) from err
        self.endpoint = _redact_url(self._client.meta.endpoint_url)

    def __repr__(self) -> str:
        options = f", client_options={self._shown_options!r}" if self._shown_options else ""
        return f"S3Store({self.location!r}, endpoint={self.endpoint!r}{options})"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"{self!r} cannot be pickled: the txsink log is used by the driver only, and a "
            "pickle would carry the S3 client's credentials"
        )

    # -- LogStore ------------------------------------------------------------------------

    def create(self, key: str, data: bytes) -> bool:
        """Create ``key`` unless it exists; True if this call created it (see module doc)."""
        self.check_conditional_writes()
        return self._create(self._object(key), data, "create")

    def read(self, key: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        name = self._object(key)
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=name)["Body"]
            try:
                return body.read()
            finally:
                body.close()
        except ClientError as err:
            if _code(err) == "NoSuchKey":
                return None
            self._fail("read", name, err)
        except BotoCoreError as err:
            self._fail("read", name, err)

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted (keys are relative to the log)."""
        from botocore.exceptions import BotoCoreError, ClientError

        start = len(self.prefix)
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket,
                Prefix=self.prefix + prefix,
                PaginationConfig={"PageSize": self.page_size},
            )
            for page in pages:
                keys.extend(obj["Key"][start:] for obj in page.get("Contents", ()))
        except (ClientError, BotoCoreError) as err:
            self._fail("list", self.prefix + prefix, err)
        return sorted(keys)

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        name = self._object(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=name)
        except (ClientError, BotoCoreError) as err:
            self._fail("delete", name, err)

    # -- the conditional-write probe -------------------------------------------------------

    def check_conditional_writes(self) -> None:
        """Make sure the store refuses a second create of a key; once per process and location.

        Raises:
            ConditionalWritesUnsupportedError: the store overwrote the key, or does not
                implement ``If-None-Match``.
            LogError: the probe itself failed (no bucket, access denied, unreachable).
        """
        ident = (self.endpoint, self.bucket, self.prefix)
        with _probe_lock:
            if ident in _probed:
                return
            # Under the lock: threads of one process probe a location once, not N times.
            self._probe()
            _probed.add(ident)

    def _probe(self) -> None:
        name = f"{self.prefix}{_PROBE_PREFIX}{uuid.uuid4().hex}"
        written = False
        try:
            written = self._create(name, b"txsink conditional-write probe 1\n", "probe")
            if not written:  # a fresh random key cannot exist
                self._unsupported(f"the first conditional PUT of a new key ({name}) was refused")
            if self._create(name, b"txsink conditional-write probe 2\n", "probe"):
                self._unsupported(
                    f"a second PUT with If-None-Match: * of {name} succeeded and overwrote it"
                )
        finally:
            if written:
                try:
                    self.delete(name[len(self.prefix) :])
                except LogError as err:
                    _logger.warning("could not delete the probe object %s: %s", name, err)

    def _unsupported(self, what: str) -> NoReturn:
        raise ConditionalWritesUnsupportedError(
            f"the S3 store at {self.endpoint} does not honour conditional writes "
            f"(If-None-Match: *), so it cannot hold the txsink log at {self.location}: {what}. "
            "The log's create-if-absent is the commit point of every epoch and what fences a "
            "zombie driver; on this store two drivers could both decide an epoch. Put the log "
            "on AWS S3, on a MinIO release from late 2024 or newer, or on another location "
            "(a local or mounted filesystem path); see docs/log-on-s3.md"
        )

    # -- helpers -------------------------------------------------------------------------

    def _object(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad log key {key!r}")
        return self.prefix + key

    def _create(self, name: str, data: bytes, op: str) -> bool:
        """PUT ``name`` if absent. True iff this call's bytes are the object afterwards."""
        from botocore.exceptions import BotoCoreError, ClientError

        token = uuid.uuid4().hex
        for attempt in range(self.conflict_retries + 1):
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=data,
                    IfNoneMatch="*",
                    ContentType="application/json",
                    Metadata={_WRITER_META: token},
                )
                return True
            except ClientError as err:
                code, status = _code(err), _status(err)
                if code == "PreconditionFailed" or status == 412:
                    owner = self._owner_token(name)
                    if owner is not None:
                        # Ours when an earlier attempt of this call (a botocore retry of
                        # a PUT whose answer was lost) created it.
                        return owner == token
                    # Deleted between the 412 and the HEAD: try again.
                elif code in _NOT_IMPLEMENTED or status == 501:
                    self._unsupported(f"the server answered {code} (HTTP {status}) to PutObject")
                elif not (code == "ConditionalRequestConflict" or status == 409):
                    self._fail(op, name, err)
            except BotoCoreError as err:
                self._fail(op, name, err)
            # 409: a concurrent write on the key is in flight; it settles shortly.
            time.sleep(min(1.0, 0.05 * 2**attempt) * (0.5 + random.random()))  # noqa: S311
        raise LogError(
            f"txsink log: the create of {name} in {self.location} did not settle in "
            f"{self.conflict_retries + 1} attempts (409 ConditionalRequestConflict, or the key "
            "deleted between a 412 and its check): something else keeps writing or deleting "
            "that key. Only txsink should write under the log's prefix",
        )

    def _owner_token(self, name: str) -> str | None:
        """The create token stored with ``name``; ``""`` if it has none, None if it is gone."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=name)
        except ClientError as err:
            if _status(err) == 404 or _code(err) in ("NoSuchKey", "404", "NotFound"):
                return None
            self._fail("create", name, err)
        except BotoCoreError as err:
            self._fail("create", name, err)
        return head.get("Metadata", {}).get(_WRITER_META, "")

    def _fail(self, op: str, name: str, err: Exception) -> NoReturn:
        raise _log_error(op, f"s3://{self.bucket}/{name}", self.bucket, self.endpoint, err) from err


def _code(err: Any) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _status(err: Any) -> int:
    return int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` part."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _log_error(op: str, where: str, bucket: str, endpoint: str, err: Exception) -> LogError:
    """A :class:`LogError` for a botocore failure, mapped by error code / status / type.

    Only codes, statuses, the server's message, the endpoint and the object's URL go into
    the message: never ``str()`` of a request, which could carry signed headers.
    """
    from botocore.exceptions import (
        ClientError,
        HTTPClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )
    from botocore.exceptions import ConnectionError as BotoConnectionError

    head = f"txsink log: S3 {op} of {where} failed"
    if isinstance(err, ClientError):
        code, status = _code(err), _status(err)
        said = str(err.response.get("Error", {}).get("Message", "")).strip()
        detail = f"{code or 'error'} (HTTP {status})" + (f": {said}" if said else "")
        if code == "NoSuchBucket":
            hint = (
                f"bucket {bucket!r} does not exist at {endpoint}: create it, or fix the log "
                "location (and endpoint_url / AWS_ENDPOINT_URL_S3 for an S3-compatible server)"
            )
        elif code in _ACCESS_CODES or status == 403:
            hint = (
                "access denied: check the credentials (boto3's chain or client_options) and "
                "that they allow s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket "
                "on the log's prefix"
                + (
                    " (without s3:ListBucket, S3 answers the read of a missing record with "
                    "AccessDenied instead of NoSuchKey)"
                    if op == "read"
                    else ""
                )
            )
        elif code in _THROTTLE_CODES or status in (429, 503):
            hint = (
                "S3 throttled the request beyond botocore's retries: retry later, or give the "
                'client more retries (client_options={"config": botocore.config.Config('
                'retries={"mode": "adaptive", "max_attempts": 10})})'
            )
        else:
            hint = "see the S3 error code above"
        return LogError(f"{head}: {detail}; {hint}")
    if isinstance(err, (NoCredentialsError, PartialCredentialsError)):
        return LogError(
            f"{head}: {type(err).__name__}: no usable AWS credentials. Set AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY, a profile or an instance role, or pass client_options",
        )
    if isinstance(err, (BotoConnectionError, HTTPClientError)):
        return LogError(
            f"{head}: cannot reach the S3 endpoint {endpoint} ({type(err).__name__}): check "
            "endpoint_url / AWS_ENDPOINT_URL_S3, the network and that the server is up",
        )
    return LogError(f"{head}: {type(err).__name__}: {err}")
