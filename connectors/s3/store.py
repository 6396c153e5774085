"""Objects under one prefix of a bucket as a key-value store with an atomic create-if-absent.

:class:`S3Objects` implements :class:`~txsink.store.LogStore` over an S3 client: the one
conditional PUT of the S3 connector. The txsink log on S3
(:class:`~txsink.connectors.s3.log_store.S3Store`) is one, and so are the S3 sink's epoch
manifests and upload markers; they differ only in how a failure reads (``fail``).

``create`` is ``PutObject`` with ``If-None-Match: *``: S3 answers 412 ``PreconditionFailed``
when the key exists. Because botocore may resend a PUT whose first attempt did succeed (its
answer was lost), every create carries a random token in its object metadata and a 412 is
checked against it: the call returns True exactly when *its* bytes are the object. AWS
answers 409 ``ConditionalRequestConflict`` when a conflicting write races on the key; the
create is then retried (a few times, with backoff) and settles on 200 or 412.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from txsink.connectors.s3.errors import error_code, is_missing, is_precondition_failed

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["Failure", "S3Objects", "UnsettledCreateError"]

#: Object metadata key (``x-amz-meta-txsink-writer``) holding the create call's token.
WRITER_META = "txsink-writer"

#: How a failed call reads: ``(op, "s3://bucket/key", error) -> the exception to raise``
#: (the error itself to let it through as it is).
Failure = Callable[[str, str, Exception], Exception]


class UnsettledCreateError(Exception):
    """A create kept meeting 409s (or a key deleted between its 412 and the check)."""


class S3Objects:
    """A :class:`~txsink.store.LogStore` on the objects ``<prefix><key>`` of ``bucket``.

    Args:
        client: the S3 client (its credentials stay with it; this object keeps no options).
        bucket, prefix: where; ``prefix`` is empty or ends with ``/``.
        fail: turns a failed call into the error to raise (see :data:`Failure`).
        page_size: keys per ``ListObjectsV2`` request (1..1000).
        conflict_retries: how often a create answered 409 is retried before giving up.
    """

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str,
        *,
        fail: Failure,
        page_size: int = 1000,
        conflict_retries: int = 5,
    ) -> None:
        if not 1 <= page_size <= 1000:
            raise ValueError(f"page_size must be within 1..1000, got {page_size}")
        if conflict_retries < 0:
            raise ValueError(f"conflict_retries must be >= 0, got {conflict_retries}")
        self._client = client
        self.bucket = bucket
        self.prefix = prefix
        self.location = f"s3://{bucket}/{prefix}"
        self.page_size = page_size
        self.conflict_retries = conflict_retries
        self._failure = fail

    # -- LogStore ------------------------------------------------------------------------

    def create(self, key: str, data: bytes) -> bool:
        """Create ``key`` unless it exists; True if this call created it."""
        return self._create(self._object(key), data, "create")

    def put(self, key: str, data: bytes) -> None:
        """Write ``key`` whatever is there (records that only their writer changes)."""
        name = self._object(key)
        try:
            self._client.put_object(
                Bucket=self.bucket, Key=name, Body=data, ContentType="application/json"
            )
        except Exception as err:
            self._fail("put", name, err)

    def read(self, key: str) -> bytes | None:
        """The object's bytes; None if it does not exist."""
        name = self._object(key)
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=name)["Body"]
            try:
                return body.read()
            finally:
                body.close()
        except Exception as err:
            if is_missing(err):
                return None
            self._fail("read", name, err)

    def list(self, prefix: str) -> list[str]:
        """Every key that starts with ``prefix``, sorted (keys are relative to the store)."""
        start = len(self.prefix)
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket,
                Prefix=self.prefix + prefix,
                PaginationConfig={"PageSize": self.page_size},
            )
            for page in pages:
                keys.extend(obj["Key"][start:] for obj in page.get("Contents", ()) if "Key" in obj)
        except Exception as err:
            self._fail("list", self.prefix + prefix, err)
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Delete ``key`` (deleting a missing key is not an error)."""
        name = self._object(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=name)
        except Exception as err:
            self._fail("delete", name, err)

    # -- helpers -------------------------------------------------------------------------

    def _object(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"bad log key {key!r}")
        return self.prefix + key

    def _create(self, name: str, data: bytes, op: str) -> bool:
        """PUT ``name`` if absent. True iff this call's bytes are the object afterwards."""
        import uuid

        token = uuid.uuid4().hex
        for attempt in range(self.conflict_retries + 1):
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=name,
                    Body=data,
                    IfNoneMatch="*",
                    ContentType="application/json",
                    Metadata={WRITER_META: token},
                )
                return True
            except Exception as err:
                code, status = error_code(err)
                if is_precondition_failed(err):
                    owner = self._owner_token(name)
                    if owner is not None:
                        # Ours when an earlier attempt of this call (a botocore retry of
                        # a PUT whose answer was lost) created it.
                        return owner == token
                    # Deleted between the 412 and the HEAD: try again.
                elif code == "NotImplemented" or status == 501:
                    self._no_conditional_writes(name, op, err)
                elif not (code == "ConditionalRequestConflict" or status == 409):
                    self._fail(op, name, err)
            # 409: a concurrent write on the key is in flight; it settles shortly.
            time.sleep(min(1.0, 0.05 * 2**attempt) * (0.5 + random.random()))  # noqa: S311
        self._fail(
            op,
            name,
            UnsettledCreateError(
                f"the create of {name} in {self.location} did not settle in "
                f"{self.conflict_retries + 1} attempts (409 ConditionalRequestConflict, or the "
                "key deleted between a 412 and its check): something else keeps writing or "
                "deleting that key. Only txsink should write under this prefix"
            ),
        )

    def _owner_token(self, name: str) -> str | None:
        """The create token stored with ``name``; ``""`` if it has none, None if it is gone."""
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=name)
        except Exception as err:
            if error_code(err)[1] == 404 or is_missing(err):
                return None
            self._fail("create", name, err)
        return head.get("Metadata", {}).get(WRITER_META, "")

    def _no_conditional_writes(self, name: str, op: str, err: Exception) -> NoReturn:
        """The server does not implement ``If-None-Match`` (501); the log says more."""
        self._fail(op, name, err)

    def _fail(self, op: str, name: str, err: Exception) -> NoReturn:
        failure = self._failure(op, f"s3://{self.bucket}/{name}", err)
        if failure is err:
            raise err
        raise failure from err
