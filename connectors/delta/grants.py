"""The least IAM rights of a :class:`~txsink.connectors.delta.DeltaSink` on S3.

One source for the docs (``docs/security.md``, section Delta, shows :func:`policy`'s output;
a docs test runs it) and the tests (``integration/test_delta_secure.py`` gives the secured
server's user exactly this policy, and removes one action at a time to see where it is
missed).

What the sink and delta-rs do under the table's folder ``s3://<bucket>/<table>/``:

* ``s3:PutObject``: the tasks' data files (pyarrow writes each as a multipart upload, which
  S3 authorizes as PutObject), and each commit's log entry ``_delta_log/<version>.json``
  (delta-rs 1.x writes it with a conditional PUT, ``If-None-Match: *``: no locking provider,
  no DynamoDB), plus delta-rs's checkpoints and ``_last_checkpoint``;
* ``s3:GetObject``: delta-rs reads the log (``_last_checkpoint``, the entries, the
  checkpoints); the commit checks each data file's size (HeadObject);
* ``s3:ListBucket`` with an ``s3:prefix`` condition to ``<table>/*``: delta-rs lists
  ``_delta_log/``, recovery lists the table's folder for files no decision names;
* ``s3:DeleteObject``: an aborted transaction's data files (and delta-rs's log clean-up).

Measured on MinIO, one action removed at a time, before the start-up probe
(:mod:`~txsink.connectors.delta.access`) existed: without ``s3:GetObject`` or
``s3:ListBucket`` the table could not be opened; without ``s3:PutObject`` the pre-commit
failed (before the decision: nothing visible); without ``s3:DeleteObject`` only the abort
failed (the aborted files stay, invisible to readers, until a ``VACUUM``). The probe now
names each of them at the check, with :func:`statement`'s grant.
``s3:AbortMultipartUpload`` and ``s3:ListBucketMultipartUploads`` were not needed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ACTIONS", "Action", "policy", "statement"]

Scope = Literal["object", "bucket"]


@dataclass(frozen=True)
class Action:
    """An IAM action, on objects under the table's folder or on the bucket, and why."""

    name: str
    scope: Scope
    why: str


ACTIONS: tuple[Action, ...] = (
    Action("s3:PutObject", "object", "data files; each commit's log entry (conditional PUT)"),
    Action("s3:GetObject", "object", "read the Delta log; check a data file's size"),
    Action("s3:DeleteObject", "object", "delete an aborted transaction's data files"),
    Action("s3:ListBucket", "bucket", "list _delta_log/ and, at recovery, the table's folder"),
)


def _folder(table: str) -> str:
    return f"{table.strip('/')}/" if table.strip("/") else ""


def statement(action: str, bucket: str, table: str) -> dict[str, Any]:
    """The one IAM statement that allows ``action`` (one of :data:`ACTIONS`) for the table at
    ``s3://<bucket>/<table>``: what the start-up check names for a refused action."""
    found = next((a for a in ACTIONS if a.name == action), None)
    if found is None:
        raise ValueError(f"{action!r} is not one of the Delta sink's actions")
    folder = _folder(table)
    if found.scope == "object":
        return {
            "Effect": "Allow",
            "Action": [action],
            "Resource": [f"arn:aws:s3:::{bucket}/{folder}*"],
        }
    return {
        "Effect": "Allow",
        "Action": [action],
        "Resource": [f"arn:aws:s3:::{bucket}"],
        "Condition": {"StringLike": {"s3:prefix": [f"{folder}*"]}},
    }


def policy(bucket: str, table: str, *, without: Iterable[str] = ()) -> dict[str, Any]:
    """The least-privilege policy for the Delta table at ``s3://<bucket>/<table>`` (``table``:
    its path in the bucket), less the actions named in ``without``."""
    skip = set(without)
    folder = _folder(table)
    objects = [a.name for a in ACTIONS if a.scope == "object" and a.name not in skip]
    statements: list[dict[str, Any]] = []
    if objects:
        statements.append(
            {
                "Effect": "Allow",
                "Action": objects,
                "Resource": [f"arn:aws:s3:::{bucket}/{folder}*"],
            }
        )
    if "s3:ListBucket" not in skip:
        statements.append(statement("s3:ListBucket", bucket, table))
    return {"Version": "2012-10-17", "Statement": statements}
