"""S3 failures, classified once: for the sink (typed sink errors) and the log (LogError).

Every botocore failure is classified by S3 error code, HTTP status and exception type, never
by message text (:func:`classify`). The sink and the log store turn a class into their own
typed error with the fix (:func:`sink_error`, :func:`log_error`). Messages carry codes,
statuses, the server's message, the key and the endpoint without user info
(:func:`redact_url`): never ``str()`` of a request, which could carry signed headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from txsink.errors import (
    CommitError,
    ConfigurationError,
    EpochBlockedError,
    LogError,
    LogUnavailableError,
    RetryableError,
    TxsinkError,
    UnreachableError,
)

__all__ = [
    "Kind",
    "classify",
    "describe",
    "error_code",
    "is_missing",
    "is_no_such_upload",
    "is_precondition_failed",
    "log_error",
    "redact_url",
    "sink_error",
]

Kind = Literal[
    "credentials",  # no usable credentials in boto3's chain or the options
    "unreachable",  # the endpoint cannot be connected to
    "connection",  # a connection broke or a read timed out
    "no-bucket",
    "denied",
    "throttled",  # SlowDown & co., 429, 503
    "transient",  # other server-side trouble worth a retry
    "other",
]

_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidSecurity",
        "403",
    }
)
#: Of the denied codes, those that refuse the key itself (changed, deleted or expired),
#: not a right of the policy.
_KEY_REFUSED_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
     "TokenRefreshRequired"}
)  # fmt: skip
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
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "XMinioServerNotInitialized",
        "ConditionalRequestConflict",  # AWS: a conditional write raced another one; retry
    }
)
_MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def error_code(err: BaseException) -> tuple[str, int | None]:
    """(S3 error code, HTTP status) of a botocore error, or ("", None)."""
    response = getattr(err, "response", None)
    if not isinstance(response, dict):
        return "", None
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code, status if isinstance(status, int) else None


def is_missing(err: BaseException) -> bool:
    """The object (not the bucket) does not exist: GET's NoSuchKey, HEAD's bare 404."""
    return error_code(err)[0] in _MISSING_CODES


def is_precondition_failed(err: BaseException) -> bool:
    """``If-None-Match: *`` refused the write: the key exists."""
    code, status = error_code(err)
    return code == "PreconditionFailed" or status == 412


def is_no_such_upload(err: BaseException) -> bool:
    return error_code(err)[0] in ("NoSuchUpload", "404")


def classify(err: BaseException) -> Kind:
    """What kind of failure ``err`` is, by exception type, S3 error code and HTTP status."""
    from botocore import exceptions as bx

    if isinstance(err, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return "credentials"
    if isinstance(err, (bx.EndpointConnectionError, bx.ConnectTimeoutError)):
        return "unreachable"
    if isinstance(err, (bx.ConnectionError, bx.ReadTimeoutError, bx.HTTPClientError)):
        return "connection"
    code, status = error_code(err)
    if code == "NoSuchBucket":
        return "no-bucket"
    if code in _DENIED_CODES or status == 403:
        return "denied"
    if code in _THROTTLE_CODES or status in (429, 503):
        return "throttled"
    if code in _TRANSIENT_CODES or (status is not None and status >= 500):
        return "transient"
    return "other"


def describe(err: BaseException) -> str:
    """The S3 code and message, or the exception type: never request headers or options."""
    code, status = error_code(err)
    if code or status:
        message = str(getattr(err, "response", {}).get("Error", {}).get("Message", ""))
        detail = f": {message.strip().rstrip('.')}" if message.strip() else ""
        return f"{code or 'HTTP'} (HTTP {status}){detail}"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


def redact_url(url: str) -> str:
    """``url`` without a ``user:password@`` part (botocore ignores it; it must not show)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def sink_error(
    err: Exception, doing: str, where: str, *, bucket: str, context: Mapping[str, Any]
) -> TxsinkError:
    """The S3 sink's typed error for a failed call: ``cannot <doing> <where>: ...`` + the fix.

    Fatal misconfiguration is a ConfigurationError, a passing failure a RetryableError; in
    the commit phase anything else is a CommitError (the decision stands, recovery retries).
    """
    if isinstance(err, TxsinkError):
        return err
    phase = context.get("phase")
    what = f"cannot {doing} {where}: {describe(err)}"
    kind = classify(err)
    if kind in ("denied", "credentials", "no-bucket") and phase == "commit":
        refused = kind == "denied" and error_code(err)[0] in _KEY_REFUSED_CODES
        # The key itself, not the policy: a rotated, deleted or expired one.
        return _blocked(what, "key-refused" if refused else kind, bucket, context)
    if kind == "credentials":
        return ConfigurationError(
            f"{what}. No usable AWS credentials: pass aws_access_key_id and "
            "aws_secret_access_key in client_options, or set them up in boto3's chain "
            "(environment, profile, instance role) on the driver and every executor",
            **context,
        )
    if kind == "no-bucket":
        return ConfigurationError(
            f"{what}. The bucket {bucket!r} does not exist at this endpoint: "
            "create it, or fix the URL, endpoint_url or region_name",
            **context,
        )
    if kind == "denied":
        return ConfigurationError(
            f"{what}. Check the credentials and the policy: the sink needs s3:ListBucket, "
            "s3:ListBucketMultipartUploads, s3:GetObject, s3:PutObject, s3:DeleteObject, "
            "s3:AbortMultipartUpload and s3:ListMultipartUploadParts on the prefix",
            **context,
        )
    if kind == "unreachable":
        message = (
            f"{what}. The endpoint cannot be reached: check endpoint_url (or "
            "AWS_ENDPOINT_URL_S3), the network and the server"
        )
        if phase == "check":  # refused before anything is written; a restart may pass it
            return UnreachableError(message, **context)
        return RetryableError(message, **context)
    if kind in ("connection", "throttled", "transient"):
        return RetryableError(f"{what}. A transient S3 failure: it is retried", **context)
    if phase == "commit":
        return CommitError(
            f"{what}. The decision stands: fix the cause and restart the query, "
            "its recovery retries the commit",
            **context,
        )
    return ConfigurationError(
        f"{what}. The server refused the request: check that it supports multipart uploads "
        "with CRC32 checksums and conditional writes (If-None-Match)",
        **context,
    )


