"""The least IAM rights of an :class:`~txsink.connectors.s3.S3Sink` and the S3 txsink log.

One source for three readers: the start-up check (:mod:`~txsink.connectors.s3.access`
probes each action and names a refused one with the statement that grants it, before any
data flows), the docs (``docs/security.md`` shows :func:`policy`'s output; a docs test
checks they match) and the tests (the secured harness attaches :func:`policy`, and a test
removes one action at a time and expects the check to name it).

What the sink does, and so needs, under ``s3://<bucket>/<prefix>``:

* ``s3:PutObject`` on ``<prefix>*``: CreateMultipartUpload, UploadPart and
  CompleteMultipartUpload (S3 authorizes all three as PutObject), the upload markers
  (``<prefix>_txsink/uploads/...``) and the epoch manifests (``<prefix>_manifests/...``,
  a conditional PUT with ``If-None-Match: *``);
* ``s3:GetObject``: HeadObject of a completed object (the commit verifies it in the bucket
  rather than trusting an error code), reading markers and manifests;
* ``s3:DeleteObject``: a committed or aborted transaction's marker;
* ``s3:AbortMultipartUpload``: abort of a transaction that is not decided;
* ``s3:ListBucket`` on the bucket, with an ``s3:prefix`` condition to ``<prefix>*``:
  listing markers (recovery) and manifests;
* ``s3:ListBucketMultipartUploads`` on the bucket: recovery finds the uploads of a
  marker's keys (S3 offers no prefix condition for this action: it lists upload keys and
  ids only, never data).

The txsink log on S3 (``log="s3://<bucket>/<log prefix>"``) needs ``s3:PutObject``
(conditional creates: the commit point of every epoch), ``s3:GetObject``,
``s3:DeleteObject`` (its conditional-write probe and pruning) and ``s3:ListBucket`` on
``<log prefix>*``. Nothing else: no ``s3:GetBucket*``, no ``s3:ListAllMyBuckets``, no
``s3:ListMultipartUploadParts``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["LOG_ACTIONS", "SINK_ACTIONS", "Action", "policy", "statement"]

Scope = Literal["object", "bucket"]


@dataclass(frozen=True)
class Action:
    """An IAM action, on objects under a prefix or on the bucket, and why it is needed."""

    name: str
    scope: Scope
    why: str


SINK_ACTIONS: tuple[Action, ...] = (
    Action("s3:PutObject", "object", "multipart uploads, markers and manifests"),
    Action("s3:GetObject", "object", "verify a completed object; read markers and manifests"),
    Action("s3:DeleteObject", "object", "delete a finished transaction's marker"),
    Action("s3:AbortMultipartUpload", "object", "abort an undecided transaction's uploads"),
    Action("s3:ListBucket", "bucket", "list markers (recovery) and manifests"),
    Action("s3:ListBucketMultipartUploads", "bucket", "recovery finds a marker's uploads"),
)

LOG_ACTIONS: tuple[Action, ...] = (
    Action("s3:PutObject", "object", "conditional creates: the commit point of every epoch"),
    Action("s3:GetObject", "object", "read the log"),
    Action("s3:DeleteObject", "object", "the conditional-write probe; pruning"),
    Action("s3:ListBucket", "bucket", "list the log's entries"),
)


def _prefix(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def statement(action: str, bucket: str, prefixes: Sequence[str]) -> dict[str, Any]:
    """The one IAM statement that allows ``action`` for ``prefixes`` of ``bucket``.

    Object actions name ``arn:aws:s3:::<bucket>/<prefix>*``; ``s3:ListBucket`` names the
    bucket with an ``s3:prefix`` condition; ``s3:ListBucketMultipartUploads`` the bucket.
    """
    scope = next((a.scope for a in (*SINK_ACTIONS, *LOG_ACTIONS) if a.name == action), "object")
    pattern = [f"{_prefix(p)}*" for p in prefixes]
    if scope == "object":
        return {
            "Effect": "Allow",
            "Action": [action],
            "Resource": [f"arn:aws:s3:::{bucket}/{p}" for p in pattern],
        }
    out: dict[str, Any] = {
        "Effect": "Allow",
        "Action": [action],
        "Resource": [f"arn:aws:s3:::{bucket}"],
    }
    if action == "s3:ListBucket":
        out["Condition"] = {"StringLike": {"s3:prefix": pattern}}
    return out


def policy(
    bucket: str,
    prefix: str,
    log_prefix: str | None = None,
    *,
    without: Iterable[str] = (),
) -> dict[str, Any]:
    """The least-privilege policy for a sink at ``s3://bucket/prefix`` (and its txsink log
    at ``s3://bucket/log_prefix``, if given), less the actions named in ``without``.

    One statement per resource kind: object actions on both prefixes, ``s3:ListBucket``
    with the ``s3:prefix`` condition, ``s3:ListBucketMultipartUploads`` on the bucket.
    """
    skip = set(without)
    prefixes = [_prefix(prefix)] + ([_prefix(log_prefix)] if log_prefix is not None else [])
    pattern = [f"{p}*" for p in prefixes]
    names = list(dict.fromkeys(a.name for a in SINK_ACTIONS + LOG_ACTIONS))
    objects = [n for n in names if n not in skip and _scope(n) == "object"]
    statements: list[dict[str, Any]] = []
    if objects:
        statements.append(
            {
                "Effect": "Allow",
                "Action": objects,
                "Resource": [f"arn:aws:s3:::{bucket}/{p}" for p in pattern],
            }
        )
    if "s3:ListBucket" not in skip:
        statements.append(statement("s3:ListBucket", bucket, prefixes))
    if "s3:ListBucketMultipartUploads" not in skip:
        statements.append(statement("s3:ListBucketMultipartUploads", bucket, prefixes))
    return {"Version": "2012-10-17", "Statement": statements}


def _scope(name: str) -> Scope:
    return next(a.scope for a in (*SINK_ACTIONS, *LOG_ACTIONS) if a.name == name)
