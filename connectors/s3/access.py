"""The start-up check of an S3 sink's rights: probe each IAM action, name every one refused.

Why probe rather than read the policy: S3 has no "what may I do" call (IAM's simulator is
AWS-only, needs rights of its own and ignores bucket policies and SCPs), and a prefix-scoped
policy refuses at the first call it does not allow, which without this check is a commit
or a recovery minutes or days later. Each probe is the cheapest call S3 authorizes as that
action, on keys under ``<prefix>_txsink/probe/`` (a random name per check), so it reads or
changes no data of the sink:

============================== =====================================================
``s3:ListBucket``              ListObjectsV2 with ``Prefix=<prefix>_txsink/``
``s3:ListBucketMultipartUploads`` ListMultipartUploads with the probe key as prefix
``s3:PutObject``               PutObject of an empty probe object, and
                               CreateMultipartUpload of the probe key
``s3:GetObject``               HeadObject of the probe object (a missing one: 404 = allowed)
``s3:DeleteObject``            DeleteObject of the probe object
``s3:AbortMultipartUpload``    AbortMultipartUpload of the probe's upload (or of an id that
                               does not exist: ``NoSuchUpload`` = allowed)
============================== =====================================================

A refusal is recognised by ``AccessDenied`` (HTTP 403); any other failure (no bucket,
bad credentials, unreachable) is raised as the sink's usual typed error. The fix named is
the statement of :func:`txsink.connectors.s3.grants.statement`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from txsink.connectors.s3 import grants
from txsink.connectors.s3.errors import error_code, is_missing, is_no_such_upload
from txsink.errors import ConfigurationError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["PROBE_FOLDER", "S3AccessError", "check_sink_access", "probe", "refused"]

#: Under the sink's prefix; its objects live for the length of one check.
PROBE_FOLDER = "_txsink/probe/"
_AUTH_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"})
#: An object that does not exist, for probes whose first object could not be written.
_ABSENT_UPLOAD_ID = "txsink-probe-no-such-upload"


class S3AccessError(ConfigurationError):
    """The sink's credentials are refused IAM actions it needs; ``missing`` names them."""

    def __init__(self, message: str, missing: list[str], **context: Any) -> None:
        super().__init__(message, **context)
        self.missing = missing


def refused(err: BaseException) -> bool:
    """The call was refused by policy (not by bad credentials or a missing bucket)."""
    code, status = error_code(err)
    if code in _AUTH_CODES:
        return False
    return code == "AccessDenied" or (status == 403 and code in ("", "403", "Forbidden"))


def _try(call: Callable[[], Any], ok: Callable[[Exception], bool] = lambda e: False) -> bool:
    """True if ``call`` is allowed: it succeeds, or fails with an error ``ok`` accepts
    (e.g. "no such key": authorized, nothing there). False if refused; others propagate."""
    try:
        call()
    except Exception as err:
        if ok(err):
            return True
        if refused(err):
            return False
        raise
    return True


def probe(client: S3Client, bucket: str, prefix: str) -> list[str]:
    """The IAM actions of :data:`~txsink.connectors.s3.grants.SINK_ACTIONS` that ``client``
    is refused under ``s3://bucket/prefix`` (empty: all allowed). Leaves nothing behind when
    everything is allowed; a refused delete or abort leaves one probe object or upload
    under ``<prefix>_txsink/probe/``, which the error says."""
    key = f"{prefix}{PROBE_FOLDER}{uuid.uuid4().hex}"
    allowed: dict[str, bool] = {}
    allowed["s3:ListBucket"] = _try(
        lambda: client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}_txsink/", MaxKeys=1)
    )
    allowed["s3:ListBucketMultipartUploads"] = _try(
        lambda: client.list_multipart_uploads(Bucket=bucket, Prefix=key, MaxUploads=1)
    )
    put = _try(lambda: client.put_object(Bucket=bucket, Key=key, Body=b""))
    upload: list[str] = []
    multipart = _try(
        lambda: upload.append(client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
    )
    allowed["s3:PutObject"] = put and multipart
    allowed["s3:GetObject"] = _try(lambda: client.head_object(Bucket=bucket, Key=key), is_missing)
    allowed["s3:AbortMultipartUpload"] = _try(
        lambda: client.abort_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload[0] if upload else _ABSENT_UPLOAD_ID
        ),
        is_no_such_upload,
    )
    allowed["s3:DeleteObject"] = _try(
        lambda: client.delete_object(Bucket=bucket, Key=key), is_missing
    )
    return [a.name for a in grants.SINK_ACTIONS if not allowed[a.name]]


def check_sink_access(
    client: S3Client, bucket: str, prefix: str, ctx: dict[str, Any], url: str
) -> None:
    """Raise :class:`~txsink.errors.ConfigurationError` naming every action the sink's
    credentials are refused under ``url``, with the IAM statement that grants each."""
    missing = probe(client, bucket, prefix)
    if not missing:
        return
    why = {a.name: a.why for a in grants.SINK_ACTIONS}
    lines = "\n".join(
        f"  - {name} ({why[name]}): add the statement "
        f"{json.dumps(grants.statement(name, bucket, [prefix]), separators=(',', ':'))}"
        for name in missing
    )
    leftovers = ""
    if {"s3:DeleteObject", "s3:AbortMultipartUpload"} & set(missing):
        leftovers = (
            f" The check may have left a probe object or upload under "
            f"s3://{bucket}/{prefix}{PROBE_FOLDER}: delete it once the rights are granted."
        )
    raise S3AccessError(
        f"the S3 sink's credentials are refused {len(missing)} action(s) it needs on "
        f"{url}, found by the start-up check before any data was written:\n{lines}\n"
        "Grant them to the sink's IAM user or role (the whole least-privilege policy is in "
        f"docs/security.md, section S3).{leftovers}",
        missing,
        **ctx,
    )