def log_error(op: str, where: str, bucket: str, endpoint: str, err: Exception) -> LogError:
    """The txsink log's :class:`LogError` for a failed S3 ``op`` of ``where``, with the fix:
    a :class:`LogUnavailableError` (also a RetryableError) when :func:`classify` calls it
    passing (unreachable, connection, throttled, transient)."""
    head = f"txsink log: S3 {op} of {where} failed"
    kind = classify(err)
    if kind in _PASSING:
        return _log_unavailable(head, kind, endpoint, err)
    code, status = error_code(err)
    if code or status:
        if kind == "no-bucket":
            hint = (
                f"bucket {bucket!r} does not exist at {endpoint}: create it, or fix the log "
                "location (and endpoint_url / AWS_ENDPOINT_URL_S3 for an S3-compatible server)"
            )
        elif kind == "denied":
            hint = (
                "access denied: check the credentials (boto3's chain or client_options) and "
                "that they allow s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket "
                "on the log's prefix (the policy: docs/security.md, section S3)"
                + (
                    " (without s3:ListBucket, S3 answers the read of a missing record with "
                    "AccessDenied instead of NoSuchKey)"
                    if op == "read"
                    else ""
                )
            )
        else:
            hint = "see the S3 error code above"
        return LogError(f"{head}: {describe(err)}; {hint}")
    if kind == "credentials":
        return LogError(
            f"{head}: {type(err).__name__}: no usable AWS credentials. Set AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY, a profile or an instance role, or pass client_options",
        )
    return LogError(f"{head}: {type(err).__name__}: {err}")


#: The kinds of failure that pass: retrying the same call can succeed.
_PASSING: frozenset[Kind] = frozenset({"unreachable", "connection", "throttled", "transient"})


def _log_unavailable(head: str, kind: Kind, endpoint: str, err: Exception) -> LogUnavailableError:
    if kind == "throttled":
        hint = (
            "S3 throttled the request beyond botocore's retries: retry later, or give the "
            'client more retries (client_options={"config": botocore.config.Config('
            'retries={"mode": "adaptive", "max_attempts": 10})})'
        )
    elif kind in ("unreachable", "connection"):
        hint = (
            f"cannot reach the S3 endpoint {endpoint}: check endpoint_url / "
            "AWS_ENDPOINT_URL_S3, the network and that the server is up"
        )
    else:
        hint = "a server-side failure of the moment"
    return LogUnavailableError(
        f"{head}: {describe(err)}; {hint}. Transient: the call is safe to retry (the next "
        "run's recovery does)"
    )


def _blocked(what: str, kind: str, bucket: str, context: Mapping[str, Any]) -> EpochBlockedError:
    # Refused for good after the decision: a policy, the credentials or the bucket
    # changed since the start; no retry succeeds until an operator puts it back.
    fix = {
        "denied": "grant the sink's credentials s3:PutObject, s3:GetObject and "
        f"s3:ListBucketMultipartUploads on the bucket {bucket!r} and prefix again, or, if "
        "its secret key was changed or its session token expired (a HEAD's 403 does not "
        "say which), give the driver and executors the current credentials",
        "credentials": "give the driver and executors usable AWS credentials again",
        "key-refused": "give the driver and executors the current credentials of the sink's "
        "user (its secret key was changed or deleted, or its session token expired): the "
        "shared-credentials file, AWS_PROFILE or the variables of boto3's chain, or "
        "client_options",
        "no-bucket": f"create the bucket {bucket!r} again (its open uploads are gone: "
        "the epoch's files of this sink cannot be completed)",
    }[kind]
    return EpochBlockedError(
        f"{what}. S3 refuses to complete the decided upload for good: a retry fails "
        f"the same way until an operator acts. Fix: {fix}",
        fix=fix,
        **context,
    )
